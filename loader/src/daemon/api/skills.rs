//! Reading the registry: `GET /v1/skills`, `GET /v1/skills/{name}`,
//! `GET /v1/tools`, and `GET /v1/registry` (its generation, a long poll).
//!
//! Each shows only the skills this caller may run ([`Authz::may_list`]):
//! `safe` for everyone, `mutating` for `mutating-with-confirm` and up,
//! `dangerous` for `dual-sign-required` when two approvers are
//! configured. A skill the caller may not see is a 404 here, and on
//! execute too (where the denial is still audited with its reason).

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use crate::daemon::app::App;
use crate::daemon::authz::{Authz, Identity};
use crate::daemon::connection::Caller;
use crate::daemon::registry::Skill;

/// Whether `who` may see `skill`: listings show it, `show` and execute
/// answer for it (else 404, as for no such skill).
pub(super) fn visible(authz: &Authz, who: &Identity, skill: &Skill) -> bool {
    authz.may_list(who, skill.registered().manifest().class())
}

/// Query of `GET /v1/skills`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    /// Only skills of this category.
    pub category: Option<String>,
}

/// `GET /v1/skills[?category=]` → `{"items":[...],"total":N}`.
pub async fn list(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let who = app.authz().identify(&caller);
    let snapshot = app.registry().current();
    let items: Vec<Value> = snapshot
        .iter()
        .filter(|s| visible(app.authz(), &who, s))
        .filter(|s| {
            query.category.as_deref().is_none_or(|c| s.registered().manifest().category() == c)
        })
        .map(|s| s.to_api_json())
        .collect();
    Ok(Json(json!({"total": items.len(), "items": items})))
}

/// `GET /v1/skills/{name}`.
pub async fn show(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(name) = name.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let who = app.authz().identify(&caller);
    let snapshot = app.registry().current();
    let mut shown = snapshot
        .get(&name)
        .filter(|s| visible(app.authz(), &who, s))
        .map(|s| s.to_api_json())
        .ok_or_else(|| ApiError::no_such_skill(&name))?;
    // The executor's warm pool of the skill: null when it grants none, or
    // does not answer in time (the detail is served either way).
    let name = shown["name"].as_str().unwrap_or(&name);
    let warm = app.executor().warm(name, WARM_ASK_TIMEOUT).await.ok().flatten();
    if let Some(o) = shown.as_object_mut() {
        o.insert("warm".into(), serde_json::to_value(warm).unwrap_or(Value::Null));
    }
    Ok(Json(shown))
}

/// How long `GET /v1/skills/{name}` waits for the executor's `warm` answer.
const WARM_ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Query of `GET /v1/tools`.
#[derive(Debug, Deserialize)]
pub struct ToolsQuery {
    /// `openai` (default), `mcp` or `anthropic`.
    pub format: Option<String>,
}

/// The tool formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    OpenAi,
    Mcp,
    Anthropic,
}

/// `GET /v1/tools?format=openai|mcp|anthropic`: tool definitions for an
/// LLM, only the skills the caller may run.
///
/// - `openai`: `{"tools":[{"type":"function","function":{"name",
///   "description","parameters"}}]}` (an MCP server's tool named by its
///   alias `PACK_TOOL`, as in `anthropic`: names there are
///   `^[a-zA-Z0-9_-]{1,64}$`)
/// - `mcp`: `{"tools":[{"name","description","inputSchema"}]}`, and
///   `outputSchema` where the manifest declares `output_schema`
/// - `anthropic`: `{"tools":[{"name","description","input_schema"}]}`
pub async fn tools(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ToolsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let format = match query.format.as_deref() {
        None | Some("openai") => Format::OpenAi,
        Some("mcp") => Format::Mcp,
        Some("anthropic") => Format::Anthropic,
        Some(other) => {
            let shown: String = other.chars().take(32).collect();
            return Err(ApiError::BadRequest(format!(
                "format {shown:?} is not one of \"openai\", \"mcp\", \"anthropic\""
            )));
        }
    };
    let who = app.authz().identify(&caller);
    let snapshot = app.registry().current();
    let tools: Vec<Value> = snapshot
        .iter()
        .filter(|s| visible(app.authz(), &who, s))
        .map(|s| {
            let m = s.registered().manifest();
            // The function formats' consumers refuse a dot in a name: an MCP
            // server's tool is listed there by its alias `PACK_TOOL`.
            let function = s.registered().function_name();
            let (description, schema) = (m.description(), m.schema());
            match format {
                Format::OpenAi => json!({"type": "function", "function": {
                    "name": function, "description": description, "parameters": schema}}),
                Format::Mcp => {
                    let name = s.name();
                    let mut tool =
                        json!({"name": name, "description": description, "inputSchema": schema});
                    if let Some(output) = m.output_schema() {
                        tool["outputSchema"] = json!(output);
                    }
                    tool
                }
                Format::Anthropic => {
                    json!({"name": function, "description": description, "input_schema": schema})
                }
            }
        })
        .collect();
    Ok(Json(json!({"tools": tools})))
}

/// The longest wait of `GET /v1/registry`, seconds.
pub const MAX_GENERATION_WAIT: u64 = 300;
/// The wait of `GET /v1/registry` without `wait`, seconds.
pub const DEFAULT_GENERATION_WAIT: u64 = 30;

/// Query of `GET /v1/registry`.
#[derive(Debug, Deserialize)]
pub struct GenerationQuery {
    /// The generation the caller knows: answered when the registry's is
    /// another. Absent: answered at once.
    pub since: Option<u64>,
    /// How long to wait, seconds ([`DEFAULT_GENERATION_WAIT`]; more than
    /// [`MAX_GENERATION_WAIT`] is refused).
    pub wait: Option<u64>,
}

/// `GET /v1/registry[?since=G&wait=S]` → `{"generation":N}`: the
/// registry's generation, which moves at each reload and each time an MCP
/// server pack's tools are listed again. A long poll: with `since`, it
/// answers once the generation is not `since` (at once if it is not
/// already), when `wait` seconds pass, or when the daemon stops. A client
/// (the MCP front) then reads what it shows (`/v1/tools`) again, rather
/// than polling that: no skill is named here, so it tells every caller the
/// same.
pub async fn generation(
    State(app): State<Arc<App>>,
    query: Result<Query<GenerationQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let wait = query.wait.unwrap_or(DEFAULT_GENERATION_WAIT);
    if wait > MAX_GENERATION_WAIT {
        let why = format!("wait must be at most {MAX_GENERATION_WAIT} seconds, got {wait}");
        return Err(ApiError::BadRequest(why));
    }
    let registry = app.registry();
    if let Some(since) = query.since {
        let mut told = registry.subscribe();
        tokio::select! {
            _ = told.wait_for(|g| *g != since) => {}
            () = tokio::time::sleep(std::time::Duration::from_secs(wait)) => {}
            () = app.stopping().cancelled() => {}
        }
    }
    Ok(Json(json!({"generation": registry.generation()})))
}
