//! One concurrent round: `conc` clients start together and each makes runs
//! until the first of them has made its share; the others stop after the
//! run they are in.
//!
//! Throughput is counted over the time while every client was running:
//! from the start until the first client was done, with the runs that
//! ended in it. The tools used to wait for every client to make its whole
//! share and divided by that, so each round ended with a drain, fewer clients running and the CPUs partly idle, that
//! weighed on the variant whose runs vary most. Both measures are kept
//! ([`Round::drained`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use crate::{cpu_wakeups, HostTime};

/// What one concurrent round measured, besides its runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Round {
    /// From the start until the first client had made its share.
    pub wall: Duration,
    /// The runs that ended within `wall`.
    pub rate_runs: usize,
    /// The host's CPU time over `wall`.
    pub host: HostTime,
    /// From the start until the last client was done.
    pub drained: Duration,
    /// Interrupts by which one CPU woke another over `wall`
    /// ([`cpu_wakeups`]); `None` when a count failed.
    pub wakeups: Option<u64>,
}

/// Runs `run` on each of `clients` (one thread each) at once, `per` times
/// for the first client to get there and as many as they make meanwhile
/// for the others; returns the round and each run's result, in no order.
pub fn run_round<C: Send, T: Send>(
    clients: Vec<C>,
    per: usize,
    run: impl Fn(&mut C) -> T + Sync,
) -> (Round, Vec<T>) {
    // Every client ready (its thread started), then the clock, then go.
    let ready = Barrier::new(clients.len() + 1);
    let barrier = Barrier::new(clients.len() + 1);
    let stop = AtomicBool::new(false);
    // When the first client was done: the instant, the host's time, the
    // wake-up count.
    let first: OnceLock<(Instant, Option<HostTime>, Option<u64>)> = OnceLock::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .into_iter()
            .map(|mut client| {
                let (ready, barrier, stop, first, run) = (&ready, &barrier, &stop, &first, &run);
                s.spawn(move || {
                    ready.wait();
                    barrier.wait();
                    let mut out = Vec::with_capacity(per);
                    while !stop.load(Ordering::Acquire) {
                        let r = run(&mut client);
                        let end = Instant::now();
                        out.push((end, r));
                        if out.len() >= per && !stop.swap(true, Ordering::AcqRel) {
                            let _ = first.set((end, HostTime::now(), cpu_wakeups()));
                        }
                    }
                    out
                })
            })
            .collect();
        ready.wait();
        let host0 = HostTime::now();
        let woken0 = cpu_wakeups();
        // Taken once every client thread has started and before they are
        // let go: read after the barrier, this thread could be scheduled
        // later than a client that already ran (a round then measured
        // 0 ns, and less than its slowest run).
        let t0 = Instant::now();
        barrier.wait();
        let runs: Vec<(Instant, T)> =
            handles.into_iter().flat_map(|h| h.join().expect("client thread")).collect();
        let drained = t0.elapsed();
        let (end, host1, woken1) = first.get().copied().unwrap_or((t0 + drained, None, None));
        let round = Round {
            wall: end.saturating_duration_since(t0),
            rate_runs: runs.iter().filter(|(at, _)| *at <= end).count(),
            host: host1.zip(host0).map(|(h, h0)| h.since(h0)).unwrap_or_default(),
            drained,
            wakeups: woken1.zip(woken0).map(|(b, a)| b.saturating_sub(a)),
        };
        (round, runs.into_iter().map(|(_, r)| r).collect())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The round ends for the rate when the first client is done: a slow
    /// client's run that ends after that is kept but not counted in the
    /// rate, and no client makes more than its share.
    #[test]
    fn the_rate_stops_at_the_first_client_done() {
        use std::sync::atomic::AtomicUsize;
        let fast_runs = AtomicUsize::new(0);
        let slow_started = AtomicBool::new(false);
        // Client 0's runs take no time once client 1 is in its run (so it
        // cannot find the round over before it starts); client 1's one run
        // lasts until client 0 has made its share, and 20 ms more.
        let (round, runs) = run_round(vec![0u8, 1], 5, |who: &mut u8| {
            if *who == 0 {
                while !slow_started.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                fast_runs.fetch_add(1, Ordering::SeqCst);
            } else {
                slow_started.store(true, Ordering::SeqCst);
                while fast_runs.load(Ordering::SeqCst) < 5 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            *who
        });
        let fast = runs.iter().filter(|w| **w == 0).count();
        let slow = runs.iter().filter(|w| **w == 1).count();
        assert_eq!((fast, slow), (5, 1), "each stops after the run it is in");
        assert_eq!(round.rate_runs, 5, "the slow run ended after the first client was done");
        assert!(round.drained >= round.wall + Duration::from_millis(20), "{round:?}");
    }
}
