//! `POST /v1/skills/{name}/execute`: check, authorise, queue, forward to
//! the executor, answer with the run report (or stream it as NDJSON).
//!
//! A skill the caller may not see (`GET /v1/skills` hides it:
//! [`super::skills::visible`]) is a 404 as if it did not exist, whatever
//! is wrong with the request; when the request itself is well formed, the
//! denial is decided, counted and audited with its real reason (e.g.
//! `class_not_permitted`) all the same. For a skill the caller sees:
//!
//! Order of checks: unknown skill (404), a body's `Content-Encoding` other
//! than `identity` (415), body size and time (413, 408), JSON
//! shape (400 `bad_request`), args against the schema (400 `invalid_args`),
//! permission (403 `denied` with a `reason`, [`crate::daemon::authz`]), the audit
//! row of the decision (503 `audit_unavailable` when it cannot be written
//! and `audit_required`), a run slot (503 `busy`), the executor (503).
//! Nothing runs before all of them pass. When a run slot is free at once,
//! the request goes to the executor *held* while the decision's row is
//! written ([`crate::daemon::executor_client::HeldRun`]): the executor checks and
//! prepares the run, and spawns it only on the `start` sent once the row
//! is in; a request refused by then closes the connection, which cancels
//! it unstarted. Otherwise the connection is only opened meanwhile and
//! nothing is sent on it before the row is in and a slot is taken. Any
//! run the executor finishes, ok or failed, is a 200 with its report.
//!
//! Audit ([`crate::daemon::audit`]): an `invalid_args` or `denied` answer has its
//! row (`reject`/`deny`) committed before it is sent, and so has a body
//! refused before that (`reject` with the 400's, 408's, 413's or 415's
//! code as its reason, outcome `rejected`); an allowed run's row
//! is written before the run starts and completed (outcome, result, exit
//! code, duration); the commit covering both comes before the report is
//! sent, in both modes.
//!
//! The executor connection belongs to the request: if the client goes
//! away, hyper drops the handler future (or the stream body), the
//! connection closes, and the executor kills the run.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use policy::wire::ExecuteParams;
use policy::{Args, DenyReason, Outcome, RunReport};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;

use super::accept::wants_ndjson;
pub use super::accept::NDJSON;
use super::allowed::Allowed;
use super::answer::{self, Answer};
use super::error::ApiError;
use super::skills::visible;
use crate::daemon::app::{App, Limits};
use crate::daemon::audit::{AuditError, Finish, Record, RunRow, EXECUTOR_UNAVAILABLE};
use crate::daemon::authz::{Denied, RunRequest};
use crate::daemon::connection::Caller;
use crate::daemon::executor_client::{
    ExecutorError, HeldRun, Opened, RunConnection, RunEvent, REPORT_SLACK,
};
use crate::daemon::metrics::InFlight;
use crate::daemon::registry::Skill;

/// The `ongrid_executions_total` outcome of an allowed run refused because
/// its decision's row could not be written (`audit_required`): no audit
/// row holds it, so it is not one of [`crate::daemon::audit::OUTCOMES`].
const AUDIT_UNAVAILABLE: &str = "audit_unavailable";

/// Longest `session_id` accepted.
const MAX_SESSION_ID: usize = 256;

/// The request body. An empty body means `{}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    /// The args object (default `{}`), kept as sent: the skill reads this
    /// text, the schema and the audit its parsed copy.
    #[serde(default)]
    pub args: Args,
    /// The caller's session, for logs and audit.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Confirmation for `mutating` skills (permission modes, issue 5).
    #[serde(default)]
    pub confirm: bool,
    /// Signed approvals for `dangerous` skills (issue 5).
    #[serde(default)]
    pub approvals: Vec<Value>,
}

/// The handler.
pub async fn execute(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Path(name) = name.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let skill = app
        .registry()
        .current()
        .get(&name)
        .cloned()
        .ok_or_else(|| ApiError::no_such_skill(&name))?;
    // From here the request may become a run of this skill, whatever a
    // reload does to it meanwhile: the drain on SIGTERM waits for its
    // timeout (an upper bound; a request refused later changes nothing).
    app.allowing_run(skill.registered().manifest().timeout());
    let who = app.authz().identify(&caller);
    let manifest = skill.registered().manifest();
    let base = |req: Option<&ExecuteRequest>| Record {
        session_id: req.and_then(|r| r.session_id.clone()),
        skill: skill.name().to_owned(),
        class: manifest.class().as_str().to_owned(),
        caller_uid: who.uid,
        caller_pid: who.pid,
        role: who.role.clone(),
        mode: who.mode.as_str().to_owned(),
        args: req.map(|r| r.args.raw_json().clone()),
        ..Record::default()
    };
    // A skill this caller may not see is answered as one that does not
    // exist (`show`, `list`), at once, as an unknown name is: its body is
    // not read (that took as long as the client took to send it) nor its
    // args checked against a schema the caller may not see. The class
    // refusal is audited, without args. (`Authz::decide` allows no
    // request for a skill `may_list` hides, whatever it holds.)
    if !visible(app.authz(), &who, &skill) {
        let args = Args::empty();
        let run = RunRequest {
            skill: skill.name(),
            class: manifest.class(),
            args: &args,
            session_id: None,
            confirm: false,
            approvals: &[],
        };
        if let Err(denied) = app.authz().decide(&who, &run, unix_now()) {
            let _ = deny(&app, base(None), denied).await;
        }
        return Err(ApiError::no_such_skill(&name));
    }
    let count = |outcome: Outcome| {
        app.metrics().executions_total.with_label_values(&[skill.name(), outcome.as_str()]).inc();
    };
    // A body that cannot be read or is no request (415, 413, 408, 400
    // `bad_request`) is refused before any decision, but it was a request
    // to run this skill: its row (`reject`, reason = the error's code,
    // outcome `rejected`, no args) is written as an `invalid_args` one is.
    let req = match read_body(body, &headers, app.limits()).await.and_then(|b| parse_request(&b)) {
        Ok(req) => req,
        Err(e) => {
            // Not an execution (`ongrid_executions_total`): no args were read.
            tracing::info!(skill = skill.name(), code = e.code(), "execute request refused");
            record_refusal(&app, base(None), "reject", e.code(), Outcome::Rejected, &e).await;
            return Err(e);
        }
    };
    // Args may hold what a caller would not want logged: their size only.
    tracing::debug!(skill = skill.name(), args_bytes = req.args.raw().len(), "execute request");

    let base = base(Some(&req));
    let run = RunRequest {
        skill: skill.name(),
        class: manifest.class(),
        args: &req.args,
        session_id: req.session_id.as_deref(),
        confirm: req.confirm,
        approvals: &req.approvals,
    };
    if let Err(violations) = skill.check_args(req.args.value()) {
        count(Outcome::InvalidArgs);
        tracing::info!(skill = skill.name(), violations = violations.len(), "args rejected");
        let e = ApiError::InvalidArgs { skill: name, violations };
        record_refusal(&app, base, "reject", "invalid_args", Outcome::InvalidArgs, &e).await;
        return Err(e);
    }
    let grant = match app.authz().decide(&who, &run, unix_now()) {
        Ok(g) => g,
        Err(denied) => return Err(deny(&app, base, denied).await),
    };
    app.metrics().authz_decisions_total.with_label_values(&["allow", grant.reason]).inc();
    // From here a request dropped unfinished counts as `cancelled`.
    let mut allowed = Allowed::new(&app, skill.name());
    let record = Record {
        decision: "allow",
        reason: grant.reason.to_owned(),
        approvers: grant.approvals.iter().map(|v| v.key_id.clone()).collect(),
        approvals_used: grant.approvals.iter().map(|v| (v.replay_key(), v.expires_at)).collect(),
        ..base.clone()
    };
    // The executor's request. Its manifest path must be UTF-8 (the wire is
    // JSON): the scan registers no skill whose path is not
    // (`crate::scan::build`), so the refusal after the decision's row below is
    // only a guard.
    let mut params = skill.registered().manifest_path().to_str().map(|m| ExecuteParams {
        manifest: m.to_owned(),
        args: req.args.into_raw(),
        session_id: req.session_id,
        class: Some(manifest.class()),
        tool: skill.registered().tool().map(str::to_owned),
        hold: false,
    });
    // The decision is written before anything runs; its commit is the one
    // the completion waits for (`Audit::record_before_run`). Meanwhile,
    // with a run slot free at once, the executor already gets the request
    // held: it checks and prepares the run but spawns nothing before the
    // `start` sent once the row is in (a refused request closes the
    // connection, which cancels it). Without a free slot the connection is
    // only opened meanwhile, and nothing is sent before a slot is taken.
    let fast = match Arc::clone(app.run_slots()).try_acquire_owned() {
        Ok(permit) => params.take().map(|p| (permit, p)),
        Err(_) => None,
    };
    // The executor's side is polled first: the row is often written in
    // place, synchronously (`Audit`'s writer), and the held request should
    // be on its way before that. The row's id goes into its `RunRow` as it
    // arrives, inside the join: a client gone while the other side is
    // still pending drops the guard, which completes the row `cancelled`.
    let audit = app.audit();
    let decided = async {
        let id = audit.record_before_run(record).await?;
        Ok::<_, AuditError>(RunRow::new(audit.clone(), Some(id)))
    };
    let (decided, pre) = match fast {
        Some((permit, p)) => {
            let (held, row) = tokio::join!(biased; app.executor().execute_held(p), decided);
            (row, Pre::Held(permit, held))
        }
        None => {
            let (opened, row) = tokio::join!(biased; app.executor().open(), decided);
            (row, Pre::Opened(opened))
        }
    };
    match decided {
        Ok(row) => {
            grant.keep();
            allowed.decided(row);
        }
        Err(AuditError::Replayed(key_id)) => {
            drop(grant);
            allowed.settle();
            let denied = Denied {
                uid: who.uid,
                mode: who.mode,
                skill: skill.name().to_owned(),
                reason: DenyReason::ApprovalReplayed,
                message: format!(
                    "the approval of key {key_id} was already used; approvals count once"
                ),
            };
            return Err(deny(&app, base, denied).await);
        }
        Err(e) if app.audit().required() => {
            drop(grant);
            allowed.settle();
            app.metrics()
                .executions_total
                .with_label_values(&[skill.name(), AUDIT_UNAVAILABLE])
                .inc();
            tracing::error!(skill = skill.name(), error = %e, "run refused: no audit trail");
            return Err(ApiError::AuditUnavailable(e.to_string()));
        }
        Err(e) => {
            grant.keep();
            tracing::warn!(
                skill = skill.name(),
                error = %e,
                "running unaudited (audit_required = false)"
            );
            allowed.decided(RunRow::new(audit.clone(), None));
        }
    }
    tracing::info!(
        skill = skill.name(),
        uid = who.uid,
        role = %who.role,
        mode = %who.mode,
        reason = run_reason(allowed.row_id()),
        "run allowed"
    );

    let deadline = |started: Instant| {
        tokio::time::Instant::from_std(started) + manifest.timeout() + REPORT_SLACK
    };
    let (permit, started, conn) = match pre {
        Pre::Held(permit, held) => {
            app.metrics().run_queue_wait_seconds.observe(0.0);
            let started = Instant::now();
            let conn = match held {
                Ok(held) => Ok(held.start().await),
                Err(e) => Err(e),
            };
            (permit, started, conn)
        }
        Pre::Opened(opened) => {
            let queued = Instant::now();
            let mut opened = Some(opened);
            let slot = match Arc::clone(app.run_slots()).try_acquire_owned() {
                Ok(permit) => Ok(Ok(permit)),
                Err(_) => {
                    // Queued: the connection opened ahead is not kept idle
                    // (the executor closes idle connections), a fresh one
                    // follows.
                    opened = None;
                    tokio::time::timeout(
                        app.limits().queue_timeout,
                        Arc::clone(app.run_slots()).acquire_owned(),
                    )
                    .await
                }
            };
            app.metrics().run_queue_wait_seconds.observe(queued.elapsed().as_secs_f64());
            let Ok(Ok(permit)) = slot else {
                let why = "no run slot free in time";
                let _ = allowed.finish(not_run(Outcome::Busy.as_str(), why)).await;
                return Err(busy(skill.name(), why));
            };
            let Some(params) = params else {
                let why = "the manifest path is not UTF-8; the executor wire needs UTF-8";
                let _ = allowed.finish(not_run("rejected", why)).await;
                return Err(ApiError::Internal(why.into()));
            };
            let started = Instant::now();
            let conn = match opened {
                Some(Ok(opened)) => app.executor().execute_on(Some(opened), &params).await,
                Some(Err(e)) => Err(e),
                None => app.executor().execute(&params).await,
            };
            (permit, started, conn)
        }
    };
    let in_flight = app.metrics().run_in_flight();
    let deadline = deadline(started);
    let conn = match conn {
        Ok(c) => c,
        Err(e) => return Err(executor_error(&name, e, &mut allowed).await),
    };
    allowed.handed_over(started);
    let timeout = manifest.timeout();
    let mut run = Run {
        app: Arc::clone(&app),
        skill,
        conn,
        deadline,
        timeout,
        queue_timeout: app.limits().queue_timeout,
        queued: false,
        started,
        allowed,
        slot: Some(permit),
        in_flight: Some(in_flight),
        unsent: None,
    };
    // Wait for the first event before choosing the status, so that a busy
    // or failing executor is a 503 in both modes.
    let first = match run.next().await {
        Ok(ev) => ev,
        Err(e) => return Err(run.fail(&name, e).await),
    };

    if wants_ndjson(&headers) {
        // The report line in slices: the stream lets go of the run, and so
        // of its slot, once the last one is taken (`answer`).
        let lines = ndjson(run, first).flat_map(|line| {
            futures_util::stream::iter(
                answer::slices(line.unwrap_or_else(|e| match e {})).map(Ok::<_, Infallible>),
            )
        });
        let mut response = Body::from_stream(lines).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
        return Ok(response);
    }
    let mut event = first;
    loop {
        if let RunEvent::Report(reported) = event {
            run.finish(&reported.report).await?;
            // The executor's encoding of the report, as it sent it, holding
            // the run's slot until it is handed over (`answer`).
            let json = reported.json.get().to_owned();
            let held = (run.slot.take(), app.metrics().answer_unsent());
            return Ok(json_response(Body::new(Answer::new(json.into(), held))));
        }
        event = match run.next().await {
            Ok(ev) => ev,
            Err(e) => return Err(run.fail(&name, e).await),
        };
    }
}

/// What was sent to the executor while the decision's row was written.
enum Pre {
    /// A run slot was free: the request went out held.
    Held(OwnedSemaphorePermit, Result<HeldRun, ExecutorError>),
    /// No slot (or no request to send): only a connection was opened.
    Opened(Result<Opened, ExecutorError>),
}

fn run_reason(row: Option<i64>) -> &'static str {
    if row.is_some() {
        "audited"
    } else {
        "unaudited"
    }
}

fn unix_now() -> u64 {
    u64::try_from(crate::daemon::audit::now_ms() / 1000).unwrap_or(0)
}

fn not_run(outcome: &str, why: &str) -> Finish {
    Finish { outcome: outcome.to_owned(), error: Some(why.to_owned()), ..Finish::default() }
}

/// Counts, logs and records a denial; returns the 403.
async fn deny(app: &App, base: Record, denied: Denied) -> ApiError {
    let reason = denied.reason.as_str();
    app.metrics().authz_decisions_total.with_label_values(&["deny", reason]).inc();
    app.metrics()
        .executions_total
        .with_label_values(&[&base.skill, Outcome::Denied.as_str()])
        .inc();
    tracing::info!(
        skill = %base.skill,
        uid = denied.uid,
        role = %base.role,
        mode = %denied.mode,
        reason,
        "run denied"
    );
    let e = ApiError::Denied { reason, message: denied.to_string() };
    record_refusal(app, base, "deny", reason, Outcome::Denied, &e).await;
    e
}

/// Writes the row of a refused request. The refusal stands either way; a
/// failed write is logged and counted by the audit thread.
async fn record_refusal(
    app: &App,
    base: Record,
    decision: &'static str,
    reason: &str,
    outcome: Outcome,
    e: &ApiError,
) {
    let record = Record {
        decision,
        reason: reason.to_owned(),
        outcome: Some(outcome.as_str().to_owned()),
        error: Some(e.to_string()),
        ..base
    };
    let _ = app.audit().record(record).await;
}

/// A run forwarded to the executor. Holding it holds the run slot, the
/// in-flight count, the executor connection and the audit row; dropping
/// it releases all of them, cancels the run if it has not finished,
/// completes the row as `cancelled` and counts it so ([`Allowed`]).
struct Run {
    app: Arc<App>,
    skill: Arc<Skill>,
    conn: RunConnection,
    /// When to give up on the executor: the skill's timeout plus
    /// [`REPORT_SLACK`](crate::daemon::executor_client::REPORT_SLACK) after the run started, or skilld's queue timeout
    /// after the executor said the run waits for a slot.
    deadline: tokio::time::Instant,
    /// The skill's timeout.
    timeout: Duration,
    /// How long a run may wait in the executor's queue.
    queue_timeout: Duration,
    /// The executor said the run waits for a slot, and not yet that it
    /// started.
    queued: bool,
    started: Instant,
    /// The request and its audit row, until its outcome.
    allowed: Allowed,
    /// The run slot: held until the answer is handed over (`answer`).
    slot: Option<OwnedSemaphorePermit>,
    /// Counts the run in `ongrid_runs_in_flight` until its report.
    in_flight: Option<InFlight>,
    /// Counts a streamed answer in `ongrid_answers_unsent` from its report
    /// line until the stream lets go of the run.
    unsent: Option<InFlight>,
}

impl Run {
    /// The next stderr line or the report. The skill's timeout counts from
    /// the run's start: a run the executor queues (all its run slots busy)
    /// may wait up to skilld's queue timeout for one, then is answered
    /// `busy` (closing the connection cancels it in the queue).
    async fn next(&mut self) -> Result<RunEvent, ExecutorError> {
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
    async fn fail(&mut self, name: &str, e: ExecutorError) -> ApiError {
        executor_error(name, e, &mut self.allowed).await
    }

    /// Counts and logs the report, and completes the audit row (committed
    /// before the caller answers).
    ///
    /// # Errors
    ///
    /// 503 `audit_unavailable` when the rows could not be committed and
    /// `audit_required`: the report is not sent without its audit trail.
    async fn finish(&mut self, report: &RunReport) -> Result<(), ApiError> {
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
        let finished = self.allowed.finish(Finish {
            outcome: report.outcome.as_str().to_owned(),
            error: report.error.clone(),
            exit_code: report.exit_code,
            result: report.result.clone(),
            duration_ms: Some(report.duration_ms),
        });
        if let Err(e) = finished.await {
            if self.app.audit().required() {
                tracing::error!(skill = name, error = %e, "run report withheld: no audit trail");
                return Err(ApiError::AuditUnavailable(format!(
                    "the run ended ({}) but its audit rows could not be committed: {e}",
                    report.outcome
                )));
            }
        }
        Ok(())
    }
}

/// The NDJSON body: `{"event":"stderr","line":...}` lines, then
/// `{"event":"report","report":{...}}`; an executor failure mid-run ends
/// the stream with `{"event":"error","error":{"code","message"}}`.
fn ndjson(
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

/// A 200 whose body is `json`, a JSON document.
fn json_response(json: Body) -> Response {
    let mut response = Response::new(json);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Refuses a body with a `Content-Encoding` other than `identity` (a
/// gzipped body would be read as its compressed bytes). The field is a
/// comma-separated list of codings, compared case-insensitively; an empty
/// body may carry any.
fn check_encoding(body: &Body, headers: &HeaderMap) -> Result<(), ApiError> {
    if hyper::body::Body::is_end_stream(body) {
        return Ok(());
    }
    let codings = headers.get_all(header::CONTENT_ENCODING).iter().flat_map(|v| {
        // Not text: certainly not `identity`.
        v.to_str().map_or_else(|_| vec!["?"], |t| t.split(',').map(str::trim).collect())
    });
    for coding in codings {
        if !coding.is_empty() && !coding.eq_ignore_ascii_case("identity") {
            return Err(ApiError::UnsupportedEncoding(coding.chars().take(32).collect()));
        }
    }
    Ok(())
}

async fn read_body(body: Body, headers: &HeaderMap, limits: &Limits) -> Result<Bytes, ApiError> {
    check_encoding(&body, headers)?;
    let max = limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(ApiError::TooLarge(max));
    }
    let collect = http_body_util::Limited::new(body, max).collect();
    match tokio::time::timeout(limits.body_timeout, collect).await {
        Err(_) => Err(ApiError::RequestTimeout),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::TooLarge(max))
        }
        Ok(Err(e)) => Err(ApiError::BadRequest(format!("cannot read the request body: {e}"))),
    }
}

fn parse_request(bytes: &[u8]) -> Result<ExecuteRequest, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(ExecuteRequest::default());
    }
    // An object (serde would also read a struct from an array), parsed
    // once, straight into the request.
    if !bytes.trim_ascii_start().starts_with(b"{") {
        let why = match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
            Ok(_) => "request body must be a JSON object".to_owned(),
            Err(e) => format!("request body: {e}"),
        };
        return Err(ApiError::BadRequest(why));
    }
    let req: ExecuteRequest = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("request body: {e}")))?;
    if req.session_id.as_ref().is_some_and(|s| s.len() > MAX_SESSION_ID) {
        return Err(ApiError::BadRequest(format!("session_id longer than {MAX_SESSION_ID} bytes")));
    }
    Ok(req)
}

fn busy(skill: &str, why: &str) -> ApiError {
    ApiError::Busy(Box::new(RunReport::not_run(skill, Outcome::Busy, why)))
}

/// The executor did not run the skill: completes the row, returns the 503.
async fn executor_error(skill: &str, e: ExecutorError, allowed: &mut Allowed) -> ApiError {
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

/// The error and its causes, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_identity_bodies_are_read() {
        let with = |codings: &[&'static str]| {
            let mut h = HeaderMap::new();
            for c in codings {
                h.append(header::CONTENT_ENCODING, HeaderValue::from_static(c));
            }
            h
        };
        for ok in [&[][..], &["identity"], &["Identity, identity"], &["identity", " "]] {
            assert!(check_encoding(&Body::from("{}"), &with(ok)).is_ok(), "{ok:?}");
        }
        for bad in [&["gzip"][..], &["identity, gzip"], &["identity", "br"], &["x-gzip"]] {
            let e = check_encoding(&Body::from("{}"), &with(bad)).unwrap_err();
            assert_eq!((e.status().as_u16(), e.code()), (415, "unsupported_encoding"), "{bad:?}");
        }
        let e = check_encoding(&Body::from("{}"), &with(&["identity, GZIP"])).unwrap_err();
        assert!(e.to_string().starts_with("Content-Encoding \"GZIP\" is not supported"), "{e}");
        // No body: nothing to decode.
        assert!(check_encoding(&Body::empty(), &with(&["gzip"])).is_ok());
        let r = e.into_response();
        assert_eq!(r.headers()[header::ACCEPT_ENCODING], "identity");
    }

    #[test]
    fn request_bodies() {
        assert_eq!(parse_request(b"").unwrap().args.raw(), "{}");
        assert_eq!(parse_request(b" \n").unwrap().args.raw(), "{}");
        assert_eq!(parse_request(b"{}").unwrap().args.raw(), "{}");
        let r =
            parse_request(br#"{"args":{"a":1},"session_id":"s","confirm":true,"approvals":[{}]}"#)
                .unwrap();
        assert_eq!(r.args.value(), &json!({"a": 1}));
        assert!(r.confirm);
        for bad in [
            &b"{"[..],
            b"[]",
            b"\xff",
            br#"{"args":[]}"#,
            br#"{"args":"x"}"#,
            br#"{"args":{},"confirm":"yes"}"#,
            br#"{"args":{},"uid":0}"#,
            br#"{"args":{}} trailing"#,
            br#"[{}]"#,
            br#"{"args":{},"args":{}}"#,
            br#"{"args":{"a":1,"a":2}}"#,
            br#"{"args":{"a":{"b":1,"b":1}}}"#,
        ] {
            let Err(e) = parse_request(bad) else { panic!("{:?}", String::from_utf8_lossy(bad)) };
            assert_eq!(e.code(), "bad_request", "{:?}", String::from_utf8_lossy(bad));
        }
        let e = parse_request(br#"{"args":{"p":"/ok","p":"/etc"}}"#).unwrap_err();
        assert!(e.to_string().contains(r#"key "p" twice"#), "{e}");
        // The skill gets the text as sent: key order, number spelling.
        let r =
            parse_request(br#"{"args":{"z":1.50,"n":123456789012345678901234567890}}"#).unwrap();
        assert_eq!(r.args.raw(), r#"{"z":1.50,"n":123456789012345678901234567890}"#);
        let long = format!(r#"{{"session_id":"{}"}}"#, "x".repeat(MAX_SESSION_ID + 1));
        assert!(parse_request(long.as_bytes()).is_err());
    }
}
