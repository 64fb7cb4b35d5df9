//! Shared support of the benchmark tools (`spawnbench`, `loadbench`, `hostbench`).
//!
//! # Layout
//!
//! - [`sorted`], [`pct`]: the percentile arithmetic the tools report with.
//! - [`Samples`]: what one variant measured (latencies, setup times, runs,
//!   wall time, the host's busy CPU time), filled the same way by both
//!   tools; [`host_busy`] reads the latter.
//! - [`write_packs`]: many valid packs on disk (the scan bench, `loadbench
//!   --loaded-skills`).
//! - [`first_line`], [`kernel_release`]: the machine facts every tool's
//!   header prints (`/proc/loadavg`, the kernel).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

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
    /// Wall time the runs took: summed when sequential, per round when
    /// concurrent (throughput is `runs / wall`).
    pub wall: Duration,
    /// CPU time the whole host was busy during the concurrent rounds, all
    /// CPUs and processes together ([`host_busy`]); zero when sequential.
    pub busy: Duration,
}

impl Samples {
    /// One sequential run: its latency counts as its wall time too.
    pub fn record(&mut self, elapsed: Duration, setup_us: Option<u64>) {
        self.add(elapsed, setup_us);
        self.wall += elapsed;
    }

    /// One concurrent round: its wall time, the host's busy CPU time over
    /// it, and each run's latency and setup.
    pub fn record_round(
        &mut self,
        wall: Duration,
        busy: Duration,
        runs: Vec<(Duration, Option<u64>)>,
    ) {
        self.wall += wall;
        self.busy += busy;
        for (elapsed, setup_us) in runs {
            self.add(elapsed, setup_us);
        }
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

/// CPU time the host has spent busy since boot, all CPUs together: the
/// first line of `/proc/stat` less `idle` and `iowait` (clock ticks, so
/// 10 ms steps; a difference over many rounds averages them out). `None`
/// without `/proc`.
pub fn host_busy() -> Option<Duration> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> =
        stat.lines().next()?.split_whitespace().skip(1).map_while(|t| t.parse().ok()).collect();
    // Guest time is counted in `user` already.
    let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = ticks[..] else {
        return None;
    };
    let busy = user + nice + system + irq + softirq + steal;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100);
    let hz = u64::try_from(hz).ok().filter(|h| *h > 0)?;
    Some(Duration::from_micros(busy.saturating_mul(1_000_000) / hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU kept busy for 300 ms shows in the host's busy time (ticks of
    /// 10 ms: at least 200 ms of it).
    #[test]
    fn host_busy_counts_a_busy_cpu() {
        let before = host_busy().expect("/proc/stat");
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            std::hint::spin_loop();
        }
        let busy = host_busy().expect("/proc/stat").saturating_sub(before);
        assert!(busy >= Duration::from_millis(200), "{busy:?}");
    }

    /// Samples add up rounds: wall and busy time summed, every run kept.
    #[test]
    fn rounds_add_up() {
        let mut s = Samples::default();
        let ms = Duration::from_millis;
        s.record_round(ms(10), ms(15), vec![(ms(2), Some(5)), (ms(3), None)]);
        s.record_round(ms(20), ms(30), vec![(ms(4), Some(7))]);
        assert_eq!((s.runs, s.wall, s.busy), (3, ms(30), ms(45)));
        assert_eq!(s.lat_us, [2000.0, 3000.0, 4000.0]);
        assert_eq!(s.setup_us, [5.0, 7.0]);
    }
}
