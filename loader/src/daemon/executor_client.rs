//! The loader's side of the executor wire ([`policy::wire`]).
//!
//! One run at a time per connection: [`ExecutorClient::execute`] connects
//! (or takes a connection opened ahead, [`ExecutorClient::open`]), sends
//! the `execute` request and hands back a [`RunConnection`] that yields the
//! run's `stderr` lines and then its report. Dropping the connection before
//! the report closes the socket, which cancels the run on the executor
//! side; that is how a client that goes away stops its skill.
//!
//! A connection whose run ended with its report (nothing else read or
//! pending on it) is kept for the next run instead of closed: at most
//! [`MAX_IDLE`] of them, each for at most [`IDLE_FOR`], and one is taken
//! only after a non-blocking peek finds it open with nothing to read. That
//! saves each run of a busy loader the `connect`, and the executor its
//! `accept`, peer check and connection tasks. [`IDLE_FOR`] is shorter than
//! the shortest `idle_timeout_seconds` of the executor (1 s), which counts
//! from the end of the connection's last run, so a kept connection is never
//! one the executor is about to close. Reconnection is automatic: an
//! executor restart costs the runs in flight and nothing after.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::socket::{recv, MsgFlags};

use policy::wire::{
    self, ExecuteParams, LineBuffer, McpToolInfo, McpToolsResult, McpWatchResult, MetricsResult,
    PingResult, Reply, WarmDiscardResult, WarmResult, MAX_LINE_BYTES,
};
use policy::{Outcome, RunReport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::daemon::quiet_stream::QuietStream;

/// How long past the skill's own timeout the loader waits for the
/// executor's report (the executor's grace period plus slack).
pub const REPORT_SLACK: Duration = Duration::from_secs(15);

/// How long a `connect` may take before the executor counts as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long writing a request may take: an executor that reads none of it
/// for this long (wedged, or not accepting) counts as down.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections kept for the next run.
pub const MAX_IDLE: usize = 16;
/// Longest a connection is kept for the next run (see the module docs).
pub const IDLE_FOR: Duration = Duration::from_millis(500);

/// Why the executor did not give a report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorError {
    /// The socket could not be reached (missing, refused, timed out).
    #[error("executor socket {socket} unreachable")]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Reading or writing the connection failed.
    #[error("executor connection failed")]
    Io(#[source] io::Error),
    /// The executor closed the connection before the report.
    #[error("executor closed the connection before the report")]
    Closed,
    /// The executor sent something that is not the wire protocol.
    #[error("executor protocol error: {0}")]
    Protocol(String),
    /// The executor is at its concurrency cap.
    #[error("executor busy: {0}")]
    Busy(String),
    /// The executor answered with a JSON-RPC error.
    #[error("executor error {code}: {message}")]
    Remote {
        /// JSON-RPC code.
        code: i64,
        /// Message.
        message: String,
    },
}

/// Connects to the executor. Clones share their kept connections.
#[derive(Debug, Clone)]
pub struct ExecutorClient {
    socket: PathBuf,
    idle: Arc<Idle>,
    send_timeout: Duration,
}

/// Connections whose run ended with its report, and since when.
#[derive(Debug, Default)]
struct Idle(Mutex<Vec<(Instant, QuietStream)>>);

impl Idle {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Instant, QuietStream)>> {
        // Every update is one push, pop or drain: a poisoned list is whole.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently kept connection that is still fit for a run, and
    /// since when it has been quiet.
    fn take(&self) -> Option<(Instant, QuietStream)> {
        let mut idle = self.lock();
        let now = Instant::now();
        // Oldest first: drop those kept too long.
        let stale = idle.iter().take_while(|(at, _)| now.duration_since(*at) >= IDLE_FOR).count();
        idle.drain(..stale);
        while let Some((since, stream)) = idle.pop() {
            if quiet_and_open(&stream) {
                return Some((since, stream));
            }
        }
        None
    }

    /// Keeps a connection quiet since `since` (on the executor's clock of
    /// idleness: its accept, or the end of its last run), unless it is
    /// already too old or enough are kept.
    fn keep(&self, since: Instant, stream: QuietStream) {
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE && since.elapsed() < IDLE_FOR {
            // Oldest first: a connection opened ahead may be older than
            // the last one kept.
            let at = idle.partition_point(|(t, _)| *t <= since);
            idle.insert(at, (since, stream));
        }
    }
}

/// Whether a kept connection is open with nothing to read: a peek that
/// would block. End of file (the executor closed it) or a stray byte rule
/// it out.
fn quiet_and_open(stream: &QuietStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        recv(stream.as_raw_fd(), &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT),
        Err(nix::errno::Errno::EAGAIN)
    )
}

/// A connection that goes back to its client's kept ones when dropped
/// once `reusable`, and is closed otherwise.
#[derive(Debug)]
struct Conn {
    stream: Option<QuietStream>,
    idle: Arc<Idle>,
    reusable: bool,
    /// Since when nothing was sent or run on it.
    since: Instant,
}

impl Conn {
    fn stream(&mut self) -> io::Result<&mut QuietStream> {
        self.stream.as_mut().ok_or_else(|| io::ErrorKind::NotConnected.into())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let (true, Some(stream)) = (self.reusable, self.stream.take()) {
            self.idle.keep(self.since, stream);
        }
    }
}

/// What a run connection yields.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    /// One line the skill wrote on stderr.
    Stderr(String),
    /// The run waits for one of the executor's run slots.
    Queued,
    /// The run got its slot after [`RunEvent::Queued`] and starts now.
    Started,
    /// The final report; nothing follows.
    Report(Box<Reported>),
}

/// A run's report, decoded, and the executor's JSON text of it, which
/// skilld's answers carry as they are instead of encoding the report again
/// (the executor encodes the same [`RunReport`] type).
#[derive(Debug, Clone, PartialEq)]
pub struct Reported {
    /// The report, for the audit row, the metrics and the log.
    pub report: RunReport,
    /// The report as the executor sent it, on one line.
    pub json: policy::RawJson,
}

/// A connection to the executor with nothing sent yet
/// ([`ExecutorClient::open`]); dropped unused, it is kept for a later run.
#[derive(Debug)]
pub struct Opened(Conn);

/// An `execute` sent with `hold` ([`ExecutorClient::execute_held`]): the
/// executor checks and prepares the run but spawns nothing before
/// [`HeldRun::start`]. Dropping it closes the connection, which cancels
/// the run before it ever started.
#[derive(Debug)]
pub struct HeldRun {
    run: RunConnection,
    send_timeout: Duration,
}

impl HeldRun {
    /// Lets the held run go; its events follow on the returned connection.
    /// A failed write is not an error here: the executor may have answered
    /// (a refusal, `busy`) and closed, and that answer is read next. A
    /// `start` not read within the send bound closes the connection (the
    /// executor counts as down, and the held run is cancelled): the next
    /// read fails instead of waiting for the run's deadline.
    pub async fn start(mut self) -> RunConnection {
        if let Ok(stream) = self.run.conn.stream() {
            let sent = send(stream, &wire::encode_start(1), self.send_timeout).await;
            if matches!(&sent, Err(e) if e.kind() == io::ErrorKind::TimedOut) {
                self.run.conn.stream = None;
            }
        }
        self.run
    }
}

/// Writes `bytes` on `stream` within `timeout` (a timeout is an
/// [`io::ErrorKind::TimedOut`] error naming it).
async fn send(stream: &mut QuietStream, bytes: &[u8], timeout: Duration) -> io::Result<()> {
    match tokio::time::timeout(timeout, stream.write_all(bytes)).await {
        Ok(written) => written,
        Err(_) => {
            let why = format!("the request was not read within {timeout:?}");
            Err(io::Error::new(io::ErrorKind::TimedOut, why))
        }
    }
}

/// An open `execute` call. Dropping it cancels the run.
#[derive(Debug)]
pub struct RunConnection {
    conn: Conn,
    lines: LineBuffer,
    ready: VecDeque<Result<Vec<u8>, wire::WireError>>,
    /// Read into its spare capacity (never zeroed), cleared after each read.
    read_buf: Vec<u8>,
    finished: bool,
    /// The `tools_generation` the executor sent for a call to a tool of an
    /// MCP server pack ([`RunConnection::tools_generation`]).
    tools_generation: Option<u64>,
}

impl ExecutorClient {
    /// A client of the executor listening on `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self { socket: socket.into(), idle: Arc::default(), send_timeout: SEND_TIMEOUT }
    }

    /// This client with another bound on writing a request (tests).
    #[cfg(test)]
    fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// Connections kept for the next run now.
    pub fn idle(&self) -> usize {
        self.idle.lock().len()
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A kept connection fit for a run, else a new one.
    async fn connect(&self) -> Result<Conn, ExecutorError> {
        let conn = |since, stream| Conn {
            stream: Some(stream),
            idle: Arc::clone(&self.idle),
            reusable: false,
            since,
        };
        if let Some((since, stream)) = self.idle.take() {
            return Ok(conn(since, stream));
        }
        let connect = QuietStream::connect(&self.socket);
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(stream)) => Ok(conn(Instant::now(), stream)),
            Ok(Err(source)) => Err(ExecutorError::Connect { socket: self.socket.clone(), source }),
            Err(_) => Err(ExecutorError::Connect {
                socket: self.socket.clone(),
                source: io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
            }),
        }
    }

    /// Starts a run: connects and sends `execute`.
    ///
    /// # Errors
    ///
    /// [`ExecutorError::Connect`] when the executor is down,
    /// [`ExecutorError::Io`] when the request cannot be written (or is not
    /// read within 10 s).
    pub async fn execute(&self, params: &ExecuteParams) -> Result<RunConnection, ExecutorError> {
        self.execute_on(None, params).await
    }

    /// Opens a connection ahead of a run, to be passed to
    /// [`ExecutorClient::execute_on`] (the loader connects while the audit
    /// row of the decision is written). Nothing is sent: dropping it
    /// starts nothing.
    ///
    /// # Errors
    ///
    /// [`ExecutorError::Connect`] when the executor is down.
    pub async fn open(&self) -> Result<Opened, ExecutorError> {
        let mut conn = self.connect().await?;
        conn.reusable = true;
        Ok(Opened(conn))
    }

    /// [`ExecutorClient::execute`] on a connection opened ahead, if any
    /// (`None`: a fresh one).
    ///
    /// # Errors
    ///
    /// As [`ExecutorClient::execute`].
    pub async fn execute_on(
        &self,
        opened: Option<Opened>,
        params: &ExecuteParams,
    ) -> Result<RunConnection, ExecutorError> {
        let mut conn = match opened {
            Some(Opened(mut conn)) => {
                conn.reusable = false;
                conn
            }
            None => self.connect().await?,
        };
        let stream = conn.stream().map_err(ExecutorError::Io)?;
        let line = wire::encode_execute(1, params);
        send(stream, &line, self.send_timeout).await.map_err(ExecutorError::Io)?;
        Ok(RunConnection::new(conn, MAX_LINE_BYTES))
    }

    /// Sends `execute` with `hold` on a kept or new connection: the executor
    /// prepares the run while the caller finishes its own work (the audit
    /// row of the decision), then [`HeldRun::start`] lets it go.
    ///
    /// # Errors
    ///
    /// As [`ExecutorClient::execute`].
    pub async fn execute_held(&self, mut params: ExecuteParams) -> Result<HeldRun, ExecutorError> {
        params.hold = true;
        let run = self.execute_on(None, &params).await?;
        Ok(HeldRun { run, send_timeout: self.send_timeout })
    }

    /// The executor's Prometheus text (`metrics` call), within `timeout`.
    ///
    /// # Errors
    ///
    /// Any [`ExecutorError`]; a timeout is [`ExecutorError::Io`].
    pub async fn metrics(&self, timeout: Duration) -> Result<String, ExecutorError> {
        let call = async {
            let mut conn = self.connect().await?;
            let stream = conn.stream().map_err(ExecutorError::Io)?;
            stream.write_all(&wire::encode_metrics(1)).await.map_err(ExecutorError::Io)?;
            let mut conn = RunConnection::new(conn, MAX_LINE_BYTES);
            match conn.next_reply().await? {
                Reply::Result { result, .. } => serde_json::from_str::<MetricsResult>(result.get())
                    .map(|m| m.text)
                    .map_err(|e| ExecutorError::Protocol(format!("metrics result: {e}"))),
                other => Err(reply_error(other)),
            }
        };
        tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| {
            Err(ExecutorError::Io(io::Error::new(io::ErrorKind::TimedOut, "metrics timed out")))
        })
    }

    /// The tools of the MCP server pack at `manifest` (`mcp_tools`), within
    /// `timeout`, and the generation of that list: `Err` with the
    /// executor's reason when it has none.
    ///
    /// # Errors
    ///
    /// Why there are no tools (the executor's reason, or the wire's error).
    pub async fn mcp_tools(
        &self,
        manifest: &str,
        timeout: Duration,
    ) -> Result<(Vec<McpToolInfo>, Option<u64>), String> {
        let call = async {
            let mut conn = self.connect().await?;
            let stream = conn.stream().map_err(ExecutorError::Io)?;
            let req = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "mcp_tools",
                "params": {"manifest": manifest}});
            let mut line = req.to_string().into_bytes();
            line.push(b'\n');
            stream.write_all(&line).await.map_err(ExecutorError::Io)?;
            let mut conn = RunConnection::new(conn, MAX_LINE_BYTES);
            match conn.next_reply().await? {
                Reply::Result { result, .. } => {
                    serde_json::from_str::<McpToolsResult>(result.get())
                        .map_err(|e| ExecutorError::Protocol(format!("mcp_tools result: {e}")))
                }
                other => Err(reply_error(other)),
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Err(_) => Err(format!("the executor did not list them within {timeout:?}")),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(McpToolsResult { error: Some(why), .. })) => Err(why),
            Ok(Ok(McpToolsResult { tools, error: None, generation })) => Ok((tools, generation)),
        }
    }

    /// Waits, on a connection of its own, for the executor to say a
    /// server's tool list moved after the count `since` (`mcp_watch`), at
    /// most `wait` (and a slack for the answer to come).
    ///
    /// # Errors
    ///
    /// Any [`ExecutorError`]; no answer in time is [`ExecutorError::Io`].
    pub async fn mcp_watch(
        &self,
        since: u64,
        wait: Duration,
    ) -> Result<McpWatchResult, ExecutorError> {
        let call = async {
            let mut conn = self.connect().await?;
            let stream = conn.stream().map_err(ExecutorError::Io)?;
            let timeout_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
            let req = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "mcp_watch",
                "params": {"since": since, "timeout_ms": timeout_ms}});
            let mut line = req.to_string().into_bytes();
            line.push(b'\n');
            stream.write_all(&line).await.map_err(ExecutorError::Io)?;
            let mut conn = RunConnection::new(conn, MAX_LINE_BYTES);
            match conn.next_reply().await? {
                Reply::Result { result, .. } => serde_json::from_str(result.get())
                    .map_err(|e| ExecutorError::Protocol(format!("mcp_watch result: {e}"))),
                other => Err(reply_error(other)),
            }
        };
        tokio::time::timeout(wait + REPORT_SLACK, call).await.unwrap_or_else(|_| {
            Err(ExecutorError::Io(io::Error::new(io::ErrorKind::TimedOut, "mcp_watch timed out")))
        })
    }

    /// The executor's warm pool of `skill` (`warm` call) within `timeout`:
    /// `Ok(None)` when it grants the skill no warm runs.
    ///
    /// # Errors
    ///
    /// Any [`ExecutorError`]; a timeout is [`ExecutorError::Io`].
    pub async fn warm(
        &self,
        skill: &str,
        timeout: Duration,
    ) -> Result<Option<WarmResult>, ExecutorError> {
        let call = async {
            let mut conn = self.connect().await?;
            let stream = conn.stream().map_err(ExecutorError::Io)?;
            stream.write_all(&wire::encode_warm(1, skill)).await.map_err(ExecutorError::Io)?;
            let mut conn = RunConnection::new(conn, 64 << 10);
            match conn.next_reply().await? {
                Reply::Result { result, .. } => serde_json::from_str(result.get())
                    .map_err(|e| ExecutorError::Protocol(format!("warm result: {e}"))),
                other => Err(reply_error(other)),
            }
        };
        tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| {
            Err(ExecutorError::Io(io::Error::new(io::ErrorKind::TimedOut, "warm timed out")))
        })
    }

    /// Asks the executor to discard its idle warm runs and make them again
    /// (`warm_discard`) within `timeout`: how many it discarded.
    ///
    /// # Errors
    ///
    /// Any [`ExecutorError`]; a timeout is [`ExecutorError::Io`].
    pub async fn warm_discard(&self, timeout: Duration) -> Result<u64, ExecutorError> {
        let call = async {
            let mut conn = self.connect().await?;
            let stream = conn.stream().map_err(ExecutorError::Io)?;
            stream.write_all(&wire::encode_warm_discard(1)).await.map_err(ExecutorError::Io)?;
            let mut conn = RunConnection::new(conn, 64 << 10);
            match conn.next_reply().await? {
                Reply::Result { result, .. } => {
                    serde_json::from_str::<WarmDiscardResult>(result.get())
                        .map(|r| r.discarded)
                        .map_err(|e| ExecutorError::Protocol(format!("warm_discard result: {e}")))
                }
                other => Err(reply_error(other)),
            }
        };
        tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| {
            Err(ExecutorError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "warm_discard timed out",
            )))
        })
    }

    /// Returns true if and only if the executor answers `ping` within
    /// `timeout`.
    pub async fn ping(&self, timeout: Duration) -> bool {
        self.pong(timeout).await.is_some()
    }

    /// The executor's answer to `ping` within `timeout`, if any: its
    /// longest run timeout among it.
    pub async fn pong(&self, timeout: Duration) -> Option<PingResult> {
        let call = async {
            let mut conn = self.connect().await.ok()?;
            let req = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n";
            conn.stream().ok()?.write_all(req).await.ok()?;
            let mut conn = RunConnection::new(conn, 64 << 10);
            match conn.next_reply().await {
                Ok(Reply::Result { result, .. }) => serde_json::from_str(result.get()).ok(),
                _ => None,
            }
        };
        tokio::time::timeout(timeout, call).await.ok().flatten()
    }
}

fn reply_error(reply: Reply) -> ExecutorError {
    match reply {
        Reply::Error { code, message, .. } if code == wire::code::BUSY => {
            ExecutorError::Busy(message)
        }
        Reply::Error { code, message, .. } => ExecutorError::Remote { code, message },
        Reply::Stderr { .. } => ExecutorError::Protocol("unexpected stderr notification".into()),
        Reply::Queued { .. } | Reply::Started { .. } => {
            ExecutorError::Protocol("unexpected queue notification".into())
        }
        Reply::ToolsGeneration { .. } => {
            ExecutorError::Protocol("unexpected tools_generation notification".into())
        }
        Reply::Result { .. } => ExecutorError::Protocol("unexpected result".into()),
    }
}

impl RunConnection {
    fn new(conn: Conn, max_line: usize) -> Self {
        Self {
            conn,
            lines: LineBuffer::new(max_line),
            ready: VecDeque::new(),
            read_buf: Vec::with_capacity(16 << 10),
            finished: false,
            tools_generation: None,
        }
    }

    /// For a call to a tool of an MCP server pack, once its report was
    /// read: the generation of the server's tool list after the call
    /// ([`Reply::ToolsGeneration`]).
    pub fn tools_generation(&self) -> Option<u64> {
        self.tools_generation
    }

    /// The next event of the run: stderr lines, then the report.
    ///
    /// A report with outcome `busy` is returned as [`ExecutorError::Busy`].
    ///
    /// # Errors
    ///
    /// [`ExecutorError`] when the connection fails or closes early, or the
    /// executor answers with an error.
    pub async fn next(&mut self) -> Result<RunEvent, ExecutorError> {
        if self.finished {
            return Err(ExecutorError::Closed);
        }
        let mut reply = self.next_reply().await?;
        while let Reply::ToolsGeneration { generation, .. } = reply {
            self.tools_generation = Some(generation);
            reply = self.next_reply().await?;
        }
        match reply {
            Reply::Stderr { line, .. } => Ok(RunEvent::Stderr(line)),
            Reply::Queued { .. } => Ok(RunEvent::Queued),
            Reply::Started { .. } => Ok(RunEvent::Started),
            Reply::Result { result, .. } => {
                self.finished = true;
                // The run is over and nothing else came: the connection
                // may serve the next run.
                self.conn.reusable = self.ready.is_empty() && self.lines.pending() == 0;
                self.conn.since = Instant::now();
                let report: RunReport = serde_json::from_str(result.get())
                    .map_err(|e| ExecutorError::Protocol(format!("run report: {e}")))?;
                if report.outcome == Outcome::Busy {
                    return Err(ExecutorError::Busy(report.error.unwrap_or_default()));
                }
                Ok(RunEvent::Report(Box::new(Reported { report, json: result })))
            }
            other => {
                self.finished = true;
                Err(reply_error(other))
            }
        }
    }

    /// Reads until the run's report, dropping stderr lines.
    ///
    /// # Errors
    ///
    /// As [`RunConnection::next`].
    pub async fn report(mut self) -> Result<RunReport, ExecutorError> {
        loop {
            if let RunEvent::Report(r) = self.next().await? {
                return Ok(r.report);
            }
        }
    }

    async fn next_reply(&mut self) -> Result<Reply, ExecutorError> {
        loop {
            if let Some(line) = self.ready.pop_front() {
                let line = line.map_err(|e| ExecutorError::Protocol(e.to_string()))?;
                return wire::decode_reply(&line)
                    .map_err(|e| ExecutorError::Protocol(e.to_string()));
            }
            let stream = self.conn.stream().map_err(ExecutorError::Io)?;
            self.read_buf.clear();
            let n = stream.read_buf(&mut self.read_buf).await.map_err(ExecutorError::Io)?;
            if n == 0 {
                return Err(ExecutorError::Closed);
            }
            self.ready.extend(self.lines.push(&self.read_buf[..n]));
        }
    }
}

#[cfg(test)]
mod tests;
