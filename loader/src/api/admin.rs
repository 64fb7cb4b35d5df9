//! Operating the daemon: `POST /v1/reload`, `GET /v1/health`, and
//! `GET /metrics` on the loopback metrics listener.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};

use crate::app::{App, ReloadSummary};
use crate::metrics;

/// How long `/metrics` waits for the executor's part.
const EXECUTOR_METRICS_TIMEOUT: Duration = Duration::from_secs(2);

/// `POST /v1/reload` → `{"registered":N,"skipped":M}`.
pub async fn reload(State(app): State<Arc<App>>) -> Json<ReloadSummary> {
    Json(app.reload().await)
}

/// `GET /v1/health` → `{"status":"ok","version":..,"skills":N,"executor":"up"|"down"}`.
/// The daemon answering is what "ok" means; a down executor is reported,
/// not an error.
pub async fn health(State(app): State<Arc<App>>) -> Json<Value> {
    let up = app.executor().ping(Duration::from_secs(1)).await;
    Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "skills": app.registry().current().registered(),
        "executor": if up { "up" } else { "down" },
    }))
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
