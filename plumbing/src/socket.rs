//! The socket node a daemon listens on: its directory, a stale node
//! replaced (but never a regular file or a symlink, nor a node a running
//! daemon answers on), then the node's owner, group and mode.
//!
//! The two daemons differ in three ways, each a field of [`NodeOptions`]:
//! the executor creates a missing directory (0755) and skilld does not
//! ([`NodeOptions::parent_mode`]); the executor sets the owner only when
//! it runs as root, while skilld's `socket_group` must be set or the start
//! fails ([`Chown`]); and the executor replaces a node another user
//! listens on (the loader's user, which may create nodes in `/run/ongrid`,
//! squatting a stopped executor's path would otherwise keep every later
//! one from starting and take its clients' args), while skilld refuses any
//! listener ([`Live`]).
//!
//! Between `bind` and `chmod` the node has the mode the umask gives; each
//! daemon's peer-credential check guards that window too.
//!
//! The node bound is owned by the [`SocketNode`] [`bind`] returns: dropping
//! it removes the node, but only while the path still names that node (its
//! device and inode as bound) and nobody listens on it, never one another
//! daemon bound since.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

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
    /// A daemon accepts connections on the socket at the path.
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

/// When [`bind`] sets the node's owner and group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chown {
    /// Always; a failure fails the bind (skilld's `socket_group`: with mode
    /// 0660 the group decides who may connect at all).
    Always,
    /// Only when the daemon runs as root; otherwise the node keeps its
    /// creator's (the executor run by hand or by tests).
    IfRoot,
}

/// What a listener already answering on the path means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    /// Any listener keeps the path: [`SocketError::InUse`].
    Refuse,
    /// Only a listener of this daemon's uid keeps the path (when a full
    /// backlog hides its uid, a node owned by this uid or by
    /// [`NodeOptions::owner`] stands for it); another user's node is
    /// replaced, with a warning that it is not `daemon`'s.
    ReplaceForeign {
        /// What the warning says the listener is not (`an executor`).
        daemon: &'static str,
    },
}

/// How [`bind`] makes the node. Build it from [`NodeOptions::new`] with
/// struct-update syntax: `NodeOptions { group, ..NodeOptions::new(0o660) }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOptions {
    /// The node's mode bits, set after `bind`.
    pub mode: u32,
    /// The uid the node gets; `None` leaves it as created.
    pub owner: Option<u32>,
    /// The gid the node gets; `None` leaves it as created.
    pub group: Option<u32>,
    /// When the owner and group are set.
    pub chown: Chown,
    /// A missing directory is created (with its parents) with this mode;
    /// `None`: a missing directory fails the bind.
    pub parent_mode: Option<u32>,
    /// What a listener already on the path means.
    pub live: Live,
}

impl NodeOptions {
    /// A node of `mode`, owner and group as created, no directory created,
    /// any listener refused (skilld's socket).
    #[must_use]
    pub fn new(mode: u32) -> Self {
        Self {
            mode,
            owner: None,
            group: None,
            chown: Chown::Always,
            parent_mode: None,
            live: Live::Refuse,
        }
    }
}

/// The uid of a user name or number.
#[must_use]
pub fn uid_of(name: &str) -> Option<u32> {
    name.parse()
        .ok()
        .or_else(|| nix::unistd::User::from_name(name).ok().flatten().map(|u| u.uid.as_raw()))
}

/// The gid of a group name or number.
#[must_use]
pub fn gid_of(name: &str) -> Option<u32> {
    name.parse()
        .ok()
        .or_else(|| nix::unistd::Group::from_name(name).ok().flatten().map(|g| g.gid.as_raw()))
}

/// The uid of the configured owner `name` of the socket at `path`.
///
/// # Errors
///
/// [`SocketError::Unknown`] when no such user exists.
pub fn resolve_user(path: &Path, name: &str) -> Result<u32, SocketError> {
    uid_of(name).ok_or_else(|| unknown(path, "user", name))
}

/// The gid of the configured group `name` of the socket at `path`.
///
/// # Errors
///
/// [`SocketError::Unknown`] when no such group exists.
pub fn resolve_group(path: &Path, name: &str) -> Result<u32, SocketError> {
    gid_of(name).ok_or_else(|| unknown(path, "group", name))
}

fn unknown(path: &Path, what: &'static str, name: &str) -> SocketError {
    SocketError::Unknown { path: path.to_owned(), what, name: name.to_owned() }
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

/// Nobody accepts connections on the node at `path` (a connection is
/// refused, or the node is gone). Never blocks: a full backlog counts as a
/// listener, and so does a probe that fails.
#[must_use]
pub fn nobody_listens(path: &Path) -> bool {
    matches!(probe(path), Ok(Probe::Free))
}

/// Whether a listener of uid `listener` (unknown behind a full backlog)
/// on a node owned by `node_owner` keeps the path, for a daemon of `euid`.
fn keeps(
    live: Live,
    owner: Option<u32>,
    listener: Option<u32>,
    node_owner: u32,
    euid: u32,
) -> bool {
    match (live, listener) {
        (Live::Refuse, _) => true,
        (Live::ReplaceForeign { .. }, Some(uid)) => uid == euid,
        (Live::ReplaceForeign { .. }, None) => node_owner == euid || owner == Some(node_owner),
    }
}

/// Checks that no daemon that keeps the path answers on it: nothing there,
/// a stale socket node (a connection is refused), or, with
/// [`Live::ReplaceForeign`], a node another user listens on, which is
/// then replaced with a warning. The probe does not block.
///
/// # Errors
///
/// [`SocketError::InUse`] when a daemon that keeps the path answers;
/// [`SocketError::Io`] when the probe itself fails.
pub fn ensure_free(path: &Path, opts: &NodeOptions) -> Result<(), SocketError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => m,
        // Nothing there, or not a socket (which `bind` refuses itself).
        _ => return Ok(()),
    };
    let Probe::Listening { uid } = probe(path)? else { return Ok(()) };
    let euid = nix::unistd::geteuid().as_raw();
    if keeps(opts.live, opts.owner, uid, meta.uid(), euid) {
        return Err(SocketError::InUse { path: path.to_owned() });
    }
    if let Live::ReplaceForeign { daemon } = opts.live {
        tracing::warn!(
            "socket {}: answered by uid {}, not by {daemon} (uid {euid}); replacing the node",
            path.display(),
            uid.unwrap_or(meta.uid()),
        );
    }
    Ok(())
}

/// The socket node a [`bind`] created, identified by its device and inode.
/// Dropping it removes the node (at exit, on every path), unless the path
/// names another node by then: one a later daemon bound after this one's
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
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True while the path names the node bound and nobody listens on it.
    fn still_own(&self) -> bool {
        let same = fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && m.dev() == self.dev && m.ino() == self.ino);
        same && nobody_listens(&self.path)
    }
}

impl Drop for SocketNode {
    fn drop(&mut self) {
        if self.still_own() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Binds the socket at `path` as `opts` says (see the module docs). Needs
/// a tokio runtime with I/O enabled. The [`SocketNode`] removes the node
/// when dropped after the listener.
///
/// # Errors
///
/// [`SocketError`] naming the path and the step; [`SocketError::InUse`]
/// when a daemon answers on the socket already.
pub fn bind(path: &Path, opts: &NodeOptions) -> Result<(UnixListener, SocketNode), SocketError> {
    if let (Some(mode), Some(dir)) = (opts.parent_mode, path.parent()) {
        if !dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(dir)
                .map_err(io_err(dir, "create its directory"))?;
        }
    }
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            ensure_free(path, opts)?;
            fs::remove_file(path).map_err(io_err(path, "remove the stale socket"))?;
        }
        Ok(_) => return Err(SocketError::NotASocket { path: path.to_owned() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(path, "inspect")(e)),
    }
    let listener = UnixListener::bind(path).map_err(io_err(path, "bind"))?;
    let meta = fs::symlink_metadata(path).map_err(io_err(path, "inspect"))?;
    let node = SocketNode { path: path.to_owned(), dev: meta.dev(), ino: meta.ino() };
    if let Err(e) = set_up(path, opts) {
        // The listener first: the node is removed only once nobody listens.
        drop(listener);
        drop(node);
        return Err(e);
    }
    Ok((listener, node))
}

/// Gives the node at `path` its owner, group and mode.
fn set_up(path: &Path, opts: &NodeOptions) -> Result<(), SocketError> {
    let chown = match opts.chown {
        Chown::Always => true,
        Chown::IfRoot => nix::unistd::geteuid().is_root(),
    };
    if chown && (opts.owner.is_some() || opts.group.is_some()) {
        std::os::unix::fs::chown(path, opts.owner, opts.group).map_err(io_err(path, "chown"))?;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(opts.mode)).map_err(io_err(path, "chmod"))
}

#[cfg(test)]
mod tests;
