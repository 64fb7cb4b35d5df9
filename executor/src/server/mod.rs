//! `ongrid-executor serve`: the executor wire on a Unix socket.
//!
//! Newline-delimited JSON-RPC 2.0 ([`policy::wire`]) with a line-length
//! cap. Methods: `execute` (stream `stderr` notifications for the run, then
//! one response whose result is the [`policy::RunReport`]), `ping`
//! (`{"ok":true}`) and `metrics` (`{"text":"<Prometheus exposition>"}`).
//!
//! # Layout (mini-redis's layering)
//!
//! - [`socket`]: binding the socket node with its owner, group and mode
//!   (never over a live daemon's), and removing it at exit if still its own.
//! - [`peer`]: who may connect (SO_PEERCRED) and which classes each may run.
//! - [`manifests`]: the executor's own reading of a manifest (roots, class),
//!   cached by device, inode, size, mtime and ctime.
//! - `connection`: one connection: capped line reads, a writer task,
//!   client-gone detection.
//! - `commands`: one handler per method; `execute` does admission, the
//!   queue, the run and the metrics.
//! - this module: [`run`], the accept loop and shutdown.
//!
//! # Limits
//!
//! `max_connections` connections at once (a [`Semaphore`] permit is taken
//! before `accept`, so further clients wait in the backlog);
//! `max_concurrent_runs` runs at once, and up to `max_queued_runs` more wait
//! for a slot; beyond that an `execute` is answered with the JSON-RPC error
//! [`policy::wire::code::BUSY`]. A connection with no run in flight that
//! sends no complete request line for `idle_timeout_seconds` is closed
//! (counted in `ongrid_executor_idle_closed_total`), so silent or
//! byte-at-a-time clients cannot keep the `max_connections` slots; a
//! connection with a run in flight is never cut for being quiet.
//!
//! # Cancellation and shutdown
//!
//! Ownership and tokens, never global flags. Every connection has a
//! [`CancellationToken`] (a child of the server's `kill` token) that its run
//! tasks pass to [`Engine::run`] as the cancel future: when the peer closes
//! the connection (a read EOF and a hang-up on the socket, or a failed
//! write), the token is cancelled and each of its runs' process trees is
//! killed. A peer that only shuts down its write side keeps its runs.
//!
//! When the `shutdown` future completes (SIGTERM or Ctrl-C in `main`), the
//! listener is dropped (no new connections), queued and new `execute`s are
//! answered `busy`, and the runs in flight go on until they end, each
//! bounded by its own deadline. A connection closes once it has no run left.
//! If runs are still there after the longest possible run
//! (`max_timeout_seconds` plus the kill grace and a margin), or after
//! `drain_timeout_seconds` if that is sooner (75 s, under the unit's
//! `TimeoutStopSec=90s`, which with `KillMode=mixed` signals the executor
//! alone), the `kill` token is cancelled, which kills them all. [`run`] returns when every
//! connection task has ended (tracked by a [`TaskTracker`]).
//!
//! # Threads and the parent-death signal
//!
//! A skill's main process gets `PR_SET_PDEATHSIG(SIGKILL)`, which the kernel
//! fires when the *thread* that created it exits. The engine's spawner
//! threads create the children and live as long as the engine; in case
//! they cannot start, [`Engine::run`] creates the child from the thread
//! that polls it, so runs are spawned as tokio tasks: on a multi-thread
//! runtime they are polled by its worker threads, which live as long as the
//! runtime; on a current-thread runtime by the thread in `block_on`.
//! Nothing here uses `spawn_blocking` or
//! `block_in_place` (a blocking-pool thread exits after 10 s idle and would
//! take the runs it spawned with it). `executor/tests/serve.rs` runs a
//! skill past a 100 ms blocking-pool keep-alive to guard this.

pub mod manifests;
pub mod peer;
pub mod socket;

mod commands;
mod connection;
mod context;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use plumbing::accept::Backoff;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::run::engine::Engine;

use context::Shared;
pub use manifests::{Checked, ManifestCache};
pub use peer::PeerPolicy;
pub use plumbing::socket::{SocketError, SocketNode};
pub use socket::bind;

/// Lets the warm pools' thread return when dropped: at the end of [`run`],
/// or wherever its future is dropped.
struct FinishWarm(Arc<Engine>);

impl Drop for FinishWarm {
    fn drop(&mut self) {
        self.0.finish_warm();
    }
}

/// Margin added to the longest run before a drain kills what is left.
const DRAIN_MARGIN: Duration = Duration::from_secs(5);

/// Serves the executor wire on `listener` until `shutdown` completes and
/// the runs in flight have ended (see the module docs).
///
/// What a crashed executor left was swept when the engine started
/// ([`crate::host::sweep`]). The settings (`max_*`, `allowed_*`, `peers`, roots)
/// come from `engine.config()`; build it with [`crate::Config::for_serve`]
/// so that an empty `roots` means the default root, not "anywhere".
pub async fn run(
    listener: UnixListener,
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    shutdown: impl Future,
) {
    let config = engine.config().clone();
    let shared = Arc::new(Shared {
        peers: PeerPolicy::from_config(&config),
        manifests: ManifestCache::new(&config),
        admission: Arc::new(Semaphore::new(
            config.max_concurrent_runs.saturating_add(config.max_queued_runs),
        )),
        slots: Arc::new(Semaphore::new(config.max_concurrent_runs)),
        stopping: CancellationToken::new(),
        kill: CancellationToken::new(),
        servers: crate::mcp::Servers::default(),
        engine,
        metrics,
    });
    tracing::info!(
        "executor: serving on {} (peers: {}; {} runs at once, {} queued)",
        listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
            .unwrap_or_default(),
        shared.peers,
        config.max_concurrent_runs,
        config.max_queued_runs
    );
    for root in config.roots.iter().filter(|r| !r.is_dir()) {
        tracing::warn!(
            "executor: allow-list root {} is not a directory (yet); its skills are rejected",
            root.display()
        );
    }
    // The warm pools' thread (`run::warm`), for as long as the server: a
    // warm run made without a spawner thread is its child.
    let warm = {
        let (engine, slots) = (Arc::clone(&shared.engine), Arc::clone(&shared.slots));
        std::thread::Builder::new()
            .name("ongrid-warm".into())
            .spawn(move || engine.serve_warm(&slots))
            .map_err(|e| tracing::warn!("executor: cannot start the warm pools' thread: {e}"))
            .ok()
    };
    let finish_warm = FinishWarm(Arc::clone(&shared.engine));
    let tracker = TaskTracker::new();
    let connections = Arc::new(Semaphore::new(config.max_connections));
    // The stop is `shutdown`; the loop's own token is never cancelled.
    let never = CancellationToken::new();
    let accepting = plumbing::accept::serve(
        &listener,
        Arc::clone(&connections),
        Backoff::DEFAULT,
        &never,
        |e| tracing::warn!("executor: accept: {e}"),
        |stream, permit| {
            let shared = Arc::clone(&shared);
            tracker.spawn(async move {
                connection::serve(stream, shared).await;
                drop(permit);
            });
        },
    );
    // MCP servers idle past their pack's `idle_seconds` are stopped.
    let idle = shared.servers.watch_idle(&shared.engine);
    // A server that says its tools changed has them listed again at once.
    let changes = shared.servers.watch_changes(&shared.engine);
    tokio::select! {
        () = accepting => {}
        () = idle => {}
        () = changes => {}
        _ = shutdown => {}
    }
    // Stop accepting: the socket refuses new connections from here on.
    drop(listener);
    shared.stopping.cancel();
    // Idle warm runs are killed, not drained.
    shared.engine.stop_warm();
    tracker.close();
    let drain = (config.max_timeout() + policy::limits::KILL_GRACE + DRAIN_MARGIN)
        .min(Duration::from_secs(config.drain_timeout_seconds));
    tracing::info!(
        "executor: shutting down; {} connections, {} runs in flight (killed after {} s)",
        tracker.len(),
        shared.metrics.runs_in_flight.get(),
        drain.as_secs()
    );
    if tokio::time::timeout(drain, tracker.wait()).await.is_err() {
        tracing::warn!("executor: runs still in flight after {} s; killing them", drain.as_secs());
        shared.kill.cancel();
        tracker.wait().await;
    }
    // No call is in flight any more: the MCP servers go too.
    shared.servers.stop_all(&shared.engine).await;
    // No taken warm run is left either: the pools' thread may go.
    drop(finish_warm);
    if let Some(thread) = warm {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    tracing::info!("executor: stopped");
}
