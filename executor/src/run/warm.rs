//! Warm runs: processes of a skill already boxed and blocked reading their
//! stdin, so a request's run starts at its args.
//!
//! A warm run is a run taken through steps 1 to 5 ahead of any request
//! (its plan, its slot with a fresh run directory and cgroup leaves, its
//! child exec'd in the full box) with its stdin pipe kept open and empty:
//! the skill starts, loads what it loads, and blocks reading its args. The
//! environment and argv are a cold run's (the plan is built from the same
//! manifest with the engine's environment; nothing of a request is in
//! either), and its refusals are watched from its spawn, as a cold run's. A request whose plan has the same identity (manifest and entry
//! files: device, inode, size, mtime, ctime; same path and tool) takes one,
//! writes its args, closes stdin, and is supervised from then: its
//! deadline, its limits and its report start at the take. Each warm run
//! serves one request and is never reused.
//!
//! A skill gets a pool only when `executor.toml` grants it (`[skills.NAME]
//! warm = N`, N at most `max_warm_total`), and only in `serve`, where one
//! thread ([`WarmPools::serve`]) makes them off the requests' path: for a
//! grant pinned to its manifest from the start, else from the first
//! request of the skill (a miss, run cold). Every [`SWEEP_EVERY`] (and
//! after the report of a request that took or missed) the thread discards
//! what must not be handed out, each with a log line and a count: a run
//! that wrote to stdout or stderr or exited while idle, one idle for
//! `warm_idle_seconds`, and (looked up at most every [`SWEEP_EVERY`]) one
//! whose manifest or entry file is not the one it was made from. A
//! request checks the same (output, exit, identity) before it takes one.
//!
//! The identity sees the manifest and the entry, not what the entry reads
//! at start (a module or a file beside it). skilld's reload (SIGHUP,
//! `POST /v1/reload`) is the operator's word that skill files changed: it
//! sends `warm_discard`, and every idle warm run is discarded
//! ([`WarmPools::discard_all`]), as is one being made while it arrived;
//! the pools are made again from the files as they are then. Grants and
//! the rest of `executor.toml` are read at start only: changing them is a
//! restart, which kills the pools.
//!
//! Each idle warm run holds one of the server's run slots (the
//! `max_concurrent_runs` semaphore), so warm runs count toward the cap and
//! toward the runs tmpfs and memory sized for it; a request that would
//! queue for a slot borrows one of an idle warm run of its own skill
//! ([`WarmPools::lend_slot`]: it will likely take that run), else evicts
//! another idle warm run first ([`WarmPools::evict`], its tree killed
//! before its slot is free). `max_warm_total` stays below
//! `max_concurrent_runs` (the configuration refuses otherwise). On
//! shutdown the idle runs are killed, not drained; the pool thread stays
//! until the server's drain is over ([`WarmPools::finish`]).
//!
//! A warm run is made off the requests' path but shares their CPUs: where
//! the executor may set another user's scheduling (`CAP_SYS_NICE`), its
//! child drops to `SCHED_IDLE` once its cgroups are joined, so the rest of
//! its set-up, its `exec` and its start-up (an interpreter's, a dynamic
//! linker's) run only on CPU time no request wants: on a busy host the
//! pool thread waits for that exec longer, and the pools refill later
//! (a request that finds none runs cold). The request that takes it sets
//! every thread of it back to a cold run's policy (the executor's own,
//! `SCHED_OTHER` unless it runs at another) before writing its args
//! ([`Warm::schedule_cold`]). A run whose threads cannot all be set back
//! is discarded and the request runs cold. A run without a cgroup leaf
//! (which lists its threads) is not made idle.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::host::instance::PgidRecord;
use crate::run::denials::Watch;
use crate::run::lock::relock;
use crate::run::parsed::FileKey;
use crate::run::plan::Plan;
use crate::run::spawn::{Child, Prepared};
use crate::sandbox::cgroup::RunCgroup;
use crate::sys;

/// How often the pool thread looks over the idle runs when nothing wakes
/// it: an idle run that wrote or died is discarded (and made again) within
/// this, though a request never takes one in that state anyway.
pub const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// After a warm run of a skill could not be made, or wrote or exited
/// before it was taken, its pool waits this long before making another
/// (the reason is logged each time).
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// A warm run: its plan, its prepared sandbox and its exec'd child, whose
/// stdin is open and empty ([`crate::run::spawn::spawn_waiting`]).
#[derive(Debug)]
pub struct Warm {
    /// The plan it was made from (with the args `{}`, never written).
    pub(crate) plan: Plan,
    /// The `SKILL.md` tool it runs, if any.
    pub(crate) tool: Option<String>,
    /// Its slot and sandbox.
    pub(crate) prep: Prepared,
    /// Its process and the parent's pipe ends.
    pub(crate) child: Child,
    /// Without a cgroup, its process group recorded for the watchdog.
    pub(crate) pgid: Option<PgidRecord>,
    /// Its refusals, watched since its spawn (when they are watched).
    pub(crate) watch: Option<Watch>,
    made: Instant,
    /// The run slot it holds while idle; `None` once lent to a request of
    /// its skill ([`WarmPools::lend_slot`]).
    permit: Option<OwnedSemaphorePermit>,
    /// When its slot was lent, if it was.
    lent_at: Option<Instant>,
}

impl Warm {
    /// A warm run made now from these parts.
    pub(crate) fn new(
        plan: Plan,
        tool: Option<String>,
        prep: Prepared,
        (child, pgid): (Child, Option<PgidRecord>),
        watch: Option<Watch>,
    ) -> Self {
        let made = Instant::now();
        Warm { plan, tool, prep, child, pgid, watch, made, permit: None, lent_at: None }
    }

    /// Why it must not serve a request, if it must not: it wrote to stdout
    /// or stderr, or exited (its pidfd readable), or closed its stdin (the
    /// pipe's write end reports an error: no reader is left), while nobody
    /// had written its args.
    fn spoiled(&self) -> Option<&'static str> {
        let c = &self.child;
        let Some((stdin, _)) = &c.stdin else { return Some("its stdin is closed") };
        let mut polled = [
            PollFd::new(c.stdout.as_fd(), PollFlags::POLLIN),
            PollFd::new(c.stderr.as_fd(), PollFlags::POLLIN),
            PollFd::new(c.pidfd.as_fd(), PollFlags::POLLIN),
            // Only POLLERR and POLLHUP, which poll always reports.
            PollFd::new(stdin.as_fd(), PollFlags::empty()),
        ];
        match nix::poll::poll(&mut polled, PollTimeout::ZERO) {
            Ok(0) => None,
            Ok(_) => {
                let ready = |p: &PollFd<'_>| p.revents().is_some_and(|r| !r.is_empty());
                if ready(&polled[2]) {
                    Some("it exited before it was taken")
                } else if ready(&polled[3]) {
                    Some("it closed its stdin before it was taken")
                } else {
                    Some("it wrote output before it was taken")
                }
            }
            Err(nix::errno::Errno::EINTR) => None,
            Err(_) => Some("its pipes cannot be polled"),
        }
    }

    /// Kills its whole tree now (`SIGKILL` to the main process, then its
    /// cgroup leaf or, without one that lists it, its process group: the
    /// warm run leads its own session); it is reaped and its slot cleaned
    /// up by [`Maker::kill`].
    pub(crate) fn kill_tree(&self) {
        let _ = sys::process::pidfd_signal(self.child.pidfd.as_fd(), libc::SIGKILL);
        match thread_listing(&self.prep) {
            Some(cg) => cg.kill(),
            None => {
                let group = nix::unistd::Pid::from_raw(self.child.pid);
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            }
        }
    }

    /// Whether its manifest and entry files are still the ones it was made
    /// from (looked up again by path).
    fn current(&self) -> bool {
        let key = |p: &Path| std::fs::metadata(p).ok().map(|m| FileKey::of(&m));
        let (manifest, entry) = self.plan.identity;
        key(&self.plan.manifest_path) == Some(manifest) && key(&self.plan.entry) == Some(entry)
    }

    /// Sets `policy` (a cold run's) back on every thread of the run, made
    /// at `SCHED_IDLE`: its main thread first (known without a listing),
    /// then each thread its cgroup leaf lists, listed again until a pass
    /// finds no thread it had not set, so one started meanwhile by a
    /// thread still idle is not missed. A thread started after the main
    /// thread was set inherits the cold policy, so a single-threaded run
    /// (most skills) takes one listing. (Left open: a thread whose
    /// creation a still-idle thread began before that thread was set, and
    /// which enters the listing only after the last pass. Its own
    /// process's start-up, still running at the take, is the only one
    /// that can do it, and only to itself.) A run without a leaf was never
    /// made idle.
    fn schedule_cold(&self, policy: libc::c_int) -> Result<(), String> {
        let Some(cg) = thread_listing(&self.prep) else { return Ok(()) };
        let set = |tid: libc::pid_t| match sys::call::sched_set_of(tid, policy) {
            // Gone: nothing of it is left to run at SCHED_IDLE.
            Ok(_) | Err(libc::ESRCH) => Ok(()),
            Err(errno) => {
                let e = nix::errno::Errno::from_raw(errno);
                Err(format!("setting thread {tid}'s scheduling: {e}"))
            }
        };
        let main = self.child.pid;
        set(main)?;
        let mut done = HashSet::from([main]);
        for _ in 0..8 {
            let fresh: Vec<i32> = cg
                .threads()
                .ok_or("its threads cannot be listed")?
                .into_iter()
                .filter(|t| !done.contains(t))
                .collect();
            if fresh.is_empty() {
                return Ok(());
            }
            for tid in fresh {
                set(tid)?;
                done.insert(tid);
            }
        }
        Err("its threads kept changing".to_owned())
    }

    /// Whether it holds a run slot, or may still go without one: its slot
    /// was lent ([`WarmPools::lend_slot`]) less than [`LENT_FOR`] ago, or
    /// one of `slots` was free for it since.
    fn holds_slot(&mut self, slots: &Arc<Semaphore>) -> bool {
        if self.permit.is_some() || self.lent_at.is_some_and(|at| at.elapsed() < LENT_FOR) {
            return true;
        }
        self.permit = slots.clone().try_acquire_owned().ok();
        self.lent_at = None;
        self.permit.is_some()
    }

    /// Whether it was made for a request with this plan and tool.
    fn serves(&self, plan: &Plan, tool: Option<&str>) -> bool {
        self.plan.identity == plan.identity
            && self.plan.manifest_path == plan.manifest_path
            && self.tool.as_deref() == tool
    }
}

/// One skill's pool, as [`WarmPools::stats`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmStats {
    /// Warm runs granted (`[skills.NAME] warm`).
    pub size: u32,
    /// Idle warm runs now.
    pub idle: u64,
    /// Requests that took a warm run.
    pub hits: u64,
    /// Requests of a warm-granted skill that found none and ran cold.
    pub misses: u64,
    /// Warm runs killed unused (output or exit while idle, expiry, a
    /// changed manifest or entry, eviction, shutdown).
    pub discarded: u64,
}

#[derive(Debug, Default)]
struct Pool {
    /// The manifest (canonical path) and tool the pool is made from.
    source: Option<(PathBuf, Option<String>)>,
    idle: VecDeque<Warm>,
    stats: WarmStats,
    /// Not tried again before this (a warm run could not be made).
    retry_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    pools: HashMap<String, Pool>,
    /// Warm runs to kill, with why (the pool thread kills them).
    dead: Vec<(Warm, &'static str)>,
    stop: bool,
    /// Idle warm runs over all pools.
    idle: usize,
    /// Counts [`WarmPools::discard_all`] calls: a warm run whose making
    /// began under an older count is discarded when made.
    generation: u64,
    /// When the idle runs' files were last looked up (at most every
    /// [`SWEEP_EVERY`]: a request's take checks its own run's anyway).
    swept: Option<Instant>,
    /// A [`Refill`] was dropped since the pool thread last looked over the
    /// pools (its wake-up may have come while it was busy).
    refill: bool,
    /// The server has no run left: the pool thread, stopped, returns once
    /// every discarded run is killed ([`WarmPools::finish`]).
    finished: bool,
}

/// What the pool thread is told to do by [`WarmPools::serve`]'s caller.
pub(crate) trait Maker {
    /// Makes one warm run of the manifest at `path` (and `tool`).
    fn make(&self, path: &Path, tool: Option<&str>) -> Result<Warm, String>;
    /// Kills a warm run's processes and hands its slot back.
    fn kill(&self, warm: Warm);
}

/// The pool thread's state and its wake-up.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// Wakes the pool thread when dropped. A request that took or missed a
/// warm run drops it once its report is out: the refill (the plan, a
/// slot, the hand-off to a parked child) then starts after the reply, not
/// on a CPU the reply still needs.
#[derive(Debug)]
pub(crate) struct Refill(Option<Arc<Shared>>);

impl Drop for Refill {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            relock(&shared.state).refill = true;
            shared.wake.notify_one();
        }
    }
}

/// The engine's warm pools: see the module docs.
#[derive(Debug)]
pub struct WarmPools {
    shared: Arc<Shared>,
    /// `[skills.NAME] warm`, by skill.
    sizes: HashMap<String, u32>,
    /// Warm runs at most over every skill.
    total: usize,
    idle_for: Duration,
    /// `Some(policy)`: warm runs wait at `SCHED_IDLE`, and their taker
    /// sets `policy` back (a cold run's; the executor may set it).
    idle_start: Option<libc::c_int>,
}

impl WarmPools {
    /// Pools for the grants of `config`; with `idle_start` warm runs wait
    /// at `SCHED_IDLE` and are set back to that policy when taken (the
    /// caller may set another user's scheduling).
    pub(crate) fn new(config: &crate::config::Config, idle_start: Option<libc::c_int>) -> Self {
        let sizes: HashMap<String, u32> = config
            .skills
            .iter()
            .filter(|(_, g)| g.warm > 0)
            .map(|(name, g)| (name.clone(), g.warm))
            .collect();
        let mut state = State::default();
        // A grant pinned to its manifest names the pool's source now.
        for (name, grant) in &config.skills {
            if let (true, Some(path)) = (grant.warm > 0, &grant.manifest) {
                let pool = state.pools.entry(name.clone()).or_default();
                pool.source = Some((path.clone(), None));
            }
        }
        WarmPools {
            shared: Arc::new(Shared { state: Mutex::new(state), wake: Condvar::new() }),
            sizes,
            total: config.warm_total(),
            idle_for: Duration::from_secs(config.warm_idle_seconds),
            idle_start,
        }
    }

    /// Whether a warm run about to be made (`prep`) waits at `SCHED_IDLE`
    /// from its child's cgroup joins on (`ChildSpec::start_idle`): the rest
    /// of its set-up, its `exec` and its start-up then run on CPU time
    /// nobody else wants. Only where warm runs are set back when taken,
    /// and with a cgroup leaf that lists every thread to set back
    /// ([`thread_listing`]); a refusal leaves it at the default policy.
    pub(crate) fn starts_idle(&self, prep: &Prepared) -> bool {
        self.idle_start.is_some() && thread_listing(prep).is_some()
    }

    /// Whether runs of `skill` look for a warm run: it is granted some
    /// (without the pool thread, as in a one-shot `run`, each is a miss).
    pub fn granted(&self, skill: &str) -> bool {
        self.sizes.contains_key(skill)
    }

    /// A warm run made for `plan` and `tool`, taken (it is no longer
    /// pooled), or `None` (a miss, counted; the pool will be made from
    /// this manifest). Idle runs that are not this plan's, or spoiled, are
    /// handed to the pool thread to kill on the way. The pool thread is
    /// not woken: the caller drops a [`WarmPools::refill_later`] once its
    /// report is out.
    pub(crate) fn take(&self, plan: &Plan, tool: Option<&str>) -> Option<Warm> {
        let skill = plan.manifest.name().as_str();
        let mut state = relock(&self.shared.state);
        if state.stop {
            return None;
        }
        let State { pools, dead, idle, .. } = &mut *state;
        let pool = pools.entry(skill.to_owned()).or_default();
        pool.source = Some((plan.manifest_path.clone(), tool.map(str::to_owned)));
        let mut found = None;
        while let Some(warm) = pool.idle.pop_front() {
            *idle = idle.saturating_sub(1);
            let why = if !warm.serves(plan, tool) {
                Some(STALE)
            } else if warm.made.elapsed() >= self.idle_for {
                Some(EXPIRED)
            } else {
                warm.spoiled()
            };
            match why {
                None => {
                    found = Some(warm);
                    break;
                }
                Some(why) => {
                    if why != STALE && why != EXPIRED {
                        pool.retry_at = Some(Instant::now() + RETRY_AFTER);
                    }
                    pool.stats.discarded += 1;
                    dead.push((warm, why));
                }
            }
        }
        match &mut found {
            // Counted a hit once it is known to be usable, below.
            Some(warm) => warm.permit = None,
            None => pool.stats.misses += 1,
        }
        drop(state);
        let warm = found?;
        let ready = self.idle_start.map_or(Ok(()), |policy| warm.schedule_cold(policy));
        let mut state = relock(&self.shared.state);
        let stats = &mut state.pools.entry(skill.to_owned()).or_default().stats;
        match ready {
            Ok(()) => {
                stats.hits += 1;
                Some(warm)
            }
            Err(why) => {
                stats.misses += 1;
                stats.discarded += 1;
                drop(state);
                tracing::warn!("executor: warm run of {skill:?} not used: {why}");
                // Its slot went to the request: it goes before the run.
                warm.kill_tree();
                self.to_kill(warm, "its scheduling could not be set back");
                None
            }
        }
    }

    /// `warm`, taken for a request that was then held, if it may still
    /// serve it after the hold; else (it wrote, exited or expired
    /// meanwhile) it is killed, counted a miss instead of a hit, and the
    /// request runs cold.
    pub(crate) fn still_usable(&self, warm: Warm) -> Option<Warm> {
        let why = if warm.made.elapsed() >= self.idle_for { Some(EXPIRED) } else { warm.spoiled() };
        let Some(why) = why else { return Some(warm) };
        let skill = warm.plan.manifest.name().to_string();
        let mut state = relock(&self.shared.state);
        let stats = &mut state.pools.entry(skill).or_default().stats;
        stats.hits = stats.hits.saturating_sub(1);
        stats.misses += 1;
        stats.discarded += 1;
        drop(state);
        warm.kill_tree();
        self.to_kill(warm, why);
        None
    }

    /// Hands `warm` to the pool thread to be killed and reaped (also once
    /// the pools are stopped, until [`WarmPools::finish`]).
    fn to_kill(&self, warm: Warm, why: &'static str) {
        relock(&self.shared.state).dead.push((warm, why));
        self.shared.wake.notify_one();
    }

    /// Sets a cold run's policy back on a warm run about to be killed
    /// unused: at `SCHED_IDLE` its exit would wait for idle CPU time, and
    /// the pool thread (or a stopping executor) waits for that exit.
    pub(crate) fn wake_to_die(&self, warm: &Warm) {
        if let Some(policy) = self.idle_start {
            let _ = warm.schedule_cold(policy);
        }
    }

    /// A [`Refill`]: the pool thread is woken when it is dropped.
    pub(crate) fn refill_later(&self) -> Refill {
        Refill(Some(Arc::clone(&self.shared)))
    }

    /// Lends the run slot of an idle warm run of `skill` to a request of
    /// that skill that found no slot free (it will most likely take that
    /// very run, so evicting one for it would make it a miss). The run
    /// stays idle without a slot; if no request takes it soon, the pool
    /// thread finds it a free slot or discards it ([`LENT_FOR`]).
    pub fn lend_slot(&self, skill: &str) -> Option<OwnedSemaphorePermit> {
        let mut state = relock(&self.shared.state);
        let pool = state.pools.get_mut(skill)?;
        let warm = pool.idle.iter_mut().find(|w| w.permit.is_some())?;
        warm.lent_at = Some(Instant::now());
        warm.permit.take()
    }

    /// Kills one idle warm run holding a run slot (the oldest of the pool
    /// with the most such runs) and frees that slot, for a request that
    /// would wait for one; false when there is none. The run's tree is
    /// killed before the slot is free (its reaping and its folder's
    /// removal are the pool thread's).
    pub fn evict(&self) -> bool {
        let mut state = relock(&self.shared.state);
        let State { pools, idle, .. } = &mut *state;
        let holding = |p: &Pool| p.idle.iter().filter(|w| w.permit.is_some()).count();
        let Some(pool) = pools.values_mut().filter(|p| holding(p) > 0).max_by_key(|p| holding(p))
        else {
            return false;
        };
        let Some(at) = pool.idle.iter().position(|w| w.permit.is_some()) else { return false };
        let Some(mut warm) = pool.idle.remove(at) else { return false };
        *idle = idle.saturating_sub(1);
        pool.stats.discarded += 1;
        drop(state);
        self.wake_to_die(&warm);
        warm.kill_tree();
        warm.permit = None;
        self.to_kill(warm, "its run slot was needed by a request");
        true
    }

    /// Hands a taken warm run that will not be used (its held run was
    /// never started) to the pool thread to kill, off the request's path.
    pub(crate) fn discard(&self, warm: Warm, why: &'static str) {
        let skill = warm.plan.manifest.name().to_string();
        relock(&self.shared.state).pools.entry(skill).or_default().stats.discarded += 1;
        self.to_kill(warm, why);
    }

    /// Discards every idle warm run of every pool (a reload said skill
    /// files changed), and any being made now once it is made; the pools
    /// are made again at once (a resting pool too). Returns how many idle
    /// runs were discarded.
    pub fn discard_all(&self) -> u64 {
        let mut state = relock(&self.shared.state);
        let State { pools, dead, idle, generation, .. } = &mut *state;
        *generation += 1;
        let mut n = 0u64;
        for pool in pools.values_mut() {
            pool.retry_at = None;
            pool.stats.discarded += pool.idle.len() as u64;
            for warm in pool.idle.drain(..) {
                n += 1;
                dead.push((warm, RELOADED));
            }
        }
        *idle = 0;
        drop(state);
        self.shared.wake.notify_one();
        n
    }

    /// Each warm-granted skill's counts.
    pub fn stats(&self) -> Vec<(String, WarmStats)> {
        let state = relock(&self.shared.state);
        let mut all: Vec<(String, WarmStats)> = self
            .sizes
            .iter()
            .map(|(name, size)| {
                let pool = state.pools.get(name);
                let mut stats = pool.map(|p| p.stats).unwrap_or_default();
                stats.size = *size;
                stats.idle = pool.map_or(0, |p| p.idle.len() as u64);
                (name.clone(), stats)
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Stops the pools: the pool thread kills every idle warm run and
    /// makes no more; no request takes one from now. The thread goes on
    /// killing the runs discarded later (a held run never started) until
    /// [`WarmPools::finish`]: it also stays, as the parent of the warm runs
    /// it created itself (without a spawner thread), while taken ones are
    /// still running (their parent-death signal fires when it exits).
    pub fn stop(&self) {
        let mut state = relock(&self.shared.state);
        state.stop = true;
        drop(state);
        self.shared.wake.notify_all();
    }

    /// Stops the pools ([`WarmPools::stop`]) and lets the pool thread
    /// return once every discarded run is killed: call it when no taken
    /// warm run is left running.
    pub fn finish(&self) {
        let mut state = relock(&self.shared.state);
        state.stop = true;
        state.finished = true;
        drop(state);
        self.shared.wake.notify_all();
    }

    /// The pool thread: makes warm runs with `maker` while there is room
    /// (a run slot of `slots` free beyond one kept for a cold run, the
    /// skill's size, `max_warm_total`), discards the spoiled, stale and
    /// expired ones, until [`WarmPools::stop`]. Returns at once when no
    /// skill is granted warm runs.
    pub(crate) fn serve(&self, maker: &dyn Maker, slots: &Arc<Semaphore>) {
        if self.sizes.is_empty() || self.total == 0 {
            return;
        }
        loop {
            let (dead, work, stop) = self.look_over(slots);
            for (warm, why) in dead {
                tracing::info!(
                    "executor: warm run of {:?} discarded: {why}",
                    warm.plan.manifest.name().as_str()
                );
                maker.kill(warm);
            }
            if stop {
                let state = relock(&self.shared.state);
                if state.finished && state.dead.is_empty() {
                    return;
                }
                if state.dead.is_empty() {
                    let _ = self.shared.wake.wait_timeout(state, SWEEP_EVERY);
                }
                continue;
            }
            let Some(Work { skill, path, tool, permit, generation }) = work else {
                let state = relock(&self.shared.state);
                if !state.stop && state.dead.is_empty() && !state.refill {
                    let _ = self.shared.wake.wait_timeout(state, SWEEP_EVERY);
                }
                continue;
            };
            let made = maker.make(&path, tool.as_deref());
            let mut state = relock(&self.shared.state);
            let reloaded = state.generation != generation;
            let pool = state.pools.entry(skill.clone()).or_default();
            match made {
                Ok(warm) if reloaded => {
                    pool.stats.discarded += 1;
                    state.dead.push((warm, RELOADED));
                }
                Ok(mut warm) if warm.plan.manifest.name().as_str() == skill => {
                    warm.permit = Some(permit);
                    pool.retry_at = None;
                    pool.idle.push_back(warm);
                    state.idle += 1;
                }
                Ok(warm) => {
                    pool.retry_at = Some(Instant::now() + RETRY_AFTER);
                    state.dead.push((warm, "its manifest now declares another name"));
                }
                Err(why) => {
                    pool.retry_at = Some(Instant::now() + RETRY_AFTER);
                    // A manifest that is gone is not tried again until a
                    // request names one.
                    if !path.exists() {
                        pool.source = None;
                    }
                    drop(state);
                    tracing::warn!("executor: cannot make a warm run of {skill:?}: {why}");
                }
            }
        }
    }

    /// Under the lock: the idle runs to discard (spoiled, expired, stale),
    /// the next warm run to make, and whether the pools stop.
    fn look_over(&self, slots: &Arc<Semaphore>) -> (Vec<(Warm, &'static str)>, Option<Work>, bool) {
        let mut state = relock(&self.shared.state);
        let State { pools, dead, idle, stop, generation, swept, refill, .. } = &mut *state;
        *refill = false;
        let mut out = std::mem::take(dead);
        let look_up = swept.is_none_or(|at| at.elapsed() >= SWEEP_EVERY);
        if look_up {
            *swept = Some(Instant::now());
        }
        for pool in pools.values_mut() {
            let before = pool.idle.len();
            let mut kept = VecDeque::with_capacity(before);
            for mut warm in pool.idle.drain(..) {
                let why = if *stop {
                    Some("the executor is stopping")
                } else if warm.made.elapsed() >= self.idle_for {
                    Some(EXPIRED)
                } else if look_up && !warm.current() {
                    Some(STALE)
                } else if !warm.holds_slot(slots) {
                    Some("its run slot went to a request")
                } else {
                    let spoiled = warm.spoiled();
                    // A skill that writes or exits before its args would
                    // do it again: its pool rests before the next.
                    if spoiled.is_some() {
                        pool.retry_at = Some(Instant::now() + RETRY_AFTER);
                    }
                    spoiled
                };
                match why {
                    Some(why) => out.push((warm, why)),
                    None => kept.push_back(warm),
                }
            }
            let gone = before - kept.len();
            pool.stats.discarded += gone as u64;
            *idle = idle.saturating_sub(gone);
            pool.idle = kept;
        }
        if *stop {
            return (out, None, true);
        }
        let now = Instant::now();
        let room = |name: &String, pool: &Pool| {
            let size = self.sizes.get(name).copied().unwrap_or(0) as usize;
            pool.source.is_some()
                && pool.idle.len() < size
                && pool.retry_at.is_none_or(|at| now >= at)
        };
        // The pool furthest below its size first.
        let next =
            pools.iter().filter(|(name, pool)| room(name, pool)).max_by_key(|(name, pool)| {
                self.sizes.get(*name).copied().unwrap_or(0) as usize - pool.idle.len()
            });
        let work = match next {
            Some((name, pool)) if *idle < self.total && slots.available_permits() > 1 => {
                let (path, tool) = pool.source.clone().unwrap_or_default();
                slots.clone().try_acquire_owned().ok().map(|permit| Work {
                    skill: name.clone(),
                    path,
                    tool,
                    permit,
                    generation: *generation,
                })
            }
            _ => None,
        };
        (out, work, false)
    }
}

/// The run's cgroup, when a leaf of it lists every thread of the run: the
/// one condition for making a warm run idle and for setting it back.
fn thread_listing(prep: &Prepared) -> Option<&RunCgroup> {
    prep.cgroup.as_ref().filter(|cg| cg.can_kill())
}

/// Why a warm run made from other files than the request's is discarded.
const STALE: &str = "its manifest or entry changed since it was made";

/// Why a warm run idle for `warm_idle_seconds` is discarded.
const EXPIRED: &str = "idle for warm_idle_seconds";

/// How long a warm run whose slot was lent ([`WarmPools::lend_slot`]) is
/// left idle without one for the request to take it.
const LENT_FOR: Duration = Duration::from_secs(1);

/// Why a warm run is discarded on `warm_discard` (skilld's reload).
const RELOADED: &str = "a reload asked for every pool to be made again";

/// The next warm run the pool thread makes: of which skill, from which
/// manifest and tool, with the run slot it will hold while idle, under
/// which [`State::generation`].
struct Work {
    skill: String,
    path: PathBuf,
    tool: Option<String>,
    permit: OwnedSemaphorePermit,
    generation: u64,
}
