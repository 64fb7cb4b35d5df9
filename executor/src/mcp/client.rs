//! The MCP client side over a server's stdio: newline-delimited JSON-RPC
//! 2.0 (the MCP stdio transport), one request in flight at a time.
//!
//! Written here rather than taken from the SDK's client because the
//! executor must bound what it reads from an untrusted server: every line
//! is capped (a longer one is a flood), a line that is not a JSON-RPC
//! message is garbage, and either ends the connection (the caller cuts the
//! server off). The server's output is read all the time by its
//! reader task ([`super::reader`]), a request or not: a
//! `notifications/tools/list_changed` is seen at once (the connection's
//! flag set, the executor woken to list the tools again), the response and
//! `notifications/progress` of the request in flight handed to it (the
//! progress to the caller's sink as a line), `ping` answered, the rest
//! dropped.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, Mutex, Notify};

use super::error::ConnError;
use super::reader::{self, Incoming, Reader, State};

/// The protocol version the executor asks for in `initialize`.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Most `tools/list` pages read (a server paging forever is cut off).
pub const MAX_LIST_PAGES: usize = 64;
/// Most tools a server may list.
pub const MAX_TOOLS: usize = 1024;
/// Most progress lines handed on per request (more are dropped).
pub const MAX_PROGRESS_LINES: usize = 1000;
/// Longest progress line handed on, bytes (cut there).
pub const MAX_PROGRESS_BYTES: usize = 1024;

/// One tool as the server listed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name (checked by [`policy::mcp::check_tool_name`]).
    pub name: String,
    /// Its description (empty when it gave none).
    pub description: String,
    /// Its `inputSchema` (an object schema).
    pub input_schema: Value,
}

/// A connection to one server's stdio: the writer, and the queue its
/// reader task fills for the request in flight.
#[derive(Debug)]
pub struct Conn {
    /// Shared (weakly) with the reader, which answers the server's pings;
    /// dropped with the connection, which closes the server's stdin.
    tx: Arc<Mutex<pipe::Sender>>,
    inbox: mpsc::Receiver<Incoming>,
    state: Arc<State>,
    reader: tokio::task::JoinHandle<()>,
    next_id: u64,
    /// Why the connection ended, once the reader said so.
    failed: Option<ConnError>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl Conn {
    /// A connection on the executor's (non-blocking) ends of the pipes,
    /// with its reader task started; lines longer than `max_line` are a
    /// flood, and `changed` is woken when the server says its tools
    /// changed. Called inside the runtime.
    ///
    /// # Errors
    ///
    /// [`ConnError::Write`] when the pipes cannot be registered.
    pub fn new(
        stdin: std::os::fd::OwnedFd,
        stdout: std::os::fd::OwnedFd,
        max_line: usize,
        changed: Arc<Notify>,
    ) -> Result<Self, ConnError> {
        let reg = |e: std::io::Error| ConnError::Write(e.to_string());
        let tx = Arc::new(Mutex::new(pipe::Sender::from_owned_fd_unchecked(stdin).map_err(reg)?));
        let rx = pipe::Receiver::from_owned_fd_unchecked(stdout).map_err(reg)?;
        let state = Arc::new(State::default());
        let (out, inbox) = mpsc::channel(reader::QUEUE);
        let reader = Reader {
            rx,
            max_line,
            tx: Arc::downgrade(&tx),
            state: Arc::clone(&state),
            out,
            changed,
        };
        let reader = tokio::spawn(reader.run());
        Ok(Conn { tx, inbox, state, reader, next_id: 1, failed: None })
    }

    /// Whether the server said its tool list changed since the last
    /// listing.
    pub fn list_changed(&self) -> bool {
        self.state.list_changed.load(Ordering::Acquire)
    }

    /// Whether the reader ended: the server is gone or broke the protocol
    /// ([`Conn::check`] says how).
    pub fn ended(&self) -> bool {
        self.state.ended.load(Ordering::Acquire)
    }

    /// What the reader queued while no request was in flight: only its
    /// end ([`Incoming::Failed`]) matters, anything else is stale.
    fn take_queued(&mut self) {
        while let Ok(item) = self.inbox.try_recv() {
            if let Incoming::Failed(e) = item {
                self.failed = Some(e);
            }
        }
    }

    /// Whether the connection still works: the reader has not found the
    /// server gone or breaking the protocol (a list change said between
    /// calls is [`Conn::list_changed`], already).
    ///
    /// # Errors
    ///
    /// [`ConnError::Closed`] when the server is gone, [`ConnError::Garbage`]
    /// or [`ConnError::Flood`] as for a request's answer.
    pub fn check(&mut self) -> Result<(), ConnError> {
        self.take_queued();
        match &self.failed {
            Some(e) => Err(e.clone()),
            // Ended, its reason not queued yet (or the queue was full of
            // stale items): it is broken all the same.
            None if self.ended() => Err(ConnError::Closed),
            None => Ok(()),
        }
    }

    /// Reads what the reader hands on until the response to `id`.
    async fn response(
        &mut self,
        id: u64,
        method: &'static str,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Value, ConnError> {
        let mut relayed = 0;
        loop {
            let obj = match self.inbox.recv().await {
                None => return Err(ConnError::Closed),
                Some(Incoming::Failed(e)) => {
                    self.failed = Some(e.clone());
                    return Err(e);
                }
                Some(Incoming::Progress(params)) => {
                    if relayed < MAX_PROGRESS_LINES {
                        if let Some(line) = progress_line(params.as_ref(), id) {
                            relayed += 1;
                            progress(&line);
                        }
                    }
                    continue;
                }
                Some(Incoming::Response(obj)) => obj,
            };
            // A stale answer to an earlier request: nothing waits for it.
            if obj.get("id").and_then(Value::as_u64) != Some(id) {
                continue;
            }
            if let Some(e) = obj.get("error") {
                let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
                let message = e.get("message").and_then(Value::as_str).unwrap_or("");
                return Err(ConnError::Rpc { method, code, message: cut(message, 256) });
            }
            return obj.get("result").cloned().ok_or(ConnError::Malformed {
                method,
                reason: "neither result nor error".to_owned(),
            });
        }
    }

    /// Sends `method` with `params` and waits up to `timeout` for its
    /// result.
    ///
    /// # Errors
    ///
    /// [`ConnError`].
    pub async fn request(
        &mut self,
        method: &'static str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, ConnError> {
        self.exchange(method, params, timeout, None).await
    }

    /// [`Conn::request`] asking for progress (`_meta.progressToken`, the
    /// request's id, added to `params`, an object): each
    /// `notifications/progress` for it is handed to `progress` as one line
    /// ([`progress_line`]), at most [`MAX_PROGRESS_LINES`].
    ///
    /// # Errors
    ///
    /// [`ConnError`].
    pub async fn request_with_progress(
        &mut self,
        method: &'static str,
        params: Value,
        timeout: Duration,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Value, ConnError> {
        self.exchange(method, params, timeout, Some(progress)).await
    }

    async fn exchange(
        &mut self,
        method: &'static str,
        mut params: Value,
        timeout: Duration,
        progress: Option<&mut (dyn FnMut(&str) + Send)>,
    ) -> Result<Value, ConnError> {
        self.check()?;
        let id = self.next_id;
        self.next_id += 1;
        let mut ignore = |_: &str| {};
        let sink: &mut (dyn FnMut(&str) + Send) = match progress {
            Some(sink) => {
                if let Value::Object(p) = &mut params {
                    p.insert("_meta".to_owned(), json!({"progressToken": id}));
                }
                sink
            }
            None => &mut ignore,
        };
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        // Set before the request goes: its answer may come at once.
        self.state.in_flight.store(id, Ordering::Release);
        let tx = Arc::clone(&self.tx);
        let exchange = async {
            reader::write(&tx, &msg).await?;
            self.response(id, method, sink).await
        };
        let answer = tokio::time::timeout(timeout, exchange).await;
        self.state.in_flight.store(0, Ordering::Release);
        answer.map_err(|_| ConnError::Timeout(timeout))?
    }

    /// `initialize`, then `notifications/initialized`.
    ///
    /// # Errors
    ///
    /// [`ConnError`].
    pub async fn initialize(&mut self, timeout: Duration) -> Result<(), ConnError> {
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "ongrid-executor", "version": env!("CARGO_PKG_VERSION")},
        });
        let result = self.request("initialize", params, timeout).await?;
        if !result.is_object() {
            let reason = "not an object".to_owned();
            return Err(ConnError::Malformed { method: "initialize", reason });
        }
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        reader::write(&self.tx, &note).await
    }

    /// Every tool the server lists (`tools/list`, following its cursor).
    /// A tool whose name cannot be a skill's is left out (logged).
    ///
    /// # Errors
    ///
    /// [`ConnError`]; a malformed listing is [`ConnError::Malformed`].
    pub async fn list_tools(&mut self, timeout: Duration) -> Result<Vec<Tool>, ConnError> {
        // A change said during this listing sets it again: listed once more.
        self.state.list_changed.store(false, Ordering::Release);
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let params = cursor.as_ref().map_or_else(|| json!({}), |c| json!({"cursor": c}));
            let page = self.request("tools/list", params, timeout).await?;
            let bad = |reason: &str| ConnError::Malformed {
                method: "tools/list",
                reason: reason.to_owned(),
            };
            let listed =
                page.get("tools").and_then(Value::as_array).ok_or_else(|| bad("no tools array"))?;
            for t in listed {
                tools.push(tool(t).ok_or_else(|| bad("a tool without a name or inputSchema"))?);
                if tools.len() > MAX_TOOLS {
                    return Err(bad("too many tools"));
                }
            }
            cursor = page.get("nextCursor").and_then(Value::as_str).map(str::to_owned);
            if cursor.is_none() {
                tools.retain(|t: &Tool| match policy::mcp::check_tool_name(&t.name) {
                    Ok(()) => true,
                    Err(reason) => {
                        tracing::warn!(
                            "MCP tool {:?} left out: its name {reason}",
                            cut(&t.name, 64)
                        );
                        false
                    }
                });
                return Ok(tools);
            }
        }
        Err(ConnError::Malformed { method: "tools/list", reason: "too many pages".to_owned() })
    }
}

/// The line a `notifications/progress` for the request `id` is relayed
/// as: `progress P/T: MESSAGE` (`/T` and `: MESSAGE` when given), cut to
/// [`MAX_PROGRESS_BYTES`]; `None` for another token or no `progress`.
pub fn progress_line(params: Option<&Value>, id: u64) -> Option<String> {
    let p = params?;
    if p.get("progressToken")?.as_u64() != Some(id) {
        return None;
    }
    let done = p.get("progress").filter(|v| v.is_number())?;
    let mut line = format!("progress {done}");
    if let Some(total) = p.get("total").filter(|v| v.is_number()) {
        line.push_str(&format!("/{total}"));
    }
    if let Some(message) = p.get("message").and_then(Value::as_str) {
        line.push_str(": ");
        line.push_str(message);
    }
    // One line on the wire and in a stream event.
    let line = line.replace(['\n', '\r'], " ");
    Some(cut(&line, MAX_PROGRESS_BYTES))
}

fn tool(v: &Value) -> Option<Tool> {
    let name = v.get("name")?.as_str()?.to_owned();
    let description = v.get("description").and_then(Value::as_str).unwrap_or("").to_owned();
    let input_schema = v.get("inputSchema").filter(|s| s.is_object())?.clone();
    Some(Tool { name, description, input_schema })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_name_their_request_and_stay_one_bounded_line() {
        let p = json!({"progressToken": 3, "progress": 2, "total": 5, "message": "two\nof five"});
        assert_eq!(progress_line(Some(&p), 3).as_deref(), Some("progress 2/5: two of five"));
        assert_eq!(progress_line(Some(&p), 4), None, "another request's");
        let p = json!({"progressToken": 3, "progress": 0.5});
        assert_eq!(progress_line(Some(&p), 3).as_deref(), Some("progress 0.5"));
        let p = json!({"progressToken": "3", "progress": 1});
        assert_eq!(progress_line(Some(&p), 3), None, "the token sent is a number");
        assert_eq!(progress_line(Some(&json!({"progressToken": 3})), 3), None);
        let long = json!({"progressToken": 1, "progress": 1, "message": "é".repeat(4096)});
        let line = progress_line(Some(&long), 1).unwrap();
        assert!(line.len() <= MAX_PROGRESS_BYTES && line.starts_with("progress 1: "));
    }
}
