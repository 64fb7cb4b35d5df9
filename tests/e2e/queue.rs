//! Runs that wait for one of the executor's run slots.
//!
//! The executor announces a run that has to wait (`queued`) and its start
//! (`started`); skilld times the skill from the start, and answers `busy`
//! when the executor's slots stay full longer than its queue timeout. Before,
//! skilld timed the skill from the moment it sent the request: with 17 slow
//! runs in flight and 16 executor slots, the seventeenth was killed midway
//! and answered 503 `executor_unavailable` from a healthy executor.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use policy::wire::{self, ExecuteParams, Reply};
use serde_json::{json, Value};

use crate::harness::Stack;

/// Sends `execute` for `skill` on a new executor connection.
fn execute(s: &Stack, id: u64, skill: &str) -> BufReader<UnixStream> {
    let mut c = UnixStream::connect(&s.executor_socket).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let manifest = s.skills.join(skill).join("skill.json");
    let params = ExecuteParams {
        manifest: manifest.display().to_string(),
        args: policy::RawJson::from_slice(b"{}").unwrap(),
        session_id: None,
        class: None,
        tool: None,
        manifest_sha256: None,
        hold: false,
    };
    c.write_all(&wire::encode_execute(id, &params)).unwrap();
    BufReader::new(c)
}

fn reply(r: &mut BufReader<UnixStream>) -> Reply {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line).expect("a reply within 20 s");
    wire::decode_reply(line.trim_ascii_end()).unwrap_or_else(|e| {
        panic!("not a reply ({e}): {}", String::from_utf8_lossy(&line));
    })
}

#[test]
fn the_executor_says_when_a_run_waits_for_a_slot_and_when_it_starts() {
    let s = Stack::start_with("max_concurrent_runs = 1", "");
    // The only slot: its first line is its own stderr, no queue notice.
    let mut first = execute(&s, 1, "sleeper");
    match reply(&mut first) {
        Reply::Stderr { line, .. } => assert!(line.starts_with("pid="), "{line}"),
        other => panic!("the first run did not start at once: {other:?}"),
    }
    let mut second = execute(&s, 2, "echo");
    assert_eq!(reply(&mut second), Reply::Queued { id: json!(2) });
    // Closing the first connection cancels its run and frees the slot.
    drop(first);
    assert_eq!(reply(&mut second), Reply::Started { id: json!(2) });
    let report = loop {
        match reply(&mut second) {
            Reply::Stderr { .. } => {}
            Reply::Result { id, result } => {
                assert_eq!(id, json!(2));
                break result.to_value();
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(report["outcome"], json!("ok"), "{report}");
}

#[test]
fn a_run_the_executor_cannot_start_in_time_is_answered_busy() {
    let s = Stack::start_with("max_concurrent_runs = 1", "queue_timeout_seconds = 1");
    // Holds the executor's only slot for 30 s.
    let mut holder = execute(&s, 1, "sleeper");
    assert!(matches!(reply(&mut holder), Reply::Stderr { .. }));
    let t0 = Instant::now();
    let r = s.execute("echo", &json!({}));
    let waited = t0.elapsed();
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    let body: Value = r.json();
    assert_eq!(body["error"]["code"], json!("busy"), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("run slots stayed full"), "{message}");
    assert!(waited < Duration::from_secs(10), "answered after {waited:?}");
    // The request was cancelled in the executor's queue: once the slot is
    // free, a new run starts at once.
    drop(holder);
    let r = s.execute("echo", &json!({"n": 1}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// A run's slot covers its answer until the connection has taken it: with
/// skilld's only slot held by a 3 MB answer its client does not read, the
/// next run waits and is answered busy; once the answer is read in full
/// (nothing lost), runs go on; `ongrid_answers_unsent` counts the answer
/// meanwhile. In both answer modes. Before, the slot was let go with the
/// report, so unread answers piled up in skilld's memory, one per
/// connection.
#[test]
fn an_answer_not_yet_taken_holds_its_run_slot() {
    let s = Stack::start_with("", "max_concurrent_runs = 1\nqueue_timeout_seconds = 1\n");
    crate::harness::write_skill(
        &s.skills,
        "big",
        "",
        "printf '{\"s\":\"'\n/usr/bin/head -c 3000000 /dev/zero | /usr/bin/tr '\\0' a\nprintf '\"}'",
    );
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    for accept in ["application/json", "application/x-ndjson"] {
        let mut a = UnixStream::connect(&s.socket).unwrap();
        a.write_all(
            format!(
                "POST /v1/skills/big/execute HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\n\
                 Connection: close\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n\
                 {{\"args\":{{}}}}"
            )
            .as_bytes(),
        )
        .unwrap();
        // The answer has begun: its head came.
        a.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut head = [0u8; 12];
        a.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 200", "{accept}");

        let r = s.execute("echo", &json!({}));
        assert_eq!(r.status, 503, "{accept}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["error"]["code"], json!("busy"), "{accept}");
        // The operator sees why: one answer not taken, no run in flight.
        let text = s.scrape();
        assert!(text.contains("\nongrid_answers_unsent 1\n"), "{accept}: {text}");
        assert!(text.contains("\nongrid_runs_in_flight 0\n"), "{accept}: {text}");

        let mut rest = head.to_vec();
        a.read_to_end(&mut rest).unwrap();
        let answer = crate::harness::parse_response(&rest).expect("a whole answer");
        let report = if accept == "application/json" {
            answer.json()
        } else {
            answer.events().pop().expect("a report line")["report"].clone()
        };
        assert_eq!(report["outcome"], json!("ok"), "{accept}");
        assert_eq!(report["result"]["s"].as_str().map(str::len), Some(3_000_000), "{accept}");

        let r = s.execute("echo", &json!({"n": 1}));
        assert_eq!(r.status, 200, "{accept}: {}", String::from_utf8_lossy(&r.body));
        assert!(s.scrape().contains("\nongrid_answers_unsent 0\n"), "{accept}");
    }
}
