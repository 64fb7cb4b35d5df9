//! systemd integration of `ongrid-skilld`: the service manager's
//! notifications (`sd_notify(3)`: `READY=1`, `RELOADING=1`, `STOPPING=1`,
//! `STATUS=`) and a
//! listening socket handed over by socket activation (`sd_listen_fds(3)`:
//! `LISTEN_PID`, `LISTEN_FDS`, the socket as fd 3).
//!
//! Without `NOTIFY_SOCKET` the notifications do nothing; without
//! `LISTEN_FDS` (for this pid) there is no inherited socket and the daemon
//! binds its own, as outside systemd. Both go through well-kept crates
//! (`sd-notify`, `listenfd`), which keep this crate free of `unsafe`.

use std::os::unix::net::UnixListener;

/// The inherited socket could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActivationError {
    /// More than one socket was passed; skilld listens on one.
    #[error("socket activation passed {0} sockets; ongrid-skilld takes exactly one (ListenStream= once)")]
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

/// Tells the service manager a rescan has started: `RELOADING=1` with
/// `MONOTONIC_USEC=` (the time `Type=notify-reload` requires), and
/// `STATUS=rescanning`. [`ready`] ends it.
pub fn reloading() {
    match sd_notify::NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[
            sd_notify::NotifyState::Reloading,
            now,
            sd_notify::NotifyState::Status("rescanning"),
        ]),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read CLOCK_MONOTONIC for RELOADING=1");
            send(&[
                sd_notify::NotifyState::Reloading,
                sd_notify::NotifyState::Status("rescanning"),
            ]);
        }
    }
}

fn send(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}
