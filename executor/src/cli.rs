//! The command line of `ongrid-executor` (clap), in the library so that the
//! packaging generator (`packaging/src/bin/ongrid-gen-docs.rs`) builds the
//! man page and shell completions from the same definitions.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The exit codes of `run` (its `--help` epilogue).
pub const EXIT_CODES: &str = "\
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

/// `ongrid-executor`.
#[derive(Debug, Parser)]
#[command(name = "ongrid-executor", version, about = "The sandboxing executor of ongrid-skills")]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
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
        /// Also stop (as on SIGTERM) when standard input reaches end of
        /// file: for a parent that runs the executor as its child (as
        /// `ongrid-skill up` does) and holds the pipe's other end, so the
        /// executor never outlives it, however it ends.
        #[arg(long)]
        stop_on_stdin_eof: bool,
    },
}

/// The `--help` epilogue of `serve`.
pub const SERVE_HELP: &str = "\
Socket: `socket` in executor.toml (default <runtime_dir>/executor.sock, i.e.
/run/ongrid/executor.sock as root), owner/group/mode from socket_owner,
socket_group, socket_mode. Peers are checked with SO_PEERCRED against
allowed_uids/allowed_gids. Methods: execute, ping, metrics.
A socket a running daemon answers on is refused (another `serve` with the
same configuration); a stale one is replaced, and the node bound is removed
at exit.
Under systemd: a socket passed by socket activation (LISTEN_FDS, e.g.
ongrid-executor.socket) is served instead and left in place at exit;
READY=1 is sent once the socket accepts, STOPPING=1 when the drain starts
(NOTIFY_SOCKET, Type=notify).
SIGTERM or Ctrl-C (or, with --stop-on-stdin-eof, the end of standard input):
stop accepting, let runs finish within their deadlines, then exit 0. SIGHUP
is logged and ignored: executor.toml is read at start (restart to apply
it). Exit 78 (EX_CONFIG): executor.toml cannot be read or is invalid (the
packaged unit does not restart on it: RestartPreventExitStatus=78); exit
70: the socket or the engine could not be set up.";
