//! The raw TOML schema of `skilld.toml`: every key as written, optional,
//! unknown keys refused; and reading the file.

use std::path::{Path, PathBuf};

use policy::PermissionMode;
use serde::Deserialize;

use super::{ConfigError, DEFAULT_CONFIG_PATH};

/// One `[[callers]]` entry as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerEntry {
    /// A uid.
    pub uid: Option<u32>,
    /// A user name (resolved at start-up).
    pub user: Option<String>,
    /// A gid.
    pub gid: Option<u32>,
    /// A group name (resolved at start-up).
    pub group: Option<String>,
    /// A label recorded in the audit trail.
    pub role: String,
    /// The permission mode.
    pub mode: PermissionMode,
    /// May read the audit trail (`GET /v1/audit`).
    #[serde(default)]
    pub audit: bool,
}

/// One `[[approvers]]` entry as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApproverEntry {
    /// The approver's name.
    pub name: String,
    /// Base64 of the 32-byte Ed25519 public key.
    pub public_key: String,
}

/// When an audit commit reaches the disk (the audit thread's `fdatasync`
/// of the WAL; SQLite itself syncs at checkpoints only). Every mode
/// commits a row before its answer, so an answered run's
/// rows survive a crash or SIGKILL of the daemon; they differ in when the
/// commit is `fsync`ed, which is what a power loss or kernel crash needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditSync {
    /// The commits of rows that matter after a power loss are `fsync`ed
    /// before the answer: runs of `mutating` and `dangerous` skills and
    /// every row that uses an approval (the replay store). The others
    /// (`safe` runs, refusals) are `fsync`ed by a background thread at most
    /// `audit_sync_interval_ms` after their commit, off the answer's path,
    /// the way journald syncs all but its critical messages on a timer.
    /// The default.
    #[default]
    Interval,
    /// Every commit is `fsync`ed before the answer: the row survives a
    /// crash of the daemon and a power loss of the host.
    Full,
    /// Commits are written to the WAL without `fsync` (checkpoints still
    /// sync): the row survives a crash or SIGKILL of the daemon, but the
    /// last commits can be lost if the host loses power or the kernel
    /// crashes. Saves one `fsync` per batch of rows.
    Normal,
}

impl AuditSync {
    /// The value of SQLite's `PRAGMA synchronous`: `NORMAL` in every mode
    /// (in WAL mode the log is synced before each checkpoint and the
    /// database after it); the commits `full` and `interval` make durable
    /// are synced by the audit thread itself, after the commit, so that a
    /// run's decision row is answered committed before its `fsync`.
    pub fn pragma(self) -> &'static str {
        "NORMAL"
    }
}

/// The file as written, every key optional.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The file this was read from (`None`: no file, the defaults): named
    /// by every error about its values.
    #[serde(skip)]
    pub origin: Option<PathBuf>,
    /// Client API socket path.
    pub socket: Option<PathBuf>,
    /// Octal mode of the client socket, e.g. `"0660"`.
    pub socket_mode: Option<String>,
    /// The executor's socket path.
    pub executor_socket: Option<PathBuf>,
    /// Allow-list roots, in priority order.
    pub skills_dirs: Option<Vec<PathBuf>>,
    /// `ADDR:PORT` of the metrics listener; empty disables it.
    pub metrics_listen: Option<String>,
    /// Largest request body in bytes.
    pub max_body_bytes: Option<usize>,
    /// Client connections served at once; more wait in the kernel backlog.
    pub max_connections: Option<usize>,
    /// Runs forwarded to the executor at once, each counted until its
    /// answer has been handed to the client's connection; more queue.
    pub max_concurrent_runs: Option<usize>,
    /// How long a run may queue for a slot before it is answered `busy`.
    pub queue_timeout_seconds: Option<u64>,
    /// How long a client may take to send its request body.
    pub request_timeout_seconds: Option<u64>,
    /// How long a client may take to send a request head, from its first
    /// byte.
    pub header_timeout_seconds: Option<u64>,
    /// How long a connection may stay idle (no request in progress, no
    /// byte moved) before it is closed.
    pub idle_timeout_seconds: Option<u64>,
    /// On SIGTERM, the longest wait for the runs in flight before the
    /// ones left are cut (below the unit's `TimeoutStopSec=`).
    pub drain_timeout_seconds: Option<u64>,
    /// Group of the client socket (name or number): with `socket_mode`
    /// 0660, who may connect at all.
    pub socket_group: Option<String>,
    /// `[[callers]]`: uids and groups mapped to a role and a mode.
    pub callers: Option<Vec<CallerEntry>>,
    /// `[[approvers]]`: the keys whose approvals count.
    pub approvers: Option<Vec<ApproverEntry>>,
    /// How far ahead an approval may expire.
    pub approval_max_ttl_seconds: Option<u64>,
    /// The audit database.
    pub audit_db: Option<PathBuf>,
    /// Refuse runs when the audit cannot be written (default true).
    pub audit_required: Option<bool>,
    /// Row cap of the audit trail (0 = none).
    pub audit_max_rows: Option<u64>,
    /// Age cap of the audit trail in days (0 = none).
    pub audit_max_age_days: Option<u64>,
    /// Size cap of the audit trail in bytes (0 = none).
    pub audit_max_bytes: Option<u64>,
    /// `interval` (default), `full` or `normal`.
    pub audit_synchronous: Option<AuditSync>,
    /// With `interval`: milliseconds between a commit and its `fsync`.
    pub audit_sync_interval_ms: Option<u64>,
}

/// Command-line overrides, `None` when the flag was not given.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--socket`.
    pub socket: Option<PathBuf>,
    /// `--executor-socket`.
    pub executor_socket: Option<PathBuf>,
    /// `--metrics-listen` (empty disables).
    pub metrics_listen: Option<String>,
    /// `--skills-dir`, repeatable: replaces the file's `skills_dirs`.
    pub skills_dirs: Vec<PathBuf>,
    /// The audit database (`up` puts it in its runtime dir).
    pub audit_db: Option<PathBuf>,
}

impl FileConfig {
    /// Parses the TOML text of `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Parse`] for bad TOML, unknown keys or wrong types.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let file: Self = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        Ok(Self { origin: Some(path.to_path_buf()), ..file })
    }

    /// Reads `path`; when `path` is `None`, reads [`DEFAULT_CONFIG_PATH`]
    /// if it exists and uses the defaults otherwise.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when the file cannot be read or parsed.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let (path, required) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text, &path),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }
}
