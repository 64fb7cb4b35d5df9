//! `ongrid-skill list [--category C] [--json]`: the daemon's registry.

use std::io::{self, Write};
use std::process::ExitCode;

use super::remote::{self, DaemonArgs};
use super::table::Table;
use crate::cli::client::encode_segment;

/// Arguments of `list`.
#[derive(Debug, clap::Args)]
#[command(after_help = remote::LIST_EXIT_CODES)]
pub struct Args {
    /// How to reach the daemon (the global `--socket`).
    #[arg(skip)]
    pub daemon: DaemonArgs,
    /// Only skills of this category.
    #[arg(long)]
    pub category: Option<String>,
    /// Print the answer (`{"items":[...],"total":N}`) as JSON.
    /// (The global `--json`.)
    #[arg(skip)]
    pub json: bool,
}

/// Lists the registered skills.
///
/// # Errors
///
/// I/O errors writing the output.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let path = match &args.category {
        Some(c) => format!("/v1/skills?category={}", encode_segment(c)),
        None => "/v1/skills".to_owned(),
    };
    let items =
        match remote::get_items(&args.daemon, &path, args.json, "skills registered", out, err)? {
            Ok(items) => items,
            Err(done) => return Ok(done),
        };
    let mut table = Table::with_header(&["NAME", "CLASS", "CATEGORY", "TIMEOUT", "DESCRIPTION"]);
    for s in &items {
        let text = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
        table.push(vec![
            text("name"),
            text("class"),
            text("category"),
            format!("{}s", s["timeout_seconds"].as_u64().unwrap_or_default()),
            text("description"),
        ]);
    }
    table.write(out)?;
    Ok(ExitCode::SUCCESS)
}
