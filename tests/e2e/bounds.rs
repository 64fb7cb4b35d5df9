//! Resource bounds with short configured limits: each
//! daemon serves at most `max_connections` connections; a client that
//! sends nothing, a slow-loris head, an idle keep-alive connection and an
//! idle or byte-at-a-time executor connection, and a client that does
//! not read its answer are closed after their timeouts, so they cannot hold a slot for ever; a request in flight is
//! never cut for being quiet; an idle connection wakes neither daemon
//! before its timeout. (Body and line size caps: `malformed`.)

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{write_skill, Stack};

const EXECUTOR: &str = "max_connections = 3\nidle_timeout_seconds = 1\n";
const SKILLD: &str = "max_connections = 3\nheader_timeout_seconds = 1\nidle_timeout_seconds = 1\n";

/// Waits until the server closes `c` (EOF or reset); returns how long it
/// took, or `None` after `limit`. Whatever the server sent is discarded.
fn closed_within(c: &mut UnixStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    c.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match c.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

/// True once the server answered (a 408) or closed `c`; never blocks.
fn server_done(c: &mut UnixStream) -> bool {
    c.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let done = match c.read(&mut buf) {
        Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    c.set_nonblocking(false).unwrap();
    done
}

/// A GET on a fresh connection; the status, or `None` if no answer came
/// within `wait`.
fn get_within(socket: &Path, path: &str, wait: Duration) -> Option<u16> {
    let mut c = UnixStream::connect(socket).unwrap();
    c.set_read_timeout(Some(wait)).unwrap();
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = [0u8; 12];
    c.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// A `ping` on a fresh executor connection: true if answered within `wait`.
fn ping_within(socket: &Path, wait: Duration) -> bool {
    let mut c = UnixStream::connect(socket).unwrap();
    c.set_read_timeout(Some(wait)).unwrap();
    let _ = c.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}\n");
    let mut buf = [0u8; 256];
    matches!(c.read(&mut buf), Ok(n) if n > 0 && String::from_utf8_lossy(&buf[..n]).contains("\"id\":7"))
}

#[test]
fn skilld_connections_are_capped_and_slow_or_idle_clients_are_cut() {
    let s = Stack::start_with(EXECUTOR, SKILLD);

    // Three silent clients take every slot: a fourth waits (its connect
    // succeeds into the backlog) until the idle timeout frees them.
    // (Timed from before the silent ones connect: each is cut no sooner
    // than 1 s after it was accepted.)
    let started = Instant::now();
    let mut silent: Vec<UnixStream> =
        (0..3).map(|_| UnixStream::connect(&s.socket).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(get_within(&s.socket, "/v1/health", Duration::from_secs(10)), Some(200));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(8),
        "the fourth client was served {waited:?} after the silent ones came (idle timeout 1 s)"
    );
    for c in &mut silent {
        assert!(
            closed_within(c, Duration::from_secs(3)).is_some(),
            "a silent client kept its slot"
        );
    }

    // Slow-loris: a head one byte every 100 ms is cut by the 1 s header
    // timeout, although bytes keep coming.
    let mut c = UnixStream::connect(&s.socket).unwrap();
    c.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    let started = Instant::now();
    let head = format!("GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: {}", "a".repeat(100));
    let mut cut = None;
    for b in head.bytes() {
        if c.write_all(&[b]).is_err() {
            cut = Some(started.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if server_done(&mut c) {
            cut = Some(started.elapsed());
            break;
        }
    }
    let cut = cut.expect("a byte-a-second head was never cut");
    assert!(cut < Duration::from_secs(4), "slow-loris cut after {cut:?}");

    // Keep-alive: after an answer, an idle connection is closed.
    let mut c = UnixStream::connect(&s.socket).unwrap();
    let sent = Instant::now();
    c.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    let n = c.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
    closed_within(&mut c, Duration::from_secs(10)).expect("idle keep-alive kept open");
    // The idle clock starts after the answer, which follows the request.
    let open = sent.elapsed();
    assert!(open >= Duration::from_secs(1), "closed too early: {open:?} after the request");

    // A client that asks for a large answer and does not read it: once
    // the writes have been blocked for the idle timeout, skilld drops the
    // connection (the client later finds a truncated body).
    let script =
        "cat >/dev/null\nprintf '{\"s\":\"'\nhead -c 900000 /dev/zero | tr '\\0' a\nprintf '\"}'";
    write_skill(&s.skills, "big", r#","timeout_seconds":20"#, script);
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    let mut c = UnixStream::connect(&s.socket).unwrap();
    send_execute_to(&mut c, "big", r#"{"args":{}}"#);
    std::thread::sleep(Duration::from_secs(4));
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    let head = String::from_utf8_lossy(&got[..got.len().min(512)]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "the run was not answered: {head}");
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no content-length: {head}"));
    let body = got.len() - head.find("\r\n\r\n").map_or(got.len(), |i| i + 4);
    assert!(
        body < length,
        "a client that does not read kept its connection (all {length} bytes came)"
    );

    // A client that takes the answer a trickle at a time (16 KB every
    // 200 ms, under 1 MiB per idle timeout while the writes block) is cut
    // too, well before the 11 s the answer would take it.
    let mut c = UnixStream::connect(&s.socket).unwrap();
    send_execute_to(&mut c, "big", r#"{"args":{}}"#);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 16 << 10];
    let cut = loop {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => break started.elapsed(),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
        std::thread::sleep(Duration::from_millis(200));
        assert!(started.elapsed() < Duration::from_secs(30), "a trickle reader was never cut");
    };
    assert!(got.len() < 900_000, "a trickle reader took the whole answer in {cut:?}");
    assert!(cut < Duration::from_secs(8), "a trickle reader was cut only after {cut:?}");

    // A run quieter than both idle timeouts (3 s, JSON mode: no byte until
    // the report) is not cut, neither by skilld nor by the executor.
    write_skill(&s.skills, "quiet", r#","timeout_seconds":20"#, "/bin/sleep 3\necho '{\"q\":1}'");
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    let r = s.execute("quiet", &json!({}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outcome"], "ok", "{}", r.json());
    assert_eq!(r.json()["result"], json!({"q": 1}));
}

#[test]
fn executor_connections_are_capped_and_idle_ones_are_cut() {
    let s = Stack::start_with(EXECUTOR, SKILLD);
    let sock = &s.executor_socket;

    // Three busy clients (a ping every 50 ms) hold every slot: a fourth
    // is not answered while they stay.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let holders: Vec<_> = (0..3)
        .map(|_| {
            let mut c = UnixStream::connect(sock).unwrap();
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    if c.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n").is_err()
                    {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                true
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!ping_within(sock, Duration::from_millis(1500)), "a fourth connection was served");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for h in holders {
        assert!(h.join().unwrap(), "a busy connection was cut");
    }
    assert!(ping_within(sock, Duration::from_secs(5)), "no slot came free");

    // A silent connection and one sending a partial line a byte at a time
    // are closed after the idle timeout (no complete request).
    let mut silent = UnixStream::connect(sock).unwrap();
    let t = closed_within(&mut silent, Duration::from_secs(5)).expect("silent connection kept");
    assert!(t >= Duration::from_millis(500), "closed too early: {t:?}");
    let mut slow = UnixStream::connect(sock).unwrap();
    let started = Instant::now();
    let mut cut = false;
    for b in b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
        if slow.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if started.elapsed() > Duration::from_secs(2) {
            cut = closed_within(&mut slow, Duration::from_secs(2)).is_some();
            break;
        }
    }
    assert!(cut, "a byte-at-a-time line kept its connection");
    let text = s.scrape();
    let closed = text
        .lines()
        .find_map(|l| l.strip_prefix("ongrid_executor_idle_closed_total "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(closed.is_some_and(|n| n >= 2), "ongrid_executor_idle_closed_total: {closed:?}");
}

/// Writes a keep-alive `POST /v1/skills/echo/execute` with `body` on `c`.
fn send_execute(c: &mut UnixStream, body: &str) {
    send_execute_to(c, "echo", body);
}

fn send_execute_to(c: &mut UnixStream, skill: &str, body: &str) {
    let head = format!(
        "POST /v1/skills/{skill}/execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body.as_bytes()).unwrap();
}

/// Times the threads of process `pid` were switched in, so far.
fn switches(pid: u32) -> u64 {
    let mut n = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        n += status
            .lines()
            .filter(|l| l.starts_with("voluntary_ctxt") || l.starts_with("nonvoluntary_ctxt"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    n
}

/// With the default idle timeouts (60 s), a client's keep-alive connection
/// left open after a run, and skilld's connection to the executor kept
/// for the next run, wake neither daemon while they stay idle: each used
/// to look at its idle connection every second, so an idle host's daemons
/// kept waking for a minute after the last run.
#[test]
fn idle_connections_wake_neither_daemon() {
    let s = Stack::start();
    let body = json!({"args": {"message": "hi"}}).to_string();
    let mut c = UnixStream::connect(&s.socket).unwrap();
    send_execute(&mut c, &body);
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let whole = |raw: &[u8]| {
        crate::harness::parse_response(raw)
            .is_some_and(|r| serde_json::from_slice::<serde_json::Value>(&r.body).is_ok())
    };
    while !whole(&got) {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the answer: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let r = crate::harness::parse_response(&got).unwrap();
    assert_eq!((r.status, &r.json()["outcome"]), (200, &json!("ok")), "{}", r.json());
    // What follows a run once settles first (the janitor's trim after 1 s,
    // the audit rows' ingest and sync).
    std::thread::sleep(Duration::from_secs(3));
    let pids = [s.executor_pid().expect("executor"), s.skilld_pid()];
    let before: Vec<u64> = pids.iter().map(|p| switches(*p)).collect();
    std::thread::sleep(Duration::from_secs(4));
    let woke: Vec<u64> = pids.iter().zip(&before).map(|(p, b)| switches(*p) - b).collect();
    assert!(
        woke.iter().all(|n| *n <= 1),
        "thread switches over 4 idle seconds (executor, skilld): {woke:?}"
    );
    // Both connections are still open: the client's is answered on.
    c.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let n = c.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
}

/// `header_timeout` bounds a request head from its first byte, and
/// `idle_timeout` a connection with no request: a keep-alive connection
/// idle after its answer stays open past the header timeout (hyper's
/// own header timer, used before, cut it there) until the idle one; a
/// slow head is still cut at the header timeout.
#[test]
fn skilld_header_and_idle_timeouts_are_separate() {
    let s = Stack::start_with(EXECUTOR, "header_timeout_seconds = 1\nidle_timeout_seconds = 4\n");

    let mut idle = UnixStream::connect(&s.socket).unwrap();
    idle.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    let n = idle.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
    let answered = Instant::now();

    // Meanwhile a slow head on another connection: cut after ~1 s.
    let mut slow = UnixStream::connect(&s.socket).unwrap();
    let started = Instant::now();
    let mut cut = None;
    for b in
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    {
        if slow.write_all(&[*b]).is_err() || server_done(&mut slow) {
            cut = Some(started.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cut = cut.expect("a slow head was never cut");
    assert!(cut < Duration::from_secs(3), "slow head cut after {cut:?}");

    let closed = closed_within(&mut idle, Duration::from_secs(10)).map(|_| answered.elapsed());
    let closed = closed.expect("an idle keep-alive connection was never closed");
    assert!(
        closed >= Duration::from_millis(3500) && closed < Duration::from_secs(8),
        "idle keep-alive closed {closed:?} after its answer (header 1 s, idle 4 s)"
    );
    // It was open, and usable, past the header timeout: a second request
    // on a fresh idle connection after 2 s is answered.
    let mut again = UnixStream::connect(&s.socket).unwrap();
    again.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    again.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let n = again.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    std::thread::sleep(Duration::from_secs(2));
    again.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let n = again.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "the second request after 2 s idle: {n} bytes");
}
