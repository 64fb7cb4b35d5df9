//! The client API listener: accepts connections on the Unix socket, reads
//! each peer's credentials, and serves HTTP/1.1 with the API router.
//!
//! Shape (mini-redis `server.rs`): [`serve`] owns the listener and a
//! semaphore capping the connections served at once (more wait in the
//! kernel backlog); each connection runs in its own task holding a permit.
//! Shutdown comes from the caller as a [`CancellationToken`]: on
//! cancellation the listener stops accepting, every connection is asked to
//! finish its current request and close, and [`serve`] returns once the
//! last connection task is gone (tracked by a [`TaskTracker`]) or `drain`
//! has passed, whichever is first.
//!
//! The connections themselves, their timeouts and limits, are
//! [`crate::daemon::connection`]'s.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use plumbing::accept::Backoff;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::daemon::connection::{serve_connection, Caller, Ends};
use crate::daemon::quiet_stream::QuietStream;

/// How connections are served.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Connections served at once.
    pub max_connections: usize,
    /// How long a client may take to send a request head.
    pub header_timeout: Duration,
    /// How long a connection may stay without a request in progress and
    /// without reading or writing a byte (and how long an answer's writes
    /// may stay blocked) before it is closed.
    pub idle_timeout: Duration,
    /// `ongrid_http_requests_total`, for the answers a connection gives
    /// itself (a head over [`crate::daemon::connection::MAX_HEAD_BYTES`]).
    pub requests_total: prometheus::IntCounterVec,
}

/// The connections still open when [`serve`] stopped accepting: each
/// finishes the request it is serving (hyper's graceful shutdown) unless
/// [`Draining::abort`] ends it first.
#[derive(Debug)]
pub struct Draining {
    tracker: TaskTracker,
    abort: CancellationToken,
}

impl Draining {
    /// Waits up to `deadline` for every connection to end; true if they did.
    pub async fn wait(&self, deadline: Duration) -> bool {
        tokio::time::timeout(deadline, self.tracker.wait()).await.is_ok()
    }

    /// The connections still open: how many.
    pub fn open(&self) -> usize {
        self.tracker.len()
    }

    /// Ends every connection still open (their requests' futures are
    /// dropped: a run in flight is cancelled and its audit row completed)
    /// and waits, briefly, for their tasks to go.
    pub async fn abort(self) {
        self.abort.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.tracker.wait()).await;
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then
/// closes the listener (a client that comes now is refused at once, or,
/// on a socket systemd passed and keeps, waits in its backlog for the next
/// start) and returns the connections still open.
pub async fn serve(
    listener: UnixListener,
    router: Router,
    opts: ServeOptions,
    shutdown: CancellationToken,
) -> Draining {
    let permits = Arc::new(Semaphore::new(opts.max_connections));
    let tracker = TaskTracker::new();
    let abort = CancellationToken::new();
    plumbing::accept::serve(
        &listener,
        permits,
        Backoff::DEFAULT,
        &shutdown,
        |e| tracing::warn!(error = %e, "accept failed"),
        |stream, permit| {
            let caller = match Caller::of(&stream) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read peer credentials; closing");
                    return;
                }
            };
            let stream = match QuietStream::from_tokio(stream) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot register the connection; closing");
                    return;
                }
            };
            let router = router.clone();
            let ends = Ends { shutdown: shutdown.clone(), abort: abort.clone() };
            let timeouts = (opts.header_timeout, opts.idle_timeout);
            let requests_total = opts.requests_total.clone();
            tracker.spawn(async move {
                let _permit = permit;
                serve_connection(stream, caller, router, timeouts, ends, requests_total).await;
            });
        },
    )
    .await;
    drop(listener);
    tracker.close();
    Draining { tracker, abort }
}
