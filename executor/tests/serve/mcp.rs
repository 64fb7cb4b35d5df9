//! MCP server packs over the wire: `mcp_tools` lists a pack's tools (with
//! the skill and class each is registered as), `execute` with `tool` calls
//! one in the pack's server, held calls wait for their `start`, and the
//! drain stops the servers.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common;
use crate::support::*;

const FAKE: &str = include_str!("../mcp/fake_server.py");

fn pack(root: &Path, idle_seconds: u64) -> PathBuf {
    let dir = root.join("fake");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = json!({"kind": "mcp", "name": "fake", "description": "t", "entry": "server.py",
        "timeout_seconds": 2, "class": "mutating", "tool_classes": {"echo": "safe"},
        "idle_seconds": idle_seconds});
    std::fs::write(dir.join("skill.json"), manifest.to_string()).unwrap();
    std::fs::write(dir.join("server.py"), FAKE).unwrap();
    std::fs::set_permissions(dir.join("server.py"), std::fs::Permissions::from_mode(0o755))
        .unwrap();
    dir.join("skill.json")
}

fn call(c: &mut Client, id: u64, m: &Path, tool: &str, args: Value, class: &str) -> Value {
    let params = json!({"manifest": m, "tool": tool, "args": args, "class": class});
    c.send(&json!({"jsonrpc": "2.0", "id": id, "method": "execute", "params": params}));
    c.run_result().1["result"].clone()
}

#[test]
fn tools_are_listed_and_called_over_the_wire_and_the_drain_stops_the_server() {
    if !can_run() {
        return;
    }
    let mut server = Server::start(|_| {});
    let m = pack(&server.root, 0);
    let marker = server.root.to_string_lossy().into_owned();
    let mut c = server.client();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "mcp_tools", "params": {"manifest": m}});
    c.send(&list);
    let v = c.recv();
    let tools = v["result"]["tools"].as_array().unwrap_or_else(|| panic!("{v}"));
    let echo = tools.iter().find(|t| t["name"] == "echo").unwrap_or_else(|| panic!("{v}"));
    assert_eq!((echo["skill"].as_str(), echo["class"].as_str()), (Some("fake.echo"), Some("safe")));
    assert_eq!(echo["inputSchema"], json!({"type": "object"}));
    let stall = tools.iter().find(|t| t["name"] == "stall").unwrap();
    assert_eq!(stall["class"], "mutating", "the pack's class");

    let generation = v["result"]["generation"].as_u64().unwrap_or_else(|| panic!("{v}"));
    // A call's report comes after its tool list's generation.
    let params = json!({"manifest": m, "tool": "echo", "args": {"x": 0}, "class": "safe"});
    c.send(&json!({"jsonrpc": "2.0", "id": 20, "method": "execute", "params": params}));
    let note = c.recv();
    assert_eq!(note["method"], "tools_generation", "{note}");
    assert_eq!(note["params"], json!({"id": 20, "generation": generation}), "unchanged");
    assert_eq!(c.run_result().1["result"]["outcome"], "ok");

    let r = call(&mut c, 2, &m, "echo", json!({"x": 1}), "safe");
    assert_eq!(r["outcome"], "ok", "{r}");
    assert_eq!(r["skill"], "fake.echo");
    assert_eq!(r["result"]["content"][0]["text"], r#"{"x": 1}"#);
    // The class the executor reads from the pack is re-checked.
    let r = call(&mut c, 3, &m, "stall", json!({}), "safe");
    assert_eq!(r["outcome"], "denied", "{r}");
    let r = call(&mut c, 4, &m, "not_listed", json!({}), "mutating");
    assert_eq!(r["outcome"], "rejected", "{r}");
    // A one-shot run of the pack is refused.
    c.execute(5, &m, json!({}));
    let r = c.run_result().1["result"].clone();
    assert_eq!(r["outcome"], "rejected", "{r}");

    // A held call waits for its start.
    let params = json!({"manifest": m, "tool": "pid", "args": {}, "hold": true});
    c.send(&json!({"jsonrpc": "2.0", "id": 6, "method": "execute", "params": params}));
    std::thread::sleep(Duration::from_millis(200));
    c.send(&json!({"jsonrpc": "2.0", "method": "start", "params": {"id": 6}}));
    let r = c.run_result().1["result"].clone();
    assert_eq!(r["outcome"], "ok", "{r}");
    assert!(!common::procs_with(&marker).is_empty(), "the server runs");
    let text = server.metrics();
    assert_eq!(runs_total(&text, "fake.echo", "ok"), 2.0, "{text}");

    drop(c);
    server.shutdown();
    assert!(server.finished_within(Duration::from_secs(30)));
    let left = common::procs_with(&marker);
    assert!(left.is_empty(), "the drain stops the server: {left:?}");
}

#[test]
fn serve_stops_a_server_idle_past_its_idle_seconds() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let m = pack(&server.root, 1);
    let marker = server.root.to_string_lossy().into_owned();
    let mut c = server.client();
    let r = call(&mut c, 1, &m, "pid", json!({}), "mutating");
    assert_eq!(r["outcome"], "ok", "{r}");
    assert!(!common::procs_with(&marker).is_empty(), "the server runs");
    wait_for("the idle server to stop", Duration::from_secs(10), || {
        common::procs_with(&marker).is_empty()
    });
    let r = call(&mut c, 2, &m, "pid", json!({}), "mutating");
    assert_eq!(r["outcome"], "ok", "started again: {r}");
}

#[test]
fn a_lazy_pack_s_server_is_stopped_after_its_listing_and_an_eager_one_stays() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let m = pack(&server.root, 0);
    let marker = server.root.to_string_lossy().into_owned();
    let mut c = server.client();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "mcp_tools", "params": {"manifest": m}});
    c.send(&list);
    assert!(c.recv()["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()));
    assert!(common::procs_with(&marker).is_empty(), "lazy: stopped after the listing");

    let text = std::fs::read_to_string(&m).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["start"] = json!("eager");
    std::fs::write(&m, v.to_string()).unwrap();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "mcp_tools", "params": {"manifest": m}});
    c.send(&list);
    assert!(c.recv()["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()));
    assert!(!common::procs_with(&marker).is_empty(), "eager: it stays");
}

#[test]
fn mcp_watch_answers_when_an_idle_servers_tool_list_moves() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let m = pack(&server.root, 0);
    let mut c = server.client();
    let mut watcher = server.client();
    let watch = |w: &mut Client, id: u64, since: u64, ms: u64| {
        let params = json!({"since": since, "timeout_ms": ms});
        w.send(&json!({"jsonrpc": "2.0", "id": id, "method": "mcp_watch", "params": params}));
        w.recv()
    };
    // A first wait (since 0) is answered at once: the count starts at the
    // executor's start time, nothing moved yet.
    let v = watch(&mut watcher, 1, 0, 10_000);
    let start = v["result"]["changes"].as_u64().unwrap_or(0);
    assert!(start > 0, "{v}");
    assert_eq!(v["result"]["packs"], json!([]), "{v}");
    // With that count, the wait runs out with the count as it is.
    let v = watch(&mut watcher, 11, start, 200);
    assert_eq!(v["result"], json!({"changes": start, "packs": []}), "{v}");

    let r = call(&mut c, 2, &m, "grow_soon", json!({}), "mutating");
    assert_eq!(r["result"]["content"][0]["text"], "soon", "{r}");
    let asked = std::time::Instant::now();
    let v = watch(&mut watcher, 3, start, 10_000);
    assert!(asked.elapsed() < Duration::from_secs(2), "{:?}", asked.elapsed());
    assert_eq!(v["result"]["changes"], start + 1, "{v}");
    let packs = v["result"]["packs"].as_array().cloned().unwrap_or_default();
    assert_eq!(packs.len(), 1, "{v}");
    let canonical = std::fs::canonicalize(&m).unwrap();
    assert_eq!(packs[0]["manifest"], canonical.to_string_lossy().as_ref(), "{v}");
    // The executor listed them again itself: the generation it says is
    // the one `mcp_tools` answers, with the new tool.
    let list = json!({"jsonrpc": "2.0", "id": 4, "method": "mcp_tools", "params": {"manifest": m}});
    c.send(&list);
    let tools = c.recv();
    assert_eq!(tools["result"]["generation"], packs[0]["generation"], "{tools}");
    let names = tools["result"]["tools"].to_string();
    assert!(names.contains(r#""name":"extra""#), "{names}");
    // A count from before this executor's start (a restarted executor's
    // callers hold one) is answered at once, naming what moved since.
    let v = watch(&mut watcher, 5, 99, 10_000);
    assert_eq!(v["result"]["changes"], start + 1, "{v}");
    assert_eq!(v["result"]["packs"].as_array().map(Vec::len), Some(1), "{v}");
}

/// An executor that is not root runs an MCP pack's server without a
/// cgroup: SIGKILLed, its watchdog kills the server's process group, so
/// what the server started goes with it.
#[test]
fn without_a_cgroup_a_killed_executors_server_takes_its_group_with_it() {
    if !can_run() {
        return;
    }
    let nobody = 65534;
    let (root, runtime) = (dir_0755(), dir_0755());
    let (socket, config) = serve_config(root.path(), runtime.path());
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("allowed_uids = [0]\nlandlock = \"best-effort\"\n");
    std::fs::write(&config, text).unwrap();
    for p in [runtime.path(), config.as_path()] {
        std::os::unix::fs::chown(p, Some(nobody), Some(nobody)).unwrap();
    }
    std::fs::set_permissions(runtime.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let m = pack(root.path(), 0);
    let dir = m.parent().unwrap();
    // The entry starts a process in the server's group (a number no other
    // process has; ten minutes at most, should it outlive a failed test),
    // then becomes the server.
    let marker = format!("sleep 602.{}", std::process::id());
    let server = dir.join("server.py");
    let wrapper =
        format!("#!/bin/sh\n/bin/{marker} &\nexec /usr/bin/python3 {}\n", server.display());
    std::fs::write(dir.join("run.sh"), wrapper).unwrap();
    std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = std::fs::read_to_string(&m).unwrap().replace("\"server.py\"", "\"run.sh\"");
    std::fs::write(&m, manifest).unwrap();
    let mut spawned = spawn_serve_as_nobody(&config);
    wait_for("the socket", Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    let mut c = Client::connect(&socket);
    let r = call(&mut c, 1, &m, "echo", json!({"x": 1}), "safe");
    assert_eq!(r["outcome"], "ok", "{r}");
    assert!(r["sandbox"]["cgroup"]["kill"].is_null(), "the server has a cgroup: {r}");
    let sleeps = || live_with(&marker);
    assert_eq!(sleeps().len(), 1, "the server's child runs");
    spawned.0.kill().unwrap();
    wait_child(&mut spawned.0);
    wait_for("the server's child to go with the executor", Duration::from_secs(10), || {
        sleeps().is_empty()
    });
}

/// A connection may have 16 `mcp_tools` and `mcp_watch` requests
/// unanswered: the next is answered `busy` at once (pipelined watches
/// would otherwise pile up in the root executor as tasks, answering
/// nothing for minutes), and a place frees as one is answered.
#[test]
fn unanswered_watches_of_one_connection_are_bounded() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let mut w = server.client();
    let watch = |id: u64, since: u64, ms: u64| {
        let params = json!({"since": since, "timeout_ms": ms});
        json!({"jsonrpc": "2.0", "id": id, "method": "mcp_watch", "params": params})
    };
    w.send(&watch(0, 0, 1));
    let now = w.recv()["result"]["changes"].as_u64().expect("a count");
    for id in 1..=16 {
        w.send(&watch(id, now, if id == 1 { 300 } else { 60_000 }));
    }
    w.send(&watch(17, now, 60_000));
    let v = w.recv();
    assert_eq!(
        (&v["id"], &v["error"]["code"]),
        (&json!(17), &json!(policy::wire::code::BUSY)),
        "{v}"
    );
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("16 mcp_tools"), "{v}");
    // The first runs out: its place is free again.
    let v = w.recv();
    assert_eq!((&v["id"], &v["result"]["changes"]), (&json!(1), &json!(now)), "{v}");
    w.send(&watch(18, now, 100));
    let v = w.recv();
    assert_eq!((&v["id"], &v["result"]["changes"]), (&json!(18), &json!(now)), "{v}");
}
