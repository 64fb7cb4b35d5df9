//! `ongrid-skill reload [--json]`: make the daemon rescan its roots.

use std::io::{self, Write};
use std::process::ExitCode;

use serde_json::json;

use super::remote::{self, DaemonArgs};

/// Arguments of `reload`.
#[derive(Debug, clap::Args)]
#[command(after_help = remote::RELOAD_EXIT_CODES)]
pub struct Args {
    /// How to reach the daemon (the global `--socket`).
    #[arg(skip)]
    pub daemon: DaemonArgs,
    /// Print the answer (`{"registered":N,"skipped":M}`) as JSON.
    /// (The global `--json`.)
    #[arg(skip)]
    pub json: bool,
}

/// Asks for a rescan.
///
/// # Errors
///
/// I/O errors writing the output.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let resp = match remote::block_on(args.daemon.client().post("/v1/reload", &json!({})))? {
        Ok(r) => r,
        Err(e) => return remote::client_error(&e, args.json, err),
    };
    if !resp.status.is_success() {
        return remote::api_error(&resp, args.json, err);
    }
    if args.json {
        remote::print_json_text(&resp.raw, out)?;
    } else {
        let n = resp.body["registered"].as_u64().unwrap_or_default();
        let m = resp.body["skipped"].as_u64().unwrap_or_default();
        writeln!(out, "{n} skill{} registered, {m} skipped", if n == 1 { "" } else { "s" })?;
    }
    Ok(ExitCode::SUCCESS)
}
