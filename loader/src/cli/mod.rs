//! `ongrid-skill`: the command-line front end, one file per command.
//!
//! Each command module has an `Args` struct (clap derive) and a `run`
//! function writing to the given stdout and stderr, so commands can be
//! tested without a process. `scan`, `validate` and `check` work on files; `list`,
//! `show`, `run`, `reload` and `audit` talk to `ongrid-skilld` over its
//! socket (`--socket`, env `ONGRID_SOCKET`, either empty meaning the
//! default `/run/ongrid/skilld.sock`) through [`remote`]; `--socket` and
//! `--json` are global (before or after the subcommand) and ignored by the
//! commands that have no use for them; `mcp`
//! serves the daemon's skills as MCP tools on stdin/stdout; `up` starts
//! both daemons in the foreground ([`up`]); `keygen` and `approve` make
//! approver keys and approvals for `dangerous` skills, offline.
//!
//! Exit codes: 0 = success, 1 = the command ran and found problems
//! (`validate`, `check`) or the skill failed (`run`), 2 = usage error, and
//! for the daemon commands 3 = daemon unreachable, 4 = no such skill, 5 =
//! refused (invalid args, bad request, denied), 6 = executor unavailable or
//! busy ([`remote::exit`]); each daemon command's `--help` lists only the
//! codes it returns.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Text from packs and skills made safe to print ([`policy::printable`]).
pub use policy::printable;

pub mod approve;
pub mod audit;
pub mod check;
pub mod client;
mod dirs;
pub mod keygen;
pub mod list;
pub mod mcp;
pub mod reload;
pub mod remote;
pub mod run;
pub mod scan;
pub mod show;
pub mod table;
pub mod up;
pub mod validate;

/// Runs, lists and checks subprocess skills.
#[derive(Debug, Parser)]
#[command(
    name = "ongrid-skill",
    version,
    propagate_version = true,
    after_help = remote::EXIT_CODES_HELP
)]
pub struct Cli {
    /// How to reach the daemon (`--socket`, global).
    #[command(flatten)]
    pub daemon: remote::DaemonArgs,
    /// Print JSON instead of text: the answer or report of list, show, run,
    /// reload, audit, scan, validate and check; ignored by mcp, up, keygen
    /// and approve.
    #[arg(long, global = true)]
    pub json: bool,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the loader over skill directories without any daemon: log lines
    /// on stderr, registered skills on stdout.
    Scan(scan::Args),
    /// Lint manifests, packs or whole roots; exits non-zero if any fails.
    Validate(validate::Args),
    /// Print every skill's requirement status (SKILL.md os, bins, config,
    /// env) on this host; exits 1 if any is unmet.
    Check(check::Args),
    /// Serve the caller's skills as MCP tools on stdin/stdout (Model
    /// Context Protocol, stdio transport), through ongrid-skilld.
    Mcp(mcp::Args),
    /// List the skills registered in ongrid-skilld.
    List(list::Args),
    /// Show one registered skill (with warm runs granted, a `warm:` line:
    /// the pool's size, idle runs, hits, misses and discards).
    Show(show::Args),
    /// Run a skill through ongrid-skilld and print its result.
    Run(run::Args),
    /// Make ongrid-skilld rescan its skill directories.
    Reload(reload::Args),
    /// Start ongrid-executor and ongrid-skilld in the foreground on local
    /// sockets with the example skills: the one-command demo.
    Up(up::Args),
    /// Read ongrid-skilld's audit trail (root and audit readers only).
    Audit(audit::Args),
    /// Make an approver key (Ed25519) and print its [[approvers]] entry.
    Keygen(keygen::Args),
    /// Sign an approval of one request to a dangerous skill.
    Approve(approve::Args),
}

/// Runs `cli`, writing results to `out` and diagnostics to `err`.
///
/// # Errors
///
/// Only I/O errors writing the output.
pub fn run(cli: Cli, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    // `--socket` and `--json` are global: clap gives the top level their
    // values wherever on the line they were written, and each command's
    // `Args` takes them from there.
    let Cli { daemon, json, command } = cli;
    match command {
        Command::Scan(args) => scan::run(&scan::Args { json, ..args }, out, err),
        Command::Validate(args) => validate::run(&validate::Args { json, ..args }, out, err),
        Command::Check(args) => check::run(&check::Args { json, ..args }, out, err),
        Command::Mcp(_) => mcp::run(&mcp::Args { daemon }, out, err),
        Command::List(args) => list::run(&list::Args { daemon, json, ..args }, out, err),
        Command::Show(args) => show::run(&show::Args { daemon, json, ..args }, out, err),
        Command::Run(args) => run::run(&run::Args { daemon, json, ..args }, out, err),
        Command::Reload(_) => reload::run(&reload::Args { daemon, json }, out, err),
        Command::Up(args) => up::run(&args, out, err),
        Command::Audit(args) => audit::run(&audit::Args { daemon, json, ..args }, out, err),
        Command::Keygen(args) => keygen::run(&args, out, err),
        Command::Approve(args) => approve::run(&args, out, err),
    }
}
