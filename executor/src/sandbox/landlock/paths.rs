//! Paths opened `O_PATH` for rules: one at a time, or the system paths
//! every ruleset names, kept open for the process and watched for change.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use policy::path::is_within;

use super::{Rule, DEV_READ, ETC_READ, SYSTEM_READ_EXEC};
use crate::host;

/// A path opened `O_PATH` for a rule.
#[derive(Debug)]
pub(super) struct Opened {
    pub(super) fd: OwnedFd,
    pub(super) is_dir: bool,
    pub(super) ident: Option<Ident>,
}

/// What a rule's path named: device, inode, and whether a directory.
pub(super) type Ident = (u64, u64, bool);

pub(super) fn ident(meta: &std::fs::Metadata) -> Ident {
    (meta.dev(), meta.ino(), meta.is_dir())
}

pub(super) fn open_path(path: &Path) -> std::io::Result<Opened> {
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata().ok();
    let is_dir = meta.as_ref().is_some_and(std::fs::Metadata::is_dir);
    Ok(Opened { fd: file.into(), is_dir, ident: meta.as_ref().map(ident) })
}

/// Whether the file `opened` names lies beneath one of `grants` with
/// symlinks followed on both sides, and if not where it lies: the
/// descriptor's own path, as the kernel resolved it when it was opened, so
/// nothing can swap a link between this check and the rule.
pub(super) fn outside(opened: &Opened, grants: &[PathBuf]) -> Option<String> {
    let real = match std::fs::read_link(format!("/proc/self/fd/{}", opened.fd.as_raw_fd())) {
        Ok(real) => real,
        Err(e) => return Some(format!("its resolved path cannot be read: {e}")),
    };
    let beneath = |g: &PathBuf| std::fs::canonicalize(g).is_ok_and(|g| is_within(&real, &g));
    if grants.iter().any(beneath) {
        return None;
    }
    let grants: Vec<_> = grants.iter().map(|g| g.display().to_string()).collect();
    Some(format!("it resolves to {}, outside {}", real.display(), grants.join(", ")))
}

/// What identifies a directory's entries: any entry created, removed,
/// renamed over or replaced changes the directory's mtime (or the
/// directory itself is another inode).
pub(super) type Stamp = (u64, u64, i64, i64, i64, i64);

pub(super) fn stamp(dir: &Path) -> Option<Stamp> {
    std::fs::metadata(dir)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()))
}

/// The system paths of every ruleset (`SYSTEM_READ_EXEC`, `ETC_READ`,
/// `DEV_READ`, `/proc`, `/dev/null`), opened `O_PATH` once per process
/// instead of once per run (about 40 opens, stats and closes per spawn).
///
/// Landlock rules follow inodes, so a cached fd must still be the file the
/// path names: the snapshot watches the parent directory of each path (as
/// written and as resolved through symlinks, e.g. `/etc/resolv.conf` into
/// `/run/...`) with inotify, and is reopened from scratch as soon as any of
/// those directories changed (a package upgrade renaming a new
/// `/etc/ld.so.cache` into place, a new `resolv.conf`, a path that
/// appears). A check is one non-blocking `read` of the inotify descriptor
/// per run; a directory that cannot be watched (missing, or no inotify) is
/// compared by its stamp (a `statx`) instead.
#[derive(Debug)]
pub(super) struct SystemPaths {
    paths: HashMap<PathBuf, Option<Opened>>,
    /// Each parent directory, its stamp when opened, and whether it is
    /// watched.
    pub(super) stamps: Vec<(PathBuf, Option<Stamp>, bool)>,
    /// The watches (above the descriptor floor); any event means stale.
    /// Closed once stale: a stale snapshot may live on in the slots' cached
    /// rulesets, and inotify instances are few per user (root's are
    /// systemd's too).
    pub(super) watch: Mutex<Option<Inotify>>,
    /// An event was seen: stale for good (events are read once).
    stale: AtomicBool,
}

/// What changes a directory's entries or the directory itself: the events
/// whose absence the stamp's mtime, ctime and inode used to show.
fn watch_mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
}

pub(super) fn system_paths() -> impl Iterator<Item = &'static str> + Clone {
    SYSTEM_READ_EXEC.iter().chain(ETC_READ).chain(DEV_READ).copied().chain(["/proc", "/dev/null"])
}

impl SystemPaths {
    fn open() -> Self {
        Self::open_paths(system_paths().map(Path::new))
    }

    pub(super) fn open_paths<'a>(list: impl Iterator<Item = &'a Path> + Clone) -> Self {
        let mut dirs = BTreeSet::new();
        for path in list.clone() {
            dirs.extend(path.parent().map(Path::to_path_buf));
            if let Ok(real) = std::fs::canonicalize(path) {
                dirs.extend(real.parent().map(Path::to_path_buf));
            }
        }
        // Watched before the opens: a change after this is an event.
        let flags = InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC;
        let watch = Inotify::init(flags).ok().map(host::fdtable::lift_inotify);
        let watched: Vec<bool> = dirs
            .iter()
            .map(|d| watch.as_ref().is_some_and(|w| w.add_watch(d, watch_mask()).is_ok()))
            .collect();
        let mut paths = HashMap::new();
        for path in list {
            // Kept for the process's life: above the descriptor floor, so
            // children do not copy them (host::fdtable).
            let opened =
                open_path(path).ok().map(|o| Opened { fd: host::fdtable::lift(o.fd), ..o });
            paths.insert(path.to_path_buf(), opened);
        }
        // Stamps taken after the opens: a change in between shows next time.
        let stamps =
            dirs.into_iter().zip(watched).map(|(d, w)| (d.clone(), stamp(&d), w)).collect();
        SystemPaths { paths, stamps, watch: Mutex::new(watch), stale: AtomicBool::new(false) }
    }

    pub(super) fn fresh(&self) -> bool {
        if self.stale.load(Ordering::Relaxed) {
            return false;
        }
        {
            let mut watch = self.watch.lock().unwrap_or_else(PoisonError::into_inner);
            // Anything but "no event" (an event, an overflow, an error).
            let changed =
                watch.as_ref().is_some_and(|w| !matches!(w.read_events(), Err(Errno::EAGAIN)));
            if changed {
                self.stale.store(true, Ordering::Relaxed);
                *watch = None;
                return false;
            }
        }
        self.stamps.iter().all(|(dir, s, watched)| *watched || stamp(dir) == *s)
    }

    /// The process-wide snapshot, reopened when stale.
    pub(super) fn current() -> Arc<SystemPaths> {
        static CACHE: Mutex<Option<Arc<SystemPaths>>> = Mutex::new(None);
        let cached = CACHE.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(c) = cached.filter(|c| c.fresh()) {
            return c;
        }
        let opened = Arc::new(SystemPaths::open());
        let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
        // Another run may have stored a fresh one meanwhile: that one stays,
        // so runs share one snapshot (and the rulesets cached with it).
        if let Some(c) = cache.as_ref().filter(|c| c.fresh()) {
            return Arc::clone(c);
        }
        *cache = Some(Arc::clone(&opened));
        opened
    }

    /// `Some(None)`: a system path missing on this host; `None`: not a
    /// system path (opened per run).
    pub(super) fn get(&self, rule: &Rule) -> Option<Option<&Opened>> {
        if rule.explicit {
            return None;
        }
        self.paths.get(&rule.path).map(Option::as_ref)
    }
}
