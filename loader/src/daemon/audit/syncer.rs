//! The background `fsync` of `audit_synchronous = "interval"` (see the
//! parent module's Durability section): the audit thread reports each
//! commit it did not sync, and the `ongrid-audit-sync` thread `fdatasync`s
//! the WAL file at most the interval after the oldest of them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus::IntCounter;

/// The background `fsync` of `audit_synchronous = "interval"`: the audit
/// thread reports each commit it did not sync; this thread `fsync`s the WAL
/// `interval` after the oldest of them, which covers them all.
#[derive(Default)]
pub(super) struct Syncer {
    state: Mutex<SyncState>,
    wake: Condvar,
}

#[derive(Default)]
struct SyncState {
    /// When the oldest commit not yet `fsync`ed was made.
    since: Option<Instant>,
    /// The audit thread is gone: sync what is left and stop.
    stop: bool,
}

impl Syncer {
    fn lock(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A commit was made and not `fsync`ed.
    pub(super) fn committed(&self) {
        let mut st = self.lock();
        if st.since.is_none() {
            st.since = Some(Instant::now());
            self.wake.notify_one();
        }
    }

    /// The WAL and the journal were `fsync`ed by a sync begun at `at`:
    /// every commit and line before it is on disk. One made since (while
    /// the sync ran) still waits for the timer.
    pub(super) fn synced(&self, at: Instant) {
        let mut st = self.lock();
        if st.since.is_some_and(|since| since <= at) {
            st.since = None;
        }
    }

    /// A commit or line waits for the timer's sync.
    #[cfg(test)]
    pub(super) fn pending(&self) -> bool {
        self.lock().since.is_some()
    }

    pub(super) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_one();
    }

    pub(super) fn run(
        &self,
        db: &Path,
        interval: Duration,
        syncs: &IntCounter,
        errors: &IntCounter,
    ) {
        let mut st = self.lock();
        loop {
            let Some(since) = st.since else {
                if st.stop {
                    return;
                }
                st = self.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            let due = since + interval;
            let now = Instant::now();
            if now < due && !st.stop {
                st =
                    self.wake.wait_timeout(st, due - now).unwrap_or_else(PoisonError::into_inner).0;
                continue;
            }
            st.since = None;
            drop(st);
            match sync_commits(db) {
                Ok(()) => syncs.inc(),
                Err(e) => {
                    errors.inc();
                    let wal = wal_path(db);
                    tracing::error!(path = %wal.display(), error = %e, "audit: cannot fsync the audit trail");
                }
            }
            st = self.lock();
        }
    }
}

/// `<db>-rows`, the journal of `db`.
pub(super) fn journal_path(db: &Path) -> PathBuf {
    let mut p = OsString::from(db.as_os_str());
    p.push("-rows");
    PathBuf::from(p)
}

/// `<db>-wal`, SQLite's write-ahead log of `db`.
pub(super) fn wal_path(db: &Path) -> PathBuf {
    let mut p = OsString::from(db.as_os_str());
    p.push("-wal");
    PathBuf::from(p)
}

/// `fdatasync` of the journal of `db` (`<db>-rows`, when there is one),
/// then of its WAL file ([`wal_path`]): every line and frame written to
/// them so far, by any descriptor, reaches the disk (Linux syncs the
/// inode). No WAL file (a checkpoint by the last connection removed it, or
/// the database could not be put in WAL mode): the database file itself is
/// synced, so what is counted as synced always was.
pub(super) fn sync_commits(db: &Path) -> std::io::Result<()> {
    match std::fs::File::open(journal_path(db)) {
        Ok(f) => f.sync_data()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    match std::fs::File::open(wal_path(db)) {
        Ok(f) => f.sync_data(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::File::open(db)?.sync_data(),
        Err(e) => Err(e),
    }
}
