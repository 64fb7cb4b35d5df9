//! `ongrid-executor`: run one skill under the full sandbox (`run`), or serve
//! the executor wire on a Unix socket (`serve`).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use executor::cli::{Cli, Command};
use executor::run::reaper::Reaper;
use executor::{Config, Engine, RunRequest};
use policy::Outcome;
use tracing::Level;

/// `serve` could not start: the configuration is invalid (sysexits'
/// EX_CONFIG; the unit's `RestartPreventExitStatus=78` keeps systemd from
/// restarting into it again and again).
const EX_CONFIG: u8 = 78;
/// `serve` could not start or failed for another reason (EX_SOFTWARE).
const EX_SOFTWARE: u8 = 70;

/// The exit code of a failed command: [`EX_CONFIG`] when executor.toml
/// is at fault (it cannot be read or parsed, a value is out of range, the
/// socket's owner or group does not exist), else [`EX_SOFTWARE`].
fn failure_code(e: &anyhow::Error) -> u8 {
    let config = e.chain().any(|cause| {
        cause.is::<executor::ConfigError>()
            || matches!(
                cause.downcast_ref::<plumbing::socket::SocketError>(),
                Some(plumbing::socket::SocketError::Unknown { .. })
            )
    });
    if config {
        EX_CONFIG
    } else {
        EX_SOFTWARE
    }
}

fn exit_code(outcome: Outcome) -> u8 {
    match outcome {
        Outcome::Ok => 0,
        Outcome::ExitNonzero => 1,
        Outcome::Timeout => 3,
        Outcome::OutputLimit => 4,
        Outcome::Rejected => 5,
        Outcome::SandboxFailed => 6,
        Outcome::Signaled => 7,
        Outcome::InvalidResult => 8,
        Outcome::SpawnFailed => 9,
        Outcome::InvalidArgs => 10,
        Outcome::Denied => 11,
        Outcome::Busy => 12,
    }
}

fn load_config(path: Option<PathBuf>) -> Result<Config, executor::ConfigError> {
    match path {
        Some(p) => Config::load(&p),
        None => {
            let default = PathBuf::from(executor::config::DEFAULT_CONFIG_PATH);
            if default.exists() {
                Config::load(&default)
            } else {
                Ok(Config::default())
            }
        }
    }
}

fn run(
    manifest: PathBuf,
    tool: Option<String>,
    args: String,
    config: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<u8> {
    let args = if args == "-" {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).context("reading args from stdin")?;
        buf
    } else {
        args.into_bytes()
    };
    let config = match load_config(config) {
        Ok(c) => c,
        Err(e) => {
            let report = policy::RunReport::not_run("", Outcome::Rejected, format!("{e:#}"));
            return print(&report, json);
        }
    };
    // Before any thread: capabilities are per thread and inherited.
    executor::host::capabilities::drop_unneeded(&config).context("capabilities")?;
    // The child's cgroup join would otherwise wait for an RCU grace period
    // on the critical path; start that wait now, in the background.
    executor::host::attach_lock::warm_up();
    // One child: the filter is installed in it, no spawner threads.
    let spawners = executor::run::spawn::Spawners::inline();
    let engine = Engine::with_spawners(config, spawners).context("starting the engine")?;
    // The engine made this process a subreaper: its runs' orphans are ours.
    Reaper::global().reap_in_background().context("starting the reaper thread")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the runtime")?;
    let mut sink = |line: &str| eprintln!("{line}");
    let report = rt.block_on(engine.run_tool(
        RunRequest { manifest_path: manifest, args },
        tool.as_deref(),
        &mut sink,
        std::future::pending(),
    ));
    print(&report, json)
}

fn serve(config: Option<PathBuf>, stop_on_stdin_eof: bool) -> anyhow::Result<u8> {
    // Before any thread or child: this edits the environment and marks the
    // inherited socket close-on-exec (the watchdog must not hold it).
    let inherited =
        plumbing::notify::take_listener("ongrid-executor").context("socket activation")?;
    let config = load_config(config).context("loading the configuration")?.for_serve();
    // Before any thread or child: capabilities are per thread and inherited.
    executor::host::capabilities::drop_unneeded(&config).context("capabilities")?;
    // Before anything else is set up: another executor serving on this
    // socket keeps it (binding checks again; this keeps a refused start
    // from touching cgroups or the runs directory first).
    if inherited.is_none() {
        executor::server::socket::ensure_free(&config).context("binding the socket")?;
    }
    warn_missing_users(&config);
    take_cgroup_delegation();
    favor_dynmods(&config);
    // Runs are spawned from the runtime's worker threads, which live as long
    // as the runtime (the children's parent-death signal is tied to the
    // spawning thread; see `executor::server`). Runs also block a worker
    // briefly during cgroup teardown, hence at least 4 workers.
    let workers = std::thread::available_parallelism().map_or(4, |n| n.get().max(4));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("ongrid-executor")
        .enable_all()
        .build()
        .context("building the runtime")?;
    rt.block_on(async {
        let registry = prometheus::Registry::new();
        // Unprefixed `process_*`: the loader renames them when it appends
        // this text to its own /metrics.
        let process = plumbing::process_metrics::ProcessMetrics::for_self("")
            .context("registering process metrics")?;
        registry.register(Box::new(process)).context("registering process metrics")?;
        let metrics = Arc::new(executor::Metrics::new(&registry).context("registering metrics")?);
        let engine = Arc::new(Engine::new(config).context("starting the engine")?);
        Reaper::global().reap_in_background().context("starting the reaper thread")?;
        // Removes the socket node bound here when this block ends, however
        // it ends (a socket systemd passed is its to keep). Declared before
        // the listener, so dropped after it: a node someone still listens
        // on is left alone.
        let mut _node = None;
        let listener = match inherited {
            Some(listener) => {
                let listener = plumbing::notify::into_tokio(listener)
                    .context("the socket passed by systemd")?;
                eprintln!("ongrid-executor: serving on the socket passed by systemd");
                listener
            }
            None => {
                let (listener, node) =
                    executor::server::bind(engine.config()).context("binding the socket")?;
                eprintln!("ongrid-executor: serving on {}", node.path().display());
                _node = Some(node);
                listener
            }
        };
        // SIGTERM and SIGINT are caught from here on, before READY=1: a stop
        // right after readiness is a graceful one, not the default action.
        let signal = shutdown_signal(stop_on_stdin_eof)
            .context("listening for SIGTERM, SIGINT and SIGHUP")?;
        // The socket accepts and the engine is up: runs are served from here.
        plumbing::notify::ready("serving");
        let shutdown = async {
            signal.await;
            plumbing::notify::stopping();
        };
        executor::server::run(listener, engine, metrics, shutdown).await;
        Ok(0)
    })
}

/// Said at start, not only in every run's report: a run-as user that
/// does not exist fails every run as it.
fn warn_missing_users(config: &Config) {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    for user in config.missing_users() {
        plumbing::journald::eprint(
            Level::WARN,
            &format!(
                "ongrid-executor: run-as user {user:?} does not exist: every run as it fails \
                 (sandbox_failed) until it is created (useradd --system --user-group \
                 --no-create-home --shell /usr/sbin/nologin {user}) or executor.toml names \
                 another"
            ),
        );
    }
}

/// A delegated cgroup v2 subtree (systemd Delegate=yes): move into
/// <own>/supervisor so the run cgroups below get pids and memory.
fn take_cgroup_delegation() {
    match executor::host::delegation::take_own() {
        Ok(executor::host::delegation::Delegation::Taken { root, enabled }) => eprintln!(
            "ongrid-executor: cgroup {} delegated: moved into {}/, enabled {} for the runs",
            root.display(),
            executor::host::delegation::SUPERVISOR,
            enabled.join(" ")
        ),
        Ok(other) => tracing::info!("executor: cgroup delegation: {other:?}"),
        Err(e) => plumbing::journald::eprint(
            Level::WARN,
            &format!("ongrid-executor: {e:#}; runs get what the cgroup offers as it is"),
        ),
    }
}

/// Cgroup joins without an RCU grace period after idle gaps.
fn favor_dynmods(config: &Config) {
    use executor::host::dynmods::{self, Favor};
    if !config.cgroup_favordynmods || !nix::unistd::geteuid().is_root() {
        return;
    }
    match dynmods::ensure() {
        Ok(Favor::Enabled(at)) => eprintln!(
            "ongrid-executor: cgroup: remounted {} with {} (runs after an idle gap no \
             longer wait an RCU grace period to join their cgroup; cgroup_favordynmods = \
             false leaves the mounts as they are)",
            at.display(),
            dynmods::OPTION
        ),
        Ok(Favor::Already(at)) => {
            tracing::debug!("executor: cgroup: {} has {}", at.display(), dynmods::OPTION);
        }
        Ok(Favor::NoCgroup) => {}
        Err(e) => tracing::warn!(
            "executor: cgroup: cannot turn on {} ({e}): a run after an idle gap waits an \
             RCU grace period (ms) to join its cgroup; mount a cgroup hierarchy with \
             {0} or boot with cgroup_favordynmods=true",
            dynmods::OPTION
        ),
    }
}

/// Starts listening for SIGTERM and SIGINT now (and, with
/// `stdin_eof`, for the end of standard input); the future completes on
/// the first of them. SIGHUP is logged and otherwise ignored from now on:
/// its default action would end the privileged daemon (a closed terminal,
/// a `pkill -HUP` meant for skilld), and there is nothing to reload.
fn shutdown_signal(stdin_eof: bool) -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let stdin = if stdin_eof { Some(stdin_closed()?) } else { None };
    Ok(async move {
        let parent_gone = async {
            match stdin {
                Some(closed) => drop(closed.await),
                None => std::future::pending().await,
            }
        };
        tokio::pin!(parent_gone);
        loop {
            tokio::select! {
                _ = term.recv() => return tracing::info!("executor: SIGTERM"),
                _ = int.recv() => return tracing::info!("executor: SIGINT"),
                _ = hup.recv() => tracing::warn!(
                    "executor: SIGHUP ignored: executor.toml is read at start; restart the \
                     executor to apply a change (skills and manifests are read at each run)"
                ),
                () = &mut parent_gone => {
                    return tracing::warn!(
                        "executor: standard input closed (the parent is gone): stopping"
                    );
                }
            }
        }
    })
}

/// A receiver that completes when standard input reaches end of file (or
/// fails). Read on a thread of its own, asleep in `read` until then: not a
/// blocking task of the runtime, whose shutdown would wait for it.
fn stdin_closed() -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    use std::io::Read;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("ongrid-stdin".into()).spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 256];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = tx.send(());
    })?;
    Ok(rx)
}

fn print(report: &policy::RunReport, json: bool) -> anyhow::Result<u8> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, report).context("writing the report")?;
        writeln!(out).context("writing the report")?;
    } else if let Some(result) = &report.result {
        // Verbatim: the skill's JSON as it printed it.
        writeln!(out, "{result}").context("writing the result")?;
    } else {
        eprintln!(
            "ongrid-executor: {} {}: {}",
            report.skill,
            report.outcome,
            report.error.as_deref().unwrap_or("")
        );
    }
    Ok(exit_code(report.outcome))
}

fn main() -> ExitCode {
    // The hidden watchdog of an engine instance (see executor::instance).
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == executor::host::instance::WATCHDOG_COMMAND) {
        return ExitCode::from(executor::host::instance::watchdog_main(
            argv.get(2..).unwrap_or_default(),
        ));
    }
    // First: the main thread's stack mapped before the work, so that no
    // instruction of it faults on a page of it (an emulated CPU can come
    // back from such a fault with wrong flags: executor::host::stack).
    executor::host::stack::prefault_main();
    // Before any thread: large buffers (a flooding skill's stdout) on
    // their own mappings, given back when freed.
    executor::map_large_allocations();
    // Before any thread too: SIGCHLD would only wake a thread to drop it,
    // and a stop signal the parent blocked must reach the handlers.
    if let Err(e) = executor::mask_only_sigchld() {
        plumbing::journald::eprint(
            Level::WARN,
            &format!(
                "ongrid-executor: cannot set the signal mask ({e}): each run's exit wakes a \
                 thread, and signals the parent blocked stay blocked"
            ),
        );
    }
    // And before the descriptor floor is decided: systemd's soft 1024.
    let nofile = executor::raise_nofile();
    let cli = Cli::parse();
    // Under systemd, lines for the journal (priorities, no timestamp).
    let _ = plumbing::journald::try_init(
        tracing_subscriber::EnvFilter::try_from_env("ONGRID_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
    );
    match nofile {
        Ok((before, after)) if after > before => {
            tracing::debug!("executor: soft RLIMIT_NOFILE raised from {before} to {after}");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("executor: cannot raise the soft RLIMIT_NOFILE: {e}"),
    }
    let result = match cli.command {
        Command::Run { manifest, tool, args, config, json } => {
            run(manifest, tool, args, config, json)
        }
        Command::Serve { config, stop_on_stdin_eof } => serve(config, stop_on_stdin_eof),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            plumbing::journald::eprint(Level::ERROR, &format!("ongrid-executor: {e:#}"));
            ExitCode::from(failure_code(&e))
        }
    }
}
