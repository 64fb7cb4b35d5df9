//! Binding the executor socket: parent directory 0755, a stale socket
//! replaced (but never a regular file or a symlink, nor a socket a running
//! daemon answers on), then the node's owner, group and mode set from
//! `executor.toml`.
//!
//! Between `bind` and `chmod` the node has the mode the umask gives; the
//! peer-credential check ([`super::peer`]) guards that window too.
//!
//! The node bound is owned by the [`SocketNode`] `bind` returns: dropping
//! it removes the node, but only while the path still names that node (its
//! device and inode as bound), never one another executor bound since.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::config::{Config, LOADER_USER};

/// The socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// A file system step failed.
    #[error("socket {path}: cannot {what}")]
    Io {
        /// The socket or its directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Something other than a socket is at the path.
    #[error("socket {path}: exists and is not a socket; not replacing it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A daemon accepts connections on the socket at the path (another
    /// `ongrid-executor serve` with the same configuration).
    #[error("socket {path} is in use by a running daemon; not replacing it")]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// The configured owner or group does not exist.
    #[error("socket {path}: {what} {name:?} does not exist")]
    Unknown {
        /// The socket.
        path: PathBuf,
        /// `user` or `group`.
        what: &'static str,
        /// The name.
        name: String,
    },
}

fn io_err<'p>(path: &'p Path, what: &'static str) -> impl FnOnce(io::Error) -> SocketError + 'p {
    move |source| SocketError::Io { path: path.to_owned(), what, source }
}

fn uid_of(name: &str) -> Option<u32> {
    name.parse()
        .ok()
        .or_else(|| nix::unistd::User::from_name(name).ok().flatten().map(|u| u.uid.as_raw()))
}

fn gid_of(name: &str) -> Option<u32> {
    name.parse()
        .ok()
        .or_else(|| nix::unistd::Group::from_name(name).ok().flatten().map(|g| g.gid.as_raw()))
}

/// The (uid, gid) the socket node gets; `None` = leave as created.
fn ownership(config: &Config, path: &Path) -> Result<(Option<u32>, Option<u32>), SocketError> {
    let unknown = |what, name: &str| SocketError::Unknown {
        path: path.to_owned(),
        what,
        name: name.to_owned(),
    };
    let uid = uid_of(&config.socket_owner).ok_or_else(|| unknown("user", &config.socket_owner))?;
    let gid = match &config.socket_group {
        Some(group) => Some(gid_of(group).ok_or_else(|| unknown("group", group))?),
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
    Ok((Some(uid), gid))
}

/// Who answers on a socket node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// Nothing there, or a stale node: a connection is refused.
    Free,
    /// A listener accepts connections (or its backlog is full): the uid
    /// it listens as (`SO_PEERCRED`), unknown when the backlog is full.
    Listening {
        /// The listener's uid.
        uid: Option<u32>,
    },
}

/// Connects to `path` without blocking.
fn probe(path: &Path) -> Result<Probe, SocketError> {
    use nix::errno::Errno;
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let failed = |e: Errno| io_err(path, "probe")(io::Error::from(e));
    let addr = UnixAddr::new(path).map_err(failed)?;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(failed)?;
    match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
        Ok(()) => {
            let cred =
                nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::PeerCredentials);
            Ok(Probe::Listening { uid: cred.ok().map(|c| c.uid()) })
        }
        // Would wait behind a full backlog.
        Err(Errno::EAGAIN | Errno::EINPROGRESS) => Ok(Probe::Listening { uid: None }),
        // A stale node (nobody listens), or gone since.
        Err(Errno::ECONNREFUSED | Errno::ENOENT) => Ok(Probe::Free),
        Err(e) => Err(failed(e)),
    }
}

/// Checks that no executor answers on the socket of `config`: nothing
/// there, a stale socket node (a connection is refused), or a node another
/// user listens on. The probe does not block.
///
/// An executor listens as the executor's uid (`SO_PEERCRED`); when its
/// backlog is full and no connection reads the uid, the node's owner
/// stands for it (the executor's uid or the configured `socket_owner`). A
/// listener of another uid is no executor: the loader's user, which may
/// create nodes in `/run/ongrid`, squatting the path of a stopped
/// executor would otherwise keep every later one from starting (and take
/// its clients' args). Its node is replaced, with a warning.
///
/// # Errors
///
/// [`SocketError::InUse`] when an executor answers; [`SocketError::Io`]
/// when the probe itself fails; [`SocketError::Unknown`] for an unknown
/// `socket_owner`.
pub fn ensure_free(config: &Config) -> Result<(), SocketError> {
    let path = config.socket_path();
    let meta = match fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket() => m,
        // Nothing there, or not a socket (which `bind` refuses itself).
        _ => return Ok(()),
    };
    let Probe::Listening { uid } = probe(&path)? else { return Ok(()) };
    let euid = nix::unistd::geteuid().as_raw();
    let ours = match uid {
        Some(uid) => uid == euid,
        None => meta.uid() == euid || ownership(config, &path)?.0 == Some(meta.uid()),
    };
    if ours {
        return Err(SocketError::InUse { path });
    }
    tracing::warn!(
        "socket {}: answered by uid {}, not by an executor (uid {euid}); replacing the node",
        path.display(),
        uid.unwrap_or(meta.uid()),
    );
    Ok(())
}

/// The socket node a [`bind`] created, identified by its device and inode.
/// Dropping it removes the node (at exit, on every path), unless the path
/// names another node by then: one a later executor bound after this one's
/// listener was gone is left to it. As a freed inode number can be given
/// to the next node at once (ext4), a node with this one's device and inode
/// is removed only if nobody listens on it: drop the node after the
/// listener.
#[derive(Debug)]
pub struct SocketNode {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketNode {
    /// The path of the node.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True while the path names the node bound and nobody listens on it.
    fn still_own(&self) -> bool {
        let same = fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && m.dev() == self.dev && m.ino() == self.ino);
        same && matches!(probe(&self.path), Ok(Probe::Free))
    }
}

impl Drop for SocketNode {
    fn drop(&mut self) {
        if self.still_own() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Binds the socket of `config` (see the module docs). Needs a tokio
/// runtime with I/O enabled. The [`SocketNode`] removes the node when
/// dropped.
///
/// # Errors
///
/// [`SocketError`] naming the path and the step; [`SocketError::InUse`]
/// when a daemon answers on the socket already.
pub fn bind(config: &Config) -> Result<(UnixListener, SocketNode), SocketError> {
    let path = config.socket_path();
    let (uid, gid) = ownership(config, &path)?;
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(io_err(dir, "create its directory"))?;
        }
    }
    match fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket() => {
            ensure_free(config)?;
            fs::remove_file(&path).map_err(io_err(&path, "remove the stale socket"))?;
        }
        Ok(_) => return Err(SocketError::NotASocket { path }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&path, "inspect")(e)),
    }
    let listener = UnixListener::bind(&path).map_err(io_err(&path, "bind"))?;
    let meta = fs::symlink_metadata(&path).map_err(io_err(&path, "inspect"))?;
    let node = SocketNode { path, dev: meta.dev(), ino: meta.ino() };
    let owned = |path: &Path| -> Result<(), SocketError> {
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(path, uid, gid).map_err(io_err(path, "chown"))?;
        }
        fs::set_permissions(path, fs::Permissions::from_mode(config.socket_mode_bits()))
            .map_err(io_err(path, "chmod"))
    };
    if let Err(e) = owned(node.path()) {
        // The listener first: the node is removed only once nobody listens.
        drop(listener);
        drop(node);
        return Err(e);
    }
    Ok((listener, node))
}
