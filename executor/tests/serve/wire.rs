//! The wire on one connection: requests and answers, stderr streaming,
//! malformed lines, half-closed and non-reading peers, the connection cap.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;

use policy::wire::code;
use serde_json::{json, Value};

use crate::common;
use crate::support::*;

/// `ping` (with the longest run timeout, 600 s by default) and `metrics`
/// answer on one connection; the connection gauge counts it.
#[test]
fn ping_and_metrics() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let mut c = server.client();
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    let pong = json!({"ok": true, "max_timeout_seconds": 600});
    assert_eq!(c.recv(), json!({"jsonrpc": "2.0", "id": 1, "result": pong}));
    c.send(&json!({"jsonrpc": "2.0", "id": "m", "method": "metrics"}));
    let v = c.recv();
    assert_eq!(v["id"], "m");
    let text = v["result"]["text"].as_str().unwrap();
    assert_eq!(sample(text, "ongrid_executor_connections"), 1.0);
    assert_eq!(sample(text, "ongrid_executor_runs_in_flight"), 0.0);
    assert_eq!(sample(text, "ongrid_executor_peer_rejected_total"), 0.0);
    drop(c);
    wait_for("the connection gauge to drop", Duration::from_secs(5), || {
        server.metrics.connections.get() == 0
    });
}

/// A good `execute` streams stderr notifications in order, then the report;
/// the metrics count exactly; the run directory is gone.
#[test]
fn execute_streams_stderr_then_report() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let m = skill(&server.root, "echo", "safe", 5, "echo first >&2\necho second >&2\ncat\npwd >&2");
    let mut c = server.client();
    c.execute(7, &m, json!({"a": [1, 2]}));
    let (stderr, reply) = c.run_result();
    assert_eq!(stderr[..2], ["first", "second"]);
    let cwd = PathBuf::from(&stderr[2]);
    assert!(cwd.starts_with(server.runtime_dir.join("runs")), "{cwd:?}");
    assert_eq!(reply["id"], 7);
    let report = &reply["result"];
    assert_eq!(report["outcome"], "ok", "{report}");
    assert_eq!(report["skill"], "echo");
    assert_eq!(report["result"], json!({"a": [1, 2]}));
    assert_eq!(
        report["sandbox"]["uid"],
        nix::unistd::User::from_name(RUN_AS).unwrap().unwrap().uid.as_raw()
    );

    // Twice more on the same connection (the manifest cache hits).
    c.execute(8, &m, json!({}));
    assert_eq!(c.run_result().1["result"]["outcome"], "ok");
    c.execute(9, &m, json!([1]));
    assert_eq!(c.run_result().1["result"]["outcome"], "invalid_args");

    let text = server.metrics();
    assert_eq!(runs_total(&text, "echo", "ok"), 2.0);
    assert_eq!(runs_total(&text, "echo", "invalid_args"), 1.0);
    assert_eq!(sample(&text, "ongrid_executor_run_duration_seconds_count"), 3.0);
    assert_eq!(sample(&text, "ongrid_sandbox_setup_seconds_count"), 2.0);
    assert_eq!(sample(&text, "ongrid_executor_queue_wait_seconds_count"), 3.0);
    let landlock: f64 = ["full", "partial", "none"]
        .iter()
        .filter_map(|s| {
            let name = format!("ongrid_landlock_enforcement_total{{status=\"{s}\"}}");
            text.contains(&name).then(|| sample(&text, &name))
        })
        .sum();
    assert_eq!(landlock, 2.0);
    assert_eq!(sample(&text, "ongrid_executor_runs_in_flight"), 0.0);
    // Removed after the report (by the engine, maybe in the background).
    wait_for("the run directory to go", Duration::from_secs(5), || !cwd.exists());
}

/// Malformed lines get JSON-RPC errors (with the id when readable) and the
/// connection keeps working; an oversized line is skipped up to its newline.
#[test]
fn malformed_lines_get_errors_and_the_connection_survives() {
    if !can_run() {
        return;
    }
    let server = Server::start(|c| c.max_line_bytes = 4096);
    let m = skill(&server.root, "ok", "safe", 5, "cat");
    let mut c = server.client();
    let cases: Vec<(Vec<u8>, i64, Value)> = vec![
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"pi".to_vec(), code::PARSE_ERROR, Value::Null),
        (b"\xff\xfe{}".to_vec(), code::PARSE_ERROR, Value::Null),
        (b"[1,2]".to_vec(), code::INVALID_REQUEST, Value::Null),
        (br#"{"jsonrpc":"2.0","method":"ping"}"#.to_vec(), code::INVALID_REQUEST, Value::Null),
        (br#"{"jsonrpc":"2.0","id":2,"method":"rm -rf"}"#.to_vec(), code::METHOD_NOT_FOUND, json!(2)),
        (br#"{"jsonrpc":"2.0","id":3,"method":"execute","params":{"manifest":5,"args":{}}}"#.to_vec(), code::INVALID_PARAMS, json!(3)),
        (br#"{"jsonrpc":"2.0","id":4,"method":"execute","params":{"manifest":"/x","args":{},"uid":0}}"#.to_vec(), code::INVALID_PARAMS, json!(4)),
        (br#"{"jsonrpc":"2.0","id":5,"method":"execute","params":{"manifest":"/x","args":{},"class":"root"}}"#.to_vec(), code::INVALID_PARAMS, json!(5)),
        (vec![b'x'; 10_000], code::LINE_TOO_LONG, Value::Null),
    ];
    for (line, want, id) in &cases {
        let mut l = line.clone();
        l.push(b'\n');
        c.send_raw(&l);
        let v = c.recv();
        assert_eq!(v["error"]["code"], json!(want), "{:?}: {v}", String::from_utf8_lossy(line));
        assert_eq!(&v["id"], id);
    }
    // An oversized line sent in pieces, then blank lines (ignored).
    c.send_raw(&vec![b'{'; 3000]);
    c.send_raw(&vec![b'"'; 3000]);
    c.send_raw(b"\n\n \n");
    assert_eq!(c.recv()["error"]["code"], json!(code::LINE_TOO_LONG));
    c.send(&json!({"jsonrpc": "2.0", "id": 6, "method": "ping"}));
    assert_eq!(c.recv()["result"]["ok"], true);
    c.execute(7, &m, json!({"still": "working"}));
    assert_eq!(c.run_result().1["result"]["result"], json!({"still": "working"}));
    let text = server.metrics();
    assert_eq!(runs_total(&text, "ok", "ok"), 1.0);
    assert_eq!(sample(&text, "ongrid_executor_run_duration_seconds_count"), 1.0);
}

/// Closing the connection mid-run kills the run's process tree.
#[test]
fn closing_the_connection_kills_its_run() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let mark = marker(2);
    // A child of the skill, in the background: the whole tree must go.
    let m = skill(
        &server.root,
        "sleeper",
        "safe",
        60,
        &format!("echo started >&2\nsleep {mark} &\nexec sleep {mark}"),
    );
    let mut c = server.client();
    c.execute(1, &m, json!({}));
    assert_eq!(c.recv()["params"]["line"], "started");
    wait_for("the marker processes", Duration::from_secs(5), || {
        common::procs_with(&mark).len() == 2
    });
    drop(c);
    wait_for("the run to be killed", Duration::from_secs(5), || {
        common::procs_with(&mark).is_empty()
    });
    server.wait_in_flight(0);
    wait_for("the run to be counted", Duration::from_secs(5), || {
        server.metrics().contains("outcome=\"signaled\",skill=\"sleeper\"} 1")
    });
}

/// A client that shuts down only its write side still gets its report.
#[test]
fn half_closed_connection_keeps_its_run() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let m = skill(&server.root, "half", "safe", 10, "sleep 0.3\necho '{\"done\":true}'");
    let mut c = server.client();
    c.execute(1, &m, json!({}));
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "ok", "{v}");
    assert_eq!(c.recv_opt(), None, "the executor closes once the run is done");
}

/// Runs multiplexed on one connection whose peer does not read: a run is
/// still supervised (its timeout fires, its process is killed) while a
/// report far larger than the socket buffer waits to be written, and both
/// answers arrive intact once the peer reads.
#[test]
fn a_peer_that_does_not_read_stalls_no_run() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let mark = marker(9);
    let slow = skill(&server.root, "stuck", "safe", 1, &format!("exec sleep {mark}"));
    // A 2 MB result: about ten times what the socket buffers hold.
    let big = skill(
        &server.root,
        "big",
        "safe",
        10,
        "printf '{\"s\":\"'; head -c 2000000 /dev/zero | tr '\\0' a; printf '\"}'",
    );
    let mut c = server.client();
    c.execute(1, &slow, json!({}));
    c.execute(2, &big, json!({}));
    // Nothing is read until the first run has timed out and been counted.
    wait_for("the big run to be counted", Duration::from_secs(10), || {
        server.metrics().contains("outcome=\"ok\",skill=\"big\"} 1")
    });
    wait_for("the stuck run to time out", Duration::from_secs(10), || {
        server.metrics().contains("outcome=\"timeout\",skill=\"stuck\"} 1")
    });
    assert!(common::procs_with(&mark).is_empty(), "the timed-out run's process is gone");
    let mut replies: Vec<Value> = vec![c.run_result().1, c.run_result().1];
    replies.sort_by_key(|v| v["id"].as_u64());
    assert_eq!(replies[0]["result"]["outcome"], "timeout", "{}", replies[0]);
    assert_eq!(replies[1]["result"]["outcome"], "ok");
    let s = replies[1]["result"]["result"]["s"].as_str().unwrap();
    assert_eq!(s.len(), 2_000_000);
    assert!(s.bytes().all(|b| b == b'a'));
}

/// Beyond `max_connections` a client waits in the listen backlog until a
/// connection closes.
#[test]
fn connections_beyond_the_cap_wait() {
    if !can_run() {
        return;
    }
    let server = Server::start(|c| c.max_connections = 1);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let mut a = server.client();
    a.send(&ping);
    assert_eq!(a.recv()["result"]["ok"], true);
    let mut b = server.client();
    b.send(&ping);
    b.stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut line = String::new();
    let waited = b.reader.read_line(&mut line);
    assert!(waited.is_err(), "served beyond the cap: {line:?}");
    drop(a);
    b.stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(b.recv()["result"]["ok"], true);
}

/// A peer that sends requests and never reads the answers is not read from
/// once about 4 MiB of answers wait for it: before, the executor read all
/// it was sent and kept every answer (230 MB in 11 s), until the peer hung
/// up. Its answers all come once it reads.
#[test]
fn a_peer_that_never_reads_its_answers_is_not_read_from() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let mut c = server.client();
    c.stream.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    // Each request (~300 bytes) asks for the metrics, whose answer is some
    // KiB of text and repeats the id (at most 256 bytes).
    let id = "x".repeat(policy::wire::MAX_ID_BYTES);
    let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":\"{id}\",\"method\":\"metrics\"}}\n");
    let mut sent = 0usize;
    let stalled = loop {
        if sent * line.len() >= 64 << 20 {
            break false;
        }
        match c.stream.write_all(line.as_bytes()) {
            Ok(()) => sent += 1,
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ),
                    "{e}"
                );
                break true;
            }
        }
    };
    let bytes = sent * line.len();
    assert!(stalled, "the executor read all {bytes} bytes of requests nobody read answers to");
    assert!(bytes < 16 << 20, "{bytes} bytes read before the executor stopped");
    // Reading the answers lets it go on: every complete request is answered.
    for _ in 0..sent {
        let v = c.recv();
        assert!(v["result"]["text"].as_str().is_some_and(|t| t.len() > 1000), "{v}");
        assert_eq!(v["id"].as_str().map(str::len), Some(id.len()));
    }
}
