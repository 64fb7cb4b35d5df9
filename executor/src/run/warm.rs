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
//! ([`WarmPools::discard_all`]), as is one being made while it arrived
//! and one taken by a request still held (it runs cold once started);
//! the pools are made again from the files as they are then. Grants and
//! the rest of `executor.toml` are read at start only: changing them is a
//! restart, which kills the pools.
//!
//! Each idle warm run holds one of the server's run slots (the
//! `max_concurrent_runs` semaphore), so warm runs count toward the cap and
//! toward the runs tmpfs and memory sized for it; a request that would
//! queue for a slot borrows one of an idle warm run of its own skill
//! ([`WarmPools::lend_slot`]: it will likely take that run), else evicts
//! another idle warm run first ([`WarmPools::evict`]). A run discarded by
//! a request or a discard has its tree killed and then its slot freed at
//! once ([`WarmPools::kill_now`]); the pool thread reaps it and removes its
//! folder. `max_warm_total` stays below
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

mod process;
mod state;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::run::file_key::FileKey;
use crate::run::lock::relock;
use crate::run::plan::Plan;
use crate::run::spawn::Prepared;

pub use process::Warm;
use process::{the_skills_doing, thread_listing};
use state::{Files, Pool, Shared, State, Work, EXPIRED, RELOADED, STALE, STOPPING};
pub(crate) use state::{Queued, Refill};
pub use state::{WarmStats, RETRY_AFTER};

/// How often the pool thread looks over the idle runs when nothing wakes
/// it: an idle run that wrote or died is discarded (and made again) within
/// this, though a request never takes one in that state anyway.
pub const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// What the pool thread is told to do by [`WarmPools::serve`]'s caller.
pub(crate) trait Maker {
    /// Makes one warm run of the manifest at `path` (and `tool`).
    fn make(&self, path: &Path, tool: Option<&str>) -> Result<Warm, String>;
    /// Kills a warm run's processes and hands its slot back.
    fn kill(&self, warm: Warm);
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
    /// put down on the way ([`WarmPools::kill_now`]). The pool thread is
    /// not woken: the caller drops a [`WarmPools::refill_later`] once its
    /// report is out.
    pub(crate) fn take(&self, plan: &Plan, tool: Option<&str>) -> Option<Warm> {
        let skill = plan.manifest.name().as_str();
        let mut state = relock(&self.shared.state);
        if state.stop {
            return None;
        }
        let State { pools, idle, .. } = &mut *state;
        let pool = pools.entry(skill.to_owned()).or_default();
        pool.source = Some((plan.manifest_path.clone(), tool.map(str::to_owned)));
        let (mut found, mut unfit) = (None, Vec::new());
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
                        pool.rest();
                    }
                    pool.stats.discarded += 1;
                    unfit.push((warm, why));
                }
            }
        }
        match &mut found {
            // Counted a hit once it is known to be used (`use_taken`).
            Some(warm) => warm.permit = None,
            None => pool.stats.misses += 1,
        }
        state.putting_down += unfit.len();
        drop(state);
        if !unfit.is_empty() {
            self.put_down_all(unfit, false);
        }
        let mut warm = found?;
        let ready = self.idle_start.map_or(Ok(()), |policy| warm.schedule_cold(policy));
        let Err(why) = ready else { return Some(warm) };
        let mut state = relock(&self.shared.state);
        let stats = &mut state.pools.entry(skill.to_owned()).or_default().stats;
        stats.misses += 1;
        stats.discarded += 1;
        drop(state);
        tracing::warn!("executor: warm run of {skill:?} not used: {why}");
        // Its slot went to the request: it goes before the run.
        warm.kill_tree();
        self.to_kill(warm, "its scheduling could not be set back");
        None
    }

    /// `warm`, taken for a request whose `start` has come (skilld holds
    /// each request until its audit row is written), if it may still
    /// serve it: a hit. If it wrote, exited or expired since the take, or
    /// the pools were discarded meanwhile (a reload), it is killed,
    /// counted a miss, and the request runs cold.
    pub(crate) fn use_taken(&self, mut warm: Warm) -> Option<Warm> {
        let why = if warm.made.elapsed() >= self.idle_for { Some(EXPIRED) } else { warm.spoiled() };
        let skill = warm.plan.manifest.name().to_string();
        let mut state = relock(&self.shared.state);
        let why = why.or((state.generation != warm.generation).then_some(RELOADED));
        let pool = state.pools.entry(skill).or_default();
        let Some(why) = why else {
            pool.stats.hits += 1;
            pool.failures = 0;
            return Some(warm);
        };
        if why != EXPIRED && why != RELOADED {
            pool.rest();
        }
        pool.stats.misses += 1;
        pool.stats.discarded += 1;
        drop(state);
        warm.kill_tree();
        self.to_kill(warm, why);
        None
    }

    /// Puts each of `runs` down at once, whatever the pool thread is doing
    /// ([`WarmPools::kill_now`]; counted in [`State::putting_down`] when
    /// they left their pool), then hands them to the pool thread to reap
    /// and remove their folders, waking it if `wake`.
    fn put_down_all(&self, mut runs: Vec<(Warm, &'static str)>, wake: bool) {
        for (warm, _) in &mut runs {
            self.kill_now(warm);
        }
        let mut state = relock(&self.shared.state);
        state.putting_down = state.putting_down.saturating_sub(runs.len());
        state.dead.append(&mut runs);
        drop(state);
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// Hands `warm` to the pool thread to be killed and reaped (also once
    /// the pools are stopped, until [`WarmPools::finish`]).
    fn to_kill(&self, warm: Warm, why: &'static str) {
        relock(&self.shared.state).dead.push((warm, why));
        self.shared.wake.notify_one();
    }

    /// Kills a warm run's tree now, once ([`Warm::kill_tree`]), a cold
    /// run's policy set back first (at `SCHED_IDLE` its exit would wait for
    /// idle CPU time, and the pool thread or a stopping executor waits for
    /// that exit), then frees its run slot: never before it is killed.
    pub(crate) fn kill_now(&self, warm: &mut Warm) {
        if !warm.killed() {
            if let Some(policy) = self.idle_start {
                let _ = warm.schedule_cold(policy);
            }
            warm.kill_tree();
        }
        warm.permit = None;
    }

    /// A [`Refill`]: the pool thread is woken when it is dropped.
    pub(crate) fn refill_later(&self) -> Refill {
        Refill(Some(Arc::clone(&self.shared)))
    }

    /// Lends the run slot of an idle warm run of `skill` to a request of
    /// that skill that found no slot free (it will most likely take that
    /// very run, so evicting one for it would make it a miss). The run
    /// stays idle without a slot; if no request takes it soon, the pool
    /// thread finds it a free slot or discards it (a second on).
    pub fn lend_slot(&self, skill: &str) -> Option<OwnedSemaphorePermit> {
        let mut state = relock(&self.shared.state);
        if state.stop {
            return None;
        }
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
        let Some(warm) = pool.idle.remove(at) else { return false };
        *idle = idle.saturating_sub(1);
        pool.stats.discarded += 1;
        // Slots are short: one made at once would likely go the same way.
        pool.rest();
        state.putting_down += 1;
        drop(state);
        self.put_down_all(vec![(warm, "its run slot was needed by a request")], true);
        true
    }

    /// Counts a request that waits in the queue for a run slot until the
    /// guard drops: a warm run whose making was under way is put down once
    /// made, its slot going to the queue. Then evicts an idle one if there
    /// is one (it may have become idle since the request last looked).
    pub(crate) fn wait_for_slot(&self) -> Queued {
        relock(&self.shared.state).queued += 1;
        let queued = Queued(Arc::clone(&self.shared));
        self.evict();
        queued
    }

    /// Hands a taken warm run that will not be used (its held run was
    /// never started) to the pool thread to kill, off the request's path.
    pub(crate) fn discard(&self, mut warm: Warm, why: &'static str) {
        // Its slot went back with its request's: it goes first.
        warm.kill_tree();
        let skill = warm.plan.manifest.name().to_string();
        relock(&self.shared.state).pools.entry(skill).or_default().stats.discarded += 1;
        self.to_kill(warm, why);
    }

    /// Discards every idle warm run of every pool (a reload said skill
    /// files changed), each put down at once ([`WarmPools::kill_now`]),
    /// and any being made now once it is made; the pools are made again at
    /// once (a resting pool too). Returns how many idle runs were
    /// discarded.
    pub fn discard_all(&self) -> u64 {
        let mut state = relock(&self.shared.state);
        state.generation += 1;
        for pool in state.pools.values_mut() {
            pool.retry_at = None;
            pool.failures = 0;
        }
        let runs = Self::leave_pools(&mut state, RELOADED);
        drop(state);
        let n = runs.len() as u64;
        self.put_down_all(runs, true);
        n
    }

    /// Every idle run of every pool, out of its pool and counted discarded
    /// (and in [`State::putting_down`]) for `why`, to be put down.
    fn leave_pools(state: &mut State, why: &'static str) -> Vec<(Warm, &'static str)> {
        let mut runs = Vec::new();
        for pool in state.pools.values_mut() {
            pool.stats.discarded += pool.idle.len() as u64;
            runs.extend(pool.idle.drain(..).map(|warm| (warm, why)));
        }
        state.idle = 0;
        state.putting_down += runs.len();
        runs
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

    /// Stops the pools: every idle warm run is put down at once, on the
    /// caller's thread, whatever the pool thread is doing (it reaps them
    /// and makes no more); no request takes one from now. The thread goes on
    /// killing the runs discarded later (a held run never started) until
    /// [`WarmPools::finish`]: it also stays, as the parent of the warm runs
    /// it created itself (without a spawner thread), while taken ones are
    /// still running (their parent-death signal fires when it exits).
    pub fn stop(&self) {
        let mut state = relock(&self.shared.state);
        state.stop = true;
        let runs = Self::leave_pools(&mut state, STOPPING);
        drop(state);
        self.put_down_all(runs, false);
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
    /// expired ones, until [`WarmPools::stop`]; then kills what is
    /// discarded until [`WarmPools::finish`]. Returns at once when no
    /// skill is granted warm runs.
    pub(crate) fn serve(&self, maker: &dyn Maker, slots: &Arc<Semaphore>) {
        if self.sizes.is_empty() || self.total == 0 {
            return;
        }
        loop {
            let files = self.look_up_files();
            let (dead, work, stop) = self.look_over(slots, files.as_ref());
            for (warm, why) in dead {
                let skill = warm.plan.manifest.name().as_str();
                if the_skills_doing(why) {
                    // Seen at the default level: the grant does nothing as
                    // the skill is written (rare: the pool rests after it).
                    tracing::warn!(
                        "executor: warm run of {skill:?} discarded: {why} (a warm skill reads \
                         its args before it writes or exits)"
                    );
                } else {
                    tracing::info!("executor: warm run of {skill:?} discarded: {why}");
                }
                maker.kill(warm);
            }
            if stop {
                let state = relock(&self.shared.state);
                if state.finished && state.dead.is_empty() && state.putting_down == 0 {
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
            // Looked at before the lock: a take never waits for the file system.
            let gone = made.is_err() && !path.exists();
            let mut state = relock(&self.shared.state);
            let reloaded = state.generation != generation;
            let stopped = state.stop;
            let wanted = state.queued > 0;
            let pool = state.pools.entry(skill.clone()).or_default();
            // A run made for nothing keeps its slot until it is killed.
            match made {
                Ok(mut warm) if reloaded || stopped => {
                    warm.permit = Some(permit);
                    pool.stats.discarded += 1;
                    state.dead.push((warm, if reloaded { RELOADED } else { STOPPING }));
                }
                Ok(mut warm) if wanted => {
                    warm.permit = Some(permit);
                    // Slots are short: as for an eviction.
                    pool.rest();
                    pool.stats.discarded += 1;
                    state.dead.push((warm, "its run slot was needed by a request"));
                }
                Ok(mut warm) if warm.plan.manifest.name().as_str() == skill => {
                    warm.permit = Some(permit);
                    warm.generation = generation;
                    pool.retry_at = None;
                    pool.idle.push_back(warm);
                    state.idle += 1;
                }
                Ok(mut warm) => {
                    warm.permit = Some(permit);
                    pool.rest();
                    pool.stats.discarded += 1;
                    state.dead.push((warm, "its manifest now declares another name"));
                }
                Err(why) => {
                    pool.rest();
                    // A manifest that is gone is not tried again until a
                    // request names one.
                    if gone {
                        pool.source = None;
                    }
                    drop(state);
                    tracing::warn!("executor: cannot make a warm run of {skill:?}: {why}");
                }
            }
        }
    }

    /// The idle runs' manifest and entry files, looked up by path at most
    /// every [`SWEEP_EVERY`] (else `None`): the paths are listed under the
    /// lock, the files looked up outside it, so a request's take never
    /// waits for the file system.
    fn look_up_files(&self) -> Option<Files> {
        let paths: HashSet<PathBuf> = {
            let mut state = relock(&self.shared.state);
            if state.swept.is_some_and(|at| at.elapsed() < SWEEP_EVERY) {
                return None;
            }
            state.swept = Some(Instant::now());
            let runs = state.pools.values().flat_map(|p| p.idle.iter());
            runs.flat_map(|w| [w.plan.manifest_path.clone(), w.plan.entry.clone()]).collect()
        };
        let mut files = Files::with_capacity(paths.len());
        for path in paths {
            let now = std::fs::metadata(&path).ok().map(|m| FileKey::of(&m));
            files.insert(path, now);
        }
        Some(files)
    }

    /// Under the lock: the idle runs to discard (spoiled, expired, stale
    /// by `files`), the next warm run to make, and whether the pools stop.
    fn look_over(
        &self,
        slots: &Arc<Semaphore>,
        files: Option<&Files>,
    ) -> (Vec<(Warm, &'static str)>, Option<Work>, bool) {
        let mut state = relock(&self.shared.state);
        let State { pools, dead, idle, stop, generation, refill, .. } = &mut *state;
        *refill = false;
        let mut out = std::mem::take(dead);
        for pool in pools.values_mut() {
            let before = pool.idle.len();
            let mut kept = VecDeque::with_capacity(before);
            let (mut spoils, mut lasted) = (false, false);
            let mut short = false;
            for mut warm in std::mem::take(&mut pool.idle) {
                let why = if *stop {
                    Some(STOPPING)
                } else if warm.made.elapsed() >= self.idle_for {
                    lasted = true;
                    Some(EXPIRED)
                } else if files.is_some_and(|files| !warm.current(files)) {
                    Some(STALE)
                } else if !warm.holds_slot(slots) {
                    short = true;
                    Some("its run slot went to a request")
                } else {
                    let spoiled = warm.spoiled();
                    spoils |= spoiled.is_some();
                    spoiled
                };
                match why {
                    Some(why) => out.push((warm, why)),
                    None => kept.push_back(warm),
                }
            }
            // A skill that writes or exits before its args would do it
            // again, and slots short now are likely short soon: its pool
            // rests before the next.
            if spoils || short {
                pool.rest();
            } else if lasted {
                // A run that stayed good until it expired ends a streak.
                pool.failures = 0;
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
