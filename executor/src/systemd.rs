//! systemd integration of `ongrid-executor serve`: the service manager's
//! notifications (`sd_notify(3)`: `READY=1`, `STOPPING=1`, `STATUS=`) and a
//! listening socket handed over by socket activation (`sd_listen_fds(3)`:
//! `LISTEN_PID`, `LISTEN_FDS`, the socket as fd 3).
//!
//! Without `NOTIFY_SOCKET` the notifications do nothing; without
//! `LISTEN_FDS` (for this pid) there is no inherited socket and the daemon
//! binds its own, as outside systemd. Both go through well-kept crates
//! (`sd-notify`, `listenfd`), which need no `unsafe` here (none outside `sys/`).

use std::os::unix::net::UnixListener;

/// The inherited socket could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActivationError {
    /// More than one socket was passed; the executor listens on one.
    #[error("socket activation passed {0} sockets; ongrid-executor takes exactly one (ListenStream= once)")]
    Count(usize),
    /// fd 3 is not a listening Unix stream socket.
    #[error("the socket passed by socket activation is not a Unix stream socket")]
    NotUnixStream(#[source] std::io::Error),
}

/// Takes the listening Unix socket passed by socket activation, if any.
///
/// Call it once, before any thread is started: it reads and removes
/// `LISTEN_PID`/`LISTEN_FDS` from the environment (so that no child
/// inherits them) and marks the socket close-on-exec.
///
/// # Errors
///
/// [`ActivationError`] when sockets were passed but not exactly one Unix
/// stream socket.
pub fn take_listener() -> Result<Option<UnixListener>, ActivationError> {
    let mut fds = listenfd::ListenFd::from_env();
    match fds.len() {
        0 => Ok(None),
        1 => fds.take_unix_listener(0).map_err(ActivationError::NotUnixStream),
        n => Err(ActivationError::Count(n)),
    }
}

/// Tells the service manager the daemon serves (`READY=1`) with a status
/// line. A failure to notify is logged, never fatal.
pub fn ready(status: &str) {
    send(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status(status)]);
}

/// Tells the service manager a graceful shutdown has started.
pub fn stopping() {
    send(&[sd_notify::NotifyState::Stopping, sd_notify::NotifyState::Status("stopping")]);
}

/// Sends a `STATUS=` line only.
pub fn status(status: &str) {
    send(&[sd_notify::NotifyState::Status(status)]);
}

fn send(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}
