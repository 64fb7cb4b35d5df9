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
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use policy::wire::ExecuteParams;
use policy::{Args, DenyReason, Manifest, Outcome};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;

use super::accept::wants_ndjson;
pub use super::accept::NDJSON;
use super::allowed::Allowed;
use super::answer::{self, Answer};
use super::error::ApiError;
use super::run::{busy, executor_error, ndjson, not_run, Run};
use super::skills::visible;
use crate::daemon::app::{App, Limits};
use crate::daemon::audit::{AuditError, Record, RunRow};
use crate::daemon::authz::{Denied, Grant, Identity, RunRequest};
use crate::daemon::connection::Caller;
use crate::daemon::executor_client::{
    ExecutorError, HeldRun, Opened, RunConnection, RunEvent, REPORT_SLACK,
};
use crate::daemon::registry::Skill;

/// The `ongrid_executions_total` outcome of an allowed run refused because
/// its decision's row could not be written (`audit_required`): no audit
/// row holds it, so it is not one of [`crate::daemon::audit::OUTCOMES`].
const AUDIT_UNAVAILABLE: &str = "audit_unavailable";

/// Longest `session_id` accepted, in characters (as JSON Schema's
/// `maxLength` counts them, which the API's contract uses).
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
    /// Confirmation for `mutating` skills (their permission mode asks for it).
    #[serde(default)]
    pub confirm: bool,
    /// Signed approvals for `dangerous` skills (dual sign), each with
    /// unique keys as the args are.
    #[serde(default, deserialize_with = "policy::args::unique_values")]
    pub approvals: Vec<Value>,
}

/// The handler: the steps of [`Execution`], in order (decode, authorise,
/// audit, admit, forward, answer); a step that refuses the request
/// answers it with its error.
pub async fn execute(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Path(name) = name.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let x = Execution::find(app, &caller, name)?;
    let req = x.decode(&headers, body).await?;
    let (base, grant) = x.authorise(&req).await?;
    let decided = x.audit(base, grant, req).await?;
    let admitted = x.admit(decided).await?;
    let (run, first) = x.forward(admitted).await?;
    x.answer(run, first, &headers).await
}

/// An execute request for a registered skill, as its steps see it.
struct Execution {
    app: Arc<App>,
    /// The skill's name (an MCP tool asked for by its alias `PACK_TOOL`:
    /// its name `PACK.TOOL`).
    name: String,
    /// The name in the path, as asked: what a 404 echoes (the registered
    /// name of a hidden tool would say it exists).
    asked: String,
    skill: Arc<Skill>,
    /// Who asks: uid, role and permission mode.
    who: Identity,
}

/// The decision's row is written (or the run goes ahead unaudited).
struct Decided {
    /// The request and its row, until its outcome.
    allowed: Allowed,
    /// What went to the executor while the row was written.
    pre: Pre,
    /// The executor's request, when it was not sent held.
    params: Option<ExecuteParams>,
}

/// The run has its slot and went to the executor.
struct Admitted {
    allowed: Allowed,
    permit: OwnedSemaphorePermit,
    started: Instant,
    conn: Result<RunConnection, ExecutorError>,
}

impl Execution {
    /// The registered skill `name` (404 when there is none) and who asks.
    fn find(app: Arc<App>, caller: &Caller, name: String) -> Result<Self, ApiError> {
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
        let who = app.authz().identify(caller);
        // An MCP tool asked for by its alias `PACK_TOOL` goes on by its
        // name `PACK.TOOL`.
        let (asked, name) = (name, skill.name().to_owned());
        Ok(Self { app, name, asked, skill, who })
    }

    fn manifest(&self) -> &Manifest {
        self.skill.registered().manifest()
    }

    /// The fields of this request's audit rows, whatever is decided.
    fn base(&self, req: Option<&ExecuteRequest>) -> Record {
        Record {
            session_id: req.and_then(|r| r.session_id.clone()),
            skill: self.skill.name().to_owned(),
            class: self.manifest().class().as_str().to_owned(),
            caller_uid: self.who.uid,
            caller_pid: self.who.pid,
            role: self.who.role.clone(),
            mode: self.who.mode.as_str().to_owned(),
            args: req.map(|r| r.args.raw_json().clone()),
            ..Record::default()
        }
    }

    /// Decode: the body read and parsed into the request, for a skill the
    /// caller may see.
    ///
    /// A skill this caller may not see is answered as one that does not
    /// exist (`show`, `list`), at once, as an unknown name is: its body is
    /// not read (that took as long as the client took to send it) nor its
    /// args checked against a schema the caller may not see. The class
    /// refusal is audited, without args. (`Authz::decide` allows no
    /// request for a skill `may_list` hides, whatever it holds.)
    ///
    /// A body that cannot be read or is no request (415, 413, 408, 400
    /// `bad_request`) is refused before any decision, but it was a request
    /// to run this skill: its row (`reject`, reason = the error's code,
    /// outcome `rejected`, no args) is written as an `invalid_args` one is.
    async fn decode(&self, headers: &HeaderMap, body: Body) -> Result<ExecuteRequest, ApiError> {
        let app = &self.app;
        if !visible(app.authz(), &self.who, &self.skill) {
            let args = Args::empty();
            let run = RunRequest {
                skill: self.skill.name(),
                class: self.manifest().class(),
                args: &args,
                session_id: None,
                confirm: false,
                approvals: &[],
            };
            if let Err(denied) = app.authz().decide(&self.who, &run, unix_now()) {
                // Answered before its row is written: the 404 of a hidden
                // skill takes no longer than that of a name not registered.
                let (_, row) = denial(app, self.base(None), denied);
                app.audit().record_unawaited(row);
            }
            return Err(ApiError::no_such_skill(&self.asked));
        }
        match read_body(body, headers, app.limits()).await.and_then(|b| parse_request(&b)) {
            Ok(req) => {
                // Args may hold what a caller would not want logged: their size only.
                tracing::debug!(
                    skill = self.skill.name(),
                    args_bytes = req.args.raw().len(),
                    "execute request"
                );
                Ok(req)
            }
            Err(e) => {
                // Not an execution (`ongrid_executions_total`): no args were read.
                tracing::info!(
                    skill = self.skill.name(),
                    code = e.code(),
                    "execute request refused"
                );
                record_refusal(app, self.base(None), "reject", e.code(), Outcome::Rejected, &e)
                    .await;
                Err(e)
            }
        }
    }

    /// Authorise: the args against the skill's schema (400 `invalid_args`),
    /// then the caller's permission (403 `denied`), each refusal counted
    /// and its row written. Returns the base of the run's row and the
    /// grant.
    async fn authorise(&self, req: &ExecuteRequest) -> Result<(Record, Grant), ApiError> {
        let app = &self.app;
        let skill = self.skill.name();
        let base = self.base(Some(req));
        if let Err(violations) = self.skill.check_args(req.args.value()) {
            let invalid = Outcome::InvalidArgs;
            app.metrics().executions_total.with_label_values(&[skill, invalid.as_str()]).inc();
            tracing::info!(skill, violations = violations.len(), "args rejected");
            let e = ApiError::InvalidArgs { skill: self.name.clone(), violations };
            record_refusal(app, base, "reject", "invalid_args", invalid, &e).await;
            return Err(e);
        }
        let run = RunRequest {
            skill,
            class: self.manifest().class(),
            args: &req.args,
            session_id: req.session_id.as_deref(),
            confirm: req.confirm,
            approvals: &req.approvals,
        };
        match app.authz().decide(&self.who, &run, unix_now()) {
            Ok(grant) => {
                app.metrics()
                    .authz_decisions_total
                    .with_label_values(&["allow", grant.reason])
                    .inc();
                Ok((base, grant))
            }
            Err(denied) => Err(deny(app, base, denied).await),
        }
    }

    /// Audit: the decision's row written before anything runs; its commit
    /// is the one the completion waits for (`Audit::record_before_run`).
    ///
    /// Meanwhile, with a run slot free at once, the executor already gets
    /// the request held: it checks and prepares the run but spawns nothing
    /// before the `start` sent once the row is in (a refused request closes
    /// the connection, which cancels it). Without a free slot the
    /// connection is only opened meanwhile, and nothing is sent before a
    /// slot is taken. A replayed approval is a 403; a row that cannot be
    /// written a 503 `audit_unavailable` when `audit_required`.
    async fn audit(
        &self,
        base: Record,
        grant: Grant,
        req: ExecuteRequest,
    ) -> Result<Decided, ApiError> {
        let app = &self.app;
        let skill = self.skill.name();
        // From here a request dropped unfinished counts as `cancelled`.
        let mut allowed = Allowed::new(app, skill);
        let record = Record {
            decision: "allow",
            reason: grant.reason.to_owned(),
            approvers: grant.approvals.iter().map(|v| v.key_id.clone()).collect(),
            approvals_used: grant
                .approvals
                .iter()
                .map(|v| (v.replay_key(), v.expires_at))
                .collect(),
            ..base.clone()
        };
        // The executor's request. Its manifest path must be UTF-8 (the wire
        // is JSON): the scan registers no skill whose path is not
        // (`crate::scan::build`), so the refusal after the decision's row
        // (`admit`) is only a guard.
        let registered = self.skill.registered();
        let mut params = registered.manifest_path().to_str().map(|m| ExecuteParams {
            manifest: m.to_owned(),
            args: req.args.into_raw(),
            session_id: req.session_id,
            class: Some(self.manifest().class()),
            tool: registered.tool().map(str::to_owned),
            // The executor runs the manifest only if it is still the one
            // this request was checked against.
            manifest_sha256: registered.digest().copied(),
            hold: false,
        });
        let fast = match Arc::clone(app.run_slots()).try_acquire_owned() {
            Ok(permit) => params.take().map(|p| (permit, p)),
            Err(_) => None,
        };
        // The executor's side is polled first: the row is often written in
        // place, synchronously (`Audit`'s writer), and the held request
        // should be on its way before that. The row's id goes into its
        // `RunRow` as it arrives, inside the join: a client gone while the
        // other side is still pending drops the guard, which completes the
        // row `cancelled`.
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
                    uid: self.who.uid,
                    mode: self.who.mode,
                    skill: skill.to_owned(),
                    reason: DenyReason::ApprovalReplayed,
                    message: format!(
                        "the approval of key {key_id} was already used; approvals count once"
                    ),
                };
                return Err(deny(app, base, denied).await);
            }
            Err(e) if app.audit().required() => {
                drop(grant);
                allowed.settle();
                app.metrics().executions_total.with_label_values(&[skill, AUDIT_UNAVAILABLE]).inc();
                tracing::error!(skill, error = %e, "run refused: no audit trail");
                return Err(ApiError::AuditUnavailable(e.to_string()));
            }
            Err(e) => {
                grant.keep();
                tracing::warn!(skill, error = %e, "running unaudited (audit_required = false)");
                allowed.decided(RunRow::new(audit.clone(), None));
            }
        }
        tracing::info!(
            skill,
            uid = self.who.uid,
            role = %self.who.role,
            mode = %self.who.mode,
            reason = run_reason(allowed.row_id()),
            "run allowed"
        );
        Ok(Decided { allowed, pre, params })
    }

    /// Admit: the run slot and the executor's connection. A request sent
    /// held is started; otherwise the run waits up to the queue timeout for
    /// a slot (503 `busy`) and is sent then.
    async fn admit(&self, decided: Decided) -> Result<Admitted, ApiError> {
        let app = &self.app;
        let Decided { mut allowed, pre, params } = decided;
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
                        // Queued: the connection opened ahead is not kept
                        // idle (the executor closes idle connections), a
                        // fresh one follows.
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
                    return Err(busy(self.skill.name(), why));
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
        Ok(Admitted { allowed, permit, started, conn })
    }

    /// Forward: the run in the executor's hands, up to its first event, so
    /// that a busy or failing executor is a 503 in both modes.
    async fn forward(&self, admitted: Admitted) -> Result<(Run, RunEvent), ApiError> {
        let app = &self.app;
        let Admitted { mut allowed, permit, started, conn } = admitted;
        let in_flight = app.metrics().run_in_flight();
        let timeout = self.manifest().timeout();
        let deadline = tokio::time::Instant::from_std(started) + timeout + REPORT_SLACK;
        let conn = match conn {
            Ok(c) => c,
            Err(e) => return Err(executor_error(&self.name, e, &mut allowed).await),
        };
        allowed.handed_over(started);
        let mut run = Run {
            app: Arc::clone(app),
            skill: Arc::clone(&self.skill),
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
        match run.next().await {
            Ok(first) => Ok((run, first)),
            Err(e) => Err(run.fail(&self.name, e).await),
        }
    }

    /// Answer: the report as one JSON body once the run is over, or every
    /// event as an NDJSON line as it comes (`Accept`).
    async fn answer(
        &self,
        mut run: Run,
        first: RunEvent,
        headers: &HeaderMap,
    ) -> Result<Response, ApiError> {
        if wants_ndjson(headers) {
            // The report line in slices: the stream lets go of the run, and
            // so of its slot, once the last one is taken (`answer`).
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
                // The executor's encoding of the report, as it sent it,
                // holding the run's slot until it is handed over (`answer`).
                let json = reported.json.get().to_owned();
                let held = (run.slot.take(), self.app.metrics().answer_unsent());
                return Ok(json_response(Body::new(Answer::new(json.into(), held))));
            }
            event = match run.next().await {
                Ok(ev) => ev,
                Err(e) => return Err(run.fail(&self.name, e).await),
            };
        }
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

/// Counts, logs and records a denial; returns the 403.
async fn deny(app: &App, base: Record, denied: Denied) -> ApiError {
    let (e, row) = denial(app, base, denied);
    let _ = app.audit().record(row).await;
    e
}

/// Counts and logs a denial: its error and its audit row.
fn denial(app: &App, base: Record, denied: Denied) -> (ApiError, Record) {
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
    let row = refusal_row(base, "deny", reason, Outcome::Denied, &e);
    (e, row)
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
    let _ = app.audit().record(refusal_row(base, decision, reason, outcome, e)).await;
}

/// The row of a refused request.
fn refusal_row(
    base: Record,
    decision: &'static str,
    reason: &str,
    outcome: Outcome,
    e: &ApiError,
) -> Record {
    Record {
        decision,
        reason: reason.to_owned(),
        outcome: Some(outcome.as_str().to_owned()),
        error: Some(e.to_string()),
        ..base
    }
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
/// body (`has_bytes` false) may carry any.
fn check_encoding(has_bytes: bool, headers: &HeaderMap) -> Result<(), ApiError> {
    if !has_bytes {
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

/// The request body, at most `max_body_bytes`, within `body_timeout`, in
/// no coding but `identity`: refused before it is read when its length
/// says it has bytes, else once read (a chunked body may turn out empty).
async fn read_body(body: Body, headers: &HeaderMap, limits: &Limits) -> Result<Bytes, ApiError> {
    let max = limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > 0) {
        check_encoding(true, headers)?;
    }
    if declared.is_some_and(|n| n > max as u64) {
        return Err(ApiError::TooLarge(max));
    }
    let collect = http_body_util::Limited::new(body, max).collect();
    let bytes = match tokio::time::timeout(limits.body_timeout, collect).await {
        Err(_) => return Err(ApiError::RequestTimeout),
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            return Err(ApiError::TooLarge(max));
        }
        Ok(Err(e)) => {
            return Err(ApiError::BadRequest(format!("cannot read the request body: {e}")));
        }
    };
    check_encoding(!bytes.is_empty(), headers)?;
    Ok(bytes)
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
    if req.session_id.as_ref().is_some_and(|s| s.chars().count() > MAX_SESSION_ID) {
        return Err(ApiError::BadRequest(format!("session_id over {MAX_SESSION_ID} characters")));
    }
    Ok(req)
}

#[cfg(test)]
mod tests;
