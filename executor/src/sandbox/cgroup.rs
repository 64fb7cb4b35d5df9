//! The run's cgroups: whole-tree kill and the pids/memory bounds.
//!
//! A v2 leaf (`<v2 mount>/ongrid/<id>`) gives `cgroup.kill`; when the v2
//! hierarchy also offers the `pids` and `memory` controllers (systemd hosts
//! with `Delegate=yes`) the bounds go there too. Otherwise the bounds come
//! from v1 `pids` and `memory` leaves (this dev machine). The child joins
//! every leaf itself by writing "0" to pre-opened `cgroup.procs` files.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use policy::report::CgroupReport;

pub(crate) use self::hierarchies::{raw_own_v2_path, v2_mount};
pub use self::hierarchies::{runs_parent, Hierarchies, SUPERVISOR};

mod hierarchies;

/// A cgroup step failed.
#[derive(Debug, thiserror::Error)]
#[error("cgroup {path}: cannot {what}")]
pub struct CgroupError {
    /// The file or directory.
    pub path: PathBuf,
    /// What was being done.
    pub what: &'static str,
    /// The cause.
    #[source]
    pub source: io::Error,
}

/// Charges a reused v1 memory leaf may keep from earlier runs (reclaimable
/// kernel objects, page cache; ~140 KiB per trivial run here) before the
/// janitor empties it: a run starts with at most this much, and at most
/// 1/[`LEFTOVER_SHARE`] of its `memory_bytes`, taken (a run with a smaller
/// bound empties the leaf itself, [`RunCgroup::set_limits`]).
///
/// Emptying (`memory.force_empty`) drains every CPU's LRU caches
/// (`lru_add_drain_all`, work queued on each CPU and waited for) and runs
/// a reclaim pass. At 1 MiB it came every ~7 runs and the janitor fell
/// behind under 8 clients (a third of the runs recycled their slot
/// themselves); at 8 MiB it keeps up.
pub const FORCE_EMPTY_ABOVE: u64 = 8 << 20;

/// See [`FORCE_EMPTY_ABOVE`]: 1/64, under 2 % of a run's memory bound.
pub const LEFTOVER_SHARE: u64 = 64;

/// The leaves of one run.
#[derive(Debug)]
pub struct RunCgroup {
    v2: Option<PathBuf>,
    pids: Option<PathBuf>,
    memory: Option<PathBuf>,
    procs: Vec<OwnedFd>,
    /// `cgroup.kill` of the v2 leaf, opened with the leaf (a run kills its
    /// tree at least twice).
    kill_file: Option<fs::File>,
    /// The v2 leaf carries the bounds.
    v2_limits: bool,
    /// The v1 memory leaf has `memory.memsw.limit_in_bytes`.
    memsw: bool,
    /// `(memory_bytes, max_pids)` as last written.
    limits: Option<(u64, u32)>,
    /// The OOM kill count of the memory leaf when this run got it (not 0
    /// when the leaf served an earlier run: [`RunCgroup::recycle`]).
    oom_base: u64,
    /// The v2 leaf was seen unpopulated since this run began: no process
    /// of the run is left, and none can come (nothing joins an empty leaf
    /// but what the executor puts there), so it is not read again; the
    /// next run's [`RunCgroup::recycle`] clears it.
    emptied: AtomicBool,
    /// The OOM kill count read once [`RunCgroup::emptied`] was set (so the
    /// run's last), or [`u64::MAX`]: the next run's baseline without
    /// another read.
    oom_final: AtomicU64,
    /// Files read or reset after every run, opened on first use and kept
    /// while the leaves serve runs ([`Kept`]).
    kept: KeptFiles,
    /// For the run report.
    pub report: CgroupReport,
}

/// A cgroup file opened once and used again for every run its leaf serves:
/// a reused leaf is read and reset after each run, and an `open`/`close`
/// through kernfs (a path walk per call) cost more than the read itself.
/// Reads start at offset 0 each time (`pread`), which makes kernfs show the
/// file afresh. Not for v1 `cgroup.procs`, whose listing an open file keeps
/// cached for a while: that one is always opened anew.
#[derive(Debug, Default)]
struct Kept(OnceLock<Option<fs::File>>);

impl Kept {
    fn file(&self, path: impl FnOnce() -> PathBuf, write: bool) -> Option<&fs::File> {
        self.0
            .get_or_init(|| {
                let file = fs::OpenOptions::new().read(!write).write(write).open(path()).ok()?;
                Some(crate::host::fdtable::lift_file(file))
            })
            .as_ref()
    }

    /// The whole file, read from offset 0.
    fn read(&self, path: impl FnOnce() -> PathBuf) -> Option<String> {
        read_whole(self.file(path, false)?)
    }

    /// Writes `value` (cgroup control files take each write whole, at any
    /// offset).
    fn write(&self, path: impl FnOnce() -> PathBuf, value: &str) -> io::Result<()> {
        let mut file = self.file(path, true).ok_or_else(|| io::Error::other("cannot open"))?;
        file.write_all(value.as_bytes())
    }
}

/// The whole of a cgroup file, from offset 0. A cgroup file is shown in
/// one piece (one `seq_show` into a buffer that grows to fit it), so a
/// read returns all of it up to the buffer's size and a short read is its
/// end: the `pread` that would meet EOF (which makes kernfs show the file
/// again to reach the offset) is not made. (Not so for `seq_file`s of many
/// records, such as `/proc/self/mountinfo`, which may stop at a page.)
fn read_whole(file: &fs::File) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        let n = file.read_at(buf.get_mut(len..)?, len as u64).ok()?;
        len += n;
        if len < buf.len() {
            buf.truncate(len);
            return String::from_utf8(buf).ok();
        }
        buf.resize(buf.len() * 2, 0);
    }
}

/// The [`Kept`] files of a run's leaves.
#[derive(Debug, Default)]
struct KeptFiles {
    /// v2 `cgroup.events` (`populated`).
    events: Kept,
    /// v2 `memory.events` or v1 `memory.oom_control` (`oom_kill`).
    oom: Kept,
    /// v1 `memory.usage_in_bytes`.
    usage: Kept,
    /// v1 resets: `memory.max_usage_in_bytes`, `memory.failcnt`, and the
    /// `memsw` pair.
    max_usage: Kept,
    failcnt: Kept,
    memsw_max_usage: Kept,
    memsw_failcnt: Kept,
}

fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError {
        path: path.to_owned(),
        what: "write",
        source,
    })
}

impl RunCgroup {
    /// Creates the leaves named `id` and sets the bounds.
    ///
    /// # Errors
    ///
    /// [`CgroupError`]; leaves already made are removed.
    pub fn create(
        h: &Hierarchies,
        id: &str,
        memory_bytes: u64,
        max_pids: u32,
    ) -> Result<Self, CgroupError> {
        let mut cg = RunCgroup::unmade();
        let made = cg.make(h, id, memory_bytes, max_pids);
        match made {
            Ok(()) => Ok(cg),
            Err(e) => {
                cg.remove();
                Err(e)
            }
        }
    }

    /// No leaf yet: what [`RunCgroup::make`] fills in.
    fn unmade() -> Self {
        RunCgroup {
            v2: None,
            pids: None,
            memory: None,
            procs: Vec::new(),
            kill_file: None,
            v2_limits: false,
            memsw: false,
            limits: None,
            oom_base: 0,
            emptied: AtomicBool::new(false),
            oom_final: AtomicU64::new(u64::MAX),
            kept: KeptFiles::default(),
            report: CgroupReport::default(),
        }
    }

    fn make(
        &mut self,
        h: &Hierarchies,
        id: &str,
        memory_bytes: u64,
        max_pids: u32,
    ) -> Result<(), CgroupError> {
        let mkdir = |base: &Path| {
            let dir = base.join(id);
            fs::create_dir(&dir).map(|()| dir.clone()).map_err(|source| CgroupError {
                path: dir,
                what: "create",
                source,
            })
        };
        if let Some(base) = &h.v2 {
            let dir = mkdir(base)?;
            self.v2 = Some(dir.clone());
            self.kill_file = fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.kill"))
                .ok()
                .map(crate::host::fdtable::lift_file);
            self.report.kill = Some("v2".into());
            if h.v2_limits {
                self.v2_limits = true;
                let _ = fs::write(dir.join("memory.swap.max"), "0");
                self.report.pids = Some("v2".into());
                self.report.memory = Some("v2".into());
            }
        }
        if let Some(base) = &h.v1_pids {
            self.pids = Some(mkdir(base)?);
            self.report.pids = Some("v1".into());
        }
        if let Some(base) = &h.v1_memory {
            let dir = mkdir(base)?;
            self.memsw = dir.join("memory.memsw.limit_in_bytes").exists();
            self.memory = Some(dir);
            self.report.memory = Some("v1".into());
        }
        self.set_limits(memory_bytes, max_pids)?;
        for dir in self.leaves() {
            let path = dir.join("cgroup.procs");
            let f = fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|source| CgroupError { path, what: "open", source })?;
            // Above the floor: the child writes to it before it leaves the
            // shared table (host::fdtable).
            self.procs.push(crate::host::fdtable::lift(OwnedFd::from(f)));
        }
        Ok(())
    }

    /// Sets the pids and memory bounds (before any process joins); writes
    /// only what differs from the bounds already set.
    ///
    /// # Errors
    ///
    /// [`CgroupError`] naming the file.
    pub fn set_limits(&mut self, memory_bytes: u64, max_pids: u32) -> Result<(), CgroupError> {
        let share = memory_bytes / LEFTOVER_SHARE;
        if share < FORCE_EMPTY_ABOVE {
            self.empty_above(share)?;
        }
        if self.limits == Some((memory_bytes, max_pids)) {
            return Ok(());
        }
        self.limits = None;
        let (mem, pids) = (memory_bytes.to_string(), max_pids.to_string());
        if let Some(dir) = self.v2.as_ref().filter(|_| self.v2_limits) {
            write_file(&dir.join("pids.max"), &pids)?;
            write_file(&dir.join("memory.max"), &mem)?;
        }
        if let Some(dir) = &self.pids {
            write_file(&dir.join("pids.max"), &pids)?;
        }
        if let Some(dir) = &self.memory {
            let limit = dir.join("memory.limit_in_bytes");
            if self.memsw {
                // The kernel keeps memsw >= the limit: a lower bound goes to
                // the limit first, a higher one (a leaf that served a
                // smaller run) to memsw first.
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if fs::write(&limit, &mem).is_ok() {
                    write_file(&memsw, &mem)?;
                } else {
                    write_file(&memsw, &mem)?;
                    write_file(&limit, &mem)?;
                }
            } else {
                write_file(&limit, &mem)?;
            }
        }
        self.limits = Some((memory_bytes, max_pids));
        Ok(())
    }

    /// The run's cgroup v2 leaf, where its egress programs attach.
    pub fn v2_leaf(&self) -> Option<&Path> {
        self.v2.as_deref()
    }

    pub(crate) fn leaves(&self) -> Vec<PathBuf> {
        [&self.v2, &self.pids, &self.memory].into_iter().flatten().cloned().collect()
    }

    /// The `cgroup.procs` fds the child writes "0" to.
    pub fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// The leaf that lists every process of the run.
    fn listing(&self) -> Option<&PathBuf> {
        self.v2.as_ref().or(self.pids.as_ref()).or(self.memory.as_ref())
    }

    /// Pids currently in the run (none when they cannot be listed).
    pub fn pids(&self) -> Vec<i32> {
        self.listed().unwrap_or_default()
    }

    /// Pids currently in the run; `None` without a listing leaf or when
    /// its `cgroup.procs` cannot be read (never taken for "no process").
    fn listed(&self) -> Option<Vec<i32>> {
        let procs = fs::read_to_string(self.listing()?.join("cgroup.procs")).ok()?;
        Some(procs.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Thread ids now in the run, of every process: the v2 leaf's
    /// `cgroup.threads`, else a v1 leaf's `tasks`, read to its end (a
    /// listing of many records comes a page per read); `None` without a
    /// leaf or when the file cannot be read.
    pub fn threads(&self) -> Option<Vec<i32>> {
        let file = match (&self.v2, self.pids.as_ref().or(self.memory.as_ref())) {
            (Some(v2), _) => v2.join("cgroup.threads"),
            (None, Some(v1)) => v1.join("tasks"),
            (None, None) => return None,
        };
        let text = fs::read_to_string(file).ok()?;
        Some(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// True when the run can be killed as a whole.
    pub fn can_kill(&self) -> bool {
        self.listing().is_some()
    }

    /// Sends `SIGTERM` then `SIGCONT` (so stopped processes see it) to
    /// every process of the run.
    pub fn terminate(&self) {
        for pid in self.pids() {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        }
    }

    /// Kills every process of the run: `cgroup.kill` on v2, else repeated
    /// `SIGKILL` of the listed processes (bounded by pids.max).
    pub fn kill(&self) {
        if let Some(mut f) = self.kill_file.as_ref() {
            if f.write_all(b"1").is_ok() {
                return;
            }
        }
        if let Some(dir) = &self.v2 {
            if fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.kill"))
                .and_then(|mut f| f.write_all(b"1"))
                .is_ok()
            {
                return;
            }
        }
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// Waits up to `within` for the run to have no process left.
    pub fn wait_empty(&self, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            if self.is_empty() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// True when no process is left in the run: the v2 leaf's
    /// `cgroup.events` says `populated 0`; without a v2 leaf (or when it
    /// cannot be read), the listing leaf's `cgroup.procs` was read and is
    /// empty. A file that cannot be read never counts as empty.
    fn is_empty(&self) -> bool {
        self.v2_empty().unwrap_or_else(|| self.listed().is_some_and(|p| p.is_empty()))
    }

    /// True when the v2 leaf was read as `populated 0` since the run began
    /// (read now unless seen already): what lets the kill at the main
    /// process's exit and the recycle's reads be skipped. `false` without
    /// a v2 leaf or when its `cgroup.events` cannot be read.
    pub fn seen_empty(&self) -> bool {
        self.v2_empty() == Some(true)
    }

    /// [`RunCgroup::v2_unpopulated`], remembered once it said `true`
    /// ([`RunCgroup::emptied`]).
    fn v2_empty(&self) -> Option<bool> {
        if self.emptied.load(Ordering::Acquire) {
            return Some(true);
        }
        let empty = self.v2_unpopulated()?;
        if empty {
            self.emptied.store(true, Ordering::Release);
        }
        Some(empty)
    }

    /// Whether the v2 leaf's `cgroup.events` says `populated 0`; `None`
    /// without a v2 leaf or when the file cannot be read.
    fn v2_unpopulated(&self) -> Option<bool> {
        let dir = self.v2.as_ref()?;
        let events = self.kept.events.read(|| dir.join("cgroup.events"))?;
        Some(events.lines().any(|l| l.trim() == "populated 0"))
    }

    /// The memory leaf's OOM kill count (`oom_kill` of v2 `memory.events`
    /// or v1 `memory.oom_control`); 0 without one.
    fn oom_count(&self) -> u64 {
        let v2 = self.report.memory.as_deref() == Some("v2");
        let text = match (&self.v2, &self.memory) {
            (Some(dir), _) if v2 => self.kept.oom.read(|| dir.join("memory.events")),
            (_, Some(dir)) => self.kept.oom.read(|| dir.join("memory.oom_control")),
            _ => None,
        };
        text.unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse::<u64>().ok()))
            .unwrap_or(0)
    }

    /// True if and only if the kernel OOM-killed a process of the run (the
    /// leaf's count went up since the run got it).
    pub fn oom_killed(&self) -> bool {
        let count = self.oom_count();
        if self.emptied.load(Ordering::Acquire) {
            self.oom_final.store(count, Ordering::Release);
        }
        count > self.oom_base
    }

    /// Makes the leaves of a finished run ready for another run, off the
    /// runs' critical path (making and removing memory cgroups is the
    /// dearer part of a run slot). Only when every leaf is provably empty:
    /// the v2 leaf says `populated 0` (no process in it or below; without
    /// a v2 leaf, the v1 leaves list no process), and the v1 memory leaf,
    /// once its charges (kernel objects and page cache the runs left) pass
    /// [`FORCE_EMPTY_ABOVE`], accepts `memory.force_empty` (refused while a
    /// task is in it) and gives them back (paid every few dozen runs, not
    /// every run); its peak and fail counters are reset, and the OOM kill
    /// count is taken as the next run's baseline. The bounds are rewritten
    /// by the next run's [`RunCgroup::set_limits`] when they differ, and
    /// are otherwise the same values. `false`: the leaves must be removed
    /// instead.
    pub fn recycle(&mut self) -> bool {
        if self.leaves().is_empty() || self.procs.len() != self.leaves().len() {
            return false;
        }
        if self.v2.is_some() {
            // `populated 0` of the v2 leaf covers the v1 leaves too: every
            // process of the run is in every leaf (the child joins the v2
            // leaf first and exits if a later join fails, descendants inherit
            // every membership, and no skill can write a `cgroup.procs`), so
            // the v1 listings (an open, a pid list and a close each) are not
            // read. Seen by the run's end already: not read again.
            if !self.seen_empty() {
                return false;
            }
        } else {
            // Opened anew: see `Kept`.
            for dir in [&self.pids, &self.memory].into_iter().flatten() {
                match fs::read_to_string(dir.join("cgroup.procs")) {
                    Ok(procs) if procs.trim().is_empty() => {}
                    _ => return false,
                }
            }
        }
        // What no reclaim gives back (tmpfs pages without swap: the
        // kernel's `force_empty` succeeds all the same, and v2 has no such
        // file) would start the next run over its own bound: such a leaf
        // is removed instead, which hands its charges to the parent.
        let Ok(emptied) = self.empty_above(FORCE_EMPTY_ABOVE) else { return false };
        // v1: read again once emptied (it was under the bound otherwise);
        // v2: over the bound, what reclaim gives back (page cache, kernel
        // objects) is asked back first.
        let over = || self.charge().filter(|&c| c > FORCE_EMPTY_ABOVE);
        if emptied && over().is_some() {
            return false;
        }
        if let (None, Some(charge), Some(dir)) = (&self.memory, over(), &self.v2) {
            let _ = write_file(&dir.join("memory.reclaim"), &charge.to_string());
            if over().is_some() {
                return false;
            }
        }
        if let Some(dir) = &self.memory {
            let k = &self.kept;
            let mut resets =
                vec![(&k.max_usage, "memory.max_usage_in_bytes"), (&k.failcnt, "memory.failcnt")];
            if self.memsw {
                resets.push((&k.memsw_max_usage, "memory.memsw.max_usage_in_bytes"));
                resets.push((&k.memsw_failcnt, "memory.memsw.failcnt"));
            }
            if resets.iter().any(|(kept, file)| kept.write(|| dir.join(file), "0").is_err()) {
                return false;
            }
        }
        self.oom_base = match self.oom_final.swap(u64::MAX, Ordering::AcqRel) {
            u64::MAX => self.oom_count(),
            last => last,
        };
        self.emptied.store(false, Ordering::Release);
        true
    }

    /// What the leaves' memory holds: the v1 leaf's usage, else the v2
    /// leaf's `memory.current` (when its memory controller is on).
    pub(crate) fn charge(&self) -> Option<u64> {
        let text = match (&self.memory, &self.v2) {
            (Some(dir), _) => self.kept.usage.read(|| dir.join("memory.usage_in_bytes"))?,
            (None, Some(dir)) => fs::read_to_string(dir.join("memory.current")).ok()?,
            (None, None) => return None,
        };
        text.trim().parse().ok()
    }

    /// Gives back the v1 memory leaf's charges when they are above `bound`
    /// (or cannot be read): see [`FORCE_EMPTY_ABOVE`]. Refused by the
    /// kernel while a task is in the leaf. `true`: it was asked to.
    fn empty_above(&self, bound: u64) -> Result<bool, CgroupError> {
        let Some(dir) = &self.memory else { return Ok(false) };
        if self.charge().is_none_or(|u| u > bound) {
            write_file(&dir.join("memory.force_empty"), "0")?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Removes the leaves (retrying while the kernel finishes teardown).
    pub fn remove(&mut self) {
        self.procs.clear();
        self.kill_file = None;
        self.kept = KeptFiles::default();
        for dir in self.leaves() {
            for attempt in 0..200 {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if attempt < 199 => std::thread::sleep(Duration::from_millis(5)),
                    Err(e) => tracing::warn!("cgroup {}: cannot remove: {e}", dir.display()),
                }
            }
        }
        self.v2 = None;
        self.pids = None;
        self.memory = None;
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if !self.leaves().is_empty() {
            self.kill();
            self.remove();
        }
    }
}

#[cfg(test)]
mod tests;
