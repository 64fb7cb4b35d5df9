//! Registering a Unix stream with the tokio reactor for one interest.
//!
//! Why one interest (see `server::connection`): a `tokio::net::UnixStream`
//! is registered for reading and writing, so every read by the peer of
//! what this side sent (which frees send space and wakes the writer's wait
//! queue) comes back as an `EPOLLOUT` edge: a parked runtime thread woken
//! for nothing.

use std::io;
use std::os::unix::net::UnixStream;

use tokio::io::unix::{AsyncFd, AsyncFdRegisterError};
use tokio::io::Interest;

/// Registers `stream` (non-blocking) with the current runtime's reactor
/// for `interest` alone; `AsyncFd::into_inner` deregisters it again.
///
/// # Errors
///
/// The registration error (the stream is closed then).
pub fn register(stream: UnixStream, interest: Interest) -> io::Result<AsyncFd<UnixStream>> {
    // SAFETY: the AsyncFd owns `stream`, which owns its descriptor, always
    // reports the same one and closes it only when dropped, after the
    // AsyncFd deregistered it.
    unsafe { AsyncFd::register_with_interest(stream, interest) }
        .map_err(AsyncFdRegisterError::into_parts)
        .map_err(|(_, e)| e)
}
