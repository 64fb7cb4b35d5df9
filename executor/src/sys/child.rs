//! Spawning the skill: `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)` and the
//! child's allocation-free sequence of raw system calls up to `execve`.
//!
//! Why this shape (see the crate docs, "Spawn sequence"): a `CLONE_VM` child
//! costs the same whatever the executor's size (no page tables are copied,
//! unlike `fork`), and `CLONE_VFORK` suspends the calling thread until the
//! child has exec'd or exited, so the child can report a failure by writing
//! into the parent's memory. The child runs on a stack the parent allocated,
//! uses only values the parent built ([`ChildSpec`]) and only raw
//! `syscall(2)`s: never glibc's `setuid` family (which signals every thread
//! of the shared address space), never the allocator.

use std::ffi::{c_char, c_int, c_long, c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use super::join::Joining;

/// The child's steps, in order. A failure reports the step and the errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Step {
    /// `clone` itself (in the parent).
    Clone = 1,
    /// `setsid`: new session, no controlling terminal.
    Setsid,
    /// Joining the run's cgroups (`cgroup.procs`).
    Cgroup,
    /// `dup3` of the pipes onto fds 0, 1, 2.
    Stdio,
    /// `close_range(floor, ~0, CLOSE_RANGE_UNSHARE)` when sharing the
    /// parent's table, then `close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`.
    CloseFds,
    /// `chdir` into the per-run directory.
    Chdir,
    /// `prlimit64` of each resource limit.
    Rlimits,
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs,
    /// `setgroups(0, NULL)`.
    Setgroups,
    /// `PR_CAPBSET_DROP` of every capability not granted.
    CapBounding,
    /// `PR_SET_KEEPCAPS` (only when capabilities are granted).
    KeepCaps,
    /// `setresgid`.
    Setresgid,
    /// `setresuid`.
    Setresuid,
    /// `capset` to exactly the granted capabilities.
    Capset,
    /// Ambient capabilities: clear, then raise the granted ones.
    Ambient,
    /// `PR_SET_PDEATHSIG(SIGKILL)` and the parent check.
    ParentDeath,
    /// `landlock_restrict_self`.
    Landlock,
    /// `seccomp(SECCOMP_SET_MODE_FILTER)`.
    Seccomp,
    /// Back to the default scheduling policy and a nice value of 0 or more.
    Scheduling,
    /// `execve` of the entry.
    Exec,
}

impl Step {
    const ALL: [Step; 20] = [
        Step::Clone,
        Step::Setsid,
        Step::Cgroup,
        Step::Stdio,
        Step::CloseFds,
        Step::Chdir,
        Step::Rlimits,
        Step::NoNewPrivs,
        Step::Setgroups,
        Step::CapBounding,
        Step::KeepCaps,
        Step::Setresgid,
        Step::Setresuid,
        Step::Capset,
        Step::Ambient,
        Step::ParentDeath,
        Step::Landlock,
        Step::Seccomp,
        Step::Scheduling,
        Step::Exec,
    ];

    /// The step recorded as `v` by a child (`record`).
    pub(super) fn from_u32(v: u32) -> Option<Step> {
        Step::ALL.into_iter().find(|s| *s as u32 == v)
    }

    /// What the step does, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Step::Clone => "clone",
            Step::Setsid => "setsid",
            Step::Cgroup => "join the run's cgroup",
            Step::Stdio => "set up stdin/stdout/stderr",
            Step::CloseFds => "close inherited file descriptors",
            Step::Chdir => "enter the per-run directory",
            Step::Rlimits => "set resource limits",
            Step::NoNewPrivs => "set no_new_privs",
            Step::Setgroups => "clear supplementary groups",
            Step::CapBounding => "drop the capability bounding set",
            Step::KeepCaps => "keep granted capabilities",
            Step::Setresgid => "switch to the run-as group",
            Step::Setresuid => "switch to the run-as user",
            Step::Capset => "set capabilities",
            Step::Ambient => "set ambient capabilities",
            Step::ParentDeath => "set the parent-death signal",
            Step::Landlock => "enforce the Landlock ruleset",
            Step::Seccomp => "install the seccomp filter",
            Step::Scheduling => "reset the scheduling policy and priority",
            Step::Exec => "execute the entry",
        }
    }
}

/// The user and group the child switches to (the executor is root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Real, effective and saved uid.
    pub uid: u32,
    /// Real, effective and saved gid; supplementary groups are cleared.
    pub gid: u32,
}

/// Everything the child needs, built by the parent before `clone`.
///
/// Pointers in `argv` and `envp` must point into `CString`s that outlive the
/// [`spawn`] call; both arrays must end with a null pointer.
#[derive(Debug, Clone, Copy)]
pub struct ChildSpec<'a> {
    /// Absolute path of the entry.
    pub path: &'a CStr,
    /// Null-terminated argv (`[entry, NULL]`: args never go into argv).
    pub argv: &'a [*const c_char],
    /// Null-terminated environment, exactly the allowed names.
    pub envp: &'a [*const c_char],
    /// Child ends of the stdin, stdout and stderr pipes; all must be >= 3.
    pub stdio: [RawFd; 3],
    /// The per-run directory.
    pub cwd: &'a CStr,
    /// Open `cgroup.procs` files the child writes "0" to.
    pub cgroup_procs: &'a [RawFd],
    /// `(RLIMIT_*, soft, hard)`.
    pub rlimits: &'a [(u32, u64, u64)],
    /// `Some` when the executor is root: switch user, clear the bounding set.
    pub identity: Option<Identity>,
    /// Bit mask of the capabilities to keep (bit n = capability n).
    pub capabilities: u64,
    /// Highest capability number the kernel knows.
    pub cap_last: u32,
    /// Landlock ruleset to enforce.
    pub landlock: Option<RawFd>,
    /// `Some(floor)`: share the parent's descriptor table (`CLONE_FILES`)
    /// until the cgroups are joined, then keep only the descriptors below
    /// `floor` ([`super::fdtable`]); `stdio` and `landlock` must be below
    /// it. `None`: the table is copied at `clone`.
    pub share_below: Option<u32>,
    /// Classic BPF seccomp program; empty = none.
    pub seccomp: &'a [libc::sock_filter],
    /// The executor's pid, checked after `PR_SET_PDEATHSIG`.
    pub parent: libc::pid_t,
    /// The creating thread's capability bounding set is empty already (a
    /// spawner thread's, set by [`super::spawner`] only): step 4g skips
    /// its `PR_CAPBSET_DROP`s, which the child inherits done.
    pub bounding_cleared: bool,
    /// Where the child stores the time it calls `execve` (step 5), in
    /// nanoseconds of `CLOCK_MONOTONIC`: the end of the sandbox's setup as
    /// the child saw it, whenever the parent gets to run again.
    pub exec_at: Option<&'a AtomicU64>,
}

/// A child that was created and has exec'd.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid (stays ours until reaped).
    pub pid: libc::pid_t,
    /// Its pidfd (`CLONE_PIDFD`, close-on-exec).
    pub pidfd: OwnedFd,
}

/// Which step failed and why; nothing is left running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnFailure {
    /// The failed step.
    pub step: Step,
    /// The errno it got.
    pub errno: i32,
}

/// Memory shared with the `CLONE_VM` child.
struct Shared<'s, 'a> {
    spec: &'s ChildSpec<'a>,
    fprog: libc::sock_fprog,
    step: AtomicU32,
    errno: AtomicI32,
}

/// The kernel's `struct sigaction` for `rt_sigaction` (x86_64 layout).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CHILD_STACK_BYTES: usize = 256 << 10;

thread_local! {
    static CHILD_STACK: std::cell::Cell<Option<Box<[u8]>>> = const { std::cell::Cell::new(None) };
}
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const SCHED_DEADLINE: c_int = 6;

/// Whether `policy` (as `sched_getscheduler` returns it, with or without
/// `SCHED_RESET_ON_FORK`) is a real-time one.
pub(super) fn real_time_policy(policy: c_int) -> bool {
    let policy = policy & !libc::SCHED_RESET_ON_FORK;
    [libc::SCHED_FIFO, libc::SCHED_RR, SCHED_DEADLINE].contains(&policy)
}
const SECCOMP_SET_MODE_FILTER: c_long = 1;
const CLOSE_RANGE_CLOEXEC: c_long = 1 << 2;
const CLOSE_RANGE_UNSHARE: c_long = 1 << 1;

/// The calling thread's errno (in a child: see the SAFETY note).
pub(super) fn errno() -> i32 {
    // SAFETY: __errno_location returns a valid pointer to the calling
    // thread's errno (in the child: its parent thread's, which is suspended
    // (what posix_spawn relies on too) or, for a parked child, asleep with
    // every signal blocked and no system call that fails before the child
    // is gone: `clone_parked`).
    unsafe { *libc::__errno_location() }
}

/// Checks a raw syscall result: -1 → the errno, tagged with `step`.
fn check(ret: c_long, step: Step) -> Result<c_long, (Step, i32)> {
    if ret == -1 {
        Err((step, errno()))
    } else {
        Ok(ret)
    }
}

/// Checks what the child relies on: null-terminated `argv` and `envp`,
/// stdio sources >= 3 (and below the floor when sharing the table), a
/// program short enough for `sock_fprog`. Returns the program's header.
///
/// # Errors
///
/// `EINVAL` at [`Step::Clone`].
pub(super) fn check_spec(spec: &ChildSpec<'_>) -> Result<libc::sock_fprog, SpawnFailure> {
    let bad = SpawnFailure { step: Step::Clone, errno: libc::EINVAL };
    if spec.argv.last().is_none_or(|p| !p.is_null())
        || spec.envp.last().is_none_or(|p| !p.is_null())
        || spec.stdio.iter().any(|fd| *fd < 3)
        || spec.seccomp.len() > usize::from(u16::MAX)
    {
        return Err(bad);
    }
    if let Some(floor) = spec.share_below {
        if !super::fdtable::all_below(floor, spec.stdio.into_iter().chain(spec.landlock)) {
            return Err(bad);
        }
    }
    Ok(libc::sock_fprog {
        len: u16::try_from(spec.seccomp.len()).map_err(|_| bad)?,
        filter: spec.seccomp.as_ptr().cast_mut(),
    })
}

/// Creates the child and runs [`ChildSpec`] in it up to `execve`.
///
/// Blocks the calling thread until the child has exec'd or failed. Every
/// signal is blocked around `clone` so no handler of the executor ever runs
/// on the child's stack; the child resets all dispositions to default and
/// unblocks everything before exec.
///
/// # Errors
///
/// [`SpawnFailure`] with the step and errno; the failed child is reaped.
pub fn spawn(spec: &ChildSpec<'_>) -> Result<Spawned, SpawnFailure> {
    let fprog = check_spec(spec)?;
    let shared = Shared { spec, fprog, step: AtomicU32::new(0), errno: AtomicI32::new(0) };
    let share = if spec.share_below.is_some() { libc::CLONE_FILES } else { 0 };
    let mut pidfd_at: c_int = -1;
    let arg = (&raw const shared).cast_mut().cast::<c_void>();
    // SAFETY: `child_main` only reads `shared`, alive on this frame until
    // `clone_vfork` returns, which is after the child exec'd or exited;
    // `pidfd_at` is a local of this frame too.
    let (pid, pidfd) = unsafe { clone_vfork(child_main, arg, share, &raw mut pidfd_at) }
        .map_err(|errno| SpawnFailure { step: Step::Clone, errno })?;
    // SAFETY: the kernel made this pidfd for us and nothing else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let step = shared.step.load(Ordering::Acquire);
    if step != 0 {
        let errno = shared.errno.load(Ordering::Acquire);
        let _ = super::process::wait(pid, false);
        return Err(SpawnFailure { step: Step::from_u32(step).unwrap_or(Step::Exec), errno });
    }
    Ok(Spawned { pid, pidfd })
}

/// `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD | extra)` running `main(arg)`
/// on the calling thread's child stack, with every signal blocked around
/// it. Returns once the child has exec'd or exited: its pid and pidfd, or
/// `clone`'s errno. The kernel stores the pidfd at `pidfd_at` before the
/// child runs, so the child can read it there; the caller owns it (it may
/// give it away meanwhile: a raw number, which nothing closes here).
///
/// # Safety
///
/// `main` must not return into the stack (it ends with `execve` or
/// `_exit`), must use only raw system calls and no allocator, and `arg`
/// and `pidfd_at` must stay valid for the whole call.
pub(super) unsafe fn clone_vfork(
    main: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
    extra: c_int,
    pidfd_at: *mut c_int,
) -> Result<(libc::pid_t, RawFd), i32> {
    // SAFETY: the caller's contract; CLONE_VFORK keeps this thread in
    // `clone` until the child exec'd or exited, so there is nothing to wait.
    unsafe {
        clone_on_child_stack(
            main,
            arg,
            libc::CLONE_VFORK | extra,
            pidfd_at,
            std::ptr::null_mut(),
            || {},
        )
    }
}

/// `clone(CLONE_VM | CLONE_PIDFD | CLONE_CHILD_CLEARTID | extra)` running
/// `main(arg)` on the calling thread's child stack, as [`clone_vfork`] does,
/// but without `CLONE_VFORK`: the calling thread goes on at once and calls
/// `wait`, which must return only once the child has exec'd or exited;
/// the stack is not reused before. The kernel zeroes `*clear_at` and wakes
/// a `futex` waiter on it then, unless the child moved its clear-child-tid
/// word meanwhile (`set_tid_address`). Every signal stays blocked in the
/// calling thread until `wait` returned, so no handler runs on it while
/// the child, which shares its thread-local storage (`errno`), works.
/// Returns the child's pid and pidfd, or `clone`'s errno (and `wait` is
/// not called).
///
/// A thread suspended in `clone(CLONE_VFORK)` is in uninterruptible sleep,
/// which the load average counts: a spawner thread keeping a child parked
/// that way added one to an idle host's load for good. One in `wait`
/// sleeps interruptibly.
///
/// # Safety
///
/// As [`clone_vfork`]; `clear_at` must stay valid until `wait` returned,
/// and `wait` must return only once the child has exec'd or exited.
pub(super) unsafe fn clone_parked(
    main: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
    extra: c_int,
    pidfd_at: *mut c_int,
    clear_at: *mut u32,
    wait: impl FnOnce(),
) -> Result<(libc::pid_t, RawFd), i32> {
    // SAFETY: the caller's contract.
    unsafe {
        clone_on_child_stack(
            main,
            arg,
            libc::CLONE_CHILD_CLEARTID | extra,
            pidfd_at,
            clear_at,
            wait,
        )
    }
}

/// `clone(CLONE_VM | CLONE_PIDFD | flags)` running `main(arg)` on the
/// calling thread's child stack, with every signal blocked in the calling
/// thread until `wait` (called only when `clone` succeeded) returned; the
/// stack is put back for the next child after it. `clear_at` is the
/// `child_tid` argument (null without `CLONE_CHILD_CLEARTID`).
///
/// # Safety
///
/// As [`clone_parked`]: the child must be off the stack when `wait`
/// returns (with `CLONE_VFORK`, `clone` itself waited).
unsafe fn clone_on_child_stack(
    main: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
    flags: c_int,
    pidfd_at: *mut c_int,
    clear_at: *mut u32,
    wait: impl FnOnce(),
) -> Result<(libc::pid_t, RawFd), i32> {
    // The calling thread's child stack, reused from one spawn to the next
    // (no 256 KiB allocation, zeroing or page faults per spawn): no child
    // uses it once `wait` returned (it exec'd or exited).
    let mut stack = CHILD_STACK
        .with(|cell| cell.take())
        .unwrap_or_else(|| vec![0u8; CHILD_STACK_BYTES].into_boxed_slice());
    // The stack grows down: pass its 16-byte aligned top.
    let top = {
        let end = stack.as_mut_ptr_range().end as usize;
        (end & !15) as *mut c_void
    };
    let flags = libc::CLONE_VM | libc::CLONE_PIDFD | flags | libc::SIGCHLD;

    // SAFETY: sigfillset initialises the set it is given; pthread_sigmask
    // only reads `all` and writes `old`, both valid locals.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    // SAFETY: the caller's contract covers `main`, `arg`, `pidfd_at` (the
    // parent_tid argument, where CLONE_PIDFD stores the pidfd) and
    // `clear_at` (the child_tid argument); `stack` stays in this frame
    // until `wait` returned, when the child is off it.
    let pid = unsafe {
        libc::clone(main, top, flags, arg, pidfd_at, std::ptr::null_mut::<c_void>(), clear_at)
    };
    let clone_errno = errno();
    if pid != -1 {
        wait();
    }
    // SAFETY: restores the mask saved above; `old` is a valid sigset_t.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    CHILD_STACK.with(|cell| cell.set(Some(stack)));
    if pid == -1 {
        return Err(clone_errno);
    }
    // SAFETY: `pidfd_at` is valid (the caller's contract); on success the
    // kernel stored the new pidfd there.
    Ok((pid, unsafe { *pidfd_at }))
}

extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `&Shared` passed to clone by `spawn`, which is
    // suspended (CLONE_VFORK) and keeps it alive while this runs.
    let shared = unsafe { &*arg.cast::<Shared<'_, '_>>() };
    let sharing = shared.spec.share_below.is_some();
    let failed = match fresh_process() {
        Ok(()) => sandbox_and_exec(shared.spec, &shared.fprog, sharing, None),
        Err(e) => e,
    };
    record(&shared.step, &shared.errno, failed);
    // SAFETY: _exit ends only this child (exit_group of its own thread group)
    // without running atexit handlers or touching the shared heap.
    unsafe { libc::_exit(127) }
}

/// A `CLOCK_MONOTONIC` reading in nanoseconds (0 never is one: the clock
/// starts at boot, long before any run).
fn monotonic_ns(t: &libc::timespec) -> u64 {
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(t.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Now on `CLOCK_MONOTONIC`, in nanoseconds (`None` if it cannot be read).
pub fn monotonic_now_ns() -> Option<u64> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only the timespec it is given, a local.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut now) };
    (r == 0).then(|| monotonic_ns(&now))
}

/// Stores a failed step for the parent (which reads it after `clone`).
pub(super) fn record(step: &AtomicU32, errno: &AtomicI32, (failed, e): (Step, i32)) {
    errno.store(e, Ordering::Release);
    step.store(failed as u32, Ordering::Release);
}

/// Steps 4a and 4b, which do not depend on the run: default signal
/// dispositions and an empty mask, then a new session. Child only.
pub(super) fn fresh_process() -> Result<(), (Step, i32)> {
    // SAFETY: raw system calls on locals of this frame; none allocates.
    unsafe {
        // Step 4a: default signal dispositions, empty mask.
        let dfl = KernelSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 };
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(libc::SYS_rt_sigaction, sig, &raw const dfl, 0usize, 8usize);
            }
        }
        let empty: u64 = 0;
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, &raw const empty, 0usize, 8);
        // Step 4b: new session, no controlling terminal.
        check(libc::syscall(libc::SYS_setsid), Step::Setsid)?;
    }
    Ok(())
}

/// The rest of the child's sequence (crate docs, spawn sequence steps 4c
/// to 5), after [`fresh_process`]. `sharing`: the child shares the
/// parent's descriptor table (`CLONE_FILES`) and takes its own in step 4d:
/// the part below `spec.share_below`, or all of it. `joining`: a parked
/// child's handoff, which may say that the run makes step 4c's joins
/// ([`super::join`]); the child then waits for them before `execve`.
/// Returns only on failure, with the step.
pub(super) fn sandbox_and_exec(
    spec: &ChildSpec<'_>,
    fprog: &libc::sock_fprog,
    sharing: bool,
    joining: Option<&Joining>,
) -> (Step, i32) {
    match sandbox(spec, fprog, sharing, joining) {
        Err(failed) => failed,
        Ok(never) => match never {},
    }
}

fn sandbox(
    spec: &ChildSpec<'_>,
    fprog: &libc::sock_fprog,
    sharing: bool,
    joining: Option<&Joining>,
) -> Result<std::convert::Infallible, (Step, i32)> {
    // Step 4c's decision: a child that takes its run's offer up leaves
    // the joins to the run (`super::join`).
    let joined_by_run = joining.filter(|j| j.accept());
    // SAFETY: every call below is a raw syscall (or `clock_gettime`, which
    // reads the vDSO or makes one) whose pointer arguments point to locals
    // of this frame or to data the parent keeps alive (`spec`, `fprog`,
    // `exec_at`) for the duration of the child; none allocates.
    unsafe {
        // Step 4c: cgroups (v2 leaf for the tree kill, v1 leaves for limits),
        // unless the run makes the joins meanwhile (waited for before step 5).
        if joined_by_run.is_none() {
            for fd in spec.cgroup_procs {
                let n = libc::syscall(libc::SYS_write, *fd, c"0".as_ptr(), 1usize);
                if n != 1 {
                    return Err((Step::Cgroup, errno()));
                }
            }
        }
        // Step 4d: a table of our own (sharing the parent's, we have not
        // touched it so far), keeping only what is below the floor: the
        // cgroup files and the executor's other long-lived descriptors
        // above it are neither copied nor closed again at exec. Without a
        // floor, a copy of all of it (the range closed is empty).
        if sharing {
            let first = spec.share_below.unwrap_or(u32::MAX);
            check(
                libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_UNSHARE),
                Step::CloseFds,
            )?;
        }
        // Then stdio, and every other fd close-on-exec.
        for (target, fd) in (0..).zip(spec.stdio) {
            check(libc::syscall(libc::SYS_dup3, fd, target, 0), Step::Stdio)?;
        }
        check(
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC),
            Step::CloseFds,
        )?;
        check(libc::syscall(libc::SYS_chdir, spec.cwd.as_ptr()), Step::Chdir)?;
        // Step 4e: resource limits.
        for (resource, soft, hard) in spec.rlimits {
            let lim = libc::rlimit64 { rlim_cur: *soft, rlim_max: *hard };
            check(
                libc::syscall(libc::SYS_prlimit64, 0, *resource, &raw const lim, 0usize),
                Step::Rlimits,
            )?;
        }
        // Step 4f: no_new_privs.
        check(
            libc::syscall(libc::SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
            Step::NoNewPrivs,
        )?;
        // Step 4g: the run-as user, and only the granted capabilities.
        if let Some(id) = spec.identity {
            check(libc::syscall(libc::SYS_setgroups, 0, 0usize), Step::Setgroups)?;
            for cap in 0..=spec.cap_last.min(63) {
                if !spec.bounding_cleared && spec.capabilities & (1u64 << cap) == 0 {
                    check(
                        libc::syscall(libc::SYS_prctl, libc::PR_CAPBSET_DROP, cap, 0, 0, 0),
                        Step::CapBounding,
                    )?;
                }
            }
            if spec.capabilities != 0 {
                check(
                    libc::syscall(libc::SYS_prctl, libc::PR_SET_KEEPCAPS, 1, 0, 0, 0),
                    Step::KeepCaps,
                )?;
            }
            check(libc::syscall(libc::SYS_setresgid, id.gid, id.gid, id.gid), Step::Setresgid)?;
            check(libc::syscall(libc::SYS_setresuid, id.uid, id.uid, id.uid), Step::Setresuid)?;
        }
        let header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
        let lo = (spec.capabilities & 0xffff_ffff) as u32;
        let hi = (spec.capabilities >> 32) as u32;
        let data = [
            CapData { effective: lo, permitted: lo, inheritable: lo },
            CapData { effective: hi, permitted: hi, inheritable: hi },
        ];
        check(libc::syscall(libc::SYS_capset, &raw const header, data.as_ptr()), Step::Capset)?;
        check(
            libc::syscall(
                libc::SYS_prctl,
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ),
            Step::Ambient,
        )?;
        for cap in 0..64u32 {
            if spec.capabilities & (1u64 << cap) != 0 {
                check(
                    libc::syscall(
                        libc::SYS_prctl,
                        libc::PR_CAP_AMBIENT,
                        libc::PR_CAP_AMBIENT_RAISE,
                        cap,
                        0,
                        0,
                    ),
                    Step::Ambient,
                )?;
            }
        }
        // Step 4h: die with the executor. Set after the uid change, which
        // clears it; the parent check closes the race with an executor that
        // died before.
        check(
            libc::syscall(libc::SYS_prctl, libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0),
            Step::ParentDeath,
        )?;
        if libc::syscall(libc::SYS_getppid) != c_long::from(spec.parent) {
            return Err((Step::ParentDeath, libc::ESRCH));
        }
        // Step 4i: Landlock, then seccomp last (it would deny nothing we
        // still need, but keeping it last keeps the filter minimal). A
        // child of a spawner thread already carries its filter (the spec's
        // program is empty then): nothing above is on its deny-list.
        if let Some(fd) = spec.landlock {
            check(libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32), Step::Landlock)?;
        }
        if !spec.seccomp.is_empty() {
            check(
                libc::syscall(
                    libc::SYS_seccomp,
                    SECCOMP_SET_MODE_FILTER,
                    0u32,
                    std::ptr::from_ref(fprog),
                ),
                Step::Seccomp,
            )?;
        }
        // Step 4c, made by the run: in every cgroup before the exec.
        if let Some(joining) = joined_by_run {
            joining.wait()?;
        }
        // Step 5: exec, timed first (through the vDSO, without a system
        // call where the clock source allows; a failed reading leaves the
        // time unset, which the parent takes as "now").
        if let Some(at) = spec.exec_at {
            let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            if libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut now) == 0 {
                at.store(monotonic_ns(&now), Ordering::Release);
            }
        }
        // Then the default scheduling: a real-time policy or a negative
        // nice value the executor runs with (children inherit them) is
        // not the skill's, and with RLIMIT_RTPRIO and RLIMIT_NICE at 0 it
        // cannot take them back. Last, after the timing: from here on a
        // real-time thread of the executor on this CPU comes first.
        let policy = check(libc::syscall(libc::SYS_sched_getscheduler, 0), Step::Scheduling)?;
        if real_time_policy(policy as c_int) {
            let param = libc::sched_param { sched_priority: 0 };
            check(
                libc::syscall(libc::SYS_sched_setscheduler, 0, libc::SCHED_OTHER, &raw const param),
                Step::Scheduling,
            )?;
        }
        // The raw call returns 20 - nice.
        if check(libc::syscall(libc::SYS_getpriority, libc::PRIO_PROCESS, 0), Step::Scheduling)?
            > 20
        {
            check(
                libc::syscall(libc::SYS_setpriority, libc::PRIO_PROCESS, 0, 0),
                Step::Scheduling,
            )?;
        }
        libc::syscall(libc::SYS_execve, spec.path.as_ptr(), spec.argv.as_ptr(), spec.envp.as_ptr());
        Err((Step::Exec, errno()))
    }
}
