//! Admission: manifests outside the roots, peer classes and uids, the
//! run cap and queue, held runs, what is logged for a refusal.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use executor::config::PeerClasses;
use policy::wire::code;
use policy::SkillClass;
use serde_json::{json, Value};

use crate::common;
use crate::support::*;

/// A manifest outside the roots, a relative path, a missing file, a FIFO
/// (which once blocked an executor thread in `open`) and a directory are
/// `rejected` before any slot is taken, counted with `skill=""`.
#[test]
fn manifests_outside_the_roots_are_rejected() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let elsewhere = dir_0755();
    let outside = skill(elsewhere.path(), "outside", "safe", 5, "cat");
    std::fs::create_dir_all(server.root.join("fifo")).unwrap();
    let fifo = server.root.join("fifo/skill.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let dir = server.root.join("dir/skill.json");
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = server.client();
    for (i, path) in [
        outside.clone(),
        PathBuf::from("outside/skill.json"),
        server.root.join("nope/skill.json"),
        server.root.join("../outside/skill.json"),
        fifo,
        dir,
    ]
    .iter()
    .enumerate()
    {
        c.execute(i as u64, path, json!({}));
        let (_, v) = c.run_result();
        assert_eq!(v["result"]["outcome"], "rejected", "{path:?}: {v}");
    }
    let text = server.metrics();
    assert_eq!(runs_total(&text, "", "rejected"), 6.0);
    assert_eq!(sample(&text, "ongrid_executor_run_duration_seconds_count"), 0.0);
}

/// `[[peers]]` restricts the classes a peer uid may run, by the class the
/// executor reads; a class claim that differs from the manifest is denied.
#[test]
fn classes_not_allowed_for_the_peer_are_denied() {
    if !can_run() {
        return;
    }
    let server = Server::start(|c| {
        c.peers = vec![PeerClasses { uid: Some(0), user: None, classes: vec![SkillClass::Safe] }];
    });
    let mutating = skill(&server.root, "mut", "mutating", 5, "cat");
    let safe = skill(&server.root, "safe", "safe", 5, "cat");
    let mut c = server.client();
    c.execute(1, &mutating, json!({}));
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "denied", "{v}");
    assert!(v["result"]["error"].as_str().unwrap().contains("may not run mutating"));
    c.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "execute",
        "params": {"manifest": safe, "args": {}, "class": "dangerous"}}));
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "denied", "{v}");
    c.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "execute",
        "params": {"manifest": safe, "args": {}, "class": "safe"}}));
    assert_eq!(c.run_result().1["result"]["outcome"], "ok");
    let text = server.metrics();
    assert_eq!(runs_total(&text, "mut", "denied"), 1.0);
    assert_eq!(runs_total(&text, "safe", "denied"), 1.0);
    assert_eq!(runs_total(&text, "safe", "ok"), 1.0);
}

/// Beyond `max_concurrent_runs` + `max_queued_runs` an `execute` gets the
/// BUSY error at once; a queued run is told so (`queued`), and starts
/// (`started`) when a slot frees up.
#[test]
fn busy_beyond_the_cap_and_the_queue() {
    if !can_run() {
        return;
    }
    let server = Server::start(|c| {
        c.max_concurrent_runs = 1;
        c.max_queued_runs = 1;
    });
    let mark = marker(1);
    let slow = skill(&server.root, "slow", "safe", 30, &format!("exec sleep {mark}"));
    let quick = skill(&server.root, "quick", "safe", 5, "echo '{\"q\":1}'");
    let mut a = server.client();
    a.execute(1, &slow, json!({}));
    server.wait_in_flight(1);
    let mut b = server.client();
    b.execute(2, &quick, json!({}));
    wait_gauge("runs_queued", &server.metrics.runs_queued, 1);
    let queued_at = Instant::now();
    // B is told it waits for a slot (A was not).
    let v = b.recv();
    assert_eq!((&v["method"], &v["params"]["id"]), (&json!("queued"), &json!(2)), "{v}");
    let mut c = server.client();
    c.execute(3, &quick, json!({}));
    let v = c.recv();
    assert_eq!(v["id"], 3);
    assert_eq!(v["error"]["code"], json!(code::BUSY), "{v}");
    // Closing A kills its run; B's queued run takes the slot.
    std::thread::sleep(Duration::from_millis(100));
    let queued_for = queued_at.elapsed().as_secs_f64();
    drop(a);
    let v = b.recv();
    assert_eq!((&v["method"], &v["params"]["id"]), (&json!("started"), &json!(2)), "{v}");
    let (_, v) = b.run_result();
    assert_eq!(v["result"]["outcome"], "ok", "{v}");
    assert!(common::procs_with(&mark).is_empty());
    let text = server.metrics();
    assert_eq!(runs_total(&text, "quick", "busy"), 1.0);
    assert_eq!(runs_total(&text, "quick", "ok"), 1.0);
    assert_eq!(runs_total(&text, "slow", "signaled"), 1.0);
    assert_eq!(sample(&text, "ongrid_executor_queue_wait_seconds_count"), 2.0);
    let waited = sample(&text, "ongrid_executor_queue_wait_seconds_sum");
    assert!(waited >= queued_for, "B waited in the queue {waited} s, at least {queued_for} s");
    assert_eq!(server.metrics.runs_queued.get(), 0);
}

/// A held `execute` is checked and prepared, but its skill starts only on
/// the `start` naming it (a stamp taken before the `start` is not later
/// than the skill's clock); the wait is not counted as setup or duration;
/// a `start` for another id starts nothing; a second held run with the
/// same id replaces the first; a held run whose connection closes never
/// runs and is not counted; one never started ends `rejected` after
/// `hold_timeout_seconds`.
#[test]
fn held_runs_spawn_only_on_their_start() {
    if !can_run() {
        return;
    }
    let server = Server::start(|c| c.hold_timeout_seconds = 2);
    let m =
        skill(&server.root, "stamp", "safe", 5, "printf '{\"t\":%s}\\n' \"$(/bin/date +%s%N)\"");
    let unix_ns =
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let held = |c: &mut Client, id: u64| {
        c.send(&json!({"jsonrpc": "2.0", "id": id, "method": "execute",
            "params": {"manifest": m, "args": {}, "hold": true}}));
    };
    let start = |c: &mut Client, id: u64| {
        c.send(&json!({"jsonrpc": "2.0", "method": "start", "params": {"id": id}}));
    };

    let mut c = server.client();
    let sent = Instant::now();
    held(&mut c, 1);
    wait_gauge("runs_held", &server.metrics.runs_held, 1);
    let prepared = sent.elapsed();
    start(&mut c, 99);
    std::thread::sleep(Duration::from_millis(300));
    let before = unix_ns();
    let started = Instant::now();
    start(&mut c, 1);
    let (_, v) = c.run_result();
    let answered = started.elapsed();
    let report = &v["result"];
    assert_eq!(v["id"], 1);
    assert_eq!(report["outcome"], "ok", "{report}");
    let t = report["result"]["t"].as_u64().unwrap();
    assert!(
        u128::from(t) >= before,
        "the skill ran {} ms before its start",
        (before - u128::from(t)) / 1_000_000
    );
    // Bounds from the client's own clock, whatever the host's load. Both
    // figures count the preparation before the hold plus time after the
    // start: setup up to the spawn, duration up to the exit. The
    // preparation ends before the held gauge shows the run, the rest lies
    // between the start and the answer; a counted hold (the 300 ms sleep,
    // in neither window) would not fit.
    let setup = Duration::from_micros(report["setup_us"].as_u64().unwrap());
    let duration = Duration::from_millis(report["duration_ms"].as_u64().unwrap());
    assert!(
        setup <= prepared + answered,
        "the hold counted as setup ({prepared:?} to prepare, {answered:?} from start to answer): {report}"
    );
    assert!(
        duration <= setup + answered,
        "the hold counted as duration ({answered:?} from start to answer): {report}"
    );

    // A second held run with the same id replaces the first, which ends
    // unstarted; the start then goes to the second.
    held(&mut c, 5);
    server.wait_in_flight(1);
    held(&mut c, 5);
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "rejected", "{v}");
    start(&mut c, 5);
    let (_, v) = c.run_result();
    assert_eq!((&v["id"], &v["result"]["outcome"]), (&json!(5), &json!("ok")), "{v}");

    // Held, then the connection closes: nothing runs, nothing is counted.
    held(&mut c, 2);
    server.wait_in_flight(1);
    drop(c);
    server.wait_in_flight(0);
    // Held and never started: rejected once the hold times out.
    let mut c = server.client();
    let asked = Instant::now();
    held(&mut c, 3);
    let (_, v) = c.run_result();
    assert!(asked.elapsed() >= Duration::from_secs(2), "{v}");
    assert_eq!(v["result"]["outcome"], "rejected", "{v}");
    assert!(v["result"]["error"].as_str().unwrap().contains("not started"), "{v}");

    let text = server.metrics();
    assert_eq!(runs_total(&text, "stamp", "ok"), 2.0);
    assert_eq!(runs_total(&text, "stamp", "rejected"), 2.0);
    assert_eq!(sample(&text, "ongrid_sandbox_setup_seconds_count"), 2.0);
}

fn python_client(socket: &Path) -> std::process::Output {
    const SCRIPT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
except OSError:
    pass
s.settimeout(10)
data = b""
while True:
    try:
        d = s.recv(65536)
    except OSError:
        break
    if not d:
        break
    data += d
    if b"ok" in data:
        break
sys.stdout.write(data.decode())
"#;
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"])
        .arg(SCRIPT)
        .arg(socket)
        .output()
        .unwrap()
}

/// A peer whose uid and gid are not allowed gets FORBIDDEN and the
/// connection closes; the same peer listed in allowed_uids is served.
#[test]
fn peers_not_allowed_are_refused() {
    if !can_run() {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        eprintln!("SKIP: /usr/bin/python3 missing");
        return;
    }
    let server = Server::start(|c| {
        c.allowed_uids = Some(vec![0]);
        c.allowed_gids = Some(vec![0]);
        c.socket_mode = "0666".into();
    });
    let out = python_client(&server.socket);
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text:?} {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["error"]["code"], json!(code::FORBIDDEN), "{v}");
    assert_eq!(v["id"], Value::Null);
    assert!(v["error"]["message"].as_str().unwrap().contains("uid 65534"));
    let text = server.metrics();
    assert_eq!(sample(&text, "ongrid_executor_peer_rejected_total"), 1.0);
    assert_eq!(sample(&text, "ongrid_executor_connections"), 0.0);
    // Root is still served.
    let mut c = server.client();
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    assert_eq!(c.recv()["result"]["ok"], true);

    let allowed = Server::start(|c| {
        c.allowed_uids = Some(vec![65534]);
        c.allowed_gids = Some(vec![]);
        c.socket_mode = "0666".into();
    });
    let out = python_client(&allowed.socket);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["result"]["ok"], true, "{v}");
    assert_eq!(sample(&allowed.metrics(), "ongrid_executor_peer_rejected_total"), 0.0);
}

/// At the default log level (`warn`, no `ONGRID_LOG`) the real `serve`
/// says why it refused a run (an entry made group-writable: a tamper
/// signal) and why a sandbox could not be set up, naming the skill; the
/// args never reach the log.
#[test]
fn refusals_and_sandbox_failures_are_logged_at_warn() {
    if !can_run() {
        return;
    }
    let root = dir_0755();
    let runtime = dir_0755();
    let socket = runtime.path().join("x.sock");
    let config = runtime.path().join("executor.toml");
    let ghost_user = "no-such-user-zq";
    std::fs::write(
        &config,
        format!(
            "roots = [{:?}]\nruntime_dir = {:?}\nsocket = {:?}\n\
             [skills.ghost]\nrun_as = [{ghost_user:?}]\n",
            root.path(),
            runtime.path(),
            socket
        ),
    )
    .unwrap();
    let tamper = skill(root.path(), "tamper", "safe", 5, "cat");
    std::fs::set_permissions(
        tamper.with_file_name("run.sh"),
        std::fs::Permissions::from_mode(0o775),
    )
    .unwrap();
    let ghost = skill(root.path(), "ghost", "safe", 5, "cat");
    std::fs::write(
        &ghost,
        format!(
            r#"{{"name":"ghost","description":"t","entry":"run.sh","sandbox":{{"run_as":"{ghost_user}"}}}}"#
        ),
    )
    .unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_ongrid-executor"))
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove("ONGRID_LOG")
        .env_remove("JOURNAL_STREAM")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut spawned = Spawned(child);
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let secret = marker(11);
    let mut c = Client::connect(&socket);
    c.execute(1, &tamper, json!({"token": secret}));
    let (_, rejected) = c.run_result();
    assert_eq!(rejected["result"]["outcome"], "rejected", "{rejected}");
    let rejected_why = rejected["result"]["error"].as_str().unwrap().to_owned();
    c.execute(2, &ghost, json!({"token": secret}));
    let (_, failed) = c.run_result();
    assert_eq!(failed["result"]["outcome"], "sandbox_failed", "{failed}");
    let failed_why = failed["result"]["error"].as_str().unwrap().to_owned();
    drop(c);

    let child = &mut spawned.0;
    sigterm(child);
    assert_eq!(wait_child(child), (Some(0), None));
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    let warned = |skill: &str, outcome: &str, why: &str| {
        log.lines().any(|l| {
            l.contains("WARN")
                && l.contains(&format!("run \"{skill}\" {outcome}: "))
                && l.contains(why)
        })
    };
    assert!(warned("tamper", "rejected", &rejected_why), "{rejected_why}\n{log}");
    assert!(warned("ghost", "sandbox_failed", &failed_why), "{failed_why}\n{log}");
    assert!(!log.contains(&secret), "the args reached the log:\n{log}");
}
