//! Waiting out the kernel work a run leaves behind it.
//!
//! A `bwrap --unshare-all` run ends before its namespaces do: the kernel
//! tears the network, IPC and mount namespaces down afterwards in worker
//! threads, behind RCU grace periods (expedited ones interrupt every CPU).
//! On the dev machine that is about 2 ms of CPU within the ~60 ms after
//! each run, measured, which lands on the runs of whatever variant comes
//! next. [`settle`] waits, outside every timing,
//! until the host is quiet again, and says how long that took and how
//! much CPU the host spent meanwhile: the run's cost that its caller does
//! not wait for.

use std::fs;
use std::time::{Duration, Instant};

use crate::{cpus, HostTime};

/// What one [`settle`] waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// From the call until the host was quiet (or the cap).
    pub waited: Duration,
    /// CPU time the whole host spent meanwhile, every CPU and task
    /// together (the waiting itself included: a few µs per window).
    pub cpu: Duration,
    /// The host never was quiet before the cap.
    pub capped: bool,
}

/// How [`settle`] decides that the host is quiet.
#[derive(Debug, Clone, Copy)]
pub struct Quiet {
    /// Always wait this long: the teardown starts after RCU grace periods,
    /// so a quiet first millisecond says nothing.
    pub at_least: Duration,
    /// A window of this length ...
    pub window: Duration,
    /// ... in which the host used at most this share of all its CPUs.
    pub share: f64,
    /// Give up waiting after this long.
    pub cap: Duration,
}

impl Default for Quiet {
    fn default() -> Quiet {
        Quiet {
            at_least: Duration::from_millis(60),
            window: Duration::from_millis(5),
            share: 0.05,
            cap: Duration::from_millis(300),
        }
    }
}

/// Waits until the host is quiet by `q`; `None` when the host's CPU time
/// cannot be read.
pub fn settle(q: Quiet) -> Option<Settled> {
    let t0 = Instant::now();
    let first = host_cpu()?;
    std::thread::sleep(q.at_least);
    let budget = q.window.mul_f64(q.share * cpus() as f64);
    let mut last = host_cpu()?;
    let capped = loop {
        if t0.elapsed() >= q.cap {
            break true;
        }
        std::thread::sleep(q.window);
        let now = host_cpu()?;
        let used = now.saturating_sub(last);
        last = now;
        if used <= budget {
            break false;
        }
    };
    Some(Settled { waited: t0.elapsed(), cpu: last.saturating_sub(first), capped })
}

/// CPU time every task of the host has run since boot: the root cpuacct
/// group's `cpuacct.usage` (ns) under cgroup v1, else the root group's
/// `usage_usec` under cgroup v2, else `/proc/stat`'s busy time (10 ms
/// ticks: too coarse for the window, but never quiet by mistake).
pub fn host_cpu() -> Option<Duration> {
    if let Some(ns) = read_u64("/sys/fs/cgroup/cpuacct/cpuacct.usage") {
        return Some(Duration::from_nanos(ns));
    }
    if let Some(us) =
        fs::read_to_string("/sys/fs/cgroup/cpu.stat").ok().as_deref().and_then(parse_usage_usec)
    {
        return Some(Duration::from_micros(us));
    }
    HostTime::now().map(|h| h.busy)
}

fn read_u64(path: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `usage_usec` of a cgroup v2 `cpu.stat`.
pub fn parse_usage_usec(stat: &str) -> Option<u64> {
    stat.lines().find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_usec_is_read_from_its_own_line() {
        let stat = "usage_usec 1234567\nuser_usec 1000\nsystem_usec 234567\n";
        assert_eq!(parse_usage_usec(stat), Some(1_234_567));
        assert_eq!(parse_usage_usec("user_usec 5\n"), None);
        assert_eq!(parse_usage_usec("usage_usec x\n"), None);
    }

    #[test]
    fn a_host_kept_busy_is_waited_for_until_the_cap() {
        let Some(_) = host_cpu() else {
            eprintln!("SKIP: no host CPU time readable here");
            return;
        };
        // A thread spinning on a CPU keeps the host above any 1 % share.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spin = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let q = Quiet {
            at_least: Duration::from_millis(5),
            window: Duration::from_millis(5),
            share: 0.01,
            cap: Duration::from_millis(60),
        };
        let s = settle(q).expect("settle");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spin.join().unwrap();
        assert!(s.capped, "{s:?}");
        assert!(s.waited >= q.cap, "{s:?}");
        assert!(s.cpu >= Duration::from_millis(40), "the spinner's CPU is counted: {s:?}");
    }

    #[test]
    fn the_first_quiet_window_ends_the_wait() {
        let Some(_) = host_cpu() else {
            eprintln!("SKIP: no host CPU time readable here");
            return;
        };
        // Any use is quiet (other tests may keep every CPU busy meanwhile):
        // the first window must end the wait.
        let q = Quiet {
            at_least: Duration::from_millis(5),
            window: Duration::from_millis(5),
            share: 1.5,
            cap: Duration::from_secs(5),
        };
        let s = settle(q).expect("settle");
        assert!(!s.capped, "{s:?}");
        assert!(s.waited >= q.at_least + q.window, "{s:?}");
    }
}
