//! The executor wire: newline-delimited JSON-RPC 2.0 with a line-length cap.
//!
//! One JSON object per line, `\n`-terminated. The loader sends `execute`
//! requests; the executor answers with `stderr` notifications for the run
//! and then one response whose `result` is the [`RunReport`](crate::report::RunReport).
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
//! [`LineBuffer`] cuts a byte stream into bounded lines. What the loader
//! sends is in `request`, what the executor sends back in `reply`.

use serde::Serialize;

pub use self::reply::{
    decode_reply, encode_error, encode_error_code, encode_queued, encode_report, encode_result,
    encode_started, encode_stderr, encode_tools_generation, McpPackMoved, McpToolInfo,
    McpToolsResult, McpWatchResult, MetricsResult, PingResult, Reply, WarmDiscardResult,
    WarmResult,
};
pub use self::request::{
    decode_line, encode_execute, encode_metrics, encode_start, encode_warm, encode_warm_discard,
    ExecuteParams, McpToolsParams, McpWatchParams, Request, DEFAULT_MCP_WATCH_MS, MAX_ID_BYTES,
    MAX_MCP_WATCH_MS,
};

mod reply;
mod request;

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
mod tests;
