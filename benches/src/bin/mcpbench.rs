//! `mcpbench`: a warm MCP tool call three ways: the server called directly
//! over its stdio, unboxed; through the executor's library (the server
//! boxed and spoken to by `executor::mcp`); and through both daemons
//! (`POST /v1/skills/bench.echo/execute` to `ongrid-skilld`, which asks
//! `ongrid-executor serve`, audit on, as `loadbench` starts them). The
//! server is the executor tests' small Python server
//! (`executor/tests/mcp/fake_server.py`), its `echo` tool.
//!
//! ```sh
//! cargo build --release --workspace --bins
//! sudo target/release/mcpbench            # default: --calls 500
//! ```
//!
//! As root the server runs as the executor's `run_as` user (which must
//! exist); as another user it runs as that user.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use executor::mcp::Servers;
use executor::{Config, Engine};
use ongrid_benches::{pct, sorted};
use serde_json::json;

// `loadbench`'s daemon pair and HTTP client, shared as they are; mcpbench
// uses part of them.
#[allow(dead_code)]
#[path = "loadbench/http.rs"]
mod http;
#[allow(dead_code)]
#[path = "loadbench/scrape.rs"]
mod scrape;
#[allow(dead_code)]
#[path = "loadbench/stack.rs"]
mod stack;

const SERVER: &str = include_str!("../../../executor/tests/mcp/fake_server.py");

fn calls_opt() -> usize {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => 500,
        [flag, n] if flag == "--calls" => n.parse().unwrap_or_else(|_| usage()),
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!("usage: mcpbench [--calls N]");
    std::process::exit(2);
}

fn report(what: &str, ms: &[f64]) {
    let s = sorted(ms);
    println!(
        "{what:<10} calls {:>5}  p50 {:>7.3} ms  p90 {:>7.3} ms  p99 {:>7.3} ms",
        s.len(),
        pct(&s, 0.5),
        pct(&s, 0.9),
        pct(&s, 0.99)
    );
}

/// The server run directly, unboxed: `initialize`, then `calls` echo calls.
fn direct(entry: &Path, calls: usize) -> Vec<f64> {
    let mut child = Command::new(entry)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", entry.display()));
    let mut tx = child.stdin.take().expect("stdin");
    let mut rx = BufReader::new(child.stdout.take().expect("stdout"));
    let mut id = 0;
    let mut ask = |method: &str, params: serde_json::Value| {
        id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        // One write per message, as the executor's client does (`writeln!`
        // on the pipe would write each formatted piece on its own).
        let mut line = msg.to_string();
        line.push('\n');
        tx.write_all(line.as_bytes()).expect("write");
        let mut line = String::new();
        loop {
            line.clear();
            rx.read_line(&mut line).expect("read");
            let v: serde_json::Value = serde_json::from_str(&line).expect("json");
            if v.get("id") == Some(&json!(id)) {
                return;
            }
        }
    };
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "mcpbench", "version": "0"}});
    ask("initialize", init);
    ask("tools/call", json!({"name": "echo", "arguments": {"warm": true}}));
    let mut ms = Vec::with_capacity(calls);
    for i in 0..calls {
        let t = Instant::now();
        ask("tools/call", json!({"name": "echo", "arguments": {"i": i}}));
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let _ = child.kill();
    let _ = child.wait();
    ms
}

/// The same calls through the executor's boxed server.
fn boxed(manifest: &Path, calls: usize) -> Vec<f64> {
    let engine = Engine::new(Config::default()).expect("engine");
    let servers = Servers::default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let warm = servers.call(&engine, manifest, "echo", json!({"warm": true})).await;
        assert_eq!(warm.outcome, policy::Outcome::Ok, "{warm:?}");
        let mut ms = Vec::with_capacity(calls);
        for i in 0..calls {
            let t = Instant::now();
            let r = servers.call(&engine, manifest, "echo", json!({"i": i})).await;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(r.outcome, policy::Outcome::Ok, "{r:?}");
        }
        servers.stop_all(&engine).await;
        ms
    })
}

/// The same calls through both daemons, started on sockets under `base`
/// with `root` as their allow-list root; `expected`: the tools to wait for.
fn daemons(root: &Path, base: &Path, calls: usize, expected: usize) -> Vec<f64> {
    let exe = std::env::current_exe().expect("own path");
    let bin_dir = exe.parent().expect("bin dir");
    let audit = base.join("audit");
    let roots = [root.to_owned()];
    let stack = stack::Stack::start("daemon-mcp", bin_dir, base, &roots, &audit, expected, "");
    let mut client = http::Http::connect(&stack.socket);
    let path = "/v1/skills/bench.echo/execute";
    let (status, body) = client.post(path, br#"{"args":{"warm":true}}"#);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let mut ms = Vec::with_capacity(calls);
    for i in 0..calls {
        let body = format!(r#"{{"args":{{"i":{i}}}}}"#);
        let t = Instant::now();
        let (status, _) = client.post(path, body.as_bytes());
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(status, 200);
    }
    ms
}

fn main() {
    let calls = calls_opt();
    let top = tempfile::tempdir().expect("tempdir");
    let root = top.path().join("skills");
    let dir = root.join("bench");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for d in [top.path(), &root, &dir] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let entry = dir.join("server.py");
    std::fs::write(&entry, SERVER).expect("write");
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let manifest = dir.join("skill.json");
    let text = json!({"kind": "mcp", "name": "bench", "description": "b", "entry": "server.py"});
    std::fs::write(&manifest, text.to_string()).expect("write");
    report("direct", &direct(&entry, calls));
    report("executor", &boxed(&manifest, calls));
    let tools = SERVER
        .lines()
        .find(|l| l.starts_with("TOOLS = "))
        .map_or(0, |l| l.matches('"').count() / 2);
    report("daemons", &daemons(&root, &top.path().join("stack"), calls, tools));
}
