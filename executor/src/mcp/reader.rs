//! The reader of one server's stdout: a task per running server that reads
//! every line the server writes, whether or not a request is in flight, so
//! that a `notifications/tools/list_changed` sent while the server is idle
//! is seen at once rather than at its next call.
//!
//! Each line is bounded (a longer one is a flood) and must be a JSON-RPC
//! 2.0 message (else garbage). What it does with each:
//! - the response to the request in flight, and that request's
//!   `notifications/progress`, go to the [`Conn`](super::client::Conn)
//!   waiting for it, through a small bounded queue (the reader waits when
//!   it is full: a server cannot grow it);
//! - `notifications/tools/list_changed` sets the connection's flag and
//!   wakes whoever lists changed servers again ([`super::Servers`]);
//! - a request from the server (`ping`) is answered, any other refused with
//!   "method not found": the executor offers the server no capability;
//! - late answers and other notifications are dropped.
//!
//! A flood, garbage, a failed write or the end of the output ends the task
//! with one [`Incoming::Failed`] and wakes the same watcher as a list
//! change: the connection is unusable, and the server is cut off at once
//! (by the call in flight, or by that watcher when it is idle).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, Mutex, Notify};

use super::error::ConnError;

/// How many messages for the request in flight may wait for it.
pub const QUEUE: usize = 16;

/// What the reader hands the request in flight.
#[derive(Debug)]
pub enum Incoming {
    /// The response (`result` or `error`) with the request's id.
    Response(Map<String, Value>),
    /// The `params` of a `notifications/progress`.
    Progress(Option<Value>),
    /// The connection ended: the server is gone or broke the protocol.
    Failed(ConnError),
}

/// What the reader and the connection share.
#[derive(Debug, Default)]
pub struct State {
    /// The id of the request in flight (0: none).
    pub in_flight: AtomicU64,
    /// The server said its tool list changed since the last listing.
    pub list_changed: AtomicBool,
    /// The reader ended: the connection is unusable.
    pub ended: AtomicBool,
}

/// The reader's ends: the server's stdout, the writer (weak: the
/// connection owns it, and dropping it closes the server's stdin), the
/// shared state, the queue to the request, and whom to wake on a list
/// change.
#[derive(Debug)]
pub struct Reader {
    /// The server's stdout.
    pub rx: pipe::Receiver,
    /// Longest line, bytes.
    pub max_line: usize,
    /// The server's stdin, to answer its requests.
    pub tx: Weak<Mutex<pipe::Sender>>,
    /// Shared with the connection.
    pub state: Arc<State>,
    /// To the request in flight.
    pub out: mpsc::Sender<Incoming>,
    /// Woken on `notifications/tools/list_changed`.
    pub changed: Arc<Notify>,
}

impl Reader {
    /// Reads until the output ends or breaks the protocol, then says why.
    pub async fn run(self) {
        let Reader { rx, max_line, tx, state, out, changed } = self;
        let mut rx = BufReader::new(rx);
        let failed = loop {
            let line = match read_line(&mut rx, max_line).await {
                Ok(line) => line,
                Err(e) => break e,
            };
            let obj = match message(&line) {
                Ok(Some(obj)) => obj,
                Ok(None) => continue,
                Err(e) => break e,
            };
            if let Err(e) = handle(obj, &tx, &state, &out, &changed).await {
                break e;
            }
        };
        // Whoever lists changed servers again cuts this one off now, rather
        // than at its next use.
        state.ended.store(true, Ordering::Release);
        changed.notify_one();
        let _ = out.send(Incoming::Failed(failed)).await;
    }
}

/// Handles one message.
async fn handle(
    obj: Map<String, Value>,
    tx: &Weak<Mutex<pipe::Sender>>,
    state: &State,
    out: &mpsc::Sender<Incoming>,
    changed: &Notify,
) -> Result<(), ConnError> {
    let in_flight = state.in_flight.load(Ordering::Acquire);
    match (obj.get("method").and_then(Value::as_str), obj.get("id")) {
        (Some(m), Some(req_id)) => answer(tx, m, req_id).await,
        (Some("notifications/tools/list_changed"), None) => {
            state.list_changed.store(true, Ordering::Release);
            changed.notify_one();
            Ok(())
        }
        (Some("notifications/progress"), None) if in_flight != 0 => {
            // The request's own check keeps only its token's.
            let _ = out.send(Incoming::Progress(obj.get("params").cloned())).await;
            Ok(())
        }
        (None, Some(got)) if in_flight != 0 && got.as_u64() == Some(in_flight) => {
            let _ = out.send(Incoming::Response(obj)).await;
            Ok(())
        }
        // Other notifications, and late answers: nothing waits for them.
        (Some(_), None) | (None, Some(_)) => Ok(()),
        (None, None) => Err(ConnError::Garbage),
    }
}

/// Answers a request the server sent: `ping`, or "method not found".
async fn answer(
    tx: &Weak<Mutex<pipe::Sender>>,
    method: &str,
    req_id: &Value,
) -> Result<(), ConnError> {
    let reply = if method == "ping" {
        json!({"jsonrpc": "2.0", "id": req_id, "result": {}})
    } else {
        let error = json!({"code": -32601, "message": "method not found"});
        json!({"jsonrpc": "2.0", "id": req_id, "error": error})
    };
    // The connection is gone: so is the server's stdin.
    let Some(tx) = tx.upgrade() else { return Err(ConnError::Closed) };
    write(&tx, &reply).await
}

/// Writes one message, a line.
pub async fn write(tx: &Mutex<pipe::Sender>, msg: &Value) -> Result<(), ConnError> {
    let mut line = msg.to_string().into_bytes();
    line.push(b'\n');
    tx.lock().await.write_all(&line).await.map_err(|e| ConnError::Write(e.to_string()))
}

/// One line, without its newline, at most `max_line` bytes.
async fn read_line(
    rx: &mut BufReader<pipe::Receiver>,
    max_line: usize,
) -> Result<Vec<u8>, ConnError> {
    let mut line = Vec::new();
    loop {
        let buf = rx.fill_buf().await.map_err(|_| ConnError::Closed)?;
        if buf.is_empty() {
            return Err(ConnError::Closed);
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        std::pin::Pin::new(&mut *rx).consume(take);
        if line.len() > max_line.saturating_add(1) {
            return Err(ConnError::Flood(max_line));
        }
        if done {
            line.pop();
            return Ok(line);
        }
    }
}

/// One line read as a JSON-RPC 2.0 message object; `None` for a blank
/// line.
fn message(line: &[u8]) -> Result<Option<Map<String, Value>>, ConnError> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match serde_json::from_slice(line) {
        Ok(Value::Object(o)) if o.get("jsonrpc") == Some(&json!("2.0")) => Ok(Some(o)),
        _ => Err(ConnError::Garbage),
    }
}
