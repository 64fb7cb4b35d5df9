//! The loader's side of the executor wire (DESIGN.md §5, [`policy::wire`]).
//!
//! One connection per run: [`ExecutorClient::execute`] connects (or takes
//! a connection opened ahead, [`ExecutorClient::open`]), sends the
//! `execute` request and hands back a [`RunConnection`] that yields the
//! run's `stderr` lines and then its report. Dropping the connection closes
//! the socket, which cancels the run on the executor side; that is how a
//! client that goes away stops its skill. Reconnection is automatic: every
//! run starts from a fresh `connect`, so an executor restart costs the runs
//! in flight and nothing after.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use policy::wire::{self, ExecuteParams, LineBuffer, MetricsResult, Reply, MAX_LINE_BYTES};
use policy::{Outcome, RunReport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// How long a `connect` may take before the executor counts as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

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

/// Connects to the executor.
#[derive(Debug, Clone)]
pub struct ExecutorClient {
    socket: PathBuf,
}

/// What a run connection yields.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    /// One line the skill wrote on stderr.
    Stderr(String),
    /// The final report; nothing follows.
    Report(Box<RunReport>),
}

/// A connection to the executor with nothing sent yet
/// ([`ExecutorClient::open`]).
#[derive(Debug)]
pub struct Opened(UnixStream);

/// An `execute` sent with `hold` ([`ExecutorClient::execute_held`]): the
/// executor checks and prepares the run but spawns nothing before
/// [`HeldRun::start`]. Dropping it closes the connection, which cancels
/// the run before it ever started.
#[derive(Debug)]
pub struct HeldRun(RunConnection);

impl HeldRun {
    /// Lets the held run go; its events follow on the returned connection.
    /// A failed write is not an error here: the executor may have answered
    /// (a refusal, `busy`) and closed, and that answer is read next.
    pub async fn start(mut self) -> RunConnection {
        let _ = self.0.stream.write_all(&wire::encode_start(1)).await;
        self.0
    }
}

/// An open `execute` call. Dropping it cancels the run.
#[derive(Debug)]
pub struct RunConnection {
    stream: UnixStream,
    lines: LineBuffer,
    ready: VecDeque<Result<Vec<u8>, wire::WireError>>,
    read_buf: Box<[u8]>,
    finished: bool,
}

impl ExecutorClient {
    /// A client of the executor listening on `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self { socket: socket.into() }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn connect(&self) -> Result<UnixStream, ExecutorError> {
        let connect = UnixStream::connect(&self.socket);
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(stream)) => Ok(stream),
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
    /// [`ExecutorError::Io`] when the request cannot be written.
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
        self.connect().await.map(Opened)
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
        let mut stream = match opened {
            Some(Opened(stream)) => stream,
            None => self.connect().await?,
        };
        stream.write_all(&wire::encode_execute(1, params)).await.map_err(ExecutorError::Io)?;
        Ok(RunConnection::new(stream, MAX_LINE_BYTES))
    }

    /// Sends `execute` with `hold` on a fresh connection: the executor
    /// prepares the run while the caller finishes its own work (the audit
    /// row of the decision), then [`HeldRun::start`] lets it go.
    ///
    /// # Errors
    ///
    /// As [`ExecutorClient::execute`].
    pub async fn execute_held(&self, mut params: ExecuteParams) -> Result<HeldRun, ExecutorError> {
        params.hold = true;
        self.execute_on(None, &params).await.map(HeldRun)
    }

    /// The executor's Prometheus text (`metrics` call), within `timeout`.
    ///
    /// # Errors
    ///
    /// Any [`ExecutorError`]; a timeout is [`ExecutorError::Io`].
    pub async fn metrics(&self, timeout: Duration) -> Result<String, ExecutorError> {
        let call = async {
            let mut stream = self.connect().await?;
            stream.write_all(&wire::encode_metrics(1)).await.map_err(ExecutorError::Io)?;
            let mut conn = RunConnection::new(stream, MAX_LINE_BYTES);
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

    /// Returns true if and only if the executor answers `ping` within
    /// `timeout`.
    pub async fn ping(&self, timeout: Duration) -> bool {
        let call = async {
            let mut stream = self.connect().await.ok()?;
            let req = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n";
            stream.write_all(req).await.ok()?;
            let mut conn = RunConnection::new(stream, 64 << 10);
            matches!(conn.next_reply().await, Ok(Reply::Result { .. })).then_some(())
        };
        matches!(tokio::time::timeout(timeout, call).await, Ok(Some(())))
    }
}

fn reply_error(reply: Reply) -> ExecutorError {
    match reply {
        Reply::Error { code, message, .. } if code == wire::code::BUSY => {
            ExecutorError::Busy(message)
        }
        Reply::Error { code, message, .. } => ExecutorError::Remote { code, message },
        Reply::Stderr { .. } => ExecutorError::Protocol("unexpected stderr notification".into()),
        Reply::Result { .. } => ExecutorError::Protocol("unexpected result".into()),
    }
}

impl RunConnection {
    fn new(stream: UnixStream, max_line: usize) -> Self {
        Self {
            stream,
            lines: LineBuffer::new(max_line),
            ready: VecDeque::new(),
            read_buf: vec![0u8; 16 << 10].into_boxed_slice(),
            finished: false,
        }
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
        match self.next_reply().await? {
            Reply::Stderr { line, .. } => Ok(RunEvent::Stderr(line)),
            Reply::Result { result, .. } => {
                self.finished = true;
                let report: RunReport = serde_json::from_str(result.get())
                    .map_err(|e| ExecutorError::Protocol(format!("run report: {e}")))?;
                if report.outcome == Outcome::Busy {
                    return Err(ExecutorError::Busy(report.error.unwrap_or_default()));
                }
                Ok(RunEvent::Report(Box::new(report)))
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
                return Ok(*r);
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
            let n = self.stream.read(&mut self.read_buf).await.map_err(ExecutorError::Io)?;
            if n == 0 {
                return Err(ExecutorError::Closed);
            }
            self.ready.extend(self.lines.push(&self.read_buf[..n]));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tokio::net::UnixListener;

    use super::*;

    /// An executor that answers the first request with `reply` verbatim.
    async fn one_shot(reply: &'static [u8]) -> (tempfile::TempDir, ExecutorClient) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(reply).await;
        });
        (dir, ExecutorClient::new(path))
    }

    fn params() -> ExecuteParams {
        ExecuteParams {
            manifest: "/s/skill.json".into(),
            args: json!({}),
            session_id: None,
            class: None,
            tool: None,
            hold: false,
        }
    }

    #[tokio::test]
    async fn stderr_then_report() {
        let report = RunReport::not_run("s", Outcome::Rejected, "no");
        let mut reply = wire::encode_stderr(&json!(1), "a");
        reply.extend(wire::encode_report(&json!(1), &report));
        let reply: &'static [u8] = Box::leak(reply.into_boxed_slice());
        let (_d, c) = one_shot(reply).await;
        let mut conn = c.execute(&params()).await.unwrap();
        assert_eq!(conn.next().await.unwrap(), RunEvent::Stderr("a".into()));
        assert_eq!(conn.next().await.unwrap(), RunEvent::Report(Box::new(report)));
        assert!(matches!(conn.next().await, Err(ExecutorError::Closed)));
    }

    /// A listener on a fresh socket and a client of it.
    fn listening() -> (tempfile::TempDir, UnixListener, ExecutorClient) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.sock");
        let listener = UnixListener::bind(&path).unwrap();
        (dir, listener, ExecutorClient::new(path))
    }

    /// A connection opened ahead carries the run when used, and nothing
    /// at all when dropped.
    #[tokio::test]
    async fn an_opened_connection_sends_only_when_used() {
        let (dir, listener, client) = listening();
        let server = tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = Vec::new();
                s.read_to_end(&mut buf).await.unwrap();
                got.push(buf);
            }
            got
        });
        drop(client.open().await.unwrap());
        let opened = client.open().await.unwrap();
        drop(client.execute_on(Some(opened), &params()).await.unwrap());
        let got = server.await.unwrap();
        assert!(got[0].is_empty(), "a dropped connection sent {:?}", got[0]);
        assert_eq!(got[1], wire::encode_execute(1, &params()));
        assert!(matches!(
            ExecutorClient::new(dir.path().join("none.sock")).open().await,
            Err(ExecutorError::Connect { .. })
        ));
    }

    /// A held run's request carries `hold`, its `start` comes only when
    /// started, and a dropped one sends nothing more.
    #[tokio::test]
    async fn a_held_run_sends_start_only_when_started() {
        let (_dir, listener, client) = listening();
        let server = tokio::spawn(async move {
            let mut got = Vec::new();
            for answer in [false, true] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = s.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if answer && buf.iter().filter(|b| **b == b'\n').count() == 2 {
                        let report = RunReport::not_run("s", Outcome::Rejected, "no");
                        s.write_all(&wire::encode_report(&json!(1), &report)).await.unwrap();
                    }
                }
                got.push(buf);
            }
            got
        });
        drop(client.execute_held(params()).await.unwrap());
        let held = client.execute_held(params()).await.unwrap();
        let report = held.start().await.report().await.unwrap();
        assert_eq!(report.outcome, Outcome::Rejected);
        let got = server.await.unwrap();
        let held_params = ExecuteParams { hold: true, ..params() };
        assert_eq!(got[0], wire::encode_execute(1, &held_params), "dropped: no start");
        let mut want = wire::encode_execute(1, &held_params);
        want.extend(wire::encode_start(1));
        assert_eq!(got[1], want);
    }

    type Case = (&'static [u8], fn(&ExecutorError) -> bool);

    #[tokio::test]
    async fn failures_are_typed() {
        let cases: [Case; 5] = [
            (b"", |e| matches!(e, ExecutorError::Closed)),
            (b"not json\n", |e| matches!(e, ExecutorError::Protocol(_))),
            (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"x\":1}}\n", |e| {
                matches!(e, ExecutorError::Protocol(_))
            }),
            (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32002,\"message\":\"full\"}}\n", |e| {
                matches!(e, ExecutorError::Busy(m) if m == "full")
            }),
            (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32001,\"message\":\"who\"}}\n", |e| {
                matches!(e, ExecutorError::Remote { code: -32001, .. })
            }),
        ];
        for (reply, want) in cases {
            let (_d, c) = one_shot(reply).await;
            let e = c.execute(&params()).await.unwrap().report().await.unwrap_err();
            assert!(want(&e), "{:?}: {e:?}", String::from_utf8_lossy(reply));
        }
        let missing = ExecutorClient::new("/nonexistent/e.sock");
        assert!(matches!(missing.execute(&params()).await, Err(ExecutorError::Connect { .. })));
        assert!(!missing.ping(Duration::from_millis(100)).await);
    }
}
