//! Removing what a dead executor left: its runs' processes, cgroups and
//! directories.
//!
//! Every executor instance (one `Engine`) keeps its runs under
//! `<runtime_dir>/runs/<instance>/<slot>/<run>` and `.../ongrid/<instance>/<run>`
//! in each cgroup hierarchy (`host::instance`). The instance directory
//! holds `.guard`: the pid and start time of the process that cleans up
//! after the instance (its watchdog, else the executor itself). Two callers:
//!
//! - the watchdog, when its executor is gone: [`clean`] of its instance;
//! - every executor at start ([`sweep`]), under the runs lock: [`clean`] of
//!   each entry of `<runtime_dir>/runs/` whose guard is not alive (a
//!   watchdog killed too, or an entry of an older executor: a flat run
//!   directory named like its cgroup leaves), then of old, empty cgroups
//!   under `ongrid/` with no entry in `runs/` that are not another
//!   instance's (a crash between creating and filling one).
//!
//! [`clean`] kills the cgroup trees first (`cgroup.kill` on v2, which takes
//! every descendant, stopped ones too; else repeated `SIGKILL` of every
//! listed process), waits for them to empty, removes them bottom-up, then
//! removes the directory without following symlinks, however deep
//! ([`super::tree`]). Only this
//! runtime directory's entries are cleaned, and another instance's cgroups
//! are never touched by the age rule, so live runs of other executors on the
//! same host (another runtime directory, a test) are left alone.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::sandbox::cgroup::Hierarchies;

/// How long a clean waits for a killed cgroup to empty.
const EMPTY_WAIT: Duration = Duration::from_secs(2);

/// Prefix of instance names (`ex-<12 hex>`): the age rule spares them.
pub const INSTANCE_PREFIX: &str = "ex-";
/// Prefix of an instance directory being set up (renamed when complete).
pub const NEW_PREFIX: &str = ".new-";
/// The guard file of an instance directory.
pub const GUARD: &str = ".guard";
/// Prefix of the files naming a run's process group (no cgroup: not root).
pub const PGID_PREFIX: &str = ".pg-";

/// What a sweep or clean removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Run (or instance) directories removed.
    pub run_dirs: usize,
    /// cgroups removed.
    pub cgroups: usize,
    /// Processes sent `SIGKILL`, process groups killed, or cgroups killed
    /// with `cgroup.kill`.
    pub kills: usize,
}

impl std::ops::AddAssign for Swept {
    fn add_assign(&mut self, o: Swept) {
        self.run_dirs += o.run_dirs;
        self.cgroups += o.cgroups;
        self.kills += o.kills;
    }
}

/// The parents of run leaves (`.../ongrid`) in `h`.
pub fn bases(h: &Hierarchies) -> Vec<PathBuf> {
    [&h.v2, &h.v1_pids, &h.v1_memory].into_iter().flatten().cloned().collect()
}

fn procs(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn children(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// True while any process is in the cgroup tree `dir`.
fn populated(dir: &Path) -> bool {
    if let Ok(events) = fs::read_to_string(dir.join("cgroup.events")) {
        return events.lines().any(|l| l.trim() == "populated 1");
    }
    !procs(dir).is_empty() || children(dir).iter().any(|c| populated(c))
}

/// Kills every process of the cgroup tree `dir`; returns the kills made.
fn kill_tree(dir: &Path) -> usize {
    if fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.kill"))
        .and_then(|mut f| f.write_all(b"1"))
        .is_ok()
    {
        return 1;
    }
    let mut kills = 0;
    let until = Instant::now() + EMPTY_WAIT;
    loop {
        let mut pids = Vec::new();
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            pids.extend(procs(&d));
            stack.extend(children(&d));
        }
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

fn wait_empty(dir: &Path) {
    let until = Instant::now() + EMPTY_WAIT;
    while populated(dir) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Removes the cgroup tree `dir` bottom-up; returns the cgroups removed.
fn remove_tree(dir: &Path) -> usize {
    let mut removed = 0;
    for child in children(dir) {
        removed += remove_tree(&child);
    }
    let until = Instant::now() + EMPTY_WAIT;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return removed + 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return removed,
            Err(e) if Instant::now() >= until => {
                tracing::warn!("cgroup {}: cannot remove: {e}", dir.display());
                return removed;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// `path` is a directory of the executor's own user (a run directory handed
/// to the run-as user is not: what a skill wrote is never trusted).
fn own_dir(path: &Path) -> bool {
    fs::symlink_metadata(path)
        .is_ok_and(|m| m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw())
}

/// The process groups an instance recorded for its runs without a cgroup.
fn recorded_pgids(dir: &Path) -> Vec<i32> {
    if !own_dir(dir) {
        return Vec::new();
    }
    fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| {
                    e.file_name().to_str()?.strip_prefix(PGID_PREFIX)?.parse::<i32>().ok()
                })
                .filter(|pgid| *pgid > 1)
                .collect()
        })
        .unwrap_or_default()
}

/// Start time (clock ticks since boot) of `pid`, field 22 of its stat;
/// `None` when it is gone or a zombie (a killed watchdog whose parent died
/// too stays a zombie where PID 1 does not reap, with its start time).
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 (state) on; start time is field 22.
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// True when the instance directory `dir` has a guard naming a live
/// process (same pid and start time).
pub fn guard_alive(dir: &Path) -> bool {
    if !own_dir(dir) {
        return false;
    }
    let guard = dir.join(GUARD);
    let Ok(meta) = fs::symlink_metadata(&guard) else { return false };
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return false;
    }
    let text = fs::read_to_string(&guard).unwrap_or_default();
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next()) {
        (Some(Ok(pid)), Some(Ok(start))) => i32::try_from(pid)
            .ok()
            .filter(|p| *p > 0)
            .and_then(start_time)
            .is_some_and(|s| s == start),
        _ => false,
    }
}

/// Kills and removes everything named `name`: the cgroup trees
/// `<base>/<name>`, the process groups recorded in `<runs>/<name>`, then
/// the entry `<runs>/<name>` itself. Every failure is logged.
pub fn clean(runs: &Path, name: &str, bases: &[PathBuf]) -> Swept {
    let mut swept = Swept::default();
    let entry = runs.join(name);
    let trees: Vec<PathBuf> = bases.iter().map(|b| b.join(name)).filter(|d| d.is_dir()).collect();
    for dir in &trees {
        swept.kills += kill_tree(dir);
    }
    for pgid in recorded_pgids(&entry) {
        if kill(Pid::from_raw(-pgid), Signal::SIGKILL).is_ok() {
            swept.kills += 1;
        }
    }
    for dir in &trees {
        wait_empty(dir);
        swept.cgroups += remove_tree(dir);
    }
    if fs::symlink_metadata(&entry).is_ok() {
        match super::tree::remove_all(&entry) {
            Ok(()) => swept.run_dirs += 1,
            Err(e) => tracing::warn!("sweep: {}: cannot remove: {e}", entry.display()),
        }
    }
    swept
}

fn older_than(meta: &fs::Metadata, min_age: Duration) -> bool {
    meta.modified()
        .ok()
        .and_then(|m| SystemTime::now().duration_since(m).ok())
        .is_some_and(|age| age >= min_age)
}

/// Sweeps `<runtime_dir>/runs` and the cgroups under `bases` (see the
/// module docs). Every failure is logged and the sweep goes on.
pub fn sweep(runtime_dir: &Path, bases: &[PathBuf], min_age: Duration) -> Swept {
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
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        let path = entry.path();
        if name.starts_with(NEW_PREFIX) {
            // An instance being set up, or one that died doing so.
            let stale = fs::symlink_metadata(&path).is_ok_and(|m| older_than(&m, min_age));
            if stale && super::tree::remove_all(&path).is_ok() {
                swept.run_dirs += 1;
            }
            continue;
        }
        if guard_alive(&path) {
            continue;
        }
        let s = clean(&runs, &name, bases);
        if s != Swept::default() {
            tracing::warn!("sweep: removed {} left by a dead executor", path.display());
        }
        swept += s;
    }
    // Empty, old leaves with no entry in runs/ (not another instance's).
    for base in bases {
        let Ok(entries) = fs::read_dir(base) else { continue };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with(INSTANCE_PREFIX)
                || fs::symlink_metadata(runs.join(&name)).is_ok()
            {
                continue;
            }
            let dir = entry.path();
            let Ok(meta) = fs::symlink_metadata(&dir) else { continue };
            if meta.is_dir() && older_than(&meta, min_age) && !populated(&dir) {
                swept.cgroups += remove_tree(&dir);
            }
        }
    }
    if swept != Swept::default() {
        tracing::warn!(
            "sweep: removed {} run directories and {} cgroups left by a dead executor ({} kills)",
            swept.run_dirs,
            swept.cgroups,
            swept.kills
        );
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zombie has no start time: a guard naming one is dead. The zombie's
    /// parent is a `sleep` that never waits (the shell has exec'd it by the
    /// time the child exits), so neither the shell nor other tests of this
    /// binary reaping "any child" can take it away before it is looked at.
    #[test]
    fn a_zombie_has_no_start_time() {
        use std::io::BufRead;
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(start_time(me).is_some());
        let mut child = std::process::Command::new("/bin/sh")
            // The child outlives the shell's exec by seconds: a shell that
            // reaps finished jobs before exec (under load) cannot take it.
            .args(["-c", "/bin/sleep 2 & echo $!; exec sleep 20"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let pid: i32 = line.trim().parse().unwrap();
        let zombie = || {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
        };
        let until = Instant::now() + Duration::from_secs(10);
        while !zombie() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(zombie(), "{pid} did not become a zombie");
        assert_eq!(start_time(pid), None);
        let _ = child.kill();
        let _ = child.wait();
    }
}
