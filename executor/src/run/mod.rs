//! The run path: one request in, one [`policy::RunReport`] out.
//!
//! - [`engine`]: [`Engine`](engine::Engine), which takes a run through the
//!   steps below.
//! - [`plan`]: step 1, validating a request into a [`plan::Plan`].
//! - [`parsed`]: manifests parsed once per file content (by the open
//!   file's identity), for the server's check and the engine's runs.
//! - [`resolve`]: canonical paths by opening the file once, the file kept
//!   for its metadata and bytes.
//! - [`spawn`]: steps 2 to 5, preparing the sandbox and creating the child;
//!   [`spawner`]: the spawner threads that create children ahead of runs.
//! - [`rundir`]: the private per-run directory.
//! - [`supervise`]: steps 6 and 7, I/O bounds, deadline, tree kill.
//! - [`reaper`]: reaping main processes and orphans.
//! - `janitor`: the run slots (directory and cgroup leaves) kept ready,
//!   recycled after a run and removed off the runs' path.
//! - [`warm`]: warm runs, taken through steps 1 to 5 ahead of any request
//!   and blocked reading their args; a request with the same plan identity
//!   takes one and starts at step 6.
//!
//! # Spawn sequence
//!
//! The code marks each step with a `// Step N:` comment.
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
//!    belong to the engine's instance ([`instance`](crate::host::instance), set up once by
//!    [`Engine::new`](engine::Engine::new): `.../ongrid/<instance>/<run>` in each hierarchy,
//!    `<runtime_dir>/runs/<instance>/<slot>/<run>` on the runs tmpfs, the
//!    slot's directory holding only the run's). The Landlock ruleset
//!    grants beneath the slot's directory, so a ruleset built for a run is
//!    reused by later runs of the same policy in the same slot
//!    ([`landlock::Cache`](crate::sandbox::landlock::Cache): same rules, same files at every path; the
//!    system paths are opened once per process and watched with inotify,
//!    reopened when a parent directory changes). A held
//!    run (the wire's `execute` with `hold`) waits here, prepared, for its
//!    caller's `start` ([`Engine::run_held`](engine::Engine::run_held)); nothing is spawned before.
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
//!    thread's berth (`run::lend`, `sys::berth`: a futex, the table shared, nothing
//!    of a run held) until a run gives it its prepared spec and wakes it;
//!    it then takes steps 4c to 5 as a child made for the run does. With
//!    the spec the run gives a handoff whose word the child makes its
//!    clear-child-tid address: the kernel wakes the run at the child's
//!    `exec` (or exit), and the run then tells the spawner thread, so the
//!    run is not woken second-hand; the only run in flight watches
//!    that word without sleeping for up to [`spin::EXEC_SPIN`] first,
//!    so its vCPU does not halt meanwhile (yielding its CPU between looks,
//!    so a child queued there runs at once). A run that finds no child
//!    parked waits for the next thread that is done, which makes one for
//!    it. Before the clone (or the hand-over) the run moves the
//!    descriptors its child keeps (the three pipe ends and the Landlock
//!    ruleset) onto a band of low numbers reserved at start (`host::fdtable`), so that step 4d copies a few descriptors, not the ~100
//!    that the executor holds below the floor under load. The spawner
//!    threads live in the runs' mount namespace (`host::procview`), whose
//!    `/proc` shows a run only its own processes; a run granted `proc =
//!    "host"` is created by the run's thread instead, in the executor's.
//! 4. In the child, raw syscalls only: (4a) default signal dispositions;
//!    (4b) new session (`setsid`, no controlling terminal), then, unless a
//!    spawner thread made it there already or it is granted the host's
//!    `/proc`, `setns` into the runs' mount namespace; (4c) join the
//!    cgroups (a parked child whose run watches for its exec leaves the
//!    joins to the run: the run's thread writes the child's pid into the
//!    leaves' `cgroup.procs` while the child takes 4d to 4i, and the
//!    child waits for that before step 5: `run::join`); (4d) a
//!    descriptor table of its own holding only what is below its floor
//!    (`close_range(floor, ~0, CLOSE_RANGE_UNSHARE)`; the floor is the top
//!    of the band its descriptors were placed on, else the table's floor,
//!    above which the cgroup files and the executor's other long-lived
//!    descriptors live: `host::fdtable`); pipes on 0, 1, 2 and every
//!    other fd close-on-exec;
//!    `chdir` into the run
//!    directory; rlimits (CORE 0, NOFILE, FSIZE, CPU, AS, RTPRIO 0, NICE
//!    0); `no_new_privs`;
//!    clear supplementary groups, drop the bounding set (inherited empty
//!    from a spawner thread when no capability is granted), switch to the
//!    run-as user and set exactly the granted capabilities (ambient too);
//!    `PR_SET_PDEATHSIG(SIGKILL)` (the parent checked by `getppid`);
//!    Landlock (a domain of its own, which is what hides every other
//!    process from it in the runs' `/proc`); seccomp (without the network
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
//!    [`spin::EXEC_SPIN`], as the end of file comes while the process
//!    exits), and waited on through its pidfd, registered only then, when
//!    it has not ended yet or 10 ms after the start.
//! 7. On any end, kill the whole tree (`cgroup.kill`, not needed when the
//!    v2 leaf is already unpopulated at the main process's exit; SIGCONT
//!    with SIGTERM so stopped processes see it), reap (the executor is a
//!    child subreaper, so orphans are reaped too; by pid, pidfd and
//!    `waitpid`, never by `SIGCHLD`, which every thread of the binary
//!    blocks; the binary's reaper thread, blocked in `waitid(P_ALL,
//!    WNOWAIT)`, reaps orphans as they exit, since a zombie counts against
//!    its run's `pids` bound until it is reaped), remove the cgroups and
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
//! 8. Report ([`classify`]): outcome, limit, result, stderr tail,
//!    and what the sandbox enforced.

pub mod classify;
pub mod denials;
pub mod egress;
pub mod engine;
pub mod file_key;
pub(crate) mod janitor;
pub mod join;
pub mod lend;
pub(crate) mod lock;
pub mod parsed;
pub mod plan;
pub mod proc_view;
pub mod reaper;
pub mod resolve;
pub mod rundir;
pub mod spawn;
pub mod spawner;
pub mod spin;
pub mod supervise;
pub mod warm;
