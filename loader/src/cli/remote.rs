//! What the daemon commands (`list`, `show`, `run`, `reload`, `audit`)
//! share: the `--socket` option, the exit codes, and printing the daemon's errors.

use std::future::Future;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::{OsStringValueParser, TypedValueParser};
use hyper::StatusCode;
use serde_json::Value;

use crate::cli::client::{ApiResponse, ClientError, DaemonClient};
use crate::daemon::config::DEFAULT_SOCKET;
use policy::printable;

/// Exit codes of the daemon commands (also in `--help`).
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// The skill ran and failed (outcome other than `ok`), or the daemon
    /// answered something unexpected.
    pub const FAILED: u8 = 1;
    /// Usage error (bad flags, `--args` not a JSON object).
    pub const USAGE: u8 = 2;
    /// The daemon is unreachable (socket missing, refused, no permission).
    pub const UNREACHABLE: u8 = 3;
    /// No such skill.
    pub const NOT_FOUND: u8 = 4;
    /// Refused: args do not match the schema, bad request, or denied.
    pub const REFUSED: u8 = 5;
    /// The executor is down or busy; retry later.
    pub const UNAVAILABLE: u8 = 6;
}

/// The exit-code table of `ongrid-skill --help`: every code any command
/// returns. Each daemon command's `--help` carries only its own codes
/// (the constants below), so a reader of `list --help` is not told about
/// codes only `run` can return.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  the command found problems (validate, check), the skill ran and failed
     (run), or another error
  2  usage error (bad flags, --args not a JSON object)
  3  ongrid-skilld unreachable (socket missing, refused, permission)
  4  no such skill (show, run)
  5  refused: args do not match the schema, bad request, or denied
  6  executor unavailable or busy, or audit trail unreadable (retry later)";

/// The exit codes of `list`.
pub const LIST_EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the daemon answered something unexpected
  2  usage error (bad flags)
  3  ongrid-skilld unreachable (socket missing, refused, permission)
  5  refused: bad request";

/// The exit codes of `show`.
pub const SHOW_EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the daemon answered something unexpected
  2  usage error (bad flags)
  3  ongrid-skilld unreachable (socket missing, refused, permission)
  4  no such skill
  5  refused: bad request";

/// The exit codes of `run`.
pub const RUN_EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the skill ran and failed (outcome other than ok), or another error
  2  usage error (bad flags, --args not a JSON object)
  3  ongrid-skilld unreachable (socket missing, refused, permission)
  4  no such skill
  5  refused: args do not match the schema, bad request, or denied
  6  executor unavailable or busy (retry later)";

/// The exit codes of `reload`.
pub const RELOAD_EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the daemon answered something unexpected
  2  usage error (bad flags)
  3  ongrid-skilld unreachable (socket missing, refused, permission)
  5  refused: denied";

/// The exit codes of `audit`.
pub const AUDIT_EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the daemon answered something unexpected
  2  usage error (bad flags)
  3  ongrid-skilld unreachable (socket missing, refused, permission)
  5  refused: bad request, or not an audit reader
  6  the audit trail is unavailable (retry later)";

/// How to reach the daemon: `--socket` is global on `ongrid-skill`
/// (accepted before or after the subcommand) and ignored by the commands
/// that do not talk to the daemon.
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonArgs {
    /// ongrid-skilld's socket (empty: the default, so that an empty
    /// ONGRID_SOCKET counts as unset); ignored by scan, validate, check,
    /// up, keygen and approve.
    #[arg(
        long,
        global = true,
        env = "ONGRID_SOCKET",
        value_name = "PATH",
        default_value = DEFAULT_SOCKET,
        value_parser = socket_path()
    )]
    pub socket: PathBuf,
}

/// Parses `--socket` and `ONGRID_SOCKET`: any path, and the empty string
/// as [`DEFAULT_SOCKET`] (clap's path parser refuses an empty value, and
/// took `ONGRID_SOCKET=""` for a `--socket` given without one).
fn socket_path() -> impl TypedValueParser<Value = PathBuf> {
    OsStringValueParser::new().map(|s| {
        if s.is_empty() {
            PathBuf::from(DEFAULT_SOCKET)
        } else {
            PathBuf::from(s)
        }
    })
}

impl Default for DaemonArgs {
    fn default() -> Self {
        Self { socket: PathBuf::from(DEFAULT_SOCKET) }
    }
}

impl DaemonArgs {
    /// A client of that socket.
    pub fn client(&self) -> DaemonClient {
        DaemonClient::new(&self.socket)
    }
}

/// Runs `f` on a single-threaded runtime (the CLI does one thing at a time).
///
/// # Errors
///
/// The runtime could not be built.
pub fn block_on<F: Future>(f: F) -> io::Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    Ok(rt.block_on(f))
}

/// Prints a transport error and returns its exit code.
///
/// # Errors
///
/// I/O errors writing `err`.
pub fn client_error(e: &ClientError, json: bool, err: &mut dyn Write) -> io::Result<ExitCode> {
    let (code, name) = match e {
        ClientError::Connect { .. } => (exit::UNREACHABLE, "unreachable"),
        _ => (exit::FAILED, "protocol"),
    };
    let message = plumbing::errors::chain(e);
    if json {
        let body = serde_json::json!({"error": {"code": name, "message": message}});
        writeln!(err, "{body}")?;
    } else {
        writeln!(err, "ongrid-skill: {message}")?;
    }
    Ok(ExitCode::from(code))
}

/// The exit code for an error answer of the daemon.
pub fn status_exit_code(status: StatusCode) -> u8 {
    match status.as_u16() {
        404 => exit::NOT_FOUND,
        400 | 403 | 413 => exit::REFUSED,
        503 => exit::UNAVAILABLE,
        _ => exit::FAILED,
    }
}

/// Prints an error answer (`{"error":{code,message,violations?}}`) and
/// returns its exit code.
///
/// # Errors
///
/// I/O errors writing `err`.
pub fn api_error(resp: &ApiResponse, json: bool, err: &mut dyn Write) -> io::Result<ExitCode> {
    let code = status_exit_code(resp.status);
    if json {
        writeln!(err, "{}", resp.body)?;
        return Ok(ExitCode::from(code));
    }
    let e = &resp.body["error"];
    let name = e["code"].as_str().unwrap_or("error");
    let message = e["message"].as_str().map_or_else(|| resp.body.to_string(), str::to_owned);
    let (name, message) = (printable::line(name), printable::line(&message));
    writeln!(err, "ongrid-skill: {name}: {message} ({})", resp.status)?;
    if let Some(violations) = e["violations"].as_array() {
        for v in violations {
            let path = v["path"].as_str().filter(|p| !p.is_empty()).unwrap_or("(args)");
            let message = v["message"].as_str().unwrap_or_default();
            writeln!(err, "  {}: {}", printable::line(path), printable::line(message))?;
        }
    }
    Ok(ExitCode::from(code))
}

/// `GET path` for a listing (`{"items":[...]}`): with `json` the answer is
/// printed as it is and the command is done; else the items come back
/// (`Ok(Err(code))`: done, with that exit code; `what` names an empty list
/// on `err`).
///
/// # Errors
///
/// I/O errors writing the output.
pub fn get_items(
    daemon: &DaemonArgs,
    path: &str,
    json: bool,
    what: &str,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<Result<Vec<Value>, ExitCode>> {
    let resp = match block_on(daemon.client().get(path))? {
        Ok(r) => r,
        Err(e) => return client_error(&e, json, err).map(Err),
    };
    if !resp.status.is_success() {
        return api_error(&resp, json, err).map(Err);
    }
    if json {
        print_json_text(&resp.raw, out)?;
        return Ok(Err(ExitCode::SUCCESS));
    }
    let items = resp.body["items"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        writeln!(err, "no {what}")?;
        return Ok(Err(ExitCode::SUCCESS));
    }
    Ok(Ok(items))
}

/// Writes a JSON answer as the daemon sent it (`--json`): a run report's
/// `result`, a row's args and a manifest's schema are as they were written
/// (key order, number spelling, escapes), which parsing and printing again
/// would change.
///
/// # Errors
///
/// I/O errors writing `out`.
pub fn print_json_text(raw: &[u8], out: &mut dyn Write) -> io::Result<()> {
    let text = raw.trim_ascii();
    // An empty answer is no JSON value: printed as `null`, as before.
    out.write_all(if text.is_empty() { b"null" } else { text })?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser;

    use super::*;

    /// A command made of the daemon arguments alone.
    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        daemon: DaemonArgs,
    }

    fn socket(args: &[&str]) -> PathBuf {
        let argv = ["ongrid-skill"].iter().chain(args);
        Wrap::try_parse_from(argv).unwrap().daemon.socket
    }

    #[test]
    fn an_empty_socket_is_the_default() {
        assert_eq!(socket(&["--socket", ""]), Path::new(DEFAULT_SOCKET));
        assert_eq!(socket(&["--socket", "/tmp/s.sock"]), Path::new("/tmp/s.sock"));
    }
}
