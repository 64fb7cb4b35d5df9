//! `executor.toml`: the operator's configuration, owned by root.
//!
//! Every field is optional; an unknown field is an error (a typo in a
//! security configuration must not be ignored). See
//! `packaging/executor.toml` for a commented example.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use policy::{Limits, SkillClass, SkillGrant};
use serde::Deserialize;

/// The largest `max_timeout_seconds`: a day. No run lasts longer, which
/// the registry's audit relies on (a row open longer is no run in flight).
pub const MAX_TIMEOUT_SECONDS: u64 = 86_400;

/// Default user skills run as when the executor is root.
pub const DEFAULT_RUN_AS: &str = "ongrid-skill";
/// Default runtime directory when the executor is root.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/ongrid";
/// Default system-wide configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ongrid/executor.toml";
/// Allow-list root `serve` uses when `roots` is empty (`run` uses the
/// manifest's own folder instead).
pub const DEFAULT_SERVE_ROOT: &str = "/etc/ongrid/skills";
/// File name of the socket in the runtime directory.
pub const SOCKET_NAME: &str = "executor.sock";
/// User and group of the loader (`ongrid-skilld`), the expected peer.
pub const LOADER_USER: &str = "ongrid";
/// Longest accepted line when `max_line_bytes` is not set.
pub const DEFAULT_MAX_LINE_BYTES: usize = policy::wire::MAX_LINE_BYTES;
/// Smallest `runs_tmpfs_bytes` (1 MiB).
pub const MIN_RUNS_TMPFS_BYTES: u64 = 1 << 20;
/// Largest default size of the runs tmpfs when runs have no memory cgroup
/// (1 GiB).
pub const DEFAULT_RUNS_TMPFS_BYTES: u64 = 1 << 30;
/// Largest size the runs tmpfs is given by default (1 PiB: well inside what
/// the kernel's `size=` takes, where an overflow would mean "no limit").
pub const MAX_RUNS_TMPFS_BYTES: u64 = 1 << 50;
/// Default `idle_timeout_seconds`.
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u64 = 60;
/// Default `hold_timeout_seconds`.
pub const DEFAULT_HOLD_TIMEOUT_SECONDS: u64 = 30;
/// Default `drain_timeout_seconds`: under the unit's `TimeoutStopSec=90s`,
/// as skilld's.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: u64 = 75;
/// Default `max_warm_total` (half the default `max_concurrent_runs`).
pub use policy::DEFAULT_MAX_WARM_TOTAL;
/// Default `warm_idle_seconds`.
pub const DEFAULT_WARM_IDLE_SECONDS: u64 = 60;
/// Shortest `max_line_bytes` (a request with a manifest path must fit).
pub const MIN_MAX_LINE_BYTES: usize = 1024;

/// Whether Landlock's ABI 1 filesystem rights are a hard requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LandlockMode {
    /// A kernel without Landlock fails every run with `sandbox_failed`.
    #[default]
    Required,
    /// Run without (or with partial) Landlock and say so in the report.
    BestEffort,
}

/// Whether a networked run's egress allowlist must be held by the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EgressMode {
    /// A networked run whose allowlist cannot be attached (no cgroup v2
    /// hierarchy, no BPF) fails with `sandbox_failed`.
    #[default]
    Required,
    /// Run it with the network unrestricted and say so in the report.
    BestEffort,
}

/// Whether runs' Landlock and seccomp refusals are read back from the
/// kernel's audit into their reports (`sandbox.denials`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReportDenials {
    /// Only when the kernel's audit is already enabled (by auditd or the
    /// operator): nothing of the host's audit setup is changed.
    #[default]
    Auto,
    /// The executor enables the kernel's audit when it is off (no rules, a
    /// rate limit), and restores what it changed when it exits.
    On,
    /// Never: reports say so.
    Off,
}

/// The parsed `executor.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// User skills run as when the executor is root.
    pub run_as: String,
    /// Allow-list roots; empty = for `run`, the manifest's folder.
    pub roots: Vec<PathBuf>,
    /// Per-run directories live under `<runtime_dir>/runs/`.
    pub runtime_dir: Option<PathBuf>,
    /// Size of the tmpfs the executor (as root) mounts on
    /// `<runtime_dir>/runs` unless a tmpfs is mounted there already: the
    /// bound on all runs' files together (each run's own files are also
    /// charged to its memory cgroup). Default, with a memory cgroup per run:
    /// `max_concurrent_runs` times the largest `memory_bytes` a run may
    /// have, so that no run can fill it for another; without one, 1 GiB or
    /// a quarter of RAM, whichever is less.
    pub runs_tmpfs_bytes: Option<u64>,
    /// Landlock requirement.
    pub landlock: LandlockMode,
    /// Egress allowlist requirement (networked runs).
    pub egress: EgressMode,
    /// Whether refusals are reported (`"auto"`, `"on"`, `"off"`).
    pub report_denials: ReportDenials,
    /// Where the resolvers of a `dns = true` grant are read (`nameserver`
    /// lines).
    pub resolv_conf: PathBuf,
    /// Longest timeout a manifest may ask for (longer ones are clamped);
    /// at most [`MAX_TIMEOUT_SECONDS`].
    pub max_timeout_seconds: u64,
    /// Users that may own an entry and its folders (plus the executor's own user).
    pub entry_owners: Vec<String>,
    /// Default limits of every run.
    pub limits: Limits,
    /// What each skill may ask for beyond the default box, by skill name.
    pub skills: BTreeMap<String, SkillGrant>,

    // `serve` settings: the executor socket and who may use it.
    /// Socket path; default `<runtime_dir>/executor.sock`.
    pub socket: Option<PathBuf>,
    /// User owning the socket node (name or number).
    pub socket_owner: String,
    /// Group of the socket node (name or number); default `ongrid` when that
    /// group exists, else the socket stays root's group (with a log line).
    pub socket_group: Option<String>,
    /// Mode of the socket node, octal (`"0660"`).
    pub socket_mode: String,
    /// Peer uids (SO_PEERCRED) that may talk to the executor; default root,
    /// the `ongrid` user if it exists, and the executor's own uid.
    pub allowed_uids: Option<Vec<u32>>,
    /// Peer primary gids that may talk to the executor; default none (the
    /// `ongrid` group is the API clients' group, so it must not be one).
    pub allowed_gids: Option<Vec<u32>>,
    /// Skill classes a peer may run, by peer uid (defence in depth: the
    /// loader decides, the executor re-checks with the class it read
    /// itself). A peer without an entry may run every class.
    pub peers: Vec<PeerClasses>,
    /// Runs at once.
    pub max_concurrent_runs: usize,
    /// Runs waiting for a slot; beyond them an `execute` is answered `busy`.
    pub max_queued_runs: usize,
    /// Connections at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Longest request line, bytes.
    pub max_line_bytes: usize,
    /// A connection without a run in flight and without a complete request
    /// line for this long is closed (0 = never).
    pub idle_timeout_seconds: u64,
    /// A held run (`execute` with `hold`) not started for this long ends
    /// as `rejected`, never spawned (at least 1).
    pub hold_timeout_seconds: u64,
    /// On SIGTERM, the longest wait for the runs in flight before the
    /// executor kills them (at least 1; keep it under the unit's
    /// `TimeoutStopSec=`). The wait also ends when the longest run could
    /// have ended (`max_timeout_seconds` and the kill grace).
    pub drain_timeout_seconds: u64,
    /// `serve` turns `favordynmods` on for the cgroup hierarchies at start
    /// when none has it ([`crate::host::dynmods`]): runs after an idle gap then
    /// skip an RCU grace period (4.5-24 ms measured) in their cgroup join.
    pub cgroup_favordynmods: bool,
    /// Warm runs (`[skills.NAME] warm`) kept at once over every skill;
    /// each counts toward `max_concurrent_runs`, which must stay above the
    /// warm runs granted so that a cold run always finds a slot.
    pub max_warm_total: usize,
    /// A warm run not taken for this long is killed and made again, so
    /// that an idle skill's processes do not sit for ever (at least 1).
    pub warm_idle_seconds: u64,
}

/// Which skill classes one peer may run (`[[peers]]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerClasses {
    /// The peer's uid.
    pub uid: Option<u32>,
    /// The peer's user name (instead of `uid`).
    pub user: Option<String>,
    /// The classes it may run.
    pub classes: Vec<SkillClass>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            run_as: DEFAULT_RUN_AS.to_owned(),
            roots: Vec::new(),
            runtime_dir: None,
            runs_tmpfs_bytes: None,
            landlock: LandlockMode::Required,
            egress: EgressMode::Required,
            report_denials: ReportDenials::Auto,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            max_timeout_seconds: policy::limits::DEFAULT_MAX_TIMEOUT.as_secs(),
            entry_owners: vec!["root".to_owned()],
            limits: Limits::default(),
            skills: BTreeMap::new(),
            socket: None,
            socket_owner: "root".to_owned(),
            socket_group: None,
            socket_mode: "0660".to_owned(),
            allowed_uids: None,
            allowed_gids: None,
            peers: Vec::new(),
            max_concurrent_runs: 16,
            max_queued_runs: 64,
            max_connections: 256,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            idle_timeout_seconds: DEFAULT_IDLE_TIMEOUT_SECONDS,
            hold_timeout_seconds: DEFAULT_HOLD_TIMEOUT_SECONDS,
            drain_timeout_seconds: DEFAULT_DRAIN_TIMEOUT_SECONDS,
            cgroup_favordynmods: true,
            max_warm_total: DEFAULT_MAX_WARM_TOTAL,
            warm_idle_seconds: DEFAULT_WARM_IDLE_SECONDS,
        }
    }
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("config {path}: cannot read")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for [`Config`].
    #[error("config {path}: {error}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause, said in the message (not also as a source, which a
        /// caller printing the chain would print twice).
        error: Box<toml::de::Error>,
    },
    /// A value is out of range.
    #[error("config {path}: {field}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl Config {
    /// Reads and validates `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the file and field.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text` (`path` is for messages).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the file and field.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: path.to_owned(), error: Box::new(e) })?;
        config.validate(path)?;
        Ok(config)
    }

    /// The run-as users this configuration names (`run_as` and every user
    /// a skill is granted) that do not exist on this host, looked up now
    /// (through NSS): every run as one of them fails (`sandbox_failed`)
    /// until it is created. Only a root executor switches users.
    pub fn missing_users(&self) -> Vec<String> {
        let mut names: Vec<&str> = std::iter::once(self.run_as.as_str())
            .chain(self.skills.values().flat_map(|g| g.run_as.iter().map(String::as_str)))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .filter(|name| nix::unistd::User::from_name(name).ok().flatten().is_none())
            .map(str::to_owned)
            .collect()
    }

    /// Warm runs over every skill, as granted (each grant at most
    /// `max_warm_total`, the sum clamped to it).
    pub fn warm_total(&self) -> usize {
        let sum = self.skills.values().map(|g| g.warm as usize).fold(0, usize::saturating_add);
        sum.min(self.max_warm_total)
    }

    /// The warm-run settings: `(field, reason)` of the first that is off.
    fn validate_warm(&self) -> Result<(), (&'static str, String)> {
        if self.warm_idle_seconds == 0 {
            return Err(("warm_idle_seconds", "must be at least 1".to_owned()));
        }
        for (name, grant) in &self.skills {
            if grant.warm as usize > self.max_warm_total {
                let max = self.max_warm_total;
                return Err(("skills", format!("[skills.{name}] warm: at most {max}")));
            }
        }
        // What is granted, not the bound: a configuration granting none is
        // valid with any `max_concurrent_runs`.
        if self.warm_total() >= self.max_concurrent_runs {
            return Err((
                "max_warm_total",
                format!(
                    "the warm runs granted ({}) must stay below max_concurrent_runs ({}): they \
                     count toward it",
                    self.warm_total(),
                    self.max_concurrent_runs
                ),
            ));
        }
        Ok(())
    }

    /// Each `[skills.NAME]` grant: a skill name, and a grant that holds
    /// together ([`policy::SkillGrant::check`]).
    fn validate_skills(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            path: path.to_owned(),
            field: "skills",
            reason,
        };
        for (name, grant) in &self.skills {
            policy::SkillName::new(name).map_err(|e| invalid(format!("[skills.{name}]: {e}")))?;
            grant.check().map_err(|e| invalid(format!("[skills.{name}] {e}")))?;
        }
        Ok(())
    }

    /// Each `[[peers]]` names one uid or one user, and none twice.
    fn validate_peers(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid =
            |field, reason: String| ConfigError::Invalid { path: path.to_owned(), field, reason };
        let mut seen = Vec::new();
        for p in &self.peers {
            let who = match (&p.uid, &p.user) {
                (Some(uid), None) => uid.to_string(),
                (None, Some(user)) if !user.is_empty() => user.clone(),
                _ => {
                    return Err(invalid(
                        "peers",
                        "each [[peers]] needs exactly one of uid or user".to_owned(),
                    ))
                }
            };
            if seen.contains(&who) {
                return Err(invalid("peers", format!("peer {who} listed twice")));
            }
            seen.push(who);
        }
        Ok(())
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid =
            |field, reason: String| ConfigError::Invalid { path: path.to_owned(), field, reason };
        if self.run_as.is_empty() {
            return Err(invalid("run_as", "empty user name".to_owned()));
        }
        for root in &self.roots {
            let s = root.to_string_lossy();
            policy::path::absolute_normal(&s).map_err(|e| invalid("roots", e.to_string()))?;
        }
        if let Some(dir) = &self.runtime_dir {
            policy::path::absolute_normal(&dir.to_string_lossy())
                .map_err(|e| invalid("runtime_dir", e.to_string()))?;
        }
        if self.runs_tmpfs_bytes.is_some_and(|b| b < MIN_RUNS_TMPFS_BYTES) {
            return Err(invalid(
                "runs_tmpfs_bytes",
                format!("must be at least {MIN_RUNS_TMPFS_BYTES}"),
            ));
        }
        if self.runs_tmpfs_bytes.is_some_and(|b| b > MAX_RUNS_TMPFS_BYTES) {
            return Err(invalid(
                "runs_tmpfs_bytes",
                format!("must be at most {MAX_RUNS_TMPFS_BYTES}"),
            ));
        }
        if !(1..=MAX_TIMEOUT_SECONDS).contains(&self.max_timeout_seconds) {
            let why = format!("must be from 1 to {MAX_TIMEOUT_SECONDS} (a day)");
            return Err(invalid("max_timeout_seconds", why));
        }
        self.limits.check().map_err(|e| invalid("limits", e.to_string()))?;
        self.validate_skills(path)?;
        if let Some(socket) = &self.socket {
            policy::path::absolute_normal(&socket.to_string_lossy())
                .map_err(|e| invalid("socket", e.to_string()))?;
        }
        if self.socket_owner.is_empty() {
            return Err(invalid("socket_owner", "empty user name".to_owned()));
        }
        if self.socket_group.as_deref() == Some("") {
            return Err(invalid("socket_group", "empty group name".to_owned()));
        }
        parse_mode(&self.socket_mode).map_err(|reason| invalid("socket_mode", reason))?;
        self.validate_peers(path)?;
        if self.max_concurrent_runs == 0 {
            return Err(invalid("max_concurrent_runs", "must be at least 1".to_owned()));
        }
        if self.hold_timeout_seconds == 0 {
            return Err(invalid("hold_timeout_seconds", "must be at least 1".to_owned()));
        }
        if self.drain_timeout_seconds == 0 {
            return Err(invalid("drain_timeout_seconds", "must be at least 1".to_owned()));
        }
        if self.max_connections == 0 {
            return Err(invalid("max_connections", "must be at least 1".to_owned()));
        }
        self.validate_warm().map_err(|(field, why)| invalid(field, why))?;
        // tokio's Semaphore holds at most usize::MAX >> 3 permits.
        let cap = usize::MAX >> 4;
        if self.max_concurrent_runs > cap
            || self.max_queued_runs > cap
            || self.max_connections > cap
        {
            return Err(invalid("max_concurrent_runs", "too large".to_owned()));
        }
        if self.max_line_bytes < MIN_MAX_LINE_BYTES {
            return Err(invalid(
                "max_line_bytes",
                format!("must be at least {MIN_MAX_LINE_BYTES}"),
            ));
        }
        Ok(())
    }

    /// The socket `serve` listens on.
    pub fn socket_path(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(|| self.runtime_dir().join(SOCKET_NAME))
    }

    /// The socket node's mode bits.
    pub fn socket_mode_bits(&self) -> u32 {
        // Validated at load; a hand-built Config with a bad mode gets 0600.
        parse_mode(&self.socket_mode).unwrap_or(0o600)
    }

    /// The configuration `serve` runs with: `roots` defaults to
    /// [`DEFAULT_SERVE_ROOT`], never "the manifest's folder", so a manifest
    /// outside the roots is `rejected`.
    #[must_use]
    pub fn for_serve(mut self) -> Self {
        if self.roots.is_empty() {
            self.roots.push(PathBuf::from(DEFAULT_SERVE_ROOT));
        }
        self
    }

    /// Longest timeout a manifest may ask for.
    pub fn max_timeout(&self) -> Duration {
        Duration::from_secs(self.max_timeout_seconds)
    }

    /// The most memory one run may be given: the default `memory_bytes`,
    /// or a larger one a skill's grant lets its manifest ask for.
    pub fn largest_run_memory(&self) -> u64 {
        self.skills.values().filter_map(|g| g.memory_bytes).fold(self.limits.memory_bytes, u64::max)
    }

    /// What the runs tmpfs must hold so that no run can fill it for
    /// another: every run slot's run at its memory bound (a run's files
    /// are charged to its memory cgroup, so none can write more).
    pub fn runs_tmpfs_need(&self) -> u64 {
        let slots = u64::try_from(self.max_concurrent_runs).unwrap_or(u64::MAX);
        slots
            .saturating_mul(self.largest_run_memory())
            .clamp(MIN_RUNS_TMPFS_BYTES, MAX_RUNS_TMPFS_BYTES)
    }

    /// Size of the runs tmpfs the executor mounts: `runs_tmpfs_bytes`,
    /// else [`Config::runs_tmpfs_need`] when each run has a memory cgroup
    /// (`memcg`: the tmpfs size is a ceiling, not a reservation; the runs'
    /// cgroups bound what it really holds), else, with nothing bounding a
    /// run's files but the tmpfs itself, the lesser of
    /// [`DEFAULT_RUNS_TMPFS_BYTES`] and a quarter of RAM.
    pub fn runs_tmpfs_bytes(&self, memcg: bool) -> u64 {
        if let Some(b) = self.runs_tmpfs_bytes {
            return b;
        }
        if memcg {
            return self.runs_tmpfs_need();
        }
        let ram = nix::sys::sysinfo::sysinfo().map(|i| i.ram_total()).unwrap_or(u64::MAX);
        (ram / 4).clamp(MIN_RUNS_TMPFS_BYTES, DEFAULT_RUNS_TMPFS_BYTES)
    }

    /// The runtime directory: the configured one, else `/run/ongrid` as
    /// root, else `$XDG_RUNTIME_DIR/ongrid` or `/tmp/ongrid-$UID`.
    pub fn runtime_dir(&self) -> PathBuf {
        if let Some(dir) = &self.runtime_dir {
            return dir.clone();
        }
        let uid = nix::unistd::geteuid();
        if uid.is_root() {
            return PathBuf::from(DEFAULT_RUNTIME_DIR);
        }
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(x) if Path::new(&x).is_absolute() => Path::new(&x).join("ongrid"),
            _ => PathBuf::from(format!("/tmp/ongrid-{uid}")),
        }
    }
}

/// Parses an octal permission string (`"0660"`, `"660"`).
fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o777 && !digits.is_empty() => Ok(mode),
        _ => Err(format!("{text:?} is not an octal mode between 0000 and 0777")),
    }
}

#[cfg(test)]
mod tests;
