//! A client that goes away mid-run: the run is killed (the skill process
//! is gone from /proc) and both daemons carry on.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::harness::{eventually, process_alive, process_running, Stack};

/// Starts `skill` with the NDJSON stream, reads until its `pid=N` stderr
/// line and sends N through `pid`, then reads to the end of the answer
/// and returns those bytes.
pub fn stream_with_pid(socket: &Path, skill: &str, pid: &std::sync::mpsc::Sender<i32>) -> String {
    let mut s = open_stream(socket, skill);
    let _ = pid.send(read_pid(&mut s));
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    String::from_utf8_lossy(&rest).into_owned()
}

pub fn open_stream(socket: &Path, skill: &str) -> UnixStream {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = json!({"args": {}}).to_string();
    let req = format!(
        "POST /v1/skills/{skill}/execute HTTP/1.1\r\nHost: localhost\r\n\
         Accept: application/x-ndjson\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    s
}

pub fn read_pid(s: &mut UnixStream) -> i32 {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended before the pid: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&seen);
        if let Some(at) = text.find("pid=") {
            let digits: String = text[at + 4..].chars().take_while(char::is_ascii_digit).collect();
            if !digits.is_empty() && text[at + 4 + digits.len()..].contains('"') {
                return digits.parse().unwrap();
            }
        }
    }
}

#[test]
fn client_disconnecting_mid_run_kills_the_run() {
    let mut s = Stack::start();
    for mode in ["stream", "json"] {
        let mut conn = if mode == "stream" {
            open_stream(&s.socket, "sleeper")
        } else {
            let mut c = UnixStream::connect(&s.socket).unwrap();
            let body = json!({"args": {}}).to_string();
            let req = format!(
                "POST /v1/skills/sleeper/execute HTTP/1.1\r\nHost: localhost\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            c.write_all(req.as_bytes()).unwrap();
            c
        };
        let pid = if mode == "stream" {
            read_pid(&mut conn)
        } else {
            // No stream to read the pid from: find the sleeper in /proc.
            started_sleeper(&s)
        };
        assert!(process_running(pid), "{mode}: sleeper {pid} running");
        drop(conn);
        assert!(
            eventually(Duration::from_secs(5), || !process_alive(pid, "sleep")),
            "{mode}: sleeper {pid} still running after the client left\n{}",
            s.logs()
        );
    }
    assert!(s.both_alive());
    let r = s.execute("echo", &json!({"n": 5}));
    assert_eq!(r.json()["result"], json!({"n": 5}));
}

/// The pid of this stack's `sleeper` once it runs (10 s at most).
fn started_sleeper(s: &Stack) -> i32 {
    let mut found = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            found = sleeper_pids(s).first().copied();
            found.is_some()
        }),
        "sleeper never started\n{}",
        s.logs()
    );
    found.unwrap()
}

/// Live `sleep` processes started from this stack's skills directory.
fn sleeper_pids(s: &Stack) -> Vec<i32> {
    crate::harness::processes_with("/bin/sleep")
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(&s.base))
        })
        .collect()
}

/// A client that shuts its write side once the request is sent (`nc -N`,
/// socat at the end of its input) is not gone: it gets its answer, for a
/// plain request and for a run. Before, skilld took the end of file for a
/// hang-up: no answer, and the run was cancelled. Then, the end of file
/// left the connection's watch ready on every turn (tokio never clears a
/// read-closed readiness): skilld spun a CPU for the whole run and, now and
/// then, starved it until the client gave up. The run costs skilld next to
/// no CPU now, and a client that closes its other side too mid-run still
/// has its run killed.
#[test]
fn a_half_closed_client_gets_its_answer() {
    let s = Stack::start();
    let ask = |req: String| {
        let mut c = UnixStream::connect(&s.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let got = ask("GET /v1/skills/echo HTTP/1.1\r\nHost: localhost\r\n\r\n".into());
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    // `finisher` sleeps a second before its result: the end of file comes
    // well before the report.
    let body = json!({"args": {}}).to_string();
    let post = |skill: &str| {
        format!(
            "POST /v1/skills/{skill}/execute HTTP/1.1\r\nHost: localhost\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let cpu_before = cpu_ticks(s.skilld_pid());
    let got = ask(post("finisher"));
    let spent = cpu_ticks(s.skilld_pid()) - cpu_before;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}\n{}", s.logs());
    assert!(got.contains(r#""done":true"#), "{got:?}");
    // A one-second run: a spinning skilld spent ~100 ticks (one CPU).
    assert!(spent < 30, "skilld spent {spent} ticks of CPU on a 1 s run");

    // Half-closed, then gone altogether mid-run: the run is killed.
    let mut c = UnixStream::connect(&s.socket).unwrap();
    c.write_all(post("sleeper").as_bytes()).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let pid = started_sleeper(&s);
    assert!(process_running(pid), "sleeper {pid} running");
    drop(c);
    assert!(
        eventually(Duration::from_secs(5), || !process_alive(pid, "sleep")),
        "sleeper {pid} still running after the half-closed client left\n{}",
        s.logs()
    );
}

/// User plus system CPU time of process `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Clients that send a whole request and hang up at once, before their
/// run starts or while it runs: every decision's row is completed (as
/// `cancelled`, or with the run's outcome when it ended first), none is
/// left looking like a run in progress (before, most of them were, until
/// the next start called them `interrupted`).
#[test]
fn a_client_gone_before_its_run_starts_leaves_no_open_row() {
    let s = Stack::start();
    let body = json!({"args": {"n": 1}, "session_id": "hang-up"}).to_string();
    let req = format!(
        "POST /v1/skills/echo/execute HTTP/1.1\r\nHost: localhost\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    for _ in 0..40 {
        let mut c = UnixStream::connect(&s.socket).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        drop(c);
        std::thread::sleep(Duration::from_millis(20));
    }
    // (skilld may close some connections before it reads their request:
    // those leave no row at all.)
    std::thread::sleep(Duration::from_millis(500));
    let mut rows = Vec::new();
    let settled = eventually(Duration::from_secs(10), || {
        let audit = s.get("/v1/audit?skill=echo&limit=100").json();
        rows = audit["items"].as_array().cloned().unwrap_or_default();
        rows.retain(|r| r["session_id"] == "hang-up");
        !rows.is_empty() && rows.iter().all(|r| !r["outcome"].is_null())
    });
    let open: Vec<_> = rows.iter().filter(|r| r["outcome"].is_null()).map(|r| &r["id"]).collect();
    assert!(settled, "{} of {} rows left open, ids {open:?}", open.len(), rows.len());
    for r in &rows {
        assert_eq!(r["decision"], "allow", "{r}");
        assert!(r["finished_at"].is_number(), "{r}");
    }
}
