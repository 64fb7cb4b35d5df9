//! Choosing, before anything starts: the skill roots, the runtime
//! directory, the executor binary, the user skills run as, skilld's
//! settings and the `--grants` to pass on ([`Plan`]).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use plumbing::errors::chain;
use policy::{PermissionMode, SkillGrant, DEFAULT_MAX_WARM_TOTAL};
use serde::Deserialize;

use crate::daemon::config::{CallerEntry, FileConfig, Overrides, Settings, DEFAULT_METRICS_LISTEN};

/// Name of the generated executor configuration in the runtime dir.
pub const EXECUTOR_CONFIG: &str = "executor.toml";
/// Name of the executor socket in the runtime dir.
pub const EXECUTOR_SOCKET: &str = "executor.sock";
/// Name of the audit database in the runtime dir.
pub const AUDIT_DB: &str = "audit.db";
/// Name of the client API socket in the runtime dir.
pub const SKILLD_SOCKET: &str = "skilld.sock";
/// Default runtime dir as root.
pub const ROOT_RUNTIME_DIR: &str = "/run/ongrid-up";
/// Where the packages install the example skills.
pub const INSTALLED_EXAMPLES: &str = "/usr/share/ongrid/examples/skills";
/// The example skills of the source tree this binary was built from.
pub const SOURCE_EXAMPLES: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/examples/skills");

/// Arguments of `up`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Exit codes: 0 after Ctrl-C, SIGTERM or SIGHUP, 1 if a daemon could not start,
the executor died or the ready lines could not be written, 2 usage error.")]
pub struct Args {
    /// A skill root (a folder of packs, or one pack) to serve besides the
    /// examples; repeatable.
    #[arg(long = "skills", value_name = "DIR")]
    pub skills: Vec<PathBuf>,
    /// Where the sockets, the generated executor.toml and the run dirs go
    /// [default: /run/ongrid-up as root, else $XDG_RUNTIME_DIR/ongrid-up or
    /// /tmp/ongrid-up-$UID].
    #[arg(long, value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,
    /// Metrics listener ADDR:PORT; "" disables it.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_METRICS_LISTEN)]
    pub metrics_listen: String,
    /// Leave out the bundled example skills.
    #[arg(long)]
    pub no_examples: bool,
    /// A skilld.toml whose permission and audit keys ([[callers]],
    /// [[approvers]], approval_max_ttl_seconds, audit_*) apply.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A TOML file of `[skills.NAME]` grants, as in executor.toml, for what
    /// your packs' `sandbox` objects ask (network, fs_read, ...) and
    /// `warm = N` (at most 8, the default max_warm_total); a grant here
    /// replaces an example's of the same name.
    #[arg(long, value_name = "FILE")]
    pub grants: Option<PathBuf>,
    /// Whether reports list what the box refused each run
    /// (`sandbox.denials`): auto, when the kernel's audit is already on
    /// (auditd); on, the executor turns it on while it runs; off.
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub report_denials: String,
}

/// A start-up failure: the message, and whether it is a usage error.
#[derive(Debug)]
pub(super) struct Failure {
    usage: bool,
    message: String,
}

impl Failure {
    pub(super) fn usage(message: impl Into<String>) -> Self {
        Self { usage: true, message: message.into() }
    }

    pub(super) fn start(message: impl Into<String>) -> Self {
        Self { usage: false, message: message.into() }
    }
}

/// Says `f` on `err`; its exit code (2 for a usage error, else 1).
///
/// # Errors
///
/// I/O errors writing `err`.
pub(super) fn fail(f: &Failure, err: &mut dyn Write) -> io::Result<ExitCode> {
    writeln!(err, "ongrid-skill up: {}", f.message)?;
    Ok(ExitCode::from(if f.usage { 2 } else { 1 }))
}

/// Everything decided before anything starts.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) runtime_dir: PathBuf,
    pub(super) roots: Vec<PathBuf>,
    pub(super) executor_bin: PathBuf,
    pub(super) metrics: Option<SocketAddr>,
    pub(super) settings: Settings,
    /// As root: the user skills run as, when not `ongrid-skill`.
    pub(super) run_as: Option<String>,
    /// The `[skills.NAME]` grants of `--grants`.
    pub(super) grants: BTreeMap<String, toml::Table>,
    /// `--report-denials`.
    pub(super) report_denials: String,
}

impl Plan {
    /// Decides from `args`; notes (a missing example directory, the user
    /// skills run as) go to `err`.
    pub(super) fn new(args: &Args, err: &mut dyn Write) -> Result<Self, Failure> {
        let metrics = args.metrics_listen.trim();
        let metrics = if metrics.is_empty() {
            None
        } else {
            Some(metrics.parse::<SocketAddr>().map_err(|e| {
                Failure::usage(format!("--metrics-listen {metrics:?}: {e} (want ADDR:PORT)"))
            })?)
        };
        let mut roots = Vec::new();
        if !args.no_examples {
            match examples_dir() {
                Some(dir) => roots.push(dir),
                None => {
                    let _ = writeln!(
                        err,
                        "ongrid-skill up: note: the example skills were not found \
                         (looked in $ONGRID_EXAMPLES_DIR, {INSTALLED_EXAMPLES} and {SOURCE_EXAMPLES})"
                    );
                }
            }
        }
        for dir in &args.skills {
            let canonical = fs::canonicalize(dir).map_err(|e| {
                // A relative path is read from the current directory: say which.
                let cwd = dir.is_relative().then(std::env::current_dir).and_then(Result::ok);
                let from = cwd.map(|c| format!(" (in {})", c.display())).unwrap_or_default();
                Failure::usage(format!("--skills {}{from}: {e}", dir.display()))
            })?;
            if !canonical.is_dir() {
                return Err(Failure::usage(format!("--skills {}: not a directory", dir.display())));
            }
            if !roots.contains(&canonical) {
                roots.push(canonical);
            }
        }
        if roots.is_empty() {
            return Err(Failure::usage("no skill directories: give --skills DIR"));
        }
        let runtime_dir = match &args.runtime_dir {
            Some(dir) => crate::cli::dirs::absolute(dir),
            None => default_runtime_dir(),
        };
        let executor_bin = executor_bin().ok_or_else(|| {
            Failure::start(
                "ongrid-executor not found next to this binary nor on PATH \
                 (build it: cargo build --workspace --bins; or set ONGRID_EXECUTOR)",
            )
        })?;
        let run_as = run_as_user(err);
        let mut file = match &args.config {
            Some(path) => FileConfig::load(Some(path)).map_err(|e| {
                Failure::usage(format!("--config {}: {}", path.display(), chain(&e)))
            })?,
            None => FileConfig::default(),
        };
        // The socket is yours alone unless the file says otherwise (the
        // daemon's default, 0660, would let your primary group run your
        // skills as you).
        file.socket_mode.get_or_insert_with(|| "0600".to_owned());
        if file.callers.is_none() {
            file.callers = Some(vec![CallerEntry {
                uid: Some(nix_uid()),
                user: None,
                gid: None,
                group: None,
                role: "owner".into(),
                mode: PermissionMode::DualSignRequired,
                audit: true,
            }]);
        }
        let settings = file
            .resolve(
                Overrides {
                    socket: Some(runtime_dir.join(SKILLD_SOCKET)),
                    executor_socket: Some(runtime_dir.join(EXECUTOR_SOCKET)),
                    metrics_listen: Some(args.metrics_listen.clone()),
                    skills_dirs: roots.clone(),
                    audit_db: Some(runtime_dir.join(AUDIT_DB)),
                },
                Vec::new(),
            )
            .map_err(|e| Failure::usage(e.to_string()))?;
        let grants = match &args.grants {
            Some(path) => read_grants(path).map_err(Failure::usage)?,
            None => BTreeMap::new(),
        };
        let report_denials = args.report_denials.clone();
        Ok(Self {
            runtime_dir,
            roots,
            executor_bin,
            metrics,
            settings,
            run_as,
            grants,
            report_denials,
        })
    }
}

pub(super) fn nix_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

pub(super) fn is_root() -> bool {
    nix_uid() == 0
}

/// The default runtime directory (see the module docs).
pub fn default_runtime_dir() -> PathBuf {
    if is_root() {
        return PathBuf::from(ROOT_RUNTIME_DIR);
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(x) if Path::new(&x).is_absolute() => Path::new(&x).join("ongrid-up"),
        _ => PathBuf::from(format!("/tmp/ongrid-up-{}", nix_uid())),
    }
}

/// The example skills directory (see the module docs), canonical.
pub fn examples_dir() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("ONGRID_EXAMPLES_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    if let Some(bin_dir) = std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_owned))
    {
        candidates.push(bin_dir.join("../share/ongrid/examples/skills"));
    }
    candidates.push(PathBuf::from(INSTALLED_EXAMPLES));
    candidates.push(PathBuf::from(SOURCE_EXAMPLES));
    candidates.into_iter().find_map(|c| fs::canonicalize(c).ok().filter(|c| c.is_dir()))
}

/// `ongrid-executor`: `$ONGRID_EXECUTOR`, next to this binary, or on PATH.
pub fn executor_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ONGRID_EXECUTOR") {
        return Some(PathBuf::from(p));
    }
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("ongrid-executor")))
        .filter(|p| p.is_file());
    sibling.or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("ongrid-executor"))
                .find(|p| p.is_file() && p.is_absolute())
        })
    })
}

/// The user name of `uid`.
pub(super) fn user_name(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok().flatten().map(|u| u.name)
}

fn user_exists(name: &str) -> bool {
    nix::unistd::User::from_name(name).ok().flatten().is_some()
}

/// As root: the user skills run as (`ongrid-skill`, else `nobody`).
fn run_as_user(err: &mut dyn Write) -> Option<String> {
    if !is_root() {
        return None;
    }
    if user_exists("ongrid-skill") {
        return None;
    }
    if user_exists("nobody") {
        let _ = writeln!(
            err,
            "ongrid-skill up: note: user ongrid-skill does not exist; skills run as nobody \
             (create it: useradd --system --user-group --no-create-home --shell /usr/sbin/nologin ongrid-skill)"
        );
        return Some("nobody".to_owned());
    }
    None
}

/// The `[skills.NAME]` grants of `--grants FILE`, each checked as the
/// executor will read it (a field it does not know, a bad name, a grant
/// that does not hold together, a file with any other key are refused
/// here, naming the file).
pub(super) fn read_grants(path: &Path) -> Result<BTreeMap<String, toml::Table>, String> {
    let at = |e: &dyn std::fmt::Display| format!("--grants {}: {e}", path.display());
    let text = fs::read_to_string(path).map_err(|e| at(&e))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| at(&e))?;
    let mut grants = BTreeMap::new();
    for (key, value) in table {
        let toml::Value::Table(skills) = value else {
            return Err(at(&format!("{key}: only [skills.NAME] tables may be given")));
        };
        if key != "skills" {
            return Err(at(&format!("[{key}]: only [skills.NAME] tables may be given")));
        }
        for (name, grant) in skills {
            policy::SkillName::new(&name).map_err(|e| at(&format!("[skills.{name}]: {e}")))?;
            // Read as the executor will read it, kept as written.
            let read = SkillGrant::deserialize(grant.clone())
                .map_err(|e| at(&format!("[skills.{name}]: {e}")))?;
            read.check().map_err(|e| at(&format!("[skills.{name}] {e}")))?;
            // The executor `up` starts keeps its default `max_warm_total`.
            if read.warm as usize > DEFAULT_MAX_WARM_TOTAL {
                let max = DEFAULT_MAX_WARM_TOTAL;
                return Err(at(&format!(
                    "[skills.{name}] warm: at most {max} (the max_warm_total of the executor up starts)"
                )));
            }
            let toml::Value::Table(grant) = grant else {
                return Err(at(&format!("[skills.{name}]: not a table")));
            };
            grants.insert(name, grant);
        }
    }
    Ok(grants)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_examples_exist() {
        assert!(examples_dir().is_some());
    }
}
