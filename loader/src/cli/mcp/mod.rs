//! `ongrid-skill mcp [--socket PATH]`: a Model Context Protocol server on
//! stdin/stdout that offers the caller's skills as MCP tools.
//!
//! The protocol is the official Rust SDK's (`rmcp`): revision 2026-07-28
//! (no handshake: `server/discover`, the version and capabilities in each
//! request's `_meta`) and the earlier revisions it still speaks
//! (2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05: `initialize` first).
//! Newline-delimited JSON-RPC 2.0 on stdout, nothing else there;
//! diagnostics go to stderr.
//!
//! - `tools/list`: `GET /v1/tools?format=mcp` from ongrid-skilld, which
//!   lists only what this caller (the uid running `ongrid-skill mcp`, by
//!   `SO_PEERCRED`) may run: `name`, `description`, `inputSchema`, and
//!   `outputSchema` where the manifest declares one.
//! - `tools/call`: `POST /v1/skills/{name}/execute` with the `arguments`.
//!   An `ok` run answers the result as `structuredContent` (an object
//!   result as is, anything else as `{"result": ...}`) and as JSON text,
//!   unless it does not conform to the tool's `outputSchema` (then
//!   `isError`, outcome `invalid_result`);
//!   any other outcome is `isError: true` with the outcome, error, exit
//!   code and stderr tail (text and `structuredContent`). Refusals (invalid
//!   args, denied, busy, daemon unreachable) are `isError` results with
//!   the daemon's code and message; an unknown tool is a JSON-RPC error
//!   (`-32602`), as the spec asks.
//! - `notifications/cancelled` drops that call's connection to the
//!   daemon, which kills the run.
//! - `tools.listChanged`: once the client is initialized (or, at
//!   2026-07-28, while its `subscriptions/listen` asks for
//!   `toolsListChanged`), the front keeps a long poll on the daemon's
//!   registry generation (`GET /v1/registry`); each time it moves (a
//!   reload, a pack added or removed, an MCP server's list change), it
//!   reads the caller's tools again and sends
//!   `notifications/tools/list_changed` when they differ from the last
//!   list the client was given or told of ([`Server::follow`]).
//!
//! Calls run concurrently. A call's `arguments` reach the skill as the
//! client wrote them ([`raw_args`]), and a key given twice is refused.

use std::collections::HashMap;
use std::future::Future;
use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use policy::{ArgsError, RawJson};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CustomRequest,
    CustomResult, Implementation, JsonObject, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde::Serialize;
use serde_json::{json, Value};

use self::raw_args::{Calls, Tee};
use super::remote::DaemonArgs;
use crate::cli::client::{encode_segment, ApiResponse, DaemonClient};

mod raw_args;

/// What `initialize` and `server/discover` say of this server.
const INSTRUCTIONS: &str = "Each tool is a sandboxed ongrid skill run on this host by \
    ongrid-skilld; only the skills you may run are listed. A failed run is returned with \
    isError and its outcome and stderr.";

/// Arguments of `mcp`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How to reach the daemon.
    #[arg(skip)]
    pub daemon: DaemonArgs,
}

/// Serves MCP on stdin/stdout until stdin closes.
///
/// # Errors
///
/// I/O errors on stdin or stdout.
pub fn run(args: &Args, _out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let server = Server::new(args.daemon.client());
    let served = super::remote::block_on(async move {
        let stdin = Tee::new(tokio::io::stdin(), server.calls.clone());
        let running =
            server.serve((stdin, tokio::io::stdout())).await.map_err(|e| e.to_string())?;
        running.waiting().await.map(drop).map_err(|e| e.to_string())
    })?;
    match served {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            writeln!(err, "ongrid-skill mcp: {e}")?;
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The methods this server serves whose params the SDK reads, and what
/// their params are: a request of one whose params it cannot read is
/// answered `-32602` naming them ([`Server::on_custom_request`]).
const SERVED: [(&str, &str); 5] = [
    ("tools/call", "an object with `name`, a string, and `arguments`, an object"),
    ("tools/list", "an object with an optional `cursor` string"),
    ("initialize", "`protocolVersion`, `capabilities` and `clientInfo`"),
    ("server/discover", "an object"),
    ("subscriptions/listen", "an object with a `filter` object"),
];

/// The longest message of one schema error in an `invalid_result`.
const MAX_SCHEMA_ERROR_CHARS: usize = 300;

/// The largest result also given as text content; a larger one is given
/// only as `structuredContent`, with a text saying so.
const MAX_TEXT_COPY: usize = 1 << 20;

/// How long one long poll of the registry's generation waits, seconds.
const REGISTRY_WAIT: u64 = 30;
/// The first wait before asking the daemon again after a failed poll.
const FOLLOW_RETRY: Duration = Duration::from_millis(500);
/// The longest wait between polls after failures.
const FOLLOW_RETRY_MAX: Duration = Duration::from_secs(10);

/// What answers requests: the daemon client, the session id its runs are
/// audited under, the calls' arguments as written, and the last tool list
/// the client was given.
#[derive(Debug, Clone)]
pub struct Server {
    client: DaemonClient,
    session: String,
    calls: Calls,
    /// The caller's tools as last given by `tools/list` (their JSON
    /// text): a move to them tells the client nothing new.
    given: Arc<Mutex<Option<String>>>,
    /// Each tool's `outputSchema` (or none) as last read: an `ok` result
    /// that does not conform is not returned as `structuredContent`.
    output_schemas: Arc<Mutex<HashMap<String, Option<Arc<JsonObject>>>>>,
}

/// A tool list as text, to compare lists by.
fn list_text(tools: &[Tool]) -> String {
    serde_json::to_string(tools).unwrap_or_default()
}

/// The execute body of a `tools/call`.
#[derive(Serialize)]
struct CallBody<'a> {
    args: &'a policy::Args,
    session_id: &'a str,
}

/// A `tools/call` result: its text and its structured content.
fn tool_result(text: String, structured: Value, is_error: bool) -> CallToolResult {
    let content = vec![ContentBlock::text(text)];
    let mut result =
        if is_error { CallToolResult::error(content) } else { CallToolResult::success(content) };
    result.structured_content = Some(structured);
    result
}

impl Server {
    /// A server asking the daemon behind `client`.
    pub fn new(client: DaemonClient) -> Self {
        Self {
            client,
            session: format!("mcp-{}", std::process::id()),
            calls: Calls::default(),
            given: Arc::default(),
            output_schemas: Arc::default(),
        }
    }

    /// Keeps `tools` as the last list the client was given (`tools/list`).
    fn give(&self, tools: &[Tool]) {
        *self.given.lock().unwrap_or_else(PoisonError::into_inner) = Some(list_text(tools));
    }

    /// The last list the client was given, as text.
    fn given(&self) -> Option<String> {
        self.given.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The registry's generation: at once (`since` `None`), or once it is
    /// not `since`, at most [`REGISTRY_WAIT`] seconds later.
    async fn registry_generation(&self, since: Option<u64>) -> Option<u64> {
        let path = match since {
            None => "/v1/registry".to_owned(),
            Some(g) => format!("/v1/registry?since={g}&wait={REGISTRY_WAIT}"),
        };
        let r = self.client.get(&path).await.ok()?;
        r.status.is_success().then(|| r.body["generation"].as_u64()).flatten()
    }

    /// Follows the daemon's registry until `notify` fails (the client is
    /// gone): a long poll on its generation, and after each move the
    /// caller's tools read again; `notify` is called when they differ from
    /// the last list this follower saw (before its first: the list the
    /// client was given, if any; a client that never listed its tools is
    /// told of the changes after the first read) and from the last list
    /// the client was given. Each follower (a session,
    /// each `subscriptions/listen`) keeps its own: every one is told. A
    /// move whose tools cannot be read is read again (the generation is
    /// taken only with its tools). When the daemon cannot be asked, it
    /// asks again after a backoff (0.5 s doubling to 10 s).
    pub async fn follow<F, Fut>(&self, mut notify: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let mut since = None;
        let mut seen: Option<String> = None;
        let mut failures: u32 = 0;
        loop {
            let read = match self.registry_generation(since).await {
                Some(g) if since == Some(g) => continue,
                Some(g) => self.tools().await.ok().map(|tools| (g, tools)),
                None => None,
            };
            let Some((generation, tools)) = read else {
                failures = failures.saturating_add(1);
                let wait = FOLLOW_RETRY
                    .saturating_mul(1 << failures.saturating_sub(1).min(5))
                    .min(FOLLOW_RETRY_MAX);
                tokio::time::sleep(wait).await;
                continue;
            };
            failures = 0;
            since = Some(generation);
            let text = list_text(&tools);
            let given = self.given();
            // Before its first read a follower compares with what the
            // client was given (it may have listed since the follower began).
            let told = seen.as_deref().or(given.as_deref());
            let news = told.is_some_and(|t| t != text) && given.as_deref() != Some(text.as_str());
            seen = Some(text);
            if news && !notify().await {
                return;
            }
        }
    }

    /// The caller's tools, as the daemon lists them.
    async fn tools(&self) -> Result<Vec<Tool>, ErrorData> {
        let r = self
            .client
            .get("/v1/tools?format=mcp")
            .await
            .map_err(|e| ErrorData::internal_error(plumbing::errors::chain(&e), None))?;
        if !r.status.is_success() {
            return Err(ErrorData::internal_error(daemon_message(&r), None));
        }
        let tools = r.body.get("tools").cloned().unwrap_or_else(|| json!([]));
        let tools: Vec<Tool> = serde_json::from_value(tools)
            .map_err(|e| ErrorData::internal_error(format!("the daemon's tool list: {e}"), None))?;
        let schemas = tools.iter().map(|t| (t.name.to_string(), t.output_schema.clone()));
        *self.output_schemas.lock().unwrap_or_else(PoisonError::into_inner) = schemas.collect();
        Ok(tools)
    }

    /// The `outputSchema` of tool `name` as last read (`fresh`: read now).
    async fn output_schema(&self, name: &str, fresh: bool) -> Option<Arc<JsonObject>> {
        let known = || {
            let schemas = self.output_schemas.lock().unwrap_or_else(PoisonError::into_inner);
            schemas.get(name).cloned()
        };
        match known() {
            Some(schema) if !fresh => schema,
            _ => {
                let _ = self.tools().await;
                known().flatten()
            }
        }
    }

    /// An `ok` run's answer, unless its result does not conform to the
    /// tool's `outputSchema` (checked against the list read now when it
    /// does not conform to the one kept): then `isError`, outcome
    /// `invalid_result`, as MCP asks of a server whose tool declares one.
    async fn checked_result(
        &self,
        name: &str,
        report: &Value,
        raw: Option<RawJson>,
    ) -> CallToolResult {
        let result = report_result(report, raw);
        let (Some(false), Some(structured)) = (result.is_error, result.structured_content.as_ref())
        else {
            return result;
        };
        let mut why = None;
        for fresh in [false, true] {
            let Some(schema) = self.output_schema(name, fresh).await else { return result };
            why = nonconforming(&schema, structured);
            if why.is_none() {
                return result;
            }
        }
        let why = why.unwrap_or_default();
        let text = format!("skill {name} failed: outcome invalid_result\nerror: {why}");
        let structured = json!({"skill": report["skill"], "outcome": "invalid_result",
            "error": why, "duration_ms": report["duration_ms"]});
        tool_result(text, structured, true)
    }

    /// Runs a `tools/call` to its end and returns its answer. `written` is
    /// what the call's line held (its arguments as text), when it was seen;
    /// a call whose line was not kept (longer than the lines inspected) is
    /// refused: the SDK's copy of its arguments is not what was sent.
    pub async fn call(
        &self,
        params: &CallToolRequestParams,
        written: Option<raw_args::Arguments>,
    ) -> Result<CallToolResult, ErrorData> {
        let name = params.name.as_ref();
        let text = match written {
            Some(Err(e)) => return Err(ErrorData::invalid_params(e, None)),
            Some(Ok(Some(raw))) if raw.get() != "null" => raw.get().to_owned(),
            Some(Ok(_)) => "{}".to_owned(),
            None => {
                let why = "the call's arguments were not kept as written (a line over 4 MiB?)";
                return Err(ErrorData::invalid_params(why, None));
            }
        };
        let args = match policy::Args::from_slice(text.as_bytes()) {
            Ok(a) => a,
            Err(ArgsError::NotObject) => {
                return Err(ErrorData::invalid_params("arguments must be an object", None))
            }
            Err(e) => return Err(ErrorData::invalid_params(format!("arguments: {e}"), None)),
        };
        let path = format!("/v1/skills/{}/execute", encode_segment(name));
        let body = CallBody { args: &args, session_id: &self.session };
        let r = match self.client.post(&path, &body).await {
            Ok(r) => r,
            Err(e) => {
                let text = plumbing::errors::chain(&e);
                let structured = json!({"error": {"code": "unreachable", "message": text}});
                return Ok(tool_result(text, structured, true));
            }
        };
        match r.status.as_u16() {
            200 => Ok(self.checked_result(name, &r.body, r.report_result()).await),
            404 => Err(ErrorData::invalid_params(format!("Unknown tool: {name}"), None)),
            _ => Ok(tool_result(daemon_message(&r), r.body.clone(), true)),
        }
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let capabilities =
            ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build();
        let mut info = ServerConfig::new(capabilities).with_instructions(INSTRUCTIONS);
        let mut implementation = Implementation::new("ongrid-skill", env!("CARGO_PKG_VERSION"));
        implementation.title = Some("ongrid-skills".into());
        info.server_info = implementation;
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self.tools().await?;
        self.give(&tools);
        Ok(ListToolsResult::with_all_items(tools))
    }

    /// A client that initialized (the revisions before 2026-07-28) is told
    /// of tool list changes from now on, on its session.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let (this, peer) = (self.clone(), context.peer);
        tokio::spawn(async move {
            this.follow(|| {
                let peer = peer.clone();
                async move { peer.notify_tool_list_changed().await.is_ok() }
            })
            .await;
        });
    }

    /// At 2026-07-28, tool list changes are told on a
    /// `subscriptions/listen` that asks for them.
    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        if context.accepted().tools_list_changed != Some(true) {
            context.cancelled().await;
            return Ok(());
        }
        let sink = context.sink().clone();
        let follow = self.follow(|| {
            let sink = sink.clone();
            async move { sink.notify_tool_list_changed().await.is_ok() }
        });
        tokio::select! {
            () = follow => {}
            () = context.cancelled() => {}
        }
        Ok(())
    }

    /// A request the SDK could not read as its method's reaches here as a
    /// custom one: for a method this server serves, its params were
    /// malformed (`-32602`, not "method not found", which would tell the
    /// client the method is not served); any other is not served.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        let method = request.method;
        match SERVED.iter().find(|(m, _)| *m == method) {
            Some((_, expected)) => Err(ErrorData::invalid_params(
                format!("{method}: malformed params (expected {expected})"),
                None,
            )),
            None => Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("method not found: {}", method.chars().take(64).collect::<String>()),
                None,
            )),
        }
    }

    /// A call the client cancels is dropped: its connection to the daemon
    /// closes, and the daemon kills the run.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let written = serde_json::to_string(&context.id).ok().and_then(|id| self.calls.take(&id));
        tokio::select! {
            result = self.call(&request, written) => result.map(Into::into),
            () = context.ct.cancelled() => {
                Err(ErrorData::internal_error("the call was cancelled", None))
            }
        }
    }
}

/// A run report (200) as a `tools/call` result; the text content is the
/// result as the skill printed it (`raw`, from the answer's text).
fn report_result(report: &Value, raw: Option<RawJson>) -> CallToolResult {
    let outcome = report["outcome"].as_str().unwrap_or("unknown");
    if outcome == "ok" {
        let result = report.get("result").cloned().unwrap_or(Value::Null);
        let mut text = match raw {
            Some(raw) => raw.get().to_owned(),
            None => serde_json::to_string(&result).unwrap_or_default(),
        };
        if text.len() > MAX_TEXT_COPY {
            // As text the result is escaped into a JSON string beside its
            // structured copy: three times its size on one line, past what
            // clients read (rmcp's own: 16 MiB).
            text = format!(
                "the result ({} bytes of JSON) is in structuredContent{}",
                text.len(),
                if result.is_object() { "" } else { " as {\"result\": ...}" }
            );
        }
        let structured = match result {
            Value::Object(_) => result,
            other => json!({"result": other}),
        };
        return tool_result(text, structured, false);
    }
    let mut text =
        format!("skill {} failed: outcome {outcome}", report["skill"].as_str().unwrap_or("?"));
    if let Some(code) = report["exit_code"].as_i64() {
        text.push_str(&format!(", exit code {code}"));
    }
    if let Some(signal) = report["signal"].as_i64() {
        text.push_str(&format!(", signal {signal}"));
    }
    if let Some(e) = report["error"].as_str() {
        text.push_str(&format!("\nerror: {e}"));
    }
    let stderr = report["stderr"].as_str().unwrap_or_default();
    if !stderr.is_empty() {
        text.push_str(&format!("\nstderr:\n{stderr}"));
    }
    let structured = json!({
        "skill": report["skill"],
        "outcome": outcome,
        "error": report["error"],
        "exit_code": report["exit_code"],
        "signal": report["signal"],
        "stderr": stderr,
        "duration_ms": report["duration_ms"],
    });
    tool_result(text, structured, true)
}

/// Why `structured` does not conform to `schema` (`None`: it does; a
/// schema that does not compile is not held against the result).
fn nonconforming(schema: &JsonObject, structured: &Value) -> Option<String> {
    let schema = Value::Object(schema.clone());
    let validator = jsonschema::validator_for(&schema).ok()?;
    // A message may quote the whole value that failed (up to the
    // result's 16 MiB): each is cut.
    let errors: Vec<String> = validator
        .iter_errors(structured)
        .take(3)
        .map(|e| {
            let text = format!("{}: {e}", e.instance_path());
            match text.char_indices().nth(MAX_SCHEMA_ERROR_CHARS) {
                Some((at, _)) => format!("{}...", &text[..at]),
                None => text,
            }
        })
        .collect();
    (!errors.is_empty()).then(|| {
        format!("the result does not match the tool's outputSchema ({})", errors.join("; "))
    })
}

/// `CODE: message` of an error answer, with its violations.
fn daemon_message(r: &ApiResponse) -> String {
    let e = &r.body["error"];
    let code = e["code"].as_str().unwrap_or("error");
    let mut text = match e["message"].as_str() {
        Some(m) => format!("{code}: {m}"),
        None => format!("{code}: HTTP {}", r.status),
    };
    if let Some(reason) = e["reason"].as_str() {
        text.push_str(&format!(" (reason: {reason})"));
    }
    for v in e["violations"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let path = v["path"].as_str().filter(|p| !p.is_empty()).unwrap_or("(args)");
        text.push_str(&format!("\n  {path}: {}", v["message"].as_str().unwrap_or_default()));
    }
    text
}

#[cfg(test)]
mod tests;
