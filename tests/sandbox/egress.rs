//! Egress allowlists: a networked run reaches exactly what its grant's
//! `connect` list names, from every process of the run and on every path
//! out (TCP, UDP, ICMP, a socket made before a fork); loopback is refused
//! under a bare `network = true`; with `dns = true` only the resolvers of
//! the configured resolv.conf answer on port 53. Every refusal is `EPERM`
//! within milliseconds and listed in the report.
//!
//! Every packet goes to loopback listeners this test opens, or to
//! addresses on interfaces of a network namespace the test makes.

use std::net::{TcpListener, UdpSocket};
use std::time::Duration;

use ongrid_tests::run::RunOptions;
use ongrid_tests::{Config, Run};
use serde_json::{json, Value};

use crate::{allowed, args, attack, no_leftovers, shared};

/// A refusal slower than this hung somewhere instead of failing at once
/// (a connect that hangs waits out its 2 s timeout).
const FAST_MS: f64 = 100.0;
/// The same for a case made in a new process (fork, exec, a socket passed
/// or inherited): its time includes making the process, which takes
/// hundreds of milliseconds in an emulated guest.
const FAST_IN_A_NEW_PROCESS_MS: f64 = 1000.0;

/// Runs the batch and returns each case's `(errno, ms)`.
fn batch(run: &Run, cases: &[Value]) -> Vec<(i64, f64)> {
    let r = allowed(run);
    let results = r["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), cases.len(), "{}", run.dump());
    results
        .iter()
        .map(|x| (x["errno"].as_i64().unwrap_or(-2), x["ms"].as_f64().unwrap_or(f64::MAX)))
        .collect()
}

/// Each case got its expected errno (0 = went through; [`PING`]: `EPERM`,
/// or `EACCES` when the host's `ping_group_range` leaves the run's group
/// out); each refusal fast. Returns the errnos.
fn check(run: &Run, cases: &[Value], want: &[i64]) -> Vec<i64> {
    let got = batch(run, cases);
    for ((c, (e, ms)), w) in cases.iter().zip(&got).zip(want) {
        let fine = e == w
            || *w == PING && [libc::EPERM, libc::EACCES].map(i64::from).contains(e)
            || *w == ROUTE && [libc::EPERM, libc::EINVAL].map(i64::from).contains(e);
        assert!(fine, "{c}: errno {e} in {ms:.1} ms, expected {w}:\n{}", run.dump());
        let direct = ["tcp", "udp_sendto", "udp_connect", "icmp"]
            .contains(&c["kind"].as_str().unwrap_or(""));
        let fast = if direct { FAST_MS } else { FAST_IN_A_NEW_PROCESS_MS };
        if *w != 0 {
            assert!(*ms < fast, "{c}: refused after {ms:.1} ms, not at once");
        }
    }
    got.into_iter().map(|(e, _)| e).collect()
}

/// The expected errno of a ping socket (see [`check`]).
const PING: i64 = -100;
/// The expected errno of a packet carrying a routing header as control
/// data: `EPERM` (dropped on its way out), or `EINVAL` where the kernel
/// has no Mobile IPv6 and takes no such header at all.
const ROUTE: i64 = -101;

fn network(run: &Run) -> Value {
    serde_json::to_value(&run.report).expect("report as JSON")["sandbox"]["network"].clone()
}

fn tcp(addr: &str) -> Value {
    json!({"kind": "tcp", "addr": addr})
}

/// Only the granted `127.0.0.2:PORT` connects; the same host on another
/// port, another host on that port, the v4-mapped spelling of the other
/// host, a UDP `sendto`, a ping socket, a connect on a socket made
/// before a fork and one on a socket passed over a Unix socket are
/// refused, from the run's process and from a forked, `setsid`,
/// double-forked or exec'd one; the report lists the refusals.
#[test]
fn allowlist_holds_every_path_out() {
    let Some(g) = shared("allowlist_holds_every_path_out") else { return };
    // Sixteen cases, five of them in new processes: seconds in an emulated guest.
    let skill = attack("egress_list")
        .with("sandbox", json!({"network": true}))
        .with("timeout_seconds", json!(30));
    let l = TcpListener::bind("127.0.0.2:0").expect("bind tcp");
    let p = l.local_addr().expect("addr").port();
    let other = if p == 65535 { p - 1 } else { p + 1 };
    let ok = format!("127.0.0.2:{p}");
    let config =
        Config::new().grant(skill.name(), &format!("network = true\nconnect = [\"{ok}\"]"));
    let refused = format!("127.0.0.3:{p}");
    let cases = vec![
        tcp(&ok),
        tcp(&format!("[::ffff:127.0.0.2]:{p}")),
        tcp(&format!("127.0.0.2:{other}")),
        tcp(&refused),
        tcp(&format!("[::ffff:127.0.0.3]:{p}")),
        json!({"kind": "udp_sendto", "addr": refused}),
        json!({"kind": "icmp", "addr": "127.0.0.2"}),
        json!({"kind": "inherit", "addr": refused}),
        json!({"kind": "inherit", "addr": ok}),
        json!({"kind": "fork", "case": tcp(&refused)}),
        json!({"kind": "setsid", "case": tcp(&refused)}),
        json!({"kind": "double_fork", "case": tcp(&refused)}),
        json!({"kind": "exec", "case": tcp(&refused)}),
        json!({"kind": "exec", "case": tcp(&ok)}),
        json!({"kind": "passed", "addr": refused}),
        json!({"kind": "passed", "addr": ok}),
    ];
    let run = skill.run(&config, &args("egress", json!({"cases": cases})));
    let eperm = i64::from(libc::EPERM);
    let mut want = vec![0, 0];
    want.extend([eperm; 10]);
    want[6] = PING;
    want[8] = 0;
    want.extend([eperm, 0, eperm, 0]);
    let got = check(&run, &cases, &want);
    // A ping socket the kernel refused for the group range never reached
    // the egress programs.
    let icmp = u64::from(got[6] == eperm);
    l.set_nonblocking(true).expect("nonblocking");
    let mut arrived = 0;
    while l.accept().is_ok() {
        arrived += 1;
    }
    assert_eq!(arrived, 5, "direct, v4-mapped, inherited, exec'd and passed connects to {ok}");

    let net = network(&run);
    assert_eq!(net["enabled"], true, "{net}");
    assert_eq!(net["enforced"], json!([ok]), "{net}");
    let count = |dest: &str, proto: &str| {
        net["denied"]
            .as_array()
            .and_then(|d| d.iter().find(|x| x["destination"] == dest && x["protocol"] == proto))
            .and_then(|x| x["count"].as_u64())
    };
    assert_eq!(
        count(&refused, "tcp"),
        Some(7),
        "direct, inherited, fork, setsid, double fork, exec, passed: {net}"
    );
    assert_eq!(count(&refused, "udp"), Some(1), "{net}");
    assert_eq!(count(&format!("127.0.0.2:{other}"), "tcp"), Some(1), "{net}");
    assert_eq!(count(&format!("[::ffff:127.0.0.3]:{p}"), "tcp"), Some(1), "{net}");
    if icmp == 1 {
        assert_eq!(count("*", "icmp"), Some(1), "the ping socket, refused when made: {net}");
    }
    assert_eq!(net["denied_total"], 10 + icmp, "{net}");
    no_leftovers(&skill, &g);
}

/// `network = true` without a list: loopback is refused (v4, v6, mapped),
/// at once, and the report counts it.
#[test]
fn bare_network_refuses_loopback() {
    let Some(g) = shared("bare_network_refuses_loopback") else { return };
    let skill = attack("egress_bare").with("sandbox", json!({"network": true}));
    let l = TcpListener::bind("127.0.0.1:0").expect("bind tcp");
    let p = l.local_addr().expect("addr").port();
    let config = Config::new().grant(skill.name(), "network = true");
    let cases = vec![
        tcp(&format!("127.0.0.1:{p}")),
        tcp(&format!("[::ffff:127.0.0.1]:{p}")),
        tcp(&format!("[::1]:{p}")),
        tcp(&format!("0.0.0.0:{p}")),
        json!({"kind": "udp_sendto", "addr": format!("127.0.0.1:{p}")}),
    ];
    let run = skill.run(&config, &args("egress", json!({"cases": cases})));
    check(&run, &cases, &[i64::from(libc::EPERM); 5]);
    l.set_nonblocking(true).expect("nonblocking");
    assert!(l.accept().is_err(), "a loopback connect got through a bare network grant");
    let net = network(&run);
    assert_eq!(net["enforced"], json!(["0.0.0.0/0:*", "[::]/0:*"]), "{net}");
    assert_eq!(net["denied_total"], 5, "{net}");
    no_leftovers(&skill, &g);
}

/// `dns = true`: the resolver of the configured resolv.conf (a fake one on
/// a loopback address) gets the query on port 53; another address on 53
/// is refused even though the grant opens it on every other port.
#[test]
fn dns_reaches_only_the_listed_resolvers() {
    let Some(g) = shared("dns_reaches_only_the_listed_resolvers") else { return };
    let skill = attack("egress_dns").with("sandbox", json!({"network": true}));
    let Ok(resolver) = UdpSocket::bind("127.0.0.57:53") else {
        ongrid_tests::host::skip("dns_reaches_only_the_listed_resolvers", "cannot bind :53");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("resolv.conf");
    std::fs::write(&conf, "nameserver 127.0.0.57\n").expect("resolv.conf");
    let config = Config::new()
        .setting(&format!("resolv_conf = \"{}\"", conf.display()))
        .grant(skill.name(), "network = true\nconnect = [\"127.0.0.0/8:*\"]\ndns = true");
    let cases = vec![
        json!({"kind": "udp_sendto", "addr": "127.0.0.57:53"}),
        json!({"kind": "udp_sendto", "addr": "127.0.0.55:53"}),
        tcp("127.0.0.55:53"),
    ];
    let run = skill.run(&config, &args("egress", json!({"cases": cases})));
    let eperm = i64::from(libc::EPERM);
    check(&run, &cases, &[0, eperm, eperm]);
    resolver.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
    let mut buf = [0u8; 64];
    let (n, _) = resolver.recv_from(&mut buf).expect("the query reaches the resolver");
    assert_eq!(&buf[..n], b"ongrid-udp");
    let net = network(&run);
    assert_eq!(net["dns"], true, "{net}");
    let enforced = net["enforced"].as_array().cloned().unwrap_or_default();
    assert!(enforced.contains(&json!("127.0.0.57:53")), "{net}");
    assert_eq!(net["denied_total"], 2, "{net}");
    no_leftovers(&skill, &g);
}

/// A network namespace this test made, with a veth pair holding a
/// link-local, a private and a unique-local address; removed on drop.
struct Netns(String);

impl Netns {
    fn new(name: &str) -> Option<Self> {
        let ip = |a: &[&str]| {
            std::process::Command::new("ip").args(a).status().is_ok_and(|s| s.success())
        };
        if !ip(&["netns", "add", name]) {
            return None;
        }
        let ns = Self(name.to_owned());
        let ok = ip(&["-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb"])
            && ip(&["-n", name, "addr", "add", "169.254.169.254/32", "dev", "vb"])
            && ip(&["-n", name, "addr", "add", "10.77.0.1/32", "dev", "vb"])
            && ip(&["-n", name, "addr", "add", "10.77.1.1/24", "brd", "+", "dev", "vb"])
            && ip(&["-n", name, "addr", "add", "fd00::1/128", "dev", "vb", "nodad"])
            && ["lo", "va", "vb"].iter().all(|d| ip(&["-n", name, "link", "set", d, "up"]));
        ok.then_some(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The executor run inside a network namespace this test made (one-shot,
/// or a served executor started in it): under a bare `network = true`,
/// the link-local metadata address and the namespace's own private and
/// unique-local addresses are refused at once, and so are the broadcast
/// addresses (the limited one and its subnet's, with `SO_BROADCAST`),
/// multicast (IPv4 and IPv6: both loop back to the host's own sockets) and
/// AWS's IPv6 metadata address. Every packet stays in that namespace.
#[test]
fn link_local_and_own_addresses_refused_in_a_netns() {
    let Some(g) = shared("link_local_and_own_addresses_refused_in_a_netns") else { return };
    let name = format!("ongrid-egress-{}", std::process::id());
    let Some(ns) = Netns::new(&name) else {
        ongrid_tests::host::skip("link_local_and_own_addresses_refused_in_a_netns", "no netns");
        return;
    };
    let skill = attack("egress_netns").with("sandbox", json!({"network": true}));
    let config = Config::new().grant(skill.name(), "network = true");
    let cases = vec![
        tcp("169.254.169.254:80"),
        json!({"kind": "udp_sendto", "addr": "169.254.169.254:80"}),
        tcp("10.77.0.1:80"),
        tcp("[fd00::1]:80"),
        json!({"kind": "udp_broadcast", "addr": "255.255.255.255:9"}),
        json!({"kind": "udp_broadcast", "addr": "10.77.1.255:9"}),
        json!({"kind": "udp_sendto", "addr": "224.0.0.1:9"}),
        json!({"kind": "udp_sendto", "addr": "[ff02::1]:9"}),
        tcp("[fd00:ec2::254]:80"),
    ];
    let opts = RunOptions::args(&args("egress", json!({"cases": cases}))).netns(&ns.0);
    let run = skill.run_with(&config, opts);
    check(&run, &cases, &[i64::from(libc::EPERM); 9]);
    assert_eq!(network(&run)["denied_total"], 9, "{}", run.raw);
    drop(ns);
    no_leftovers(&skill, &g);
}

/// `socket(2)` of `family`, `kind` and `protocol` in a run.
fn socket(family: i32, kind: i32, protocol: i32) -> Value {
    json!({"kind": "socket", "family": family, "type": kind, "protocol": protocol})
}

/// Under `network = true`: no source route (an IPv6 routing header would
/// send a packet judged for one address on to another: refused as a
/// socket option, dropped when a `sendmsg` carries it to `[::1]:9`, the
/// one address allowed, whose header names `::1` again), no vsock socket
/// (the hypervisor's services, which no egress rule judges); UDP, TCP and
/// netlink sockets as before.
#[test]
fn source_routes_and_other_socket_families_are_refused() {
    let Some(g) = shared("source_routes_and_other_socket_families_are_refused") else { return };
    let skill = attack("egress_families").with("sandbox", json!({"network": true}));
    let config = Config::new().grant(skill.name(), "network = true\nconnect = [\"[::1]:9\"]");
    let cases = vec![
        json!({"kind": "rthdr_cmsg", "addr": "[::1]:9"}),
        json!({"kind": "rthdr", "addr": "fd99::5"}),
        json!({"kind": "ip_options"}),
        socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0),
        socket(libc::AF_INET6, libc::SOCK_DGRAM, 0),
        socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_TCP),
        socket(libc::AF_NETLINK, libc::SOCK_RAW, 0),
    ];
    let run = skill.run(&config, &args("egress", json!({"cases": cases})));
    let eperm = i64::from(libc::EPERM);
    check(&run, &cases, &[ROUTE, eperm, eperm, eperm, 0, 0, 0]);
    no_leftovers(&skill, &g);
}

/// A run granted `CAP_NET_RAW` with the network still makes no raw IP
/// socket (its packets would pass no address hook) and no packet socket,
/// and sets no IPv4 source route: the grant's list holds.
#[test]
fn cap_net_raw_does_not_open_the_allowlist() {
    let Some(g) = shared("cap_net_raw_does_not_open_the_allowlist") else { return };
    let sandbox = json!({"network": true, "capabilities": ["CAP_NET_RAW"]});
    let skill = attack("egress_raw").with("sandbox", sandbox);
    let grant = "network = true\nconnect = [\"127.0.0.2:9\"]\ncapabilities = [\"CAP_NET_RAW\"]";
    let config = Config::new().grant(skill.name(), grant);
    let cases = vec![
        socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_UDP),
        socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_TCP),
        socket(libc::AF_PACKET, libc::SOCK_DGRAM, 0),
        json!({"kind": "ip_options"}),
        socket(libc::AF_INET, libc::SOCK_DGRAM, 0),
    ];
    let run = skill.run(&config, &args("egress", json!({"cases": cases})));
    let sb = run.report.sandbox.as_ref().expect("sandbox report");
    assert_eq!(sb.capabilities, ["CAP_NET_RAW"], "not granted:\n{}", run.dump());
    let eperm = i64::from(libc::EPERM);
    check(&run, &cases, &[eperm, eperm, eperm, eperm, 0]);
    no_leftovers(&skill, &g);
}
