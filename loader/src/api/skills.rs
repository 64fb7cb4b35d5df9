//! Reading the registry: `GET /v1/skills`, `GET /v1/skills/{name}` and
//! `GET /v1/tools`.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use super::ApiError;
use crate::app::App;
use crate::authz;
use crate::server::Caller;

/// Query of `GET /v1/skills`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    /// Only skills of this category.
    pub category: Option<String>,
}

/// `GET /v1/skills[?category=]` → `{"items":[...],"total":N}`.
pub async fn list(
    State(app): State<Arc<App>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let snapshot = app.registry().current();
    let items: Vec<Value> = snapshot
        .iter()
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
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(name) = name.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let snapshot = app.registry().current();
    snapshot
        .get(&name)
        .map(|s| Json(s.to_api_json()))
        .ok_or_else(|| ApiError::NotFound(format!("no skill named {name:?}")))
}

/// Query of `GET /v1/tools`.
#[derive(Debug, Deserialize)]
pub struct ToolsQuery {
    /// `openai` (default) or `mcp`.
    pub format: Option<String>,
}

/// `GET /v1/tools?format=openai|mcp`: tool definitions for an LLM, only
/// the skills the caller may run.
///
/// - `openai`: `{"tools":[{"type":"function","function":{"name",
///   "description","parameters"}}]}`
/// - `mcp`: `{"tools":[{"name","description","inputSchema"}]}`
pub async fn tools(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ToolsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let mcp = match query.format.as_deref() {
        None | Some("openai") => false,
        Some("mcp") => true,
        Some(other) => {
            let shown: String = other.chars().take(32).collect();
            return Err(ApiError::BadRequest(format!(
                "format {shown:?} is not one of \"openai\", \"mcp\""
            )));
        }
    };
    let snapshot = app.registry().current();
    let tools: Vec<Value> = snapshot
        .iter()
        .filter(|s| authz::may_list(&caller, s.name(), s.registered().manifest().class()))
        .map(|s| {
            let m = s.registered().manifest();
            if mcp {
                json!({"name": m.name(), "description": m.description(), "inputSchema": m.schema()})
            } else {
                json!({"type": "function", "function": {
                    "name": m.name(), "description": m.description(), "parameters": m.schema()}})
            }
        })
        .collect();
    Ok(Json(json!({"tools": tools})))
}
