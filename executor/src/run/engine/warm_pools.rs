//! The engine's side of the warm pools (`run::warm`): their controls for
//! the server, making a warm run (steps 1 to 5 without a request) and
//! killing one never used.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::{settle, Engine};
use crate::run::egress;
use crate::run::plan::Plan;
use crate::run::spawn;
use crate::run::warm::{Maker, Warm, WarmStats};
use crate::sandbox::cgroup::RunCgroup;

impl Engine {
    /// Warm pools' counts by skill (`run::warm`).
    pub fn warm_stats(&self) -> Vec<(String, WarmStats)> {
        self.warm.stats()
    }

    /// Runs the warm pools' thread on the calling thread until
    /// [`Engine::finish_warm`] ([`Engine::stop_warm`] only stops the
    /// pools: the thread goes on killing the runs discarded later): it
    /// makes the granted skills' warm runs, each holding a permit of
    /// `slots` (the server's run slots) while idle, and discards the
    /// spoiled, stale and expired ones. Returns at once when
    /// no skill is granted warm runs. Call it from a thread that lives as
    /// long as the runs it makes (a run created without a spawner thread
    /// has its parent-death signal tied to it).
    pub fn serve_warm(&self, slots: &Arc<Semaphore>) {
        self.warm.serve(self, slots);
    }

    /// Stops the warm pools: every idle warm run is put down at once, on
    /// the calling thread; [`Engine::serve_warm`] reaps them, makes no
    /// more, and goes on killing the runs discarded later until
    /// [`Engine::finish_warm`].
    pub fn stop_warm(&self) {
        self.warm.stop();
    }

    /// Stops the warm pools and lets [`Engine::serve_warm`] return once
    /// every discarded run is killed. Call it once no run is in flight:
    /// a taken warm run its thread created dies with that thread.
    pub fn finish_warm(&self) {
        self.warm.finish();
    }

    /// Discards every idle warm run, and one being made now (`warm_discard`,
    /// sent by skilld's reload): the pools are made again from the skill
    /// files as they are now. Returns how many idle runs were discarded.
    pub fn discard_warm(&self) -> u64 {
        self.warm.discard_all()
    }

    /// Kills one idle warm run to free its run slot; false when none
    /// holds one.
    pub fn evict_warm(&self) -> bool {
        self.warm.evict()
    }

    /// Counts a request waiting in the queue for a run slot until the
    /// guard drops (see `WarmPools::wait_for_slot`).
    pub(crate) fn wait_for_warm_slot(&self) -> crate::run::warm::Queued {
        self.warm.wait_for_slot()
    }

    /// The run slot of an idle warm run of `skill`, lent to a request of
    /// it that found none free (see `WarmPools::lend_slot`).
    pub fn lend_warm_slot(&self, skill: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.warm.lend_slot(skill)
    }

    /// Kills a warm run never used (its tree, then its reaping), and hands
    /// its slot back to the janitor.
    fn kill_warm(&self, mut warm: Warm) {
        self.warm.kill_now(&mut warm);
        let Warm { mut prep, child, pgid, .. } = warm;
        if let Some(cg) = prep.cgroup.as_mut() {
            settle(cg);
        }
        let until = Instant::now() + Duration::from_secs(2);
        let mut gone = false;
        while !gone && Instant::now() < until {
            gone = self.reaper.collect(child.pid).is_some();
            if !gone {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if !gone {
            // Reaped later as an orphan, its status parked for no one.
            self.reaper.forget(child.pid);
        }
        drop((child, pgid));
        self.reaper.reap_orphans();
        prep.end_egress();
        self.janitor.discard(prep.cgroup.take(), &mut prep.run_dir, true);
    }
}

impl Maker for Engine {
    fn make(&self, path: &std::path::Path, tool: Option<&str>) -> Result<Warm, String> {
        let at = self.parsed.locate(&self.config.roots, path, tool).map_err(|e| e.to_string())?;
        let args = b"{}".to_vec();
        let plan = Plan::build_located(&self.config, at, tool, args, &self.env)
            .map_err(|e| e.to_string())?;
        let l = &plan.granted.limits;
        let owner = plan.run_as.switch.then_some((plan.run_as.uid, plan.run_as.gid));
        let bounds = (l.memory_bytes, l.max_pids);
        let resolved = egress::resolve_grant_blocking(&plan.granted).map_err(|e| e.to_string())?;
        let (slot, refill) = self
            .janitor
            .take(true, &self.config, &self.host, bounds, owner)
            .map_err(|e| e.to_string())?;
        let mut prep = spawn::prepare(&self.config, &self.host, &plan, &resolved, slot)
            .map_err(|e| e.to_string())?;
        // Its refusals are watched from its spawn, as a cold run's: the
        // report of the request that takes it lists those of its start-up
        // too, as a cold run's report would.
        prep.report.denials_off = self.denials.off().map(str::to_owned);
        let leaves = prep.cgroup.as_ref().map(RunCgroup::leaves).unwrap_or_default();
        let watch = self.denials.watch(leaves);
        prep.log_denials = watch.is_some();
        let idle = self.warm.starts_idle(&prep);
        let child = match spawn::spawn_waiting(&mut prep, &plan.entry, &self.spawners, idle, || {
            drop(refill);
        }) {
            Ok(child) => child,
            Err(e) => {
                prep.end_egress();
                self.janitor.discard(prep.cgroup.take(), &mut prep.run_dir, true);
                return Err(e.to_string());
            }
        };
        self.reaper.track(child.pid);
        if let Some(w) = &watch {
            w.pid(child.pid);
        }
        let pgid = prep.cgroup.is_none().then(|| self.instance.record_pgid(child.pid)).flatten();
        Ok(Warm::new(plan, tool.map(str::to_owned), prep, (child, pgid), watch))
    }

    fn kill(&self, warm: Warm) {
        self.kill_warm(warm);
    }
}
