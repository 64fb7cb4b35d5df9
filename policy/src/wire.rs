//! The executor wire: newline-delimited JSON-RPC 2.0 with a line-length cap.
//!
//! One JSON object per line, `\n`-terminated. The loader sends `execute`
//! requests; the executor answers with `stderr` notifications for the run
//! and then one response whose `result` is the [`RunReport`].
//!
//! A run that has to wait for one of the executor's run slots is announced
//! with a `queued` notification, and a `started` one when it gets its slot
//! (`{"jsonrpc":"2.0","method":"queued","params":{"id":ID}}`): the caller's
//! clock for the skill's timeout starts then, not while the run waited.
//! A run that starts at once gets neither. A call to a tool of an MCP
//! server pack is answered after a `tools_generation` notification
//! ([`Reply::ToolsGeneration`]).
//!
//! A held run: `execute` with `"hold": true` is checked and prepared by
//! the executor (manifest, admission, run slot, cgroup, run directory,
//! Landlock ruleset), but nothing is spawned before a `start`
//! notification naming its id arrives on the same connection
//! (`{"jsonrpc":"2.0","method":"start","params":{"id":ID}}`, no answer).
//! The loader sends the request while it writes the decision's audit row
//! and `start` once the row is in, so the two overlap and no skill runs
//! unaudited. Closing the connection instead cancels the held run. Decoding is
//! split from I/O (as mini-redis splits `frame` from `connection`): the
//! caller hands [`decode_line`] one line without its newline, and
//! [`LineBuffer`] cuts a byte stream into bounded lines.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::report::RunReport;
use crate::RawJson;

/// Longest line accepted on the executor socket, in bytes (args are bounded
/// at 1 MiB by the loader; reports carry bounded stderr and the result).
pub const MAX_LINE_BYTES: usize = 32 << 20;

/// JSON-RPC error codes used on the wire.
pub mod code {
    /// Invalid JSON was received.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON is not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// The method does not exist.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid method parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// The peer is not allowed to talk to the executor.
    pub const FORBIDDEN: i64 = -32001;
    /// The executor is at its concurrency and queue cap.
    pub const BUSY: i64 = -32002;
    /// A line was longer than [`super::MAX_LINE_BYTES`].
    pub const LINE_TOO_LONG: i64 = -32003;
}

/// Parameters of `execute`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteParams {
    /// Absolute path of the skill's `skill.json`.
    pub manifest: String,
    /// The args, passed to the skill's stdin exactly as sent. Any JSON
    /// here: the executor checks them as [`crate::Args`] when it plans the
    /// run, and reports `invalid_args` like a one-shot run would.
    pub args: RawJson,
    /// Caller's session id, for logs and audit.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The skill class the loader authorised (the executor re-checks it).
    #[serde(default)]
    pub class: Option<crate::class::SkillClass>,
    /// For a `SKILL.md` manifest: which of its tools to run (its name as
    /// written or as registered). Absent for `skill.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Prepare the run, but spawn nothing before a `start` notification
    /// for this request's id ([`Request::Start`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
}

/// A request the executor understands.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Run a skill.
    Execute {
        /// JSON-RPC id.
        id: Value,
        /// What to run.
        params: ExecuteParams,
    },
    /// Liveness check; answered with `{"ok":true}`.
    Ping {
        /// JSON-RPC id.
        id: Value,
    },
    /// The executor's Prometheus exposition text, answered with
    /// [`MetricsResult`] (`{"text":"..."}`). The loader appends it to its
    /// own `/metrics`, so one scrape target carries both daemons: the
    /// loader renames any `process_*` family to `ongrid_executor_process_*`
    /// and drops any family whose name it already exposes itself.
    Metrics {
        /// JSON-RPC id.
        id: Value,
    },
    /// The tools of an MCP server pack (`"kind": "mcp"`), answered with
    /// [`McpToolsResult`]; starts the pack's server when it is not running.
    McpTools {
        /// JSON-RPC id.
        id: Value,
        /// What to list.
        params: McpToolsParams,
    },
    /// A long poll on the MCP servers' tool lists: answered with
    /// [`McpWatchResult`] once the count of generation moves is not
    /// `since` (at once if it is not already), or when `timeout_ms` passes,
    /// or when the executor stops. skilld keeps one in flight and lists
    /// again the packs the answer names.
    McpWatch {
        /// JSON-RPC id.
        id: Value,
        /// What to wait for.
        params: McpWatchParams,
    },
    /// The warm pool of one skill, answered with [`WarmResult`], or null
    /// when the executor grants that skill no warm runs.
    Warm {
        /// JSON-RPC id.
        id: Value,
        /// The skill's name.
        skill: String,
    },
    /// Discard every idle warm run (skilld's reload: skill files may have
    /// changed in ways the warm runs' identity check does not see), and
    /// make the pools again; answered with [`WarmDiscardResult`].
    WarmDiscard {
        /// JSON-RPC id.
        id: Value,
    },
    /// A notification (no id, no answer): start the held run whose
    /// `execute` had the id `run` on this connection.
    Start {
        /// The id of the held `execute`.
        run: Value,
    },
}

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

/// Parameters of `mcp_tools`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolsParams {
    /// Absolute path of the pack's `skill.json`.
    pub manifest: String,
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

/// Longest wait of an `mcp_watch`, ms (a longer `timeout_ms` is cut to it).
pub const MAX_MCP_WATCH_MS: u64 = 300_000;
/// The wait of an `mcp_watch` without `timeout_ms`, ms.
pub const DEFAULT_MCP_WATCH_MS: u64 = 30_000;

/// Parameters of `mcp_watch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpWatchParams {
    /// The count of moves the caller has seen (`changes` of its last
    /// answer; 0 at first).
    pub since: u64,
    /// How long to wait, ms (default [`DEFAULT_MCP_WATCH_MS`], at most
    /// [`MAX_MCP_WATCH_MS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
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

/// The `params` of `warm`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WarmParams {
    skill: String,
}

/// Why a line is not a request. Each maps to a JSON-RPC error code.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Not JSON (or not UTF-8).
    #[error("parse error: {0}")]
    Parse(String),
    /// JSON, but not a JSON-RPC 2.0 request.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Unknown method.
    #[error("method not found: {0}")]
    MethodNotFound(String),
    /// Bad params for a known method.
    #[error("invalid params: {0}")]
    InvalidParams(String),
    /// The line exceeded the cap.
    #[error("line longer than {0} bytes")]
    LineTooLong(usize),
}

impl WireError {
    /// The JSON-RPC error code.
    pub fn code(&self) -> i64 {
        match self {
            WireError::Parse(_) => code::PARSE_ERROR,
            WireError::InvalidRequest(_) => code::INVALID_REQUEST,
            WireError::MethodNotFound(_) => code::METHOD_NOT_FOUND,
            WireError::InvalidParams(_) => code::INVALID_PARAMS,
            WireError::LineTooLong(_) => code::LINE_TOO_LONG,
        }
    }
}

/// Longest string `id` a request may carry: every notification and answer
/// of a run repeats it (one per stderr line), so a long one would multiply
/// the executor's write queue.
pub const MAX_ID_BYTES: usize = 256;

/// Decodes one line (without its `\n`) into a request. Returns the id it
/// could recover alongside any error, so the error response can carry it.
///
/// # Errors
///
/// [`WireError`] with the id when one was readable (else `null`).
pub fn decode_line(line: &[u8]) -> Result<Request, (Value, WireError)> {
    let v: Value =
        serde_json::from_slice(line).map_err(|e| (Value::Null, WireError::Parse(e.to_string())))?;
    let Value::Object(mut obj) = v else {
        return Err((Value::Null, WireError::InvalidRequest("not an object".into())));
    };
    let id = match obj.remove("id") {
        Some(Value::String(s)) if s.len() > MAX_ID_BYTES => {
            return Err((
                Value::Null,
                WireError::InvalidRequest(format!("id longer than {MAX_ID_BYTES} bytes")),
            ))
        }
        Some(id @ (Value::Number(_) | Value::String(_))) => id,
        Some(_) => {
            return Err((
                Value::Null,
                WireError::InvalidRequest("id must be a number or a string".into()),
            ))
        }
        None if obj.get("method").and_then(Value::as_str) == Some("start") => {
            return decode_start(&obj).map_err(|e| (Value::Null, e));
        }
        None => {
            return Err((
                Value::Null,
                WireError::InvalidRequest("notifications other than start are not accepted".into()),
            ))
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((id, WireError::InvalidRequest("jsonrpc must be \"2.0\"".into())));
    }
    let method = match obj.get("method") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err((id, WireError::InvalidRequest("method must be a string".into()))),
    };
    match method.as_str() {
        // Read again from the line's text, so the args reach the skill as
        // they were sent (a `Value` would sort keys and round numbers).
        "execute" => match serde_json::from_slice::<ExecuteLine<'_>>(line) {
            Ok(ExecuteLine { params: Some(raw) }) => {
                match serde_json::from_str::<ExecuteParams>(raw.get()) {
                    Ok(params) => Ok(Request::Execute { id, params }),
                    Err(e) => Err((id, WireError::InvalidParams(e.to_string()))),
                }
            }
            Ok(ExecuteLine { params: None }) => {
                Err((id, WireError::InvalidParams("execute needs params".into())))
            }
            Err(e) => Err((id, WireError::InvalidRequest(e.to_string()))),
        },
        "ping" => Ok(Request::Ping { id }),
        "mcp_tools" => {
            let params = obj.remove("params").unwrap_or(Value::Null);
            match serde_json::from_value::<McpToolsParams>(params) {
                Ok(params) => Ok(Request::McpTools { id, params }),
                Err(e) => Err((id, WireError::InvalidParams(e.to_string()))),
            }
        }
        "mcp_watch" => {
            let params = obj.remove("params").unwrap_or(Value::Null);
            match serde_json::from_value::<McpWatchParams>(params) {
                Ok(params) => Ok(Request::McpWatch { id, params }),
                Err(e) => Err((id, WireError::InvalidParams(e.to_string()))),
            }
        }
        "metrics" => Ok(Request::Metrics { id }),
        "warm" => match obj.get("params").map(WarmParams::deserialize) {
            Some(Ok(WarmParams { skill })) => Ok(Request::Warm { id, skill }),
            Some(Err(e)) => Err((id, WireError::InvalidParams(e.to_string()))),
            None => Err((id, WireError::InvalidParams("warm needs params".into()))),
        },
        "warm_discard" => match obj.get("params") {
            None | Some(Value::Null) => Ok(Request::WarmDiscard { id }),
            Some(Value::Object(o)) if o.is_empty() => Ok(Request::WarmDiscard { id }),
            Some(_) => Err((id, WireError::InvalidParams("warm_discard takes no params".into()))),
        },
        other => {
            let shown: String = other.chars().take(64).collect();
            Err((id, WireError::MethodNotFound(shown)))
        }
    }
}

/// An `execute` line's `params`, as text.
#[derive(Deserialize)]
struct ExecuteLine<'a> {
    #[serde(borrow, default)]
    params: Option<&'a serde_json::value::RawValue>,
}

/// The `start` notification: `params` is `{"id": ID}`, the id a number or
/// a string as in the `execute` it starts.
fn decode_start(obj: &serde_json::Map<String, Value>) -> Result<Request, WireError> {
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(WireError::InvalidRequest("jsonrpc must be \"2.0\"".into()));
    }
    match obj.get("params").and_then(|p| p.get("id")) {
        Some(run @ (Value::Number(_) | Value::String(_))) => {
            Ok(Request::Start { run: run.clone() })
        }
        _ => Err(WireError::InvalidParams("start needs params.id, a number or a string".into())),
    }
}

/// Encodes a request line (with its `\n`).
pub fn encode_execute(id: u64, params: &ExecuteParams) -> Vec<u8> {
    // A struct, not `json!`: the args go out as their text.
    #[derive(Serialize)]
    struct Line<'a> {
        jsonrpc: &'static str,
        id: u64,
        method: &'static str,
        params: &'a ExecuteParams,
    }
    line(&Line { jsonrpc: "2.0", id, method: "execute", params })
}

/// Encodes the `start` notification of the held run `id` (with its `\n`).
pub fn encode_start(id: u64) -> Vec<u8> {
    line(&serde_json::json!({"jsonrpc": "2.0", "method": "start", "params": {"id": id}}))
}

/// Encodes a `metrics` request line (with its `\n`).
pub fn encode_metrics(id: u64) -> Vec<u8> {
    line(&serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "metrics"}))
}

/// Encodes a `warm` request line for `skill` (with its `\n`).
pub fn encode_warm(id: u64, skill: &str) -> Vec<u8> {
    line(
        &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "warm", "params": {"skill": skill}}),
    )
}

/// Encodes a `warm_discard` request line (with its `\n`).
pub fn encode_warm_discard(id: u64) -> Vec<u8> {
    line(&serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "warm_discard"}))
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

fn line<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    // Serialising cannot fail: every map key is a string.
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Cuts a byte stream into `\n`-terminated lines of at most `cap` bytes.
/// A longer line is reported once as [`WireError::LineTooLong`] and skipped
/// up to its newline, so one bad line never wedges the connection and the
/// buffer never grows past `cap`.
#[derive(Debug)]
pub struct LineBuffer {
    buf: Vec<u8>,
    cap: usize,
    discarding: bool,
}

impl LineBuffer {
    /// A buffer for lines of at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self { buf: Vec::new(), cap, discarding: false }
    }

    /// Feeds `data` and returns the complete lines (without `\n`) or errors
    /// it produced, in order.
    pub fn push(&mut self, mut data: &[u8]) -> Vec<Result<Vec<u8>, WireError>> {
        let mut out = Vec::new();
        while !data.is_empty() {
            match data.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    if self.discarding {
                        self.discarding = false;
                    } else if self.buf.len() + i > self.cap {
                        out.push(Err(WireError::LineTooLong(self.cap)));
                    } else {
                        self.buf.extend_from_slice(&data[..i]);
                        out.push(Ok(std::mem::take(&mut self.buf)));
                    }
                    self.buf.clear();
                    data = &data[i + 1..];
                }
                None => {
                    if !self.discarding {
                        if self.buf.len() + data.len() > self.cap {
                            self.discarding = true;
                            self.buf = Vec::new();
                            out.push(Err(WireError::LineTooLong(self.cap)));
                        } else {
                            self.buf.extend_from_slice(data);
                        }
                    }
                    data = &[];
                }
            }
        }
        out
    }

    /// Bytes of an incomplete line held now.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn execute_round_trip() {
        let p = ExecuteParams {
            manifest: "/s/skill.json".into(),
            args: RawJson::from_slice(br#"{"z":1.50,"a":123456789012345678901234567890}"#).unwrap(),
            session_id: None,
            class: None,
            tool: None,
            hold: false,
        };
        let l = encode_execute(7, &p);
        assert!(!l.windows(4).any(|w| w == b"hold"), "hold is left out when false");
        let text = br#""args":{"z":1.50,"a":123456789012345678901234567890}"#;
        assert!(l.windows(text.len()).any(|w| w == text), "args as sent");
        assert_eq!(l.last(), Some(&b'\n'));
        match decode_line(&l[..l.len() - 1]).unwrap() {
            Request::Execute { id, params } => {
                assert_eq!(id, json!(7));
                assert_eq!(params, p);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn execute_args_are_read_as_text_and_checked_later() {
        // Not an object, a key twice: decoded as sent; the executor's plan
        // refuses them with an `invalid_args` report.
        for args in [r#"{"a":1,"a":2}"#, "[1]", r#"{"b":1E3,"a":"\u00e9"}"#] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"execute","params":{{"manifest":"/x","args":{args}}}}}"#
            );
            match decode_line(line.as_bytes()).unwrap() {
                Request::Execute { params, .. } => assert_eq!(params.args.get(), args),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_held_execute_and_its_start_round_trip() {
        let p = ExecuteParams {
            manifest: "/s/skill.json".into(),
            args: RawJson::from_slice(b"{}").unwrap(),
            session_id: None,
            class: None,
            tool: None,
            hold: true,
        };
        let l = encode_execute(3, &p);
        assert!(matches!(
            decode_line(&l[..l.len() - 1]).unwrap(),
            Request::Execute { params: ExecuteParams { hold: true, .. }, .. }
        ));
        let l = encode_start(3);
        assert_eq!(decode_line(&l[..l.len() - 1]).unwrap(), Request::Start { run: json!(3) });
        assert_eq!(
            decode_line(br#"{"jsonrpc":"2.0","method":"start","params":{"id":"r"}}"#).unwrap(),
            Request::Start { run: json!("r") }
        );
    }

    #[test]
    fn bad_lines_get_the_right_code() {
        let with_id =
            |n: usize| format!(r#"{{"jsonrpc":"2.0","id":"{}","method":"ping"}}"#, "i".repeat(n));
        let longest = "i".repeat(MAX_ID_BYTES);
        assert_eq!(
            decode_line(with_id(MAX_ID_BYTES).as_bytes()).unwrap(),
            Request::Ping { id: json!(longest) }
        );
        let long_id = with_id(MAX_ID_BYTES + 1);
        let cases: &[(&[u8], i64, Value)] = &[
            (b"", code::PARSE_ERROR, Value::Null),
            (b"{", code::PARSE_ERROR, Value::Null),
            (b"\xff", code::PARSE_ERROR, Value::Null),
            (b"[]", code::INVALID_REQUEST, Value::Null),
            (br#"{"jsonrpc":"2.0","method":"ping"}"#, code::INVALID_REQUEST, Value::Null),
            (br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#, code::INVALID_REQUEST, Value::Null),
            (long_id.as_bytes(), code::INVALID_REQUEST, Value::Null),
            (br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#, code::INVALID_REQUEST, json!(1)),
            (br#"{"jsonrpc":"2.0","id":"a","method":5}"#, code::INVALID_REQUEST, json!("a")),
            (br#"{"jsonrpc":"2.0","id":2,"method":"rm"}"#, code::METHOD_NOT_FOUND, json!(2)),
            (br#"{"jsonrpc":"2.0","id":3,"method":"execute"}"#, code::INVALID_PARAMS, json!(3)),
            (br#"{"jsonrpc":"2.0","id":4,"method":"execute","params":{"manifest":1,"args":{}}}"#, code::INVALID_PARAMS, json!(4)),
            (br#"{"jsonrpc":"2.0","id":5,"method":"execute","params":{"manifest":"/x","args":{},"evil":1}}"#, code::INVALID_PARAMS, json!(5)),
            (br#"{"jsonrpc":"2.0","id":6,"method":"execute","params":{"manifest":"/x","args":{},"hold":"yes"}}"#, code::INVALID_PARAMS, json!(6)),
            (br#"{"jsonrpc":"2.0","id":9,"method":"execute","params":null}"#, code::INVALID_PARAMS, json!(9)),
            (br#"{"jsonrpc":"2.0","id":10,"method":"execute","params":{},"params":{}}"#, code::INVALID_REQUEST, json!(10)),
            (br#"{"jsonrpc":"2.0","method":"execute","params":{}}"#, code::INVALID_REQUEST, Value::Null),
            (br#"{"jsonrpc":"2.0","method":"start"}"#, code::INVALID_PARAMS, Value::Null),
            (br#"{"jsonrpc":"2.0","method":"start","params":{"id":null}}"#, code::INVALID_PARAMS, Value::Null),
            (br#"{"jsonrpc":"2.0","method":"start","params":{"id":[1]}}"#, code::INVALID_PARAMS, Value::Null),
            (br#"{"jsonrpc":"1.0","method":"start","params":{"id":1}}"#, code::INVALID_REQUEST, Value::Null),
        ];
        for (line, want, want_id) in cases {
            let (id, e) = decode_line(line).unwrap_err();
            assert_eq!(e.code(), *want, "{:?}: {e}", String::from_utf8_lossy(line));
            assert_eq!(&id, want_id);
            let enc = encode_error(&id, &e);
            let v: Value = serde_json::from_slice(&enc).unwrap();
            assert_eq!(v["error"]["code"], json!(want));
        }
    }

    #[test]
    fn ping() {
        assert_eq!(
            decode_line(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).unwrap(),
            Request::Ping { id: json!(1) }
        );
    }

    #[test]
    fn warm_requests_name_a_skill() {
        let l = encode_warm(4, "py");
        let want = Request::Warm { id: json!(4), skill: "py".into() };
        assert_eq!(decode_line(&l[..l.len() - 1]).unwrap(), want);
        for bad in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"warm"}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"warm","params":{"skill":1}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"warm","params":{"skill":"a","x":1}}"#,
        ] {
            let (_, e) = decode_line(bad).unwrap_err();
            assert!(matches!(e, WireError::InvalidParams(_)), "{e}");
        }
        let r = WarmResult { size: 2, idle: 1, hits: 5, misses: 1, discarded: 0 };
        let back: WarmResult = serde_json::from_value(json!(r)).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn warm_discard_takes_no_params() {
        let l = encode_warm_discard(5);
        assert_eq!(decode_line(&l[..l.len() - 1]).unwrap(), Request::WarmDiscard { id: json!(5) });
        let empty = br#"{"jsonrpc":"2.0","id":6,"method":"warm_discard","params":{}}"#;
        assert_eq!(decode_line(empty).unwrap(), Request::WarmDiscard { id: json!(6) });
        for bad in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"warm_discard","params":{"skill":"a"}}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"warm_discard","params":[]}"#,
        ] {
            let (_, e) = decode_line(bad).unwrap_err();
            assert!(matches!(e, WireError::InvalidParams(_)), "{e}");
        }
        let r = WarmDiscardResult { discarded: 3 };
        assert_eq!(serde_json::to_value(r).unwrap(), json!({"discarded": 3}));
    }

    #[test]
    fn mcp_watch_takes_since_and_an_optional_timeout() {
        let l = br#"{"jsonrpc":"2.0","id":7,"method":"mcp_watch","params":{"since":3}}"#;
        let params = McpWatchParams { since: 3, timeout_ms: None };
        assert_eq!(decode_line(l).unwrap(), Request::McpWatch { id: json!(7), params });
        let l = br#"{"jsonrpc":"2.0","id":8,"method":"mcp_watch","params":{"since":0,"timeout_ms":500}}"#;
        let params = McpWatchParams { since: 0, timeout_ms: Some(500) };
        assert_eq!(decode_line(l).unwrap(), Request::McpWatch { id: json!(8), params });
        for bad in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"mcp_watch"}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"mcp_watch","params":{"since":-1}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"mcp_watch","params":{"since":1,"x":2}}"#,
        ] {
            let (_, e) = decode_line(bad).unwrap_err();
            assert!(matches!(e, WireError::InvalidParams(_)), "{e}");
        }
        let r = McpWatchResult {
            changes: 4,
            packs: vec![McpPackMoved { manifest: "/s/p/skill.json".into(), generation: 9 }],
        };
        let v = json!({"changes": 4, "packs": [{"manifest": "/s/p/skill.json", "generation": 9}]});
        assert_eq!(serde_json::to_value(&r).unwrap(), v);
        assert_eq!(serde_json::from_value::<McpWatchResult>(v).unwrap(), r);
    }

    #[test]
    fn metrics_request_and_replies_round_trip() {
        let l = encode_metrics(3);
        assert_eq!(decode_line(&l[..l.len() - 1]).unwrap(), Request::Metrics { id: json!(3) });

        let text = json!(MetricsResult { text: "a 1\n".into() });
        let l = encode_result(&json!(3), &text);
        assert_eq!(
            decode_reply(&l[..l.len() - 1]).unwrap(),
            Reply::Result { id: json!(3), result: RawJson::from_value(&json!({"text": "a 1\n"})) }
        );
        let l = encode_stderr(&json!(1), "warn: x");
        assert_eq!(
            decode_reply(&l[..l.len() - 1]).unwrap(),
            Reply::Stderr { id: json!(1), line: "warn: x".into() }
        );
        let l = encode_queued(&json!(4));
        assert_eq!(decode_reply(&l[..l.len() - 1]).unwrap(), Reply::Queued { id: json!(4) });
        let l = encode_started(&json!(4));
        assert_eq!(decode_reply(&l[..l.len() - 1]).unwrap(), Reply::Started { id: json!(4) });
        let l = encode_tools_generation(&json!(4), u64::MAX);
        assert_eq!(
            decode_reply(&l[..l.len() - 1]).unwrap(),
            Reply::ToolsGeneration { id: json!(4), generation: u64::MAX }
        );
        let l = br#"{"jsonrpc":"2.0","method":"tools_generation","params":{"id":4}}"#;
        assert!(matches!(decode_reply(l), Err(WireError::InvalidParams(_))));
        let l = encode_error_code(&json!(1), code::BUSY, "full");
        assert_eq!(
            decode_reply(&l[..l.len() - 1]).unwrap(),
            Reply::Error { id: json!(1), code: code::BUSY, message: "full".into() }
        );
        let report = RunReport::not_run("x", crate::Outcome::Busy, "full");
        let l = encode_report(&json!(1), &report);
        match decode_reply(&l[..l.len() - 1]).unwrap() {
            Reply::Result { result, .. } => {
                assert_eq!(serde_json::from_str::<RunReport>(result.get()).unwrap(), report);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_report_result_crosses_the_wire_verbatim() {
        let mut report = RunReport::not_run("x", crate::Outcome::Ok, "");
        let text = r#"{"zeta":1.50,"alpha":"\u00e9","n":[1E3]}"#;
        report.result = Some(RawJson::from_slice(text.as_bytes()).unwrap());
        let l = encode_report(&json!(7), &report);
        assert!(l.windows(text.len()).any(|w| w == text.as_bytes()));
        let Reply::Result { id, result } = decode_reply(&l[..l.len() - 1]).unwrap() else {
            panic!("not a result");
        };
        assert_eq!(id, json!(7));
        let back: RunReport = serde_json::from_str(result.get()).unwrap();
        assert_eq!(back.result.unwrap().get(), text);
        // A null result is still a result.
        assert!(matches!(
            decode_reply(br#"{"jsonrpc":"2.0","id":1,"result":null}"#),
            Ok(Reply::Result { .. })
        ));
    }

    #[test]
    fn bad_replies_are_errors() {
        for line in [
            &b""[..],
            b"\xff",
            b"[]",
            br#"{"id":1,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":1}"#,
            br#"{"jsonrpc":"2.0","method":"exit","params":{}}"#,
            br#"{"jsonrpc":"2.0","method":"stderr","params":{"id":1,"line":5}}"#,
            br#"{"jsonrpc":"2.0","method":"stderr"}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{},"result":{}}"#,
        ] {
            assert!(decode_reply(line).is_err(), "{:?}", String::from_utf8_lossy(line));
        }
        // A member given twice in a line that is not JSON is a parse error
        // (fuzz wire_reply crash-cfb1ce55).
        for (line, parse) in [
            (&br#"{"jsonrpc":"2.0","id":1,"id":1,"result":{}}"#[..], false),
            (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":1,\xff\"result\":{}}", true),
            // Not UTF-8 inside a member a reply does not read (crash-cd146a1e).
            (b"{\"jsonr-pc\":\"2\xcc0\",\"id\":1,\"error\":{}}", true),
        ] {
            let e = decode_reply(line).unwrap_err();
            assert_eq!(matches!(e, WireError::Parse(_)), parse, "{e:?}");
        }
    }

    #[test]
    fn serde_json_private_raw_value_token_is_json_but_not_a_reply() {
        // serde_json's `Value` refuses an object keyed by its private
        // `RawValue` token (fuzz wire_reply, crash-8f55b833): the line is
        // JSON, so it is an invalid request, never a parse error or a panic.
        let line = b"{\"jsonrpc\":\"2.0\",\"method\":\"stderr\",\"params\":\n{\"$serde_json::private::RawValue\":0,\"line\":\"x\"}}";
        let e = decode_reply(line).unwrap_err();
        assert!(matches!(e, WireError::InvalidRequest(_)), "{e:?}");
        // In a result, the raw text is kept as it came.
        let line = br#"{"jsonrpc":"2.0","id":1,"result":{"$serde_json::private::RawValue":0}}"#;
        match decode_reply(line).unwrap() {
            Reply::Result { result, .. } => {
                assert_eq!(result.get(), r#"{"$serde_json::private::RawValue":0}"#);
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn line_buffer_splits_and_caps() {
        let mut b = LineBuffer::new(8);
        let out = b.push(b"abc\nde");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].as_ref().unwrap(), b"abc");
        assert_eq!(b.pending(), 2);
        let out = b.push(b"f\n0123456789abc");
        assert_eq!(out[0].as_ref().unwrap(), b"def");
        assert!(matches!(out[1], Err(WireError::LineTooLong(8))));
        assert_eq!(b.pending(), 0, "an oversized line must not be buffered");
        let out = b.push(b"more junk\nok\n");
        assert_eq!(out.len(), 1, "the rest of the long line is skipped silently");
        assert_eq!(out[0].as_ref().unwrap(), b"ok");
        let out = b.push(b"12345678\n123456789\n");
        assert_eq!(out[0].as_ref().unwrap(), b"12345678");
        assert!(matches!(out[1], Err(WireError::LineTooLong(8))));
    }
}
