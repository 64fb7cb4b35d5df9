//! `report_denials = "on"`: the kernel's audit enabled by the executor
//! when it is off, and restored by the last executor of the host that
//! uses it.
//!
//! The status found is kept in [`STATE_FILE`], which every executor that
//! relies on it holds a shared `flock` on; one leaving takes the lock
//! exclusively (without waiting): only the last gets it, and it restores
//! the status kept and removes the file. A restart of the only executor
//! therefore disables and enables again; a crash leaves the audit on and
//! the file behind, which the next start finds and keeps.
//!
//! Enabled with: no rules (none is added), a rate limit
//! ([`RATE_LIMIT`] records per second, past which the kernel drops
//! records and counts them lost), a backlog of [`BACKLOG_LIMIT`], and no
//! wait for room (`backlog_wait_time` 0: a task making a record never
//! sleeps for the queue; the record is dropped instead).

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::sandbox::audit::{self, mask, Status};

/// Where the status found before enabling is kept.
pub const STATE_FILE: &str = "/run/ongrid/audit-status";
/// Records per second while the executor holds the audit on.
pub const RATE_LIMIT: u32 = 2000;
/// Records queued in the kernel at most.
pub const BACKLOG_LIMIT: u32 = 8192;
const FIELDS: u32 =
    mask::ENABLED | mask::RATE_LIMIT | mask::BACKLOG_LIMIT | mask::BACKLOG_WAIT_TIME;

/// The executor relies on the audit being on; dropping it restores the
/// status kept when no other executor does.
#[derive(Debug)]
pub struct Enabled {
    file: Flock<File>,
}

impl Enabled {
    /// Enables the audit (found as `found`) unless the file says another
    /// executor did; holds the file shared.
    ///
    /// # Errors
    ///
    /// Why it could not: the file, or `AUDIT_SET` refused.
    pub fn take(found: Status) -> Result<Self, String> {
        let path = Path::new(STATE_FILE);
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| format!("{STATE_FILE}: {e}"))?;
        let mut file = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, e)| format!("{STATE_FILE}: {e}"))?;
        let mut kept = String::new();
        let _ = file.read_to_string(&mut kept);
        let now = audit::status().map_err(|e| e.to_string())?;
        if kept.trim().is_empty() && now.enabled == 0 {
            let on = Status {
                enabled: 1,
                rate_limit: RATE_LIMIT,
                backlog_limit: found.backlog_limit.max(BACKLOG_LIMIT),
                lost: 0,
                backlog_wait_time: 0,
            };
            audit::set(&on, FIELDS).map_err(|e| format!("enabling the kernel's audit: {e}"))?;
            let line = format!(
                "{} {} {} {}\n",
                found.enabled, found.rate_limit, found.backlog_limit, found.backlog_wait_time
            );
            let _ = file.rewind();
            let _ = file.write_all(line.as_bytes());
            let _ = file.sync_data();
            tracing::info!("kernel audit enabled for the runs' refusals (restored at exit)");
        }
        file.relock(FlockArg::LockShared).map_err(|e| format!("{STATE_FILE}: {e}"))?;
        Ok(Enabled { file })
    }
}

impl Drop for Enabled {
    fn drop(&mut self) {
        // Only the last holder gets the lock exclusively.
        if self.file.relock(FlockArg::LockExclusiveNonblock).is_err() {
            return;
        }
        let mut kept = String::new();
        let _ = self.file.rewind();
        let _ = self.file.read_to_string(&mut kept);
        let v: Vec<u32> = kept.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        if let [enabled, rate_limit, backlog_limit, backlog_wait_time] = v[..] {
            let s = Status { enabled, rate_limit, backlog_limit, lost: 0, backlog_wait_time };
            match audit::set(&s, FIELDS) {
                Ok(()) => tracing::info!("kernel audit status restored"),
                Err(e) => tracing::warn!("restoring the kernel's audit status: {e}"),
            }
        }
        let _ = std::fs::remove_file(STATE_FILE);
        let _ = self.file.set_len(0);
    }
}
