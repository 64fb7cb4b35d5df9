//! `ongrid-skill up [--skills DIR]... [--runtime-dir DIR] [--metrics-listen ADDR]`:
//! the one-command demo. Starts `ongrid-executor serve` as a child process
//! and `ongrid-skilld` in this process, in the foreground, on sockets under
//! a local runtime directory, with the bundled example skills plus any
//! `--skills` packs; prints the lines to try; stops both on Ctrl-C,
//! SIGTERM or SIGHUP (the terminal it runs in closed; not when started
//! with SIGHUP ignored, as `nohup` starts it).
//!
//! # Runtime directory
//!
//! `--runtime-dir`, else `/run/ongrid-up` as root, else
//! `$XDG_RUNTIME_DIR/ongrid-up`, else `/tmp/ongrid-up-$UID`. It must be a
//! directory owned by the current user and not group/world writable (it is
//! created 0755 if missing), given by its real path (no symlink on the
//! way), under folders owned by root or the user that no one else may
//! rename entries of (writable by others only if sticky, as `/tmp`): it
//! holds the generated `executor.toml`, which a root executor trusts. Inside: `executor.toml`, `executor.sock`,
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
//! removed), 1 if a daemon could not start, the executor died or the ready
//! lines could not be written (both stopped), 2 on a usage error.
//!
//! # Layout
//!
//! `choose` decides everything before anything starts, `write` makes
//! the runtime directory and the executor's configuration, `supervise`
//! runs, watches and stops both daemons.

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

mod choose;
mod supervise;
mod write;

pub use choose::{
    default_runtime_dir, examples_dir, executor_bin, Args, AUDIT_DB, EXECUTOR_CONFIG,
    EXECUTOR_SOCKET, INSTALLED_EXAMPLES, ROOT_RUNTIME_DIR, SKILLD_SOCKET, SOURCE_EXAMPLES,
};
use choose::{fail, Plan};

/// Runs both daemons until Ctrl-C or SIGTERM.
///
/// # Errors
///
/// I/O errors writing `out` or `err`.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let _ = plumbing::journald::try_init(
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    );
    let plan = match Plan::new(args, err) {
        Ok(p) => p,
        Err(f) => return fail(&f, err),
    };
    for note in write::ungranted(&plan.roots, &plan.grants) {
        writeln!(err, "ongrid-skill up: note: {}", policy::printable::line(&note))?;
    }
    // Its skilld serves from this process (the executor raises its own).
    if let Err(e) = crate::daemon::raise_nofile() {
        tracing::warn!("ongrid-skill up: cannot raise the soft RLIMIT_NOFILE: {e}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let code = runtime.block_on(supervise::serve(plan, out, err))?;
    // Requests still being drained must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(code)
}
