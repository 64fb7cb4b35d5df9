//! The egress programs in the kernel: a probe process moved into a
//! temporary cgroup v2 directory holding an [`Egress`] tries every way
//! out, and each refused attempt must fail at once with `EPERM`.
//!
//! Traffic stays on loopback listeners the tests open, or inside a network
//! namespace a test creates (a dummy interface holding 169.254.169.254,
//! 10.77.0.1 and fd00::1, removed after). Root only: as another user the
//! tests print SKIP and return.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use executor::sandbox::egress::{Denials, Egress};
use policy::egress::{EgressRules, Rule};
use serde_json::{json, Value};

/// `ping_group_range` is host-wide: tests that set it take turns.
static PING_RANGE: Mutex<()> = Mutex::new(());

const EPERM: i64 = 1;
/// Longest a refused call may take: the programs refuse before any
/// packet, so a timeout (seconds) is far past it.
const FAST_MS: f64 = 200.0;

/// The probe: reads a JSON list of cases on stdin, tries each, prints a
/// JSON list of `{"errno": N, "ms": T}` (errno 0: it went through).
const PROBE: &str = r#"
import json, os, socket, subprocess, sys, time

def family(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET

def attempt(c):
    k, addr, port = c["kind"], c.get("addr", ""), c.get("port", 0)
    dst = (addr, port)
    if k == "tcp":
        s = socket.socket(family(addr), socket.SOCK_STREAM); s.settimeout(3); s.connect(dst); s.close()
    elif k == "udp_sendto":
        s = socket.socket(family(addr), socket.SOCK_DGRAM); s.sendto(b"ongrid", dst); s.close()
    elif k == "udp_connect":
        s = socket.socket(family(addr), socket.SOCK_DGRAM); s.connect(dst); s.send(b"ongrid"); s.close()
    elif k == "tfo":
        s = socket.socket(family(addr), socket.SOCK_STREAM); s.settimeout(3)
        s.sendto(b"ongrid", socket.MSG_FASTOPEN, dst); s.close()
    elif k == "tcp_loop":
        # p50 and p90 of `n` connects (microseconds), each closed at once.
        times = []
        for _ in range(c["n"]):
            s = socket.socket(family(addr), socket.SOCK_STREAM)
            t = time.perf_counter_ns(); s.connect(dst); times.append(time.perf_counter_ns() - t); s.close()
        times.sort()
        return {"errno": 0, "ms": 0.0, "p50_us": times[len(times) // 2] / 1000,
                "p90_us": times[len(times) * 9 // 10] / 1000}
    elif k == "socket":
        s = socket.socket(family(addr), socket.SOCK_STREAM if c["stream"] else socket.SOCK_DGRAM, c["proto"])
        s.close()
    elif k == "rthdr":
        # A segment routing header naming `via`, then a send to `addr`.
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        srh = bytes([0, 2, 4, 0, 0, 0, 0, 0]) + socket.inet_pton(socket.AF_INET6, c["via"])
        if c.get("hop"):
            # A hop-by-hop header first (PadN), as a sender with CAP_NET_RAW may.
            s.setsockopt(socket.IPPROTO_IPV6, 54, bytes([0, 0, 1, 4, 0, 0, 0, 0]))
        s.setsockopt(socket.IPPROTO_IPV6, 57, srh); s.sendto(b"ongrid", dst); s.close()
    elif k == "ip_options":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, bytes([1, 1, 1, 0]))
        s.sendto(b"ongrid", dst); s.close()
    elif k == "ping_connect":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
        s.connect(dst); s.send(bytes([8, 0, 0, 0, 0, 0, 0, 1])); s.close()
    elif k == "ping":
        v6 = family(addr) == socket.AF_INET6
        s = socket.socket(family(addr), socket.SOCK_DGRAM,
                          socket.IPPROTO_ICMPV6 if v6 else socket.IPPROTO_ICMP)
        s.sendto(bytes([128 if v6 else 8, 0, 0, 0, 0, 0, 0, 1]), dst); s.close()
    elif k in ("exec", "setsid"):
        # A new program after fork and exec (and a new session) tries it.
        r = subprocess.run([sys.executable, __file__], input=json.dumps([c["case"]]),
                           capture_output=True, text=True, start_new_session=(k == "setsid"))
        return json.loads(r.stdout)[0]
    elif k == "inherit":
        # A socket made here, connected by a child program it is passed to.
        s = socket.socket(family(addr), socket.SOCK_STREAM)
        code = ("import socket,sys\ns=socket.socket(fileno=int(sys.argv[1]))\ns.settimeout(3)\n"
                "try:\n s.connect((sys.argv[2], int(sys.argv[3]))); print(0)\n"
                "except OSError as e: print(e.errno or 110)")
        r = subprocess.run([sys.executable, "-c", code, str(s.fileno()), addr, str(port)],
                           pass_fds=[s.fileno()], capture_output=True, text=True)
        return {"errno": int(r.stdout.strip() or -1), "ms": 0.0}
    return None

def one(c):
    t = time.monotonic()
    try:
        r = attempt(c)
        if r is not None:
            return r
        e = 0
    except socket.timeout:
        e = 110
    except OSError as x:
        e = x.errno if x.errno is not None else -1
    return {"errno": e, "ms": (time.monotonic() - t) * 1000}

cases = json.loads(sys.stdin.readline())
print(json.dumps([one(c) for c in cases]), flush=True)
"#;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn v2_mount() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists())
}

/// A cgroup v2 directory removed on drop (its processes gone by then).
struct TempCgroup(PathBuf);

impl TempCgroup {
    fn dir(&self) -> std::fs::File {
        std::fs::File::open(&self.0).unwrap()
    }

    fn new(tag: &str) -> Option<Self> {
        let Some(root) = v2_mount() else {
            eprintln!("SKIP: no cgroup v2 mount");
            return None;
        };
        let dir = root.join(format!("ongrid-egress-test-{}-{tag}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        Some(Self(dir))
    }
}

impl Drop for TempCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

fn rules(entries: &[&str], host: &[&str]) -> EgressRules {
    let allow: Vec<Rule> =
        entries.iter().map(|s| Rule::from_entry(&s.parse().unwrap()).unwrap()).collect();
    let host: Vec<IpAddr> = host.iter().map(|a| a.parse().unwrap()).collect();
    EgressRules::new(&allow, &host).unwrap()
}

/// Runs the probe (under `prefix`, e.g. `ip netns exec NS`) in `cg`,
/// moved there before it reads its cases; returns one result per case.
fn probe(dir: &Path, cg: &TempCgroup, prefix: &[&str], cases: &[Value]) -> Vec<Value> {
    let script = dir.join("probe.py");
    std::fs::write(&script, PROBE).unwrap();
    let mut argv: Vec<&str> = prefix.to_vec();
    argv.extend(["python3", script.to_str().unwrap()]);
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(cg.0.join("cgroup.procs"), child.id().to_string()).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", Value::from(cases.to_vec())).unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(child.wait().unwrap().success());
    serde_json::from_str::<Vec<Value>>(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

fn check(cases: &[Value], results: &[Value], want: &[i64]) {
    assert_eq!(results.len(), want.len());
    for ((c, r), w) in cases.iter().zip(results).zip(want) {
        assert_eq!(r["errno"].as_i64(), Some(*w), "{c}: {r}");
        if *w == EPERM {
            assert!(r["ms"].as_f64().unwrap_or(f64::MAX) < FAST_MS, "{c} slow: {r}");
        }
    }
}

fn counts(d: &Denials) -> BTreeMap<(String, String), u64> {
    d.listed.iter().map(|x| ((x.destination.clone(), x.protocol.clone()), x.count)).collect()
}

/// Sets `ping_group_range` so root may open ping sockets, and restores it.
struct PingRange(String);

impl PingRange {
    const PATH: &str = "/proc/sys/net/ipv4/ping_group_range";
    fn open() -> Self {
        let old = std::fs::read_to_string(Self::PATH).unwrap();
        std::fs::write(Self::PATH, "0 2147483647").unwrap();
        Self(old)
    }
}

impl Drop for PingRange {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, self.0.trim().replace('\t', " "));
    }
}

#[test]
fn only_the_named_loopback_port_gets_through() {
    if !is_root() {
        eprintln!("SKIP: needs root");
        return;
    }
    let Some(cg) = TempCgroup::new("named") else { return };
    let _lock = PING_RANGE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ping = PingRange::open();
    let listener = TcpListener::bind("127.0.0.2:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let other = if port == 65535 { port - 1 } else { port + 1 };
    let allowed = format!("127.0.0.2:{port}");
    let egress = Egress::load(&rules(&[&allowed], &[])).unwrap();
    assert_eq!(egress.programs(), 6, "the four address hooks, the socket filter, the route drop");
    let attached = egress.attach(&cg.dir()).unwrap();
    assert_eq!(attached.programs(), 6);
    let tcp = |a: &str, p: u16| json!({"kind": "tcp", "addr": a, "port": p});
    let kind = |k: &str, a: &str, p: u16| json!({"kind": k, "addr": a, "port": p});
    let cases = vec![
        tcp("127.0.0.2", port),
        tcp("::ffff:127.0.0.2", port),
        tcp("127.0.0.2", other),
        tcp("127.0.0.3", port),
        tcp("::ffff:127.0.0.3", port),
        tcp("::1", port),
        tcp("0.0.0.0", port),
        kind("udp_sendto", "127.0.0.3", port),
        kind("udp_connect", "127.0.0.3", port),
        kind("udp_sendto", "::ffff:127.0.0.3", port),
        kind("tfo", "127.0.0.3", port),
        kind("ping", "127.0.0.2", 0),
        kind("ping", "::1", 0),
        json!({"kind": "exec", "case": tcp("127.0.0.3", port)}),
        json!({"kind": "exec", "case": tcp("127.0.0.2", port)}),
        json!({"kind": "setsid", "case": {"kind": "exec", "case": tcp("127.0.0.3", port)}}),
        kind("inherit", "127.0.0.3", port),
        kind("inherit", "127.0.0.2", port),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let results = probe(tmp.path(), &cg, &[], &cases);
    let want = [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0];
    check(&cases, &results, &want);

    let id = attached.cgroup_id();
    drop(attached);
    let d = egress.take_denials(id).unwrap();
    let c = counts(&d);
    let p = port;
    let expect = [
        (format!("127.0.0.2:{other}"), "tcp", 1),
        (format!("127.0.0.3:{p}"), "tcp", 5),
        (format!("[::ffff:127.0.0.3]:{p}"), "tcp", 1),
        (format!("[::1]:{p}"), "tcp", 1),
        (format!("0.0.0.0:{p}"), "tcp", 1),
        (format!("127.0.0.3:{p}"), "udp", 3),
    ];
    for (dest, proto, n) in &expect {
        assert_eq!(c.get(&(dest.clone(), (*proto).to_owned())), Some(n), "{dest} {proto}: {d:?}");
    }
    // Ping sockets are refused when made, before any destination.
    assert_eq!(c.get(&("*".to_owned(), "icmp".to_owned())), Some(&2), "{d:?}");
    // The mapped UDP send is judged (and recorded) by the IPv4 hook.
    assert_eq!(c.len(), 7, "{d:?}");
    assert_eq!(d.total, 1 + 5 + 1 + 1 + 1 + 3 + 2, "{d:?}");
    drop(listener);
    // Taken: nothing left for the next run in this cgroup.
    assert_eq!(egress.take_denials(id).unwrap(), Denials::default());
    // Detached: the same cgroup's sockets are no longer judged.
    let after = probe(tmp.path(), &cg, &[], &[tcp("127.0.0.2", other)]);
    assert_eq!(after[0]["errno"].as_i64(), Some(111), "{after:?}");
    assert_eq!(egress.take_denials(id).unwrap().total, 0);
}

/// The kernel runs no hook for a ping socket's `sendto` (an echo to a
/// refused address went through when ping sockets were allowed), so ICMP
/// sockets are refused when made, even under an any-port rule.
#[test]
fn ping_and_other_non_tcp_udp_sockets_are_refused_even_under_an_any_port_rule() {
    if !is_root() {
        eprintln!("SKIP: needs root");
        return;
    }
    let Some(cg) = TempCgroup::new("icmp") else { return };
    let _lock = PING_RANGE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ping = PingRange::open();
    let egress = Egress::load(&rules(&["127.0.0.2:*"], &[])).unwrap();
    let attached = egress.attach(&cg.dir()).unwrap();
    let cases = vec![
        json!({"kind": "ping", "addr": "127.0.0.2", "port": 0}),
        json!({"kind": "ping", "addr": "::1", "port": 0}),
        json!({"kind": "ping_connect", "addr": "127.0.0.2", "port": 0}),
        json!({"kind": "udp_sendto", "addr": "127.0.0.2", "port": 9}),
        json!({"kind": "socket", "addr": "::", "stream": true, "proto": 0}),
        // UDP-Lite: refused when made (or absent from the kernel).
        json!({"kind": "socket", "addr": "0.0.0.0", "stream": false, "proto": 136}),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let results = probe(tmp.path(), &cg, &[], &cases);
    check(&cases[..5], &results[..5], &[EPERM, EPERM, EPERM, 0, 0]);
    let udplite = results[5]["errno"].as_i64();
    assert!(matches!(udplite, Some(1 | 93)), "{:?}", results[5]);
    let d = egress.take_denials(attached.cgroup_id()).unwrap();
    let mut want = BTreeMap::from([(("*".to_owned(), "icmp".to_owned()), 3)]);
    if udplite == Some(EPERM) {
        want.insert(("*".to_owned(), "ip:136".to_owned()), 1);
    }
    assert_eq!(counts(&d), want, "{d:?}");
    assert_eq!(d.total, want.values().sum::<u64>());
}

/// A network namespace with a dummy interface, removed on drop.
struct Netns(String);

impl Netns {
    fn new() -> Option<Self> {
        let name = format!("ongrid-egress-{}", std::process::id());
        let ip = |args: &[&str]| Command::new("ip").args(args).status().is_ok_and(|s| s.success());
        if !ip(&["netns", "add", &name]) {
            eprintln!("SKIP: ip netns add failed");
            return None;
        }
        let ns = Self(name);
        let n = ns.0.as_str();
        for args in [
            &["link", "add", "dummy0", "type", "veth", "peer", "name", "dummy1"][..],
            &["addr", "add", "169.254.169.254/32", "dev", "dummy0"],
            &["addr", "add", "10.77.0.1/32", "dev", "dummy0"],
            &["addr", "add", "fd00::1/128", "dev", "dummy0", "nodad"],
            &["link", "set", "dummy0", "up"],
            &["link", "set", "dummy1", "up"],
            &["route", "add", "10.78.0.0/24", "dev", "dummy0"],
        ] {
            let mut full = vec!["-n", n];
            full.extend_from_slice(args);
            assert!(ip(&full), "ip {full:?}");
        }
        Some(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn an_any_destination_grant_still_refuses_loopback_link_local_and_own_addresses() {
    if !is_root() {
        eprintln!("SKIP: needs root");
        return;
    }
    let Some(cg) = TempCgroup::new("any") else { return };
    let Some(ns) = Netns::new() else { return };
    let own = ["169.254.169.254", "10.77.0.1", "fd00::1"];
    let egress = Egress::load(&rules(&["0.0.0.0/0:*", "[::]/0:*"], &own)).unwrap();
    let attached = egress.attach(&cg.dir()).unwrap();
    let tcp = |a: &str| json!({"kind": "tcp", "addr": a, "port": 80});
    let udp = |a: &str| json!({"kind": "udp_sendto", "addr": a, "port": 9});
    let cases = vec![
        tcp("127.0.0.1"),
        tcp("::1"),
        tcp("::ffff:127.0.0.1"),
        tcp("169.254.169.254"),
        tcp("::ffff:169.254.169.254"),
        tcp("169.254.1.1"),
        tcp("10.77.0.1"),
        tcp("fd00::1"),
        tcp("fe80::1"),
        udp("169.254.169.254"),
        udp("10.77.0.1"),
        // Allowed: into the dummy interface's route, dropped there.
        udp("10.78.0.5"),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let results = probe(tmp.path(), &cg, &["ip", "netns", "exec", &ns.0], &cases);
    let mut want = vec![EPERM; cases.len()];
    want[11] = 0;
    check(&cases, &results, &want);
    let d = egress.take_denials(attached.cgroup_id()).unwrap();
    let c = counts(&d);
    assert_eq!(d.total, 11, "{d:?}");
    for key in [("169.254.169.254:80", "tcp"), ("[fd00::1]:80", "tcp"), ("10.77.0.1:9", "udp")] {
        assert_eq!(c.get(&(key.0.to_owned(), key.1.to_owned())), Some(&1), "{key:?}: {d:?}");
    }
}

/// 32 entries, IPv4 and IPv6, with ports and without: the programs verify,
/// and the kernel decides as [`EgressRules::decide`] does.
fn thirty_two(port: u16) -> Vec<String> {
    let mut e = vec![format!("127.0.0.2:{port}"), format!("[::1]:{port}")];
    for i in 0..30u16 {
        e.push(match i % 3 {
            0 => format!("10.{i}.0.0/16:{}", 1000 + i),
            1 => format!("[2001:db8:{i:x}::]/48:*"),
            _ => format!("192.0.2.{i}:443"),
        });
    }
    e
}

#[test]
fn thirty_two_entries_verify_and_decide_like_the_reference() {
    if !is_root() {
        eprintln!("SKIP: needs root");
        return;
    }
    let Some(cg) = TempCgroup::new("32") else { return };
    let listener = TcpListener::bind("127.0.0.2:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let entries = thirty_two(port);
    let refs: Vec<&str> = entries.iter().map(String::as_str).collect();
    let r = rules(&refs, &["127.0.0.5"]);
    let egress = Egress::load(&r).unwrap();
    let attached = egress.attach(&cg.dir()).unwrap();
    let dests = [
        ("127.0.0.2", port),
        ("::ffff:127.0.0.2", port),
        ("127.0.0.2", port ^ 1),
        ("127.0.0.5", port),
        ("::1", port ^ 1),
        ("127.0.0.9", port),
    ];
    let cases: Vec<Value> =
        dests.iter().map(|(a, p)| json!({"kind": "tcp", "addr": a, "port": p})).collect();
    let tmp = tempfile::tempdir().unwrap();
    let results = probe(tmp.path(), &cg, &[], &cases);
    let want: Vec<i64> = dests
        .iter()
        .map(|(a, p)| {
            let ok = r.decide(a.parse().unwrap(), *p, policy::egress::Protocol::Tcp);
            if ok {
                0
            } else {
                EPERM
            }
        })
        .collect();
    assert_eq!(want, [0, 0, EPERM, EPERM, EPERM, EPERM]);
    check(&cases, &results, &want);
    assert_eq!(egress.take_denials(attached.cgroup_id()).unwrap().total, 4);
}

/// The cost of the rules (not a timed test: prints numbers for
/// BENCHMARKS.md). `cargo test -p ongrid-executor --test egress --
/// --ignored --nocapture cost`
#[test]
#[ignore = "a measurement, run by hand"]
fn cost_of_thirty_two_entries() {
    if !is_root() {
        eprintln!("SKIP: needs root");
        return;
    }
    let Some(bare) = TempCgroup::new("cost-bare") else { return };
    let Some(ruled) = TempCgroup::new("cost-ruled") else { return };
    let listener = TcpListener::bind("127.0.0.2:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            drop(s);
        }
    });
    let entries = thirty_two(port);
    let refs: Vec<&str> = entries.iter().map(String::as_str).collect();
    let r = rules(&refs, &[]);
    let dir = ruled.dir();
    let (mut loads, mut attaches, mut detaches, mut takes) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut kept = None;
    for _ in 0..20 {
        let t = std::time::Instant::now();
        let e = Egress::load(&r).unwrap();
        loads.push(t.elapsed());
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let a = e.attach(&dir).unwrap();
            attaches.push(t.elapsed());
            let id = a.cgroup_id();
            let t = std::time::Instant::now();
            drop(a);
            detaches.push(t.elapsed());
            let t = std::time::Instant::now();
            e.take_denials(id).unwrap();
            takes.push(t.elapsed());
        }
        kept = Some(e);
    }
    let mut v = [
        ("load", loads),
        ("attach (take included)", attaches),
        ("detach", detaches),
        ("take", takes),
    ];
    for (what, v) in &mut v {
        v.sort();
        eprintln!(
            "{what} (32 entries, 6 programs): p50 {:?}, max {:?}",
            v[v.len() / 2],
            v[v.len() - 1]
        );
    }
    let attached = kept.as_ref().map(|e| e.attach(&dir).unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let case = json!({"kind": "tcp_loop", "addr": "127.0.0.2", "port": port, "n": 3000});
    for round in 0..3 {
        let b = probe(tmp.path(), &bare, &[], std::slice::from_ref(&case));
        let w = probe(tmp.path(), &ruled, &[], std::slice::from_ref(&case));
        eprintln!(
            "round {round}: connect p50/p90 us: no programs {}/{}, 32 entries {}/{}",
            b[0]["p50_us"], b[0]["p90_us"], w[0]["p50_us"], w[0]["p90_us"]
        );
    }
    assert!(attached.is_some_and(|a| a.programs() == 6));
}

/// One loaded rule set shared by two runs: each cgroup's refusals are its
/// own, and a slot's reused cgroup starts clean.
#[test]
fn runs_sharing_one_rule_set_count_apart() {
    if !is_root() {
        eprintln!("SKIP: needs root");
        return;
    }
    let (Some(a), Some(b)) = (TempCgroup::new("share-a"), TempCgroup::new("share-b")) else {
        return;
    };
    let egress = Egress::load(&rules(&["10.0.0.0/8:443"], &[])).unwrap();
    let (att_a, att_b) = (egress.attach(&a.dir()).unwrap(), egress.attach(&b.dir()).unwrap());
    assert_ne!(att_a.cgroup_id(), att_b.cgroup_id());
    let tcp = |a: &str, p: u16| json!({"kind": "tcp", "addr": a, "port": p});
    let tmp = tempfile::tempdir().unwrap();
    check(&[tcp("127.0.0.7", 9)], &probe(tmp.path(), &a, &[], &[tcp("127.0.0.7", 9)]), &[EPERM]);
    let twice = [tcp("127.0.0.8", 9), tcp("127.0.0.8", 9)];
    check(&twice, &probe(tmp.path(), &b, &[], &twice), &[EPERM, EPERM]);
    let id_a = att_a.cgroup_id();
    drop(att_a);
    // A reused slot: attaching again drops what the last run left.
    let again = egress.attach(&a.dir()).unwrap();
    assert_eq!(egress.take_denials(again.cgroup_id()).unwrap().total, 0);
    assert_eq!(again.cgroup_id(), id_a);
    let d = egress.take_denials(att_b.cgroup_id()).unwrap();
    assert_eq!(counts(&d), BTreeMap::from([(("127.0.0.8:9".to_owned(), "tcp".to_owned()), 2)]));
    assert_eq!(d.total, 2);
}

/// The largest rule set a run may have verifies (IPv6 rules, the longest).
#[test]
fn the_largest_rule_set_verifies() {
    if !is_root() {
        eprintln!("SKIP: needs root");
        return;
    }
    // The default refusals, and the refusal of port 53 (IPv4 and IPv6).
    let n = policy::egress::rules::MAX_STEPS - policy::egress::rules::default_refusals().len() - 2;
    // Ports from 1000: none is 53, which would add refusals on 53.
    let entries: Vec<String> =
        (0..n).map(|i| format!("[2001:db8:{i:x}::1]:{}", 1000 + i)).collect();
    let refs: Vec<&str> = entries.iter().map(String::as_str).collect();
    let egress = Egress::load(&rules(&refs, &[]));
    assert!(egress.as_ref().is_ok_and(|e| e.programs() == 6), "{egress:?}");
}

/// A packet carrying a source route is dropped on its way out, its send
/// refused at once, though the address the send named is allowed: an IPv6
/// routing header (the kernel sends the packet to the header's address),
/// also behind a hop-by-hop header, and IPv4 options. The probe (root, no seccomp) sets them as socket
/// options, which a run's seccomp filter refuses; the drop also holds the
/// ones a `sendmsg` passes as control data. Everything stays on loopback.
#[test]
fn source_routed_packets_are_dropped() {
    if !is_root() {
        eprintln!("SKIP: needs root");
        return;
    }
    let Some(cg) = TempCgroup::new("route") else { return };
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::UdpSocket::bind("[::1]:0").map(|s| s.local_addr().unwrap().port());
    let Ok(port) = port else {
        eprintln!("SKIP: source_routed_packets_are_dropped: no IPv6 loopback");
        return;
    };
    let (v6, v4) = (format!("[::1]:{port}"), format!("127.0.0.2:{port}"));
    let egress = Egress::load(&rules(&[&v6, &v4], &[])).unwrap();
    let attached = egress.attach(&cg.dir()).unwrap();
    let send = |a: &str| json!({"kind": "udp_sendto", "addr": a, "port": port});
    let cases = vec![
        send("::1"),
        json!({"kind": "rthdr", "addr": "::1", "port": port, "via": "::1"}),
        json!({"kind": "rthdr", "addr": "::1", "port": port, "via": "::1", "hop": true}),
        send("127.0.0.2"),
        json!({"kind": "ip_options", "addr": "127.0.0.2", "port": port}),
    ];
    let results = probe(dir.path(), &cg, &[], &cases);
    check(&cases, &results, &[0, EPERM, EPERM, 0, EPERM]);
    drop(attached);
    let d = egress.take_denials(attached_id(&cg)).unwrap();
    let c = counts(&d);
    assert_eq!(c.get(&("*".to_owned(), "ip:43".to_owned())), Some(&2), "{c:?}");
    assert_eq!(c.get(&("*".to_owned(), "ip:0".to_owned())), Some(&1), "{c:?}");
}

/// The cgroup id of `cg` (its directory's inode).
fn attached_id(cg: &TempCgroup) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(&cg.0).unwrap().ino()
}
