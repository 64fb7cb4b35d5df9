//! Spawn sequence steps 3 to 5 seen from the parent: the child created,
//! by one of the engine's spawner threads or directly, on the slot's
//! pipes; what it does itself is `sys::child`.

use std::ffi::c_char;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::{Prepared, SpawnError, Stdio};
use crate::host::fdtable::{self, Placed};
use crate::host::procview::RunsNamespace;
use crate::run::spawner::Spawner;
use crate::sandbox::cgroup::RunCgroup;
use crate::sandbox::seccomp;
use crate::sys;
use crate::sys::spec::{ChildSpec, SpawnFailure, Step};

/// A running child and the parent's ends of its pipes.
#[derive(Debug)]
pub struct Child {
    /// Its pid.
    pub pid: i32,
    /// Its pidfd.
    pub pidfd: OwnedFd,
    /// Write end of its stdin (non-blocking) and how many bytes of the
    /// args are already in the pipe; `None` once all of them are there and
    /// the pipe is closed behind them.
    pub stdin: Option<(OwnedFd, usize)>,
    /// Read end of its stdout (non-blocking).
    pub stdout: OwnedFd,
    /// Read end of its stderr (non-blocking).
    pub stderr: OwnedFd,
    /// When it called `execve`, as it timed it (step 5): the end of the
    /// run's setup, however late the run's thread got to run after it.
    pub exec_at: Instant,
}

/// The engine's spawner threads ([`crate::run::spawner`]): one pool per seccomp
/// program ([`seccomp::Variant`]: the network grant, metadata locked),
/// started on first use.
/// A child created by one inherits the pool's filter instead of compiling
/// it (~90 µs per spawn on the dev machine).
#[derive(Debug, Default)]
pub struct Spawners {
    pools: [OnceLock<Option<Spawner>>; 4],
    /// No spawner threads: every child installs the filter itself.
    inline: bool,
    /// The threads' filters log their refusals to the audit (the runs'
    /// refusals are read back: `run::denials`).
    log: bool,
    /// The runs' mount namespace, which the threads join when they start
    /// (`host::procview`).
    ns: Option<Arc<RunsNamespace>>,
}

impl Spawners {
    /// No spawner threads: each child installs the seccomp filter itself.
    /// For a one-shot `ongrid-executor run`: its one child has nothing to
    /// share the filter with, and threads made while the cgroup attach
    /// lock's warm-up ([`crate::host::attach_lock`]) waits for its RCU grace
    /// period wait with it (2-3 ms more per one-shot run, measured).
    pub fn inline() -> Self {
        Spawners { inline: true, ..Spawners::default() }
    }

    /// The threads' filters log their refusals (set before the first run:
    /// a pool's filter is installed when the pool starts).
    pub fn log_denials(&mut self, log: bool) {
        self.log = log;
    }

    /// The threads join the runs' mount namespace `ns` (set before the
    /// first run, as [`Spawners::log_denials`]).
    pub fn runs_namespace(&mut self, ns: Option<Arc<RunsNamespace>>) {
        self.ns = ns;
    }

    /// The pool for `seccomp::program(variant)`, `None` when inline or
    /// when its threads could not start (logged once; the children then
    /// install the filter).
    fn get(&self, variant: seccomp::Variant) -> Option<&Spawner> {
        if self.inline {
            return None;
        }
        self.pools[variant.index()]
            .get_or_init(|| {
                // Two per CPU, 4 to 8: a thread whose parked child a run
                // took is busy until it has parked another, and a run that
                // finds none parked waits for a thread to make its child
                // (two more hand-offs). With 8 clients on 2 CPUs, 4 threads
                // against 2: runs/s higher or equal in 8 of 8 rounds, p50
                // lower in 6.
                let threads = std::thread::available_parallelism()
                    .map_or(4, |n| n.get().saturating_mul(2).clamp(4, 8));
                let flags = if self.log { sys::call::SECCOMP_FILTER_FLAG_LOG } else { 0 };
                let program = seccomp::program(variant);
                let ns = self.ns.clone();
                match Spawner::start_in(ns, program, flags, threads, "ongrid-spawner") {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::warn!(
                            "cannot start the spawner threads ({e}); each child installs \
                             the seccomp filter itself"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }
}

/// This process's pid, read once.
fn own_pid() -> i32 {
    static PID: OnceLock<i32> = OnceLock::new();
    *PID.get_or_init(|| nix::unistd::getpid().as_raw())
}

/// Puts what fits of `args` into the stdin pipe before the child exists
/// (or, for a warm run, as it is taken), and closes the pipe behind them
/// when all of them fit (64 KiB, nearly always): the child then reads its
/// args and EOF without waiting on the executor, which saves the skill a
/// sleep and a wake-up per run on a busy host, and the supervisor an
/// event loop turn. Returns the write end and how much was written when
/// some is left.
pub(crate) fn prefill_stdin(fd: OwnedFd, args: &[u8]) -> Option<(OwnedFd, usize)> {
    let mut done = 0;
    while done < args.len() {
        match nix::unistd::write(&fd, &args[done..]) {
            Ok(n) => done += n,
            Err(nix::errno::Errno::EINTR) => {}
            // Full (EAGAIN) or anything else: the supervisor carries on
            // from here and meets the error itself.
            Err(_) => break,
        }
    }
    (done < args.len()).then_some((fd, done))
}

/// Spawn sequence steps 3 to 5: create the child, which applies the
/// sandbox and execs the entry, on the slot's pipes (made here when it
/// has none). `args` go into its stdin first (`prefill_stdin`). `spin`:
/// how long a child made ahead may be watched for its `exec` without
/// sleeping (`spawner`'s `spawn_spinning`; zero: sleep at once).
/// `meanwhile` runs once the child has its spec (else once it exists),
/// off the path to its `exec`.
///
/// # Errors
///
/// [`SpawnError::Sandbox`] or [`SpawnError::Exec`] naming the step,
/// [`SpawnError::Prepare`] when pipes cannot be made.
pub fn spawn(
    prep: &mut Prepared,
    entry: &Path,
    args: &[u8],
    spawners: &Spawners,
    spin: Duration,
    meanwhile: impl FnOnce(),
) -> Result<Child, SpawnError> {
    spawn_with(prep, entry, Input::Args(args), spawners, spin, meanwhile)
}

/// [`spawn`] for a warm run (`run::warm`): the child gets an empty stdin
/// kept open (the returned [`Child::stdin`] is its write end, nothing
/// written), so it execs and blocks reading its args until a request
/// writes them. Never watched for without sleeping (nobody waits on it).
///
/// # Errors
///
/// As [`spawn`].
pub fn spawn_waiting(
    prep: &mut Prepared,
    entry: &Path,
    spawners: &Spawners,
    start_idle: bool,
    meanwhile: impl FnOnce(),
) -> Result<Child, SpawnError> {
    let input = Input::Waiting { start_idle };
    spawn_with(prep, entry, input, spawners, Duration::ZERO, meanwhile)
}

/// What a child's stdin gets at its spawn.
enum Input<'a> {
    /// The args, prefilled.
    Args(&'a [u8]),
    /// Nothing yet: kept open and empty (a warm run, its args later);
    /// `start_idle`: the child runs at `SCHED_IDLE` once its cgroups are joined.
    Waiting { start_idle: bool },
}

/// [`spawn`] with its child's stdin as `input` says.
fn spawn_with(
    prep: &mut Prepared,
    entry: &Path,
    input: Input<'_>,
    spawners: &Spawners,
    spin: Duration,
    meanwhile: impl FnOnce(),
) -> Result<Child, SpawnError> {
    let stdio = match prep.stdio.take() {
        Some(stdio) => stdio,
        None => Stdio::new(&prep.skill)?,
    };
    let prep = &*prep;
    let skill = prep.skill.as_str();
    let Stdio { stdin: (stdin_r, stdin_w), stdout: (stdout_r, stdout_w), stderr } = stdio;
    let (stderr_r, stderr_w) = stderr;
    // Kept open and empty: a warm run (args later) or an MCP pack's server.
    let (stdin, start_idle) = match input {
        Input::Args(args) if !prep.keep_stdin => (prefill_stdin(stdin_w, args), false),
        Input::Args(_) => (Some((stdin_w, 0)), false),
        Input::Waiting { start_idle } => (Some((stdin_w, 0)), start_idle),
    };
    let argv: Vec<*const c_char> =
        prep.argv.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let envp: Vec<*const c_char> =
        prep.envp.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let procs: Vec<RawFd> = prep.cgroup.as_ref().map(RunCgroup::procs_fds).unwrap_or_default();
    let exec_ns = AtomicU64::new(0);
    // Step 3: a spawner thread carrying the run's seccomp program creates
    // the child, which inherits the filter; without one (it could not
    // start) the child installs the program itself in step 4i.
    // Its bounding set is empty: a run granted capabilities (they must stay
    // in the bounding set) goes without one.
    // A run granted the host's /proc goes without one too: the threads
    // live in the runs' mount namespace, whose /proc hides the host.
    let spawner =
        if prep.capabilities == 0 && !prep.host_proc { spawners.get(prep.variant) } else { None };
    let mut spec = ChildSpec {
        path: &prep.path,
        argv: &argv,
        envp: &envp,
        stdio: [stdin_r.as_raw_fd(), stdout_w.as_raw_fd(), stderr_w.as_raw_fd()],
        cwd: &prep.cwd,
        cgroup_procs: &procs,
        rlimits: &prep.rlimits,
        identity: prep.identity,
        capabilities: prep.capabilities,
        cap_last: prep.cap_last,
        landlock: prep.landlock.as_ref().map(AsRawFd::as_raw_fd),
        share_below: None,
        seccomp: prep.seccomp,
        log_denials: prep.log_denials,
        parent: own_pid(),
        bounding_cleared: false,
        exec_at: Some(&exec_ns),
        mount_ns: prep.mount_ns.as_deref().map(|ns| ns.mount_ns().as_raw_fd()),
        start_idle,
    };
    // `placed` lives until the child exec'd.
    let placed = place_descriptors(&mut spec);
    // Steps 3-5 (in the child): see sys::child.
    let spawned = match spawner {
        Some(spawner) => {
            // The thread carries the filter and lives in the namespace.
            spec.seccomp = &[];
            spec.mount_ns = None;
            spawner.spawn_spinning(&spec, spin, meanwhile)
        }
        None => {
            let spawned = sys::child::spawn(&spec);
            meanwhile();
            spawned
        }
    };
    let spawned = spawned.map_err(|SpawnFailure { step, errno }| {
        if step == Step::Exec {
            SpawnError::Exec { skill: skill.to_owned(), entry: entry.to_owned(), errno }
        } else {
            SpawnError::Sandbox { skill: skill.to_owned(), step, errno }
        }
    })?;
    let exec_at = exec_instant(exec_ns.load(Ordering::Acquire));
    drop((placed, stdin_r, stdout_w, stderr_w));
    Ok(Child {
        pid: spawned.pid,
        pidfd: spawned.pidfd,
        stdin,
        stdout: stdout_r,
        stderr: stderr_r,
        exec_at,
    })
}

/// Where the child's descriptors are and how much of the table it shares:
/// the whole table until its cgroups are joined, then only what is below
/// its floor (`host::fdtable`): the top of the band its descriptors are
/// placed on (returned, to be kept until the child exec'd), else the
/// table's floor when they are below it; else it copies the table.
fn place_descriptors(spec: &mut ChildSpec<'_>) -> Option<Placed> {
    let placed = fdtable::bands().and_then(|bands| {
        let [i, o, e] = spec.stdio;
        bands.place([Some(i), Some(o), Some(e), spec.landlock])
    });
    match placed.as_ref().map(|p| (p.fds(), p.top())) {
        Some(([Some(i), Some(o), Some(e), landlock], top)) => {
            spec.stdio = [i, o, e];
            spec.landlock = landlock;
            spec.share_below = Some(top);
        }
        _ => {
            let kept = spec.stdio.into_iter().chain(spec.landlock);
            spec.share_below =
                fdtable::floor().filter(|floor| sys::spec::all_below(*floor, kept.clone()));
        }
    }
    placed
}

/// The [`Instant`] of a `CLOCK_MONOTONIC` reading `ns` the child took
/// (the clock `Instant` reads on Linux): now, less the time since. Now
/// when it took none (0) or the clock cannot be read.
fn exec_instant(ns: u64) -> Instant {
    let now = Instant::now();
    match sys::call::monotonic_now_ns() {
        Some(t) if ns != 0 => {
            now.checked_sub(Duration::from_nanos(t.saturating_sub(ns))).unwrap_or(now)
        }
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use nix::fcntl::OFlag;

    use super::super::slot::{pipe, Ours};
    use super::*;

    fn read_all(fd: &OwnedFd) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match nix::unistd::read(fd.as_fd(), &mut buf) {
                Ok(0) => return (out, true),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EAGAIN) => return (out, false),
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    #[test]
    fn args_that_fit_are_in_the_pipe_and_closed_behind_before_any_child() {
        let (r, w) = pipe("t", Ours::Write).unwrap();
        nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        let args = br#"{"a":1}"#;
        assert!(prefill_stdin(w, args).is_none(), "the write end is kept");
        // The reader finds the args and then EOF, with no writer left.
        assert_eq!(read_all(&r), (args.to_vec(), true));
    }

    #[test]
    fn args_larger_than_the_pipe_leave_the_rest_to_the_supervisor() {
        let (r, w) = pipe("t", Ours::Write).unwrap();
        nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        let args: Vec<u8> = (0..300 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
        let (w, done) = prefill_stdin(w, &args).expect("the write end is kept");
        assert!(done > 0 && done < args.len(), "{done}");
        let (got, eof) = read_all(&r);
        assert_eq!((got.as_slice(), eof), (&args[..done], false));
        drop(w);
        assert_eq!(read_all(&r), (Vec::new(), true));
    }
}
