//! `ongrid-skill audit [--skill S] [--since DURATION] [--outcome O]
//! [--decision D] [--limit N] [--json]`: the daemon's audit trail, newest
//! first, through `GET /v1/audit` (root and callers with `audit = true`
//! only: the trail holds every caller's args). When the daemon could not
//! write the rows it journaled into the database before reading it (a
//! database another process holds locked, a full file system), the rows
//! shown may lack the newest ones: a warning on stderr says so (with
//! `--json` too; the answer then holds `incomplete`).

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use clap::builder::PossibleValuesParser;

use super::remote::{self, DaemonArgs};
use super::table::Table;
use crate::cli::client::encode_segment;
use crate::daemon::audit;
use policy::printable;

/// Arguments of `audit`.
#[derive(Debug, clap::Args)]
#[command(after_help = remote::AUDIT_EXIT_CODES)]
pub struct Args {
    /// How to reach the daemon (the global `--socket`).
    #[arg(skip)]
    pub daemon: DaemonArgs,
    /// Only this skill.
    #[arg(long)]
    pub skill: Option<String>,
    /// Only rows newer than this (90s, 10m, 2h, 7days).
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub since: Option<String>,
    /// Only this outcome.
    #[arg(long, value_parser = PossibleValuesParser::new(audit::OUTCOMES))]
    pub outcome: Option<String>,
    /// Only this decision.
    #[arg(long, value_parser = PossibleValuesParser::new(audit::DECISIONS))]
    pub decision: Option<String>,
    /// At most this many rows (1..=1000).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Print the answer (`{"items":[...],"total":N}`) as JSON.
    /// (The global `--json`.)
    #[arg(skip)]
    pub json: bool,
}

/// `--since`: a duration as the daemon reads it, checked here so a typo is a
/// usage error (exit 2) like any other, and sent as written.
fn duration_text(text: &str) -> Result<String, String> {
    humantime::parse_duration(text)
        .map(|_| text.to_owned())
        .map_err(|e| format!("{e} (want e.g. 90s, 10m, 2h, 7days)"))
}

/// Prints the audit trail.
///
/// # Errors
///
/// I/O errors writing the output.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let mut query = vec![format!("limit={}", args.limit)];
    for (key, value) in [
        ("skill", &args.skill),
        ("since", &args.since),
        ("outcome", &args.outcome),
        ("decision", &args.decision),
    ] {
        if let Some(v) = value {
            query.push(format!("{key}={}", encode_segment(v)));
        }
    }
    let path = format!("/v1/audit?{}", query.join("&"));
    let resp = match remote::block_on(args.daemon.client().get(&path))? {
        Ok(r) => r,
        Err(e) => return remote::client_error(&e, args.json, err),
    };
    if !resp.status.is_success() {
        return remote::api_error(&resp, args.json, err);
    }
    if let Some(i) = resp.body.get("incomplete") {
        let n = i["unwritten"].as_u64().unwrap_or_default();
        let reason = printable::line(i["reason"].as_str().unwrap_or("unknown"));
        writeln!(
            err,
            "ongrid-skill: warning: the audit trail shown is incomplete: {n} journaled row(s) \
             or completion(s) could not be written into the database before the read \
             ({reason}); the newest rows may be missing or show runs unfinished: try again"
        )?;
    }
    if args.json {
        remote::print_json_text(&resp.raw, out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let items = resp.body["items"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        writeln!(err, "no audit rows")?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::with_header(&[
        "ID",
        "TIME",
        "SKILL",
        "UID",
        "ROLE",
        "DECISION",
        "REASON",
        "OUTCOME",
        "MS",
        "APPROVERS",
    ]);
    for r in &items {
        let text = |k: &str| r[k].as_str().unwrap_or("-").to_owned();
        let num = |k: &str| r[k].as_i64().map_or_else(|| "-".to_owned(), |n| n.to_string());
        let time = r["started_at"]
            .as_u64()
            .map(|ms| humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)))
            .map_or_else(|| "-".to_owned(), |t| t.to_string());
        let approvers: Vec<&str> = r["approvers"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        table.push(vec![
            num("id"),
            time,
            text("skill"),
            num("caller_uid"),
            text("role"),
            text("decision"),
            text("reason"),
            text("outcome"),
            num("duration_ms"),
            if approvers.is_empty() { "-".to_owned() } else { approvers.join(",") },
        ]);
    }
    table.write(out)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// `ongrid-skill audit`'s arguments as a command of their own.
    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        args: super::Args,
    }

    fn parse(args: &[&str]) -> Result<super::Args, clap::Error> {
        let argv = ["ongrid-skill"].iter().chain(args);
        Wrap::try_parse_from(argv).map(|w| w.args)
    }

    #[test]
    fn unknown_outcomes_and_decisions_are_usage_errors() {
        for args in [["--outcome", "timedout"], ["--decision", "permit"], ["--outcome", "OK"]] {
            let e = parse(&args).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue, "{args:?}");
            assert_eq!(e.exit_code(), 2);
            let text = e.to_string();
            assert!(text.contains("possible values"), "{text}");
        }
        let e = parse(&["--outcome", "timedout"]).unwrap_err().to_string();
        assert!(e.contains("cancelled") && e.contains("exit_nonzero"), "{e}");
        let a = parse(&["--outcome", "cancelled", "--decision", "deny"]).unwrap();
        assert_eq!(
            (a.outcome.as_deref(), a.decision.as_deref()),
            (Some("cancelled"), Some("deny"))
        );
    }

    #[test]
    fn a_since_that_is_no_duration_is_a_usage_error_and_a_good_one_goes_as_written() {
        for bad in ["yesterday", "2 hours ago", "5x", ""] {
            let e = parse(&["--since", bad]).unwrap_err();
            assert_eq!((e.kind(), e.exit_code()), (clap::error::ErrorKind::ValueValidation, 2));
            assert!(e.to_string().contains("want e.g. 90s"), "{e}");
        }
        let a = parse(&["--since", "7days"]).unwrap();
        assert_eq!(a.since.as_deref(), Some("7days"));
    }
}
