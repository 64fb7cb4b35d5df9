//! The child's system calls between `clone` and `execve`: one raw
//! `syscall(2)` per function, on values the parent built, allocating
//! nothing and touching no shared state (never glibc's `setuid` family,
//! which signals every thread of the shared address space). Each returns
//! the call's result, or its errno.

use std::ffi::{c_char, c_int, c_long, c_ulong, CStr};
use std::os::fd::RawFd;

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

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const SECCOMP_SET_MODE_FILTER: c_long = 1;
/// `SECCOMP_FILTER_FLAG_LOG`: the filter's refusals (other than `allow`)
/// are sent to the kernel's audit.
pub const SECCOMP_FILTER_FLAG_LOG: u32 = 1 << 1;
/// `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON` (ABI 7): the domain's
/// refusals are sent to the audit after an `execve` too (by default only
/// until the first one, and skills are exec'd after the restriction).
pub const LANDLOCK_LOG_NEW_EXEC_ON: u32 = 1 << 1;
/// `close_range` flag: set close-on-exec instead of closing.
pub const CLOSE_RANGE_CLOEXEC: c_long = 1 << 2;
/// `close_range` flag: unshare the descriptor table first.
pub const CLOSE_RANGE_UNSHARE: c_long = 1 << 1;

/// The calling thread's errno (in a child: see the SAFETY note).
pub fn errno() -> i32 {
    // SAFETY: __errno_location returns a valid pointer to the calling
    // thread's errno (in the child: its parent thread's, which is suspended
    // (what posix_spawn relies on too) or, for a parked child, asleep with
    // every signal blocked and no system call that fails before the child
    // is gone: `clone_parked`).
    unsafe { *libc::__errno_location() }
}

/// A raw syscall result: -1 → the errno.
fn checked(ret: c_long) -> Result<c_long, i32> {
    if ret == -1 {
        Err(errno())
    } else {
        Ok(ret)
    }
}

/// `rt_sigaction(sig, SIG_DFL)`, with an empty mask and no flags.
pub fn default_disposition(sig: c_int) -> Result<c_long, i32> {
    let dfl = KernelSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: reads `dfl`, a local; no old action is asked for.
    checked(unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, &raw const dfl, 0usize, 8usize) })
}

/// `rt_sigprocmask(SIG_SETMASK, {})`: every signal unblocked.
pub fn unblock_all_signals() -> Result<c_long, i32> {
    let empty: u64 = 0;
    // SAFETY: reads `empty`, a local; no old mask is asked for.
    checked(unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, &raw const empty, 0usize, 8)
    })
}

/// `setsid()`.
pub fn setsid() -> Result<c_long, i32> {
    // SAFETY: no arguments.
    checked(unsafe { libc::syscall(libc::SYS_setsid) })
}

/// `write(fd, bytes)`: the count written.
pub fn write(fd: RawFd, bytes: &[u8]) -> Result<c_long, i32> {
    // SAFETY: reads `bytes`, borrowed for the call.
    checked(unsafe { libc::syscall(libc::SYS_write, fd, bytes.as_ptr(), bytes.len()) })
}

/// `close_range(first, last, flags)`.
pub fn close_range(first: u32, last: u32, flags: c_long) -> Result<c_long, i32> {
    // SAFETY: integer arguments only.
    checked(unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) })
}

/// `dup3(fd, target, 0)`.
pub fn dup3(fd: RawFd, target: c_int) -> Result<c_long, i32> {
    // SAFETY: integer arguments only.
    checked(unsafe { libc::syscall(libc::SYS_dup3, fd, target, 0) })
}

/// `chdir(path)`.
pub fn chdir(path: &CStr) -> Result<c_long, i32> {
    // SAFETY: reads `path`, a C string borrowed for the call.
    checked(unsafe { libc::syscall(libc::SYS_chdir, path.as_ptr()) })
}

/// `prlimit64(0, resource, {soft, hard}, NULL)`: this process's limit.
pub fn prlimit(resource: u32, soft: u64, hard: u64) -> Result<c_long, i32> {
    let lim = libc::rlimit64 { rlim_cur: soft, rlim_max: hard };
    // SAFETY: reads `lim`, a local; no old limit is asked for.
    checked(unsafe { libc::syscall(libc::SYS_prlimit64, 0, resource, &raw const lim, 0usize) })
}

/// `prctl(option, arg2, arg3, 0, 0)`.
pub fn prctl(option: c_int, arg2: c_ulong, arg3: c_ulong) -> Result<c_long, i32> {
    // SAFETY: integer arguments only.
    checked(unsafe { libc::syscall(libc::SYS_prctl, option, arg2, arg3, 0, 0) })
}

/// `setgroups(0, NULL)`: no supplementary groups.
pub fn clear_groups() -> Result<c_long, i32> {
    // SAFETY: an empty list, no pointer read.
    checked(unsafe { libc::syscall(libc::SYS_setgroups, 0, 0usize) })
}

/// `setresgid(gid, gid, gid)`, for this thread only (the raw call).
pub fn setresgid(gid: u32) -> Result<c_long, i32> {
    // SAFETY: integer arguments only.
    checked(unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) })
}

/// `setresuid(uid, uid, uid)`, for this thread only (the raw call).
pub fn setresuid(uid: u32) -> Result<c_long, i32> {
    // SAFETY: integer arguments only.
    checked(unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) })
}

/// `capset`: effective, permitted and inheritable sets all `caps` (bit n =
/// capability n).
pub fn capset(caps: u64) -> Result<c_long, i32> {
    let header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let lo = (caps & 0xffff_ffff) as u32;
    let hi = (caps >> 32) as u32;
    let data = [
        CapData { effective: lo, permitted: lo, inheritable: lo },
        CapData { effective: hi, permitted: hi, inheritable: hi },
    ];
    // SAFETY: reads `header` and the two `data` entries, locals.
    checked(unsafe { libc::syscall(libc::SYS_capset, &raw const header, data.as_ptr()) })
}

/// `getppid()`.
pub fn getppid() -> libc::pid_t {
    // SAFETY: no arguments.
    let ppid = unsafe { libc::syscall(libc::SYS_getppid) };
    libc::pid_t::try_from(ppid).unwrap_or(0)
}

/// `setns(fd, nstype)`: the calling task (a child with a filesystem
/// context of its own) joins the namespace `fd` names.
pub fn setns(fd: RawFd, nstype: c_int) -> Result<c_long, i32> {
    // SAFETY: integer arguments only.
    checked(unsafe { libc::syscall(libc::SYS_setns, fd, nstype) })
}

/// `landlock_restrict_self(ruleset, flags)`.
pub fn landlock_restrict_self(ruleset: RawFd, flags: u32) -> Result<c_long, i32> {
    // SAFETY: integer arguments only.
    checked(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, flags) })
}

/// `seccomp(SECCOMP_SET_MODE_FILTER, flags, fprog)`: this thread only
/// (`flags` without `TSYNC`).
pub fn seccomp_filter(fprog: &libc::sock_fprog, flags: u32) -> Result<c_long, i32> {
    // SAFETY: reads `fprog` and the program it points to, which its
    // builder keeps alive for the call.
    checked(unsafe {
        libc::syscall(libc::SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, std::ptr::from_ref(fprog))
    })
}

/// `sched_getscheduler(0)`: this thread's policy.
pub fn sched_getscheduler() -> Result<c_long, i32> {
    // SAFETY: integer arguments only.
    checked(unsafe { libc::syscall(libc::SYS_sched_getscheduler, 0) })
}

/// `sched_setscheduler(0, SCHED_OTHER, {0})`.
pub fn sched_set_other() -> Result<c_long, i32> {
    sched_set_of(0, libc::SCHED_OTHER)
}

/// `sched_setscheduler(tid, policy, {0})` (`tid` 0: the calling thread).
/// For another user's thread the caller needs `CAP_SYS_NICE`.
pub fn sched_set_of(tid: libc::pid_t, policy: c_int) -> Result<c_long, i32> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: reads `param`, a local.
    checked(unsafe { libc::syscall(libc::SYS_sched_setscheduler, tid, policy, &raw const param) })
}

/// `getpriority(PRIO_PROCESS, 0)` as the raw call returns it: 20 - nice.
pub fn getpriority() -> Result<c_long, i32> {
    // SAFETY: integer arguments only.
    checked(unsafe { libc::syscall(libc::SYS_getpriority, libc::PRIO_PROCESS, 0) })
}

/// `setpriority(PRIO_PROCESS, 0, 0)`: a nice value of 0.
pub fn setpriority_zero() -> Result<c_long, i32> {
    // SAFETY: integer arguments only.
    checked(unsafe { libc::syscall(libc::SYS_setpriority, libc::PRIO_PROCESS, 0, 0) })
}

/// `set_tid_address(word)`: the kernel zeroes `word` and wakes a shared
/// `futex` waiter on it at this thread's exec or exit. Returns the
/// caller's tid.
pub fn set_tid_address(word: &std::sync::atomic::AtomicU32) -> libc::pid_t {
    // SAFETY: the caller keeps `word` alive until this thread execs or
    // exits (the kernel writes it then).
    let tid = unsafe { libc::syscall(libc::SYS_set_tid_address, word.as_ptr()) };
    libc::pid_t::try_from(tid).unwrap_or(0)
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

/// `execve(path, argv, envp)`: returns only on failure, with its errno.
pub fn execve(path: &CStr, argv: &[*const c_char], envp: &[*const c_char]) -> i32 {
    // SAFETY: `path` is a C string; `argv` and `envp` are null-terminated
    // arrays of C strings (checked by `check_spec`) that the parent keeps
    // alive until the child exec'd or exited.
    unsafe { libc::syscall(libc::SYS_execve, path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    errno()
}

/// `_exit(code)`: ends only this child, running no atexit handler and
/// touching no shared heap.
pub fn exit(code: c_int) -> ! {
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(code) }
}
