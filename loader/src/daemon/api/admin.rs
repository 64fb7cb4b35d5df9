//! Operating the daemon: `POST /v1/reload`, `GET /v1/health`, and
//! `GET /metrics` on the loopback metrics listener.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Extension;
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use crate::daemon::app::{App, ReloadSummary};
use crate::daemon::connection::Caller;
use crate::daemon::metrics;

/// How long `/v1/health` waits for the executor's `ping`.
const EXECUTOR_PING_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `/v1/health` waits for the audit thread (busy with a batch and
/// its `fsync`, or with a database another process holds locked).
const AUDIT_HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// How long `/metrics` waits for the executor's part.
const EXECUTOR_METRICS_TIMEOUT: Duration = Duration::from_secs(2);

/// `POST /v1/reload` → `{"registered":N,"skipped":M}`; 403 for callers
/// that may not ([`crate::daemon::authz::Authz::may_reload`]).
pub async fn reload(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<ReloadSummary>, ApiError> {
    let who = app.authz().identify(&caller);
    if !app.authz().may_reload(&who, nix::unistd::geteuid().as_raw()) {
        tracing::info!(uid = who.uid, role = %who.role, "reload refused");
        return Err(ApiError::Forbidden(format!(
            "uid {} (role {}, {}) may not reload: only root, the daemon's user and callers \
             with a mode beyond read-only may",
            who.uid, who.role, who.mode
        )));
    }
    tracing::info!(uid = who.uid, role = %who.role, "reload requested");
    // A task of its own: a client that hangs up drops this request, not
    // the reload, which still swaps the registry (and holds the
    // one-at-a-time lock until its scan is done).
    let reload = tokio::spawn(async move { app.reload().await });
    match reload.await {
        Ok(summary) => Ok(Json(summary)),
        Err(e) => Err(ApiError::Internal(format!("the reload failed: {e}"))),
    }
}

/// `GET /v1/health` → `{"status":"ok"|"degraded","version":..,"skills":N,
/// "executor":"up"|"down","audit":"ok"|"unavailable"}`, plus `audit_error`
/// (why) when the audit is unavailable. Always 200: the daemon answering
/// is what the answer itself means; what runs need and is missing (the
/// executor down, an audit trail that cannot be written, so runs are
/// refused 503) is reported as `degraded`, not as an error.
pub async fn health(State(app): State<Arc<App>>) -> Json<Value> {
    let (up, audit) = tokio::join!(
        app.executor().ping(EXECUTOR_PING_TIMEOUT),
        tokio::time::timeout(AUDIT_HEALTH_TIMEOUT, app.audit().health())
    );
    let audit = match audit {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "the audit thread did not answer within {} s",
            AUDIT_HEALTH_TIMEOUT.as_secs()
        )),
    };
    let mut body = json!({
        "status": if up && audit.is_ok() { "ok" } else { "degraded" },
        "version": env!("CARGO_PKG_VERSION"),
        "skills": app.registry().current().registered(),
        "executor": if up { "up" } else { "down" },
        "audit": if audit.is_ok() { "ok" } else { "unavailable" },
    });
    if let (Err(e), Some(obj)) = (audit, body.as_object_mut()) {
        obj.insert("audit_error".into(), Value::String(e));
    }
    Json(body)
}

/// `GET /metrics`: the loader's metrics followed by the executor's (when
/// it answers).
pub async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    let executor = app.executor().metrics(EXECUTOR_METRICS_TIMEOUT).await;
    app.metrics().executor_up.set(i64::from(executor.is_ok()));
    let mut text = metrics::encode(app.prometheus());
    match executor {
        Ok(executor_text) => metrics::merge_executor_text(&mut text, &executor_text),
        Err(e) => tracing::debug!(error = %e, "executor metrics unavailable"),
    }
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text)
}
