//! `ongrid-skill run NAME [--args JSON|-] [--stream] [--json]`: run a skill
//! through the daemon.
//!
//! Human output: the result JSON on stdout when the run is ok; otherwise
//! the outcome, the error and the stderr tail on stderr, exit 1. `--json`
//! prints the whole run report on stdout (exit 1 still marks a failed
//! run). `--stream` prints the skill's stderr lines as they come (with
//! `--json`: the NDJSON events, one per line, on stdout). Human output
//! shows no control character the skill wrote ([`policy::printable`]): in
//! its stderr lines and errors they are escaped, in its result they are
//! JSON escapes, so the result is the same JSON value.

use std::io::{self, Read, Write};
use std::process::ExitCode;

use policy::RawJson;
use serde::Serialize;
use serde_json::Value;

use super::remote::{self, exit, DaemonArgs};
use crate::cli::client::encode_segment;
use policy::printable;

/// Arguments of `run`.
#[derive(Debug, clap::Args)]
#[command(after_help = remote::RUN_EXIT_CODES)]
pub struct Args {
    /// How to reach the daemon (the global `--socket`).
    #[arg(skip)]
    pub daemon: DaemonArgs,
    /// The skill's name.
    pub name: String,
    /// The args object as JSON, or `-` to read it from stdin [default: {}].
    #[arg(long, value_name = "JSON|-")]
    pub args: Option<String>,
    /// Stream the skill's stderr lines while it runs.
    #[arg(long)]
    pub stream: bool,
    /// Print the run report (with --stream: the NDJSON events) as JSON.
    /// (The global `--json`.)
    #[arg(skip)]
    pub json: bool,
    /// A session id recorded with the run.
    #[arg(long, value_name = "ID")]
    pub session_id: Option<String>,
    /// Confirm a `mutating` skill.
    #[arg(long)]
    pub confirm: bool,
    /// An approval for a `dangerous` skill (from `ongrid-skill approve`): a
    /// file holding its JSON, or the JSON itself; repeatable.
    #[arg(long, value_name = "FILE|JSON")]
    pub approval: Vec<String>,
}

/// The request body (a struct, so the args go out as their text).
#[derive(Serialize)]
struct Body<'a> {
    args: &'a policy::Args,
    confirm: bool,
    #[serde(skip_serializing_if = "<[Value]>::is_empty")]
    approvals: &'a [Value],
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
}

/// The text of `--args`: `{}` when not given, standard input for `-`.
///
/// # Errors
///
/// An I/O error reading standard input.
pub(crate) fn args_text(arg: Option<&str>) -> io::Result<String> {
    Ok(match arg {
        None => "{}".to_owned(),
        Some("-") => {
            let mut s = String::new();
            io::stdin().read_to_string(&mut s)?;
            s
        }
        Some(s) => s.to_owned(),
    })
}

/// Runs the skill.
///
/// # Errors
///
/// I/O errors reading stdin or writing the output.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let text = args_text(args.args.as_deref())?;
    // Sent as written: the skill reads this text (key order, numbers).
    let skill_args = match policy::Args::from_slice(text.as_bytes()) {
        Ok(a) => a,
        Err(e) => {
            writeln!(err, "ongrid-skill: --args: {e}")?;
            return Ok(ExitCode::from(exit::USAGE));
        }
    };
    let mut approvals = Vec::with_capacity(args.approval.len());
    for a in &args.approval {
        let text = if a.trim_start().starts_with('{') {
            a.clone()
        } else {
            match std::fs::read_to_string(a) {
                Ok(t) => t,
                Err(e) => {
                    writeln!(err, "ongrid-skill: --approval {a}: {e}")?;
                    return Ok(ExitCode::from(exit::USAGE));
                }
            }
        };
        match serde_json::from_str::<Value>(&text) {
            Ok(v @ Value::Object(_)) => approvals.push(v),
            _ => {
                writeln!(err, "ongrid-skill: --approval {a}: not a JSON object")?;
                return Ok(ExitCode::from(exit::USAGE));
            }
        }
    }
    let body = Body {
        args: &skill_args,
        confirm: args.confirm,
        approvals: &approvals,
        session_id: args.session_id.as_deref(),
    };
    let client = args.daemon.client();
    let answer = if args.stream {
        let mut report = None;
        let mut failed_with = None;
        let mut write_error = None;
        let json_out = args.json;
        let answer = remote::block_on(client.execute_stream(&args.name, &body, |event, line| {
            let r = if json_out {
                remote::print_json_text(line, out).and_then(|()| out.flush())
            } else {
                match event["event"].as_str() {
                    Some("stderr") => {
                        writeln!(err, "{}", printable::line(event["line"].as_str().unwrap_or("")))
                    }
                    Some("error") => writeln!(
                        err,
                        "ongrid-skill: {}",
                        printable::line(
                            event["error"]["message"].as_str().unwrap_or("stream failed")
                        )
                    ),
                    _ => Ok(()),
                }
            };
            if let Err(e) = r {
                write_error.get_or_insert(e);
            }
            if event["event"] == "report" {
                report = Some((event["report"].clone(), crate::cli::client::report_result(line)));
            }
            if event["event"] == "error" {
                failed_with = event["error"]["code"].as_str().map(str::to_owned);
            }
        }))?;
        if let Some(e) = write_error {
            return Err(e);
        }
        match answer {
            Ok(resp) if resp.status.is_success() => {
                let Some(report) = report else {
                    // The stream ended with an error event (already printed).
                    return Ok(ExitCode::from(stream_error_exit(failed_with.as_deref())));
                };
                return finish_stream(report, args.json, out, err);
            }
            other => other,
        }
    } else {
        let path = format!("/v1/skills/{}/execute", encode_segment(&args.name));
        remote::block_on(client.post(&path, &body))?
    };
    let resp = match answer {
        Ok(r) => r,
        Err(e) => return remote::client_error(&e, args.json, err),
    };
    if !resp.status.is_success() {
        return remote::api_error(&resp, args.json, err);
    }
    if args.json {
        remote::print_json_text(&resp.raw, out)?;
        return Ok(exit_of(&resp.body));
    }
    print_report(&resp.body, resp.report_result(), Shown::Text, out, err)
}

/// The exit code of a stream that ended with an error event of `code`: a
/// run that ended unaudited ran (a retry would run it again); the others
/// did not finish (retry later).
fn stream_error_exit(code: Option<&str>) -> u8 {
    match code {
        Some("audit_incomplete") => exit::FAILED,
        _ => exit::UNAVAILABLE,
    }
}

fn finish_stream(
    (report, result): (Value, Option<RawJson>),
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<ExitCode> {
    if json {
        // The events, report included, are already on stdout.
        return Ok(exit_of(&report));
    }
    print_report(&report, result, Shown::Streamed, out, err)
}

/// How the report is shown as text: the skill's stderr tail is printed
/// after a failure unless its lines were streamed already (`--json` prints
/// the answer's text instead: `remote::print_json_text`).
#[derive(Clone, Copy, PartialEq)]
enum Shown {
    Text,
    Streamed,
}

fn exit_of(report: &Value) -> ExitCode {
    if report["outcome"] == "ok" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::FAILED)
    }
}

/// Prints the result as the skill printed it (`result`, from the answer's
/// text) or the failure on stderr, with the skill's stderr tail unless it
/// was streamed.
fn print_report(
    report: &Value,
    result: Option<RawJson>,
    shown: Shown,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<ExitCode> {
    if report["outcome"] == "ok" {
        match result {
            Some(raw) => writeln!(out, "{}", printable::json(raw.get()))?,
            None => {
                let text =
                    serde_json::to_string_pretty(&report["result"]).map_err(io::Error::other)?;
                writeln!(out, "{}", printable::json(&text))?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let skill = printable::line(report["skill"].as_str().unwrap_or("?"));
    let outcome = printable::line(report["outcome"].as_str().unwrap_or("?"));
    let error = printable::line(report["error"].as_str().unwrap_or(""));
    writeln!(err, "ongrid-skill: skill \"{skill}\" failed: {outcome}: {error}")?;
    let stderr = report["stderr"].as_str().unwrap_or("");
    if !stderr.is_empty() && shown == Shown::Text {
        writeln!(err, "stderr (tail):")?;
        for line in printable::lines(stderr) {
            writeln!(err, "  {line}")?;
        }
    }
    Ok(ExitCode::from(exit::FAILED))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that ended unaudited is a run that happened: not the
    /// "retry later" of one that did not finish.
    #[test]
    fn a_stream_that_ended_unaudited_is_not_retry_later() {
        assert_eq!(stream_error_exit(Some("audit_incomplete")), exit::FAILED);
        assert_eq!(stream_error_exit(Some("executor_unavailable")), exit::UNAVAILABLE);
        assert_eq!(stream_error_exit(None), exit::UNAVAILABLE);
    }
}
