//! The daemon's Prometheus metrics, held in an injected registry.
//!
//! Names follow the Prometheus conventions (prefix `ongrid_`, base units,
//! `_total` counters); the skill name is the only high-cardinality label,
//! and only registered names ever reach it. One scrape target carries both
//! daemons: [`merge_executor_text`] appends the executor's exposition, got
//! over its socket with the `metrics` call (its `process_*` renamed
//! `ongrid_executor_process_*`; a family the loader already has is dropped).
//!
//! | Metric | Type | Labels |
//! |---|---|---|
//! | `ongrid_executions_total` | counter | `skill`, `outcome` |
//! | `ongrid_run_duration_seconds` | histogram | `skill` |
//! | `ongrid_run_queue_wait_seconds` | histogram | |
//! | `ongrid_runs_in_flight` | gauge | |
//! | `ongrid_answers_unsent` | gauge | |
//! | `ongrid_skills_registered` | gauge | |
//! | `ongrid_manifest_errors_total` | counter | `reason` (the scan event's kind: `parse`, `build`, a schema that does not compile included, `duplicate`...) |
//! | `ongrid_reloads_total` | counter | |
//! | `ongrid_http_requests_total` | counter | `route`, `code` |
//! | `ongrid_executor_up` | gauge | |
//! | `ongrid_authz_decisions_total` | counter | `decision`, `reason` |
//! | `ongrid_audit_write_errors_total` | counter | |
//! | `ongrid_audit_syncs_total` | counter | `when` |
//! | `ongrid_audit_wait_seconds` | histogram | `row` |
//! | `ongrid_build_info` | gauge | `version` |
//! | `ongrid_skilld_process_*` | `plumbing::process_metrics::ProcessMetrics` (`cpu_seconds_total`, `open_fds`, `max_fds`, `virtual_memory_bytes`, `resident_memory_bytes`, `start_time_seconds`, `threads`) | |
//! | `ongrid_executor_process_*` | the executor's, renamed | |

use std::collections::HashSet;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The namespace of skilld's process metrics: `ongrid_skilld_process_*`.
pub const PROCESS_NAMESPACE: &str = "ongrid_skilld";

/// Buckets from 1 ms to 60 s (the longest default timeout is 30 s; a run
/// killed at a 60 s timeout still lands in a finite bucket).
pub const DURATION_BUCKETS: [f64; 15] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Buckets from 25 µs to 1 s for the audit's waits: a row written in
/// place takes tens to hundreds of microseconds, an `fsync`ed commit
/// milliseconds on a slow disk.
pub const AUDIT_WAIT_BUCKETS: [f64; 15] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0,
];

/// The `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every metric the loader updates.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Finished requests to run a registered skill, by skill and outcome
    /// (`invalid_args`, `denied` and `busy` included, and `cancelled`: an
    /// allowed request whose client went away, or that a stopping skilld
    /// cut, before its report).
    pub executions_total: IntCounterVec,
    /// Wall time of runs the executor reported on, by skill.
    pub run_duration_seconds: HistogramVec,
    /// Time a run waited for one of the `max_concurrent_runs` slots.
    pub run_queue_wait_seconds: Histogram,
    /// Runs forwarded to the executor and not finished.
    pub runs_in_flight: IntGauge,
    /// Answers of finished runs that the client's connection has not
    /// taken yet; each holds its run slot (`api::answer`).
    pub answers_unsent: IntGauge,
    /// Skills in the current registry.
    pub skills_registered: IntGauge,
    /// Manifests, files and roots skipped by scans, by reason.
    pub manifest_errors_total: IntCounterVec,
    /// Scans done (start-up, SIGHUP, `POST /v1/reload`).
    pub reloads_total: IntCounter,
    /// Client API requests, by route template and status code.
    pub http_requests_total: IntCounterVec,
    /// 1 if the last `metrics` call reached the executor, else 0.
    pub executor_up: IntGauge,
    /// Permission decisions on run requests, by decision (`allow`,
    /// `deny`) and reason (`safe`, `confirmed`, `dual_signed`, or a deny
    /// reason code).
    pub authz_decisions_total: IntCounterVec,
    /// Audit rows that could not be written.
    pub audit_write_errors_total: IntCounter,
    /// `fsync`s of the audit trail, by when: `commit` (before an answer)
    /// or `interval` (in the background, `audit_synchronous = "interval"`).
    pub audit_syncs_total: IntCounterVec,
    /// How long a request waited for its audit row, by row: `decision` (an
    /// allowed run's first row, before the run), `completion` (its
    /// outcome, before the answer), `refusal` (a `deny` or `reject` row,
    /// before the answer).
    pub audit_wait_seconds: HistogramVec,
}

impl Metrics {
    /// Creates the metrics and registers them, with
    /// `ongrid_build_info{version}`, in `registry`.
    ///
    /// # Errors
    ///
    /// A registration error (a name already registered in `registry`).
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let buckets = DURATION_BUCKETS.to_vec();
        let m = Self {
            executions_total: IntCounterVec::new(
                Opts::new("ongrid_executions_total", "Skill run requests finished, by outcome."),
                &["skill", "outcome"],
            )?,
            run_duration_seconds: HistogramVec::new(
                HistogramOpts::new("ongrid_run_duration_seconds", "Wall time of skill runs.")
                    .buckets(buckets.clone()),
                &["skill"],
            )?,
            run_queue_wait_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "ongrid_run_queue_wait_seconds",
                    "Time runs waited for a run slot in the loader.",
                )
                .buckets(buckets),
            )?,
            runs_in_flight: IntGauge::new("ongrid_runs_in_flight", "Runs not finished yet.")?,
            answers_unsent: IntGauge::new(
                "ongrid_answers_unsent",
                "Answers of finished runs not yet taken by the client, each holding a run slot.",
            )?,
            skills_registered: IntGauge::new(
                "ongrid_skills_registered",
                "Skills in the current registry.",
            )?,
            manifest_errors_total: IntCounterVec::new(
                Opts::new(
                    "ongrid_manifest_errors_total",
                    "Manifests, files or roots skipped by scans, by reason.",
                ),
                &["reason"],
            )?,
            reloads_total: IntCounter::new("ongrid_reloads_total", "Scans of the skill roots.")?,
            http_requests_total: IntCounterVec::new(
                Opts::new("ongrid_http_requests_total", "Client API requests, by route and code."),
                &["route", "code"],
            )?,
            executor_up: IntGauge::new(
                "ongrid_executor_up",
                "1 if the executor answered the last metrics call.",
            )?,
            authz_decisions_total: IntCounterVec::new(
                Opts::new(
                    "ongrid_authz_decisions_total",
                    "Permission decisions on run requests, by decision and reason.",
                ),
                &["decision", "reason"],
            )?,
            audit_write_errors_total: IntCounter::new(
                "ongrid_audit_write_errors_total",
                "Audit rows that could not be written.",
            )?,
            audit_syncs_total: IntCounterVec::new(
                Opts::new(
                    "ongrid_audit_syncs_total",
                    "Fsyncs of the audit trail, before an answer (commit) or on a timer (interval).",
                ),
                &["when"],
            )?,
            audit_wait_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "ongrid_audit_wait_seconds",
                    "Time requests waited for their audit row to be written, by row.",
                )
                .buckets(AUDIT_WAIT_BUCKETS.to_vec()),
                &["row"],
            )?,
        };
        registry.register(Box::new(m.executions_total.clone()))?;
        registry.register(Box::new(m.run_duration_seconds.clone()))?;
        registry.register(Box::new(m.run_queue_wait_seconds.clone()))?;
        registry.register(Box::new(m.runs_in_flight.clone()))?;
        registry.register(Box::new(m.answers_unsent.clone()))?;
        registry.register(Box::new(m.skills_registered.clone()))?;
        registry.register(Box::new(m.manifest_errors_total.clone()))?;
        registry.register(Box::new(m.reloads_total.clone()))?;
        registry.register(Box::new(m.http_requests_total.clone()))?;
        registry.register(Box::new(m.executor_up.clone()))?;
        registry.register(Box::new(m.authz_decisions_total.clone()))?;
        registry.register(Box::new(m.audit_write_errors_total.clone()))?;
        registry.register(Box::new(m.audit_syncs_total.clone()))?;
        registry.register(Box::new(m.audit_wait_seconds.clone()))?;
        let build = IntGaugeVec::new(
            Opts::new("ongrid_build_info", "Build of ongrid-skilld; always 1."),
            &["version"],
        )?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        registry.register(Box::new(build))?;
        Ok(m)
    }

    /// A guard counting one run in flight until it is dropped.
    pub fn run_in_flight(&self) -> InFlight {
        self.runs_in_flight.inc();
        InFlight(self.runs_in_flight.clone())
    }

    /// A guard counting one answer in `ongrid_answers_unsent` until it is
    /// dropped.
    pub fn answer_unsent(&self) -> InFlight {
        self.answers_unsent.inc();
        InFlight(self.answers_unsent.clone())
    }
}

/// Decrements its gauge (`ongrid_runs_in_flight`, `ongrid_answers_unsent`)
/// when dropped, however the run or answer ends (including a client that
/// goes away midway).
#[derive(Debug)]
pub struct InFlight(IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Encodes `registry` in the text format.
pub fn encode(registry: &Registry) -> String {
    let mut buf = Vec::new();
    // Encoding into a Vec fails only for metric families that cannot be
    // written (none are ever registered here); an empty answer is the
    // fallback.
    if TextEncoder::new().encode(&registry.gather(), &mut buf).is_err() {
        buf.clear();
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// Appends the executor's exposition `text` to `out` (the loader's own
/// exposition), keeping the result valid: families named `process_*` are
/// renamed `ongrid_executor_process_*` (both daemons have them), and any
/// other family whose name the loader already exposes is dropped, so the
/// executor can never shadow or duplicate a loader family.
pub fn merge_executor_text(out: &mut String, text: &str) {
    let own: HashSet<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|r| r.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    // The family of the last HELP/TYPE line, and whether it is kept.
    let mut current: Option<(String, bool)> = None;
    for line in text.lines() {
        let (prefix, rest) = if let Some(r) = line.strip_prefix("# HELP ") {
            ("# HELP ", r)
        } else if let Some(r) = line.strip_prefix("# TYPE ") {
            ("# TYPE ", r)
        } else if line.starts_with('#') || line.trim().is_empty() {
            continue;
        } else {
            ("", line)
        };
        let name_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let (name, tail) = rest.split_at(name_len);
        if name.is_empty() {
            continue;
        }
        let name = if name.starts_with("process_") {
            format!("ongrid_executor_{name}")
        } else {
            name.to_owned()
        };
        let keep = if !prefix.is_empty() {
            let keep = !own.contains(&name);
            current = Some((name.clone(), keep));
            keep
        } else {
            match &current {
                Some((family, keep)) if name.starts_with(family.as_str()) => *keep,
                _ => !own.contains(family_of(&name)),
            }
        };
        if keep {
            out.push_str(prefix);
            out.push_str(&name);
            out.push_str(tail);
            out.push('\n');
        }
    }
}

/// The family a sample name belongs to (histogram and summary suffixes
/// stripped).
fn family_of(sample: &str) -> &str {
    ["_bucket", "_sum", "_count"].iter().find_map(|s| sample.strip_suffix(s)).unwrap_or(sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_build_info_are_exposed() {
        let r = Registry::new();
        let m = Metrics::new(&r).unwrap();
        m.executions_total.with_label_values(&["disk", "ok"]).inc();
        m.run_duration_seconds.with_label_values(&["disk"]).observe(0.2);
        let text = encode(&r);
        assert!(
            text.contains("ongrid_executions_total{outcome=\"ok\",skill=\"disk\"} 1"),
            "{text}"
        );
        assert!(text.contains("ongrid_build_info{version=\""), "{text}");
        assert!(text.contains("ongrid_run_duration_seconds_bucket{skill=\"disk\",le=\"60\"} 1"));
        assert!(Metrics::new(&r).is_err(), "registering twice must fail, not duplicate");
    }

    #[test]
    fn in_flight_guard_decrements_on_drop() {
        let m = Metrics::new(&Registry::new()).unwrap();
        let a = m.run_in_flight();
        let b = m.run_in_flight();
        assert_eq!(m.runs_in_flight.get(), 2);
        drop(a);
        drop(b);
        assert_eq!(m.runs_in_flight.get(), 0);
        let c = m.answer_unsent();
        assert_eq!((m.answers_unsent.get(), m.runs_in_flight.get()), (1, 0));
        drop(c);
        assert_eq!(m.answers_unsent.get(), 0);
    }

    #[test]
    fn executor_text_is_renamed_and_filtered() {
        let own = "# HELP ongrid_executions_total x\n# TYPE ongrid_executions_total counter\n\
                   ongrid_executions_total 1\n# TYPE ongrid_run_duration_seconds histogram\n\
                   ongrid_run_duration_seconds_count 0\n";
        let text = "# HELP process_open_fds Open fds.\n# TYPE process_open_fds gauge\n\
                    process_open_fds 7\n# HELP ongrid_executor_runs_total Runs.\n\
                    # TYPE ongrid_executor_runs_total counter\n\
                    ongrid_executor_runs_total{outcome=\"ok\"} 3\n\
                    # TYPE ongrid_executions_total counter\nongrid_executions_total 9\n\
                    # TYPE ongrid_sandbox_setup_seconds histogram\n\
                    ongrid_sandbox_setup_seconds_sum 0.5\n\
                    ongrid_run_duration_seconds_sum 3\n\
                    # a comment\n\n{nonsense\n";
        let mut out = own.to_owned();
        merge_executor_text(&mut out, text);
        assert_eq!(
            out.strip_prefix(own).unwrap(),
            "# HELP ongrid_executor_process_open_fds Open fds.\n\
             # TYPE ongrid_executor_process_open_fds gauge\n\
             ongrid_executor_process_open_fds 7\n\
             # HELP ongrid_executor_runs_total Runs.\n\
             # TYPE ongrid_executor_runs_total counter\n\
             ongrid_executor_runs_total{outcome=\"ok\"} 3\n\
             # TYPE ongrid_sandbox_setup_seconds histogram\n\
             ongrid_sandbox_setup_seconds_sum 0.5\n"
        );
    }
}
