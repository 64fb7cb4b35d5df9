//! `ongrid-executor`: the privileged process that runs subprocess skills in
//! a sandbox and reports how each run ended.
//!
//! # Layout
//!
//! - [`config`]: `executor.toml` ([`Config`]), the operator's rules.
//! - [`plan`]: step 1, validating a request into a [`plan::Plan`].
//! - [`parsed`]: manifests parsed once per file content (by the open
//!   file's identity), for the server's check and the engine's runs.
//! - [`spawn`]: steps 2 to 5, preparing the sandbox and creating the child.
//! - [`landlock`]: which paths get which Landlock rights, per ABI.
//! - [`seccomp`]: the syscall deny-list, compiled to classic BPF.
//! - [`cgroup`]: the run's cgroups (tree kill, pids and memory bounds).
//! - [`dynmods`]: `favordynmods` on the cgroup hierarchies, so a cgroup
//!   join after an idle gap does not wait an RCU grace period.
//! - [`resolve`]: canonical paths by opening the file once (not a
//!   `readlink` per component; none at all for a plain path that opens
//!   crossing no symbolic link), the file kept for its metadata and bytes.
//! - [`egress`]: a run's egress allowlist as cgroup-BPF programs on its
//!   cgroup v2 leaf, and what they refused.
//! - [`rundir`]: the private per-run directory.
//! - [`supervise`]: steps 6 and 7, I/O bounds, deadline, tree kill.
//! - [`reaper`]: reaping main processes and orphans.
//! - [`engine`]: [`Engine`], one request in, one [`policy::RunReport`] out.
//! - `janitor`: the engine's run slots (directory and cgroup leaves) kept
//!   ready, recycled after a run and removed off the runs' path.
//! - [`instance`]: one engine's share of the host (cgroup parent, runs
//!   directory, the runs tmpfs) and the watchdog that kills and removes its
//!   runs when the executor dies.
//! - [`server`]: `ongrid-executor serve`, the executor wire on a Unix
//!   socket (peer check, admission and queue, cancellation, shutdown).
//! - [`metrics`]: the executor's Prometheus metrics on an injected registry.
//! - [`journald`]: log lines with journald's `<N>` priorities, no
//!   timestamp, when stderr is the journal's stream.
//! - [`sweep`]: removing what a dead executor left (by the watchdog, and
//!   by every executor at start).
//! - `sys`: the only unsafe code (raw syscalls, the child's sequence, the
//!   spawner threads, the descriptor table's floor, the allocator's mmap
//!   threshold: [`map_large_allocations`]).
//!
//! # Trust model
//!
//! The executor runs as root and trusts nothing its caller says beyond
//! "run the skill whose manifest is at P with these args". It re-reads and
//! re-validates the manifest under its own root-owned configuration, checks
//! that the entry lies under an allow-list root and that the entry and every
//! folder up to that root are owned by an `entry_owners` user and not
//! group/world writable, and grants a manifest's `sandbox` object only what
//! `executor.toml` grants that skill by name. The skill is hostile: it runs
//! as an unprivileged user with no capabilities, `no_new_privs`, Landlock,
//! seccomp, rlimits and its own cgroup, and everything it writes back is
//! bounded: its files too (its directory is on a tmpfs whose pages are
//! charged to its memory cgroup). The skill's processes never outlive the
//! executor: a watchdog that holds nothing but a pipe from the executor
//! kills the instance's whole cgroup when that pipe closes. Nothing the
//! skill wrote steers a cleanup (the sweep trusts only files owned by the
//! executor's user, in directories the skill cannot write).
//!
//! # Spawn sequence
//!
//! The numbered steps of DESIGN.md §4; the code carries `// Step N:` comments.
//!
//! 1. Validate the request against the executor's own config ([`plan`]).
//!    In `serve` the pre-admission check opens the manifest and places it
//!    under its root once, and hands the open file, its root and the
//!    manifest parsed from it (cached by the file's identity, [`parsed`];
//!    an engine's runs named by path use the same cache) to the plan
//!    ([`plan::Located`]): the file checked is the file run. The allowed
//!    environment comes from the engine's copy of the process environment,
//!    read once when the engine is made.
//! 2. Prepare everything in the parent ([`spawn::prepare`]): the
//!    environment (exactly `env_allow`), argv, rlimit values, the Landlock
//!    ruleset fd, the seccomp program, the cgroup leaves with their
//!    `cgroup.procs` opened, the per-run directory, the stdio pipes
//!    (made with the slot, so ahead of the run by the janitor when the
//!    slot is made ahead: [`spawn::Slot`]). Leaves and directory
//!    belong to the engine's instance ([`instance`], set up once by
//!    [`Engine::new`]: `.../ongrid/<instance>/<run>` in each hierarchy,
//!    `<runtime_dir>/runs/<instance>/<slot>/<run>` on the runs tmpfs, the
//!    slot's directory holding only the run's). The Landlock ruleset
//!    grants beneath the slot's directory, so a ruleset built for a run is
//!    reused by later runs of the same policy in the same slot
//!    ([`landlock::Cache`]: same rules, same files at every path; the
//!    system paths are opened once per process and watched with inotify,
//!    reopened when a parent directory changes). A held
//!    run (the wire's `execute` with `hold`) waits here, prepared, for its
//!    caller's `start` ([`Engine::run_held`]); nothing is spawned before.
//! 3. Create the child with `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)`
//!    on a parent-allocated stack, the way `posix_spawn` does: the cost does
//!    not grow with the executor's memory (no page tables copied, unlike
//!    `fork`, which costs 65 ms from a 2 GiB parent on the dev machine), and
//!    nothing is allocated between clone and exec. `clone3` with
//!    `CLONE_INTO_CGROUP` would also save the cgroup migration, but glibc
//!    exposes no `clone3` wrapper that runs a function on a new stack, and
//!    the child joining by writing "0" to pre-opened `cgroup.procs` files
//!    measured about 0.25 ms on this machine. In `serve` the clone is made
//!    by one of the engine's spawner threads ([`spawn::Spawners`]), which
//!    carry the run's seccomp filter (installed once per thread, on that
//!    thread only): the child inherits it instead of compiling it (~90
//!    µs). A one-shot `run` has one child, which installs it (step 4i).
//!    The child shares the executor's descriptor table (`CLONE_FILES`)
//!    until its cgroups are joined, when the kernel allows it: see step 4.
//!    A spawner thread creates its child ahead of the run (without
//!    `CLONE_VFORK`: the thread waits in `futex`, not in uninterruptible
//!    sleep, which the load average would count): the child takes
//!    steps 4a and 4b, sets its parent-death signal and waits in the
//!    thread's berth (`sys`'s `berth`: a futex, the table shared, nothing
//!    of a run held) until a run gives it its prepared spec and wakes it;
//!    it then takes steps 4c to 5 as a child made for the run does. With
//!    the spec the run gives a handoff whose word the child makes its
//!    clear-child-tid address: the kernel wakes the run at the child's
//!    `exec` (or exit), and the run then tells the spawner thread, so the
//!    run is not woken second-hand; the only run in flight watches
//!    that word without sleeping for up to [`engine::EXEC_SPIN`] first,
//!    so its vCPU does not halt meanwhile (yielding its CPU between looks,
//!    so a child queued there runs at once). A run that finds no child
//!    parked waits for the next thread that is done, which makes one for
//!    it. Before the clone (or the hand-over) the run moves the
//!    descriptors its child keeps (the three pipe ends and the Landlock
//!    ruleset) onto a band of low numbers reserved at start (`sys`'s
//!    `fdtable`), so that step 4d copies a few descriptors, not the ~100
//!    that the executor holds below the floor under load.
//! 4. In the child, raw syscalls only: (4a) default signal dispositions;
//!    (4b) new session (`setsid`, no controlling terminal); (4c) join the
//!    cgroups (a parked child whose run watches for its exec leaves the
//!    joins to the run: the run's thread writes the child's pid into the
//!    leaves' `cgroup.procs` while the child takes 4d to 4i, and the
//!    child waits for that before step 5: `sys`'s `join`); (4d) a
//!    descriptor table of its own holding only what is below its floor
//!    (`close_range(floor, ~0, CLOSE_RANGE_UNSHARE)`; the floor is the top
//!    of the band its descriptors were placed on, else the table's floor,
//!    above which the cgroup files and the executor's other long-lived
//!    descriptors live: `sys`'s `fdtable`); pipes on 0, 1, 2 and every
//!    other fd close-on-exec;
//!    `chdir` into the run
//!    directory; rlimits (CORE 0, NOFILE, FSIZE, CPU, AS, RTPRIO 0, NICE
//!    0); `no_new_privs`;
//!    clear supplementary groups, drop the bounding set (inherited empty
//!    from a spawner thread when no capability is granted), switch to the
//!    run-as user and set exactly the granted capabilities (ambient too);
//!    `PR_SET_PDEATHSIG(SIGKILL)`; Landlock; seccomp (without the network
//!    grant `socket(2)` fails for every family, `AF_UNIX` included, and
//!    `socketpair(2)` gives stream and seqpacket pairs only; a run whose
//!    uid may own files outside the box cannot change any file's
//!    metadata), which is already in place when the child came from a
//!    spawner thread.
//! 5. `execve` the entry with argv = `[entry]` and the prepared environment.
//!    A failing step writes (step, errno) into the parent's memory and
//!    exits; the parent reports `sandbox_failed` or `spawn_failed`. Just
//!    before the call the child stores the time (`CLOCK_MONOTONIC`, through
//!    the vDSO) in the run's memory: the report's `setup_us` ends there,
//!    not when the run's thread next gets a CPU, which under the default
//!    scheduling policy can be after the skill has run. Then it leaves a
//!    real-time policy or negative nice value inherited from the executor
//!    (the skill gets the default scheduling; RTPRIO and NICE limits of 0
//!    keep it there); last, so that up to here it keeps the executor's
//!    priority (a real-time executor does not spin for the exec).
//! 6. Supervise ([`supervise`]): args to stdin then EOF (args that fit in
//!    the pipe, nearly all, are put there with the EOF behind them before
//!    step 3, so the skill never waits on the executor for them), stdout up
//!    to its cap, stderr streamed line by line, the deadline (SIGTERM,
//!    grace, SIGKILL), cancellation. The main process's exit is collected
//!    with one `wait4(WNOHANG)` once both pipes are at end of file (most
//!    runs; the only run in flight looks again without sleeping for up to
//!    [`engine::EXEC_SPIN`], as the end of file comes while the process
//!    exits), and waited on through its pidfd, registered only then, when
//!    it has not ended yet or 10 ms after the start.
//! 7. On any end, kill the whole tree (`cgroup.kill`, not needed when the
//!    v2 leaf is already unpopulated at the main process's exit; SIGCONT
//!    with SIGTERM so stopped processes see it), reap (the executor is a
//!    child subreaper, so orphans are reaped too; by pid, pidfd and
//!    `waitpid`, never by `SIGCHLD`, which every thread of the binary
//!    blocks, so an exit wakes no thread), remove the cgroups and
//!    the run directory (from the engine's second run on, a janitor thread
//!    does it right after the report is written, as the run's pipes and
//!    pidfd are closed then, or within 20 ms with the next runs' (woken
//!    for a batch of them), and keeps slots ready: `janitor`; a finished run's
//!    leaves, once provably empty and reset, serve a later run with a fresh
//!    run directory in the same slot directory, once that is found as it
//!    was made, instead of being removed and made again). If the
//!    executor itself dies mid-run, the main process gets its parent-death
//!    signal and the instance's watchdog does this step for every run
//!    (`cgroup.kill` of the instance parent, then removal).
//! 8. Report ([`engine::classify`]): outcome, limit, result, stderr tail,
//!    and what the sandbox enforced.
//!
//! # Test strategy
//!
//! Pure decisions are unit-tested where they live: config parsing, the
//! Landlock rights per ABI, the seccomp program (through a small BPF
//! interpreter), the outcome classification. `executor/tests/` drives the
//! real `run` path end to end against scripts in temporary directories:
//! as root it checks the sandbox from inside the skill (`/proc/self/status`,
//! denied files, sockets), as another user the root-only checks are skipped
//! with a printed reason. The workspace `tests/` crate holds the
//! adversarial suite against the `ongrid-executor` binary.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod attach_lock;
pub mod cgroup;
pub mod cli;
pub mod config;
pub mod delegation;
pub mod dynmods;
pub mod egress;
pub mod engine;
pub mod instance;
mod janitor;
pub mod journald;
pub mod landlock;
pub mod metrics;
pub mod parsed;
pub mod plan;
pub mod reaper;
pub mod resolve;
pub mod rundir;
pub mod seccomp;
pub mod server;
pub mod spawn;
pub mod supervise;
pub mod sweep;
pub(crate) mod sys;

/// Serves large allocations (a flooding skill's stdout buffers) from their
/// own mappings, given back to the kernel when freed, instead of glibc's
/// heap, which keeps them (`sys::memory`). The binary calls it first,
/// before any thread. Returns whether glibc took the setting.
pub fn map_large_allocations() -> bool {
    sys::memory::map_large_allocations(sys::memory::LARGE_ALLOCATION)
}

/// Raises the soft `RLIMIT_NOFILE` towards the hard one
/// (`sys::fdtable::raise_nofile`): systemd starts services at 1024. The
/// binary calls it first, before the descriptor floor is decided. Returns
/// the soft limit before and after.
///
/// # Errors
///
/// The error of `getrlimit` or `setrlimit`.
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    sys::fdtable::raise_nofile()
}

/// Sets the calling thread's signal mask to `SIGCHLD` alone, and so every
/// thread's made after it (`sys::process::mask_only_sigchld`): an inherited
/// mask blocking the stop signals is cleared. The binary calls it first,
/// before any thread.
///
/// # Errors
///
/// The error of `pthread_sigmask`.
pub fn mask_only_sigchld() -> std::io::Result<()> {
    sys::process::mask_only_sigchld()
}
pub mod systemd;

pub use config::{Config, ConfigError, LandlockMode};
pub use engine::{Engine, EngineError, RunRequest};
pub use janitor::SlotCounts;
pub use metrics::Metrics;
