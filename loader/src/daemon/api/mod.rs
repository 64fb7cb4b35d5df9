//! The client API: HTTP/1.1 + JSON on the Unix socket, one handler file per
//! resource. Its contract is `docs/openapi.json` (OpenAPI 3.1), served at
//! `GET /v1/openapi.json` ([`OPENAPI`]).
//!
//! - [`skills`]: `GET /v1/skills[?category=]`, `GET /v1/skills/{name}`,
//!   `GET /v1/tools?format=openai|mcp|anthropic`, showing only what the
//!   caller may run, and `GET /v1/registry[?since=&wait=]`, the registry's
//!   generation as a long poll.
//! - [`execute`]: `POST /v1/skills/{name}/execute` (JSON or NDJSON stream,
//!   chosen by `Accept`: [`accept`]).
//! - `allowed`: an allowed run request until its outcome, counted
//!   `cancelled` when dropped before one.
//! - [`answer`]: a run's answer in slices, holding the run's slot until
//!   the connection has taken it.
//! - [`audit`]: `GET /v1/audit` (root and `audit = true` callers only).
//! - [`admin`]: `POST /v1/reload`, `GET /v1/health`, and `GET /metrics` on
//!   the separate loopback listener ([`metrics_router`]).
//! - [`error`]: [`ApiError`], the `{"error":{...}}` answers.
//!
//! Every request is logged once at info with its route, status, duration
//! and the caller's uid and pid; argument values never reach info level.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::daemon::app::App;
use crate::daemon::connection::Caller;

pub mod accept;
pub mod admin;
mod allowed;
pub mod answer;
pub mod audit;
pub mod error;
pub mod execute;
mod run;
pub mod skills;

pub use error::ApiError;

/// The OpenAPI 3.1 document of this API (`docs/openapi.json`), built in so
/// that a daemon serves the contract of its own version.
pub const OPENAPI: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json"));

/// The client API router.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/skills", get(skills::list))
        .route("/v1/skills/{name}", get(skills::show))
        .route("/v1/skills/{name}/execute", post(execute::execute))
        .route("/v1/tools", get(skills::tools))
        .route("/v1/registry", get(skills::generation))
        .route("/v1/audit", get(audit::list))
        .route("/v1/reload", post(admin::reload))
        .route("/v1/health", get(admin::health))
        .route("/v1/openapi.json", get(openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(app.clone(), log_request))
        .with_state(app)
}

/// The router of the metrics listener: `GET /metrics` only; anything else
/// gets a plain-text 404 or 405 that says so (scrapers and humans read it).
pub fn metrics_router(app: Arc<App>) -> Router {
    Router::new()
        .route("/metrics", get(admin::metrics))
        .fallback(|| async {
            (StatusCode::NOT_FOUND, "not found: this listener serves GET /metrics only\n")
        })
        .method_not_allowed_fallback(|| async {
            (
                StatusCode::METHOD_NOT_ALLOWED,
                [(header::ALLOW, "GET, HEAD")],
                "method not allowed: this listener serves GET /metrics only\n",
            )
        })
        .with_state(app)
}

/// `GET /v1/openapi.json`: [`OPENAPI`], for any caller, as `/v1/health`
/// (the document says what each route shows whom, nothing more).
async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Logs each request and counts it in `ongrid_http_requests_total`.
async fn log_request(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |m| m.as_str().to_owned());
    let caller = req.extensions().get::<Caller>().copied();
    let span = tracing::info_span!(
        "request",
        %method,
        path = %path.chars().take(256).collect::<String>(),
        uid = caller.map(|c| c.uid),
        pid = caller.and_then(|c| c.pid),
    );
    let response = tracing::Instrument::instrument(next.run(req), span.clone()).await;
    let status = response.status();
    app.metrics().http_requests_total.with_label_values(&[&route, status.as_str()]).inc();
    span.in_scope(|| {
        tracing::info!(
            status = status.as_u16(),
            duration_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
            "request"
        );
    });
    response
}
