//! Waiting for, signalling and reaping processes.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

/// How a process ended, as `wait4` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Exit status when it exited.
    pub code: Option<i32>,
    /// Signal number when a signal killed it.
    pub signal: Option<i32>,
    /// User + system CPU time it used, microseconds.
    pub cpu_us: u64,
}

fn cpu_us(tv: libc::timeval) -> u64 {
    let secs = u64::try_from(tv.tv_sec).unwrap_or(0);
    let micros = u64::try_from(tv.tv_usec).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

/// Held by every wait for "any child" ([`wait`] with -1) and by
/// [`while_unreaped`]: no child is reaped by pid -1 while it is held.
static ANY_CHILD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `wait4(pid)`: reaps `pid` (any child with -1, while holding the lock
/// that [`while_unreaped`] takes). `Ok(None)` when `nohang` and nothing has
/// exited yet.
///
/// # Errors
///
/// The errno of `wait4` (`ECHILD`: not our child, or already reaped).
pub fn wait(pid: libc::pid_t, nohang: bool) -> io::Result<Option<(libc::pid_t, Exit)>> {
    let _any = (pid == -1).then(|| ANY_CHILD.lock().unwrap_or_else(|e| e.into_inner()));
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; zeroed is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let flags = if nohang { libc::WNOHANG } else { 0 } | libc::__WALL;
    loop {
        // SAFETY: status and usage are valid, writable locals.
        let got = unsafe { libc::wait4(pid, &raw mut status, flags, &raw mut usage) };
        if got == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if got == 0 {
            return Ok(None);
        }
        let exit = Exit {
            code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
            signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
            cpu_us: cpu_us(usage.ru_utime).saturating_add(cpu_us(usage.ru_stime)),
        };
        return Ok(Some((got, exit)));
    }
}

/// Runs `f` while the child behind `pidfd` is provably not reaped, so its
/// pid is not another process's for the call: no wait for "any child" runs
/// meanwhile, and `waitid(P_PIDFD, WNOWAIT)` finds it (alive, or exited
/// but not reaped). `None`, without calling `f`, once it was reaped. The
/// caller makes sure nothing reaps it by its pid or pidfd meanwhile.
pub fn while_unreaped<R>(pidfd: RawFd, f: impl FnOnce() -> R) -> Option<R> {
    let id = libc::id_t::try_from(pidfd).ok()?;
    let _any = ANY_CHILD.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        // SAFETY: siginfo_t is plain data (zeroed is valid) and waitid
        // writes into the valid local; WNOWAIT leaves the child as it is.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PIDFD,
                id,
                &raw mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL,
            )
        };
        if r == 0 {
            return Some(f());
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return None;
        }
    }
}

/// `waitid(P_PIDFD)`: reaps the child behind `pidfd`, never another
/// process that reused its pid; blocks until it has exited.
///
/// # Errors
///
/// The errno of `waitid` (`ECHILD`: already reaped, e.g. by the orphan
/// reaper's `wait4(-1)`).
pub fn reap_pidfd(pidfd: BorrowedFd<'_>) -> io::Result<()> {
    let id = libc::id_t::try_from(pidfd.as_raw_fd())
        .map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    loop {
        // SAFETY: siginfo_t is plain data (zeroed is valid) and waitid
        // writes into the valid local; the pidfd is open (borrowed).
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PIDFD, id, &raw mut info, libc::WEXITED | libc::__WALL)
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Blocks until a child has exited, reaping none
/// (`waitid(P_ALL, WEXITED | WNOWAIT | __WALL)`, the children [`wait`]
/// with -1 reaps).
///
/// # Errors
///
/// The errno of `waitid` (`ECHILD`: no child at all).
pub fn until_a_child_exits() -> io::Result<()> {
    loop {
        // SAFETY: siginfo_t is plain data (zeroed is valid) and waitid
        // writes into the valid local; WNOWAIT leaves the child as it is.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_ALL,
                0,
                &raw mut info,
                libc::WEXITED | libc::WNOWAIT | libc::__WALL,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `pidfd_open(pid)`: a pidfd for the process `pid` now names.
///
/// # Errors
///
/// The errno of `pidfd_open` (`ESRCH`: no such process).
#[cfg(test)]
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a raw syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::last_os_error())?;
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel made this descriptor for us just now.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// `pidfd_send_signal(pidfd, sig)`. ESRCH (already gone) counts as success.
///
/// # Errors
///
/// Any other errno.
pub fn pidfd_signal(pidfd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: a raw syscall on a valid fd with no pointer arguments.
    let r =
        unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), sig, 0usize, 0u32) };
    if r == -1 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(e);
        }
    }
    Ok(())
}

/// Makes this process the reaper of its orphaned descendants
/// (`PR_SET_CHILD_SUBREAPER`), so a skill's daemonised leftovers become
/// our children and are reaped by us, not left as zombies of a PID 1 that
/// may not reap (this machine's does not).
///
/// # Errors
///
/// The errno of `prctl`.
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Highest capability number the kernel knows (`/proc/sys/kernel/cap_last_cap`).
pub fn cap_last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Registers a pidfd with the tokio reactor (readable = the process ended).
///
/// # Errors
///
/// The registration error, with the pidfd given back.
pub fn async_pidfd(
    pidfd: std::os::fd::OwnedFd,
) -> Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>, (std::os::fd::OwnedFd, io::Error)> {
    // SAFETY: an OwnedFd is a valid open fd, stays open while the AsyncFd
    // owns it, and always returns the same raw fd.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    }
    .map_err(tokio::io::unix::AsyncFdRegisterError::into_parts)
}

/// Sets the calling thread's signal mask to `SIGCHLD` alone (threads made
/// after inherit the mask; children reset theirs in step 4a).
///
/// Alone: a mask is inherited across `fork` and `exec`, and a parent that
/// blocked the stop signals around its spawn (a supervisor, a shell
/// script's `trap`, a tool waiting for them in a thread of its own) would
/// otherwise leave `SIGTERM` and `SIGINT` pending forever: the executor
/// would never stop on them. Signal handlers do not unblock a signal.
///
/// Nothing in the executor waits for the signal: runs reap their main
/// process by pid or pidfd and orphans with `waitpid`. But a child's exit
/// queues it for the executor and, while the spawner thread that made the
/// child blocks every signal (it does around `clone`, and a thread with a
/// child parked is always in `clone`), the kernel does not count it as
/// ignored: it wakes another thread of the executor to take it, which then
/// drops it. One wake-up of a thread, often on the other CPU, per run.
/// Blocked in every thread, the signal stays pending once and wakes no one.
///
/// # Errors
///
/// The error of `pthread_sigmask`.
pub fn mask_only_sigchld() -> io::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGCHLD);
    set.thread_set_mask().map_err(io::Error::from)
}

/// Whether the calling thread runs in a real-time policy (`SCHED_FIFO`,
/// `SCHED_RR` or `SCHED_DEADLINE`).
pub fn real_time() -> bool {
    // SAFETY: no arguments but pid 0, the calling thread.
    real_time_policy(unsafe { libc::sched_getscheduler(0) })
}

/// Tests: keeps the calling thread (and the threads and children it makes
/// after) on the first CPU.
#[cfg(test)]
pub(crate) fn pin_thread_to_first_cpu() {
    let mut first = nix::sched::CpuSet::new();
    first.set(0).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &first).unwrap();
}

/// Tests: puts the calling thread in scheduling `policy` at `priority`
/// (0 but for the real-time policies).
///
/// # Errors
///
/// The errno of `sched_setscheduler` (`EPERM` without `CAP_SYS_NICE`).
#[cfg(test)]
pub(crate) fn set_thread_policy(policy: libc::c_int, priority: i32) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: pid 0 is the calling thread; `param` is a valid local.
    if unsafe { libc::sched_setscheduler(0, policy, &raw const param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Tests: sets the calling thread's nice value.
///
/// # Errors
///
/// The errno of `setpriority` (`EACCES` lowering it without
/// `CAP_SYS_NICE`).
#[cfg(test)]
pub(crate) fn set_thread_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: integer arguments only; `who` 0 is the calling thread.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)`: for the calling thread (and what it
/// creates), which `seccomp(2)` requires without `CAP_SYS_ADMIN`.
///
/// # Errors
///
/// The error of `prctl`.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only; it changes this thread.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `seccomp(SECCOMP_SET_MODE_FILTER, flags, program)`: the filter on the
/// calling thread only (`flags` without `TSYNC`), inherited by what it
/// creates.
///
/// # Errors
///
/// `InvalidInput` for a program too long for `sock_fprog`, else the error
/// of `seccomp`.
pub fn install_thread_filter(program: &[libc::sock_filter], flags: u32) -> io::Result<()> {
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seccomp program too long"))?;
    let fprog = libc::sock_fprog { len, filter: program.as_ptr().cast_mut() };
    // SAFETY: `fprog` points to `program`, alive for the call, and holds its
    // length; `flags` holds no TSYNC: this thread only.
    let r = unsafe {
        libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, flags, &raw const fprog)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_CAPBSET_DROP, cap)` on the calling thread; false when refused
/// (without `CAP_SETPCAP`).
pub fn drop_bounding(cap: u32) -> bool {
    // SAFETY: prctl with integer arguments only; it changes this thread's
    // credentials.
    unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) == 0 }
}

const SCHED_DEADLINE: libc::c_int = 6;

/// The scheduling policy a run's child execs with: the calling thread's
/// own, but `SCHED_OTHER` for a real-time one (the child's step 5 resets
/// it), without `SCHED_RESET_ON_FORK`.
pub fn cold_run_policy() -> libc::c_int {
    let own = super::call::sched_getscheduler()
        .ok()
        .and_then(|p| libc::c_int::try_from(p).ok())
        .unwrap_or(libc::SCHED_OTHER);
    if real_time_policy(own) {
        libc::SCHED_OTHER
    } else {
        own & !libc::SCHED_RESET_ON_FORK
    }
}

/// Whether `policy` (as `sched_getscheduler` returns it, with or without
/// `SCHED_RESET_ON_FORK`) is a real-time one.
pub(super) fn real_time_policy(policy: libc::c_int) -> bool {
    let policy = policy & !libc::SCHED_RESET_ON_FORK;
    [libc::SCHED_FIFO, libc::SCHED_RR, SCHED_DEADLINE].contains(&policy)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// `f` runs while the child is ours (alive here), and not once it was
    /// reaped: its pid may be another process's then.
    #[test]
    #[allow(clippy::zombie_processes, reason = "reaped through its pidfd, never by a pid")]
    fn a_reaped_child_is_not_unreaped() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        let pidfd = pidfd_open(pid).unwrap();
        assert_eq!(while_unreaped(pidfd.as_raw_fd(), || 7), Some(7));
        child.kill().unwrap();
        // Reaped here, or by another test's wait for any child meanwhile.
        let _ = reap_pidfd(pidfd.as_fd());
        let mut ran = false;
        assert_eq!(while_unreaped(pidfd.as_raw_fd(), || ran = true), None);
        assert!(!ran);
    }
}
