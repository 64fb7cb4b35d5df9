//! `ongrid-executor`: run one skill under the full sandbox (`run`), or serve
//! the executor wire on a Unix socket (`serve`).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use executor::{Config, Engine, RunRequest};
use policy::Outcome;

const EXIT_CODES: &str = "\
Exit codes of `run`:
   0  ok              the skill exited 0 and printed one JSON value
   1  exit_nonzero    the skill exited with a non-zero status
   2  usage           bad command line
   3  timeout         wall-clock or CPU-time limit (see `limit` in --json)
   4  output_limit    stdout over its cap; the run was killed
   5  rejected        bad manifest, entry, config or sandbox grant
   6  sandbox_failed  a required restriction could not be put in place
   7  signaled        the skill was killed by a signal
   8  invalid_result  exit 0 but stdout is not one JSON value
   9  spawn_failed    the entry could not be executed
  10  invalid_args    --args is not one JSON object
  70  internal error  the executor itself failed";

#[derive(Debug, Parser)]
#[command(name = "ongrid-executor", version, about = "The sandboxing executor of ongrid-skills")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one skill under the full sandbox and print its result.
    #[command(after_help = EXIT_CODES)]
    Run {
        /// The skill's skill.json (or SKILL.md, with --tool).
        #[arg(long)]
        manifest: PathBuf,
        /// For a SKILL.md: the tool to run (as written or as registered).
        #[arg(long)]
        tool: Option<String>,
        /// The args JSON object, or `-` to read it from stdin.
        #[arg(long, default_value = "{}")]
        args: String,
        /// executor.toml (default: /etc/ongrid/executor.toml if it exists).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print the run report (JSON) instead of the result.
        #[arg(long)]
        json: bool,
    },
    /// Serve the executor wire (newline-delimited JSON-RPC 2.0) on the
    /// configured Unix socket until SIGTERM or Ctrl-C, then drain.
    #[command(after_help = SERVE_HELP)]
    Serve {
        /// executor.toml (default: /etc/ongrid/executor.toml if it exists).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

const SERVE_HELP: &str = "\
Socket: `socket` in executor.toml (default <runtime_dir>/executor.sock, i.e.
/run/ongrid/executor.sock as root), owner/group/mode from socket_owner,
socket_group, socket_mode. Peers are checked with SO_PEERCRED against
allowed_uids/allowed_gids. Methods: execute, ping, metrics.
SIGTERM or Ctrl-C: stop accepting, let runs finish within their deadlines,
then exit 0. Exit 70: the configuration, socket or engine could not be set up.";

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
    // The child's cgroup join would otherwise wait for an RCU grace period
    // on the critical path; start that wait now, in the background.
    executor::attach_lock::warm_up();
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
    let engine = Engine::new(config).context("starting the engine")?;
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

fn serve(config: Option<PathBuf>) -> anyhow::Result<u8> {
    let config = load_config(config).context("loading the configuration")?.for_serve();
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
        registry
            .register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
            .context("registering process metrics")?;
        let metrics = Arc::new(executor::Metrics::new(&registry).context("registering metrics")?);
        let engine = Arc::new(Engine::new(config).context("starting the engine")?);
        let socket = engine.config().socket_path();
        let listener = executor::server::bind(engine.config()).context("binding the socket")?;
        eprintln!("ongrid-executor: serving on {}", socket.display());
        executor::server::run(listener, engine, metrics, shutdown_signal()).await;
        executor::server::socket::remove(&socket);
        Ok(0)
    })
}

/// Completes on the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("executor: SIGTERM"),
                _ = int.recv() => tracing::info!("executor: SIGINT"),
            }
        }
        _ => {
            tracing::warn!("executor: cannot listen for signals; falling back to Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
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
    if argv.get(1).is_some_and(|a| a == executor::instance::WATCHDOG_COMMAND) {
        return ExitCode::from(executor::instance::watchdog_main(
            argv.get(2..).unwrap_or_default(),
        ));
    }
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ONGRID_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let result = match cli.command {
        Command::Run { manifest, tool, args, config, json } => {
            run(manifest, tool, args, config, json)
        }
        Command::Serve { config } => serve(config),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("ongrid-executor: {e:#}");
            ExitCode::from(70)
        }
    }
}
