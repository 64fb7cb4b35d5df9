//! The executor going away and coming back: 503 while it is down, runs
//! work again once it is back, without restarting ongrid-skilld. And
//! ongrid-skilld's drain on SIGTERM: runs in flight finish, or are cut at
//! the drain's deadline.

use std::fs;
use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::json;

use crate::harness::{
    blocked_signals, eventually, nofile_limits, process_alive, process_running, with_blocked,
    write_skill, Stack,
};

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

/// A run still in flight when skilld's drain budget ends (the queue
/// timeout, the longest timeout of a registered skill or a run allowed,
/// the report's slack, at most `drain_timeout_seconds`) is cut: the
/// client's stream ends without a report, the skill's process is killed
/// (the executor sees skilld's connection close), skilld exits 0 right
/// after the budget, and the run's audit row is completed and flushed
/// into the database as cut by the stop (not left open for the next start
/// to call `interrupted`).
///
/// To outlive the budget within a test's time, the run is of a skill with
/// a 60 s timeout under a `drain_timeout_seconds` of 6. (Stopping the
/// executor instead does not get there: skilld gives up on a run's report
/// at its own timeout plus the same slack, inside the budget.)
#[test]
fn a_run_outliving_skilld_drain_is_cut_and_recorded_so() {
    if Command::new("sqlite3").arg("-version").output().is_err() {
        eprintln!(
            "SKIP a_run_outliving_skilld_drain_is_cut_and_recorded_so: needs sqlite3 \
             (reads the audit database skilld left)"
        );
        return;
    }
    let mut s = Stack::start_with("", "queue_timeout_seconds = 1\ndrain_timeout_seconds = 6\n");
    let pid_then_sleep = "echo \"pid=$$\" >&2\nexec /bin/sleep 60";
    write_skill(&s.skills, "lingerer", r#","timeout_seconds":60"#, pid_then_sleep);
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    let mut conn = crate::cancel::open_stream(&s.socket, "lingerer");
    let pid = crate::cancel::read_pid(&mut conn);
    let budget = Duration::from_secs(6);

    // The client reads what is left of its answer until the connection ends.
    conn.set_read_timeout(Some(budget + Duration::from_secs(20))).unwrap();
    let client = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let read = conn.read_to_end(&mut rest).map(drop);
        (read, String::from_utf8_lossy(&rest).into_owned(), Instant::now())
    });
    let term = Instant::now();
    s.signal_skilld(Signal::SIGTERM);

    // The drain waits for the run until the budget is nearly over.
    std::thread::sleep(budget - Duration::from_secs(2));
    assert!(process_running(pid), "the run {pid} was cut before the drain's end\n{}", s.logs());
    assert!(!client.is_finished(), "the answer ended before the drain's end\n{}", s.logs());
    assert!(s.wait_skilld(Duration::ZERO).is_none(), "skilld left before its drain's end");

    // Then it is cut, and skilld exits at once.
    let st = s.wait_skilld(Duration::from_secs(10)).unwrap_or_else(|| {
        panic!("skilld still draining {:?} after SIGTERM\n{}", term.elapsed(), s.logs())
    });
    let took = term.elapsed();
    assert!(st.success(), "{st}\n{}", s.logs());
    assert!(took >= budget - Duration::from_millis(500), "skilld exited after {took:?}");
    assert!(took < budget + Duration::from_secs(5), "skilld exited after {took:?}");
    assert!(
        s.logs().contains("drain deadline passed"),
        "not ended by the drain's deadline\n{}",
        s.logs()
    );

    // The client's connection was closed (no hang), and the stream has no
    // report: the run did not end, it was cut.
    let (read, rest, ended) = client.join().unwrap();
    read.unwrap_or_else(|e| panic!("the client's stream did not end: {e}\n{}", s.logs()));
    assert!(ended.duration_since(term) >= budget - Duration::from_millis(500), "{rest}");
    assert!(!rest.contains("\"event\":\"report\""), "a report for a cut run: {rest}");
    assert!(!rest.contains("\"event\":\"error\""), "{rest}");
    assert!(!rest.ends_with("0\r\n\r\n"), "the cut stream looks complete: {rest:?}");

    // Nothing of the run is left; the executor carries on.
    assert!(
        eventually(Duration::from_secs(5), || !process_running(pid)),
        "the run {pid} outlived skilld\n{}",
        s.logs()
    );
    let executor = i32::try_from(s.executor_pid().unwrap()).unwrap();
    assert!(process_alive(executor, "ongrid-executor"), "{}", s.logs());

    // The run's row is in the database, completed as cut by the stop, and
    // no row is left open; the journal is empty.
    let db = s.base.join("audit.db");
    let sql = |q: &str| {
        let out = Command::new("sqlite3").arg(&db).arg(q).output().unwrap();
        assert!(out.status.success(), "sqlite3: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let rows =
        sql("SELECT decision, outcome, error, finished_at IS NOT NULL, duration_ms >= 5000 \
         FROM audit WHERE skill = 'lingerer'");
    assert_eq!(
        rows.lines().collect::<Vec<_>>(),
        ["allow|cancelled|ongrid-skilld stopped before the run ended|1|1"],
        "{}",
        s.logs()
    );
    assert_eq!(sql("SELECT count(*) FROM audit WHERE outcome IS NULL").trim(), "0");
    let journal = s.base.join("audit.db-rows");
    assert!(fs::metadata(&journal).map_or(true, |m| m.len() == 0), "rows left in the journal");
}

/// A reload that shortens a skill's timeout while a run of it is in
/// flight does not shorten skilld's drain for that run: the budget counts
/// the longest timeout of any run allowed, not only of the skills
/// registered at the stop. Before, the run below (60 s timeout, 28 s
/// long) was cut at 17 s (1 s queue + the registry's 1 s + 15 s of slack)
/// and recorded `cancelled`.
#[test]
fn a_reload_shortening_a_running_skills_timeout_does_not_shorten_the_drain() {
    let mut s = Stack::start_with("", "queue_timeout_seconds = 1\n");
    let script =
        |sleep: u32| format!("echo \"pid=$$\" >&2\n/bin/sleep {sleep}\necho '{{\"done\":true}}'");
    write_skill(&s.skills, "longrun", r#","timeout_seconds":60"#, &script(28));
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    let mut conn = crate::cancel::open_stream(&s.socket, "longrun");
    let pid = crate::cancel::read_pid(&mut conn);

    // The registry's longest timeout becomes 1 s.
    for name in ["echo", "fail", "strict", "sleeper", "finisher"] {
        fs::remove_dir_all(s.skills.join(name)).unwrap();
    }
    write_skill(&s.skills, "longrun", r#","timeout_seconds":1"#, &script(28));
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    let listed = s.get("/v1/skills").json();
    let timeouts: Vec<_> =
        listed["items"].as_array().unwrap().iter().map(|i| i["timeout_seconds"].clone()).collect();
    assert_eq!(timeouts, [json!(1), json!(1)], "{listed}");

    conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let client = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let read = conn.read_to_end(&mut rest).map(drop);
        (read, String::from_utf8_lossy(&rest).into_owned())
    });
    s.signal_skilld(Signal::SIGTERM);
    let st = s.wait_skilld(Duration::from_secs(60)).expect("skilld exits once drained");
    assert!(st.success(), "{st}\n{}", s.logs());
    let (read, rest) = client.join().unwrap();
    read.unwrap_or_else(|e| panic!("the client's stream did not end: {e}\n{}", s.logs()));
    assert!(rest.contains("\"event\":\"report\""), "no report: {rest}\n{}", s.logs());
    assert!(rest.contains("\"outcome\":\"ok\""), "{rest}");
    assert!(rest.contains("\"result\":{\"done\":true}"), "{rest}");
    assert!(!s.logs().contains("drain deadline passed"), "{}", s.logs());
    assert!(!process_running(pid), "the run {pid} outlived skilld");
}

/// A parent that blocks the stop signals around its spawn (a supervisor,
/// a tool that waits for them in a thread of its own) hands its mask on
/// through `exec`: the daemons clear it, so they still stop on SIGTERM
/// (and skilld reloads on SIGHUP). Before the fix, both ignored SIGTERM
/// for good: the signal stayed pending.
#[test]
fn daemons_started_with_the_stop_signals_blocked_still_stop_on_them() {
    let mut s = with_blocked(&[Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP], Stack::start);
    assert_runs(&s, 1);
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        assert!(!blocked_signals(s.skilld_pid()).contains(sig), "skilld blocks {sig}");
        let executor = s.executor_pid().unwrap();
        assert!(!blocked_signals(executor).contains(sig), "the executor blocks {sig}");
    }
    s.signal_skilld(Signal::SIGHUP);
    assert!(
        eventually(Duration::from_secs(10), || s.logs().contains("SIGHUP: rescanning")),
        "skilld did not reload on SIGHUP:\n{}",
        s.logs()
    );
    let status = s.stop_executor(Signal::SIGTERM);
    assert!(status.success(), "{status}");
    s.signal_skilld(Signal::SIGTERM);
    let status = s.wait_skilld(Duration::from_secs(20));
    assert!(status.is_some_and(|st| st.success()), "skilld: {status:?}\n{}", s.logs());
}

/// Started from a shell at a soft `RLIMIT_NOFILE` of 1024 (as systemd
/// starts services): each daemon raises its soft limit towards the hard
/// one, to its own ceiling, and runs as before.
#[test]
fn daemons_started_at_a_soft_nofile_of_1024_raise_it() {
    let hard = nofile_limits(std::process::id()).1;
    if hard <= 1024 {
        println!("SKIP: the hard RLIMIT_NOFILE here is {hard}: nothing to raise to");
        return;
    }
    let s = Stack::start_under("", "", Some("ulimit -Sn 1024"));
    assert_runs(&s, 1);
    let executor = s.executor_pid().unwrap();
    let (soft, _) = nofile_limits(executor);
    assert_eq!(soft, hard.min(65_536), "the executor's soft limit");
    let (soft, _) = nofile_limits(s.skilld_pid());
    assert_eq!(soft, hard.min(16_384), "skilld's soft limit");
}
