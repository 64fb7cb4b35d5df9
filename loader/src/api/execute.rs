//! `POST /v1/skills/{name}/execute`: check, authorise, queue, forward to
//! the executor, answer with the run report (or stream it as NDJSON).
//!
//! Order of checks: unknown skill (404), body size and time (413, 408), JSON
//! shape (400 `bad_request`), args against the schema (400 `invalid_args`),
//! permission (403), a run slot (503 `busy`), the executor (503). Nothing
//! reaches the executor before all of them pass. Any run the executor
//! finishes, ok or failed, is a 200 with its report.
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
use axum::{Extension, Json};
use http_body_util::BodyExt;
use policy::wire::ExecuteParams;
use policy::{Outcome, RunReport};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;

use super::ApiError;
use crate::app::{App, Limits};
use crate::authz::{self, RunRequest};
use crate::executor_client::{ExecutorError, RunConnection, RunEvent};
use crate::metrics::InFlight;
use crate::registry::Skill;
use crate::server::Caller;

/// The media type of the streamed answer.
pub const NDJSON: &str = "application/x-ndjson";

/// How long past the skill's own timeout the loader waits for the
/// executor's report (the executor's grace period plus slack).
const REPORT_SLACK: Duration = Duration::from_secs(15);

/// Longest `session_id` accepted.
const MAX_SESSION_ID: usize = 256;

/// The request body. An empty body means `{}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    /// The args object (default `{}`).
    #[serde(default = "empty_object")]
    pub args: Value,
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

fn empty_object() -> Value {
    json!({})
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
        .ok_or_else(|| ApiError::NotFound(format!("no skill named {name:?}")))?;
    let bytes = read_body(body, &headers, app.limits()).await?;
    let req = parse_request(&bytes)?;
    tracing::debug!(skill = skill.name(), args = %req.args, "execute request");

    let count = |outcome: Outcome| {
        app.metrics().executions_total.with_label_values(&[skill.name(), outcome.as_str()]).inc();
    };
    if let Err(violations) = skill.check_args(&req.args) {
        count(Outcome::InvalidArgs);
        tracing::info!(skill = skill.name(), violations = violations.len(), "args rejected");
        return Err(ApiError::InvalidArgs { skill: name, violations });
    }
    let manifest = skill.registered().manifest();
    let run = RunRequest {
        skill: skill.name(),
        class: manifest.class(),
        confirm: req.confirm,
        approvals: req.approvals.len(),
    };
    if let Err(denied) = authz::authorize(&caller, &run) {
        count(Outcome::Denied);
        tracing::info!(skill = skill.name(), uid = caller.uid, "run denied");
        return Err(ApiError::Denied(denied.to_string()));
    }

    let queued = Instant::now();
    let slot = tokio::time::timeout(
        app.limits().queue_timeout,
        Arc::clone(app.run_slots()).acquire_owned(),
    )
    .await;
    app.metrics().run_queue_wait_seconds.observe(queued.elapsed().as_secs_f64());
    let Ok(Ok(permit)) = slot else {
        count(Outcome::Busy);
        return Err(busy(skill.name(), "no run slot free in time"));
    };
    let in_flight = app.metrics().run_in_flight();

    let manifest_path = skill.registered().manifest_path().to_str().ok_or_else(|| {
        ApiError::Internal("the manifest path is not UTF-8; the executor wire needs UTF-8".into())
    })?;
    let params = ExecuteParams {
        manifest: manifest_path.to_owned(),
        args: req.args,
        session_id: req.session_id,
        class: Some(manifest.class()),
    };
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + manifest.timeout() + REPORT_SLACK;
    let mut run = Run {
        app: Arc::clone(&app),
        skill,
        conn: app.executor().execute(&params).await.map_err(|e| executor_error(&app, &name, e))?,
        deadline,
        started,
        _permit: permit,
        _in_flight: in_flight,
    };
    // Wait for the first event before choosing the status, so that a busy
    // or failing executor is a 503 in both modes.
    let first = run.next().await.map_err(|e| executor_error(&app, &name, e))?;

    if wants_ndjson(&headers) {
        let mut response = Body::from_stream(ndjson(run, first)).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
        return Ok(response);
    }
    let mut event = first;
    loop {
        if let RunEvent::Report(report) = event {
            run.finish(&report);
            return Ok(Json(*report).into_response());
        }
        event = run.next().await.map_err(|e| executor_error(&app, &name, e))?;
    }
}

/// A run forwarded to the executor. Holding it holds the run slot, the
/// in-flight count and the executor connection; dropping it releases all
/// three and cancels the run if it has not finished.
struct Run {
    app: Arc<App>,
    skill: Arc<Skill>,
    conn: RunConnection,
    deadline: tokio::time::Instant,
    started: Instant,
    _permit: OwnedSemaphorePermit,
    _in_flight: InFlight,
}

impl Run {
    async fn next(&mut self) -> Result<RunEvent, ExecutorError> {
        match tokio::time::timeout_at(self.deadline, self.conn.next()).await {
            Ok(r) => r,
            Err(_) => Err(ExecutorError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no report from the executor past the skill's timeout",
            ))),
        }
    }

    fn finish(&self, report: &RunReport) {
        let name = self.skill.name();
        let elapsed = self.started.elapsed();
        let m = self.app.metrics();
        m.executions_total.with_label_values(&[name, report.outcome.as_str()]).inc();
        m.run_duration_seconds.with_label_values(&[name]).observe(elapsed.as_secs_f64());
        tracing::info!(
            skill = name,
            outcome = %report.outcome,
            exit_code = report.exit_code,
            signal = report.signal,
            duration_ms = report.duration_ms,
            "run finished"
        );
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
        let (value, done) = match event {
            Ok(RunEvent::Stderr(line)) => (json!({"event": "stderr", "line": line}), false),
            Ok(RunEvent::Report(report)) => {
                run.finish(&report);
                (json!({"event": "report", "report": report}), true)
            }
            Err(e) => {
                tracing::warn!(skill = run.skill.name(), error = %chain(&e), "run stream ended");
                let code = if matches!(e, ExecutorError::Busy(_)) {
                    "busy"
                } else {
                    "executor_unavailable"
                };
                (json!({"event": "error", "error": {"code": code, "message": chain(&e)}}), true)
            }
        };
        let mut line = value.to_string().into_bytes();
        line.push(b'\n');
        Some((Ok(Bytes::from(line)), (run, None, done)))
    })
}

fn wants_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.trim().starts_with(NDJSON)))
}

async fn read_body(body: Body, headers: &HeaderMap, limits: &Limits) -> Result<Bytes, ApiError> {
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
        return Ok(ExecuteRequest { args: empty_object(), ..ExecuteRequest::default() });
    }
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("request body: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::BadRequest("request body must be a JSON object".into()));
    }
    let req: ExecuteRequest = serde_json::from_value(value)
        .map_err(|e| ApiError::BadRequest(format!("request body: {e}")))?;
    if !req.args.is_object() {
        return Err(ApiError::BadRequest("args must be a JSON object".into()));
    }
    if req.session_id.as_ref().is_some_and(|s| s.len() > MAX_SESSION_ID) {
        return Err(ApiError::BadRequest(format!("session_id longer than {MAX_SESSION_ID} bytes")));
    }
    Ok(req)
}

fn busy(skill: &str, why: &str) -> ApiError {
    ApiError::Busy(Box::new(RunReport::not_run(skill, Outcome::Busy, why)))
}

fn executor_error(app: &App, skill: &str, e: ExecutorError) -> ApiError {
    tracing::warn!(skill, error = %chain(&e), "executor did not run the skill");
    match e {
        ExecutorError::Busy(why) => {
            app.metrics().executions_total.with_label_values(&[skill, "busy"]).inc();
            busy(skill, &format!("executor busy: {why}"))
        }
        other => ApiError::ExecutorUnavailable(chain(&other)),
    }
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
    fn request_bodies() {
        assert_eq!(parse_request(b"").unwrap().args, json!({}));
        assert_eq!(parse_request(b" \n").unwrap().args, json!({}));
        assert_eq!(parse_request(b"{}").unwrap().args, json!({}));
        let r =
            parse_request(br#"{"args":{"a":1},"session_id":"s","confirm":true,"approvals":[{}]}"#)
                .unwrap();
        assert_eq!(r.args, json!({"a": 1}));
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
        ] {
            let Err(e) = parse_request(bad) else { panic!("{:?}", String::from_utf8_lossy(bad)) };
            assert_eq!(e.code(), "bad_request", "{:?}", String::from_utf8_lossy(bad));
        }
        let long = format!(r#"{{"session_id":"{}"}}"#, "x".repeat(MAX_SESSION_ID + 1));
        assert!(parse_request(long.as_bytes()).is_err());
    }

    #[test]
    fn accept_header_selects_the_stream() {
        let mut h = HeaderMap::new();
        assert!(!wants_ndjson(&h));
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, application/x-ndjson"),
        );
        assert!(wants_ndjson(&h));
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(!wants_ndjson(&h));
    }
}
