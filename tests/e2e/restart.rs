//! The executor going away and coming back: 503 while it is down, runs
//! work again once it is back, without restarting ongrid-skilld.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;

use crate::harness::{eventually, process_alive, process_running, Stack};

fn assert_unavailable(s: &Stack) {
    let r = s.execute("echo", &json!({"n": 1}));
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], "executor_unavailable");
    assert_eq!(s.get("/v1/health").json()["executor"], "down");
    // The registry still answers.
    assert_eq!(s.get("/v1/skills").status, 200);
}

fn assert_runs(s: &Stack, n: i64) {
    let r = s.execute("echo", &json!({"n": n}));
    assert_eq!(r.status, 200, "{}\n{}", String::from_utf8_lossy(&r.body), s.logs());
    assert_eq!(r.json()["result"], json!({"n": n}));
}

#[test]
fn executor_restart_while_idle() {
    let mut s = Stack::start();
    assert_runs(&s, 1);
    let st = s.stop_executor(Signal::SIGTERM);
    assert!(st.success(), "executor exit after SIGTERM: {st}\n{}", s.logs());
    assert!(!s.executor_socket.exists(), "the executor removes its socket");
    assert_unavailable(&s);
    s.start_executor();
    assert_runs(&s, 2);
    assert_eq!(s.get("/v1/health").json()["executor"], "up");
}

/// SIGTERM during a run: the executor stops accepting but lets the run
/// finish, then exits 0; after a restart runs work.
#[test]
fn executor_sigterm_during_a_run_lets_it_finish() {
    let mut s = Stack::start();
    let socket = s.socket.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    // Streamed, so the skill's first stderr line says it is running.
    let run = std::thread::spawn(move || crate::cancel::stream_with_pid(&socket, "finisher", &tx));
    rx.recv_timeout(Duration::from_secs(30)).expect("the run never started");
    s.signal_executor(Signal::SIGTERM);
    let rest = run.join().unwrap();
    assert!(rest.contains("\"outcome\":\"ok\""), "{rest}\n{}", s.logs());
    assert!(rest.contains("\"result\":{\"done\":true}"), "{rest}");
    let st = s.wait_executor();
    assert!(st.success(), "{st}");
    assert_unavailable(&s);
    s.start_executor();
    assert_runs(&s, 3);
}

/// The executor killed (SIGKILL) mid-run: the client gets a 503, the
/// skill's process does not outlive the executor's restart, runs work.
#[test]
fn executor_killed_during_a_run() {
    let mut s = Stack::start();
    let socket = s.socket.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let run = std::thread::spawn(move || crate::cancel::stream_with_pid(&socket, "sleeper", &tx));
    let pid = rx.recv_timeout(Duration::from_secs(20)).expect("sleeper started");
    assert!(process_running(pid), "sleeper {pid} running");
    s.stop_executor(Signal::SIGKILL);
    let rest = run.join().unwrap();
    assert!(rest.contains("\"event\":\"error\""), "the stream ends with an error: {rest}");
    assert_unavailable(&s);
    s.start_executor();
    // Gone by now: killed with its executor, or swept by the new one.
    assert!(
        eventually(Duration::from_secs(10), || !process_alive(pid, "sleep")),
        "sleeper {pid} survived the executor's death and restart\n{}",
        s.logs()
    );
    assert_runs(&s, 4);
}

/// SIGTERM to skilld during a run: it stops accepting at once (a new
/// client is refused, not left hanging in the backlog until skilld
/// exits), lets the run in flight finish and answer, then exits 0.
#[test]
fn skilld_sigterm_during_a_run_refuses_new_clients_and_lets_it_finish() {
    let mut s = Stack::start();
    let socket = s.socket.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let run = std::thread::spawn(move || crate::cancel::stream_with_pid(&socket, "finisher", &tx));
    rx.recv_timeout(Duration::from_secs(30)).expect("the run never started");
    s.signal_skilld(Signal::SIGTERM);
    // Refused while the run (1 s) is still going.
    let refused = eventually(Duration::from_millis(300), || {
        std::os::unix::net::UnixStream::connect(&s.socket).is_err()
    });
    assert!(!run.is_finished(), "the run ended before the check");
    assert!(refused, "skilld still accepts connections while it drains\n{}", s.logs());
    let rest = run.join().unwrap();
    assert!(rest.contains("\"outcome\":\"ok\""), "{rest}\n{}", s.logs());
    assert!(rest.contains("\"result\":{\"done\":true}"), "{rest}");
    let st = s.wait_skilld(Duration::from_secs(20)).expect("skilld exits after its drain");
    assert!(st.success(), "{st}\n{}", s.logs());
}

/// While skilld drains after SIGTERM, a client that hangs up still has its
/// run killed (the connection's checks go on during the drain), rather
/// than the run holding its slot until its own deadline.
#[test]
fn a_client_gone_during_skilld_drain_has_its_run_killed() {
    let mut s = Stack::start();
    let mut conn = crate::cancel::open_stream(&s.socket, "sleeper");
    let pid = crate::cancel::read_pid(&mut conn);
    s.signal_skilld(Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    assert!(process_running(pid), "the sleeper {pid} died with the SIGTERM alone");
    drop(conn);
    assert!(
        eventually(Duration::from_secs(5), || !process_running(pid)),
        "the sleeper {pid} outlived its client during the drain\n{}",
        s.logs()
    );
    let st = s.wait_skilld(Duration::from_secs(20)).expect("skilld exits once drained");
    assert!(st.success(), "{st}");
}
