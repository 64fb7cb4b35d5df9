//! A client that goes away mid-run cancels the run.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::setup;
use crate::skilld::eventually;

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

async fn wait_pid(path: &std::path::Path) -> i32 {
    for _ in 0..500 {
        if let Ok(s) = std::fs::read_to_string(path) {
            if let Ok(pid) = s.trim().parse() {
                return pid;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the skill never started");
}

/// Closing the client connection closes the executor connection of that
/// run, and the executor kills the skill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_the_run() {
    for accept in ["application/json", "application/x-ndjson"] {
        let (env, ex, d) = setup();
        let mut s = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
        let req = format!(
            "POST /v1/skills/sleeper/execute HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\n\
             Content-Length: 2\r\n\r\n{{}}"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let pid = wait_pid(&env.path("sleeper.pid")).await;
        assert!(alive(pid));
        drop(s);
        assert!(
            eventually(Duration::from_secs(5), || !alive(pid)).await,
            "{accept}: still running"
        );
        let stats = ex.stats.clone();
        assert!(
            eventually(Duration::from_secs(5), || stats.runs_cancelled.load(Ordering::SeqCst) == 1)
                .await,
            "{accept}"
        );
        // The slot and the in-flight gauge are released.
        let d2 = d.scrape();
        assert!(d2.contains("\nongrid_runs_in_flight 0\n"), "{d2}");
        // Counted once, `cancelled`, with the run's time.
        let cancelled = "ongrid_executions_total{outcome=\"cancelled\",skill=\"sleeper\"} 1\n";
        assert!(
            eventually(Duration::from_secs(5), || d.scrape().contains(cancelled)).await,
            "{accept}: {}",
            d.scrape()
        );
        let text = d.scrape();
        assert!(
            text.contains("ongrid_run_duration_seconds_count{skill=\"sleeper\"} 1\n"),
            "{text}"
        );
        assert_eq!(text.matches("ongrid_executions_total{").count(), 1, "{accept}: {text}");
    }
}

/// A client gone while its request waits for a run slot is counted
/// `cancelled` once, without a run time (nothing ran), like its audit row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_queued_is_counted_cancelled() {
    let (env, ex, d) = crate::setup_with("max_concurrent_runs = 1\nqueue_timeout_seconds = 20\n");
    let send = |mut s: tokio::net::UnixStream| async move {
        let req = "POST /v1/skills/sleeper/execute HTTP/1.1\r\nHost: x\r\n\
                   Content-Length: 2\r\n\r\n{}";
        s.write_all(req.as_bytes()).await.unwrap();
        s
    };
    let first = send(tokio::net::UnixStream::connect(&d.socket).await.unwrap()).await;
    wait_pid(&env.path("sleeper.pid")).await;
    let queued = send(tokio::net::UnixStream::connect(&d.socket).await.unwrap()).await;
    // Its decision's row is written once it waits for the slot.
    let db = env.audit_db();
    assert!(
        eventually(Duration::from_secs(5), || {
            crate::skilld::audit_settled(&db);
            let c = rusqlite::Connection::open(&db).unwrap();
            c.query_row("SELECT count(*) FROM audit", [], |r| r.get::<_, i64>(0)).unwrap() == 2
        })
        .await
    );
    drop(queued);
    let cancelled = "ongrid_executions_total{outcome=\"cancelled\",skill=\"sleeper\"} 1\n";
    assert!(
        eventually(Duration::from_secs(5), || d.scrape().contains(cancelled)).await,
        "{}",
        d.scrape()
    );
    let text = d.scrape();
    assert!(!text.contains("ongrid_run_duration_seconds_count{skill=\"sleeper\"}"), "{text}");
    drop(first);
    assert!(
        eventually(Duration::from_secs(5), || d.scrape().contains(&cancelled.replace(" 1", " 2")))
            .await,
        "{}",
        d.scrape()
    );
    let text = d.scrape();
    assert!(text.contains("ongrid_run_duration_seconds_count{skill=\"sleeper\"} 1\n"), "{text}");
    assert_eq!(ex.stats.runs_started.load(Ordering::SeqCst), 1);
}
