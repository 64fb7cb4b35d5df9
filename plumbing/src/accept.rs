//! The accept loop both daemons run (skilld twice: its client socket and
//! its metrics port): a permit from a semaphore before each `accept`, so
//! that clients beyond the cap wait in the kernel backlog instead of
//! holding descriptors here; a failed `accept` (EMFILE, ENFILE, ENOBUFS,
//! ...) retried after a pause that doubles up to a ceiling, so that a
//! daemon out of descriptors does not spin; and a [`CancellationToken`]
//! that ends it at any of those waits.
//!
//! What is done with a connection is the daemon's: `handle` gets the
//! stream and its permit (which it holds as long as the connection is
//! served, typically by moving it into the task it spawns). How a failed
//! `accept` is logged is the daemon's too (`on_error`), so that its log
//! line keeps its own target and wording.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// A listener the loop accepts from: tokio's Unix and TCP listeners.
pub trait Listener {
    /// An accepted connection.
    type Stream;

    /// Waits for the next connection.
    fn accept(&self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

impl Listener for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;

    async fn accept(&self) -> io::Result<Self::Stream> {
        tokio::net::UnixListener::accept(self).await.map(|(stream, _)| stream)
    }
}

impl Listener for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;

    async fn accept(&self) -> io::Result<Self::Stream> {
        tokio::net::TcpListener::accept(self).await.map(|(stream, _)| stream)
    }
}

/// The pause after a failed `accept`: `first`, doubled after each further
/// failure up to `max`, back to `first` after a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first pause.
    pub first: Duration,
    /// The longest pause.
    pub max: Duration,
}

impl Backoff {
    /// Both daemons' pauses: 10 ms doubling up to 1 s.
    pub const DEFAULT: Backoff =
        Backoff { first: Duration::from_millis(10), max: Duration::from_secs(1) };
}

impl Default for Backoff {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Accepts connections on `listener` until `cancel` is cancelled, taking a
/// permit of `permits` before each; hands each connection and its permit
/// to `handle`. A failed `accept` is passed to `on_error`, its permit
/// given back, and the loop pauses as `backoff` says. Returns when `cancel`
/// is cancelled (while waiting for a permit, a connection or the end of a
/// pause) or `permits` is closed; the listener is the caller's to drop.
pub async fn serve<L, E, H>(
    listener: &L,
    permits: Arc<Semaphore>,
    backoff: Backoff,
    cancel: &CancellationToken,
    mut on_error: E,
    mut handle: H,
) where
    L: Listener,
    E: FnMut(&io::Error),
    H: FnMut(L::Stream, OwnedSemaphorePermit),
{
    let mut pause = backoff.first;
    loop {
        let permit = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok(stream) => {
                pause = backoff.first;
                handle(stream, permit);
            }
            Err(e) => {
                drop(permit);
                on_error(&e);
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = pause.saturating_mul(2).min(backoff.max);
            }
        }
    }
}

#[cfg(test)]
mod tests;
