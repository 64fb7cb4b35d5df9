//! `ongrid-skill mcp [--socket PATH]`: a Model Context Protocol server on
//! stdin/stdout that offers the caller's skills as MCP tools.
//!
//! Transport: MCP stdio (spec 2025-06-18; 2025-03-26 and 2024-11-05 are
//! accepted too): newline-delimited JSON-RPC 2.0, one message per line,
//! nothing but protocol messages on stdout; diagnostics go to stderr.
//!
//! - `initialize`: the protocol version (the client's when supported, else
//!   ours), `capabilities.tools`, `serverInfo`.
//! - `ping`: `{}`.
//! - `tools/list`: `GET /v1/tools?format=mcp` from ongrid-skilld, which
//!   lists only what this caller (the uid running `ongrid-skill mcp`, by
//!   `SO_PEERCRED`) may run: `name`, `description`, `inputSchema`.
//! - `tools/call`: `POST /v1/skills/{name}/execute` with the `arguments`.
//!   An `ok` run answers the result as `structuredContent` (an object
//!   result as is, anything else as `{"result": ...}`) and as JSON text;
//!   any other outcome is `isError: true` with the outcome, error, exit
//!   code and stderr tail (text and `structuredContent`). Refusals (invalid
//!   args, denied, busy, daemon unreachable) are `isError` results with
//!   the daemon's code and message; an unknown tool is a JSON-RPC error
//!   (`-32602`), as the spec asks.
//! - `notifications/cancelled` drops that call's connection to the
//!   daemon, which kills the run; no answer is sent for it.
//!
//! Calls run concurrently; answers may come out of order (by id).
//! Why not the rmcp SDK: its current releases need Rust 1.88 (this
//! workspace builds with 1.85) and bring schemars, macros and a UUID
//! stack for five methods whose payloads are JSON we already have.

use std::collections::HashMap;
use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use policy::{ArgsError, RawJson};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::remote::DaemonArgs;
use crate::cli::client::{encode_segment, ApiResponse, ClientError, DaemonClient};

/// The protocol version this server speaks first.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Versions accepted from a client's `initialize`.
pub const SUPPORTED_VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];
/// Longest message line read from stdin.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// JSON-RPC error codes.
mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
}

/// Arguments of `mcp`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How to reach the daemon.
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

/// Serves MCP on stdin/stdout until stdin closes.
///
/// # Errors
///
/// I/O errors on stdin or stdout.
pub fn run(args: &Args, _out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let server = Server::new(args.daemon.client());
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let result = super::remote::block_on(serve(server, stdin, tokio::io::stdout()))??;
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            writeln!(err, "ongrid-skill mcp: {e}")?;
            Ok(ExitCode::FAILURE)
        }
    }
}

/// What answers requests: the daemon client and the calls in flight.
#[derive(Debug, Clone)]
pub struct Server {
    client: DaemonClient,
    session: String,
    in_flight: Arc<Mutex<HashMap<String, tokio::task::AbortHandle>>>,
}

fn response(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// A `tools/call` line, for its arguments' text.
#[derive(Deserialize)]
struct CallLine {
    params: Option<CallParams>,
}

#[derive(Deserialize)]
struct CallParams {
    arguments: Option<Box<RawValue>>,
}

/// The execute body of a `tools/call` (a struct: the args go as text).
#[derive(Serialize)]
struct CallBody<'a> {
    args: &'a policy::Args,
    session_id: &'a str,
}

/// A `tools/call` result.
fn tool_result(text: String, structured: Value, is_error: bool) -> Value {
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": is_error,
    })
}

impl Server {
    /// A server asking the daemon behind `client`.
    pub fn new(client: DaemonClient) -> Self {
        Self {
            client,
            session: format!("mcp-{}", std::process::id()),
            in_flight: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::task::AbortHandle>> {
        self.in_flight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Answers one message that is not a `tools/call` (those need the
    /// daemon and run as tasks: [`Server::call_tool`]). `None` for
    /// notifications and responses.
    pub async fn handle(&self, msg: Value) -> Option<Value> {
        let Value::Object(obj) = msg else {
            let why = "a message must be a JSON object (batches are not supported)";
            return Some(error(&Value::Null, code::INVALID_REQUEST, why));
        };
        let id = obj.get("id").cloned();
        let method = obj.get("method").and_then(Value::as_str);
        let (Some(id), Some(method)) = (id, method) else {
            if obj.get("method").and_then(Value::as_str) == Some("notifications/cancelled") {
                self.cancel(obj.get("params"));
            }
            // Other notifications, and responses to requests we never send.
            return None;
        };
        if !matches!(id, Value::String(_) | Value::Number(_)) {
            return Some(error(
                &Value::Null,
                code::INVALID_REQUEST,
                "id must be a string or a number",
            ));
        }
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Some(error(&id, code::INVALID_REQUEST, "jsonrpc must be \"2.0\""));
        }
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        Some(match method {
            "initialize" => response(&id, initialize(&params)),
            "ping" => response(&id, json!({})),
            "tools/list" => self.list_tools(&id).await,
            "tools/call" => self.call_tool(&id, &params, None).await,
            other => {
                let shown: String = other.chars().take(64).collect();
                error(&id, code::METHOD_NOT_FOUND, format!("method not found: {shown}"))
            }
        })
    }

    fn cancel(&self, params: Option<&Value>) {
        let Some(id) = params.and_then(|p| p.get("requestId")) else { return };
        if let Some(handle) = self.calls().remove(&id.to_string()) {
            handle.abort();
        }
    }

    async fn list_tools(&self, id: &Value) -> Value {
        match self.client.get("/v1/tools?format=mcp").await {
            Ok(r) if r.status.is_success() => {
                let tools = r.body.get("tools").cloned().unwrap_or_else(|| json!([]));
                response(id, json!({"tools": tools}))
            }
            Ok(r) => error(id, code::INTERNAL_ERROR, daemon_message(&r)),
            Err(e) => error(id, code::INTERNAL_ERROR, client_message(&e)),
        }
    }

    /// Runs a `tools/call` to its end and returns its answer. `arguments`
    /// is `params.arguments` as the message's text, when the caller kept
    /// it: the skill then reads it exactly (else `params`' copy is sent).
    pub async fn call_tool(
        &self,
        id: &Value,
        params: &Value,
        arguments: Option<&RawValue>,
    ) -> Value {
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return error(id, code::INVALID_PARAMS, "params.name must be a string");
        };
        let text = match (arguments, params.get("arguments")) {
            (Some(raw), _) if raw.get() != "null" => raw.get().to_owned(),
            (Some(_), _) | (None, None | Some(Value::Null)) => "{}".to_owned(),
            (None, Some(v)) => v.to_string(),
        };
        let args = match policy::Args::from_slice(text.as_bytes()) {
            Ok(a) => a,
            Err(ArgsError::NotObject) => {
                return error(id, code::INVALID_PARAMS, "params.arguments must be an object")
            }
            Err(e) => return error(id, code::INVALID_PARAMS, format!("params.arguments: {e}")),
        };
        let path = format!("/v1/skills/{}/execute", encode_segment(name));
        let body = CallBody { args: &args, session_id: &self.session };
        let r = match self.client.post(&path, &body).await {
            Ok(r) => r,
            Err(e) => {
                let text = client_message(&e);
                let structured = json!({"error": {"code": "unreachable", "message": text}});
                return response(id, tool_result(text, structured, true));
            }
        };
        match r.status.as_u16() {
            200 => response(id, report_result(&r.body, r.report_result())),
            404 => error(id, code::INVALID_PARAMS, format!("Unknown tool: {name}")),
            _ => {
                let structured = r.body.clone();
                response(id, tool_result(daemon_message(&r), structured, true))
            }
        }
    }
}

/// The `initialize` result.
fn initialize(params: &Value) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked.filter(|v| SUPPORTED_VERSIONS.contains(v)).unwrap_or(PROTOCOL_VERSION);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {
            "name": "ongrid-skill",
            "title": "ongrid-skills",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "instructions": "Each tool is a sandboxed ongrid skill run on this host by ongrid-skilld; \
            only the skills you may run are listed. A failed run is returned with isError and \
            its outcome and stderr.",
    })
}

/// A run report (200) as a `tools/call` result; the text content is the
/// result as the skill printed it (`raw`, from the answer's text).
fn report_result(report: &Value, raw: Option<RawJson>) -> Value {
    let outcome = report["outcome"].as_str().unwrap_or("unknown");
    if outcome == "ok" {
        let result = report.get("result").cloned().unwrap_or(Value::Null);
        let text = match raw {
            Some(raw) => raw.get().to_owned(),
            None => serde_json::to_string(&result).unwrap_or_default(),
        };
        let structured = match result {
            Value::Object(_) => result,
            other => json!({"result": other}),
        };
        return tool_result(text, structured, false);
    }
    let mut text =
        format!("skill {} failed: outcome {outcome}", report["skill"].as_str().unwrap_or("?"));
    if let Some(code) = report["exit_code"].as_i64() {
        text.push_str(&format!(", exit code {code}"));
    }
    if let Some(signal) = report["signal"].as_i64() {
        text.push_str(&format!(", signal {signal}"));
    }
    if let Some(e) = report["error"].as_str() {
        text.push_str(&format!("\nerror: {e}"));
    }
    let stderr = report["stderr"].as_str().unwrap_or_default();
    if !stderr.is_empty() {
        text.push_str(&format!("\nstderr:\n{stderr}"));
    }
    let structured = json!({
        "skill": report["skill"],
        "outcome": outcome,
        "error": report["error"],
        "exit_code": report["exit_code"],
        "signal": report["signal"],
        "stderr": stderr,
        "duration_ms": report["duration_ms"],
    });
    tool_result(text, structured, true)
}

/// `CODE: message` of an error answer, with its violations.
fn daemon_message(r: &ApiResponse) -> String {
    let e = &r.body["error"];
    let code = e["code"].as_str().unwrap_or("error");
    let mut text = match e["message"].as_str() {
        Some(m) => format!("{code}: {m}"),
        None => format!("{code}: HTTP {}", r.status),
    };
    if let Some(reason) = e["reason"].as_str() {
        text.push_str(&format!(" (reason: {reason})"));
    }
    for v in e["violations"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let path = v["path"].as_str().filter(|p| !p.is_empty()).unwrap_or("(args)");
        text.push_str(&format!("\n  {path}: {}", v["message"].as_str().unwrap_or_default()));
    }
    text
}

fn client_message(e: &ClientError) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    message
}

/// Reads one line of at most [`MAX_MESSAGE_BYTES`]. `Ok(None)` at EOF;
/// an over-long line is consumed to its end and returned as `Some(None)`.
async fn read_line<R: AsyncBufRead + Unpin>(reader: &mut R) -> io::Result<Option<Option<Vec<u8>>>> {
    let mut buf = Vec::new();
    let n = (&mut *reader).take(MAX_MESSAGE_BYTES as u64 + 1).read_until(b'\n', &mut buf).await?;
    if n == 0 {
        return Ok(None);
    }
    if buf.len() > MAX_MESSAGE_BYTES && buf.last() != Some(&b'\n') {
        // Skip the rest of the line.
        loop {
            let mut rest = Vec::new();
            let m = (&mut *reader).take(64 << 10).read_until(b'\n', &mut rest).await?;
            if m == 0 || rest.last() == Some(&b'\n') {
                break;
            }
        }
        return Ok(Some(None));
    }
    Ok(Some(Some(buf)))
}

/// Serves MCP on `input`/`output` until `input` closes and every call in
/// flight has answered.
///
/// # Errors
///
/// I/O errors reading `input` or writing `output`.
pub async fn serve<R, W>(
    server: Server,
    mut input: R,
    mut output: W,
) -> io::Result<Result<(), String>>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            let mut line = serde_json::to_vec(&msg).unwrap_or_default();
            line.push(b'\n');
            output.write_all(&line).await?;
            output.flush().await?;
        }
        io::Result::Ok(())
    });
    let mut calls = tokio::task::JoinSet::new();
    while let Some(line) = read_line(&mut input).await? {
        let Some(line) = line else {
            let _ = tx.send(error(&Value::Null, code::PARSE_ERROR, "message too long"));
            continue;
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let msg: Value = match serde_json::from_slice(&line) {
            Ok(v) => v,
            Err(e) => {
                let _ =
                    tx.send(error(&Value::Null, code::PARSE_ERROR, format!("parse error: {e}")));
                continue;
            }
        };
        let is_call = msg.get("method").and_then(Value::as_str) == Some("tools/call")
            && matches!(msg.get("id"), Some(Value::String(_) | Value::Number(_)))
            && msg.get("jsonrpc").and_then(Value::as_str) == Some("2.0");
        if is_call {
            let id = msg["id"].clone();
            let params = msg.get("params").cloned().unwrap_or(Value::Null);
            // The arguments as sent (a `Value` sorts keys, rounds numbers and
            // keeps the last of a key given twice, which `Args` refuses).
            let arguments = match serde_json::from_slice::<CallLine>(&line) {
                Ok(l) => l.params.and_then(|p| p.arguments),
                Err(e) => {
                    // E.g. `params` or `arguments` given twice.
                    let _ = tx.send(error(&id, code::INVALID_PARAMS, format!("params: {e}")));
                    continue;
                }
            };
            let (task_server, tx) = (server.clone(), tx.clone());
            let key = id.to_string();
            // Held across the spawn: the task's own removal comes after.
            let mut in_flight = server.calls();
            let task = calls.spawn(async move {
                let answer = task_server.call_tool(&id, &params, arguments.as_deref()).await;
                task_server.calls().remove(&id.to_string());
                let _ = tx.send(answer);
            });
            in_flight.insert(key, task);
            drop(in_flight);
        } else if let Some(answer) = server.handle(msg).await {
            let _ = tx.send(answer);
        }
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
    drop(tx);
    match writer.await {
        Ok(r) => r.map(Ok),
        Err(e) => Ok(Err(format!("writer task failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Server {
        Server::new(DaemonClient::new("/nonexistent/skilld.sock"))
    }

    async fn exchange(lines: &str) -> Vec<Value> {
        let (mut client, server_end) = tokio::io::duplex(1 << 20);
        let input = tokio::io::BufReader::new(lines.as_bytes().to_vec().leak() as &[u8]);
        let task = tokio::spawn(serve(server(), input, server_end));
        task.await.unwrap().unwrap().unwrap();
        let mut out = String::new();
        client.read_to_string(&mut out).await.unwrap();
        out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[tokio::test]
    async fn handshake_ping_errors_and_unreachable_daemon() {
        let answers = exchange(concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#, "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#, "\n",
            r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#, "\n",
            "not json\n",
            "[]\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"resources/list"}"#, "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x","arguments":[]}}"#, "\n",
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x"}}"#, "\n",
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#, "\n",
        ))
        .await;
        let by_id = |id: Value| answers.iter().find(|a| a["id"] == id).cloned().unwrap();
        let init = by_id(json!(1));
        assert_eq!(init["result"]["protocolVersion"], "2024-11-05");
        assert_eq!(init["result"]["capabilities"]["tools"]["listChanged"], false);
        assert_eq!(by_id(json!("p"))["result"], json!({}));
        assert_eq!(by_id(json!(2))["error"]["code"], code::METHOD_NOT_FOUND);
        assert_eq!(by_id(json!(3))["error"]["code"], code::INVALID_PARAMS);
        let unreachable = by_id(json!(4));
        assert_eq!(unreachable["result"]["isError"], true, "{unreachable}");
        assert!(unreachable["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("cannot connect"));
        assert_eq!(by_id(json!(5))["error"]["code"], code::INTERNAL_ERROR);
        let nulls: Vec<&Value> = answers.iter().filter(|a| a["id"].is_null()).collect();
        assert_eq!(nulls.len(), 2, "{answers:?}");
        assert_eq!(nulls[0]["error"]["code"], code::PARSE_ERROR);
        assert_eq!(nulls[1]["error"]["code"], code::INVALID_REQUEST);
        assert_eq!(answers.len(), 8);
    }

    fn report_result_of(report: &Value) -> Value {
        report_result(report, None)
    }

    #[test]
    fn an_ok_result_text_is_what_the_skill_printed() {
        let printed = r#"{"zeta":1.50,"alpha":"\u00e9"}"#;
        let report = json!({"skill": "s", "outcome": "ok", "result": {"zeta": 1.5, "alpha": "é"}});
        let r = report_result(&report, RawJson::from_slice(printed.as_bytes()).ok());
        assert_eq!(r["content"][0]["text"], printed);
        assert_eq!(r["structuredContent"], json!({"zeta": 1.5, "alpha": "é"}));
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
        assert!(
            text.contains("outcome exit_nonzero, exit code 3") && text.contains("boom"),
            "{text}"
        );
    }
}
