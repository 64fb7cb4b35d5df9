//! What the loader sends the executor: requests and the `start`
//! notification, encoded by the loader and decoded by the executor.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{line, WireError};
use crate::RawJson;

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
    /// The SHA-256 of the manifest's bytes as the caller read and checked
    /// them: the executor refuses the run (`rejected`) when the file's bytes
    /// now have another, so a pack changed since the caller's scan never
    /// runs under the caller's old reading of it. Absent: not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_sha256: Option<crate::ManifestDigest>,
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
    /// [`MetricsResult`](super::MetricsResult) (`{"text":"..."}`). The loader appends it to its
    /// own `/metrics`, so one scrape target carries both daemons: the
    /// loader renames any `process_*` family to `ongrid_executor_process_*`
    /// and drops any family whose name it already exposes itself.
    Metrics {
        /// JSON-RPC id.
        id: Value,
    },
    /// The tools of an MCP server pack (`"kind": "mcp"`), answered with
    /// [`McpToolsResult`](super::McpToolsResult); starts the pack's server when it is not running.
    McpTools {
        /// JSON-RPC id.
        id: Value,
        /// What to list.
        params: McpToolsParams,
    },
    /// A long poll on the MCP servers' tool lists: answered with
    /// [`McpWatchResult`](super::McpWatchResult) once the count of generation moves is not
    /// `since` (at once if it is not already), or when `timeout_ms` passes,
    /// or when the executor stops. skilld keeps one in flight and lists
    /// again the packs the answer names.
    McpWatch {
        /// JSON-RPC id.
        id: Value,
        /// What to wait for.
        params: McpWatchParams,
    },
    /// The warm pool of one skill, answered with [`WarmResult`](super::WarmResult), or null
    /// when the executor grants that skill no warm runs.
    Warm {
        /// JSON-RPC id.
        id: Value,
        /// The skill's name.
        skill: String,
    },
    /// Discard every idle warm run (skilld's reload: skill files may have
    /// changed in ways the warm runs' identity check does not see), and
    /// make the pools again; answered with [`WarmDiscardResult`](super::WarmDiscardResult).
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

/// Parameters of `mcp_tools`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolsParams {
    /// Absolute path of the pack's `skill.json`.
    pub manifest: String,
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

/// The `params` of `warm`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WarmParams {
    skill: String,
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
