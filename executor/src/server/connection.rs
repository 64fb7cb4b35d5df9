//! One connection: the peer check, capped line reads, a writer task, and
//! telling a closed connection (cancel its runs) from a half-closed one.
//!
//! Idle connections: a connection with no run in flight that has not sent
//! a complete request line for `idle_timeout_seconds` is closed (one that
//! sends nothing, or a partial line a byte at a time, cannot keep one of
//! the `max_connections` slots). A connection with a run in flight is
//! never cut for being quiet: it ends with its runs.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use policy::wire::{self, code, LineBuffer};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::commands;
use super::peer::Peer;
use super::Shared;

/// Read chunk (under 64 KiB: freeing a larger block makes glibc sweep its
/// fast bins, ~1 % of all CPU with one connection per run).
const READ_CHUNK: usize = 16 << 10;
/// After a read EOF, how often the socket is polled for a hang-up.
const HUP_POLL: Duration = Duration::from_millis(50);
/// How long a refused peer or a finished connection gets to take its last
/// lines before the socket is closed anyway.
const FLUSH: Duration = Duration::from_secs(2);

/// What the commands of one connection share.
#[derive(Debug, Clone)]
pub(super) struct ConnCtx {
    /// Server state.
    pub(super) shared: Arc<Shared>,
    /// Who is on the other end.
    pub(super) peer: Peer,
    /// Lines to write (the writer task owns the socket's write half).
    /// Unbounded, yet bounded per run: stderr streaming stops at the run's
    /// `stderr_bytes` and the report carries at most the stdout cap.
    tx: mpsc::UnboundedSender<Vec<u8>>,
    /// Cancelled when the client is gone (or the drain is over); the runs
    /// of this connection pass it to the engine as their cancel future.
    pub(super) token: CancellationToken,
    /// This connection's run tasks (kept closed, so `wait` resolves
    /// whenever it is empty).
    pub(super) runs: TaskTracker,
    /// Held runs waiting for their `start`, by the JSON text of their id.
    pub(super) held: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
}

impl ConnCtx {
    /// Queues one encoded line for the peer (dropped if the peer is gone).
    pub(super) fn send(&self, line: Vec<u8>) {
        let _ = self.tx.send(line);
    }

    /// A sender for a run's stderr sink.
    pub(super) fn sender(&self) -> mpsc::UnboundedSender<Vec<u8>> {
        self.tx.clone()
    }
}

/// Decrements a gauge when dropped.
pub(super) struct GaugeGuard(prometheus::IntGauge);

impl GaugeGuard {
    pub(super) fn new(gauge: &prometheus::IntGauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Serves one accepted connection to its end.
pub(super) async fn serve(mut stream: UnixStream, shared: Arc<Shared>) {
    let peer = match stream.peer_cred() {
        Ok(c) => Peer { uid: c.uid(), gid: c.gid(), pid: c.pid() },
        Err(e) => {
            tracing::warn!("executor: connection without peer credentials ({e}); closing it");
            return;
        }
    };
    if !shared.peers.admits(&peer) {
        shared.metrics.peer_rejected_total.inc();
        tracing::warn!(
            "executor: refused connection from {peer}: not in allowed_uids or allowed_gids"
        );
        let line = wire::encode_error_code(
            &Value::Null,
            code::FORBIDDEN,
            &format!("peer uid {} gid {} may not use the executor", peer.uid, peer.gid),
        );
        let _ = tokio::time::timeout(FLUSH, async {
            let _ = stream.write_all(&line).await;
            let _ = stream.shutdown().await;
        })
        .await;
        return;
    }
    let _open = GaugeGuard::new(&shared.metrics.connections);
    tracing::debug!("executor: connection from {peer}");

    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    let token = shared.kill.child_token();
    // However this task ends, its runs are cancelled.
    let _cancel_runs = token.clone().drop_guard();
    let mut writer = tokio::spawn(write_lines(wr, rx, token.clone()));
    let runs = TaskTracker::new();
    runs.close();
    let ctx = ConnCtx {
        shared: Arc::clone(&shared),
        peer,
        tx,
        token: token.clone(),
        runs,
        held: Arc::default(),
    };

    let mut lines = LineBuffer::new(shared.engine.config().max_line_bytes);
    // Filled in its spare capacity (nothing zeroed), emptied before each read.
    let mut buf = Vec::with_capacity(READ_CHUNK);
    let mut reading = true;
    let mut stopping = shared.stopping.is_cancelled();
    let mut hup = tokio::time::interval(HUP_POLL);
    let idle_timeout = Duration::from_secs(shared.engine.config().idle_timeout_seconds);
    let mut idle_check = tokio::time::interval(
        (idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)),
    );
    let mut last_request = tokio::time::Instant::now();
    loop {
        buf.clear();
        tokio::select! {
            r = rd.read_buf(&mut buf), if reading => match r {
                Ok(0) => reading = false,
                Ok(_) => {
                    for item in lines.push(&buf) {
                        last_request = tokio::time::Instant::now();
                        commands::dispatch(&ctx, item);
                    }
                }
                Err(e) => {
                    tracing::debug!("executor: read from {peer}: {e}");
                    token.cancel();
                    reading = false;
                }
            },
            _ = hup.tick(), if !reading && !token.is_cancelled() => {
                if hung_up(rd.as_ref()) {
                    tracing::debug!("executor: {peer} closed the connection; cancelling its runs");
                    token.cancel();
                }
            }
            _ = idle_check.tick(), if reading && !idle_timeout.is_zero() => {
                if !ctx.runs.is_empty() {
                    last_request = tokio::time::Instant::now();
                } else if last_request.elapsed() >= idle_timeout {
                    tracing::debug!(
                        "executor: closing the connection of {peer}: no request for {} s",
                        idle_timeout.as_secs()
                    );
                    shared.metrics.idle_closed_total.inc();
                    break;
                }
            }
            () = shared.stopping.cancelled(), if !stopping => stopping = true,
            () = ctx.runs.wait(), if !reading || stopping => break,
        }
    }
    // Every run is done: close the channel and let the writer flush.
    drop(ctx);
    if tokio::time::timeout(FLUSH, &mut writer).await.is_err() {
        writer.abort();
    }
}

/// Returns true if and only if the peer closed its end (both directions):
/// AF_UNIX reports `POLLHUP` then, but only `POLLIN` (EOF) after a
/// `shutdown(SHUT_WR)`.
fn hung_up(stream: &UnixStream) -> bool {
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => {
            fds[0].revents().is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
        }
        Err(_) => false,
    }
}

/// Writes queued lines until every sender is gone; a failed write means the
/// client is gone, so the connection's runs are cancelled and the rest of
/// the queue is dropped.
async fn write_lines(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    token: CancellationToken,
) {
    let mut failed = false;
    while let Some(line) = rx.recv().await {
        if failed {
            continue;
        }
        if let Err(e) = wr.write_all(&line).await {
            tracing::debug!("executor: write: {e}; cancelling the connection's runs");
            token.cancel();
            failed = true;
        }
    }
    let _ = wr.shutdown().await;
}
