//! 200 runs from 20 concurrent clients, every answer the right one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::Stack;

#[test]
fn two_hundred_runs_from_twenty_concurrent_clients() {
    let s = Arc::new(Stack::start());
    let t = Instant::now();
    let clients: Vec<_> = (0..20)
        .map(|c| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for i in 0..10 {
                    let n = c * 1000 + i;
                    let r = s.execute("echo", &json!({"n": n}));
                    assert_eq!(
                        r.status,
                        200,
                        "client {c} run {i}: {}",
                        String::from_utf8_lossy(&r.body)
                    );
                    let report = r.json();
                    assert_eq!(report["outcome"], "ok", "{report}");
                    assert_eq!(report["result"], json!({"n": n}), "client {c} run {i}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let took = t.elapsed();
    eprintln!("200 runs from 20 clients in {took:?}");
    assert!(took < Duration::from_secs(90), "{took:?}");
    let text = s.scrape();
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("ongrid_executions_total")
                && l.contains("skill=\"echo\"")
                && l.contains("outcome=\"ok\"")
        })
        .unwrap_or_else(|| panic!("no executions counter for echo/ok:\n{text}"));
    let count: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(count, 200.0, "each run counted once: {line}");
}
