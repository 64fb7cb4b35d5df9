//! `ongrid-skill check [--json] [DIR...]`: every skill's requirement
//! status on this host.
//!
//! Scans the roots like `scan` (same loader, same `PATH` and environment)
//! and prints one block per skill: `skill.json` skills have no
//! requirements; each SKILL.md lists its `os`, `bins`, `config` and `env`
//! checks, met (`ok`), missing (`MISSING`) or not checkable (`UNKNOWN`: a
//! config file whose status cannot be read), and the tools it registers
//! (none while a requirement is unmet). The scan's warnings (a root that
//! does not exist, a manifest skipped) go to stderr as `scan` prints them.
//! Exits 1 when any requirement is unmet or a DIR given does not exist.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};

use policy::printable;

/// Arguments of `check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the statuses as JSON.
    /// (The global `--json`.)
    #[arg(skip)]
    pub json: bool,
    /// Allow-list roots to check. Default: the roots in
    /// ONGRID_SKILLS_EXTERNAL_DIRS.
    #[arg(value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
}

/// Checks and prints; see the module docs.
///
/// # Errors
///
/// I/O errors writing the output.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let missing = super::dirs::any_missing(&args.dirs);
    let report = super::dirs::scan_roots(&args.dirs, err)?;
    super::dirs::print_events(&report, false, err)?;
    let mut items: Vec<Value> = Vec::new();
    for s in report.skills.iter().filter(|s| s.tool().is_none()) {
        items.push(json!({
            "name": s.name(),
            "source": "skill.json",
            "manifest": s.manifest_path().to_string_lossy(),
            "met": true,
            "checks": [],
            "tools": [s.name()],
        }));
    }
    for r in &report.requirements {
        let tools: Vec<&str> = report
            .skills
            .iter()
            .filter(|s| s.manifest_path() == r.manifest)
            .map(|s| s.name())
            .collect();
        let checks: Vec<Value> = r
            .checks
            .iter()
            .map(|c| {
                let mut v = serde_json::to_value(c).unwrap_or(Value::Null);
                if let Some(o) = v.as_object_mut() {
                    o.insert("message".into(), json!(c.to_string()));
                }
                v
            })
            .collect();
        items.push(json!({
            "name": r.name,
            "source": "skill.md",
            "manifest": r.manifest.to_string_lossy(),
            "met": r.met(),
            "checks": checks,
            "tools": tools,
        }));
    }
    let unmet = items.iter().filter(|i| i["met"] == false).count();
    if args.json {
        let doc = json!({"ok": unmet == 0, "unmet": unmet, "skills": items});
        let text = serde_json::to_string_pretty(&doc).map_err(io::Error::other)?;
        writeln!(out, "{text}")?;
    } else {
        for i in &items {
            let status = if i["met"] == true { "ok" } else { "unmet" };
            // Written by the pack: printed without control characters.
            let text = |v: &Value| printable::line(v.as_str().unwrap_or_default()).into_owned();
            let (name, manifest) = (text(&i["name"]), text(&i["manifest"]));
            let source = i["source"].as_str().unwrap_or_default();
            writeln!(out, "{status:<6}{name} ({source}, {manifest})")?;
            let checks = i["checks"].as_array().map(Vec::as_slice).unwrap_or_default();
            if checks.is_empty() {
                writeln!(out, "      no requirements")?;
            }
            for c in checks {
                let mark = match (c["met"] == true, c.get("error").is_some()) {
                    (true, _) => "ok   ",
                    // Its status could not be read: it may be there.
                    (false, true) => "UNKNOWN",
                    (false, false) => "MISSING",
                };
                writeln!(out, "      {mark:<8}{}", text(&c["message"]))?;
            }
            let tools: Vec<&str> = i["tools"]
                .as_array()
                .map(|t| t.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if source == "skill.md" {
                let shown = if tools.is_empty() {
                    "none".to_owned()
                } else {
                    printable::line(&tools.join(", ")).into_owned()
                };
                writeln!(out, "      tools: {shown}")?;
            }
        }
        writeln!(out, "{} skill(s), {unmet} with unmet requirements", items.len())?;
    }
    Ok(if unmet == 0 && !missing { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
