//! The run engine: one validated, sandboxed, supervised run per request,
//! ending in a [`RunReport`]. Used by `ongrid-executor run` and, next, by
//! the daemon.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use policy::limits::KILL_GRACE;
use policy::{LimitKind, Outcome, RunReport};

use crate::config::Config;
use crate::plan::Plan;
use crate::reaper::Reaper;
use crate::rundir::random_id;
use crate::spawn::{self, Host};
use crate::supervise::{self, Bounds, Stop, Supervised};
use crate::sys;

/// Longest excerpt of an invalid stdout quoted in the error.
const EXCERPT_BYTES: usize = 256;

/// One run request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRequest {
    /// The skill's `skill.json`.
    pub manifest_path: PathBuf,
    /// The args JSON, passed to stdin verbatim.
    pub args: Vec<u8>,
}

/// The engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// `PR_SET_CHILD_SUBREAPER` failed.
    #[error("cannot become the reaper of skill processes")]
    Subreaper(#[source] std::io::Error),
}

/// Runs skills under the configured sandbox.
///
/// The engine makes its process a child subreaper (orphans of skills are
/// reaped here). Runs spawn from the thread that polls [`Engine::run`]; the
/// child's parent-death signal is tied to that thread, so poll runs from
/// threads that live as long as the runs (a current-thread runtime, or the
/// worker threads of a multi-thread runtime, never `spawn_blocking`).
#[derive(Debug)]
pub struct Engine {
    config: Config,
    host: Host,
    reaper: &'static Reaper,
}

impl Engine {
    /// Builds an engine from a validated configuration, probing the host
    /// (Landlock ABI, cgroup hierarchies) once.
    ///
    /// # Errors
    ///
    /// [`EngineError`].
    pub fn new(config: Config) -> Result<Self, EngineError> {
        sys::process::set_child_subreaper().map_err(EngineError::Subreaper)?;
        Ok(Engine { config, host: Host::detect(), reaper: Reaper::global() })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Host facts found at start-up.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Runs one skill to its end. Each stderr line goes to `stderr_sink` as
    /// it arrives; `cancel` completing (client gone) kills the run's tree.
    /// Never fails: every problem is a report outcome.
    pub async fn run(
        &self,
        req: RunRequest,
        stderr_sink: &mut (dyn FnMut(&str) + Send),
        cancel: impl Future<Output = ()>,
    ) -> RunReport {
        let started = Instant::now();
        let mut report = self.run_inner(req, stderr_sink, cancel, started).await;
        report.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        report
    }

    async fn run_inner(
        &self,
        req: RunRequest,
        sink: &mut (dyn FnMut(&str) + Send),
        cancel: impl Future<Output = ()>,
        started: Instant,
    ) -> RunReport {
        let fallback_name = req
            .manifest_path
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Step 1: validate against our own configuration.
        let plan =
            match Plan::build(&self.config, &req.manifest_path, req.args, std::env::vars_os()) {
                Ok(plan) => plan,
                Err(e) => return RunReport::not_run(fallback_name, e.outcome(), e.to_string()),
            };
        let skill = plan.manifest.name().to_string();
        let run_id = match random_id() {
            Ok(id) => id,
            Err(e) => {
                return RunReport::not_run(skill, Outcome::SandboxFailed, format!("run id: {e}"))
            }
        };
        // Step 2: prepare everything in the parent.
        let mut prep = match spawn::prepare(&self.config, &self.host, &plan, &run_id) {
            Ok(p) => p,
            Err(e) => return RunReport::not_run(skill, e.outcome(), e.to_string()),
        };
        // Steps 3-5: spawn (the child applies the sandbox and execs).
        let child = match spawn::spawn(&prep, &plan.entry) {
            Ok(c) => c,
            Err(e) => {
                let mut r = RunReport::not_run(skill, e.outcome(), e.to_string());
                r.sandbox = Some(prep.report.clone());
                return r;
            }
        };
        let setup_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let limits = &plan.granted.limits;
        let bounds = Bounds {
            timeout: plan.manifest.timeout(),
            grace: KILL_GRACE,
            stdout_bytes: limits.stdout_bytes,
            stderr_bytes: limits.stderr_bytes,
            stderr_line_bytes: limits.stderr_line_bytes,
        };
        // Steps 6-7: supervise; kill the whole tree on any end.
        let sup = supervise::supervise(
            child,
            &plan.args,
            prep.cgroup.as_ref(),
            self.reaper,
            bounds,
            sink,
            cancel,
        )
        .await;
        let oom = match prep.cgroup.as_mut() {
            Some(cg) => {
                if !cg.wait_empty(Duration::from_secs(2)) {
                    cg.kill();
                    cg.wait_empty(Duration::from_secs(1));
                }
                let oom = cg.oom_killed();
                cg.remove();
                oom
            }
            None => false,
        };
        self.reaper.reap_orphans();
        prep.run_dir.remove();
        // Step 8: report.
        let cpu_limit_us = limits.cpu_seconds_for(bounds.timeout).saturating_mul(1_000_000);
        let mut report = classify(&skill, sup, oom, cpu_limit_us, bounds.stdout_bytes);
        report.setup_us = setup_us;
        report.sandbox = Some(prep.report.clone());
        report
    }
}

/// Turns what supervision saw into the report's outcome (step 8).
pub fn classify(
    skill: &str,
    sup: Supervised,
    oom: bool,
    cpu_limit_us: u64,
    stdout_cap: u64,
) -> RunReport {
    let Supervised { exit, stop, stdout, stderr, stderr_dropped } = sup;
    let mut r = RunReport::not_run(skill, Outcome::Ok, String::new());
    r.error = None;
    r.exit_code = exit.code;
    r.signal = exit.signal;
    r.stderr = stderr;
    r.stderr_truncated_bytes = stderr_dropped;
    let fail = |r: &mut RunReport, outcome, limit, error: String| {
        r.outcome = outcome;
        r.limit = limit;
        r.error = Some(error);
    };
    let cpu_hit = exit.signal == Some(libc::SIGXCPU)
        || (exit.signal == Some(libc::SIGKILL) && exit.cpu_us >= cpu_limit_us);
    match stop {
        Stop::OutputLimit => fail(
            &mut r,
            Outcome::OutputLimit,
            Some(LimitKind::Output),
            format!("stdout exceeded {stdout_cap} bytes; the run was killed"),
        ),
        Stop::WallTime => fail(
            &mut r,
            Outcome::Timeout,
            Some(LimitKind::WallTime),
            "wall-clock timeout; the run was terminated".into(),
        ),
        Stop::Cancelled => fail(
            &mut r,
            Outcome::Signaled,
            None,
            "cancelled by the caller; the run was killed".into(),
        ),
        Stop::None if cpu_hit => fail(
            &mut r,
            Outcome::Timeout,
            Some(LimitKind::CpuTime),
            format!("CPU time limit of {} s reached", cpu_limit_us / 1_000_000),
        ),
        Stop::None if oom && exit.code != Some(0) => {
            let outcome =
                if exit.signal.is_some() { Outcome::Signaled } else { Outcome::ExitNonzero };
            fail(
                &mut r,
                outcome,
                Some(LimitKind::Memory),
                "memory limit reached (OOM kill)".into(),
            );
        }
        Stop::None => match (exit.code, exit.signal) {
            (_, Some(sig)) => {
                let limit = (sig == libc::SIGXFSZ).then_some(LimitKind::FileSize);
                let name = nix::sys::signal::Signal::try_from(sig)
                    .map(|s| s.as_str().to_owned())
                    .unwrap_or_else(|_| sig.to_string());
                fail(&mut r, Outcome::Signaled, limit, format!("killed by signal {name}"));
            }
            (Some(0), None) => match serde_json::from_slice::<serde_json::Value>(&stdout) {
                Ok(v) => r.result = Some(v),
                Err(e) => {
                    let cut = stdout.len().min(EXCERPT_BYTES);
                    let excerpt =
                        String::from_utf8_lossy(stdout.get(..cut).unwrap_or_default()).into_owned();
                    let more = if stdout.len() > cut { "..." } else { "" };
                    fail(
                        &mut r,
                        Outcome::InvalidResult,
                        None,
                        format!(
                            "stdout is not one JSON value ({e}); {} bytes: {excerpt:?}{more}",
                            stdout.len()
                        ),
                    );
                }
            },
            (Some(code), None) => {
                fail(&mut r, Outcome::ExitNonzero, None, format!("exited with status {code}"))
            }
            (None, None) => fail(&mut r, Outcome::Signaled, None, "the process vanished".into()),
        },
    }
    r
}
