//! The executor going away and coming back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::skilld::{eventually, Env, Skilld};
use crate::FakeExecutor;

/// No executor → 503 `executor_unavailable`; once it starts, runs work
/// without restarting the daemon; a restart of the executor is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_down_is_503_then_recovery() {
    let env = Env::new();
    let skills = env.standard_skills();
    let d = Skilld::start(&env, &[&skills], "");
    let c = d.client();
    let r = c.post("/v1/skills/echo/execute", &json!({"args": {"n": 1}})).await.unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.body["error"]["code"], "executor_unavailable");

    let ex = FakeExecutor::start(&env.executor_socket());
    let r = c.post("/v1/skills/echo/execute", &json!({"args": {"n": 2}})).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["result"], json!({"n": 2}));

    let stats = ex.stop().await;
    let r = c.post("/v1/skills/echo/execute", &json!({})).await.unwrap();
    assert_eq!(r.status, 503);

    let _ex = FakeExecutor::start_with(&env.executor_socket(), stats);
    let r = c.post("/v1/skills/echo/execute", &json!({"args": {"n": 3}})).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["result"], json!({"n": 3}));
    // Each end counted once, the executor's absence included.
    let text = d.scrape();
    for line in [
        "ongrid_executions_total{outcome=\"executor_unavailable\",skill=\"echo\"} 2\n",
        "ongrid_executions_total{outcome=\"ok\",skill=\"echo\"} 2\n",
    ] {
        assert!(text.contains(line), "{line}{text}");
    }
}

/// The executor dying mid-run answers 503 (JSON) or ends the stream with
/// an error event; the daemon serves the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_dying_mid_run() {
    let env = Env::new();
    let skills = env.standard_skills();
    let ex = FakeExecutor::start(&env.executor_socket());
    let d = Skilld::start(&env, &[&skills], "");
    let c = d.client();
    let run = tokio::spawn(async move { c.post("/v1/skills/sleeper/execute", &json!({})).await });
    let c = d.client();
    let streamed = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&streamed);
    let stream = tokio::spawn(async move {
        let mut events = Vec::new();
        let r = c
            .execute_stream("sleeper", &json!({}), |e, _| {
                seen.store(true, Ordering::SeqCst);
                events.push(e);
            })
            .await;
        (r, events)
    });
    // Both runs are in the executor, and the stream has its first event.
    let both = eventually(Duration::from_secs(20), || {
        ex.stats.runs_started.load(Ordering::SeqCst) == 2 && streamed.load(Ordering::SeqCst)
    });
    assert!(both.await, "the two runs never started");
    let stats = ex.stop().await;
    let r = run.await.unwrap().unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.body["error"]["code"], "executor_unavailable");
    let (r, events) = stream.await.unwrap();
    assert_eq!(r.unwrap().status, 200);
    assert_eq!(events.first().unwrap()["event"], "stderr");
    assert_eq!(events.last().unwrap()["event"], "error", "{events:?}");

    let _ex = FakeExecutor::start_with(&env.executor_socket(), stats);
    let r = d.client().post("/v1/skills/echo/execute", &json!({})).await.unwrap();
    assert_eq!(r.status, 200);
    // The answered 503 and the stream's error event: each counted once.
    let unavailable =
        "ongrid_executions_total{outcome=\"executor_unavailable\",skill=\"sleeper\"} 2\n";
    let text = d.scrape();
    assert!(text.contains(unavailable), "{text}");
}
