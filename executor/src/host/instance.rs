//! One executor instance's share of the host, and what outlives it.
//!
//! Each [`crate::Engine`] (both `run` and `serve`) is an instance with a
//! random name `ex-<12 hex>`:
//!
//! - its runs' directories live in `<runtime_dir>/runs/<instance>/` (root's,
//!   mode 0711) and their cgroup leaves under `<base>/<instance>/` in each
//!   hierarchy, so one `cgroup.kill` of the v2 parent ends every run of the
//!   instance, stopped processes included;
//! - a **watchdog** outlives the executor: the executor binary re-executed
//!   (`/proc/self/exe watchdog ...`, spawned by std's `Command`, i.e.
//!   `posix_spawn`, with nothing but the read end of a pipe on its stdin;
//!   the executor keeps the write end, close-on-exec). It starts its own
//!   session, blocks SIGINT/SIGTERM/SIGHUP/SIGQUIT and reads. EOF without
//!   the executor's `done` first means the executor died (killed, or it
//!   exited without dropping its engine): the watchdog kills and removes
//!   everything of the instance ([`crate::host::sweep::clean`]), gives the runs
//!   tmpfs up if it was the last user, and exits. The dying executor's own
//!   users lock goes only after the kernel has closed the pipe, so the
//!   watchdog waits for it (bounded, 3 s) rather than seeing it as another
//!   user. Without cgroups (not root) it kills the process groups the
//!   executor recorded;
//! - `<runtime_dir>/runs/<instance>/.guard` names the watchdog (pid and
//!   start time): an instance whose guard is dead is swept by the next
//!   executor to start ([`crate::host::sweep::sweep`]);
//! - the runs tmpfs: as root, unless a tmpfs is mounted on
//!   `<runtime_dir>/runs` already (an earlier instance's, or the one
//!   ongrid-executor.service provides with `TemporaryFileSystem=`, as the
//!   hardened unit keeps no `CAP_SYS_ADMIN`), the first instance mounts one
//!   (`ongrid-runs`, nosuid, nodev, noexec). Files a run writes there are
//!   charged to the run's memory cgroup (memcg charges tmpfs pages, and
//!   the inodes and dentries of its files, to the cgroup of the task that
//!   makes them, v1 and v2), so a run's disk use is bounded by its
//!   `memory_bytes`, never the host's disk. So that no run can fill the
//!   tmpfs for the others, it is sized for every run slot's run at its
//!   memory bound ([`Config::runs_tmpfs_need`]: a ceiling, not a
//!   reservation) and counts no inodes of its own (`nr_inodes=0`); an
//!   earlier instance's smaller mount is grown, and a provided one that is
//!   smaller is reported in every run's `degraded`. Without a memory cgroup
//!   the tmpfs size (`runs_tmpfs_bytes`, default 1 GiB or a quarter of
//!   RAM) is what bounds all runs' files together. Every instance
//!   holds a shared lock on `.runs-users.lock` for its lifetime; the last
//!   one to leave (the exclusive lock taken under `.runs-mount.lock`)
//!   unmounts it, so temporary runtime directories are not left mounted.
//!
//! A normal end removes the instance's (empty) cgroup parents and directory
//! and gives the tmpfs up in [`Instance`]'s `Drop`, then writes `done` and
//! closes the pipe; the watchdog then exits at once.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg, OFlag};

use crate::config::Config;
use crate::host::sweep::{self, Swept, GUARD, INSTANCE_PREFIX, NEW_PREFIX, PGID_PREFIX};
use crate::sandbox::cgroup::Hierarchies;
use crate::sys;
use crate::sys::mount::TmpfsSize;

/// The hidden subcommand that runs the watchdog.
pub const WATCHDOG_COMMAND: &str = "watchdog";
/// Lock held (shared) by every live instance of a runtime directory.
const USERS_LOCK: &str = ".runs-users.lock";
/// Lock held (exclusive) around mounting, sweeping and unmounting.
const MOUNT_LOCK: &str = ".runs-mount.lock";
/// Guard-less entries and empty cgroups younger than this are spared by
/// the start-up sweep. Longer than any instance keeps an empty leaf it means
/// to use (the engine gives up a ready slot idle for 30 s).
pub const SWEEP_MIN_AGE: Duration = Duration::from_secs(60);
/// How long the watchdog of a killed executor waits for the users lock.
const DEATH_PATIENCE: Duration = Duration::from_secs(3);
/// Between two tries for the users lock.
const RELEASE_RETRY: Duration = Duration::from_millis(5);
/// What the executor writes to the watchdog's pipe once its instance is
/// cleaned and released (a normal end): the EOF that follows is not a death.
const DONE: &[u8] = b"done\n";

/// An executor instance (see the module docs).
#[derive(Debug)]
pub struct Instance {
    name: String,
    runtime: PathBuf,
    runs: PathBuf,
    dir: PathBuf,
    bases: Vec<PathBuf>,
    cgroups: Hierarchies,
    users: Option<Flock<File>>,
    watchdog: Option<OwnedFd>,
    notes: Vec<String>,
}

/// The instance could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("executor instance: {what} {}", .path.display())]
pub struct InstanceError {
    /// What was being done.
    pub what: &'static str,
    /// The path.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: io::Error,
}

fn err<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> InstanceError + 'p {
    move |source| InstanceError { what, path: path.to_owned(), source }
}

fn lock_file(path: &Path, create: bool) -> io::Result<File> {
    fs::OpenOptions::new()
        .read(true)
        .write(create)
        .create(create)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

fn flock(f: File, arg: FlockArg) -> io::Result<Flock<File>> {
    Flock::lock(f, arg).map_err(|(_, e)| io::Error::from(e))
}

/// `(fstype, source)` of the topmost mount on `path`, from mountinfo.
fn mount_at(path: &Path) -> Option<(String, String)> {
    let path = fs::canonicalize(path).ok()?;
    let want = path.to_str()?;
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let unescape = |s: &str| {
        s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
    };
    info.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let point = unescape(pre.split(' ').nth(4)?);
            let mut post = post.split(' ');
            Some((point, post.next()?.to_owned(), post.next()?.to_owned()))
        })
        .filter(|(point, _, _)| point == want)
        .map(|(_, fstype, source)| (fstype, source))
        .next_back()
}

/// True if a tmpfs is mounted on `runs` itself (mountinfo names the path as
/// a mount point, and `statfs` says tmpfs): the executor's own from an
/// earlier instance, or one the service manager provides
/// (`TemporaryFileSystem=` in ongrid-executor.service, which mounts it
/// without the executor needing `CAP_SYS_ADMIN`).
fn tmpfs_mounted_on(runs: &Path) -> bool {
    let point = mount_at(runs).is_some_and(|(fstype, _)| fstype == "tmpfs");
    let magic = nix::sys::statfs::statfs(runs)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    point && magic
}

/// Where a run's files go and what bounds them; `Err` is a degraded note.
/// With a memory cgroup per run (`memcg`) the tmpfs must hold every run
/// slot's run at its memory bound, inodes included, or one run could fill
/// it for the others: the executor's own mount is made so (or grown so, if
/// an earlier instance made it smaller); a provided one that is not is
/// reported.
fn runs_tmpfs(runs: &Path, config: &Config, memcg: bool) -> Result<(), String> {
    let want = TmpfsSize { bytes: config.runs_tmpfs_bytes(memcg), unlimited_inodes: memcg };
    if !tmpfs_mounted_on(runs) {
        sys::mount::mount_tmpfs(runs, want).map_err(|e| {
            format!(
                "disk: cannot mount a tmpfs on {}: {e}; run directories are on the host's \
                 filesystem, bounded per file only (RLIMIT_FSIZE)",
                runs.display()
            )
        })?;
    } else if memcg && mount_at(runs).is_some_and(|(_, s)| s == sys::mount::RUNS_SOURCE) {
        if let Some((bytes, inodes)) = tmpfs_room(runs) {
            if bytes < want.bytes || inodes != 0 {
                // `size=0` keeps a mount without a size limit so.
                let bytes = if bytes == u64::MAX { 0 } else { bytes.max(want.bytes) };
                let grown = TmpfsSize { bytes, unlimited_inodes: true };
                if let Err(e) = sys::mount::remount_tmpfs(runs, grown) {
                    tracing::warn!("runs tmpfs {}: cannot grow it: {e}", runs.display());
                }
            }
        }
    }
    if memcg {
        if let Some(note) = shared_room_note(runs, config) {
            return Err(note);
        }
    }
    Ok(())
}

/// The tmpfs on `runs`: bytes of file data it may hold (`u64::MAX` for
/// `size=0`, no limit, which `statvfs` shows as 0 blocks), and its inode
/// count (0: not counted).
fn tmpfs_room(runs: &Path) -> Option<(u64, u64)> {
    let s = nix::sys::statvfs::statvfs(runs).ok()?;
    let bytes = match s.blocks() {
        0 => u64::MAX,
        blocks => blocks.saturating_mul(s.fragment_size()),
    };
    Some((bytes, s.files()))
}

/// Why the runs tmpfs (mounted on `runs`) lets runs fill it for one
/// another, if it does: it holds less than [`Config::runs_tmpfs_need`], or
/// it counts inodes (the runs' memory cgroups bound those already, and a
/// count of its own is one more thing runs share).
fn shared_room_note(runs: &Path, config: &Config) -> Option<String> {
    let (bytes, inodes) = tmpfs_room(runs)?;
    let need = config.runs_tmpfs_need();
    let mib = |b: u64| b >> 20;
    let mut short = Vec::new();
    if bytes < need {
        short.push(format!(
            "holds {} MiB where {} runs at {} MiB need {}",
            mib(bytes),
            config.max_concurrent_runs,
            mib(config.largest_run_memory()),
            mib(need)
        ));
    }
    if inodes != 0 {
        short.push(format!(
            "counts inodes ({inodes}, where nr_inodes=0 leaves them to each run's memory cgroup)"
        ));
    }
    (!short.is_empty()).then(|| {
        format!(
            "disk: the runs tmpfs on {} {}: runs can fill it for one another",
            runs.display(),
            short.join(" and ")
        )
    })
}

/// Gives the runs tmpfs up when no instance uses it any more: under the
/// mount lock, if the users lock can be taken exclusively (`users`, this
/// instance's shared lock, is dropped first), the executor's own mount on
/// an empty `runs` is unmounted. While another holder keeps the users lock,
/// this tries again (the mount lock let go in between) for up to
/// `patience`: the watchdog of a killed executor gives the dying process
/// that long to let go of its own lock, which the kernel releases after it
/// closed the pipe that woke the watchdog. Nothing is created here (the
/// runtime directory may be on its way out).
fn release_runs(runtime: &Path, mut users: Option<Flock<File>>, patience: Duration) {
    let until = Instant::now() + patience;
    loop {
        let Ok(mount_lock) = lock_file(&runtime.join(MOUNT_LOCK), false) else { return };
        let Ok(_mount_lock) = flock(mount_lock, FlockArg::LockExclusive) else { return };
        drop(users.take());
        let Ok(all) = lock_file(&runtime.join(USERS_LOCK), false) else { return };
        if let Ok(_all) = flock(all, FlockArg::LockExclusiveNonblock) {
            let runs = runtime.join("runs");
            let ours =
                mount_at(&runs).is_some_and(|(t, s)| t == "tmpfs" && s == sys::mount::RUNS_SOURCE);
            let empty = fs::read_dir(&runs).is_ok_and(|mut d| d.next().is_none());
            if ours && empty {
                if let Err(e) = sys::mount::unmount(&runs) {
                    tracing::warn!("runs tmpfs {}: cannot unmount: {e}", runs.display());
                }
            }
            return;
        }
        if Instant::now() >= until {
            return;
        }
        drop(_mount_lock);
        std::thread::sleep(RELEASE_RETRY);
    }
}

/// The program to run as the watchdog: this executor itself, else (a test
/// or benchmark using the library) an `ongrid-executor` next to the
/// current executable or one folder up, owned by root or us and not
/// writable by others.
fn watchdog_program() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    if me.file_name().is_some_and(|n| n.to_string_lossy().starts_with("ongrid-executor")) {
        return Ok(PathBuf::from("/proc/self/exe"));
    }
    let euid = nix::unistd::geteuid().as_raw();
    me.ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join("ongrid-executor"))
        .find(|p| {
            fs::metadata(p).is_ok_and(|m| {
                m.is_file() && (m.uid() == 0 || m.uid() == euid) && m.mode() & 0o022 == 0
            })
        })
        .ok_or_else(|| format!("{} is not ongrid-executor and none is next to it", me.display()))
}

/// Starts the watchdog; returns its pid and the pipe's write end.
fn spawn_watchdog(runtime: &Path, name: &str, bases: &[PathBuf]) -> Result<(u32, OwnedFd), String> {
    let program = watchdog_program()?;
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let child = Command::new(&program)
        .arg(WATCHDOG_COMMAND)
        .arg(runtime)
        .arg(name)
        .args(bases)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::from(r))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    Ok((child.id(), w))
}

impl Instance {
    /// Sets the instance up (see the module docs): sweeps what dead
    /// executors left in this runtime directory, mounts the runs tmpfs if
    /// needed, starts the watchdog, makes the instance directory and cgroup
    /// parents. Shortfalls become [`Instance::notes`].
    ///
    /// # Errors
    ///
    /// [`InstanceError`]: the runtime directory, a lock, the instance
    /// directory or a cgroup parent cannot be made.
    pub fn start(config: &Config, hierarchies: &Hierarchies) -> Result<Self, InstanceError> {
        let root = nix::unistd::geteuid().is_root();
        let runtime = config.runtime_dir();
        let runs = runtime.join("runs");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&runs)
            .map_err(err("create", &runs))?;
        let bases = sweep::bases(hierarchies);
        let mut notes = Vec::new();

        let mount_path = runtime.join(MOUNT_LOCK);
        let mount_lock = lock_file(&mount_path, true).map_err(err("open", &mount_path))?;
        let mount_lock =
            flock(mount_lock, FlockArg::LockExclusive).map_err(err("lock", &mount_path))?;
        let users_path = runtime.join(USERS_LOCK);
        let users = lock_file(&users_path, true).map_err(err("open", &users_path))?;
        let users = flock(users, FlockArg::LockShared).map_err(err("lock", &users_path))?;
        // Sweep before mounting: a fresh mount would hide what is there.
        sweep::sweep(&runtime, &bases, SWEEP_MIN_AGE);
        let memcg = hierarchies.v2_limits || hierarchies.v1_memory.is_some();
        if root {
            if let Err(note) = runs_tmpfs(&runs, config, memcg) {
                notes.push(note);
            } else if !memcg {
                notes.push(
                    "disk: no memory cgroup; one run can fill the runs tmpfs shared by all runs"
                        .to_owned(),
                );
            }
        } else {
            notes.push(
                "disk: not root; run directories are on the host's filesystem, bounded per \
                 file only (RLIMIT_FSIZE)"
                    .to_owned(),
            );
        }
        drop(mount_lock);

        let name = format!("{INSTANCE_PREFIX}{}", &random_hex().map_err(err("random", &runs))?);
        let guard_pid = match spawn_watchdog(&runtime, &name, &bases) {
            Ok((pid, w)) => {
                if hierarchies.v2.is_none() && hierarchies.v1_pids.is_none() {
                    notes.push(
                        "watchdog: no cgroup; if the executor dies, its runs are killed by \
                         process group only"
                            .to_owned(),
                    );
                }
                Some((pid, w))
            }
            Err(e) => {
                notes.push(format!(
                    "watchdog: {e}; if the executor dies, only each run's main process dies \
                     with it (the next executor sweeps the rest)"
                ));
                None
            }
        };
        let (pid, watchdog) = match guard_pid {
            Some((pid, w)) => (pid, Some(w)),
            None => (std::process::id(), None),
        };
        let mut instance = Instance {
            dir: runs.join(&name),
            name,
            runtime,
            runs,
            bases,
            cgroups: Hierarchies::default(),
            users: Some(users),
            watchdog,
            notes,
        };
        instance.make_dir(pid)?;
        instance.cgroups = hierarchies.scoped(&instance.name).map_err(|e| InstanceError {
            what: "create the cgroup parent",
            path: e.path,
            source: e.source,
        })?;
        Ok(instance)
    }

    /// `runs/.new-<name>` with the guard, renamed to `runs/<name>`.
    fn make_dir(&self, guard_pid: u32) -> Result<(), InstanceError> {
        let tmp = self.runs.join(format!("{NEW_PREFIX}{}", self.name));
        fs::DirBuilder::new().mode(0o711).create(&tmp).map_err(err("create", &tmp))?;
        let made = (|| {
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o711))?;
            let pid = i32::try_from(guard_pid).unwrap_or(0);
            let start = sweep::start_time(pid).ok_or(io::ErrorKind::NotFound)?;
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(tmp.join(GUARD))?;
            writeln!(f, "{guard_pid} {start}")?;
            fs::rename(&tmp, &self.dir)
        })();
        made.map_err(|e| {
            let _ = fs::remove_dir_all(&tmp);
            InstanceError { what: "create", path: self.dir.clone(), source: e }
        })
    }

    /// The instance's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where its runs' directories go.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cgroup hierarchies with the instance's parents as bases.
    pub fn cgroups(&self) -> &Hierarchies {
        &self.cgroups
    }

    /// Shortfalls found at start (for every run's `degraded`).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Records the process group of a run without a cgroup, for the
    /// watchdog; the record goes when the returned value is dropped.
    pub fn record_pgid(&self, pgid: i32) -> Option<PgidRecord> {
        self.watchdog.as_ref()?;
        let path = self.dir.join(format!("{PGID_PREFIX}{pgid}"));
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .ok()
            .map(|_| PgidRecord(path))
    }
}

/// A recorded process group (see [`Instance::record_pgid`]).
#[derive(Debug)]
pub struct PgidRecord(PathBuf);

impl Drop for PgidRecord {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        sweep::clean(&self.runs, &self.name, &self.bases);
        release_runs(&self.runtime, self.users.take(), Duration::ZERO);
        // "done", then EOF, lets the watchdog go: nothing is left to clean.
        if let Some(pipe) = self.watchdog.take() {
            let _ = File::from(pipe).write_all(DONE);
        }
    }
}

fn random_hex() -> io::Result<String> {
    let mut b = [0u8; 6];
    File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The watchdog process (`ongrid-executor watchdog <runtime_dir>
/// <instance> [<cgroup base>...]`): waits for EOF on stdin, then kills and
/// removes everything of the instance. Returns the exit status.
pub fn watchdog_main(args: &[OsString]) -> u8 {
    let [runtime, name, bases @ ..] = args else { return 2 };
    let Some(name) = name.to_str().filter(|n| n.starts_with(INSTANCE_PREFIX) && !n.contains('/'))
    else {
        return 2;
    };
    let _ = nix::unistd::setsid();
    let mut blocked = nix::sys::signal::SigSet::empty();
    for sig in [
        nix::sys::signal::SIGINT,
        nix::sys::signal::SIGTERM,
        nix::sys::signal::SIGHUP,
        nix::sys::signal::SIGQUIT,
        nix::sys::signal::SIGPIPE,
    ] {
        blocked.add(sig);
    }
    let _ = blocked.thread_block();
    let mut stdin = io::stdin().lock();
    let mut said = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                said.extend_from_slice(&buf[..n]);
                said.truncate(DONE.len() + 1);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if said == DONE {
        // A normal end: the executor cleaned and released its instance.
        return 0;
    }
    let runtime = PathBuf::from(runtime);
    let bases: Vec<PathBuf> = bases.iter().map(PathBuf::from).collect();
    let runs = runtime.join("runs");
    let Swept { kills, .. } = sweep::clean(&runs, name, &bases);
    let _ = fs::remove_dir_all(runs.join(format!("{NEW_PREFIX}{name}")));
    release_runs(&runtime, None, DEATH_PATIENCE);
    u8::from(kills > 0)
}
