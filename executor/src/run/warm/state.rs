//! The pools' shared state: each skill's pool and counts, what the pool
//! thread is to kill, the lock and wake-up the requests and the pool thread
//! share, and how long a pool rests after a failure (the pools' logic is
//! the parent module's).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use super::process::Warm;
use crate::run::file_key::FileKey;
use crate::run::lock::relock;

/// After a warm run of a skill could not be made, wrote or exited before
/// it was taken, or gave its run slot up to a request (evicted, or lent
/// and not taken), its pool waits this long before making another
/// (the reason is logged each time), twice as long after each such failure
/// in a row, up to [`RETRY_AFTER`] x 32 (a skill that always writes at
/// start is made about once a minute); a run taken, or one that lasted
/// until it expired, resets it.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// One skill's pool, as [`WarmPools::stats`](super::WarmPools::stats) reports it.
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
    /// Warm runs killed unused: output, exit or stdin closed before its
    /// args, expiry, changed files, eviction, reload, shutdown, or taken
    /// but not usable.
    pub discarded: u64,
}

/// One skill's pool: where its runs are made from, its idle runs, its
/// counts and its rest after failures.
#[derive(Debug, Default)]
pub(super) struct Pool {
    /// The manifest (canonical path) and tool the pool is made from.
    pub(super) source: Option<(PathBuf, Option<String>)>,
    pub(super) idle: VecDeque<Warm>,
    pub(super) stats: WarmStats,
    /// Not tried again before this (a warm run could not be made).
    pub(super) retry_at: Option<Instant>,
    /// Warm runs that could not be made or spoiled, in a row.
    pub(super) failures: u32,
}

impl Pool {
    /// A warm run could not be made, spoiled or gave its slot up: the pool rests
    /// ([`RETRY_AFTER`], doubled for each failure in a row).
    pub(super) fn rest(&mut self) {
        let doubled = self.failures.min(5);
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(Instant::now() + RETRY_AFTER * (1 << doubled));
    }
}

/// What the pools' lock guards.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) pools: HashMap<String, Pool>,
    /// Warm runs to kill, with why (the pool thread kills them).
    pub(super) dead: Vec<(Warm, &'static str)>,
    /// Warm runs taken out of their pool to be put down, not yet in
    /// `dead` (`WarmPools::put_down_all`): the pool thread does not
    /// return before they are there.
    pub(super) putting_down: usize,
    pub(super) stop: bool,
    /// Idle warm runs over all pools.
    pub(super) idle: usize,
    /// Counts `WarmPools::discard_all` calls: a warm run whose making
    /// began under an older count is discarded when made.
    pub(super) generation: u64,
    /// When the idle runs' files were last looked up (at most every
    /// `SWEEP_EVERY`: a request's take checks its own run's anyway).
    pub(super) swept: Option<Instant>,
    /// A [`Refill`] was dropped since the pool thread last looked over the
    /// pools (its wake-up may have come while it was busy).
    pub(super) refill: bool,
    /// The server has no run left: the pool thread, stopped, returns once
    /// every discarded run is killed (`WarmPools::finish`).
    pub(super) finished: bool,
    /// Requests waiting in the server's queue for a run slot
    /// ([`Queued`]): a warm run made meanwhile is put down, its slot
    /// theirs.
    pub(super) queued: usize,
}

/// The pool thread's state and its wake-up.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) wake: Condvar,
}

/// A request counted in [`State::queued`] until dropped
/// (`WarmPools::wait_for_slot`).
#[derive(Debug)]
pub(crate) struct Queued(pub(super) Arc<Shared>);

impl Drop for Queued {
    fn drop(&mut self) {
        let mut state = relock(&self.0.state);
        state.queued = state.queued.saturating_sub(1);
    }
}

/// Wakes the pool thread when dropped. A request that took or missed a
/// warm run drops it once its report is out: the refill (the plan, a
/// slot, the hand-off to a parked child) then starts after the reply, not
/// on a CPU the reply still needs.
#[derive(Debug)]
pub(crate) struct Refill(pub(super) Option<Arc<Shared>>);

impl Drop for Refill {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            relock(&shared.state).refill = true;
            shared.wake.notify_one();
        }
    }
}

/// Files looked up by path: what each is now (`None`: it cannot be
/// looked up).
pub(super) type Files = HashMap<PathBuf, Option<FileKey>>;

/// Why the idle runs are discarded when the executor stops.
pub(super) const STOPPING: &str = "the executor is stopping";

/// Why a warm run made from other files than the request's is discarded.
pub(super) const STALE: &str =
    "made from other files than the request's (its manifest or entry changed, or another manifest or tool was named)";

/// Why a warm run idle for `warm_idle_seconds` is discarded.
pub(super) const EXPIRED: &str = "idle for warm_idle_seconds";

/// Why a warm run is discarded on `warm_discard` (skilld's reload).
pub(super) const RELOADED: &str = "a reload asked for every pool to be made again";

/// The next warm run the pool thread makes: of which skill, from which
/// manifest and tool, with the run slot it will hold while idle, under
/// which [`State::generation`].
pub(super) struct Work {
    pub(super) skill: String,
    pub(super) path: PathBuf,
    pub(super) tool: Option<String>,
    pub(super) permit: OwnedSemaphorePermit,
    pub(super) generation: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_rests_twice_as_long_after_each_failure_in_a_row() {
        let mut pool = Pool::default();
        let mut rest = || {
            let before = Instant::now();
            pool.rest();
            pool.retry_at.map(|at| at.duration_since(before).as_secs())
        };
        let rests: Vec<Option<u64>> = (0..8).map(|_| rest()).collect();
        let want = [2, 4, 8, 16, 32, 64, 64, 64].map(Some);
        assert_eq!(rests, want);
    }
}
