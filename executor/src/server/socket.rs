//! Binding the executor socket: parent directory 0755, a stale socket
//! replaced (but never a regular file or a symlink), then the node's owner,
//! group and mode set from `executor.toml`.
//!
//! Between `bind` and `chmod` the node has the mode the umask gives; the
//! peer-credential check ([`super::peer`]) guards that window too.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
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

/// Binds the socket of `config` (see the module docs). Needs a tokio
/// runtime with I/O enabled.
///
/// # Errors
///
/// [`SocketError`] naming the path and the step.
pub fn bind(config: &Config) -> Result<UnixListener, SocketError> {
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
            fs::remove_file(&path).map_err(io_err(&path, "remove the stale socket"))?;
        }
        Ok(_) => return Err(SocketError::NotASocket { path }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&path, "inspect")(e)),
    }
    let listener = UnixListener::bind(&path).map_err(io_err(&path, "bind"))?;
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(&path, uid, gid).map_err(io_err(&path, "chown"))?;
    }
    fs::set_permissions(&path, fs::Permissions::from_mode(config.socket_mode_bits()))
        .map_err(io_err(&path, "chmod"))?;
    Ok(listener)
}

/// Removes the socket node at `path` if it is still a socket (at exit).
pub fn remove(path: &Path) {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = fs::remove_file(path);
    }
}
