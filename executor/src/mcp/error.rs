//! Why a request to an MCP server got no usable answer: shared by the
//! reader task, which finds most of them, and the client, which reports
//! them.

use std::time::Duration;

/// Why a request got no usable answer. The connection is unusable after
/// any of these but [`ConnError::Rpc`]: the caller cuts the server off.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnError {
    /// The server closed its stdout (it exited, or was killed).
    #[error("the server closed its output (it exited or was killed)")]
    Closed,
    /// No answer within the deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// A line over the cap.
    #[error("the server wrote a line over {0} bytes")]
    Flood(usize),
    /// A line that is not a JSON-RPC 2.0 message.
    #[error("the server wrote a line that is not a JSON-RPC message")]
    Garbage,
    /// The answer has the wrong shape for the request.
    #[error("the server answered {method} with a malformed result: {reason}")]
    Malformed {
        /// The request.
        method: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Writing to the server failed (its stdin is closed).
    #[error("cannot write to the server: {0}")]
    Write(String),
    /// The server answered with a JSON-RPC error.
    #[error("the server answered {method} with error {code}: {message}")]
    Rpc {
        /// The request.
        method: &'static str,
        /// The error code.
        code: i64,
        /// Its message, cut to 256 bytes.
        message: String,
    },
}

impl ConnError {
    /// Whether the connection can still be used after it.
    pub fn keeps_connection(&self) -> bool {
        matches!(self, ConnError::Rpc { .. })
    }
}
