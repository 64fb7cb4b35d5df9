//! Shared support of the benchmark tools (`spawnbench`, `loadbench`).
//!
//! # Layout
//!
//! - [`sorted`], [`pct`]: the percentile arithmetic both tools report with.
//! - [`Samples`]: what one variant measured (latencies, setup times, runs,
//!   wall time), filled the same way by both tools.
//! - [`write_packs`]: many valid packs on disk (the scan bench, `loadbench
//!   --loaded-skills`).

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
}

impl Samples {
    /// One sequential run: its latency counts as its wall time too.
    pub fn record(&mut self, elapsed: Duration, setup_us: Option<u64>) {
        self.add(elapsed, setup_us);
        self.wall += elapsed;
    }

    /// One concurrent round: its wall time and each run's latency and setup.
    pub fn record_round(&mut self, wall: Duration, runs: Vec<(Duration, Option<u64>)>) {
        self.wall += wall;
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
