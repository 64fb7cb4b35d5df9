//! `ongrid-skill approve --key FILE --skill NAME [--args JSON|-]
//! [--session-id S] [--ttl 10m | --expires-at UNIX]`: sign an approval of
//! one request to a `dangerous` skill, and print it as the JSON object the
//! execute body's `approvals` array takes (and `run --approval` reads).
//!
//! The approval is for exactly that skill, those args (compared as
//! canonical JSON: key order and whitespace do not matter, the spelling
//! of numbers does, as the skill reads the text), that session
//! id, until the expiry; the daemon accepts it once, and only if the expiry
//! is at most `approval_max_ttl_seconds` (default 900) ahead when used.
//! The key file must not be readable by group or others.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use policy::approval::{SecretKey, Subject};

use super::remote::exit;

/// Arguments of `approve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The approver's private key (from `ongrid-skill keygen`).
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// The skill to approve.
    #[arg(long)]
    pub skill: String,
    /// The args object as JSON, or `-` for stdin [default: {}].
    #[arg(long, value_name = "JSON|-")]
    pub args: Option<String>,
    /// The session id the request will carry.
    #[arg(long, value_name = "ID")]
    pub session_id: Option<String>,
    /// How long the approval is valid (90s, 10m, 1h...).
    #[arg(long, value_name = "DURATION", default_value = "10m", conflicts_with = "expires_at")]
    pub ttl: String,
    /// The expiry as unix seconds (instead of --ttl).
    #[arg(long, value_name = "UNIX")]
    pub expires_at: Option<u64>,
}

/// Signs and prints the approval.
///
/// # Errors
///
/// I/O errors reading stdin or writing the output.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let usage = |err: &mut dyn Write, msg: String| -> io::Result<ExitCode> {
        writeln!(err, "ongrid-skill approve: {msg}")?;
        Ok(ExitCode::from(exit::USAGE))
    };
    let text = super::run::args_text(args.args.as_deref())?;
    // Signed as written: send the same text with the run (key order and
    // whitespace may differ, numbers and values may not).
    let skill_args = match policy::Args::from_slice(text.as_bytes()) {
        Ok(a) => a,
        Err(e) => return usage(err, format!("--args: {e}")),
    };
    let key = match read_key(&args.key) {
        Ok(k) => k,
        Err(msg) => return usage(err, format!("{}: {msg}", args.key.display())),
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs();
    let expires_at = match args.expires_at {
        Some(t) => t,
        None => match humantime::parse_duration(&args.ttl) {
            Ok(d) => now.saturating_add(d.as_secs()),
            Err(e) => return usage(err, format!("--ttl {:?}: {e}", args.ttl)),
        },
    };
    let subject =
        Subject { skill: &args.skill, args: &skill_args, session_id: args.session_id.as_deref() };
    let approval = key.approve(&subject, expires_at);
    let json = serde_json::to_string(&approval).map_err(io::Error::other)?;
    writeln!(out, "{json}")?;
    Ok(ExitCode::SUCCESS)
}

/// Reads a key file, refusing one that group or others may read.
fn read_key(path: &std::path::Path) -> Result<SecretKey, String> {
    let meta = fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "mode {:o}: a private key must not be accessible to group or others (chmod 600)",
            meta.mode() & 0o777
        ));
    }
    let text = fs::read_to_string(path).map_err(|e| e.to_string())?;
    SecretKey::from_base64(&text)
        .map_err(|e| format!("not a key file from `ongrid-skill keygen`: {e}"))
}
