//! The engine's run slots: kept ready ahead of the runs, recycled after
//! them, removed off the runs' path.
//!
//! A slot is a run directory and the run's cgroup leaves ([`Slot`]).
//! Making one costs a run a few `mkdir`s in the cgroup hierarchies and the
//! kernfs files they open, and a fresh directory a Landlock ruleset built
//! for it; removing one costs `rmdir`s. So the engine's [`Janitor`] keeps
//! [`POOL_DEPTH`] slots ready, and a finished run's leaves, once provably
//! empty and reset ([`RunCgroup::recycle`]), go back into a ready slot with
//! a fresh run directory in the same home ([`Slot::reuse`], which keeps the
//! rulesets built for it) instead of being removed and made again.
//!
//! The order of the janitor's work is the order runs need it: a finished
//! run's slot is recycled first, one at a time, each ready as soon as it is
//! (a run that finds no ready slot would otherwise make one); removals
//! come after; new slots are made only to keep the pool at its depth. A
//! run that still finds no ready slot recycles a finished one itself
//! (a few reads and one `mkdirat`) before it makes one ([`Janitor::take`]).
//! How each run got its slot is counted ([`SlotCounts`]).
//!
//! Started by the engine's second run, so a one-shot `ongrid-executor run`
//! makes and removes its slot inline exactly as before. Dropping the
//! janitor stops it after it removed every pending and ready slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::run::lock::relock;
use crate::run::rundir::RunDir;
use crate::run::spawn::{Host, Slot, SpawnError};
use crate::sandbox::cgroup::RunCgroup;

/// Slots kept ready once the engine serves more than one run (new ones are
/// made below this).
pub(crate) const POOL_DEPTH: usize = 4;
/// Ready slots beyond which a finished run's leaves are removed rather than
/// reused. Above [`POOL_DEPTH`]: the pool is refilled while a run is in
/// flight, so its leaves come back to a full pool; 16 rather than 8 so that
/// 8 runs at a time do not keep making and removing leaves (executor CPU
/// per run with 8 clients 525-592 -> 467-500 µs). The extra ones go after [`TRIM_AFTER`] without runs.
const MAX_READY: usize = 4 * POOL_DEPTH;
/// With no run taken or finished for this long, ready slots beyond
/// [`POOL_DEPTH`] are removed.
pub(crate) const TRIM_AFTER: Duration = Duration::from_secs(1);
/// A ready slot older than this is removed rather than used.
const MAX_IDLE: Duration = Duration::from_secs(30);
/// Finished runs waiting for removal beyond which a run removes its own.
const MAX_TRASH: usize = 64;
/// Finished runs that wake the janitor together while it is gathering
/// them (it recycled one a moment ago) and the pool is at its depth: a
/// wake-up per run costs a context switch, and on a VM often a halted
/// vCPU woken.
const RECYCLE_BATCH: usize = POOL_DEPTH;
/// How long the janitor gathers finished runs after recycling before it
/// takes them unwoken (a batch that does not fill) or goes to sleep; the
/// longest a finished run's directory outlives it for want of a batch.
const GATHER_FOR: Duration = Duration::from_millis(20);

/// A finished run's leaves and directory.
type Used = (Option<RunCgroup>, RunDir);

/// How runs got their slots so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotCounts {
    /// Taken ready from the pool.
    pub ready: u64,
    /// A finished run's slot recycled on the run's path (the pool was
    /// empty).
    pub recycled: u64,
    /// Made on the run's path.
    pub made: u64,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Janitor {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// [`SlotCounts`]: ready, recycled, made.
    counts: [AtomicU64; 3],
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    trash: Vec<Used>,
    /// Finished runs whose leaves may serve again ([`reuse`]).
    used: Vec<Used>,
    /// Ready slots and when they were made.
    ready: Vec<(Instant, Slot)>,
    /// The janitor thread runs (refills wanted).
    started: bool,
    /// The janitor sleeps until woken: a finished run wakes it at once
    /// (while it gathers them, only a batch does).
    asleep: bool,
    /// A finished run's [`Wake`] is on its way to the janitor.
    woken: bool,
    stop: bool,
}

impl Shared {
    fn run(&self, config: &Config, host: &Host) {
        let mut state = relock(&self.state);
        // Finished runs were recycled since the janitor last slept.
        let mut gathering = false;
        loop {
            // First what runs wait for: one finished slot made ready.
            if let Some((cgroup, run_dir)) = state.used.pop() {
                gathering = true;
                let room = !state.stop && state.ready.len() < MAX_READY;
                drop(state);
                let slot = match cgroup {
                    Some(cg) if room => reuse(cg, run_dir, config, host),
                    cg => {
                        remove((cg, run_dir));
                        None
                    }
                };
                state = relock(&self.state);
                if let Some(slot) = slot {
                    state.ready.push((Instant::now(), slot));
                }
                continue;
            }
            if let Some(trash) = state.trash.pop() {
                drop(state);
                remove(trash);
                state = relock(&self.state);
                continue;
            }
            if state.stop {
                let ready = std::mem::take(&mut state.ready);
                drop(state);
                ready.into_iter().for_each(|(_, slot)| remove((slot.cgroup, slot.run_dir)));
                return;
            }
            if state.ready.len() < POOL_DEPTH {
                drop(state);
                let l = &config.limits;
                let made = Slot::create(config, host, l.memory_bytes, l.max_pids, None);
                state = relock(&self.state);
                match made {
                    Ok(slot) => state.ready.push((Instant::now(), slot)),
                    Err(e) => {
                        tracing::warn!("janitor: cannot make a run slot ahead: {e}");
                        drop(state);
                        std::thread::sleep(Duration::from_millis(100));
                        state = relock(&self.state);
                    }
                }
                continue;
            }
            if gathering {
                // More finished runs are likely to follow: they wake the
                // janitor in batches meanwhile ([`Janitor::discard_later`]),
                // and what came without a wake-up is taken after this.
                gathering = false;
                state = self
                    .wake
                    .wait_timeout(state, GATHER_FOR)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                state.woken = false;
                continue;
            }
            state.asleep = true;
            if state.ready.len() > POOL_DEPTH {
                // Reused leaves beyond the pool go once the engine is idle.
                let (guard, wait) = self
                    .wake
                    .wait_timeout(state, TRIM_AFTER)
                    .unwrap_or_else(PoisonError::into_inner);
                state = guard;
                (state.asleep, state.woken) = (false, false);
                if wait.timed_out() && state.ready.len() > POOL_DEPTH {
                    let excess = state.ready.len() - POOL_DEPTH;
                    let oldest: Vec<_> = state.ready.drain(..excess).collect();
                    state.trash.extend(oldest.into_iter().map(|(_, s)| (s.cgroup, s.run_dir)));
                }
                continue;
            }
            state = self.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
            (state.asleep, state.woken) = (false, false);
        }
    }
}

/// A ready slot made of a finished run's leaves, when they are empty and
/// reset ([`RunCgroup::recycle`]), and its directory's home with a new run
/// directory ([`Slot::reuse`]); otherwise both are removed.
fn reuse(mut cg: RunCgroup, mut run_dir: RunDir, config: &Config, host: &Host) -> Option<Slot> {
    // The run's files go first: their tmpfs pages stay charged to the
    // memory leaf until then, and recycling judges what the leaf holds.
    if run_dir.clear().is_err() || !cg.recycle() {
        remove((Some(cg), run_dir));
        return None;
    }
    match Slot::reuse(config, host, cg, run_dir) {
        Ok(slot) => Some(slot),
        Err(e) => {
            tracing::warn!("janitor: cannot make a run slot ahead: {e}");
            None
        }
    }
}

impl Janitor {
    /// A slot for a run with these bounds and owner: a ready one, else a
    /// finished run's recycled here, else a new one. `warm`: the engine
    /// serves more than one run, so the janitor is started (it refills in
    /// the background). The [`Wake`] asks for the pool's refill when the
    /// run drops it: once its child has the spec, not on the way to it (a
    /// wake-up of the janitor's idle CPU cost the run 20 µs p50 and up to
    /// 270 µs there on a guest that halts idle vCPUs).
    ///
    /// # Errors
    ///
    /// [`SpawnError`] of making a new slot.
    pub(crate) fn take(
        &self,
        warm: bool,
        config: &Config,
        host: &Host,
        (memory_bytes, max_pids): (u64, u32),
        owner: Option<(u32, u32)>,
    ) -> Result<(Slot, Wake), SpawnError> {
        if warm {
            self.start(config, host);
        }
        let mut state = relock(&self.shared.state);
        // A slot idle for long is given up (an executor starting on this
        // runtime directory sweeps what it finds there). The janitor is
        // woken only when there is work for it: the pool below its depth,
        // or a slot to remove (a wake-up per run costs a context switch).
        // It is woken after the lock is let go: woken under it, it would
        // wake only to wait for the lock, and be woken again.
        let mut stale = false;
        while let Some((made, slot)) = state.ready.pop() {
            if made.elapsed() < MAX_IDLE {
                let refill = stale || state.ready.len() < POOL_DEPTH;
                drop(state);
                self.count(0);
                return Ok((slot, Wake(refill.then(|| Arc::clone(&self.shared)))));
            }
            state.trash.push((slot.cgroup, slot.run_dir));
            stale = true;
        }
        drop(state);
        self.shared.wake.notify_one();
        let mut state = relock(&self.shared.state);
        // The pool is empty: the janitor is behind. A finished run's slot
        // is recycled here (cheaper than a new one, and it keeps its
        // rulesets); one that cannot be is the janitor's to remove.
        while let Some((cgroup, run_dir)) = state.used.pop() {
            let Some(cg) = cgroup else {
                state.trash.push((None, run_dir));
                continue;
            };
            drop(state);
            if let Some(slot) = reuse(cg, run_dir, config, host) {
                self.count(1);
                return Ok((slot, Wake(None)));
            }
            state = relock(&self.shared.state);
        }
        drop(state);
        self.count(2);
        Slot::create(config, host, memory_bytes, max_pids, owner).map(|slot| (slot, Wake(None)))
    }

    fn count(&self, how: usize) {
        self.counts[how].fetch_add(1, Ordering::Relaxed);
    }

    /// Ready slots, and how many of them carry their run's pipes.
    #[cfg(test)]
    pub(crate) fn ready_with_pipes(&self) -> (usize, usize) {
        let state = relock(&self.shared.state);
        let with = state.ready.iter().filter(|(_, s)| s.stdio.is_some()).count();
        (state.ready.len(), with)
    }

    /// How runs got their slots so far.
    pub(crate) fn counts(&self) -> SlotCounts {
        let [ready, recycled, made] = self.counts.each_ref().map(|c| c.load(Ordering::Relaxed));
        SlotCounts { ready, recycled, made }
    }

    fn start(&self, config: &Config, host: &Host) {
        let mut thread = relock(&self.thread);
        if thread.is_some() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let (config, host) = (config.clone(), host.clone());
        let spawned = std::thread::Builder::new()
            .name("ongrid-janitor".into())
            .spawn(move || shared.run(&config, &host));
        match spawned {
            Ok(handle) => {
                relock(&self.shared.state).started = true;
                *thread = Some(handle);
            }
            Err(e) => tracing::warn!("janitor: cannot start: {e}; cleaning up inline"),
        }
    }

    /// Hands a finished run's cgroups and directory over for recycling or
    /// removal; removed inline when the janitor is not running or is far
    /// behind.
    pub(crate) fn discard(&self, cgroup: Option<RunCgroup>, run_dir: &mut RunDir, warm: bool) {
        drop(self.discard_later(cgroup, run_dir, warm));
    }

    /// [`Janitor::discard`], with the janitor woken when the returned
    /// [`Wake`] is dropped rather than now: a run drops it once its report
    /// is written, so the janitor's wake-up (a `futex` wake, often an
    /// inter-processor interrupt to wake the other CPU) is off the report's
    /// path. A janitor that recycled finished runs a moment ago is not
    /// woken for each: only for [`RECYCLE_BATCH`] of them, or when the
    /// pool runs low; it takes the rest within [`GATHER_FOR`].
    pub(crate) fn discard_later(
        &self,
        cgroup: Option<RunCgroup>,
        run_dir: &mut RunDir,
        warm: bool,
    ) -> Wake {
        let mut state = relock(&self.shared.state);
        if warm && state.started && !state.stop && state.trash.len() + state.used.len() < MAX_TRASH
        {
            let dir = std::mem::replace(run_dir, RunDir::detached());
            state.used.push((cgroup, dir));
            // One wake-up on its way is enough: the janitor takes every
            // finished run there is when it wakes.
            let now = !state.woken
                && (state.asleep
                    || state.used.len() >= RECYCLE_BATCH
                    || state.ready.len() < POOL_DEPTH);
            state.woken |= now;
            return Wake(now.then(|| Arc::clone(&self.shared)));
        }
        drop(state);
        remove((cgroup, std::mem::replace(run_dir, RunDir::detached())));
        Wake(None)
    }
}

/// Wakes the janitor for a finished run's slot when dropped
/// ([`Janitor::discard_later`]).
#[derive(Debug)]
#[must_use = "dropping it wakes the janitor"]
pub(crate) struct Wake(Option<Arc<Shared>>);

impl Drop for Wake {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            shared.wake.notify_one();
        }
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        relock(&self.shared.state).stop = true;
        self.shared.wake.notify_one();
        if let Some(handle) = relock(&self.thread).take() {
            let _ = handle.join();
        }
        // Not started, or it failed: remove whatever is left here.
        let mut state = relock(&self.shared.state);
        let mut trash = std::mem::take(&mut state.trash);
        trash.append(&mut state.used);
        let ready = std::mem::take(&mut state.ready);
        drop(state);
        trash.into_iter().for_each(remove);
        ready.into_iter().for_each(|(_, slot)| remove((slot.cgroup, slot.run_dir)));
    }
}

/// Removes a run's leaves, then its directory (the order the start-up
/// sweep relies on).
fn remove((cgroup, mut run_dir): Used) {
    if let Some(mut cg) = cgroup {
        cg.remove();
    }
    run_dir.remove();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Engine;

    /// A runtime directory, an engine on it (kept for its instance's
    /// cgroups), its configuration and host; `None` after a visible SKIP
    /// without cgroup v2 leaves (not root).
    fn slot_host(test: &str) -> Option<(tempfile::TempDir, Engine, Config, Host)> {
        let runtime = tempfile::tempdir().unwrap();
        let config = Config { runtime_dir: Some(runtime.path().to_owned()), ..Config::default() };
        let engine = Engine::new(config.clone()).unwrap();
        let host = engine.host().clone();
        if host.cgroups.v2.is_none() {
            println!("SKIP: {test}: no cgroup v2 leaves here (needs root)");
            return None;
        }
        Some((runtime, engine, config, host))
    }

    /// With no ready slot, a run takes a finished run's slot recycled on
    /// its path (the same leaves and home, a new run directory) before it
    /// makes one; a slot without leaves is not recycled but removed.
    #[test]
    fn an_empty_pool_recycles_a_finished_slot_before_making_one() {
        let Some((_runtime, _engine, config, host)) =
            slot_host("an_empty_pool_recycles_a_finished_slot_before_making_one")
        else {
            return;
        };
        let bounds = (config.limits.memory_bytes, config.limits.max_pids);
        let janitor = Janitor::default();
        // Not started (warm = false): nothing refills behind the test.
        let (first, _) = janitor.take(false, &config, &host, bounds, None).unwrap();
        assert_eq!(janitor.counts(), SlotCounts { ready: 0, recycled: 0, made: 1 });
        let (home, old_run) = (first.run_dir.home().to_owned(), first.run_dir.path().to_owned());
        relock(&janitor.shared.state).used.push((first.cgroup, first.run_dir));

        let (again, _) = janitor.take(false, &config, &host, bounds, None).unwrap();
        assert_eq!(janitor.counts(), SlotCounts { ready: 0, recycled: 1, made: 1 });
        assert_eq!(again.run_dir.home(), home, "the same slot");
        assert_ne!(again.run_dir.path(), old_run, "with a new run directory");
        assert!(again.run_dir.path().is_dir() && !old_run.exists());
        assert!(relock(&janitor.shared.state).used.is_empty());

        // A slot without leaves cannot be recycled: it goes to the trash.
        let Slot { cgroup, run_dir, .. } = again;
        let leaves = cgroup.as_ref().map(|c| c.leaves()).unwrap_or_default();
        relock(&janitor.shared.state).used.push((None, run_dir));
        let (made, _) = janitor.take(false, &config, &host, bounds, None).unwrap();
        assert_eq!(janitor.counts(), SlotCounts { ready: 0, recycled: 1, made: 2 });
        assert_eq!(relock(&janitor.shared.state).trash.len(), 1);
        drop(cgroup);
        drop(made);
        drop(janitor);
        assert!(!home.exists(), "dropping the janitor removes its trash: {}", home.display());
        assert!(leaves.iter().all(|l| !l.exists()), "{leaves:?}");
    }

    /// A run that takes a ready slot asks for the refill only when it lets
    /// go of the [`Wake`] (once its child has the spec): until then the
    /// janitor sleeps on, and then it tops the pool up.
    #[test]
    fn the_refill_waits_until_the_run_lets_go_of_its_wake() {
        let Some((_runtime, _engine, config, host)) =
            slot_host("the_refill_waits_until_the_run_lets_go_of_its_wake")
        else {
            return;
        };
        let bounds = (config.limits.memory_bytes, config.limits.max_pids);
        let janitor = Janitor::default();
        let settle = |what: &str, done: &dyn Fn(&State) -> bool| {
            let since = Instant::now();
            while !done(&relock(&janitor.shared.state)) {
                assert!(since.elapsed() < Duration::from_secs(10), "{what}");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        // Started (warm): the pool fills, the janitor goes to sleep.
        let (first, _) = janitor.take(true, &config, &host, bounds, None).unwrap();
        settle("the pool never filled", &|s| s.asleep && s.ready.len() == POOL_DEPTH);
        let (second, wake) = janitor.take(true, &config, &host, bounds, None).unwrap();
        assert!(wake.0.is_some(), "below its depth, the pool is to be refilled");
        std::thread::sleep(Duration::from_millis(100));
        {
            let state = relock(&janitor.shared.state);
            assert!(state.asleep, "the janitor was woken before the run let go");
            assert_eq!(state.ready.len(), POOL_DEPTH - 1);
        }
        drop(wake);
        settle("the pool was not refilled", &|s| s.ready.len() == POOL_DEPTH);
        drop((first, second));
    }

    /// Finished runs that come back to back wake the janitor in batches,
    /// not each: 12 of them, discarded one after the other, wake it at
    /// most 8 times (without batches, 12). A sleeping janitor is woken by
    /// the first; while that wake-up is on its way, no other is sent, and
    /// while it gathers, only a batch of [`RECYCLE_BATCH`] sends one (more
    /// only if this thread is held up for a gathering's length). Those
    /// that did not wake it are still recycled, soon.
    #[test]
    fn finished_runs_back_to_back_wake_the_janitor_in_batches() {
        let Some((_runtime, _engine, config, host)) =
            slot_host("finished_runs_back_to_back_wake_the_janitor_in_batches")
        else {
            return;
        };
        let bounds = (config.limits.memory_bytes, config.limits.max_pids);
        let janitor = Janitor::default();
        let slots: Vec<Slot> =
            (0..12).map(|_| janitor.take(true, &config, &host, bounds, None).unwrap().0).collect();
        // The pool refilled behind the takes, and the janitor asleep.
        let settled = Instant::now();
        while !relock(&janitor.shared.state).asleep {
            assert!(settled.elapsed() < Duration::from_secs(10), "the janitor never slept");
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut wakes = 0;
        for slot in slots {
            let Slot { cgroup, mut run_dir, .. } = slot;
            let wake = janitor.discard_later(cgroup, &mut run_dir, true);
            wakes += usize::from(wake.0.is_some());
        }
        assert!(wakes >= 1, "a sleeping janitor is woken");
        assert!(wakes <= 8, "{wakes} wake-ups for 12 finished runs");
        let waited = Instant::now();
        while !relock(&janitor.shared.state).used.is_empty() {
            assert!(waited.elapsed() < Duration::from_secs(5), "finished runs left unrecycled");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
