//! The executor socket's settings: parent directory 0755, a stale socket
//! replaced (but never a regular file or a symlink, nor a socket an
//! executor answers on), then the node's owner, group and mode set from
//! `executor.toml`. The node itself (bind, probe, removal at exit) is
//! `plumbing::socket`'s, shared with skilld.
//!
//! Between `bind` and `chmod` the node has the mode the umask gives; the
//! peer-credential check ([`super::peer`]) guards that window too.

use std::path::Path;

use plumbing::socket::{NodeOptions, SocketError, SocketNode};
use tokio::net::UnixListener;

use crate::config::{Config, LOADER_USER};

/// How the executor's node at `path` is made: the configured owner, the
/// configured group (else the loader's, when that group exists), chowned
/// only when running as root, the directory created 0755, and a listener
/// of another uid replaced (a squatter on a stopped executor's path).
///
/// # Errors
///
/// [`SocketError::Unknown`] for an unknown `socket_owner` or `socket_group`.
pub fn node_options(config: &Config, path: &Path) -> Result<NodeOptions, SocketError> {
    use plumbing::socket::{gid_of, resolve_group, resolve_user, Chown, Live};
    let owner = resolve_user(path, &config.socket_owner)?;
    let group = match &config.socket_group {
        Some(group) => Some(resolve_group(path, group)?),
        None => {
            let gid = gid_of(LOADER_USER);
            if gid.is_none() {
                tracing::warn!(
                    "socket {}: group {LOADER_USER:?} does not exist; the socket keeps root's group",
                    path.display()
                );
            }
            gid
        }
    };
    Ok(NodeOptions {
        owner: Some(owner),
        group,
        chown: Chown::IfRoot,
        parent_mode: Some(0o755),
        live: Live::ReplaceForeign { daemon: "an executor" },
        ..NodeOptions::new(config.socket_mode_bits())
    })
}

/// Checks that no executor answers on the socket of `config`
/// ([`plumbing::socket::ensure_free`] with [`node_options`]).
///
/// # Errors
///
/// [`SocketError::InUse`] when an executor answers; [`SocketError::Io`]
/// when the probe itself fails; [`SocketError::Unknown`] for an unknown
/// owner or group.
pub fn ensure_free(config: &Config) -> Result<(), SocketError> {
    let path = config.socket_path();
    plumbing::socket::ensure_free(&path, &node_options(config, &path)?)
}

/// Binds the socket of `config` ([`plumbing::socket::bind`] with
/// [`node_options`]). Needs a tokio runtime with I/O enabled. The
/// [`SocketNode`] removes the node when dropped after the listener.
///
/// # Errors
///
/// [`SocketError`] naming the path and the step; [`SocketError::InUse`]
/// when an executor answers on the socket already.
pub fn bind(config: &Config) -> Result<(UnixListener, SocketNode), SocketError> {
    let path = config.socket_path();
    plumbing::socket::bind(&path, &node_options(config, &path)?)
}
