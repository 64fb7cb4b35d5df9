//! One handler per method of the executor wire.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use policy::wire::{
    self, code, ExecuteParams, McpToolsParams, McpToolsResult, MetricsResult, Request, WireError,
};
use policy::{Outcome, RunReport};
use serde_json::{json, Value};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::context::{ConnCtx, GaugeGuard, Shared, WAITS};
use super::manifests::Checked;
use crate::run::engine::ManifestSource;
use crate::run::lock::relock;

/// Longest session id quoted in logs.
const SESSION_LOG_CHARS: usize = 64;

/// Handles one line (or line error) read from the connection.
pub(super) fn dispatch(ctx: &ConnCtx, item: Result<Vec<u8>, WireError>) {
    let line = match item {
        Ok(line) => line,
        Err(e) => {
            tracing::debug!("executor: {}: {e}", ctx.peer);
            ctx.send(wire::encode_error(&Value::Null, &e));
            return;
        }
    };
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    match wire::decode_line(&line) {
        Err((id, e)) => {
            tracing::debug!("executor: {}: {e}", ctx.peer);
            ctx.send(wire::encode_error(&id, &e));
        }
        // With the longest timeout a run gets here: skilld advertises no
        // longer one to its clients.
        Ok(Request::Ping { id }) => {
            let max = ctx.shared.engine.config().max_timeout_seconds;
            let pong = wire::PingResult { ok: true, max_timeout_seconds: Some(max) };
            ctx.send(wire::encode_result(&id, &pong));
        }
        Ok(Request::Metrics { id }) => {
            let engine = &ctx.shared.engine;
            ctx.shared.metrics.sync_engine(engine.landlock_rulesets(), engine.run_slots());
            ctx.shared.metrics.sync_warm(&engine.warm_stats());
            ctx.shared.metrics.sync_denials(engine.denials().1);
            let text = ctx.shared.metrics.render();
            ctx.send(wire::encode_result(&id, &json!(MetricsResult { text })));
        }
        // A skill the executor grants no warm runs (or does not know)
        // answers null: its name is the caller's, so nothing is minted.
        Ok(Request::Warm { id, skill }) => {
            let stats = ctx.shared.engine.warm_stats();
            let found =
                stats.into_iter().find(|(name, _)| *name == skill).map(|(_, s)| wire::WarmResult {
                    size: s.size,
                    idle: s.idle,
                    hits: s.hits,
                    misses: s.misses,
                    discarded: s.discarded,
                });
            ctx.send(wire::encode_result(&id, &found));
        }
        Ok(Request::WarmDiscard { id }) => {
            let discarded = ctx.shared.engine.discard_warm();
            tracing::info!(
                "executor: {discarded} idle warm runs discarded on request (peer {})",
                ctx.peer
            );
            ctx.send(wire::encode_result(&id, &wire::WarmDiscardResult { discarded }));
        }
        Ok(Request::Execute { id, params }) => {
            // A held run's start is registered before its task runs: the
            // `start` may be the very next line.
            let start = params.hold.then(|| {
                let (tx, rx) = oneshot::channel();
                relock(&ctx.held).insert(id.to_string(), tx);
                rx
            });
            let run_ctx = ctx.clone();
            ctx.runs.spawn(execute(run_ctx, id, params, start));
        }
        Ok(Request::McpTools { id, params }) => {
            let Some(waiting) = may_wait(ctx, &id) else { return };
            let list_ctx = ctx.clone();
            ctx.runs.spawn(async move {
                mcp_tools(list_ctx, id, params).await;
                drop(waiting);
            });
        }
        Ok(Request::McpWatch { id, params }) => {
            let Some(waiting) = may_wait(ctx, &id) else { return };
            let watch_ctx = ctx.clone();
            ctx.runs.spawn(async move {
                mcp_watch(watch_ctx, id, params).await;
                drop(waiting);
            });
        }
        Ok(Request::Start { run }) => match relock(&ctx.held).remove(&run.to_string()) {
            Some(tx) => {
                let _ = tx.send(());
            }
            // Already refused or over, or never held: nothing to start.
            None => tracing::debug!("executor: {}: start for no held run {run}", ctx.peer),
        },
    }
}

/// One of the connection's [`WAITS`] places for an `mcp_tools` or
/// `mcp_watch` request, else `busy` answered.
fn may_wait(ctx: &ConnCtx, id: &Value) -> Option<OwnedSemaphorePermit> {
    let place = ctx.waits.clone().try_acquire_owned().ok();
    if place.is_none() {
        let why = format!("{WAITS} mcp_tools and mcp_watch requests of this connection unanswered");
        tracing::info!("executor: {why} (peer {})", ctx.peer);
        ctx.send(wire::encode_error_code(id, code::BUSY, &why));
    }
    place
}

/// Resolves once a held run may go (`true`) or never will (`false`, and
/// `gave_up` set: the connection closed, the executor is stopping, or
/// `hold_timeout_seconds` passed).
async fn start_signal(
    ctx: &ConnCtx,
    start: Option<oneshot::Receiver<()>>,
    gave_up: &AtomicBool,
) -> bool {
    let Some(rx) = start else { return true };
    // First polled once the run is prepared: counted while it waits.
    let _held = GaugeGuard::new(&ctx.shared.metrics.runs_held);
    let limit = Duration::from_secs(ctx.shared.engine.config().hold_timeout_seconds);
    let go = tokio::select! {
        biased;
        () = ctx.token.cancelled() => false,
        () = ctx.shared.stopping.cancelled() => false,
        r = rx => r.is_ok(),
        () = tokio::time::sleep(limit) => false,
    };
    gave_up.store(!go, Ordering::Relaxed);
    go
}

/// Answers `busy` (JSON-RPC error [`code::BUSY`]) and counts it.
fn busy(ctx: &ConnCtx, id: &Value, skill: &str, why: &str) {
    ctx.shared.metrics.count_outcome(skill, Outcome::Busy);
    tracing::info!("executor: run {skill:?} busy: {why} (peer {})", ctx.peer);
    ctx.send(wire::encode_error_code(id, code::BUSY, why));
}

/// True for the outcomes an operator must see at the default log level
/// (`warn`): a manifest, entry or request the executor refused (with a
/// loader that checks the same rules first, a tamper signal or a
/// configuration mismatch), and a sandbox or spawn that failed.
fn operator_facing(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Rejected | Outcome::Denied | Outcome::SandboxFailed | Outcome::SpawnFailed
    )
}

/// Logs how a run ended: the skill, the outcome and the report's reason,
/// at `warn` for [`operator_facing`] outcomes and `info` otherwise. Never
/// the args, the environment or the result.
fn log_outcome(ctx: &ConnCtx, skill: &str, report: &RunReport, how: &str) {
    // A manifest refused before it was read has no skill name yet; its
    // reason names the manifest.
    let skill = if skill.is_empty() { String::new() } else { format!(" {skill:?}") };
    let reason = report.error.as_deref().unwrap_or("");
    let reason = if reason.is_empty() { String::new() } else { format!(": {reason}") };
    if operator_facing(report.outcome) {
        tracing::warn!("executor: run{skill} {}{reason} ({how}peer {})", report.outcome, ctx.peer);
    } else {
        tracing::info!("executor: run{skill} {}{reason} ({how}peer {})", report.outcome, ctx.peer);
    }
}

/// Answers with a report for a run that never started, and counts it.
fn refuse(ctx: &ConnCtx, id: &Value, skill: &str, report: &RunReport) {
    ctx.shared.metrics.count_outcome(skill, report.outcome);
    log_outcome(ctx, skill, report, "");
    ctx.send(wire::encode_report(id, report));
}

/// `execute`: check, admit, queue, (wait for a held run's start), run,
/// report.
async fn execute(
    ctx: ConnCtx,
    id: Value,
    params: ExecuteParams,
    start: Option<oneshot::Receiver<()>>,
) {
    let key = start.is_some().then(|| id.to_string());
    execute_run(&ctx, &id, params, start).await;
    // However it ended, a start that comes later finds nothing; but a held
    // run given the same id since (which replaced this one's entry, and
    // ended it unstarted) keeps its own.
    if let Some(key) = key {
        let mut held = relock(&ctx.held);
        if held.get(&key).is_some_and(oneshot::Sender::is_closed) {
            held.remove(&key);
        }
    }
}

/// `mcp_tools`: the tools of an MCP server pack, starting its server when
/// needed; a pack that cannot be listed is answered with no tools and the
/// reason.
async fn mcp_tools(ctx: ConnCtx, id: Value, params: McpToolsParams) {
    let shared = &ctx.shared;
    let none = |error| McpToolsResult { tools: Vec::new(), error, generation: None };
    let result = match shared.manifests.check(&params.manifest) {
        Err(report) => none(report.error),
        Ok((checked, _)) => {
            let listed = shared.servers.tool_infos(&shared.engine, &checked.path, gone(&ctx));
            match listed.await {
                Some(Ok((tools, generation))) => {
                    McpToolsResult { tools, error: None, generation: Some(generation) }
                }
                Some(Err(report)) => {
                    log_outcome(&ctx, &checked.name, &report, "listing tools, ");
                    none(report.error)
                }
                None => none(Some("not listed: the executor is shutting down".to_owned())),
            }
        }
    };
    ctx.send(wire::encode_result(&id, &result));
}

/// Resolves once the connection's caller is gone or the executor stops:
/// a use of an MCP pack's server that has not begun is given up then.
async fn gone(ctx: &ConnCtx) {
    tokio::select! {
        () = ctx.token.cancelled() => {}
        () = ctx.shared.stopping.cancelled() => {}
    }
}

/// `mcp_watch`: answers once a server's tool list generation moved after
/// the count `since`, or when the wait is over (its `timeout_ms`, the
/// executor stopping, the connection closed: then nobody reads it).
async fn mcp_watch(ctx: ConnCtx, id: Value, params: wire::McpWatchParams) {
    let ms = params.timeout_ms.unwrap_or(wire::DEFAULT_MCP_WATCH_MS).min(wire::MAX_MCP_WATCH_MS);
    let stop = async {
        tokio::select! {
            () = ctx.token.cancelled() => {}
            () = ctx.shared.stopping.cancelled() => {}
        }
    };
    let moves = ctx.shared.servers.watch(params.since, Duration::from_millis(ms), stop).await;
    let packs = moves
        .packs
        .into_iter()
        .map(|(m, generation)| wire::McpPackMoved {
            manifest: m.to_string_lossy().into_owned(),
            generation,
        })
        .collect();
    ctx.send(wire::encode_result(&id, &wire::McpWatchResult { changes: moves.changes, packs }));
}

/// `execute` of a tool of an MCP server pack: admitted as a run is (or
/// `busy`), then, after a held call's start, the call goes to the pack's
/// server ([`crate::mcp`]), which takes no run slot (it runs already, its
/// calls take turns); reported as a run, after a `tools_generation`
/// notification. Closing the connection does not
/// cancel a call in flight (the server is mid-request): it ends within the
/// pack's `timeout_seconds`. A call still waiting for its turn at the
/// server is dropped then, and answered `busy` once the executor stops.
async fn call_tool(
    ctx: &ConnCtx,
    id: &Value,
    params: &ExecuteParams,
    start: Option<oneshot::Receiver<()>>,
    checked: &Checked,
) {
    let shared = &ctx.shared;
    let skill = checked.name.as_str();
    let args = match policy::Args::from_slice(params.args.get().as_bytes()) {
        Ok(args) => args.value().clone(),
        Err(e) => {
            let report = RunReport::not_run(skill, Outcome::InvalidArgs, format!("args: {e}"));
            return refuse(ctx, id, skill, &report);
        }
    };
    let Ok(admitted) = shared.admission.clone().try_acquire_owned() else {
        return busy(ctx, id, skill, &at_cap(shared));
    };
    let gave_up = AtomicBool::new(false);
    if !start_signal(ctx, start, &gave_up).await {
        if ctx.token.is_cancelled() {
            return;
        }
        let why = "the held run was not started by its caller";
        return refuse(ctx, id, skill, &RunReport::not_run(skill, Outcome::Rejected, why));
    }
    let in_flight = GaugeGuard::new(&shared.metrics.runs_in_flight);
    let started = Instant::now();
    let tool = params.tool.as_deref().unwrap_or_default();
    // The server's progress notifications go out as the call's stderr
    // lines (its stderr itself is dropped: a server may print its
    // environment there).
    let tx = ctx.sender();
    let mut progress = |line: &str| tx.send(wire::encode_stderr(id, line));
    let call = shared.servers.call_with_progress(
        &shared.engine,
        &checked.path,
        tool,
        args,
        &mut progress,
        gone(ctx),
    );
    // The list's generation after the call: the caller lists the tools
    // again when it registered them at another one.
    let Some((report, generation)) = call.await else {
        // Given up while another call held the server: never begun.
        if ctx.token.is_cancelled() {
            tracing::info!(
                "executor: call {skill:?} dropped: its caller left while it waited for the \
                 pack's server (peer {})",
                ctx.peer
            );
            return;
        }
        return busy(ctx, id, skill, "the executor is shutting down");
    };
    ctx.send(wire::encode_tools_generation(id, generation));
    drop(in_flight);
    drop(admitted);
    shared.metrics.record_run(skill, &report, started.elapsed());
    log_outcome(ctx, skill, &report, "");
    ctx.send(wire::encode_report(id, &report));
}

/// A run slot, at once or after waiting in the queue (telling the caller
/// `queued`, then `started`); `None` when the connection closed or the
/// executor began shutting down meanwhile (answered `busy` then).
async fn take_slot(ctx: &ConnCtx, id: &Value, skill: &str) -> Option<OwnedSemaphorePermit> {
    let shared = &ctx.shared;
    match shared.slots.clone().try_acquire_owned() {
        Ok(_) if ctx.token.is_cancelled() => None,
        Ok(slot) => Some(slot),
        // An idle warm run of this skill lends its slot (this run will
        // likely take it); else one of another skill goes for its slot.
        Err(_) => match shared.engine.lend_warm_slot(skill) {
            Some(_) if ctx.token.is_cancelled() => None,
            Some(slot) => Some(slot),
            None => evict_for_slot(ctx, id, skill).await,
        },
    }
}

/// A slot freed by killing an idle warm run, else one waited for in the
/// queue ([`queue_for_slot`]).
async fn evict_for_slot(ctx: &ConnCtx, id: &Value, skill: &str) -> Option<OwnedSemaphorePermit> {
    let shared = &ctx.shared;
    if shared.engine.evict_warm() {
        if let Ok(slot) = shared.slots.clone().try_acquire_owned() {
            return (!ctx.token.is_cancelled()).then_some(slot);
        }
    }
    queue_for_slot(ctx, id, skill).await
}

/// Waits in the queue for a run slot, telling the caller `queued`, then
/// `started`; `None` as for [`take_slot`].
async fn queue_for_slot(ctx: &ConnCtx, id: &Value, skill: &str) -> Option<OwnedSemaphorePermit> {
    let shared = &ctx.shared;
    // Counted while it waits: a warm run made meanwhile gives it its slot.
    let _waiting = shared.engine.wait_for_warm_slot();
    ctx.send(wire::encode_queued(id));
    let slot = tokio::select! {
        biased;
        () = ctx.token.cancelled() => {
            tracing::info!(
                "executor: run {skill:?} cancelled while queued (peer {})",
                ctx.peer
            );
            return None;
        }
        () = shared.stopping.cancelled() => {
            busy(ctx, id, skill, "the executor is shutting down");
            return None;
        }
        // The semaphore is never closed.
        slot = shared.slots.clone().acquire_owned() => slot.ok()?,
    };
    ctx.send(wire::encode_started(id));
    Some(slot)
}

async fn execute_run(
    ctx: &ConnCtx,
    id: &Value,
    params: ExecuteParams,
    start: Option<oneshot::Receiver<()>>,
) {
    let shared = &ctx.shared;
    let session: String =
        params.session_id.as_deref().unwrap_or("-").chars().take(SESSION_LOG_CHARS).collect();
    // The executor's own reading of the manifest: under its roots, valid.
    let (checked, located) = match shared.manifests.check_tool(
        &params.manifest,
        params.tool.as_deref(),
        params.manifest_sha256.as_ref(),
    ) {
        Ok(c) => c,
        Err(report) => return refuse(ctx, id, "", &report),
    };
    let skill = checked.name.as_str();
    if !shared.peers.may_run(ctx.peer.uid, checked.class) {
        let why = format!("peer uid {} may not run {} skills", ctx.peer.uid, checked.class);
        return refuse(ctx, id, skill, &RunReport::not_run(skill, Outcome::Denied, why));
    }
    if let Some(claimed) = params.class.filter(|c| *c != checked.class) {
        let why = format!(
            "the caller authorised class {claimed}, but the manifest declares {}",
            checked.class
        );
        return refuse(ctx, id, skill, &RunReport::not_run(skill, Outcome::Denied, why));
    }
    if shared.stopping.is_cancelled() {
        return busy(ctx, id, skill, "the executor is shutting down");
    }
    if checked.mcp {
        return call_tool(ctx, id, &params, start, &checked).await;
    }
    // Admission: a run slot or a queue place, else busy at once.
    let Ok(admitted) = shared.admission.clone().try_acquire_owned() else {
        return busy(ctx, id, skill, &at_cap(shared));
    };
    let queued = Instant::now();
    let waiting = GaugeGuard::new(&shared.metrics.runs_queued);
    // A run that has to wait says so, and says when it starts: the
    // caller's clock for the skill's timeout must not count the wait.
    let Some(slot) = take_slot(ctx, id, skill).await else { return };
    drop(waiting);
    let metrics = &shared.metrics;
    metrics.queue_wait_seconds.observe(queued.elapsed().as_secs_f64());
    let in_flight = GaugeGuard::new(&metrics.runs_in_flight);
    let tx = ctx.sender();
    let stderr_id = id.clone();
    let mut sink = move |line: &str| {
        tx.send(wire::encode_stderr(&stderr_id, line));
    };
    // The args as the loader's caller sent them: the JSON text as received,
    // not parsed and encoded again, goes to the skill's stdin.
    let args = params.args.get().as_bytes().to_vec();
    let started = Instant::now();
    let gave_up = AtomicBool::new(false);
    // Polled by this task, on a runtime thread (see the module docs of
    // `server` on the parent-death signal).
    let (report, held, after) = shared
        .engine
        .run_source_then(
            ManifestSource::Located(located),
            args,
            params.tool.as_deref(),
            &mut sink,
            start_signal(ctx, start, &gave_up),
            ctx.token.clone().cancelled_owned(),
        )
        .await;
    let elapsed = started.elapsed().saturating_sub(held);
    drop(slot);
    drop(admitted);
    drop(in_flight);
    if gave_up.load(Ordering::Relaxed) && ctx.token.is_cancelled() {
        // The caller closed the connection instead of starting the run
        // (e.g. its audit row could not be written): nothing ran, and
        // nobody is there to read a report.
        tracing::info!(
            "executor: held run {skill:?} cancelled before its start (peer {})",
            ctx.peer
        );
        return;
    }
    metrics.record_run(skill, &report, elapsed);
    if operator_facing(report.outcome) {
        log_outcome(ctx, skill, &report, &format!("session {session:?}, "));
    } else {
        tracing::info!(
            "executor: run {skill:?} {} in {} ms (peer {}, session {session:?})",
            report.outcome,
            elapsed.as_millis(),
            ctx.peer
        );
    }
    ctx.send(wire::encode_report(id, &report));
    // The run's pipes closed and the janitor woken, once the report is out.
    ctx.after_sent(after);
}

/// Why an `execute` was answered busy at admission.
fn at_cap(shared: &Shared) -> String {
    let config = shared.engine.config();
    format!(
        "the executor is at its cap ({} runs, {} queued)",
        config.max_concurrent_runs, config.max_queued_runs
    )
}
