//! The start-up sweep: run directories and cgroups a crashed executor left.
//!
//! A run's directory (`<runtime_dir>/runs/<id>`) is created before its
//! cgroups (`.../ongrid/<id>` in each hierarchy) and removed after them, so
//! every run that was alive at a crash still has its directory. The sweep:
//!
//! 1. for every entry of `<runtime_dir>/runs/`: kills what is left in the
//!    cgroups named after it (`cgroup.kill` on v2, else repeated `SIGKILL`
//!    of `cgroup.procs`), removes those cgroups, then removes the entry
//!    without following symlinks (std's `remove_dir_all` works on directory
//!    fds with `O_NOFOLLOW`);
//! 2. removes every other cgroup under `ongrid/` that has no process and is
//!    older than `min_age` (a crash between creating and filling one).
//!
//! Only this executor's runtime directory is swept, and step 2 spares
//! populated or young cgroups, so another executor's live runs on the same
//! host (an `ongrid-executor run`, a test) are left alone.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cgroup::Hierarchies;

/// How long the sweep waits for a killed cgroup to empty.
const EMPTY_WAIT: Duration = Duration::from_secs(2);

/// What the sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Run directories removed.
    pub run_dirs: usize,
    /// cgroups removed.
    pub cgroups: usize,
    /// Processes sent `SIGKILL` (v1) or cgroups killed with `cgroup.kill` (v2).
    pub kills: usize,
}

fn bases(h: &Hierarchies) -> impl Iterator<Item = &PathBuf> {
    [&h.v2, &h.v1_pids, &h.v1_memory].into_iter().flatten()
}

fn procs(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Kills every process of the cgroup `dir`; returns the kills made.
fn kill_cgroup(dir: &Path) -> usize {
    let kill_file = dir.join("cgroup.kill");
    if kill_file.exists()
        && fs::OpenOptions::new()
            .write(true)
            .open(&kill_file)
            .and_then(|mut f| f.write_all(b"1"))
            .is_ok()
    {
        return 1;
    }
    let mut kills = 0;
    let until = Instant::now() + EMPTY_WAIT;
    loop {
        let pids = procs(dir);
        if pids.is_empty() || Instant::now() >= until {
            return kills;
        }
        for pid in pids {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                kills += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn remove_cgroup(dir: &Path) -> bool {
    let until = Instant::now() + EMPTY_WAIT;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return false,
            Err(e) if Instant::now() >= until => {
                tracing::warn!("sweep: cgroup {}: cannot remove: {e}", dir.display());
                return false;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Sweeps `runtime_dir` and the cgroups of `h` (see the module docs).
/// Every failure is logged and the sweep goes on.
pub fn sweep(runtime_dir: &Path, h: &Hierarchies, min_age: Duration) -> Swept {
    let mut swept = Swept::default();
    let runs = runtime_dir.join("runs");
    let entries = match fs::read_dir(&runs) {
        Ok(entries) => entries.filter_map(Result::ok).collect::<Vec<_>>(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            tracing::warn!("sweep: {}: cannot list: {e}", runs.display());
            Vec::new()
        }
    };
    for entry in entries {
        let name = entry.file_name();
        // Step 1: the run's cgroups first (their processes may be writing
        // into the directory), then the directory.
        for base in bases(h) {
            let dir = base.join(&name);
            if dir.is_dir() {
                swept.kills += kill_cgroup(&dir);
                if remove_cgroup(&dir) {
                    swept.cgroups += 1;
                }
            }
        }
        let path = entry.path();
        let removed = match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&path),
            Ok(_) => fs::remove_file(&path),
            Err(e) => Err(e),
        };
        match removed {
            Ok(()) => {
                swept.run_dirs += 1;
                tracing::warn!("sweep: removed run directory {} left by a crash", path.display());
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("sweep: {}: cannot remove: {e}", path.display()),
        }
    }
    // Step 2: empty, old leaves with no run directory.
    let now = SystemTime::now();
    for base in bases(h) {
        let Ok(entries) = fs::read_dir(base) else { continue };
        for entry in entries.filter_map(Result::ok) {
            let dir = entry.path();
            let Ok(meta) = fs::symlink_metadata(&dir) else { continue };
            let old = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|age| age >= min_age);
            if meta.is_dir() && old && procs(&dir).is_empty() && fs::remove_dir(&dir).is_ok() {
                swept.cgroups += 1;
            }
        }
    }
    if swept != Swept::default() {
        tracing::warn!(
            "sweep: removed {} run directories and {} cgroups left by a crash ({} kills)",
            swept.run_dirs,
            swept.cgroups,
            swept.kills
        );
    }
    swept
}
