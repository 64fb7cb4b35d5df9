//! `GET /v1/audit[?skill=&outcome=&decision=&since=&limit=]`: the audit
//! trail, newest first, for root and the `[[callers]]` with `audit = true`
//! (others: 403 `forbidden`). The trail holds every caller's args, so it is
//! not for every client of the socket.
//!
//! `outcome` and `decision` must be words a row can hold
//! ([`audit::OUTCOMES`], [`audit::DECISIONS`]): any other is a 400 naming
//! them, not an empty answer. `since` is a duration back from now (`90s`,
//! `10m`, `2h`, `7days`: humantime's syntax); `limit` defaults to 100, at
//! most 1000. Answer:
//! `{"items":[row...],"total":N}` with the rows of [`crate::daemon::audit::Entry`]
//! (times in unix milliseconds), plus
//! `"incomplete":{"unwritten":N,"reason":"..."}` when rows the daemon
//! journaled could not be written into the database before the read (a
//! database another process holds locked, a full file system): the items
//! may then lack the newest rows or completions.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use crate::daemon::app::App;
use crate::daemon::audit::{self, MAX_QUERY_ROWS};
use crate::daemon::connection::Caller;

/// Default number of rows.
pub const DEFAULT_LIMIT: u32 = 100;

/// The query string.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only this skill.
    pub skill: Option<String>,
    /// Only this outcome (one of [`audit::OUTCOMES`]).
    pub outcome: Option<String>,
    /// Only this decision (one of [`audit::DECISIONS`]).
    pub decision: Option<String>,
    /// Only rows newer than this duration.
    pub since: Option<String>,
    /// At most this many rows.
    pub limit: Option<u32>,
}

/// The handler.
pub async fn list(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Json<Listing>, ApiError> {
    let who = app.authz().identify(&caller);
    if !app.authz().may_read_audit(&who) {
        return Err(ApiError::Forbidden(format!(
            "uid {} (role {}) may not read the audit trail: only root and callers with \
             `audit = true` in skilld.toml may",
            who.uid, who.role
        )));
    }
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    one_of("outcome", q.outcome.as_deref(), &audit::OUTCOMES)?;
    one_of("decision", q.decision.as_deref(), &audit::DECISIONS)?;
    let since_ms = match q.since.as_deref() {
        None => None,
        Some(text) => {
            let d = humantime::parse_duration(text).map_err(|e| {
                let shown: String = text.chars().take(32).collect();
                ApiError::BadRequest(format!(
                    "since {shown:?}: {e} (want e.g. 90s, 10m, 2h, 7days)"
                ))
            })?;
            let back = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            Some(audit::now_ms().saturating_sub(back))
        }
    };
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_QUERY_ROWS).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit must be within 1..={MAX_QUERY_ROWS}")));
    }
    // A tool's `PACK_TOOL` alias names it as its rows do: `PACK.TOOL`.
    let skill = q.skill.map(|name| {
        let snapshot = app.registry().current();
        snapshot.get(&name).map_or(name, |s| s.registered().name().to_owned())
    });
    let trail = app
        .audit()
        .query(audit::Query { skill, outcome: q.outcome, decision: q.decision, since_ms, limit })
        .await
        .map_err(|e| ApiError::AuditUnreadable(e.to_string()))?;
    if let Some(i) = &trail.incomplete {
        tracing::warn!(unwritten = i.unwritten, reason = %i.reason, "audit: read of an incomplete trail");
    }
    Ok(Json(Listing { total: trail.items.len(), items: trail.items, incomplete: trail.incomplete }))
}

/// Refuses a `value` of the filter `key` that is not one of `words`.
fn one_of(key: &str, value: Option<&str>, words: &[&str]) -> Result<(), ApiError> {
    match value {
        Some(v) if !words.contains(&v) => {
            let shown: String = v.chars().take(32).collect();
            Err(ApiError::BadRequest(format!("{key} {shown:?} is not one of {}", words.join(", "))))
        }
        _ => Ok(()),
    }
}

/// The answer: a struct, not `json!`, so each row's args and result keep
/// their text.
#[derive(Debug, Serialize)]
pub struct Listing {
    items: Vec<audit::Entry>,
    total: usize,
    /// What the items lack, when they cannot be the whole trail.
    #[serde(skip_serializing_if = "Option::is_none")]
    incomplete: Option<audit::Incomplete>,
}
