//! What the parent gives the child it creates ([`ChildSpec`]) and what it
//! gets back: the child ([`Spawned`]) or the step that failed
//! ([`SpawnFailure`], [`Step`]).

use std::ffi::{c_char, CStr};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::AtomicU64;

/// The child's steps, in order. A failure reports the step and the errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Step {
    /// `clone` itself (in the parent).
    Clone = 1,
    /// `setsid`: new session, no controlling terminal.
    Setsid,
    /// `setns` into the runs' mount namespace (its `/proc` shows a run
    /// only its own processes).
    MountNs,
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
    const ALL: [Step; 21] = [
        Step::Clone,
        Step::Setsid,
        Step::MountNs,
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
            Step::MountNs => "enter the runs' mount namespace",
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
/// `spawn` call; both arrays must end with a null pointer.
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
    /// `floor` (`host::fdtable`); `stdio` and `landlock` must be below
    /// it. `None`: the table is copied at `clone`.
    pub share_below: Option<u32>,
    /// Classic BPF seccomp program; empty = none.
    pub seccomp: &'a [libc::sock_filter],
    /// The run's refusals are read back from the audit: Landlock's domain
    /// logs past the exec (ABI 7), the filter logs its refusals.
    pub log_denials: bool,
    /// The executor's pid, checked after `PR_SET_PDEATHSIG`.
    pub parent: libc::pid_t,
    /// The creating thread's capability bounding set is empty already (a
    /// spawner thread's, set by `spawner` only): step 4g skips
    /// its `PR_CAPBSET_DROP`s, which the child inherits done.
    pub bounding_cleared: bool,
    /// Where the child stores the time it calls `execve` (step 5), in
    /// nanoseconds of `CLOCK_MONOTONIC`: the end of the sandbox's setup as
    /// the child saw it, whenever the parent gets to run again.
    pub exec_at: Option<&'a AtomicU64>,
    /// `Some`: the child joins this mount namespace in step 4b, the runs'
    /// own (`host::procview`), whose `/proc` shows a run only its own
    /// processes. `None` for a child of a spawner thread, which lives in
    /// it already, and for a run granted the host's view.
    pub mount_ns: Option<RawFd>,
    /// The child drops to `SCHED_IDLE` once its cgroups are joined (step
    /// 4c), so the rest of its set-up, its `exec` and its start-up run
    /// only on CPU time no other thread wants: a warm run made ahead of
    /// its request.
    pub start_idle: bool,
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

/// True if every one of `fds` is below `floor`: what a child that shares
/// the table keeps (`close_range(floor, ~0, CLOSE_RANGE_UNSHARE)`).
pub fn all_below(floor: u32, fds: impl IntoIterator<Item = RawFd>) -> bool {
    fds.into_iter().all(|fd| u32::try_from(fd).is_ok_and(|fd| fd < floor))
}
