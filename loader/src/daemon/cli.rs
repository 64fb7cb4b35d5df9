//! The command line of `ongrid-skilld` (clap), in the library so that the
//! packaging generator (`packaging/src/bin/ongrid-gen-docs.rs`) builds its
//! man page and shell completions from the same definitions.

use std::path::PathBuf;

use clap::Parser;

/// The ongrid-skills registry daemon: scans the allow-listed skill
/// directories, serves the client API on a Unix socket and forwards runs to
/// ongrid-executor. SIGHUP rescans.
#[derive(Debug, Parser)]
#[command(name = "ongrid-skilld", version, after_help = AFTER_HELP)]
pub struct Args {
    /// Configuration file [default: /etc/ongrid/skilld.toml if present].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Client API socket (overrides `socket`).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Executor socket (overrides `executor_socket`).
    #[arg(long, value_name = "PATH")]
    pub executor_socket: Option<PathBuf>,
    /// Metrics listener ADDR:PORT; "" disables it (overrides `metrics_listen`).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Allow-list root, repeatable (replaces `skills_dirs`; the roots in
    /// ONGRID_SKILLS_EXTERNAL_DIRS are still appended).
    #[arg(long = "skills-dir", value_name = "DIR")]
    pub skills_dirs: Vec<PathBuf>,
    /// Check the configuration and exit: 0 if valid (with a summary), 78
    /// if not (naming the file, the key and the cause).
    #[arg(long)]
    pub check_config: bool,
}

/// The `--help` epilogue: exit codes and systemd.
pub const AFTER_HELP: &str = "\
Exit codes: 0 after SIGTERM/SIGINT, 1 start-up failure, 78 (EX_CONFIG)
invalid configuration (--check-config too).
Under systemd (Type=notify): READY=1 once the client socket accepts, the
metrics listener is bound and the first scan is done; RELOADING=1 and then
READY=1 around every rescan (SIGHUP, POST /v1/reload); STOPPING=1 when the
drain starts. A socket passed by socket activation (LISTEN_FDS, e.g.
ongrid-skilld.socket) is served instead of binding `socket`, and is left in
place at exit.";
