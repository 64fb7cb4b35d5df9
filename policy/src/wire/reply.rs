//! What the executor sends back: results, notifications of a run and
//! errors, encoded by the executor and decoded by the loader.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{code, line, WireError};
use crate::report::RunReport;
use crate::RawJson;

/// The result of `ping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingResult {
    /// Always true: the executor answers.
    pub ok: bool,
    /// The longest timeout a run gets from this executor
    /// (`max_timeout_seconds` of its configuration; a manifest asking for
    /// more is clamped). Absent from older executors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_timeout_seconds: Option<u64>,
}

/// One tool of an MCP server pack, as `mcp_tools` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpToolInfo {
    /// The tool's name as the server lists it (what `execute`'s `tool` names).
    pub name: String,
    /// The skill it is registered as, `PACK.TOOL` ([`crate::mcp::tool_name`]).
    pub skill: String,
    /// Its description.
    pub description: String,
    /// Its input schema (a JSON Schema of an object).
    #[serde(rename = "inputSchema")]
    pub input_schema: Value,
    /// Its class: the pack's `tool_classes` entry, else the pack's class.
    pub class: crate::class::SkillClass,
}

/// The result of `mcp_tools`: the tools, or why there are none (the
/// server did not start; never a secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpToolsResult {
    /// The tools the server listed.
    pub tools: Vec<McpToolInfo>,
    /// Why the server could not be asked, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The generation of this list: it moves each time the server's list
    /// differs from its listing before (see [`Reply::ToolsGeneration`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
}

/// One pack whose tool list's generation moved, in [`McpWatchResult`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpPackMoved {
    /// Absolute path of the pack's `skill.json`, as `mcp_tools` was asked.
    pub manifest: String,
    /// The generation of its tool list now.
    pub generation: u64,
}

/// The result of `mcp_watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpWatchResult {
    /// How many times a server's generation moved since the executor
    /// started: the next call's `since`.
    pub changes: u64,
    /// The packs whose generation moved after `since` (empty when the wait
    /// timed out). A `changes` below `since` is a restarted executor's:
    /// every pack that moved since its start is named.
    pub packs: Vec<McpPackMoved>,
}

/// The result of `metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsResult {
    /// Prometheus text exposition format 0.0.4.
    pub text: String,
}

/// The result of `warm` for a skill granted warm runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmResult {
    /// Warm runs granted (`[skills.NAME] warm`).
    pub size: u32,
    /// Warm runs waiting now.
    pub idle: u64,
    /// Runs that took a warm run since the executor started.
    pub hits: u64,
    /// Runs that found none and ran cold.
    pub misses: u64,
    /// Warm runs killed unused.
    pub discarded: u64,
}

/// The result of `warm_discard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmDiscardResult {
    /// Idle warm runs discarded.
    pub discarded: u64,
}

/// Encodes a successful response carrying any `result` (`ping`, `metrics`).
pub fn encode_result<T: Serialize + ?Sized>(id: &Value, result: &T) -> Vec<u8> {
    line(&ResultLine { jsonrpc: "2.0", id, result })
}

/// A response line, serialised field by field so a [`RawJson`] inside the
/// result (a run report's `result`) is written as received.
#[derive(Serialize)]
struct ResultLine<'a, T: Serialize + ?Sized> {
    jsonrpc: &'static str,
    id: &'a Value,
    result: &'a T,
}

/// Encodes an error response with an explicit code, e.g. [`code::BUSY`].
pub fn encode_error_code(id: &Value, code: i64, message: &str) -> Vec<u8> {
    line(
        &serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
    )
}

/// One line the executor sends back, as the loader reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A `stderr` notification: one line the run wrote on stderr.
    Stderr {
        /// The id of the run.
        id: Value,
        /// The line, without its newline.
        line: String,
    },
    /// A `queued` notification: the run waits for one of the executor's
    /// run slots (sent only when it has to wait).
    Queued {
        /// The id of the run.
        id: Value,
    },
    /// A `started` notification: a queued run got its slot and starts now
    /// (sent only after a `queued`).
    Started {
        /// The id of the run.
        id: Value,
    },
    /// A `tools_generation` notification, sent before the report of a
    /// call to a tool of an MCP server pack: the generation of that
    /// server's tool list after the call. A caller that registered the
    /// pack's tools at another generation (the one `mcp_tools` answered)
    /// lists them again: the server said its tools changed, or a restarted
    /// server lists other tools.
    ToolsGeneration {
        /// The id of the run.
        id: Value,
        /// The generation.
        generation: u64,
    },
    /// A successful response; for `execute`, `result` is a [`RunReport`].
    Result {
        /// The id of the request.
        id: Value,
        /// The result, as the text the executor sent.
        result: RawJson,
    },
    /// An error response (e.g. [`code::BUSY`]).
    Error {
        /// The id of the request (null when the executor could not read it).
        id: Value,
        /// The JSON-RPC error code.
        code: i64,
        /// The error message.
        message: String,
    },
}

/// Decodes one line (without its `\n`) the executor sent.
///
/// # Errors
///
/// [`WireError::Parse`] when it is not JSON, [`WireError::InvalidRequest`]
/// when it is not a JSON-RPC 2.0 response or a `stderr`, `queued`,
/// `started` or `tools_generation` notification.
pub fn decode_reply(line: &[u8]) -> Result<Reply, WireError> {
    // The whole line is checked as JSON first (members a reply does not
    // use, and the raw `result`, are skipped below without being read).
    crate::raw_json::check(line).map_err(|e| WireError::Parse(e.to_string()))?;
    if !line.trim_ascii_start().starts_with(b"{") {
        return Err(WireError::InvalidRequest("not an object".into()));
    }
    // JSON, so what is left is a reply's shape (a member given twice).
    let r: ReplyLine =
        serde_json::from_slice(line).map_err(|e| WireError::InvalidRequest(e.to_string()))?;
    if r.jsonrpc.as_ref().and_then(Value::as_str) != Some("2.0") {
        return Err(WireError::InvalidRequest("jsonrpc must be \"2.0\"".into()));
    }
    if let Some(method) = r.method {
        let name = method.as_str().unwrap_or("");
        if !matches!(name, "stderr" | "queued" | "started" | "tools_generation") {
            return Err(WireError::MethodNotFound(method.to_string().chars().take(64).collect()));
        }
        let mut params = match r.params {
            Some(Value::Object(p)) => p,
            _ => return Err(WireError::InvalidParams(format!("{name} params must be an object"))),
        };
        let id = params.remove("id").unwrap_or(Value::Null);
        if name == "tools_generation" {
            return match params.get("generation").and_then(Value::as_u64) {
                Some(generation) => Ok(Reply::ToolsGeneration { id, generation }),
                None => Err(WireError::InvalidParams("generation must be an integer".into())),
            };
        }
        return match (name, params.remove("line")) {
            ("queued", _) => Ok(Reply::Queued { id }),
            ("started", _) => Ok(Reply::Started { id }),
            (_, Some(Value::String(line))) => Ok(Reply::Stderr { id, line }),
            _ => Err(WireError::InvalidParams("stderr line must be a string".into())),
        };
    }
    let id = r.id.unwrap_or(Value::Null);
    if let Some(result) = r.result {
        return Ok(Reply::Result { id, result });
    }
    match r.error {
        Some(Value::Object(mut e)) => {
            let code = e.get("code").and_then(Value::as_i64).unwrap_or(code::INVALID_REQUEST);
            let message = match e.remove("message") {
                Some(Value::String(m)) => m,
                _ => String::new(),
            };
            Ok(Reply::Error { id, code, message })
        }
        _ => Err(WireError::InvalidRequest("neither result nor error".into())),
    }
}

/// One reply line as read: `result` is kept as text so a run report's
/// `result` (the skill's stdout) reaches the client verbatim.
#[derive(Deserialize)]
struct ReplyLine {
    #[serde(default)]
    jsonrpc: Option<Value>,
    #[serde(default)]
    method: Option<Value>,
    #[serde(default)]
    params: Option<Value>,
    #[serde(default)]
    id: Option<Value>,
    /// Present (even `null`) means a result.
    #[serde(default, deserialize_with = "present")]
    result: Option<RawJson>,
    #[serde(default)]
    error: Option<Value>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<RawJson>, D::Error> {
    RawJson::deserialize(d).map(Some)
}

/// Encodes a `stderr` notification for run `id`.
pub fn encode_stderr(id: &Value, text: &str) -> Vec<u8> {
    line(
        &serde_json::json!({"jsonrpc": "2.0", "method": "stderr", "params": {"id": id, "line": text}}),
    )
}

/// Encodes a `queued` notification for run `id`: it waits for a run slot.
pub fn encode_queued(id: &Value) -> Vec<u8> {
    line(&serde_json::json!({"jsonrpc": "2.0", "method": "queued", "params": {"id": id}}))
}

/// Encodes a `started` notification for run `id`: it left the queue.
pub fn encode_started(id: &Value) -> Vec<u8> {
    line(&serde_json::json!({"jsonrpc": "2.0", "method": "started", "params": {"id": id}}))
}

/// Encodes a `tools_generation` notification for run `id`
/// ([`Reply::ToolsGeneration`]).
pub fn encode_tools_generation(id: &Value, generation: u64) -> Vec<u8> {
    line(&serde_json::json!({"jsonrpc": "2.0", "method": "tools_generation",
        "params": {"id": id, "generation": generation}}))
}

/// Encodes the final response of a run.
pub fn encode_report(id: &Value, report: &RunReport) -> Vec<u8> {
    encode_result(id, report)
}

/// Encodes an error response.
pub fn encode_error(id: &Value, err: &WireError) -> Vec<u8> {
    line(
        &serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": err.code(), "message": err.to_string()}}),
    )
}
