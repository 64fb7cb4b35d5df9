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

use std::ffi::{c_int, c_ulong, c_void};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use super::call::{self, errno, monotonic_now_ns};
use super::process::real_time_policy;
use super::spec::{ChildSpec, Identity, SpawnFailure, Spawned, Step};
use crate::run::join::Joining;

/// Memory shared with the `CLONE_VM` child.
struct Shared<'s, 'a> {
    spec: &'s ChildSpec<'a>,
    fprog: libc::sock_fprog,
    step: AtomicU32,
    errno: AtomicI32,
}

const CHILD_STACK_BYTES: usize = 256 << 10;

thread_local! {
    static CHILD_STACK: std::cell::Cell<Option<Box<[u8]>>> = const { std::cell::Cell::new(None) };
}
/// Tags a call's errno with the step it failed.
fn at<T>(step: Step, r: Result<T, i32>) -> Result<T, (Step, i32)> {
    r.map_err(|e| (step, e))
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
        let kept = spec.stdio.into_iter().chain(spec.landlock);
        if !super::spec::all_below(floor, kept) {
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
        // By its pidfd: the reaper thread may have reaped it already, and
        // its pid may name another child by now.
        let _ = super::process::reap_pidfd(std::os::fd::AsFd::as_fd(&pidfd));
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
    let failed = match fresh_process().and_then(|()| enter_mount_ns(shared.spec.mount_ns)) {
        Ok(()) => sandbox_and_exec(shared.spec, &shared.fprog, sharing, None),
        Err(e) => e,
    };
    record(&shared.step, &shared.errno, failed);
    call::exit(127)
}

/// Stores a failed step for the parent (which reads it after `clone`).
pub(super) fn record(step: &AtomicU32, errno: &AtomicI32, (failed, e): (Step, i32)) {
    errno.store(e, Ordering::Release);
    step.store(failed as u32, Ordering::Release);
}

/// Steps 4a and 4b, which do not depend on the run: default signal
/// dispositions and an empty mask, then a new session. Child only.
pub(super) fn fresh_process() -> Result<(), (Step, i32)> {
    // Step 4a: default signal dispositions, empty mask (a failure here
    // leaves an inherited disposition, which the exec resets anyway).
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            let _ = call::default_disposition(sig);
        }
    }
    let _ = call::unblock_all_signals();
    // Step 4b: new session, no controlling terminal.
    at(Step::Setsid, call::setsid())?;
    Ok(())
}

/// Step 4b, last: the runs' mount namespace, whose `/proc` shows a run
/// only what it could `ptrace` (`host::procview`). Before step 4d's
/// `chdir` (joining a mount namespace moves the working directory to its
/// root) and step 4g (it needs `CAP_SYS_ADMIN`).
fn enter_mount_ns(ns: Option<RawFd>) -> Result<(), (Step, i32)> {
    if let Some(fd) = ns {
        at(Step::MountNs, call::setns(fd, libc::CLONE_NEWNS))?;
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

/// Steps 4c to 5, in order; each step a short function of raw calls
/// ([`super::call`]). Returns only on failure, with the step.
fn sandbox(
    spec: &ChildSpec<'_>,
    fprog: &libc::sock_fprog,
    sharing: bool,
    joining: Option<&Joining>,
) -> Result<std::convert::Infallible, (Step, i32)> {
    // Step 4c's decision: a child that takes its run's offer up leaves
    // the joins to the run (`super::join`).
    let joined_by_run = joining.filter(|j| j.accept());
    // Step 4c: cgroups (v2 leaf for the tree kill, v1 leaves for limits),
    // unless the run makes the joins meanwhile (waited for before step 5).
    if joined_by_run.is_none() {
        join_cgroups(spec.cgroup_procs)?;
    }
    // A warm run made ahead goes on at SCHED_IDLE (lowering its own policy
    // needs no privilege): the rest of its set-up, its exec and start-up
    // give way to any other thread. Not before the joins: a cgroup
    // migration holds the host's cgroup locks, which no thread should
    // wait on while their holder waits for idle CPU time; what follows
    // takes only locks of its own process. A refusal leaves it at the
    // default policy, as a cold run: a warm run made anyway.
    if spec.start_idle {
        let _ = call::sched_set_of(0, libc::SCHED_IDLE);
    }
    // Step 4d: a descriptor table of our own, stdio, the run directory.
    own_descriptors(spec, sharing)?;
    at(Step::Chdir, call::chdir(spec.cwd))?;
    // Step 4e: resource limits.
    set_rlimits(spec.rlimits)?;
    // Step 4f: no_new_privs.
    at(Step::NoNewPrivs, call::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0))?;
    // Step 4g: the run-as user, and only the granted capabilities.
    if let Some(id) = spec.identity {
        switch_user(spec, id)?;
    }
    set_capabilities(spec.capabilities)?;
    // Step 4h: die with the executor.
    die_with_parent(spec.parent)?;
    // Step 4i: Landlock, then seccomp.
    restrict(spec, fprog)?;
    // Step 4c, made by the run: in every cgroup before the exec.
    if let Some(joining) = joined_by_run {
        joining.wait()?;
    }
    // Step 5: exec, timed first, then the default scheduling.
    if let Some(exec_at) = spec.exec_at {
        time_exec(exec_at);
    }
    default_scheduling()?;
    Err((Step::Exec, call::execve(spec.path, spec.argv, spec.envp)))
}

/// Step 4c: writes "0" (this process) to each open `cgroup.procs`.
fn join_cgroups(procs: &[RawFd]) -> Result<(), (Step, i32)> {
    for fd in procs {
        match call::write(*fd, b"0") {
            Ok(1) => {}
            Ok(_) => return Err((Step::Cgroup, call::errno())),
            Err(e) => return Err((Step::Cgroup, e)),
        }
    }
    Ok(())
}

/// Step 4d: a table of our own (sharing the parent's, we have not touched
/// it so far), keeping only what is below the floor: the cgroup files and
/// the executor's other long-lived descriptors above it are neither
/// copied nor closed again at exec. Without a floor, a copy of all of it
/// (the range closed is empty). Then stdio, and every other fd
/// close-on-exec.
fn own_descriptors(spec: &ChildSpec<'_>, sharing: bool) -> Result<(), (Step, i32)> {
    if sharing {
        let first = spec.share_below.unwrap_or(u32::MAX);
        at(Step::CloseFds, call::close_range(first, u32::MAX, call::CLOSE_RANGE_UNSHARE))?;
    }
    for (target, fd) in (0..).zip(spec.stdio) {
        at(Step::Stdio, call::dup3(fd, target))?;
    }
    at(Step::CloseFds, call::close_range(3, u32::MAX, call::CLOSE_RANGE_CLOEXEC))?;
    Ok(())
}

/// Step 4e: each `(resource, soft, hard)`.
fn set_rlimits(rlimits: &[(u32, u64, u64)]) -> Result<(), (Step, i32)> {
    for (resource, soft, hard) in rlimits {
        at(Step::Rlimits, call::prlimit(*resource, *soft, *hard))?;
    }
    Ok(())
}

/// Step 4g, as root: no supplementary groups, the bounding set down to
/// the granted capabilities (unless inherited empty), the capabilities
/// kept across the uid change when some are granted, then the run-as
/// group and user.
fn switch_user(spec: &ChildSpec<'_>, id: Identity) -> Result<(), (Step, i32)> {
    at(Step::Setgroups, call::clear_groups())?;
    if !spec.bounding_cleared {
        for cap in 0..=spec.cap_last.min(63) {
            if spec.capabilities & (1u64 << cap) == 0 {
                let drop = call::prctl(libc::PR_CAPBSET_DROP, c_ulong::from(cap), 0);
                at(Step::CapBounding, drop)?;
            }
        }
    }
    if spec.capabilities != 0 {
        at(Step::KeepCaps, call::prctl(libc::PR_SET_KEEPCAPS, 1, 0))?;
    }
    at(Step::Setresgid, call::setresgid(id.gid))?;
    at(Step::Setresuid, call::setresuid(id.uid))?;
    Ok(())
}

/// Step 4g, last part: exactly the granted capabilities, ambient too.
fn set_capabilities(caps: u64) -> Result<(), (Step, i32)> {
    at(Step::Capset, call::capset(caps))?;
    let clear = libc::PR_CAP_AMBIENT_CLEAR_ALL as c_ulong;
    at(Step::Ambient, call::prctl(libc::PR_CAP_AMBIENT, clear, 0))?;
    for cap in 0..64u32 {
        if caps & (1u64 << cap) != 0 {
            let raise = libc::PR_CAP_AMBIENT_RAISE as c_ulong;
            at(Step::Ambient, call::prctl(libc::PR_CAP_AMBIENT, raise, c_ulong::from(cap)))?;
        }
    }
    Ok(())
}

/// Step 4h: die with the executor. Set after the uid change, which clears
/// it; the parent check closes the race with an executor that died
/// before.
pub(super) fn die_with_parent(parent: libc::pid_t) -> Result<(), (Step, i32)> {
    let sigkill = libc::SIGKILL as c_ulong;
    at(Step::ParentDeath, call::prctl(libc::PR_SET_PDEATHSIG, sigkill, 0))?;
    if call::getppid() != parent {
        return Err((Step::ParentDeath, libc::ESRCH));
    }
    Ok(())
}

/// Step 4i: Landlock, then seccomp last (it would deny nothing we still
/// need, but keeping it last keeps the filter minimal). A child of a
/// spawner thread already carries its filter (the spec's program is empty
/// then): nothing above is on its deny-list.
fn restrict(spec: &ChildSpec<'_>, fprog: &libc::sock_fprog) -> Result<(), (Step, i32)> {
    // Logging only where the run's refusals are read back (the kernel
    // prints seccomp's logged refusals even with its audit off).
    let (ll_flags, sc_flags) = if spec.log_denials {
        (call::LANDLOCK_LOG_NEW_EXEC_ON, call::SECCOMP_FILTER_FLAG_LOG)
    } else {
        (0, 0)
    };
    if let Some(fd) = spec.landlock {
        at(Step::Landlock, call::landlock_restrict_self(fd, ll_flags))?;
    }
    if !spec.seccomp.is_empty() {
        at(Step::Seccomp, call::seccomp_filter(fprog, sc_flags))?;
    }
    Ok(())
}

/// Step 5, first: the time of the exec, through the vDSO (without a system
/// call where the clock source allows; a failed reading leaves the time
/// unset, which the parent takes as "now").
fn time_exec(exec_at: &AtomicU64) {
    if let Some(now) = monotonic_now_ns() {
        exec_at.store(now, Ordering::Release);
    }
}

/// Step 5, then: the default scheduling. A real-time policy or a negative
/// nice value the executor runs with (children inherit them) is not the
/// skill's, and with RLIMIT_RTPRIO and RLIMIT_NICE at 0 it cannot take
/// them back. Last, after the timing: from here on a real-time thread of
/// the executor on this CPU comes first.
fn default_scheduling() -> Result<(), (Step, i32)> {
    let policy = at(Step::Scheduling, call::sched_getscheduler())?;
    if real_time_policy(c_int::try_from(policy).unwrap_or(0)) {
        at(Step::Scheduling, call::sched_set_other())?;
    }
    // The raw call returns 20 - nice.
    if at(Step::Scheduling, call::getpriority())? > 20 {
        at(Step::Scheduling, call::setpriority_zero())?;
    }
    Ok(())
}
