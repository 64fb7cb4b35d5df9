//! Many clients at once.

use serde_json::json;

use crate::setup;

/// 20 concurrent clients × 10 runs each: every answer is the caller's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_clients_ten_runs_each() {
    let (_env, ex, d) = setup();
    let mut tasks = Vec::new();
    for client in 0..20 {
        let c = d.client();
        tasks.push(tokio::spawn(async move {
            for run in 0..10 {
                let n = client * 100 + run;
                let r =
                    c.post("/v1/skills/echo/execute", &json!({"args": {"n": n}})).await.unwrap();
                assert_eq!(r.status, 200, "{}", r.body);
                assert_eq!(r.body["outcome"], "ok");
                assert_eq!(r.body["result"], json!({"n": n}));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(ex.stats.runs_started.load(std::sync::atomic::Ordering::SeqCst), 200);
    let text = d.scrape();
    assert!(text.contains("ongrid_executions_total{outcome=\"ok\",skill=\"echo\"} 200"), "{text}");
    assert!(text.contains("ongrid_run_duration_seconds_count{skill=\"echo\"} 200"), "{text}");
    assert!(text.contains("\nongrid_runs_in_flight 0\n"));
}

/// Runs over `max_concurrent_runs` queue, and are answered `busy` after
/// `queue_timeout_seconds`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_run_slots_answer_busy() {
    let (_env, ex, d) = crate::setup_with("max_concurrent_runs = 1\nqueue_timeout_seconds = 1\n");
    let c = d.client();
    let first = tokio::spawn(async move { c.post("/v1/skills/sleeper/execute", &json!({})).await });
    let started = crate::skilld::eventually(std::time::Duration::from_secs(20), || {
        ex.stats.runs_started.load(std::sync::atomic::Ordering::SeqCst) == 1
    });
    assert!(started.await, "the first run never started");
    let r = d.client().post("/v1/skills/echo/execute", &json!({})).await.unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.body["error"]["code"], "busy");
    assert_eq!(r.body["report"]["outcome"], "busy");
    // Dropping the first client frees the slot.
    first.abort();
    let _ = first.await;
    let mut status = 0;
    for _ in 0..50 {
        status =
            d.client().post("/v1/skills/echo/execute", &json!({})).await.unwrap().status.as_u16();
        if status == 200 {
            break;
        }
    }
    assert_eq!(status, 200);
    assert!(d.scrape().contains("ongrid_executions_total{outcome=\"busy\",skill=\"echo\"} "));
}
