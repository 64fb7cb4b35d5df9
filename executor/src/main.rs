//! `ongrid-executor`: run one skill under the full sandbox.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

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
        /// The skill's skill.json.
        #[arg(long)]
        manifest: PathBuf,
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

fn run(manifest: PathBuf, args: String, config: Option<PathBuf>, json: bool) -> anyhow::Result<u8> {
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
    let report = rt.block_on(engine.run(
        RunRequest { manifest_path: manifest, args },
        &mut sink,
        std::future::pending(),
    ));
    print(&report, json)
}

fn print(report: &policy::RunReport, json: bool) -> anyhow::Result<u8> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, report).context("writing the report")?;
        writeln!(out).context("writing the report")?;
    } else if let Some(result) = &report.result {
        serde_json::to_writer(&mut out, result).context("writing the result")?;
        writeln!(out).context("writing the result")?;
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
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ONGRID_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let result = match cli.command {
        Command::Run { manifest, args, config, json } => run(manifest, args, config, json),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("ongrid-executor: {e:#}");
            ExitCode::from(70)
        }
    }
}
