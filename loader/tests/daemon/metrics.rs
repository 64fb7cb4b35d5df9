//! `GET /metrics`: the loader's metrics with the executor's appended.

use std::process::Command;

use serde_json::json;

use crate::setup;

/// Exact counts after known traffic; the executor's families are merged
/// (`process_*` renamed); skilld's own process metrics are
/// `ongrid_skilld_process_*` (every family starts with `ongrid_`); the
/// text passes `promtool check metrics` when promtool is installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_both_daemons() {
    let (env, ex, d) = setup();
    let c = d.client();
    c.post("/v1/skills/echo/execute", &json!({"args": {"n": 1}})).await.unwrap();
    c.post("/v1/skills/echo/execute", &json!({"args": {"n": 2}})).await.unwrap();
    c.post("/v1/skills/fail/execute", &json!({})).await.unwrap();
    c.post("/v1/skills/echo/execute", &json!({"args": {"n": "x"}})).await.unwrap();
    c.post("/v1/skills/nope/execute", &json!({})).await.unwrap();
    std::fs::write(env.path("skills/broken/skill.json"), "{").unwrap_or_else(|_| {
        std::fs::create_dir_all(env.path("skills/broken")).unwrap();
        std::fs::write(env.path("skills/broken/skill.json"), "{").unwrap();
    });
    c.post("/v1/reload", &json!({})).await.unwrap();

    let text = d.scrape();
    for want in [
        "ongrid_executions_total{outcome=\"ok\",skill=\"echo\"} 2\n",
        "ongrid_executions_total{outcome=\"exit_nonzero\",skill=\"fail\"} 1\n",
        "ongrid_executions_total{outcome=\"invalid_args\",skill=\"echo\"} 1\n",
        "ongrid_run_duration_seconds_count{skill=\"echo\"} 2\n",
        "ongrid_run_duration_seconds_bucket{skill=\"fail\",le=\"60\"} 1\n",
        "ongrid_run_queue_wait_seconds_count 3\n",
        // Three runs (two rows each) and one refusal (`invalid_args`); the
        // unknown skill is answered before any row.
        "ongrid_audit_wait_seconds_count{row=\"decision\"} 3\n",
        "ongrid_audit_wait_seconds_count{row=\"completion\"} 3\n",
        "ongrid_audit_wait_seconds_count{row=\"refusal\"} 1\n",
        "\nongrid_runs_in_flight 0\n",
        "\nongrid_skills_registered 5\n",
        "ongrid_manifest_errors_total{reason=\"parse\"} 1\n",
        "\nongrid_reloads_total 2\n",
        "ongrid_http_requests_total{code=\"404\",route=\"/v1/skills/{name}/execute\"} 1\n",
        "ongrid_build_info{version=\"",
        "\nongrid_executor_up 1\n",
        "\nongrid_skilld_process_open_fds ",
        "\nongrid_skilld_process_start_time_seconds ",
        "# TYPE ongrid_skilld_process_cpu_seconds_total counter\n",
        "\nongrid_executor_fake_runs_total 3\n",
        "# TYPE ongrid_executor_process_open_fds gauge\nongrid_executor_process_open_fds 3\n",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    assert!(!text.contains("skill=\"nope\""), "unknown names must not become labels");
    let unprefixed: Vec<&str> =
        text.lines().filter(|l| !l.starts_with('#') && !l.starts_with("ongrid_")).collect();
    assert!(unprefixed.is_empty(), "families without the ongrid_ prefix: {unprefixed:?}");

    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .output()
    {
        Err(_) => eprintln!("SKIP promtool check: promtool not installed (apt package prometheus)"),
        Ok(_) => {
            let path = env.path("metrics.prom");
            std::fs::write(&path, &text).unwrap();
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("promtool check metrics < {}", path.display()))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "promtool: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    // The executor down: the loader's own metrics only.
    ex.stop().await;
    let text = d.scrape();
    assert!(text.contains("\nongrid_executor_up 0\n"), "{text}");
    assert!(!text.contains("ongrid_executor_fake_runs_total"));
    assert!(text.contains("ongrid_executions_total{outcome=\"ok\",skill=\"echo\"} 2\n"));
}

/// The metrics listener serves `GET /metrics` only and says so: other
/// paths get a plain-text 404, other methods a 405 with `Allow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_listener_explains_what_it_serves() {
    use std::io::{Read, Write};
    let (_env, _ex, d) = setup();
    let ask = |request: &str| {
        // The listener may come up just after the API socket.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut s = loop {
            match std::net::TcpStream::connect(d.metrics) {
                Ok(s) => break s,
                Err(e) if std::time::Instant::now() > until => panic!("metrics listener: {e}"),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        };
        s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text.to_ascii_lowercase()
    };
    let r = ask("GET /v1/skills HTTP/1.0\r\nHost: localhost\r\n\r\n");
    assert!(r.starts_with("http/1.0 404"), "{r}");
    assert!(r.ends_with("this listener serves get /metrics only\n"), "{r}");
    let r = ask("POST /metrics HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n");
    assert!(r.starts_with("http/1.0 405"), "{r}");
    assert!(r.contains("\r\nallow: get, head\r\n"), "{r}");
    assert!(r.ends_with("this listener serves get /metrics only\n"), "{r}");
}
