//! The run's side of a spawn through a spawner thread: lending its spec to
//! a child made ahead, making that child's cgroup joins meanwhile, and
//! watching for its `exec`.
//!
//! Creating a child and taking the steps of the spawn sequence that do not
//! depend on the run (the `clone` itself, step 4a's signal resets, step
//! 4b's `setsid`) cost ~55 µs traced, ~85 µs sampled, per run on the dev
//! machine. A spawner thread (`run::spawner`) takes them before the run
//! comes: it creates the child into its berth (`sys::berth`, which also
//! holds the rule for how long the memory shared with that child stays
//! valid), where the child waits on a futex, and the run then only hands
//! it its spec and wakes it. The child takes the rest of the sequence (4c
//! to 5) as a child made for the run does.
//!
//! The spawner thread waits asleep in `futex` while its child is parked,
//! not suspended in `clone(CLONE_VFORK)` as while a child made for a run
//! works up to `execve`: that sleep is uninterruptible and counts in the
//! load average, and an idle executor read one per spawner thread on
//! `uptime`.
//!
//! The run learns that its child exec'd from the child itself, not from the
//! spawner thread: the kernel zeroes the handoff's word, which the child
//! made its clear-child-tid address, and wakes the run at the `exec`,
//! before it lets the spawner thread out of `clone`. The run's thread is
//! woken once, by the `exec`, not by the spawner thread woken first (one
//! cross-CPU wake-up fewer on the run's path, ~20-30 µs on the dev machine,
//! whose idle vCPUs halt).

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sys::berth::{self, Berth, Handoff, Job};
use crate::sys::process;
use crate::sys::spec::{ChildSpec, SpawnFailure, Spawned, Step};

/// Lends `spec` to a spawner thread: `give` hands the job to a parked
/// child (returning its berth) or queues it (`None`). Waits until the
/// child exec'd or failed: from the handoff, for up to `spin` without
/// sleeping, when a parked child took it ([`wait_for_exec`]), else from
/// the job's answer. With a nonzero `spin` the calling thread also offers
/// to make that child's cgroup joins (step 4c, [`crate::run::join`]) while
/// it works. `meanwhile` runs once the spec is handed over (and those
/// joins made), while the child works towards its `exec`.
///
/// # Errors
///
/// As `sys::child::spawn`; a spec that would join a mount namespace is
/// refused (`EINVAL` at `clone`); a job `give` gives back, or dropped unanswered,
/// is a `clone` failure (`EAGAIN`).
pub fn lend<'b>(
    spec: &ChildSpec<'_>,
    spin: Duration,
    give: impl FnOnce(Job) -> Result<Option<&'b Berth>, Job>,
    meanwhile: impl FnOnce(),
) -> Result<Spawned, SpawnFailure> {
    // A parked child cannot join a mount namespace: its spawner thread's
    // filter denies `setns` (the thread lives in the runs' namespace
    // already, and so does the child).
    if spec.mount_ns.is_some() {
        return Err(SpawnFailure { step: Step::Clone, errno: libc::EINVAL });
    }
    let handoff = Arc::new(Handoff::default());
    // The only run in flight (it spins) offers to make its parked child's
    // cgroup joins while the child takes its other steps (`run::join`).
    let run_joins = !spin.is_zero() && !spec.cgroup_procs.is_empty();
    if run_joins {
        handoff.joining.offer();
    }
    berth::lend(spec, &handoff, give, |berth| {
        if run_joins && berth.is_some() {
            join_if_accepted(&handoff, spec.cgroup_procs, spin);
        }
        meanwhile();
        if berth.is_some() {
            wait_for_exec(&handoff, spin);
        }
    })
}

/// Blocks until the handoff [ended](Handoff::ended): the child that took
/// the spec exec'd or exited, or the spawner thread released it.
///
/// With a nonzero `spin`, first watches the word for that long without
/// sleeping, yielding the CPU between looks (the caller decides when the
/// CPU is not wanted elsewhere: [`EXEC_SPIN`](crate::run::spin::EXEC_SPIN)).
/// A thread asleep in `futex` lets its vCPU halt, and on a guest whose idle
/// vCPUs halt at once the `exec`'s wake-up then waits for the host to run
/// that vCPU again (~28 µs on the dev machines); the child's steps up to
/// `exec` take about as long as the spin, so the run usually sees the word
/// change while still running.
fn wait_for_exec(handoff: &Handoff, spin: Duration) {
    if !spin.is_zero() {
        let since = Instant::now();
        while !handoff.ended() && since.elapsed() < spin {
            // `sched_yield`, not a pause: a child the scheduler queued on
            // this CPU (the other one busy) runs at once, rather than after
            // the spin.
            std::thread::yield_now();
        }
    }
    handoff.sleep_until_ended();
}

/// The run's half of [`crate::run::join`], once the spec is handed over and
/// the child woken: waits (yielding its CPU) for up to `spin` for the child
/// to take the offer up, then writes the child's pid into `procs` and lets
/// it go on to its exec. Withdraws the offer when the child has not
/// answered by then, is gone, or no child took the spec: a child that
/// answers later finds it withdrawn and joins itself, as one made for the
/// run does. Call only after [`crate::run::join::Joining::offer`], with the
/// spec's `cgroup_procs`.
fn join_if_accepted(handoff: &Handoff, procs: &[RawFd], spin: Duration) {
    let since = Instant::now();
    while handoff.joining.open() && !handoff.ended() && since.elapsed() < spin {
        std::thread::yield_now();
    }
    if !handoff.joining.withdraw() {
        return;
    }
    // The child stored its pid and pidfd before it took the offer up.
    // The spawner thread reaps it only after this run let the berth go
    // (`Berth::child_gone`), and no wait for "any child" (the orphan
    // reaper's) runs during the writes: the pid is the child's.
    let (pid, pidfd) = handoff.taken_by();
    let joined = process::while_unreaped(pidfd, || handoff.joining.join(pid, procs));
    if joined.is_none() {
        handoff.joining.gone();
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::wait_for_exec;

    /// The wait returns once the word is zeroed: during its spin (without
    /// waiting the spin out), and after it, asleep in `futex`.
    #[test]
    fn a_released_handoff_is_seen_spinning_or_asleep() {
        let ms = Duration::from_millis;
        // (spin, released after, must return before)
        for (spin, after, within) in [(ms(2_000), ms(5), ms(1_000)), (ms(0), ms(20), ms(5_000))]
            .into_iter()
            .chain([(Duration::from_micros(100), ms(20), ms(5_000))])
        {
            let (handoff, releaser) = crate::sys::berth::released_later(after);
            let t0 = Instant::now();
            wait_for_exec(&handoff, spin);
            let waited = t0.elapsed();
            releaser.join().unwrap();
            assert!(
                waited >= after,
                "spin {spin:?}: returned after {waited:?}, before the release"
            );
            assert!(
                waited < within,
                "spin {spin:?}: released at {after:?}, returned after {waited:?}"
            );
        }
    }
}
