//! Shared support of the benchmark tools (`spawnbench`, `loadbench`, `hostbench`).
//!
//! # Layout
//!
//! - [`sorted`], [`pct`]: the percentile arithmetic the tools report with.
//! - [`Samples`]: what one variant measured (latencies, setup times, runs,
//!   wall time, the host's busy and stolen CPU time), filled the same way
//!   by both tools; [`HostTime`] reads the latter, [`cpu_wakeups`] the
//!   interrupts by which one CPU wakes another.
//! - [`run_round`]: one concurrent round of the clients, timed while all
//!   of them run ([`Round`]).
//! - [`settle`]: waits, untimed, until the kernel work a run left behind
//!   (`bwrap`'s namespace teardown) is done ([`Settled`], [`host_cpu`]).
//! - [`write_packs`]: many valid packs on disk (the scan bench, `loadbench
//!   --loaded-skills`).
//! - [`interrupt`]: an interrupted `loadbench` stops the daemons it
//!   started and removes their folders.
//! - [`first_line`], [`kernel_release`], [`cpus`]: the machine facts every tool's
//!   header prints (`/proc/loadavg`, the kernel).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

pub mod interrupt;
mod round;
mod settle;

pub use round::{run_round, Round};
pub use settle::{host_cpu, settle, Quiet, Settled};

/// A sorted copy of `v` (total order, NaN last).
pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

/// The `p` quantile (0.0 to 1.0, nearest rank) of an already sorted slice;
/// NaN when it is empty.
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Writes `n` valid packs under `root`, 100 per folder
/// (`group000/pack00000/{skill.json,run.sh}`): a typical manifest of about
/// 400 bytes with a schema, and an executable entry.
///
/// # Panics
///
/// When a file cannot be written.
pub fn write_packs(root: &Path, n: usize) {
    for i in 0..n {
        let dir = root.join(format!("group{:03}/pack{i:05}", i / 100));
        fs::create_dir_all(&dir).unwrap();
        let manifest = serde_json::json!({
            "name": format!("skill_{i:05}"),
            "description": "Reports disk usage of a path, with a realistic description length.",
            "entry": "run.sh",
            "class": "safe",
            "category": "storage",
            "timeout_seconds": 10,
            "env_allow": ["LANG"],
            "schema": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "depth": {"type": "integer"}},
                "required": ["path"]
            }
        });
        fs::write(dir.join("skill.json"), manifest.to_string()).unwrap();
        let entry = dir.join("run.sh");
        fs::write(&entry, "#!/bin/sh\necho '{}'\n").unwrap();
        fs::set_permissions(&entry, fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// What one variant measured.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    /// Each run's latency, µs.
    pub lat_us: Vec<f64>,
    /// Each run's CPU time, µs (only tools that measure it).
    pub cpu_us: Vec<f64>,
    /// The sandbox setup time its report gave, µs (runs that report one).
    pub setup_us: Vec<f64>,
    /// Runs measured.
    pub runs: usize,
    /// Runs that ended inside `wall`: all of them when sequential; when
    /// concurrent, those that ended while every client was still running
    /// (throughput is `rate_runs / wall`).
    pub rate_runs: usize,
    /// Wall time the runs took: summed when sequential; when concurrent,
    /// each round's from its start until its first client had made its
    /// share of runs (the others then stop after the run they are in).
    pub wall: Duration,
    /// Each concurrent round's wall time until its last client was done:
    /// `wall` plus the drain, when fewer clients than asked were running
    /// (the older measure: `runs / drained`).
    pub drained: Duration,
    /// CPU time the whole host was busy over `wall` when concurrent, all
    /// CPUs and processes together, steal not included ([`HostTime`]);
    /// zero when sequential.
    pub busy: Duration,
    /// CPU time the hypervisor gave to others while this guest's CPUs
    /// wanted to run, over the same time ([`HostTime::steal`]).
    pub steal: Duration,
    /// Interrupts by which one CPU woke another during the sequential runs
    /// or over the concurrent `wall` ([`cpu_wakeups`]); `None` when not
    /// counted, or when a count failed.
    pub wakeups: Option<u64>,
    /// [`Samples::add_wakeups`] was called.
    wakeups_counted: bool,
    /// After each run (or round) that leaves kernel work behind it, the
    /// untimed wait until the host was quiet again ([`settle`]).
    pub settled: Vec<Settled>,
}

impl Samples {
    /// One sequential run: its latency counts as its wall time too.
    pub fn record(&mut self, elapsed: Duration, setup_us: Option<u64>) {
        self.add(elapsed, setup_us);
        self.rate_runs += 1;
        self.wall += elapsed;
        self.drained += elapsed;
    }

    /// One concurrent round ([`Round`]): each run's latency and setup, and
    /// what the round's full-concurrency time holds.
    pub fn record_round(&mut self, round: Round, runs: Vec<(Duration, Option<u64>)>) {
        self.wall += round.wall;
        self.drained += round.drained;
        self.rate_runs += round.rate_runs;
        self.busy += round.host.busy;
        self.steal += round.host.steal;
        for (elapsed, setup_us) in runs {
            self.add(elapsed, setup_us);
        }
    }

    /// Runs per second: the runs that ended inside the timed wall time.
    pub fn runs_per_s(&self) -> f64 {
        self.rate_runs as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Runs per second counting each round until its last client was done.
    pub fn drained_runs_per_s(&self) -> f64 {
        self.runs as f64 / self.drained.as_secs_f64().max(1e-9)
    }

    /// The host's busy CPU time per run over the timed wall time.
    pub fn busy_per_run(&self) -> Duration {
        self.busy / u32::try_from(self.rate_runs.max(1)).unwrap_or(u32::MAX)
    }

    /// Adds the wake-ups counted over some of the runs; `None` (not
    /// counted) leaves the total unknown for good.
    pub fn add_wakeups(&mut self, n: Option<u64>) {
        let first = !self.wakeups_counted;
        self.wakeups_counted = true;
        self.wakeups = match (first, self.wakeups, n) {
            (true, _, n) => n,
            (false, Some(w), Some(n)) => Some(w + n),
            _ => None,
        };
    }

    /// Wake-ups of another CPU per run, when every run's were counted.
    pub fn wakeups_per_run(&self) -> Option<f64> {
        self.wakeups.filter(|_| self.rate_runs > 0).map(|w| w as f64 / self.rate_runs as f64)
    }

    fn add(&mut self, elapsed: Duration, setup_us: Option<u64>) {
        self.lat_us.push(elapsed.as_secs_f64() * 1e6);
        self.setup_us.extend(setup_us.map(|u| u as f64));
        self.runs += 1;
    }
}

/// The first line of the file at `path` (empty if it cannot be read).
pub fn first_line(path: &str) -> String {
    fs::read_to_string(path).unwrap_or_default().lines().next().unwrap_or("").to_owned()
}

/// The running kernel's release (empty if `uname` fails).
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// CPU time of the whole host since boot, all CPUs together, from the
/// first line of `/proc/stat` (clock ticks, so 10 ms steps; a difference
/// over many rounds averages them out).
///
/// `steal` is kept apart from `busy`: on a shared host it is the time the
/// hypervisor ran other guests while this one's CPUs wanted to run, work
/// nobody here did, and it comes and goes with the neighbours (seen here:
/// from ~0 to a third of both CPUs within minutes). The tools print it so
/// that a noisy round shows as one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostTime {
    /// User, nice, system, irq and softirq time (guest time is in `user`).
    pub busy: Duration,
    /// Time stolen by the hypervisor.
    pub steal: Duration,
}

impl HostTime {
    /// The host's time since boot; `None` without `/proc`.
    pub fn now() -> Option<HostTime> {
        HostTime::parse(&fs::read_to_string("/proc/stat").ok()?, clock_ticks()?)
    }

    /// From the text of `/proc/stat`, at `hz` ticks per second.
    pub fn parse(stat: &str, hz: u64) -> Option<HostTime> {
        let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
        let ticks: Vec<u64> = cpu.split_whitespace().map_while(|t| t.parse().ok()).collect();
        let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = ticks[..] else {
            return None;
        };
        let time = |t: u64| Duration::from_micros(t.saturating_mul(1_000_000) / hz.max(1));
        Some(HostTime { busy: time(user + nice + system + irq + softirq), steal: time(steal) })
    }

    /// What passed between `before` and `self`.
    #[must_use]
    pub fn since(self, before: HostTime) -> HostTime {
        HostTime {
            busy: self.busy.saturating_sub(before.busy),
            steal: self.steal.saturating_sub(before.steal),
        }
    }

    /// A time (busy or stolen) as a share of `cpus` CPUs over `wall`, in
    /// percent.
    pub fn share(time: Duration, wall: Duration, cpus: usize) -> f64 {
        time.as_secs_f64() / (wall.as_secs_f64() * cpus as f64).max(1e-9) * 100.0
    }
}

/// Interrupts by which one CPU has made another run something since boot,
/// all CPUs together: the `RES` (rescheduling) and `CAL` (function call)
/// lines of `/proc/interrupts`.
///
/// On a guest whose idle vCPUs halt (`haltpoll.guest_halt_poll_ns=0`, as
/// on the dev machines), waking a thread whose CPU is idle sends one of
/// them, and the woken vCPU runs only once the hypervisor schedules it
/// again: tens of microseconds each, measured. Counted per run, they show how many such hops a
/// path takes. `None` without `/proc/interrupts` or without either line.
pub fn cpu_wakeups() -> Option<u64> {
    parse_wakeups(&fs::read_to_string("/proc/interrupts").ok()?)
}

/// [`cpu_wakeups`] from the text of `/proc/interrupts`: the per-CPU counts
/// of its `RES:` and `CAL:` lines (as many as the header names CPUs).
pub fn parse_wakeups(text: &str) -> Option<u64> {
    let mut lines = text.lines();
    let cpus = lines.next()?.split_whitespace().filter(|c| c.starts_with("CPU")).count();
    let mut found = 0;
    let mut sum = 0u64;
    for line in lines {
        let mut fields = line.split_whitespace();
        if !matches!(fields.next(), Some("RES:" | "CAL:")) {
            continue;
        }
        let counts: Vec<u64> = fields.take(cpus).map_while(|c| c.parse().ok()).collect();
        if counts.len() != cpus {
            return None;
        }
        sum += counts.iter().sum::<u64>();
        found += 1;
    }
    (found == 2).then_some(sum)
}

/// CPUs this process may run on (1 when unknown).
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

fn clock_ticks() -> Option<u64> {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100);
    u64::try_from(hz).ok().filter(|h| *h > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU kept busy for 300 ms shows in the host's busy time (ticks of
    /// 10 ms: at least 200 ms of it, counting what the hypervisor stole).
    #[test]
    fn host_time_counts_a_busy_cpu() {
        let before = HostTime::now().expect("/proc/stat");
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            std::hint::spin_loop();
        }
        let spent = HostTime::now().expect("/proc/stat").since(before);
        assert!(spent.busy + spent.steal >= Duration::from_millis(200), "{spent:?}");
    }

    /// Steal is read from its own column, not counted as busy.
    #[test]
    fn steal_is_kept_apart_from_busy() {
        let stat = "cpu  100 1 20 5000 7 2 3 40 0 0\ncpu0 50 0 10 2500 3 1 1 20 0 0\n";
        let t = HostTime::parse(stat, 100).unwrap();
        assert_eq!(t.busy, Duration::from_millis(1260));
        assert_eq!(t.steal, Duration::from_millis(400));
        let later = HostTime::parse("cpu  200 1 20 5000 7 2 3 90 0 0\n", 100).unwrap();
        let d = later.since(t);
        assert_eq!((d.busy, d.steal), (Duration::from_secs(1), Duration::from_millis(500)));
        assert_eq!(HostTime::share(d.steal, Duration::from_millis(500), 2), 50.0);
        assert_eq!(HostTime::parse("cpu0 1 2 3 4 5 6 7 8\n", 100), None, "the total line first");
        assert_eq!(HostTime::parse("cpu  1 2 3\n", 100), None, "too few columns");
    }

    /// Only the rescheduling and function-call lines count, every CPU's
    /// column of them, and nothing without both.
    #[test]
    fn wakeups_are_the_res_and_cal_columns() {
        let text = "           CPU0       CPU1       \n\
                    \x20 1:         9          0   IO-APIC   1-edge      i8042\n\
                    LOC:      1000       2000   Local timer interrupts\n\
                    RES:        10         20   Rescheduling interrupts\n\
                    CAL:       300        400   Function call interrupts\n\
                    TLB:         5          6   TLB shootdowns\n";
        assert_eq!(parse_wakeups(text), Some(730));
        let no_cal = text.replace("CAL:", "XYZ:");
        assert_eq!(parse_wakeups(&no_cal), None);
        let short = text.replace("400   Function", "Function");
        assert_eq!(parse_wakeups(&short), None, "a column missing");
        assert!(cpu_wakeups().is_some(), "this host has /proc/interrupts with both lines");
    }

    /// Wake-ups add up over the runs they were counted for; one lost count
    /// makes the total unknown rather than low.
    #[test]
    fn wakeups_add_up_or_are_unknown() {
        let mut s = Samples::default();
        assert_eq!(s.wakeups_per_run(), None);
        for n in [3, 5] {
            s.record(Duration::from_millis(1), None);
            s.add_wakeups(Some(n));
        }
        assert_eq!(s.wakeups_per_run(), Some(4.0));
        s.record(Duration::from_millis(1), None);
        s.add_wakeups(None);
        s.add_wakeups(Some(7));
        assert_eq!((s.wakeups, s.wakeups_per_run()), (None, None));
    }

    /// Samples add up rounds: wall and busy time summed, every run kept;
    /// the rate counts only the runs inside the timed wall time.
    #[test]
    fn rounds_add_up() {
        let mut s = Samples::default();
        let ms = Duration::from_millis;
        let round = |wall, rate_runs, busy, steal, drained| Round {
            wall: ms(wall),
            rate_runs,
            host: HostTime { busy: ms(busy), steal: ms(steal) },
            drained: ms(drained),
            wakeups: None,
        };
        s.record_round(round(10, 2, 15, 1, 12), vec![(ms(2), Some(5)), (ms(3), None)]);
        s.record_round(round(20, 1, 30, 2, 30), vec![(ms(4), Some(7)), (ms(9), None)]);
        assert_eq!((s.runs, s.rate_runs, s.wall, s.drained), (4, 3, ms(30), ms(42)));
        assert_eq!((s.busy, s.steal, s.busy_per_run()), (ms(45), ms(3), ms(15)));
        assert!((s.runs_per_s() - 100.0).abs() < 1e-9);
        assert!((s.drained_runs_per_s() - 4.0 / 0.042).abs() < 1e-9);
        assert_eq!(s.lat_us, [2000.0, 3000.0, 4000.0, 9000.0]);
        assert_eq!(s.setup_us, [5.0, 7.0]);
        s.add_wakeups(Some(6));
        assert_eq!(s.wakeups_per_run(), Some(2.0));
    }
}
