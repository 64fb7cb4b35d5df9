//! The executor's Prometheus metrics, registered on an injected
//! [`Registry`] (no global registry, so tests build a fresh one and assert
//! exact counts).
//!
//! Names follow the Prometheus conventions: the `ongrid_` prefix, base
//! units, `_total` on counters. The skill name is the only high-cardinality
//! label, and it is set only from a manifest the executor validated under
//! its own roots (an unknown or refused manifest is counted with
//! `skill=""`), so a caller cannot mint label values.
//!
//! The loader fetches [`Metrics::render`] through the `metrics` method of
//! the executor wire and appends it to its own `/metrics`.
//!
//! The process's own `process_*` are `plumbing::process_metrics`, unprefixed:
//! the loader renames them `ongrid_executor_process_*` when it merges them.

use std::time::Duration;

use policy::{Enforcement, RunReport};
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Run-duration buckets, 1 ms to 60 s (a run killed at a 60 s timeout
/// lands in `le="60"` or `+Inf`).
pub const DURATION_BUCKETS: [f64; 15] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Sandbox-setup and queue-wait buckets: 100 µs to 60 s.
pub const SHORT_BUCKETS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// The executor's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Where the metrics are registered (rendered by [`Metrics::render`]).
    registry: Registry,
    /// `ongrid_executor_runs_total{skill,outcome}`: every `execute` that got
    /// an answer (report or `busy`).
    pub runs_total: IntCounterVec,
    /// `ongrid_executor_run_duration_seconds`: runs handed to the engine,
    /// from its start to the report (queue wait excluded).
    pub run_duration_seconds: Histogram,
    /// `ongrid_sandbox_setup_seconds`: validation to exec, of runs that
    /// spawned (the report's `setup_us`).
    pub sandbox_setup_seconds: Histogram,
    /// `ongrid_executor_queue_wait_seconds`: time admitted runs waited for a
    /// slot.
    pub queue_wait_seconds: Histogram,
    /// `ongrid_executor_runs_in_flight`: runs holding a slot.
    pub runs_in_flight: IntGauge,
    /// `ongrid_executor_runs_queued`: admitted runs waiting for a slot.
    pub runs_queued: IntGauge,
    /// `ongrid_executor_runs_held`: held runs prepared and waiting for
    /// their `start`.
    pub runs_held: IntGauge,
    /// `ongrid_landlock_enforcement_total{status}`: `full`, `partial` or
    /// `none`, per run that built a sandbox.
    pub landlock_enforcement_total: IntCounterVec,
    /// `ongrid_executor_peer_rejected_total`: connections refused by the
    /// SO_PEERCRED check.
    pub peer_rejected_total: IntCounter,
    /// `ongrid_executor_connections`: accepted connections open now.
    pub connections: IntGauge,
    /// `ongrid_executor_idle_closed_total`: connections closed for sending
    /// no request for `idle_timeout_seconds` with no run in flight.
    pub idle_closed_total: IntCounter,
    /// `ongrid_landlock_rulesets_total{how}`: rulesets `built` for a run,
    /// or `reused` from its slot's cache; brought up to the engine's counts
    /// at each scrape ([`Metrics::sync_engine`]).
    pub landlock_rulesets_total: IntCounterVec,
    /// `ongrid_executor_run_slots_total{how}`: how runs got their slot
    /// (directory and cgroup leaves): `ready` from the pool, `recycled`
    /// from a finished run on the run's path, `made` on the run's path;
    /// brought up to the engine's counts at each scrape.
    pub run_slots_total: IntCounterVec,
    /// `ongrid_network_denied_total{skill}`: connects and sends the runs'
    /// egress rules refused.
    pub network_denied_total: IntCounterVec,
    /// `ongrid_warm_hits_total{skill}`: runs that took a warm run.
    pub warm_hits_total: IntCounterVec,
    /// `ongrid_warm_misses_total{skill}`: runs of a warm-granted skill that
    /// found none and ran cold.
    pub warm_misses_total: IntCounterVec,
    /// `ongrid_warm_discarded_total{skill}`: warm runs killed unused.
    pub warm_discarded_total: IntCounterVec,
    /// `ongrid_warm_idle{skill}`: warm runs waiting now.
    pub warm_idle: IntGaugeVec,
    /// `ongrid_sandbox_denials_total{skill,kind}`: the runs' refusals
    /// listed in their reports (`sandbox.denials`), by kind (`fs`,
    /// `syscall`, `network`).
    pub sandbox_denials_total: IntCounterVec,
    /// `ongrid_sandbox_denial_records_lost_total{why}`: audit records of
    /// refusals not in any report: `socket` (the executor's socket was
    /// full), `late` (the run's report was out).
    pub denial_records_lost_total: IntCounterVec,
    /// Serialises [`Metrics::sync_engine`].
    engine_sync: std::sync::Arc<std::sync::Mutex<()>>,
}

impl Metrics {
    /// Creates the metrics and registers them on `registry`.
    ///
    /// # Errors
    ///
    /// [`prometheus::Error`] when a name is already registered there.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
        };
        let m = Metrics {
            registry: registry.clone(),
            runs_total: counters(
                "ongrid_executor_runs_total",
                "Executions answered, by skill and outcome.",
                &["skill", "outcome"],
            )?,
            run_duration_seconds: histogram(
                "ongrid_executor_run_duration_seconds",
                "Wall time of runs handed to the run engine.",
                &DURATION_BUCKETS,
            )?,
            sandbox_setup_seconds: histogram(
                "ongrid_sandbox_setup_seconds",
                "Validation to exec of runs that spawned.",
                &SHORT_BUCKETS,
            )?,
            queue_wait_seconds: histogram(
                "ongrid_executor_queue_wait_seconds",
                "Time admitted runs waited for a run slot.",
                &SHORT_BUCKETS,
            )?,
            runs_in_flight: IntGauge::new(
                "ongrid_executor_runs_in_flight",
                "Runs holding a run slot now.",
            )?,
            runs_queued: IntGauge::new(
                "ongrid_executor_runs_queued",
                "Admitted runs waiting for a run slot now.",
            )?,
            runs_held: IntGauge::new(
                "ongrid_executor_runs_held",
                "Held runs prepared and waiting for their start now.",
            )?,
            landlock_enforcement_total: counters(
                "ongrid_landlock_enforcement_total",
                "Runs by the Landlock enforcement they got (full, partial, none).",
                &["status"],
            )?,
            peer_rejected_total: IntCounter::new(
                "ongrid_executor_peer_rejected_total",
                "Connections refused by the peer-credential check.",
            )?,
            connections: IntGauge::new(
                "ongrid_executor_connections",
                "Accepted executor-socket connections open now.",
            )?,
            idle_closed_total: IntCounter::new(
                "ongrid_executor_idle_closed_total",
                "Connections closed after idle_timeout_seconds without a request or a run.",
            )?,
            landlock_rulesets_total: counters(
                "ongrid_landlock_rulesets_total",
                "Landlock rulesets of runs, built or reused from the run slot's cache.",
                &["how"],
            )?,
            run_slots_total: counters(
                "ongrid_executor_run_slots_total",
                "Run slots (directory and cgroup leaves) by how runs got them: ready from \
                     the pool, recycled or made on the run's path.",
                &["how"],
            )?,
            network_denied_total: counters(
                "ongrid_network_denied_total",
                "Connects and sends refused by the runs' egress allowlists, by skill.",
                &["skill"],
            )?,
            warm_hits_total: counters(
                "ongrid_warm_hits_total",
                "Runs that took a warm run, by skill.",
                &["skill"],
            )?,
            warm_misses_total: counters(
                "ongrid_warm_misses_total",
                "Runs of a skill granted warm runs that found none and ran cold, by skill.",
                &["skill"],
            )?,
            warm_discarded_total: counters(
                "ongrid_warm_discarded_total",
                "Warm runs killed unused (output, exit or stdin closed while idle, expiry, \
                     changed files, eviction, reload, shutdown, or taken but not usable), by skill.",
                &["skill"],
            )?,
            warm_idle: IntGaugeVec::new(
                Opts::new("ongrid_warm_idle", "Warm runs waiting for a request now, by skill."),
                &["skill"],
            )?,
            sandbox_denials_total: counters(
                "ongrid_sandbox_denials_total",
                "Refusals listed in the runs' reports (sandbox.denials), by skill and kind.",
                &["skill", "kind"],
            )?,
            denial_records_lost_total: counters(
                "ongrid_sandbox_denial_records_lost_total",
                "Audit records of refusals in no report: the socket was full, or the run's \
                     report was out.",
                &["why"],
            )?,
            engine_sync: std::sync::Arc::default(),
        };
        m.register(registry)?;
        Ok(m)
    }

    /// Registers every metric on `registry`, and makes the series of each
    /// label value known ahead (so they read 0 rather than missing).
    fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.denial_records_lost_total.clone()))?;
        registry.register(Box::new(self.sandbox_denials_total.clone()))?;
        registry.register(Box::new(self.network_denied_total.clone()))?;
        registry.register(Box::new(self.runs_total.clone()))?;
        registry.register(Box::new(self.run_duration_seconds.clone()))?;
        registry.register(Box::new(self.sandbox_setup_seconds.clone()))?;
        registry.register(Box::new(self.queue_wait_seconds.clone()))?;
        registry.register(Box::new(self.runs_in_flight.clone()))?;
        registry.register(Box::new(self.runs_queued.clone()))?;
        registry.register(Box::new(self.runs_held.clone()))?;
        registry.register(Box::new(self.landlock_enforcement_total.clone()))?;
        registry.register(Box::new(self.peer_rejected_total.clone()))?;
        registry.register(Box::new(self.connections.clone()))?;
        registry.register(Box::new(self.idle_closed_total.clone()))?;
        registry.register(Box::new(self.landlock_rulesets_total.clone()))?;
        registry.register(Box::new(self.run_slots_total.clone()))?;
        registry.register(Box::new(self.warm_hits_total.clone()))?;
        registry.register(Box::new(self.warm_misses_total.clone()))?;
        registry.register(Box::new(self.warm_discarded_total.clone()))?;
        registry.register(Box::new(self.warm_idle.clone()))?;
        for how in ["built", "reused"] {
            self.landlock_rulesets_total.with_label_values(&[how]);
        }
        for why in ["socket", "late"] {
            self.denial_records_lost_total.with_label_values(&[why]);
        }
        for how in ["ready", "recycled", "made"] {
            self.run_slots_total.with_label_values(&[how]);
        }
        Ok(())
    }

    /// Brings the counters the engine keeps itself up to its counts:
    /// `ongrid_landlock_rulesets_total` ([`crate::Engine::landlock_rulesets`])
    /// and `ongrid_executor_run_slots_total` ([`crate::Engine::run_slots`]).
    pub fn sync_engine(&self, (built, reused): (u64, u64), slots: crate::SlotCounts) {
        let _one = self.engine_sync.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let bring = |vec: &IntCounterVec, how: &str, now: u64| {
            let counter = vec.with_label_values(&[how]);
            counter.inc_by(now.saturating_sub(counter.get()));
        };
        bring(&self.landlock_rulesets_total, "built", built);
        bring(&self.landlock_rulesets_total, "reused", reused);
        bring(&self.run_slots_total, "ready", slots.ready);
        bring(&self.run_slots_total, "recycled", slots.recycled);
        bring(&self.run_slots_total, "made", slots.made);
    }

    /// Brings the warm-pool metrics up to the engine's counts
    /// ([`crate::Engine::warm_stats`]); the skills are those `executor.toml`
    /// grants warm runs, so no caller mints a label.
    pub fn sync_warm(&self, stats: &[(String, crate::run::warm::WarmStats)]) {
        let _one = self.engine_sync.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let bring = |vec: &IntCounterVec, skill: &str, now: u64| {
            let counter = vec.with_label_values(&[skill]);
            counter.inc_by(now.saturating_sub(counter.get()));
        };
        for (skill, s) in stats {
            bring(&self.warm_hits_total, skill, s.hits);
            bring(&self.warm_misses_total, skill, s.misses);
            bring(&self.warm_discarded_total, skill, s.discarded);
            self.warm_idle
                .with_label_values(&[skill])
                .set(i64::try_from(s.idle).unwrap_or(i64::MAX));
        }
    }

    /// Brings `ongrid_sandbox_denial_records_lost_total` up to the engine's
    /// counts ([`crate::Engine::denials`]).
    pub fn sync_denials(&self, (lost, late): (u64, u64)) {
        let _one = self.engine_sync.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (why, now) in [("socket", lost), ("late", late)] {
            let counter = self.denial_records_lost_total.with_label_values(&[why]);
            counter.inc_by(now.saturating_sub(counter.get()));
        }
    }

    /// Counts an answered `execute` under `skill` (`""` when the manifest
    /// was not validated).
    pub fn count_outcome(&self, skill: &str, outcome: policy::Outcome) {
        self.runs_total.with_label_values(&[skill, outcome.as_str()]).inc();
    }

    /// Records a report the engine produced after running for `elapsed`.
    pub fn record_run(&self, skill: &str, report: &RunReport, elapsed: Duration) {
        self.count_outcome(skill, report.outcome);
        self.run_duration_seconds.observe(elapsed.as_secs_f64());
        if let Some(sandbox) = &report.sandbox {
            if report.setup_us > 0 {
                self.sandbox_setup_seconds.observe(report.setup_us as f64 / 1e6);
            }
            let status = match sandbox.landlock.status {
                Enforcement::Full => "full",
                Enforcement::Partial => "partial",
                Enforcement::None => "none",
            };
            self.landlock_enforcement_total.with_label_values(&[status]).inc();
            if sandbox.network.denied_total > 0 {
                let denied = self.network_denied_total.with_label_values(&[skill]);
                denied.inc_by(sandbox.network.denied_total);
            }
            for d in &sandbox.denials {
                let kind = d.kind.as_str();
                self.sandbox_denials_total.with_label_values(&[skill, kind]).inc_by(d.count);
            }
        }
    }

    /// The registry's text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        TextEncoder::new().encode_to_string(&self.registry.gather()).unwrap_or_else(|e| {
            // Encoding fails only on inconsistent families, which the typed
            // metrics above cannot produce; say so in the text itself.
            format!("# ongrid-executor: metrics encoding failed: {e}\n")
        })
    }
}

#[cfg(test)]
mod tests {
    use policy::Outcome;

    use super::*;

    #[test]
    fn fresh_registry_counts_exactly() {
        let registry = Registry::new();
        let m = Metrics::new(&registry).unwrap();
        assert!(Metrics::new(&registry).is_err(), "names are registered once");
        m.count_outcome("x", Outcome::Busy);
        let report = RunReport::not_run("x", Outcome::Rejected, "no");
        m.record_run("", &report, Duration::from_millis(3));
        let text = m.render();
        assert!(
            text.contains("ongrid_executor_runs_total{outcome=\"busy\",skill=\"x\"} 1"),
            "{text}"
        );
        assert!(text.contains("ongrid_executor_runs_total{outcome=\"rejected\",skill=\"\"} 1"));
        assert!(text.contains("ongrid_executor_run_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("ongrid_executor_run_duration_seconds_count 1"));
        assert!(text.contains("ongrid_sandbox_setup_seconds_count 0"));
        assert!(text.contains("ongrid_executor_connections 0"));
        assert!(text.contains("ongrid_executor_peer_rejected_total 0"));
    }

    #[test]
    fn refusals_count_by_skill() {
        let m = Metrics::new(&Registry::new()).unwrap();
        let mut report = RunReport::not_run("probe", Outcome::Ok, "");
        report.sandbox = Some(policy::SandboxReport {
            uid: 0,
            gid: 0,
            no_new_privs: true,
            capabilities: vec![],
            landlock: policy::report::LandlockReport {
                abi: 0,
                status: Enforcement::None,
                net: false,
                scoped: false,
            },
            seccomp: true,
            network: policy::NetworkReport {
                enabled: true,
                denied_total: 3,
                ..policy::NetworkReport::default()
            },
            cgroup: policy::report::CgroupReport::default(),
            rlimits: std::collections::BTreeMap::new(),
            degraded: vec![],
            proc: policy::sandbox::ProcView::Own,
            denials: vec![policy::Denial {
                kind: policy::DenialKind::Fs,
                access: "read_file".into(),
                path: Some("/etc/shadow".into()),
                syscall: None,
                destination: None,
                count: 2,
            }],
            denials_total: 2,
            denials_off: None,
        });
        m.record_run("probe", &report, Duration::from_millis(1));
        m.record_run("probe", &report, Duration::from_millis(1));
        let text = m.render();
        assert!(text.contains("ongrid_network_denied_total{skill=\"probe\"} 6"), "{text}");
        let fs = "ongrid_sandbox_denials_total{kind=\"fs\",skill=\"probe\"} 4";
        assert!(text.contains(fs), "{text}");
    }
}
