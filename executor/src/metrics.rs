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
//! [`ProcessMetrics`] are the process's own `process_*` (unprefixed: the
//! loader renames them `ongrid_executor_process_*` when it merges them).

use std::time::Duration;

use policy::{Enforcement, RunReport};
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Counter, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// The executor process's `process_*` metrics: those of the prometheus
/// crate's process collector (open and max fds, virtual and resident
/// memory, threads, start time), with its `process_cpu_seconds_total`,
/// which it truncates to whole seconds, replaced by the exact value: the
/// `utime + stime` ticks of `/proc/<pid>/stat` over `CLK_TCK`, as a float.
/// (skilld's `loader::metrics::ProcessMetrics` is the same, prefixed.)
#[derive(Debug)]
pub struct ProcessMetrics {
    pid: i32,
    inner: prometheus::process_collector::ProcessCollector,
    /// The CPU counter's options: a counter made afresh at each collect,
    /// set to the kernel's total (which only grows), so collects at once
    /// cannot add the same time twice.
    cpu: Opts,
    descs: Vec<Desc>,
}

/// The family [`ProcessMetrics`] computes itself.
const CPU_SECONDS: &str = "process_cpu_seconds_total";

impl ProcessMetrics {
    /// The metrics of process `pid`.
    ///
    /// # Errors
    ///
    /// A metric that cannot be made (never, with these fixed names).
    pub fn new(pid: i32) -> Result<Self, prometheus::Error> {
        let inner = prometheus::process_collector::ProcessCollector::new(pid, "");
        let cpu = Opts::new(CPU_SECONDS, "Total user and system CPU time in seconds.");
        let descs = inner
            .desc()
            .into_iter()
            .filter(|d| d.fq_name != CPU_SECONDS)
            .chain(Counter::with_opts(cpu.clone())?.desc())
            .cloned()
            .collect();
        Ok(Self { pid, inner, cpu, descs })
    }

    /// This process's metrics.
    ///
    /// # Errors
    ///
    /// As [`ProcessMetrics::new`].
    pub fn for_self() -> Result<Self, prometheus::Error> {
        Self::new(i32::try_from(std::process::id()).unwrap_or(i32::MAX))
    }
}

impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families: Vec<MetricFamily> =
            self.inner.collect().into_iter().filter(|f| f.name() != CPU_SECONDS).collect();
        if let (Some(total), Ok(cpu)) =
            (cpu_seconds(self.pid), Counter::with_opts(self.cpu.clone()))
        {
            cpu.inc_by(total);
            families.extend(cpu.collect());
        }
        families
    }
}

/// The CPU time of process `pid` in seconds: `utime + stime` of
/// `/proc/<pid>/stat` over `CLK_TCK`.
fn cpu_seconds(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    if per_second <= 0 {
        return None;
    }
    Some(cpu_ticks(&stat)? as f64 / per_second as f64)
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line,
/// counted from the command name's last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    utime.checked_add(stime)
}

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
        let m = Metrics {
            registry: registry.clone(),
            runs_total: IntCounterVec::new(
                Opts::new(
                    "ongrid_executor_runs_total",
                    "Executions answered, by skill and outcome.",
                ),
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
            landlock_enforcement_total: IntCounterVec::new(
                Opts::new(
                    "ongrid_landlock_enforcement_total",
                    "Runs by the Landlock enforcement they got (full, partial, none).",
                ),
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
            landlock_rulesets_total: IntCounterVec::new(
                Opts::new(
                    "ongrid_landlock_rulesets_total",
                    "Landlock rulesets of runs, built or reused from the run slot's cache.",
                ),
                &["how"],
            )?,
            run_slots_total: IntCounterVec::new(
                Opts::new(
                    "ongrid_executor_run_slots_total",
                    "Run slots (directory and cgroup leaves) by how runs got them: ready from \
                     the pool, recycled or made on the run's path.",
                ),
                &["how"],
            )?,
            network_denied_total: IntCounterVec::new(
                Opts::new(
                    "ongrid_network_denied_total",
                    "Connects and sends refused by the runs' egress allowlists, by skill.",
                ),
                &["skill"],
            )?,
            engine_sync: std::sync::Arc::default(),
        };
        registry.register(Box::new(m.network_denied_total.clone()))?;
        registry.register(Box::new(m.runs_total.clone()))?;
        registry.register(Box::new(m.run_duration_seconds.clone()))?;
        registry.register(Box::new(m.sandbox_setup_seconds.clone()))?;
        registry.register(Box::new(m.queue_wait_seconds.clone()))?;
        registry.register(Box::new(m.runs_in_flight.clone()))?;
        registry.register(Box::new(m.runs_queued.clone()))?;
        registry.register(Box::new(m.runs_held.clone()))?;
        registry.register(Box::new(m.landlock_enforcement_total.clone()))?;
        registry.register(Box::new(m.peer_rejected_total.clone()))?;
        registry.register(Box::new(m.connections.clone()))?;
        registry.register(Box::new(m.idle_closed_total.clone()))?;
        registry.register(Box::new(m.landlock_rulesets_total.clone()))?;
        registry.register(Box::new(m.run_slots_total.clone()))?;
        for how in ["built", "reused"] {
            m.landlock_rulesets_total.with_label_values(&[how]);
        }
        for how in ["ready", "recycled", "made"] {
            m.run_slots_total.with_label_values(&[how]);
        }
        Ok(m)
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

    /// `process_*` (renamed by the loader), and the CPU time exact, not
    /// truncated to whole seconds: a child that burnt a few tenths of a
    /// second and was stopped reads its ticks over CLK_TCK, fraction
    /// included.
    #[test]
    fn process_cpu_seconds_are_fractional() {
        use nix::sys::signal::{kill, Signal};
        assert_eq!(
            cpu_ticks("42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 23 2 0 0 20"),
            Some(25)
        );
        let per_second =
            nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap().unwrap() as u64;
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let nix_pid = nix::unistd::Pid::from_raw(pid);
        let stat = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        // Stopped with at least 0.2 s of CPU time that is not a whole
        // number of seconds: the truncated value would be off.
        let burnt = loop {
            assert!(std::time::Instant::now() < deadline, "the child burnt no CPU");
            std::thread::sleep(Duration::from_millis(20));
            if cpu_ticks(&stat(pid)).unwrap() < per_second / 5 {
                continue;
            }
            kill(nix_pid, Signal::SIGSTOP).unwrap();
            while !stat(pid).contains(") T ") {
                std::thread::sleep(Duration::from_millis(1));
            }
            let t = cpu_ticks(&stat(pid)).unwrap();
            if !t.is_multiple_of(per_second) {
                break t;
            }
            kill(nix_pid, Signal::SIGCONT).unwrap();
        };
        let r = Registry::new();
        r.register(Box::new(ProcessMetrics::new(pid).unwrap())).unwrap();
        let text = TextEncoder::new().encode_to_string(&r.gather()).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let cpu: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
            .unwrap_or_else(|| panic!("no cpu seconds in\n{text}"))
            .parse()
            .unwrap();
        let want = burnt as f64 / per_second as f64;
        assert!((cpu - want).abs() < 1e-9, "cpu {cpu}, ticks {burnt} / {per_second}\n{text}");
        assert!(cpu > 0.0 && cpu.fract() != 0.0, "{cpu}");
        assert!(text.contains("# TYPE process_cpu_seconds_total counter\n"), "{text}");
        assert!(text.contains("# TYPE process_open_fds gauge\n"), "{text}");
    }

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
        });
        m.record_run("probe", &report, Duration::from_millis(1));
        m.record_run("probe", &report, Duration::from_millis(1));
        let text = m.render();
        assert!(text.contains("ongrid_network_denied_total{skill=\"probe\"} 6"), "{text}");
    }
}
