//! `ongrid-skill show NAME [--json]`: one skill of the daemon's registry.

use std::io::{self, Write};
use std::process::ExitCode;

use super::remote::{self, DaemonArgs};
use crate::cli::client::encode_segment;
use policy::printable;

/// Arguments of `show`.
#[derive(Debug, clap::Args)]
#[command(after_help = remote::SHOW_EXIT_CODES)]
pub struct Args {
    /// How to reach the daemon (the global `--socket`).
    #[arg(skip)]
    pub daemon: DaemonArgs,
    /// The skill's name.
    pub name: String,
    /// Print the skill as JSON.
    /// (The global `--json`.)
    #[arg(skip)]
    pub json: bool,
}

/// Shows one skill.
///
/// # Errors
///
/// I/O errors writing the output.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let path = format!("/v1/skills/{}", encode_segment(&args.name));
    let resp = match remote::block_on(args.daemon.client().get(&path))? {
        Ok(r) => r,
        Err(e) => return remote::client_error(&e, args.json, err),
    };
    if !resp.status.is_success() {
        return remote::api_error(&resp, args.json, err);
    }
    let s = &resp.body;
    if args.json {
        remote::print_json_text(&resp.raw, out)?;
        return Ok(ExitCode::SUCCESS);
    }
    // Written by the pack: printed without its control characters.
    let text = |k: &str| printable::line(s[k].as_str().unwrap_or_default()).into_owned();
    writeln!(out, "name:         {}", text("name"))?;
    writeln!(out, "description:  {}", text("description"))?;
    writeln!(out, "class:        {}", text("class"))?;
    writeln!(out, "category:     {}", text("category"))?;
    writeln!(out, "timeout:      {}s", s["timeout_seconds"].as_u64().unwrap_or_default())?;
    let env: Vec<&str> = s["env_allow"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    writeln!(
        out,
        "env_allow:    {}",
        if env.is_empty() { "(none)".into() } else { printable::line(&env.join(" ")).into_owned() }
    )?;
    if let Some(w) = s["warm"].as_object() {
        let n = |k: &str| w.get(k).and_then(serde_json::Value::as_u64).unwrap_or_default();
        let (size, idle, hits, misses) = (n("size"), n("idle"), n("hits"), n("misses"));
        let discarded = n("discarded");
        writeln!(
            out,
            "warm:         {size} granted, {idle} idle; hits {hits}, misses {misses}, discarded {discarded}"
        )?;
    }
    writeln!(out, "schema:")?;
    let schema = serde_json::to_string_pretty(&s["schema"]).map_err(io::Error::other)?;
    writeln!(out, "{}", printable::json(&schema))?;
    Ok(ExitCode::SUCCESS)
}
