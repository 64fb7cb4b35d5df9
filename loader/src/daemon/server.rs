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

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
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

/// The client socket node [`bind`] made, identified by its device and
/// inode. Dropping it removes the node, on every path: a start that fails
/// after the bind (the metrics port taken, the socket's group) as well as
/// the end of the daemon's serving loop. A node that is no longer this one (the same
/// device and inode can be handed to the next node at once) or that
/// someone listens on is left alone: drop it after the listener.
#[derive(Debug)]
pub struct SocketNode {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketNode {
    /// The node bound at `path` just now.
    fn bound(path: &Path) -> std::io::Result<Self> {
        let meta = fs::symlink_metadata(path)?;
        Ok(Self { path: path.to_owned(), dev: meta.dev(), ino: meta.ino() })
    }

    /// Nobody accepts connections on the node at `path` (a connection is
    /// refused, or the node is gone). Never blocks: a full backlog counts
    /// as a listener.
    pub(crate) fn nobody_listens(path: &Path) -> bool {
        use nix::errno::Errno;
        use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
        let Ok(addr) = UnixAddr::new(path) else { return false };
        let Ok(fd) = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        ) else {
            return false;
        };
        matches!(
            connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr),
            Err(Errno::ECONNREFUSED | Errno::ENOENT)
        )
    }
}

impl Drop for SocketNode {
    fn drop(&mut self) {
        let same = fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && m.dev() == self.dev && m.ino() == self.ino);
        if same && Self::nobody_listens(&self.path) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Binds the Unix socket at `path` with `mode`. A stale socket file (no
/// daemon answers on it: a connection is refused) is removed first; a live
/// one, whose backlog may be full (the probe never blocks), is an error.
/// The [`SocketNode`] removes the node when dropped after the listener.
///
/// # Errors
///
/// [`BindError`].
pub fn bind(path: &Path, mode: u32) -> Result<(UnixListener, SocketNode), BindError> {
    let io_err = |source| BindError::Io { path: path.to_path_buf(), source };
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if !SocketNode::nobody_listens(path) {
                return Err(BindError::InUse(path.to_path_buf()));
            }
            fs::remove_file(path).map_err(io_err)?;
        }
        Ok(_) => return Err(BindError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e)),
    }
    let listener = UnixListener::bind(path).map_err(io_err)?;
    let node = SocketNode::bound(path).map_err(io_err)?;
    if let Err(e) = fs::set_permissions(path, fs::Permissions::from_mode(mode)) {
        // The listener first: the node is removed only once nobody listens.
        drop(listener);
        drop(node);
        return Err(io_err(e));
    }
    Ok((listener, node))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon whose backlog is full still answers (its clients wait): a
    /// second `bind` on its path is refused instead of taking the path over
    /// (a blocking probe would wait, a failed one took it for stale), and
    /// the node stays.
    #[tokio::test]
    async fn a_live_socket_with_a_full_backlog_is_not_taken_over() {
        use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let addr = UnixAddr::new(&path).unwrap();
        let mut queued = Vec::new();
        loop {
            let fd = socket(
                AddressFamily::Unix,
                SockType::Stream,
                SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                None,
            )
            .unwrap();
            if connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).is_err() {
                break;
            }
            queued.push(fd);
            assert!(queued.len() < 100_000, "the backlog never filled");
        }
        let inode = fs::metadata(&path).unwrap().ino();
        assert!(matches!(bind(&path, 0o600), Err(BindError::InUse(_))));
        assert_eq!(fs::metadata(&path).unwrap().ino(), inode, "the node was replaced");
        drop(queued);
        drop(live);
        // Now stale: replaced (the inode number may be reused), and removed
        // with its listener.
        let (listener, node) = bind(&path, 0o600).unwrap();
        drop(listener);
        drop(node);
        assert!(!path.exists(), "the node outlived its listener");
    }
}
