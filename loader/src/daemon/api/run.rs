//! A run forwarded to the executor ([`Run`]), read event by event up to
//! its report, whole or as an NDJSON stream, and the 503s of an executor
//! that did not run it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use plumbing::errors::chain;
use policy::{Outcome, RunReport};
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;

use super::allowed::Allowed;
use super::error::ApiError;
use crate::daemon::app::App;
use crate::daemon::audit::{Finish, EXECUTOR_UNAVAILABLE};
use crate::daemon::executor_client::{ExecutorError, RunConnection, RunEvent, REPORT_SLACK};
use crate::daemon::metrics::InFlight;
use crate::daemon::registry::Skill;

/// A run forwarded to the executor. Holding it holds the run slot, the
/// in-flight count, the executor connection and the audit row; dropping
/// it releases all of them, cancels the run if it has not finished,
/// completes the row as `cancelled` and counts it so ([`Allowed`]).
pub(super) struct Run {
    pub(super) app: Arc<App>,
    pub(super) skill: Arc<Skill>,
    pub(super) conn: RunConnection,
    /// When to give up on the executor: the skill's timeout plus
    /// [`REPORT_SLACK`](crate::daemon::executor_client::REPORT_SLACK) after the run started, or skilld's queue timeout
    /// after the executor said the run waits for a slot.
    pub(super) deadline: tokio::time::Instant,
    /// The skill's timeout.
    pub(super) timeout: Duration,
    /// How long a run may wait in the executor's queue.
    pub(super) queue_timeout: Duration,
    /// The executor said the run waits for a slot, and not yet that it
    /// started.
    pub(super) queued: bool,
    pub(super) started: Instant,
    /// The request and its audit row, until its outcome.
    pub(super) allowed: Allowed,
    /// The run slot: held until the answer is handed over (`answer`).
    pub(super) slot: Option<OwnedSemaphorePermit>,
    /// Counts the run in `ongrid_runs_in_flight` until its report.
    pub(super) in_flight: Option<InFlight>,
    /// Counts a streamed answer in `ongrid_answers_unsent` from its report
    /// line until the stream lets go of the run.
    pub(super) unsent: Option<InFlight>,
}

impl Run {
    /// The next stderr line or the report. The skill's timeout counts from
    /// the run's start: a run the executor queues (all its run slots busy)
    /// may wait up to skilld's queue timeout for one, then is answered
    /// `busy` (closing the connection cancels it in the queue).
    pub(super) async fn next(&mut self) -> Result<RunEvent, ExecutorError> {
        loop {
            let event = match tokio::time::timeout_at(self.deadline, self.conn.next()).await {
                Ok(r) => r?,
                Err(_) if self.queued => {
                    return Err(ExecutorError::Busy(format!(
                        "its run slots stayed full for {} s",
                        self.queue_timeout.as_secs()
                    )));
                }
                Err(_) => {
                    return Err(ExecutorError::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no report from the executor past the skill's timeout",
                    )));
                }
            };
            let now = tokio::time::Instant::now();
            match event {
                RunEvent::Queued => {
                    self.queued = true;
                    self.deadline = now + self.queue_timeout;
                }
                RunEvent::Started => {
                    self.queued = false;
                    self.deadline = now + self.timeout + REPORT_SLACK;
                }
                other => return Ok(other),
            }
        }
    }

    /// The executor failed: completes the row, returns the 503.
    pub(super) async fn fail(&mut self, name: &str, e: ExecutorError) -> ApiError {
        executor_error(name, e, &mut self.allowed).await
    }

    /// Counts and logs the report, and completes the audit row (committed
    /// before the caller answers).
    ///
    /// # Errors
    ///
    /// 500 `audit_incomplete` when the rows could not be committed and
    /// `audit_required`: the report is not sent without its audit trail.
    pub(super) async fn finish(&mut self, report: &RunReport) -> Result<(), ApiError> {
        let name = self.skill.name();
        let elapsed = self.started.elapsed();
        let m = self.app.metrics();
        m.run_duration_seconds.with_label_values(&[name]).observe(elapsed.as_secs_f64());
        tracing::info!(
            skill = name,
            outcome = %report.outcome,
            exit_code = report.exit_code,
            signal = report.signal,
            duration_ms = report.duration_ms,
            "run finished"
        );
        let network = report.sandbox.as_ref().map(|s| &s.network);
        let finished = self.allowed.finish(Finish {
            outcome: report.outcome.as_str().to_owned(),
            error: report.error.clone(),
            exit_code: report.exit_code,
            result: report.result.clone(),
            duration_ms: Some(report.duration_ms),
            network_denied: network.filter(|n| n.enabled).map(|n| n.denied_total),
        });
        // A call to an MCP server's tool says the generation of its tool
        // list: the registry follows when it moved.
        if let Some(generation) = self.conn.tools_generation() {
            self.app.tools_generation_seen(self.skill.registered().manifest_path(), generation);
        }
        if let Err(e) = finished.await {
            if self.app.audit().required() {
                tracing::error!(skill = name, error = %e, "run report withheld: no audit trail");
                return Err(ApiError::AuditIncomplete {
                    outcome: report.outcome.to_string(),
                    cause: e.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// The NDJSON body: `{"event":"stderr","line":...}` lines, then
/// `{"event":"report","report":{...}}`; an executor failure mid-run ends
/// the stream with `{"event":"error","error":{"code","message"}}`.
pub(super) fn ndjson(
    run: Run,
    first: RunEvent,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
    futures_util::stream::unfold((run, Some(first), false), |(mut run, pending, done)| async move {
        if done {
            return None;
        }
        let event = match pending {
            Some(e) => Ok(e),
            None => run.next().await,
        };
        let (mut line, done) = match event {
            Ok(RunEvent::Stderr(line)) => {
                (json!({"event": "stderr", "line": line}).to_string(), false)
            }
            // `Run::next` keeps these to itself.
            Ok(RunEvent::Queued | RunEvent::Started) => {
                return Some((Ok(Bytes::new()), (run, None, false)));
            }
            Ok(RunEvent::Report(reported)) => match run.finish(&reported.report).await {
                // The executor's text of the report, so its `result` goes
                // out as the skill printed it.
                Ok(()) => {
                    run.in_flight = None;
                    run.unsent = Some(run.app.metrics().answer_unsent());
                    (format!(r#"{{"event":"report","report":{}}}"#, reported.json.get()), true)
                }
                Err(e) => (json!({"event": "error", "error": e.body()["error"]}).to_string(), true),
            },
            Err(e) => {
                tracing::warn!(skill = run.skill.name(), error = %chain(&e), "run stream ended");
                let code =
                    if matches!(e, ExecutorError::Busy(_)) { "busy" } else { EXECUTOR_UNAVAILABLE };
                let message = chain(&e);
                let _ = run.allowed.finish(not_run(code, &message)).await;
                let event = json!({"event": "error", "error": {"code": code, "message": message}});
                (event.to_string(), true)
            }
        };
        line.push('\n');
        Some((Ok(Bytes::from(line)), (run, None, done)))
    })
}

/// The row of a run that did not start.
pub(super) fn not_run(outcome: &str, why: &str) -> Finish {
    Finish { outcome: outcome.to_owned(), error: Some(why.to_owned()), ..Finish::default() }
}

pub(super) fn busy(skill: &str, why: &str) -> ApiError {
    ApiError::Busy(Box::new(RunReport::not_run(skill, Outcome::Busy, why)))
}

/// The executor did not run the skill: completes the row, returns the 503.
pub(super) async fn executor_error(
    skill: &str,
    e: ExecutorError,
    allowed: &mut Allowed,
) -> ApiError {
    tracing::warn!(skill, error = %chain(&e), "executor did not run the skill");
    let (e, outcome) = match e {
        ExecutorError::Busy(why) => {
            (busy(skill, &format!("executor busy: {why}")), Outcome::Busy.as_str())
        }
        other => (ApiError::ExecutorUnavailable(chain(&other)), EXECUTOR_UNAVAILABLE),
    };
    let _ = allowed.finish(not_run(outcome, &e.to_string())).await;
    e
}
