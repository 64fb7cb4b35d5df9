//! One MCP pack's server: started in the full box (the same plan, slot,
//! cgroup leaf with its limits, Landlock, seccomp, rlimits, run-as user and
//! egress allowlist as a run), spoken to over its stdio, cut off and
//! restarted.
//!
//! Life: started on the first call (or at start for `"start": "eager"`),
//! `initialize` and `tools/list` within the pack's `timeout_seconds`. A
//! call to a tool the server did not list is refused without reaching it.
//! A call that fails on the connection (timeout, flood, garbage, the
//! server gone) kills the server's whole cgroup and answers with a clear
//! outcome; the next call starts it again, after a backoff when starts keep
//! failing ([`backoff`]). [`Server::stop_if_idle`] stops it after the pack's
//! `idle_seconds` without a call; [`Server::stop`] on drain. Its output is
//! read all the time ([`crate::mcp::reader`]): a tool list change it says
//! while idle is listed again by [`Server::refresh`], called as soon as the
//! reader sees it. Its stderr is
//! read and dropped: a server may print its environment there.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use policy::report::SandboxReport;
use policy::wire::McpToolInfo;
use policy::{LimitKind, Outcome, RawJson, RunReport};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::sync::Notify;

use crate::host::instance::PgidRecord;
use crate::mcp::client::{Conn, Tool};
use crate::mcp::error::ConnError;
use crate::mcp::secrets::Secrets;
use crate::run::egress;
use crate::run::plan::{euid, Located, Plan};
use crate::run::spawn::{self, Prepared, Slot};
use crate::sys::process::Exit;
use crate::Engine;

/// The first wait before another start after a failed one; doubled per
/// failure up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The longest wait between starts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a stopped server is given to exit after its stdin is closed
/// (and SIGTERM) before its cgroup is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// The wait before the next start after `failures` failed starts in a row.
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    FIRST_BACKOFF.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(MAX_BACKOFF)
}

/// A started server.
#[derive(Debug)]
struct Running {
    conn: Conn,
    pid: i32,
    /// Without a cgroup, its process group, recorded for the watchdog.
    pgid: Option<PgidRecord>,
    prep: Prepared,
    plan: Plan,
    tools: Vec<Tool>,
    stderr: tokio::task::JoinHandle<()>,
}

/// One pack's server, started or not.
#[derive(Debug)]
pub struct Server {
    manifest: PathBuf,
    running: Option<Running>,
    failures: u32,
    retry_at: Option<Instant>,
    last_used: Instant,
    starts: u64,
    /// The tools of its last listing, kept across restarts: what a new
    /// listing is compared with.
    known: Option<Vec<Tool>>,
    /// Moves each time a listing differs from the one before.
    generation: u64,
    /// Woken when its running server says its tools changed.
    changed: Arc<Notify>,
}

/// The first generation of every server of this executor, and the start
/// of its count of moves: its start time in nanoseconds, so that the
/// numbers of a restarted executor differ from (and exceed) those its
/// callers saw before.
pub(crate) fn first_generation() -> u64 {
    static FIRST: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *FIRST.get_or_init(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        now.map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    })
}

/// Why a server could not be started: the report of the call that wanted it.
type Refused = Box<RunReport>;

fn refused(skill: &str, outcome: Outcome, error: impl Into<String>) -> Refused {
    Box::new(RunReport::not_run(skill, outcome, error))
}

impl Server {
    /// A server for the pack at `manifest`, not started; `changed` is
    /// woken whenever it says its tools changed (whoever waits on it
    /// lists them again: [`Server::refresh`]).
    pub fn new(manifest: &Path, changed: Arc<Notify>) -> Self {
        Server {
            manifest: manifest.to_owned(),
            running: None,
            failures: 0,
            retry_at: None,
            last_used: Instant::now(),
            starts: 0,
            known: None,
            generation: first_generation(),
            changed,
        }
    }

    /// The generation of its tool list: moves each time a listing (at a
    /// start, or after `notifications/tools/list_changed`) differs from
    /// the one before. The executor's answers carry it so that a caller
    /// that registered the tools at another generation lists them again.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Takes `tools` as the server's list, moving the generation when it
    /// differs from the last listing.
    fn listed(&mut self, tools: Vec<Tool>) {
        if self.known.as_ref().is_some_and(|k| *k != tools) {
            self.generation = self.generation.wrapping_add(1);
        }
        if let Some(run) = self.running.as_mut() {
            run.tools.clone_from(&tools);
        }
        self.known = Some(tools);
    }

    /// Whether its running server said its tools changed since their last
    /// listing, or its connection ended: [`Server::refresh`] lists them
    /// again, or cuts it off.
    pub fn wants_refresh(&self) -> bool {
        self.running.as_ref().is_some_and(|r| r.conn.list_changed() || r.conn.ended())
    }

    /// The names of the tools of its last listing (not started by this).
    pub fn known_tools(&self) -> Vec<String> {
        self.known.iter().flatten().map(|t| t.name.clone()).collect()
    }

    /// How many times it was started.
    pub fn starts(&self) -> u64 {
        self.starts
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.running.as_ref().map(|r| r.pid)
    }

    /// The tools it listed, starting it when needed.
    ///
    /// # Errors
    ///
    /// The report of the failed start.
    pub async fn tools(&mut self, engine: &Engine) -> Result<Vec<Tool>, Refused> {
        // A server found broken here is started again by `ensure`.
        if self.catch_up().await.is_err() {
            self.cut_off(engine).await;
        }
        self.ensure(engine).await?;
        self.last_used = Instant::now();
        Ok(self.running.as_ref().map(|r| r.tools.clone()).unwrap_or_default())
    }

    /// The tools it listed as the wire's `mcp_tools` answers them: with the
    /// skill each is registered as and its class.
    ///
    /// # Errors
    ///
    /// The report of the failed start.
    /// A `"start": "lazy"` pack's server started only for this listing is
    /// stopped again: it starts on its first call. An `"eager"` one stays
    /// (skilld lists every pack when it starts).
    pub async fn tool_infos(&mut self, engine: &Engine) -> Result<Vec<McpToolInfo>, Refused> {
        let was_running = self.running.is_some();
        let last_used = self.last_used;
        let tools = self.tools(engine).await?;
        // Listing a running server is not a use: a server that keeps
        // changing its list (each change makes skilld list it) still stops
        // after its idle time.
        if was_running {
            self.last_used = last_used;
        }
        let Some(run) = self.running.as_ref() else { return Ok(Vec::new()) };
        let manifest = &run.plan.manifest;
        let pack = manifest.name().as_str();
        let Some(spec) = manifest.mcp() else { return Ok(Vec::new()) };
        let lazy = spec.start == policy::mcp::Start::Lazy;
        let infos = tools
            .into_iter()
            .map(|t| McpToolInfo {
                skill: skill_name(pack, &t.name),
                class: spec.class_of(&t.name, manifest.class()),
                name: t.name,
                description: t.description,
                input_schema: t.input_schema,
            })
            .collect();
        if lazy && !was_running {
            self.stop(engine).await;
        }
        Ok(infos)
    }

    /// Calls `tool` with `args` (a JSON object): the report's result is the
    /// tool's result (`content`, `isError`, `structuredContent`) and its
    /// `sandbox` the box the server runs in.
    pub async fn call(&mut self, engine: &Engine, tool: &str, args: Value) -> RunReport {
        self.call_with_progress(engine, tool, args, &mut |_| {}).await
    }

    /// [`Server::call`], handing each progress notification of the call
    /// to `progress` as a line ([`crate::mcp::client::progress_line`]).
    pub async fn call_with_progress(
        &mut self,
        engine: &Engine,
        tool: &str,
        args: Value,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> RunReport {
        let started = Instant::now();
        let mut report = self.call_inner(engine, tool, args, progress).await;
        report.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_used = Instant::now();
        report
    }

    async fn call_inner(
        &mut self,
        engine: &Engine,
        tool: &str,
        args: Value,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> RunReport {
        if let Err(r) = self.ensure(engine).await {
            return RunReport { skill: skill_name(&r.skill, tool), ..*r };
        }
        let caught_up = self.catch_up().await;
        let Some(run) = self.running.as_mut() else {
            return RunReport::not_run(tool, Outcome::SpawnFailed, "the server is not running");
        };
        let skill = skill_name(run.plan.manifest.name().as_str(), tool);
        let sandbox = Some(run.prep.report.clone());
        if let Err(e) = caught_up {
            let exit = self.cut_off(engine).await;
            return cut_off_report(skill, &e, exit, sandbox);
        }
        if !run.tools.iter().any(|t| t.name == tool) {
            let why = format!("the server did not list a tool named {tool:?}");
            return RunReport { sandbox, ..RunReport::not_run(skill, Outcome::Rejected, why) };
        }
        if !args.is_object() {
            let why = "args must be a JSON object";
            return RunReport { sandbox, ..RunReport::not_run(skill, Outcome::InvalidArgs, why) };
        }
        let timeout = run.plan.manifest.timeout();
        let params = json!({"name": tool, "arguments": args});
        let answer = run.conn.request_with_progress("tools/call", params, timeout, progress).await;
        // A tool's result is an object (`content`, `isError`, ...).
        let answer = answer.and_then(|r| match r {
            Value::Object(o) => Ok(o),
            _ => Err(ConnError::Malformed { method: "tools/call", reason: "not an object".into() }),
        });
        // The server said its tools changed: listed again before the next
        // call; a listing that breaks the connection cuts it off after this
        // call's answer.
        let mut broken = false;
        if answer.is_ok() && run.conn.list_changed() {
            match run.conn.list_tools(timeout).await {
                Ok(tools) => self.listed(tools),
                Err(e) => broken = !e.keeps_connection(),
            }
        }
        match answer {
            Ok(mut result) => {
                if broken {
                    self.cut_off(engine).await;
                }
                let mut r = RunReport::not_run(skill, Outcome::Ok, "");
                r.error = None;
                let is_error = result.get("isError").and_then(Value::as_bool).unwrap_or(false);
                result.insert("isError".to_owned(), Value::Bool(is_error));
                r.result = Some(RawJson::from_value(&Value::Object(result)));
                r.sandbox = sandbox;
                r
            }
            Err(e) if e.keeps_connection() => {
                let outcome = match &e {
                    ConnError::Rpc { code: -32602, .. } => Outcome::InvalidArgs,
                    _ => Outcome::InvalidResult,
                };
                RunReport { sandbox, ..RunReport::not_run(skill, outcome, e.to_string()) }
            }
            Err(e) => {
                let exit = self.cut_off(engine).await;
                cut_off_report(skill, &e, exit, sandbox)
            }
        }
    }

    /// Checks the running server's connection (its reader found it gone or
    /// breaking the protocol: [`Conn::check`]) and lists its tools again
    /// when it said they changed, so that a call is checked against its
    /// latest list.
    async fn catch_up(&mut self) -> Result<(), ConnError> {
        let Some(run) = self.running.as_mut() else { return Ok(()) };
        run.conn.check()?;
        if !run.conn.list_changed() {
            return Ok(());
        }
        match run.conn.list_tools(run.plan.manifest.timeout()).await {
            Ok(tools) => {
                self.listed(tools);
                Ok(())
            }
            Err(e) if e.keeps_connection() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Lists the running server's tools again when it said they changed
    /// (a `notifications/tools/list_changed` read while it was idle, or
    /// during a call): the generation moves when the list differs. A server
    /// found broken is cut off (the next call starts it again). Not a use:
    /// the idle deadline stays.
    pub async fn refresh(&mut self, engine: &Engine) {
        if self.catch_up().await.is_err() {
            self.cut_off(engine).await;
        }
    }

    /// Starts the server unless it runs; refused while a backoff runs.
    async fn ensure(&mut self, engine: &Engine) -> Result<(), Refused> {
        if self.running.is_some() {
            return Ok(());
        }
        let name = self.pack_name();
        if let Some(at) = self.retry_at.filter(|at| *at > Instant::now()) {
            let wait = at.saturating_duration_since(Instant::now());
            let why = format!("the server failed to start; next start in {} ms", wait.as_millis());
            return Err(refused(&name, Outcome::SpawnFailed, why));
        }
        match start(engine, &self.manifest, Arc::clone(&self.changed)).await {
            Ok(run) => {
                let tools = run.tools.clone();
                self.running = Some(run);
                self.listed(tools);
                self.starts += 1;
                self.failures = 0;
                self.retry_at = None;
                Ok(())
            }
            Err(r) => {
                self.failures = self.failures.saturating_add(1);
                self.retry_at = Some(Instant::now() + backoff(self.failures));
                Err(r)
            }
        }
    }

    fn pack_name(&self) -> String {
        let dir = self.manifest.parent().and_then(Path::file_name);
        dir.map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// Kills the server's whole tree at once; its exit when it could be
    /// collected.
    async fn cut_off(&mut self, engine: &Engine) -> Option<Exit> {
        let run = self.running.take()?;
        Some(end(engine, run, Duration::ZERO).await)
    }

    /// When it is to stop for idleness: its last use plus its pack's
    /// `idle_seconds`; `None` while it is not running.
    pub fn idle_deadline(&self) -> Option<Instant> {
        let spec = self.running.as_ref()?.plan.manifest.mcp()?;
        Some(self.last_used + spec.idle)
    }

    /// Stops the server when it had no call for its pack's `idle_seconds`.
    /// Returns whether it stopped it.
    pub async fn stop_if_idle(&mut self, engine: &Engine) -> bool {
        let idle = match self.running.as_ref().and_then(|r| r.plan.manifest.mcp()) {
            Some(spec) => spec.idle,
            None => return false,
        };
        if self.last_used.elapsed() < idle {
            return false;
        }
        self.stop(engine).await;
        true
    }

    /// Stops the server: stdin closed and SIGTERM, then its cgroup killed
    /// after [`STOP_GRACE`].
    pub async fn stop(&mut self, engine: &Engine) {
        if let Some(run) = self.running.take() {
            end(engine, run, STOP_GRACE).await;
        }
    }
}

/// The skill `tool` of `pack` is registered as, `pack.tool`
/// ([`policy::mcp::tool_name`]; spelled so even when that is not a name the
/// loader registers).
fn skill_name(pack: &str, tool: &str) -> String {
    policy::mcp::tool_name(pack, tool).unwrap_or_else(|_| format!("{pack}.{tool}"))
}

/// The report of a call whose server was cut off.
fn cut_off_report(
    skill: String,
    e: &ConnError,
    exit: Option<Exit>,
    sandbox: Option<SandboxReport>,
) -> RunReport {
    let (outcome, limit) = match e {
        ConnError::Timeout(_) => (Outcome::Timeout, Some(LimitKind::WallTime)),
        ConnError::Flood(_) => (Outcome::OutputLimit, Some(LimitKind::Output)),
        ConnError::Garbage | ConnError::Malformed { .. } => (Outcome::InvalidResult, None),
        _ => match exit {
            Some(Exit { code: Some(_), .. }) => (Outcome::ExitNonzero, None),
            _ => (Outcome::Signaled, None),
        },
    };
    let mut r = RunReport::not_run(skill, outcome, format!("{e}; the server was cut off"));
    r.limit = limit;
    r.sandbox = sandbox;
    if matches!(e, ConnError::Closed | ConnError::Write(_)) {
        r.exit_code = exit.and_then(|x| x.code);
        r.signal = exit.and_then(|x| x.signal);
    }
    r
}

/// Plans, boxes, spawns and initializes the pack's server.
async fn start(engine: &Engine, manifest: &Path, changed: Arc<Notify>) -> Result<Running, Refused> {
    let config = engine.config();
    let (spawners, env, reaper) = engine.server_parts();
    let fallback = manifest.parent().and_then(Path::file_name);
    let fallback = fallback.map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let planned =
        Located::open(&config.roots, manifest).and_then(|at| Plan::build_server(config, at, env));
    let mut plan = planned.map_err(|e| {
        let name = e.skill().map_or(fallback, str::to_owned);
        refused(&name, e.outcome(), e.to_string())
    })?;
    let name = plan.manifest.name().to_string();
    add_secrets(config, &mut plan).map_err(|why| refused(&name, Outcome::Rejected, why))?;
    let Some(spec) = plan.manifest.mcp().cloned() else {
        return Err(refused(&name, Outcome::Rejected, "not an MCP server pack"));
    };
    let missing =
        policy::mcp::missing(&spec.env_required, |n| plan.env.iter().any(|(k, _)| k == n));
    if let Some(first) = missing.first() {
        let why = format!("pack \"{name}\": required variable {first} is not set");
        return Err(refused(&name, Outcome::Rejected, why));
    }
    let l = &plan.granted.limits;
    let owner = plan.run_as.switch.then_some((plan.run_as.uid, plan.run_as.gid));
    let failed = |e: spawn::SpawnError| refused(&name, e.outcome(), e.to_string());
    // The grant's names, looked up without holding this worker.
    let resolved = egress::resolve_grant(&plan.granted)
        .await
        .map_err(|source| failed(spawn::SpawnError::Egress { skill: name.to_string(), source }))?;
    let slot =
        Slot::create(config, engine.host(), l.memory_bytes, l.max_pids, owner).map_err(failed)?;
    let mut prep = spawn::prepare(config, engine.host(), &plan, &resolved, slot).map_err(failed)?;
    prep.serve_with(&spec.args).map_err(failed)?;
    let child = match spawn::spawn(&mut prep, &plan.entry, &[], spawners, Duration::ZERO, || ()) {
        Ok(c) => c,
        Err(e) => {
            prep.end_egress();
            let mut r = failed(e);
            r.sandbox = Some(prep.report.clone());
            return Err(r);
        }
    };
    reaper.track(child.pid);
    // Without a cgroup the watchdog kills the server's process group.
    let pgid = prep.cgroup.is_none().then(|| engine.instance().record_pgid(child.pid)).flatten();
    let stderr = tokio::spawn(drain(child.stderr));
    let max_line = usize::try_from(l.stdout_bytes).unwrap_or(usize::MAX);
    let timeout = plan.manifest.timeout();
    // A server's spawn keeps its stdin (`Prepared::serve_with`).
    let conn = match child.stdin {
        Some((stdin, _)) => Conn::new(stdin, child.stdout, max_line, changed),
        None => Err(ConnError::Write("the server's stdin was closed".to_owned())),
    };
    let conn = match conn {
        Ok(conn) => conn,
        Err(e) => {
            let sandbox = Some(prep.report.clone());
            end_tree(engine, (child.pid, pgid), prep, stderr, Duration::ZERO).await;
            let mut r = refused(&name, Outcome::SpawnFailed, e.to_string());
            r.sandbox = sandbox;
            return Err(r);
        }
    };
    let mut run = Running { conn, pid: child.pid, pgid, prep, plan, tools: Vec::new(), stderr };
    let hello = async {
        run.conn.initialize(timeout).await?;
        run.conn.list_tools(timeout).await
    };
    match hello.await {
        Ok(tools) => {
            run.tools = tools;
            Ok(run)
        }
        Err(e) => {
            let sandbox = Some(run.prep.report.clone());
            let exit = end(engine, run, Duration::ZERO).await;
            let mut r = cut_off_report(name, &e, Some(exit), sandbox);
            r.error = Some(format!("the server did not start: {e}"));
            Err(Box::new(r))
        }
    }
}

/// Puts the operator's secrets (`[skills.NAME] env_file`) into the plan's
/// environment: only names the pack allows, each replacing the executor's
/// own value. Errors name the file, never a value.
fn add_secrets(config: &crate::Config, plan: &mut Plan) -> Result<(), String> {
    let grant = config.skills.get(plan.manifest.name().as_str());
    let Some(path) = grant.and_then(|g| g.env_file.as_deref()) else { return Ok(()) };
    let owner = if euid() == 0 { 0 } else { euid() };
    let secrets = Secrets::read(path, owner).map_err(|e| e.to_string())?;
    for (name, value) in secrets.vars() {
        if !plan.manifest.env_allow().contains(name) {
            continue;
        }
        plan.env.retain(|(k, _)| k != name.as_str());
        plan.env.push((name.as_str().to_owned(), value.into()));
    }
    Ok(())
}

/// Reads a server's stderr to its end and drops it.
async fn drain(fd: OwnedFd) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(fd) else {
        return;
    };
    let mut buf = vec![0u8; 16 << 10];
    while matches!(rx.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Ends a server: stdin closed and SIGTERM with `grace` to exit, then its
/// whole cgroup killed; reaped, its allowlist detached, its slot removed.
async fn end(engine: &Engine, run: Running, grace: Duration) -> Exit {
    let Running { conn, pid, pgid, prep, plan: _, tools: _, stderr } = run;
    drop(conn);
    end_tree(engine, (pid, pgid), prep, stderr, grace).await
}

/// [`end`] once the connection is closed.
async fn end_tree(
    engine: &Engine,
    (pid, pgid): (i32, Option<PgidRecord>),
    mut prep: Prepared,
    stderr: tokio::task::JoinHandle<()>,
    grace: Duration,
) -> Exit {
    let (_, _, reaper) = engine.server_parts();
    let gone = |prep: &Prepared| prep.cgroup.as_ref().is_some_and(|c| c.wait_empty(Duration::ZERO));
    if !grace.is_zero() {
        match prep.cgroup.as_ref() {
            Some(cg) => cg.terminate(),
            None => {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        let until = Instant::now() + grace;
        while Instant::now() < until && !gone(&prep) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    match prep.cgroup.as_ref() {
        Some(cg) => {
            cg.kill();
            // Polled here, not slept on in `wait_empty`: this is a runtime
            // thread other connections share.
            let until = Instant::now() + Duration::from_secs(2);
            while !cg.wait_empty(Duration::ZERO) && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        None => {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let mut exit = reaper.collect(pid);
    for _ in 0..200 {
        if exit.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        exit = reaper.collect(pid);
    }
    if exit.is_none() {
        // Reaped later as an orphan, its status parked for no one.
        reaper.forget(pid);
    }
    drop(pgid);
    reaper.reap_orphans();
    stderr.abort();
    prep.end_egress();
    drop(prep);
    exit.unwrap_or(Exit { code: None, signal: None, cpu_us: 0 })
}
