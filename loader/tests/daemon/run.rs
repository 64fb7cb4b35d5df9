//! Running skills: ok, failing, timing out, schema-rejected, bad bodies,
//! the NDJSON stream.

use std::sync::atomic::Ordering;

use hyper::Method;
use serde_json::{json, Value};

use crate::setup;

/// An ok run answers 200 with the report; the result is the skill's
/// stdout and the stderr lines are in the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_run_returns_the_result() {
    let (_env, _ex, d) = setup();
    let r = d
        .client()
        .post("/v1/skills/echo/execute", &json!({"args": {"n": 7}, "session_id": "s1"}))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["outcome"], "ok");
    assert_eq!(r.body["skill"], "echo");
    assert_eq!(r.body["result"], json!({"n": 7}));
    assert_eq!(r.body["error"], Value::Null);
    assert_eq!(r.body["stderr"], "echo: starting\necho: second line\n");
    // An empty body means no args.
    let resp = d.client().send(Method::POST, "/v1/skills/echo/execute", None, "*/*").await.unwrap();
    let r = loader::cli::client::read_json(resp).await.unwrap();
    assert_eq!(r.body["result"], json!({}));
}

/// A failing run is still a 200: the report says how it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_run_is_200_with_its_report() {
    let (_env, _ex, d) = setup();
    let r = d.client().post("/v1/skills/fail/execute", &json!({"args": {}})).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["outcome"], "exit_nonzero");
    assert_eq!(r.body["exit_code"], 3);
    assert_eq!(r.body["stderr"], "boom\n");
}

/// A skill past its timeout is reported `timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timing_out_run_is_reported() {
    let (_env, _ex, d) = setup();
    let t = std::time::Instant::now();
    let r = d.client().post("/v1/skills/slow/execute", &json!({})).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["outcome"], "timeout");
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
}

/// Args not matching the schema are a 400 listing every violation, and
/// nothing reaches the executor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_rejected_args_never_reach_the_executor() {
    let (_env, ex, d) = setup();
    let c = d.client();
    let r = c
        .post("/v1/skills/strict/execute", &json!({"args": {"depth": -1, "extra": true}}))
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"]["code"], "invalid_args");
    let v = r.body["error"]["violations"].as_array().unwrap();
    assert_eq!(v.len(), 3, "{v:?}");
    let paths: Vec<&str> = v.iter().map(|v| v["path"].as_str().unwrap()).collect();
    assert!(paths.contains(&"/depth"), "{paths:?}");
    let r = c.post("/v1/skills/echo/execute", &json!({"args": {"n": "seven"}})).await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(ex.stats.runs_started.load(Ordering::SeqCst), 0);
    // strict is mutating: the test caller (mutating-with-confirm) confirms.
    let body = json!({"args": {"path": "/"}, "confirm": true});
    let r = c.post("/v1/skills/strict/execute", &body).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["result"], json!({"path": "/"}));
    // The arg values never reach the info-level log.
    assert!(!d.log().contains("seven"), "{}", d.log());
}

/// Bad JSON, wrong types and unknown fields are 400; over 1 MiB is 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies() {
    let (_env, ex, d) = setup();
    let c = d.client();
    for body in [
        &b"{"[..],
        b"[1]",
        b"\"args\"",
        b"\xff\xfe",
        br#"{"args":[]}"#,
        br#"{"args":{},"confirm":1}"#,
        br#"{"args":{},"approvals":{}}"#,
        br#"{"args":{},"unknown":1}"#,
    ] {
        let resp = c
            .send(Method::POST, "/v1/skills/echo/execute", Some(body.to_vec()), "*/*")
            .await
            .unwrap();
        let r = loader::cli::client::read_json(resp).await.unwrap();
        assert_eq!(r.status, 400, "{:?}: {}", String::from_utf8_lossy(body), r.body);
        assert_eq!(r.body["error"]["code"], "bad_request");
    }
    // The daemon may answer 413 and close before it has taken the whole
    // body, so the client's write can fail with EPIPE (an HTTP client then
    // reports the failed write, not the answer): the request goes on a raw
    // connection whose write errors are ignored, and the answer is read.
    let big = format!(r#"{{"args":{{"s":"{}"}}}}"#, "x".repeat(1 << 20));
    let head = format!(
        "POST /v1/skills/echo/execute HTTP/1.1\r\nHost: x\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n",
        big.len()
    );
    let answer = answer_to(&d.socket, &[head.as_bytes(), big.as_bytes()].concat()).await;
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer:.200}");
    assert!(answer.contains(r#""code":"payload_too_large""#), "{answer:.400}");
    assert_eq!(ex.stats.runs_started.load(Ordering::SeqCst), 0);
}

/// Sends `request` on a fresh connection (a failed write is ignored: the
/// daemon may answer and close first) and returns what the daemon wrote
/// until it closed the connection or 5 s passed.
async fn answer_to(socket: &std::path::Path, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let request = request.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        // Kept open (no half-close): the daemon takes EOF as "gone away".
        std::future::pending::<()>().await;
    });
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), rd.read_to_end(&mut out)).await;
    // A writer still blocked (a daemon that stopped reading without
    // closing) must not hang the test.
    writer.abort();
    String::from_utf8_lossy(&out).into_owned()
}

/// `Accept: application/x-ndjson` streams stderr events, then the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ndjson_stream() {
    let (_env, _ex, d) = setup();
    let mut events = Vec::new();
    let r = d
        .client()
        .execute_stream("echo", &json!({"args": {"n": 1}}), |e, _| events.push(e))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        events[..2],
        [
            json!({"event": "stderr", "line": "echo: starting"}),
            json!({"event": "stderr", "line": "echo: second line"})
        ]
    );
    assert_eq!(events.len(), 3);
    assert_eq!(events[2]["event"], "report");
    assert_eq!(events[2]["report"]["result"], json!({"n": 1}));

    // Errors before the run are plain JSON answers, even when streaming.
    let r = d.client().execute_stream("strict", &json!({"args": {}}), |_, _| {}).await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"]["code"], "invalid_args");
}

/// The executor's busy answer is a 503 carrying a `busy` report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_busy_is_503() {
    let (_env, ex, d) = setup();
    ex.stats.busy.store(true, Ordering::SeqCst);
    let r = d.client().post("/v1/skills/echo/execute", &json!({})).await.unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.body["error"]["code"], "busy");
    assert_eq!(r.body["report"]["outcome"], "busy");
    ex.stats.busy.store(false, Ordering::SeqCst);
    let r = d.client().post("/v1/skills/echo/execute", &json!({})).await.unwrap();
    assert_eq!(r.status, 200);
}
