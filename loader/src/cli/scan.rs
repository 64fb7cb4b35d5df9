//! `ongrid-skill scan [--json] [--verbose] [DIR...]`

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use super::table::Table;

/// Arguments of `scan`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the registered skills as a JSON array.
    /// (The global `--json`.)
    #[arg(skip)]
    pub json: bool,
    /// Also print debug events (ignored manifest fields).
    #[arg(short, long)]
    pub verbose: bool,
    /// Allow-list roots to scan, in priority order. Default: the roots in
    /// ONGRID_SKILLS_EXTERNAL_DIRS. Relative DIRs are taken from the current
    /// directory.
    #[arg(value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
}

/// Scans, prints every event on `err` and the skills on `out`. Exits 0 even
/// when manifests were skipped: a broken pack never blocks the others; but
/// a DIR given on the command line that does not exist is the caller's
/// mistake (a typo would otherwise look like a root without packs): the
/// scan's line names it and the exit code is 1.
///
/// # Errors
///
/// I/O errors writing the output.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let missing = super::dirs::any_missing(&args.dirs);
    let report = super::dirs::scan_roots(&args.dirs, err)?;
    super::dirs::print_events(&report, args.verbose, err)?;
    let n = report.registered();
    writeln!(err, "skill loader: {n} skill{} registered", if n == 1 { "" } else { "s" })?;

    if args.json {
        let skills: Vec<serde_json::Value> = report.skills.iter().map(|s| s.to_json()).collect();
        let text = serde_json::to_string_pretty(&skills).map_err(io::Error::other)?;
        writeln!(out, "{text}")?;
    } else if !report.skills.is_empty() {
        let mut table = Table::with_header(&["NAME", "CLASS", "CATEGORY", "TIMEOUT", "ENTRY"]);
        for s in &report.skills {
            let m = s.manifest();
            table.push(vec![
                m.name().to_string(),
                m.class().to_string(),
                m.category().to_owned(),
                format!("{}s", m.timeout().as_secs()),
                s.entry().display().to_string(),
            ]);
        }
        table.write(out)?;
    }
    Ok(if missing { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
