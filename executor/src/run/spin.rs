//! How long a run watches without sleeping: only the one run in flight
//! spins, and only for the engine's budget.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How long the only run in flight watches for its child's `exec` before
/// it sleeps (`run::lend`): about what a child made
/// ahead takes from its wake-up to its `exec` on the dev machines. Sleeping
/// lets the run's vCPU halt, and a halted vCPU costs the wake-up at the
/// `exec` ~28 µs on a guest that halts its idle vCPUs at once. Not with other
/// runs in flight (their work wants the CPU) nor on one CPU (the child
/// does), nor in a real-time policy (the child leaves it before its
/// `exec`, and a real-time thread spinning on its CPU would then hold it
/// up). The watching yields the CPU between looks, so a child queued on
/// the run's CPU runs at once.
pub const EXEC_SPIN: Duration = Duration::from_micros(150);

/// How long a run watches without sleeping (for its child's `exec`, and
/// for its skill's exit once the pipes are done): the engine's `budget`
/// ([`EXEC_SPIN`] with more than one CPU) when it is the only run in
/// flight, else not at all.
pub(crate) fn spin_for(active: usize, budget: Duration) -> Duration {
    if active == 1 {
        budget
    } else {
        Duration::ZERO
    }
}

/// Counts a run in the engine's `active` while it lives.
pub(crate) struct Active<'a>(&'a AtomicUsize);

impl<'a> Active<'a> {
    pub(crate) fn enter(active: &'a AtomicUsize) -> Self {
        active.fetch_add(1, Ordering::Relaxed);
        Active(active)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the one run in flight spins, and only as long as the engine's
    /// budget; the runs in flight are counted while their guard lives.
    #[test]
    fn only_the_one_run_in_flight_spins_for_its_exec() {
        let active = AtomicUsize::new(0);
        let first = Active::enter(&active);
        assert_eq!(spin_for(active.load(Ordering::Relaxed), EXEC_SPIN), EXEC_SPIN);
        assert_eq!(spin_for(active.load(Ordering::Relaxed), Duration::ZERO), Duration::ZERO);
        let second = Active::enter(&active);
        assert_eq!(spin_for(active.load(Ordering::Relaxed), EXEC_SPIN), Duration::ZERO);
        drop(first);
        assert_eq!(spin_for(active.load(Ordering::Relaxed), EXEC_SPIN), EXEC_SPIN);
        drop(second);
        assert_eq!(active.load(Ordering::Relaxed), 0);
        assert_eq!(spin_for(0, EXEC_SPIN), Duration::ZERO);
    }
}
