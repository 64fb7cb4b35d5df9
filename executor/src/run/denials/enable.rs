//! `report_denials = "on"`: the kernel's audit enabled by the executor
//! when it is off, and restored by the last executor of the host that
//! relies on it.
//!
//! Two files coordinate the host's executors: [`LOCK_FILE`], locked
//! exclusively (`flock`) for the moment of a check, holds the status found
//! before enabling; [`USERS_FILE`] is locked shared by every executor that
//! relies on the audit, for as long as it does. One leaving drops its
//! shared lock and, under the exclusive one, tries to lock the users' file
//! exclusively without waiting: only the last succeeds, and it restores
//! the status kept. A crash leaves the audit on and the status kept,
//! which the next executor to start relies on and later restores.
//!
//! Enabled with: no rules (none is added), a rate limit ([`RATE_LIMIT`]
//! records per second, past which the kernel drops records and counts
//! them lost), a backlog of [`BACKLOG_LIMIT`], and no wait for room
//! (`backlog_wait_time` 0: a task making a record never sleeps for the
//! queue; the record is dropped instead).

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::sandbox::audit::{self, mask, Status};

/// Locked for a check; holds the status found before enabling.
pub const LOCK_FILE: &str = "/run/ongrid/.audit.lock";
/// Locked shared by every executor relying on the audit.
pub const USERS_FILE: &str = "/run/ongrid/.audit-users.lock";
/// Records per second while the executor holds the audit on.
pub const RATE_LIMIT: u32 = 5000;
/// Records queued in the kernel at most.
pub const BACKLOG_LIMIT: u32 = 8192;
const FIELDS: u32 =
    mask::ENABLED | mask::RATE_LIMIT | mask::BACKLOG_LIMIT | mask::BACKLOG_WAIT_TIME;

/// This executor relies on the audit being on; dropping it restores the
/// status kept when no other executor does.
#[derive(Debug)]
pub struct Enabled {
    /// The shared lock on [`USERS_FILE`].
    user: Option<Flock<File>>,
}

/// Opens (creating it) the coordination file at `path`: never through a
/// symlink, and only a regular file of the executor's own user with no
/// other link. Another
/// user may create entries in `/run/ongrid` (skilld's socket): a file or
/// link planted there must not be truncated and written as root, nor its
/// text restored as the audit's status.
fn open(path: &str) -> Result<File, String> {
    if let Some(dir) = Path::new(path).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let file = std::fs::OpenOptions::new()
        .mode(0o600)
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("{path}: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("{path}: {e}"))?;
    let own = crate::run::plan::euid();
    // One link: a hard link planted to a file of the same user elsewhere
    // would be truncated and written too.
    if !meta.file_type().is_file() || meta.uid() != own || meta.nlink() != 1 {
        return Err(format!("{path}: not a regular file of uid {own} with one link; remove it"));
    }
    Ok(file)
}

fn lock(path: &str, how: FlockArg) -> Result<Flock<File>, String> {
    Flock::lock(open(path)?, how).map_err(|(_, e)| format!("{path}: {e}"))
}

/// The status kept in the lock file, if any.
fn kept(file: &mut File) -> Option<Status> {
    let mut text = String::new();
    let _ = file.rewind();
    let _ = file.read_to_string(&mut text);
    let v: Vec<u32> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    match v[..] {
        [enabled, rate_limit, backlog_limit, backlog_wait_time] => {
            Some(Status { enabled, rate_limit, backlog_limit, lost: 0, backlog_wait_time })
        }
        _ => None,
    }
}

fn keep(file: &mut File, s: Option<&Status>) {
    let _ = file.set_len(0);
    let _ = file.rewind();
    if let Some(s) = s {
        let line =
            format!("{} {} {} {}\n", s.enabled, s.rate_limit, s.backlog_limit, s.backlog_wait_time);
        let _ = file.write_all(line.as_bytes());
    }
    let _ = file.sync_data();
}

impl Enabled {
    /// Relies on the audit: enables it when it is off and no status is
    /// kept (another executor's enabling is relied on as it is).
    ///
    /// # Errors
    ///
    /// Why it could not: the files, or `AUDIT_SET` refused.
    pub fn take() -> Result<Self, String> {
        let mut guard = lock(LOCK_FILE, FlockArg::LockExclusive)?;
        let user = lock(USERS_FILE, FlockArg::LockShared)?;
        let now = audit::status().map_err(|e| e.to_string())?;
        if now.enabled == 0 {
            let on = Status {
                enabled: 1,
                rate_limit: RATE_LIMIT,
                backlog_limit: now.backlog_limit.max(BACKLOG_LIMIT),
                lost: 0,
                backlog_wait_time: 0,
            };
            audit::set(&on, FIELDS).map_err(|e| format!("enabling the kernel's audit: {e}"))?;
            // Switched off since an executor enabled it: the status it
            // kept is still the one to restore.
            if kept(&mut guard).is_none() {
                keep(&mut guard, Some(&now));
            }
            tracing::info!("kernel audit enabled for the runs' refusals (restored at exit)");
        }
        Ok(Enabled { user: Some(user) })
    }
}

impl Drop for Enabled {
    fn drop(&mut self) {
        let Ok(mut guard) = lock(LOCK_FILE, FlockArg::LockExclusive) else {
            return;
        };
        drop(self.user.take());
        // Only the last user gets the users' file exclusively.
        let Ok(_last) = lock(USERS_FILE, FlockArg::LockExclusiveNonblock) else {
            return;
        };
        if let Some(s) = kept(&mut guard) {
            match audit::set(&s, FIELDS) {
                Ok(()) => tracing::info!("kernel audit status restored"),
                Err(e) => tracing::warn!("restoring the kernel's audit status: {e}"),
            }
            keep(&mut guard, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_link_or_another_users_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep me").unwrap();
        let link = dir.path().join("link.lock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open(link.to_str().unwrap()).unwrap_err();
        assert!(e.contains("link.lock"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");

        let hard = dir.path().join("hard.lock");
        std::fs::hard_link(&target, &hard).unwrap();
        let e = open(hard.to_str().unwrap()).unwrap_err();
        assert!(e.contains("with one link"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");

        let fresh = dir.path().join("fresh.lock");
        let mut file = open(fresh.to_str().unwrap()).unwrap();
        keep(&mut file, None);
        assert!(fresh.is_file());

        if nix::unistd::geteuid().is_root() {
            let planted = dir.path().join("planted.lock");
            std::fs::write(&planted, "1 0 0 0\n").unwrap();
            std::os::unix::fs::chown(&planted, Some(65534), None).unwrap();
            let e = open(planted.to_str().unwrap()).unwrap_err();
            assert!(e.contains("not a regular file of uid 0"), "{e}");
        }
    }
}
