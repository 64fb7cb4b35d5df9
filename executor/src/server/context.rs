//! What the accept loop, the connections and the runs share ([`Shared`]),
//! and what the commands of one connection share ([`ConnCtx`]): the server's
//! state, the peer, the queue of lines for the writer task with its
//! bounded backlog, the connection's runs and held runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use tokio::sync::Semaphore;

use super::manifests::ManifestCache;
use super::peer::{Peer, PeerPolicy};
use crate::metrics::Metrics;
use crate::run::engine::{AfterReport, Engine};

/// State shared by the accept loop, the connections and the runs.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Runs the skills; its config is the server's config.
    pub(crate) engine: Arc<Engine>,
    /// Where every run and connection is counted.
    pub(crate) metrics: Arc<Metrics>,
    /// Who may connect and which classes each peer may run.
    pub(crate) peers: PeerPolicy,
    /// The executor's own reading of manifests.
    pub(crate) manifests: ManifestCache,
    /// Admission: `max_concurrent_runs + max_queued_runs` permits. A run
    /// that cannot take one is answered `busy` at once.
    pub(crate) admission: Arc<Semaphore>,
    /// Run slots: `max_concurrent_runs` permits, awaited in the queue.
    pub(crate) slots: Arc<Semaphore>,
    /// Cancelled when shutdown starts: no new runs, connections close once
    /// their runs are done.
    pub(crate) stopping: CancellationToken,
    /// Cancelled when the drain is over: every run is killed.
    pub(crate) kill: CancellationToken,
    /// The MCP server packs' servers (stopped on drain).
    pub(crate) servers: crate::mcp::Servers,
}

/// Past this many bytes of answers waiting for the peer to read them, the
/// connection reads no more requests until the writer catches up.
pub(super) const BACKLOG: usize = 4 << 20;

/// The bytes queued for the peer and not written yet. Without a bound, a
/// peer that sends requests and never reads the answers (`id`s of 1 MB
/// each, answered by errors that repeat them) grew the root executor by
/// its whole input: 230 MB in 11 s, released only when it hung up.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    pub(super) bytes: AtomicUsize,
    pub(super) drained: Notify,
}

impl Backlog {
    pub(super) fn add(&self, n: usize) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` bytes written (or dropped); wakes the reader when the backlog
    /// falls under [`BACKLOG`].
    pub(super) fn done(&self, n: usize) {
        let update = |b: usize| Some(b.saturating_sub(n));
        // The closure never returns None.
        let before = self.bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, update);
        let before = before.unwrap_or_else(|b| b);
        if before >= BACKLOG && before.saturating_sub(n) < BACKLOG {
            self.drained.notify_one();
        }
    }

    pub(super) fn full(&self) -> bool {
        self.bytes.load(Ordering::Relaxed) >= BACKLOG
    }
}

/// Queues lines for the peer, counted in the connection's [`Backlog`].
#[derive(Debug, Clone)]
pub(super) struct Lines {
    pub(super) tx: mpsc::UnboundedSender<Outgoing>,
    pub(super) backlog: Arc<Backlog>,
}

impl Lines {
    /// Queues one encoded line (dropped if the peer is gone).
    pub(super) fn send(&self, line: Vec<u8>) {
        let n = line.len();
        self.backlog.add(n);
        if self.tx.send(Outgoing::Line(line)).is_err() {
            self.backlog.done(n);
        }
    }

    /// Queues `then`, dropped once the lines queued before it are written
    /// (or at once if the peer is gone), counted as [`AFTER_REPORT_BYTES`].
    pub(super) fn then(&self, then: Box<dyn std::any::Any + Send>) {
        self.backlog.add(AFTER_REPORT_BYTES);
        if self.tx.send(Outgoing::Then(then)).is_err() {
            self.backlog.done(AFTER_REPORT_BYTES);
        }
    }
}

/// What the commands of one connection share.
#[derive(Debug, Clone)]
pub(super) struct ConnCtx {
    /// Server state.
    pub(super) shared: Arc<Shared>,
    /// Who is on the other end.
    pub(super) peer: Peer,
    /// Lines to write (the writer task owns the socket's write half).
    /// A run's lines are bounded (stderr streaming stops at the run's
    /// `stderr_bytes`, the report carries at most the stdout cap); the
    /// answers to requests are bounded by [`BACKLOG`].
    pub(super) lines: Lines,
    /// Cancelled when the client is gone (or the drain is over); the runs
    /// of this connection pass it to the engine as their cancel future.
    pub(super) token: CancellationToken,
    /// This connection's run tasks (kept closed, so `wait` resolves
    /// whenever it is empty).
    pub(super) runs: TaskTracker,
    /// Held runs waiting for their `start`, by the JSON text of their id.
    pub(super) held: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
    /// `mcp_tools` and `mcp_watch` requests of this connection not yet
    /// answered, [`WAITS`] at most: they take no run slot, and a watch
    /// answers nothing for minutes, so pipelined ones would otherwise pile
    /// up as tasks while the backlog stays empty.
    pub(super) waits: Arc<Semaphore>,
}

/// Unanswered `mcp_tools` and `mcp_watch` requests a connection may have
/// (the loader sends one per connection); past it they are answered
/// `busy` at once.
pub(super) const WAITS: usize = 16;

/// What a finished run's [`AfterReport`] counts in its connection's
/// backlog while it waits behind lines not yet written: it holds the run's
/// pipes and pidfd and its slot's clean-up, so a peer that never reads
/// holds as many of them as [`BACKLOG`] allows (64) and the runs it had
/// admitted by then (`max_concurrent_runs + max_queued_runs` at most), not
/// one per run.
pub(super) const AFTER_REPORT_BYTES: usize = 64 << 10;

impl ConnCtx {
    /// Queues one encoded line for the peer (dropped if the peer is gone).
    pub(super) fn send(&self, line: Vec<u8>) {
        self.lines.send(line);
    }

    /// Queues `then`, dropped once the lines queued before it are written
    /// (or dropped with the queue if the peer is gone).
    pub(super) fn after_sent(&self, then: AfterReport) {
        self.lines.then(Box::new(then));
    }

    /// A sender for a run's stderr sink.
    pub(super) fn sender(&self) -> Lines {
        self.lines.clone()
    }
}

/// What the writer task is given.
#[derive(Debug)]
pub(super) enum Outgoing {
    /// An encoded line for the peer.
    Line(Vec<u8>),
    /// Dropped once every line before it is written: what of a finished
    /// run is kept off its report's path ([`AfterReport`]).
    Then(Box<dyn std::any::Any + Send>),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The backlog is full from [`BACKLOG`] bytes on, and wakes the reader
    /// once it falls under it again, even when the wake comes first.
    #[tokio::test]
    async fn the_backlog_stops_and_wakes_the_reader() {
        let b = Backlog::default();
        b.add(BACKLOG - 1);
        assert!(!b.full());
        b.add(2);
        assert!(b.full());
        b.done(1);
        assert!(b.full());
        b.done(1);
        assert!(!b.full());
        // The wake was given before anyone waited: it is kept.
        tokio::time::timeout(Duration::from_secs(5), b.drained.notified()).await.expect("woken");
        b.done(BACKLOG);
        assert_eq!(b.bytes.load(Ordering::Relaxed), 0, "never below zero");
    }
}
