//! The loader's side of the executor wire (DESIGN.md §5, [`policy::wire`]).
//!
//! One connection per run: [`ExecutorClient::execute`] connects, sends the
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

/// An open `execute` call. Dropping it cancels the run.
#[derive(Debug)]
pub struct RunConnection {
    stream: UnixStream,
    lines: LineBuffer,
    ready: VecDeque<Result<Vec<u8>, wire::WireError>>,
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
        let mut stream = self.connect().await?;
        stream.write_all(&wire::encode_execute(1, params)).await.map_err(ExecutorError::Io)?;
        Ok(RunConnection {
            stream,
            lines: LineBuffer::new(MAX_LINE_BYTES),
            ready: VecDeque::new(),
            finished: false,
        })
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
            let mut conn = RunConnection {
                stream,
                lines: LineBuffer::new(MAX_LINE_BYTES),
                ready: VecDeque::new(),
                finished: false,
            };
            match conn.next_reply().await? {
                Reply::Result { result, .. } => serde_json::from_value::<MetricsResult>(result)
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
            let mut conn = RunConnection {
                stream,
                lines: LineBuffer::new(64 << 10),
                ready: VecDeque::new(),
                finished: false,
            };
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
                let report: RunReport = serde_json::from_value(result)
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
        let mut buf = vec![0u8; 64 << 10];
        loop {
            if let Some(line) = self.ready.pop_front() {
                let line = line.map_err(|e| ExecutorError::Protocol(e.to_string()))?;
                return wire::decode_reply(&line)
                    .map_err(|e| ExecutorError::Protocol(e.to_string()));
            }
            let n = self.stream.read(&mut buf).await.map_err(ExecutorError::Io)?;
            if n == 0 {
                return Err(ExecutorError::Closed);
            }
            self.ready.extend(self.lines.push(&buf[..n]));
        }
    }
}
