//! The MCP front against an absent daemon and a fake one: the protocol,
//! the followers of the registry, results and their `outputSchema`.

use super::*;

/// Serves one MCP session on an in-memory pipe, against a daemon that
/// is not there, and returns the answers to `lines` (by id).
async fn exchange(lines: &[Value]) -> Vec<Value> {
    exchange_text(&lines.iter().map(Value::to_string).collect::<Vec<_>>()).await
}

/// [`exchange`] of lines as text (an answer is awaited after each line
/// with an `"id"`).
async fn exchange_text(lines: &[String]) -> Vec<Value> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let (client, server_end) = tokio::io::duplex(1 << 20);
    let server = Server::new(DaemonClient::new("/nonexistent/skilld.sock"));
    let task = tokio::spawn(async move {
        let (read, write) = tokio::io::split(server_end);
        let read = Tee::new(read, server.calls.clone());
        if let Ok(running) = server.serve((read, write)).await {
            let _ = running.waiting().await;
        }
    });
    let (read, mut write) = tokio::io::split(client);
    let mut read = BufReader::new(read).lines();
    let mut answers = Vec::new();
    for line in lines {
        write.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        if line.contains("\"id\"") {
            let text = tokio::time::timeout(std::time::Duration::from_secs(10), read.next_line())
                .await
                .expect("an answer in time")
                .unwrap()
                .expect("an answer");
            answers.push(serde_json::from_str(&text).unwrap());
        }
    }
    // Both halves: the server sees the end of its input once the pipe is
    // dropped whole.
    drop((write, read));
    tokio::time::timeout(std::time::Duration::from_secs(10), task)
        .await
        .expect("the server ends with its input")
        .unwrap();
    answers
}

fn init(version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}})
}

#[tokio::test]
async fn an_older_client_initializes_and_calls() {
    let answers = exchange(&[
        init("2025-06-18"),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": "p", "method": "ping"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "resources/list"}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "x"}}),
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
            "params": {"name": "x", "arguments": [1]}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": 5}}),
        json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {}}),
        json!({"jsonrpc": "2.0", "id": 9, "method": "no/such"}),
    ])
    .await;
    for bad in &answers[5..8] {
        assert_eq!(bad["error"]["code"], -32602, "{bad}");
        let message = bad["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("tools/call: malformed params"), "{message}");
    }
    assert_eq!(answers[8]["error"]["code"], -32601, "{:?}", answers[8]);
    assert_eq!(answers[0]["result"]["protocolVersion"], "2025-06-18", "{answers:?}");
    assert!(answers[0]["result"]["capabilities"]["tools"].is_object());
    assert_eq!(answers[0]["result"]["serverInfo"]["name"], "ongrid-skill");
    assert_eq!(answers[1]["result"], json!({}));
    assert_eq!(answers[2]["error"]["code"], -32601, "{:?}", answers[2]);
    let unreachable = &answers[3];
    assert_eq!(unreachable["result"]["isError"], true, "{unreachable}");
    let text = unreachable["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("cannot connect"), "{text}");
    assert_eq!(answers[4]["error"]["code"], -32603, "{:?}", answers[4]);
}

/// Calls whose arguments the SDK cannot hold as JSON values (a lone
/// surrogate escape, a number past f64) are answered, not dropped.
#[tokio::test]
async fn a_call_the_sdk_cannot_read_is_answered() {
    let call = |id: u64, args: &str| {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"x","arguments":{args}}}}}"#
        );
        serde_json::from_str::<Value>(&line).unwrap_or(Value::String(line))
    };
    let surrogate = call(2, r#"{"s":"\ud800"}"#);
    let huge = call(3, r#"{"n":1e400}"#);
    // Not readable here either: sent as their text.
    assert!(surrogate.is_string() && huge.is_string());
    let answers = exchange_text(&[
        init("2025-06-18").to_string(),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
        surrogate.as_str().unwrap().to_owned(),
        huge.as_str().unwrap().to_owned(),
    ])
    .await;
    assert_eq!(answers[1]["id"], 2, "{answers:?}");
    assert_eq!(answers[1]["error"]["code"], -32602, "{:?}", answers[1]);
    assert_eq!(answers[2]["id"], 3, "{answers:?}");
    assert!(answers[2].get("result").is_some() || answers[2].get("error").is_some());
}

#[tokio::test]
async fn a_2026_client_discovers_without_a_handshake() {
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"}});
    let answers = exchange(&[
        json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
            "params": {"_meta": meta}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "x", "arguments": {}, "_meta": meta}}),
    ])
    .await;
    let discovered = &answers[0]["result"];
    let versions = discovered["supportedVersions"].to_string();
    assert!(versions.contains("2026-07-28") && versions.contains("2025-06-18"), "{discovered}");
    assert!(discovered["capabilities"]["tools"].is_object(), "{discovered}");
    assert_eq!(answers[1]["result"]["isError"], true, "{:?}", answers[1]);
}

/// A daemon's registry and tool list, for [`Server::follow`]: the
/// generation, the tools, and how many tool reads are to fail.
#[derive(Default)]
struct FakeRegistry {
    generation: std::sync::atomic::AtomicU64,
    tools: Mutex<Value>,
    failures: std::sync::atomic::AtomicU32,
}

/// Serves `registry` as skilld's `/v1/registry` (a long poll of up to
/// a second) and `/v1/tools` on a socket in `dir`.
fn fake_daemon(dir: &std::path::Path, registry: Arc<FakeRegistry>) -> DaemonClient {
    use axum::extract::{Query, State};
    use std::sync::atomic::Ordering;
    type Fake = State<Arc<FakeRegistry>>;
    async fn generation(
        State(r): Fake,
        Query(q): Query<std::collections::HashMap<String, u64>>,
    ) -> axum::Json<Value> {
        for _ in 0..50 {
            if q.get("since") != Some(&r.generation.load(Ordering::SeqCst)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        axum::Json(json!({"generation": r.generation.load(Ordering::SeqCst)}))
    }
    async fn tools(State(r): Fake) -> axum::response::Response {
        use axum::response::IntoResponse;
        let fail =
            r.failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if fail.is_ok() {
            return axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        let tools = r.tools.lock().unwrap().clone();
        axum::Json(json!({ "tools": tools })).into_response()
    }
    let socket = dir.join("skilld.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let app = axum::Router::new()
        .route("/v1/registry", axum::routing::get(generation))
        .route("/v1/tools", axum::routing::get(tools))
        .with_state(registry);
    tokio::spawn(async move { axum::serve(listener, app).await });
    DaemonClient::new(socket)
}

/// Two followers (a session and a listen, or two listens) are each
/// told of a move, and one whose tools read failed reads them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_follower_is_told_even_after_a_failed_read() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(FakeRegistry::default());
    let tool = |n: &str| json!({"name": n, "inputSchema": {"type": "object"}});
    *registry.tools.lock().unwrap() = json!([tool("a")]);
    let server = Server::new(fake_daemon(dir.path(), Arc::clone(&registry)));
    let (told, mut heard) = tokio::sync::mpsc::unbounded_channel();
    for who in 0..2 {
        let (server, told) = (server.clone(), told.clone());
        tokio::spawn(async move {
            server
                .follow(|| {
                    let told = told.clone();
                    async move { told.send(who).is_ok() }
                })
                .await;
        });
    }
    // Both have read the first list (nothing to tell yet).
    tokio::time::sleep(Duration::from_millis(300)).await;
    *registry.tools.lock().unwrap() = json!([tool("a"), tool("b")]);
    registry.failures.store(1, std::sync::atomic::Ordering::SeqCst);
    registry.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut who = Vec::new();
    while who.len() < 2 {
        let next = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await;
        who.push(next.expect("both followers told within 5 s").unwrap());
    }
    who.sort_unstable();
    assert_eq!(who, [0, 1]);
    assert_eq!(registry.failures.load(std::sync::atomic::Ordering::SeqCst), 0, "a read failed");
}

/// An `ok` result that does not conform to the tool's `outputSchema`
/// is an `isError` result (`invalid_result`), never `structuredContent`
/// a client would refuse; one that conforms, or of a tool without one,
/// is returned as is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_is_held_to_the_tools_output_schema() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(FakeRegistry::default());
    let shaped = json!({"type": "object", "properties": {"n": {"type": "integer"}},
        "required": ["n"]});
    *registry.tools.lock().unwrap() = json!([
        {"name": "shaped", "inputSchema": {"type": "object"}, "outputSchema": shaped},
        {"name": "free", "inputSchema": {"type": "object"}},
    ]);
    let server = Server::new(fake_daemon(dir.path(), Arc::clone(&registry)));
    let ok = |result: Value| json!({"skill": "s", "outcome": "ok", "result": result});
    let answer = |name: &'static str, result: Value| {
        let server = server.clone();
        async move {
            let r = server.checked_result(name, &ok(result), None).await;
            serde_json::to_value(r).unwrap()
        }
    };
    let good = answer("shaped", json!({"n": 1})).await;
    assert_eq!((&good["isError"], &good["structuredContent"]), (&json!(false), &json!({"n": 1})));
    for bad in [json!({"n": "x"}), json!({}), json!(5)] {
        let r = answer("shaped", bad.clone()).await;
        assert_eq!(r["isError"], true, "{bad}: {r}");
        assert_eq!(r["structuredContent"]["outcome"], "invalid_result", "{bad}: {r}");
        let text = r["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("does not match the tool's outputSchema"), "{text}");
    }
    // A message that would quote a long value is cut.
    let long = answer("shaped", json!({"n": "y".repeat(100_000)})).await;
    assert_eq!(long["structuredContent"]["outcome"], "invalid_result", "{long:.300}");
    let line = serde_json::to_string(&long).unwrap();
    assert!(line.len() < 4096, "{} bytes", line.len());
    let free = answer("free", json!(5)).await;
    assert_eq!(
        (&free["isError"], &free["structuredContent"]),
        (&json!(false), &json!({"result": 5}))
    );
    // The schema changed since it was read: the list is read again.
    *registry.tools.lock().unwrap() = json!([
        {"name": "shaped", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
    ]);
    let now = answer("shaped", json!({"m": 2})).await;
    assert_eq!(now["isError"], false, "{now}");
}

fn report_result_of(report: &Value) -> Value {
    serde_json::to_value(report_result(report, None)).unwrap()
}

#[test]
fn an_ok_result_text_is_what_the_skill_printed() {
    let printed = r#"{"zeta":1.50,"alpha":"\u00e9"}"#;
    let report = json!({"skill": "s", "outcome": "ok", "result": {"zeta": 1.5, "alpha": "é"}});
    let r = report_result(&report, RawJson::from_slice(printed.as_bytes()).ok());
    let r = serde_json::to_value(r).unwrap();
    assert_eq!(r["content"][0]["text"], printed);
    assert_eq!(r["structuredContent"], json!({"zeta": 1.5, "alpha": "é"}));
}

#[test]
fn a_large_result_is_not_copied_into_the_text() {
    let big = "x".repeat(MAX_TEXT_COPY);
    let r = report_result_of(&json!({"skill": "s", "outcome": "ok", "result": {"s": big}}));
    assert_eq!(r["structuredContent"]["s"].as_str().map(str::len), Some(MAX_TEXT_COPY));
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("the result (1048584 bytes of JSON) is in structuredContent"),
        "{text}"
    );
    let line = serde_json::to_string(&r).unwrap();
    assert!(line.len() < MAX_TEXT_COPY + 4096, "{} bytes", line.len());
}

#[test]
fn reports_become_results() {
    let ok = report_result_of(&json!({"skill": "s", "outcome": "ok", "result": {"a": 1}}));
    assert_eq!(ok["structuredContent"], json!({"a": 1}));
    assert_eq!(ok["content"][0]["text"], r#"{"a":1}"#);
    assert_eq!(ok["isError"], false);
    let scalar = report_result_of(&json!({"skill": "s", "outcome": "ok", "result": [1]}));
    assert_eq!(scalar["structuredContent"], json!({"result": [1]}));
    let failed = report_result_of(&json!({"skill": "s", "outcome": "exit_nonzero",
        "exit_code": 3, "error": "exit status 3", "stderr": "boom\n", "result": null}));
    assert_eq!(failed["isError"], true);
    assert_eq!(failed["structuredContent"]["outcome"], "exit_nonzero");
    let text = failed["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("outcome exit_nonzero, exit code 3") && text.contains("boom"), "{text}");
}
