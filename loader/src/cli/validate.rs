//! `ongrid-skill validate [--json] PATH...`: lint for a pack's own CI.
//!
//! Each PATH is a `skill.json`, a pack folder or a whole root. A folder is
//! walked exactly as the loader walks a root; a single manifest is checked
//! with its own folder as the root. Every manifest gets one line: `ok` or
//! `error` with its path and reason, plus `note` lines (ignored fields, a
//! clamped timeout, a symlinked folder, which the daemon does not follow
//! inside a root, a manifest, entry or folder the executor refuses
//! because it is group or world writable, an entry that is neither ELF nor `#!`) that do
//! not fail. A manifest reached through several
//! PATHs (a folder and its `skill.json`, nested folders, a symlink to a
//! folder) is checked once, by its canonical path. Exits 1 if anything
//! failed: a skipped manifest, a duplicate name, an unreadable path, or a
//! folder without any `skill.json`.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use policy::path::is_within;
use policy::ValidateOptions;
use serde_json::json;

use crate::scan::event::ScanEvent;
use crate::scan::{ScanTarget, Scanner};
use policy::printable;

/// Arguments of `validate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the results as a JSON object.
    /// (The global `--json`.)
    #[arg(skip)]
    pub json: bool,
    /// An `executor.toml` (or an `up --grants` file): note each manifest
    /// `sandbox.network.connect` entry its `[skills.NAME]` grant does not
    /// cover (the run gets the grant's list, never the manifest's).
    #[arg(long, value_name = "FILE")]
    pub grants: Option<PathBuf>,
    /// Manifests (`skill.json`), pack folders or roots to check.
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<PathBuf>,
}

/// The note on a PATH that is a symlink to a folder: checked through the
/// link, but the daemon would not follow it inside a root.
const SYMLINK_NOTE: &str = "a symlink to a directory: checked through it here, but the \
                            daemon does not follow it inside an allow-list root (an \
                            allow-list root may be one)";

/// How one result line counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Note,
    Error,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Note => "note",
            Status::Error => "error",
        }
    }
}

/// One line of the report.
#[derive(Debug)]
struct Finding {
    status: Status,
    path: PathBuf,
    message: String,
}

impl Finding {
    fn from_event(event: &ScanEvent) -> Self {
        let status = match event {
            ScanEvent::Registered { .. } => Status::Ok,
            // A folder given twice (by another spelling): checked once.
            ScanEvent::RootRepeated { .. } => Status::Note,
            // Not followed, as by the daemon; not an error of the pack.
            ScanEvent::SymlinkedDir { .. } => Status::Note,
            e if e.is_skip() => Status::Error,
            _ => Status::Note,
        };
        Self { status, path: event.path().to_path_buf(), message: event.reason() }
    }
}

/// What `validate PATH` says of a file not named `skill.json` or
/// `SKILL.md`: the daemons read no other file as a manifest.
const NOT_A_MANIFEST_NAME: &str =
    "not a manifest: the daemons read only files named skill.json or SKILL.md";

/// A note when the entry or the manifest of `skill`, or a folder between
/// either and its root, is group or world writable: the loader registers
/// such a pack, but `ongrid-executor` refuses every run of it (`rejected`),
/// whatever its configuration, so the author hears it here rather than at
/// the first run.
fn writable_note(skill: &crate::scan::skill::RegisteredSkill) -> Option<Finding> {
    let root = std::fs::canonicalize(skill.root()).ok()?;
    let manifest = std::fs::canonicalize(skill.manifest_path()).ok();
    let note = |p: &Path| writable_up_to(skill, p, &root);
    note(skill.entry()).or_else(|| manifest.as_deref().and_then(note))
}

/// The note of [`writable_note`] for `from` and each folder up to `root`.
fn writable_up_to(
    skill: &crate::scan::skill::RegisteredSkill,
    from: &Path,
    root: &Path,
) -> Option<Finding> {
    use std::os::unix::fs::MetadataExt;
    let mut at = Some(from);
    while let Some(p) = at {
        if !is_within(p, root) {
            break;
        }
        let mode = std::fs::metadata(p).ok()?.mode() & 0o7777;
        if mode & 0o022 != 0 {
            let message = format!(
                "{} is group or world writable (mode {mode:o}): ongrid-executor refuses to run \
                 the skill; chmod go-w {}",
                p.display(),
                p.display()
            );
            let path = skill.manifest_path().to_path_buf();
            return Some(Finding { status: Status::Note, path, message });
        }
        if p == root {
            break;
        }
        at = p.parent();
    }
    None
}

/// A note when the entry of `skill` is neither an ELF binary nor a script
/// starting with `#!`: `execve` refuses it (`ENOEXEC`), so every run ends
/// `spawn_failed` with "Exec format error" (a shell would have run it, the
/// executor runs no shell).
fn exec_format_note(skill: &crate::scan::skill::RegisteredSkill) -> Option<Finding> {
    use std::io::Read;
    let mut head = [0u8; 4];
    let mut file = std::fs::File::open(skill.entry()).ok()?;
    let n = file.read(&mut head).ok()?;
    let head = &head[..n];
    if head.starts_with(b"#!") || head.starts_with(b"\x7fELF") {
        return None;
    }
    let message = format!(
        "{} is neither an ELF binary nor a script starting with #! (an interpreter line such \
         as #!/bin/sh): every run would fail with spawn_failed (Exec format error)",
        skill.entry().display()
    );
    Some(Finding { status: Status::Note, path: skill.manifest_path().to_path_buf(), message })
}

/// The `[skills.NAME]` tables of a grants file (other keys ignored).
#[derive(Debug, Default, serde::Deserialize)]
struct GrantsFile {
    #[serde(default)]
    skills: std::collections::BTreeMap<String, policy::SkillGrant>,
}

/// The grants of `path`, or the error line about it.
fn read_grants(path: &std::path::Path) -> Result<GrantsFile, Finding> {
    let fail = |message: String| Finding { status: Status::Error, path: path.into(), message };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let grants: GrantsFile = toml::from_str(&text).map_err(|e| fail(format!("grants: {e}")))?;
    for (name, grant) in &grants.skills {
        grant.check().map_err(|e| fail(format!("grants: [skills.{name}] {e}")))?;
    }
    Ok(grants)
}

/// A note naming the `connect` entries of `skill`'s manifest that a run
/// under its grant would not reach. A grant of the network without a list
/// covers every destination outside the default refusals.
fn uncovered_note(
    grants: &GrantsFile,
    skill: &crate::scan::skill::RegisteredSkill,
) -> Option<Finding> {
    let asked = &skill.manifest().sandbox().connect;
    if asked.is_empty() {
        return None;
    }
    let grant = grants.skills.get(skill.name());
    let any: Vec<policy::egress::Entry> =
        ["0.0.0.0/0:*", "[::]/0:*"].iter().filter_map(|e| e.parse().ok()).collect();
    let list = match grant {
        Some(g) if g.network && g.connect.is_empty() => &any,
        Some(g) if g.network => &g.connect,
        _ => &Vec::new(),
    };
    let missing = policy::egress::rules::unreachable(list, asked);
    if missing.is_empty() {
        return None;
    }
    let names: Vec<String> = missing.iter().map(ToString::to_string).collect();
    let message = format!(
        "sandbox.network.connect: no grant of [skills.{}] covers {} (a run gets the grant's \
         list only; loopback, 0.0.0.0/8 and link-local only from an entry within them, port 53 \
         only from an entry naming it)",
        skill.name(),
        names.join(", ")
    );
    Some(Finding { status: Status::Note, path: skill.manifest_path().to_path_buf(), message })
}

/// Validates every PATH and prints one line per finding on `out`.
///
/// # Errors
///
/// I/O errors writing the output.
pub fn run(args: &Args, out: &mut dyn Write, _err: &mut dyn Write) -> io::Result<ExitCode> {
    let mut findings = Vec::new();
    let mut targets = Vec::new();
    // Folders that must contain at least one manifest, canonical.
    let mut folders = Vec::new();
    let mut seen = Vec::new();
    for given in &args.paths {
        let path = super::dirs::absolute(given);
        // The same PATH twice is checked once; a manifest reached through two
        // PATHs (a folder and its skill.json, nested folders) is loaded
        // once by the scan itself (`Scanner::scan_targets`).
        if seen.contains(&path) {
            continue;
        }
        seen.push(path.clone());
        match std::fs::metadata(&path) {
            Err(e) => {
                findings.push(Finding { status: Status::Error, path, message: e.to_string() })
            }
            Ok(meta) if meta.is_dir() => {
                if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_symlink()) {
                    let message = SYMLINK_NOTE.to_owned();
                    findings.push(Finding { status: Status::Note, path: path.clone(), message });
                }
                if let Ok(canonical) = std::fs::canonicalize(&path) {
                    folders.push((path.clone(), canonical));
                }
                targets.push(ScanTarget::Root(path));
            }
            Ok(_) if !policy::is_manifest_path(&path) => {
                let message = NOT_A_MANIFEST_NAME.to_owned();
                findings.push(Finding { status: Status::Error, path, message });
            }
            Ok(_) => targets.push(ScanTarget::Manifest(path)),
        }
    }

    let report = Scanner::new(ValidateOptions::default()).scan_targets(&targets);
    findings.extend(report.events.iter().map(Finding::from_event));
    findings.extend(report.skills.iter().filter_map(writable_note));
    findings.extend(report.skills.iter().filter_map(exec_format_note));
    if let Some(path) = &args.grants {
        match read_grants(path) {
            Ok(g) => findings.extend(report.skills.iter().filter_map(|s| uncovered_note(&g, s))),
            Err(f) => findings.push(f),
        }
    }
    for (given, canonical) in folders {
        let found = report.events.iter().any(|e| {
            e.path() != canonical
                && is_within(e.path(), &canonical)
                && !matches!(e, ScanEvent::Walk { .. } | ScanEvent::SymlinkedDir { .. })
        });
        if !found {
            let message = "no skill.json found".to_owned();
            findings.push(Finding { status: Status::Error, path: given, message });
        }
    }

    let ok = findings.iter().filter(|f| f.status == Status::Ok).count();
    let failed = findings.iter().filter(|f| f.status == Status::Error).count();
    if args.json {
        let items: Vec<serde_json::Value> = findings
            .iter()
            .map(|f| {
                json!({
                    "status": f.status.word(),
                    "path": f.path.to_string_lossy(),
                    "message": f.message,
                })
            })
            .collect();
        let doc = json!({"ok": failed == 0, "valid": ok, "errors": failed, "findings": items});
        let text = serde_json::to_string_pretty(&doc).map_err(io::Error::other)?;
        writeln!(out, "{text}")?;
    } else {
        for f in &findings {
            let path = f.path.display().to_string();
            let (path, message) = (printable::line(&path), printable::line(&f.message));
            writeln!(out, "{:<5} {path}: {message}", f.status.word())?;
        }
        writeln!(out, "{ok} valid, {failed} failed")?;
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
