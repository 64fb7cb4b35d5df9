//! `ongrid-skill up [--skills DIR]... [--runtime-dir DIR] [--metrics-listen ADDR]`:
//! the one-command demo. Starts `ongrid-executor serve` as a child process
//! and `ongrid-skilld` in this process, in the foreground, on sockets under
//! a local runtime directory, with the bundled example skills plus any
//! `--skills` packs; prints the lines to try; stops both on Ctrl-C,
//! SIGTERM or SIGHUP (the terminal it runs in closed).
//!
//! # Runtime directory
//!
//! `--runtime-dir`, else `/run/ongrid-up` as root, else
//! `$XDG_RUNTIME_DIR/ongrid-up`, else `/tmp/ongrid-up-$UID`. It must be a
//! directory owned by the current user and not group/world writable (it is
//! created 0755 if missing): it holds the generated `executor.toml`, which
//! a root executor trusts. Inside: `executor.toml`, `executor.sock`,
//! `skilld.sock` and `runs/` (the per-run directories). The sockets and the
//! generated file are removed at exit.
//!
//! # Skills
//!
//! The example packs are looked up at run time: `$ONGRID_EXAMPLES_DIR`,
//! `<bin>/../share/ongrid/examples/skills` (installed binaries),
//! `/usr/share/ongrid/examples/skills`, then the source tree the binary was
//! built from. `--no-examples` leaves them out. Every `--skills DIR` (a root
//! holding packs, or one pack) is added after them; the first skill of a
//! name wins. The same directories are the loader's roots and the
//! executor's allow-list `roots`.
//!
//! # The executor
//!
//! `$ONGRID_EXECUTOR`, else `ongrid-executor` next to this binary, else on
//! `PATH`. Its generated configuration admits only the current uid on its
//! socket (mode 0600), accepts entries owned by root or the current user,
//! and asks for Landlock best effort (every report says what was enforced).
//! It runs with `--stop-on-stdin-eof` and its standard input a pipe whose
//! other end only `up` holds: however `up` ends (SIGKILL included), the
//! executor sees the pipe close and stops, so it never outlives `up` as
//! an orphaned root daemon. As root, skills run as `ongrid-skill` (else
//! `nobody`, with a note); as another user they run as that user, without
//! a cgroup or an identity change, and each report's `sandbox.degraded`
//! says so.
//!
//! # Permissions and audit
//!
//! `--config FILE` reads a `skilld.toml` for its permission and audit keys
//! (`[[callers]]`, `[[approvers]]`, `approval_max_ttl_seconds`,
//! `audit_*`, ...); the sockets, the skill roots, the metrics listener
//! and `audit_db` (`<runtime-dir>/audit.db`) are always `up`'s. With no
//! `[[callers]]` (or no `--config`), the user running `up` is the one
//! caller: role `owner`, mode `dual-sign-required`, may read the audit
//! (dangerous skills still need two configured approvers).
//!
//! # Exit codes
//!
//! 0 after Ctrl-C, SIGTERM or SIGHUP (both daemons stopped, sockets
//! removed), 1 if a daemon could not start or the executor died, 2 on a
//! usage error.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::daemon::config::{CallerEntry, FileConfig, Overrides, Settings, DEFAULT_METRICS_LISTEN};
use crate::daemon::Daemon;
use policy::{PermissionMode, SkillGrant};
use serde::Deserialize;

/// Name of the generated executor configuration in the runtime dir.
pub const EXECUTOR_CONFIG: &str = "executor.toml";
/// Name of the executor socket in the runtime dir.
pub const EXECUTOR_SOCKET: &str = "executor.sock";
/// Name of the audit database in the runtime dir.
pub const AUDIT_DB: &str = "audit.db";
/// Name of the client API socket in the runtime dir.
pub const SKILLD_SOCKET: &str = "skilld.sock";
/// Default runtime dir as root.
pub const ROOT_RUNTIME_DIR: &str = "/run/ongrid-up";
/// Where the packages install the example skills.
pub const INSTALLED_EXAMPLES: &str = "/usr/share/ongrid/examples/skills";
/// The example skills of the source tree this binary was built from.
pub const SOURCE_EXAMPLES: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/examples/skills");

/// How long the executor may take to open its socket.
const EXECUTOR_START: Duration = Duration::from_secs(20);
/// How long the executor may take to stop after SIGTERM (runs finish
/// within their deadlines first) before it is killed, at least: once
/// serving, as long as skilld's drain may wait for its runs
/// (`App::longest_run`, up to `drain_timeout_seconds`) and a margin.
const EXECUTOR_STOP: Duration = Duration::from_secs(45);
/// What the executor gets beyond skilld's drain to answer and stop.
const EXECUTOR_STOP_MARGIN: Duration = Duration::from_secs(5);

/// Arguments of `up`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Exit codes: 0 after Ctrl-C, SIGTERM or SIGHUP, 1 if a daemon could not start
or the executor died, 2 usage error.")]
pub struct Args {
    /// A skill root (a folder of packs, or one pack) to serve besides the
    /// examples; repeatable.
    #[arg(long = "skills", value_name = "DIR")]
    pub skills: Vec<PathBuf>,
    /// Where the sockets, the generated executor.toml and the run dirs go
    /// [default: /run/ongrid-up as root, else $XDG_RUNTIME_DIR/ongrid-up or
    /// /tmp/ongrid-up-$UID].
    #[arg(long, value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,
    /// Metrics listener ADDR:PORT; "" disables it.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_METRICS_LISTEN)]
    pub metrics_listen: String,
    /// Leave out the bundled example skills.
    #[arg(long)]
    pub no_examples: bool,
    /// A skilld.toml whose permission and audit keys ([[callers]],
    /// [[approvers]], approval_max_ttl_seconds, audit_*) apply.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A TOML file of `[skills.NAME]` grants, as in executor.toml, for what
    /// your packs' `sandbox` objects ask (network, fs_read, ...); a grant
    /// here replaces an example's of the same name.
    #[arg(long, value_name = "FILE")]
    pub grants: Option<PathBuf>,
}

/// A start-up failure: the message, and whether it is a usage error.
#[derive(Debug)]
struct Failure {
    usage: bool,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Self {
        Self { usage: true, message: message.into() }
    }

    fn start(message: impl Into<String>) -> Self {
        Self { usage: false, message: message.into() }
    }
}

/// Runs both daemons until Ctrl-C or SIGTERM.
///
/// # Errors
///
/// I/O errors writing `out` or `err`.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let _ = crate::daemon::journald::try_init(
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    );
    let plan = match Plan::new(args, err) {
        Ok(p) => p,
        Err(f) => return fail(&f, err),
    };
    // Its skilld serves from this process (the executor raises its own).
    if let Err(e) = crate::daemon::raise_nofile() {
        tracing::warn!("ongrid-skill up: cannot raise the soft RLIMIT_NOFILE: {e}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let code = runtime.block_on(plan.serve(out, err))?;
    // Requests still being drained must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(code)
}

fn fail(f: &Failure, err: &mut dyn Write) -> io::Result<ExitCode> {
    writeln!(err, "ongrid-skill up: {}", f.message)?;
    Ok(ExitCode::from(if f.usage { 2 } else { 1 }))
}

/// Everything decided before anything starts.
#[derive(Debug)]
struct Plan {
    runtime_dir: PathBuf,
    roots: Vec<PathBuf>,
    executor_bin: PathBuf,
    metrics: Option<SocketAddr>,
    settings: Settings,
    config_text: String,
}

impl Plan {
    fn new(args: &Args, err: &mut dyn Write) -> Result<Self, Failure> {
        let metrics = args.metrics_listen.trim();
        let metrics = if metrics.is_empty() {
            None
        } else {
            Some(metrics.parse::<SocketAddr>().map_err(|e| {
                Failure::usage(format!("--metrics-listen {metrics:?}: {e} (want ADDR:PORT)"))
            })?)
        };
        let mut roots = Vec::new();
        if !args.no_examples {
            match examples_dir() {
                Some(dir) => roots.push(dir),
                None => {
                    let _ = writeln!(
                        err,
                        "ongrid-skill up: note: the example skills were not found \
                         (looked in $ONGRID_EXAMPLES_DIR, {INSTALLED_EXAMPLES} and {SOURCE_EXAMPLES})"
                    );
                }
            }
        }
        for dir in &args.skills {
            let canonical = fs::canonicalize(dir)
                .map_err(|e| Failure::usage(format!("--skills {}: {e}", dir.display())))?;
            if !canonical.is_dir() {
                return Err(Failure::usage(format!("--skills {}: not a directory", dir.display())));
            }
            if !roots.contains(&canonical) {
                roots.push(canonical);
            }
        }
        if roots.is_empty() {
            return Err(Failure::usage("no skill directories: give --skills DIR"));
        }
        let runtime_dir = match &args.runtime_dir {
            Some(dir) => super::dirs::absolute(dir),
            None => default_runtime_dir(),
        };
        let executor_bin = executor_bin().ok_or_else(|| {
            Failure::start(
                "ongrid-executor not found next to this binary nor on PATH \
                 (build it: cargo build --workspace --bins; or set ONGRID_EXECUTOR)",
            )
        })?;
        let run_as = run_as_user(err);
        let mut file = match &args.config {
            Some(path) => FileConfig::load(Some(path)).map_err(|e| {
                Failure::usage(format!("--config {}: {}", path.display(), chain(&e)))
            })?,
            None => FileConfig::default(),
        };
        if file.callers.is_none() {
            file.callers = Some(vec![CallerEntry {
                uid: Some(nix_uid()),
                user: None,
                gid: None,
                group: None,
                role: "owner".into(),
                mode: PermissionMode::DualSignRequired,
                audit: true,
            }]);
        }
        let settings = file
            .resolve(
                Overrides {
                    socket: Some(runtime_dir.join(SKILLD_SOCKET)),
                    executor_socket: Some(runtime_dir.join(EXECUTOR_SOCKET)),
                    metrics_listen: Some(args.metrics_listen.clone()),
                    skills_dirs: roots.clone(),
                    audit_db: Some(runtime_dir.join(AUDIT_DB)),
                },
                Vec::new(),
            )
            .map_err(|e| Failure::usage(e.to_string()))?;
        let grants = match &args.grants {
            Some(path) => read_grants(path).map_err(Failure::usage)?,
            None => BTreeMap::new(),
        };
        let config_text = executor_config(&runtime_dir, &roots, run_as.as_deref(), &grants);
        Ok(Self { runtime_dir, roots, executor_bin, metrics, settings, config_text })
    }

    async fn serve(self, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
        // Handlers first: a signal during start-up stops cleanly too.
        let (mut term, mut int, mut hup) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(t), Ok(i), Ok(h)) => (t, i, h),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                return fail(&Failure::start(format!("signal handlers: {e}")), err)
            }
        };
        if let Err(f) = self.prepare_dir() {
            return fail(&f, err);
        }
        let config_path = self.runtime_dir.join(EXECUTOR_CONFIG);
        let executor_socket = self.runtime_dir.join(EXECUTOR_SOCKET);
        let mut executor = match Command::new(&self.executor_bin)
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            // Stops when this process ends, however it ends: the pipe's
            // write end is `parent_alive`, held until `up` returns.
            .arg("--stop-on-stdin-eof")
            // Its own socket, not one passed to `up`; and only `up` itself
            // may talk to a service manager it runs under.
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env_remove("LISTEN_FDNAMES")
            .stdin(Stdio::piped())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                self.cleanup();
                let f =
                    Failure::start(format!("cannot start {}: {e}", self.executor_bin.display()));
                return fail(&f, err);
            }
        };
        // Never written to; closed (by the kernel if need be) when `up` ends.
        let parent_alive = executor.stdin.take();
        let started = tokio::select! {
            r = wait_for_socket(&mut executor, &executor_socket) => r,
            _ = term.recv() => Err(Failure::start("stopped (SIGTERM) during start-up")),
            _ = int.recv() => Err(Failure::start("stopped (SIGINT) during start-up")),
            _ = hup.recv() => Err(Failure::start("stopped (SIGHUP) during start-up")),
        };
        if let Err(f) = started {
            stop_executor(&mut executor, EXECUTOR_STOP).await;
            self.cleanup();
            return fail(&f, err);
        }
        let daemon = match Daemon::start(&self.settings, None).await {
            Ok(d) => d,
            Err(e) => {
                stop_executor(&mut executor, EXECUTOR_STOP).await;
                self.cleanup();
                let hint = match (&e, self.metrics) {
                    (crate::daemon::StartError::MetricsListen { .. }, Some(_)) => {
                        " (is another ongrid-skilld running? choose another --metrics-listen, or \"\" to disable)"
                    }
                    _ => "",
                };
                let f = Failure::start(format!("ongrid-skilld: {}{hint}", chain(&e)));
                return fail(&f, err);
            }
        };
        let app = Arc::clone(&daemon.app);
        self.print_ready(&app, executor.id(), out)?;
        out.flush()?;

        let shutdown = CancellationToken::new();
        let serving = tokio::spawn(daemon.run(shutdown.clone()));
        let (code, why) = tokio::select! {
            _ = term.recv() => (ExitCode::SUCCESS, "SIGTERM".to_owned()),
            _ = int.recv() => (ExitCode::SUCCESS, "SIGINT".to_owned()),
            _ = hup.recv() => (ExitCode::SUCCESS, "SIGHUP (the terminal closed)".to_owned()),
            st = executor.wait() => (
                ExitCode::FAILURE,
                format!("ongrid-executor exited unexpectedly ({})", describe(st)),
            ),
        };
        tracing::info!("ongrid-skill up: {why}: stopping both daemons");
        // Both at once: the executor lets runs finish within their
        // deadlines while ongrid-skilld drains the requests waiting on them.
        shutdown.cancel();
        let within = EXECUTOR_STOP.max(app.longest_run() + EXECUTOR_STOP_MARGIN);
        let in_flight = app.metrics().runs_in_flight.get();
        if in_flight > 0 {
            let _ = writeln!(
                err,
                "ongrid-skill up: waiting for {in_flight} run(s) in flight to end (at most {} s); \
                 Ctrl-C again to kill them now",
                app.longest_run().as_secs()
            );
        }
        // A second stop signal kills the executor: its watchdog kills the
        // runs and removes their directories and cgroups, and skilld's
        // drain ends with their connections.
        tokio::select! {
            () = stop_executor(&mut executor, within) => {}
            _ = async { tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} } } => {
                tracing::warn!("ongrid-skill up: stopping now; the runs in flight are killed");
                let _ = executor.kill().await;
            }
        }
        drop(parent_alive);
        let _ = serving.await;
        self.cleanup();
        if code == ExitCode::FAILURE {
            writeln!(err, "ongrid-skill up: {why}")?;
        } else {
            writeln!(err, "ongrid-skill up: stopped")?;
        }
        Ok(code)
    }

    /// Creates (or checks) the runtime dir and writes `executor.toml`.
    fn prepare_dir(&self) -> Result<(), Failure> {
        let dir = &self.runtime_dir;
        let io = |what: &str, e: io::Error| {
            Failure::start(format!("runtime dir {}: cannot {what}: {e}", dir.display()))
        };
        if !dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|e| io("create it", e))?;
        }
        let meta = fs::symlink_metadata(dir).map_err(|e| io("inspect it", e))?;
        let uid = nix_uid();
        if !meta.is_dir() {
            return Err(Failure::usage(format!(
                "runtime dir {}: not a directory (a symlink is not accepted)",
                dir.display()
            )));
        }
        if meta.uid() != uid || meta.mode() & 0o022 != 0 {
            return Err(Failure::usage(format!(
                "runtime dir {}: must be owned by uid {uid} and not group/world writable \
                 (owner {}, mode {:o})",
                dir.display(),
                meta.uid(),
                meta.mode() & 0o7777
            )));
        }
        for name in [SKILLD_SOCKET, EXECUTOR_SOCKET] {
            let path = dir.join(name);
            if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket())
                && !crate::daemon::server::SocketNode::nobody_listens(&path)
            {
                return Err(Failure::start(format!(
                    "{} answers: another `ongrid-skill up` (or daemon) uses this runtime dir; \
                     stop it or pass another --runtime-dir",
                    path.display()
                )));
            }
        }
        let path = dir.join(EXECUTOR_CONFIG);
        let _ = fs::remove_file(&path);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
            .map_err(|e| io("write executor.toml", e))?;
        file.write_all(self.config_text.as_bytes()).map_err(|e| io("write executor.toml", e))?;
        Ok(())
    }

    /// Removes the sockets and the generated file (not the directory's
    /// other contents).
    fn cleanup(&self) {
        for name in [SKILLD_SOCKET, EXECUTOR_SOCKET] {
            let path = self.runtime_dir.join(name);
            if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = fs::remove_file(&path);
            }
        }
        let _ = fs::remove_file(self.runtime_dir.join(EXECUTOR_CONFIG));
    }

    fn print_ready(
        &self,
        app: &crate::daemon::app::App,
        executor_pid: Option<u32>,
        out: &mut dyn Write,
    ) -> io::Result<()> {
        let snapshot = app.registry().current();
        let names: Vec<String> = snapshot.iter().map(|s| s.name().to_owned()).collect();
        let sock = self.runtime_dir.join(SKILLD_SOCKET);
        let sock = shell_quote(&sock.display().to_string());
        let me = std::env::current_exe()
            .ok()
            .map_or_else(|| "ongrid-skill".to_owned(), |p| p.display().to_string());
        let me = shell_quote(&me);
        let pid = executor_pid.map_or_else(|| "?".to_owned(), |p| p.to_string());
        writeln!(out, "ongrid-skill up: ready")?;
        if is_root() {
            writeln!(out, "  executor   pid {pid}, as root")?;
        } else {
            writeln!(
                out,
                "  executor   pid {pid}, as uid {} (not root: skills keep this uid and get no \
                 cgroup; each report's sandbox.degraded says what was not enforced)",
                nix_uid()
            )?;
        }
        writeln!(out, "  registry   {} skills: {}", names.len(), names.join(", "))?;
        for root in &self.roots {
            writeln!(out, "  skills     {}", root.display())?;
        }
        writeln!(out, "  runtime    {}", self.runtime_dir.display())?;
        writeln!(out, "  audit      {}", self.settings.audit.db.display())?;
        let me_caller = app.authz().identify(&crate::daemon::connection::Caller {
            uid: nix_uid(),
            gid: nix::unistd::getgid().as_raw(),
            pid: None,
        });
        writeln!(
            out,
            "  you        uid {}: role {}, {} ({} approvers configured)",
            me_caller.uid,
            me_caller.role,
            me_caller.mode,
            app.authz().approvers().len()
        )?;
        if let Some(m) = self.metrics {
            writeln!(out, "  metrics    http://{m}/metrics")?;
        }
        writeln!(out)?;
        writeln!(out, "Try:")?;
        writeln!(out, "  curl --unix-socket {sock} http://localhost/v1/skills")?;
        let pick = |wanted: &str| names.iter().find(|n| *n == wanted).cloned();
        let skill = try_skill(snapshot.iter().map(|s| s.registered().manifest()));
        if let Some(skill) = &skill {
            writeln!(
                out,
                "  curl --unix-socket {sock} -d '{{\"args\":{{}}}}' http://localhost/v1/skills/{skill}/execute"
            )?;
        }
        writeln!(out, "  {me} list --socket {sock}")?;
        if let Some(skill) = &skill {
            writeln!(out, "  {me} run {skill} --socket {sock}")?;
        }
        if pick("echo").is_some() {
            writeln!(out, "  {me} run echo --args '{{\"message\":\"hi\"}}' --socket {sock}")?;
        }
        if let Some(m) = self.metrics {
            writeln!(out, "  curl http://{m}/metrics")?;
        }
        writeln!(out)?;
        writeln!(out, "Ctrl-C stops both daemons.")?;
        Ok(())
    }
}

/// The skill the printed run lines suggest, which send `{}` as its args:
/// `host_load` when served, else the first `safe` skill whose schema takes
/// `{}` (a skill with a required argument would answer the pasted line with
/// a 400, a `mutating` or `dangerous` one with a 403); none if no skill does.
fn try_skill<'a>(manifests: impl IntoIterator<Item = &'a policy::Manifest>) -> Option<String> {
    let takes_empty = |m: &policy::Manifest| {
        m.class() == policy::SkillClass::Safe
            && crate::scan::validators::compile(m.schema())
                .is_ok_and(|v| v.is_valid(&serde_json::json!({})))
    };
    let fits: Vec<&policy::Manifest> = manifests.into_iter().filter(|m| takes_empty(m)).collect();
    let host_load = fits.iter().find(|m| m.name().as_str() == "host_load");
    host_load.or_else(|| fits.first()).map(|m| m.name().as_str().to_owned())
}

/// The error and its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn describe(st: io::Result<ExitStatus>) -> String {
    match st {
        Ok(st) => st.to_string(),
        Err(e) => e.to_string(),
    }
}

/// Waits until the executor accepts connections on `socket`.
async fn wait_for_socket(child: &mut Child, socket: &Path) -> Result<(), Failure> {
    let deadline = Instant::now() + EXECUTOR_START;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(Failure::start(format!(
                "ongrid-executor exited during start-up ({st}); see its messages above"
            )));
        }
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Failure::start(format!(
                "ongrid-executor did not open {} within {}s",
                socket.display(),
                EXECUTOR_START.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// SIGTERM to the executor, then wait (SIGKILL after `within`).
async fn stop_executor(child: &mut Child, within: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(within, child.wait()).await.is_err() {
        tracing::warn!("ongrid-executor did not stop within {within:?}; killing it");
        let _ = child.kill().await;
    }
}

fn nix_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn is_root() -> bool {
    nix_uid() == 0
}

/// The default runtime directory (see the module docs).
pub fn default_runtime_dir() -> PathBuf {
    if is_root() {
        return PathBuf::from(ROOT_RUNTIME_DIR);
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(x) if Path::new(&x).is_absolute() => Path::new(&x).join("ongrid-up"),
        _ => PathBuf::from(format!("/tmp/ongrid-up-{}", nix_uid())),
    }
}

/// The example skills directory (see the module docs), canonical.
pub fn examples_dir() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("ONGRID_EXAMPLES_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    if let Some(bin_dir) = std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_owned))
    {
        candidates.push(bin_dir.join("../share/ongrid/examples/skills"));
    }
    candidates.push(PathBuf::from(INSTALLED_EXAMPLES));
    candidates.push(PathBuf::from(SOURCE_EXAMPLES));
    candidates.into_iter().find_map(|c| fs::canonicalize(c).ok().filter(|c| c.is_dir()))
}

/// `ongrid-executor`: `$ONGRID_EXECUTOR`, next to this binary, or on PATH.
pub fn executor_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ONGRID_EXECUTOR") {
        return Some(PathBuf::from(p));
    }
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("ongrid-executor")))
        .filter(|p| p.is_file());
    sibling.or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("ongrid-executor"))
                .find(|p| p.is_file() && p.is_absolute())
        })
    })
}

/// The user name of `uid`.
fn user_name(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok().flatten().map(|u| u.name)
}

fn user_exists(name: &str) -> bool {
    nix::unistd::User::from_name(name).ok().flatten().is_some()
}

/// As root: the user skills run as (`ongrid-skill`, else `nobody`).
fn run_as_user(err: &mut dyn Write) -> Option<String> {
    if !is_root() {
        return None;
    }
    if user_exists("ongrid-skill") {
        return None;
    }
    if user_exists("nobody") {
        let _ = writeln!(
            err,
            "ongrid-skill up: note: user ongrid-skill does not exist; skills run as nobody \
             (create it: useradd --system --user-group --no-create-home --shell /usr/sbin/nologin ongrid-skill)"
        );
        return Some("nobody".to_owned());
    }
    None
}

fn toml_str(s: &str) -> String {
    // A TOML basic string is a JSON string for our purposes.
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The `[skills.NAME]` grants of `--grants FILE`, each checked as the
/// executor will read it (a field it does not know, a bad name, a file
/// with any other key are refused here, naming the file).
fn read_grants(path: &Path) -> Result<BTreeMap<String, toml::Table>, String> {
    let at = |e: &dyn std::fmt::Display| format!("--grants {}: {e}", path.display());
    let text = fs::read_to_string(path).map_err(|e| at(&e))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| at(&e))?;
    let mut grants = BTreeMap::new();
    for (key, value) in table {
        let toml::Value::Table(skills) = value else {
            return Err(at(&format!("{key}: only [skills.NAME] tables may be given")));
        };
        if key != "skills" {
            return Err(at(&format!("[{key}]: only [skills.NAME] tables may be given")));
        }
        for (name, grant) in skills {
            policy::SkillName::new(&name).map_err(|e| at(&format!("[skills.{name}]: {e}")))?;
            // Read as the executor will read it, kept as written.
            SkillGrant::deserialize(grant.clone())
                .map_err(|e| at(&format!("[skills.{name}]: {e}")))?;
            let toml::Value::Table(grant) = grant else {
                return Err(at(&format!("[skills.{name}]: not a table")));
            };
            grants.insert(name, grant);
        }
    }
    Ok(grants)
}

/// The generated `executor.toml`, with the examples' grants and `grants`
/// (which replace an example's of the same name).
fn executor_config(
    runtime_dir: &Path,
    roots: &[PathBuf],
    run_as: Option<&str>,
    grants: &BTreeMap<String, toml::Table>,
) -> String {
    let uid = nix_uid();
    let gid = nix::unistd::getegid().as_raw();
    let roots: Vec<String> = roots.iter().map(|r| toml_str(&r.display().to_string())).collect();
    let mut owners = vec![toml_str("root")];
    if let Some(name) = user_name(uid).filter(|n| n != "root") {
        owners.push(toml_str(&name));
    }
    let mut text = format!(
        "# Generated by `ongrid-skill up`; removed when it stops.\n\
         roots = [{roots}]\n\
         runtime_dir = {runtime}\n\
         socket = {socket}\n\
         socket_owner = \"{uid}\"\n\
         socket_group = \"{gid}\"\n\
         socket_mode = \"0600\"\n\
         allowed_uids = [{uid}]\n\
         allowed_gids = []\n\
         entry_owners = [{owners}]\n\
         landlock = \"best-effort\"\n",
        roots = roots.join(", "),
        runtime = toml_str(&runtime_dir.display().to_string()),
        socket = toml_str(&runtime_dir.join(EXECUTOR_SOCKET).display().to_string()),
        owners = owners.join(", "),
    );
    if let Some(user) = run_as {
        text.push_str(&format!("run_as = {}\n", toml_str(user)));
    }
    text.push_str("\n# The example packs' sandbox requests.\n");
    for (name, grant) in EXAMPLE_GRANTS {
        if !grants.contains_key(name) {
            text.push_str(&format!("[skills.{name}]\n{grant}\n"));
        }
    }
    if !grants.is_empty() {
        let skills: toml::Table =
            grants.iter().map(|(n, g)| (n.clone(), toml::Value::Table(g.clone()))).collect();
        let table = toml::Table::from_iter([("skills".to_owned(), toml::Value::Table(skills))]);
        text.push_str("\n# --grants\n");
        text.push_str(&table.to_string());
    }
    text
}

/// What the bundled example packs ask for in their `sandbox` object, and
/// nothing more (as in `packaging/executor.toml`'s commented examples).
const EXAMPLE_GRANTS: [(&str, &str); 4] = [
    ("probe_tcp", "network = true"),
    ("probe_http", "network = true"),
    ("probe_dns", "network = true"),
    ("tail_file", "fs_read = [\"/var/log\"]"),
];

/// Quotes `s` for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+:,@=".contains(&b)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/run/ongrid-up/skilld.sock"), "/run/ongrid-up/skilld.sock");
        assert_eq!(shell_quote("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn generated_config_names_the_roots_and_sockets() {
        let text = executor_config(
            Path::new("/run/x y"),
            &[PathBuf::from("/a"), PathBuf::from("/b\"c")],
            Some("nobody"),
            &BTreeMap::new(),
        );
        let v: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(v["roots"][1].as_str(), Some("/b\"c"));
        assert_eq!(v["socket"].as_str(), Some("/run/x y/executor.sock"));
        assert_eq!(v["runtime_dir"].as_str(), Some("/run/x y"));
        assert_eq!(v["run_as"].as_str(), Some("nobody"));
        assert_eq!(v["allowed_uids"][0].as_integer(), Some(i64::from(nix_uid())));
        assert_eq!(v["skills"]["probe_tcp"]["network"].as_bool(), Some(true));
        assert_eq!(v["skills"]["tail_file"]["fs_read"][0].as_str(), Some("/var/log"));
        assert!(v["skills"]["tail_file"].get("network").is_none());
    }

    /// `--grants FILE`: its `[skills.NAME]` tables reach the generated
    /// executor.toml, replacing an example's grant of the same name; a file
    /// the executor would refuse is refused here, naming it and the table.
    #[test]
    fn grants_from_a_file_reach_the_executor_config() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("grants.toml");
        fs::write(
            &file,
            "[skills.netprobe_tcp]\nnetwork = true\nmanifest = \"/p/netprobe/SKILL.md\"\n\
             [skills.probe_tcp]\nnetwork = false\nfs_read = [\"/srv\"]\n",
        )
        .unwrap();
        let grants = read_grants(&file).unwrap();
        let text = executor_config(Path::new("/run/x"), &[PathBuf::from("/a")], None, &grants);
        let v: toml::Value = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let skills = &v["skills"];
        assert_eq!(skills["netprobe_tcp"]["network"].as_bool(), Some(true), "{text}");
        assert_eq!(skills["netprobe_tcp"]["manifest"].as_str(), Some("/p/netprobe/SKILL.md"));
        assert_eq!(skills["probe_tcp"]["network"].as_bool(), Some(false), "replaced: {text}");
        assert_eq!(skills["probe_tcp"]["fs_read"][0].as_str(), Some("/srv"));
        assert_eq!(skills["probe_dns"]["network"].as_bool(), Some(true), "the other examples stay");
        assert_eq!(skills["tail_file"]["fs_read"][0].as_str(), Some("/var/log"));

        for (body, needle) in [
            ("[skills.x]\nnetwrk = true\n", "[skills.x]: unknown field `netwrk`"),
            ("run_as = \"root\"\n", "run_as: only [skills.NAME] tables"),
            ("[limits]\nmax_pids = 1\n", "[limits]: only [skills.NAME] tables"),
            ("[skills.Bad-Name]\nnetwork = true\n", "[skills.Bad-Name]"),
            ("[skills.x\n", "TOML parse error"),
        ] {
            fs::write(&file, body).unwrap();
            let e = read_grants(&file).unwrap_err();
            assert!(e.starts_with(&format!("--grants {}: ", file.display())), "{e}");
            assert!(e.contains(needle), "{body}: {e}");
        }
        let e = read_grants(&dir.path().join("none.toml")).unwrap_err();
        assert!(e.contains("No such file"), "{e}");
    }

    #[test]
    fn the_suggested_run_takes_empty_args() {
        let manifest = |name: &str, extra: &str| {
            let text = format!(r#"{{"name":"{name}","description":"d","entry":"run.sh"{extra}}}"#);
            policy::Manifest::from_slice(text.as_bytes(), &policy::ValidateOptions::default())
                .unwrap()
        };
        let required = r#","schema":{"type":"object","required":["who"]}"#;
        let needs_args = manifest("greet", required);
        let mutating = manifest("apply", r#","class":"mutating""#);
        let plain = manifest("zeta", "");
        let host_load = manifest("host_load", "");
        // The first name would answer `{}` with a 400, the second with a 403.
        assert_eq!(try_skill([&needs_args, &mutating, &plain]).as_deref(), Some("zeta"));
        assert_eq!(try_skill([&needs_args, &plain, &host_load]).as_deref(), Some("host_load"));
        assert_eq!(try_skill([&needs_args, &mutating]), None);
        assert_eq!(try_skill([]), None);
    }

    #[test]
    fn source_examples_exist() {
        assert!(examples_dir().is_some());
    }
}
