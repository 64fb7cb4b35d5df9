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
//! [`crate::connection`]'s.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::{serve_connection, Ends};
use crate::quiet_stream::QuietStream;

/// Who is on the other end of a client connection, as the kernel says
/// (`SO_PEERCRED` at `connect()` time), never as the request claims.
/// Handlers get it as an `Extension<Caller>`; permission modes (issue 5)
/// decide from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The peer's uid.
    pub uid: u32,
    /// The peer's primary gid.
    pub gid: u32,
    /// The peer's pid, when the kernel gave one (it can be recycled: for
    /// logs only).
    pub pid: Option<i32>,
}

impl Caller {
    /// The credentials of the peer of `stream`.
    ///
    /// # Errors
    ///
    /// The `getsockopt` error.
    pub fn of(stream: &UnixStream) -> io::Result<Self> {
        let cred = stream.peer_cred()?;
        Ok(Self { uid: cred.uid(), gid: cred.gid(), pid: cred.pid() })
    }
}

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
    /// itself (a head over [`crate::connection::MAX_HEAD_BYTES`]).
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

/// Why the client socket could not be bound.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// Another daemon answers on the socket.
    #[error("{0} is in use by a running daemon")]
    InUse(PathBuf),
    /// Something that is not a socket is at the path.
    #[error("{0} exists and is not a socket")]
    NotASocket(PathBuf),
    /// Binding, removing a stale socket or setting the mode failed.
    #[error("cannot bind {path}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Binds the Unix socket at `path` with `mode`. A stale socket file (no
/// daemon answers on it) is removed first; a live one is an error.
///
/// # Errors
///
/// [`BindError`].
pub async fn bind(path: &Path, mode: u32) -> Result<UnixListener, BindError> {
    let io_err = |source| BindError::Io { path: path.to_path_buf(), source };
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).await.is_ok() {
                return Err(BindError::InUse(path.to_path_buf()));
            }
            fs::remove_file(path).map_err(io_err)?;
        }
        Ok(_) => return Err(BindError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e)),
    }
    let listener = UnixListener::bind(path).map_err(io_err)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err)?;
    Ok(listener)
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
    let mut backoff = Duration::from_millis(10);
    loop {
        // Wait for a free slot before accepting, so excess clients queue in
        // the kernel backlog instead of holding file descriptors here.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                // The semaphore is never closed.
                Err(_) => break,
            },
            () = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    backoff = Duration::from_millis(10);
                    stream
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let caller = match Caller::of(&stream) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read peer credentials; closing");
                continue;
            }
        };
        let stream = match QuietStream::from_tokio(stream) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot register the connection; closing");
                continue;
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
    }
    drop(listener);
    tracker.close();
    Draining { tracker, abort }
}
