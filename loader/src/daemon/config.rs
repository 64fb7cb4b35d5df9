//! `skilld.toml`: the daemon's configuration, parsed once at start-up.
//!
//! Every key is optional; unknown keys are an error (typos must not pass
//! silently), and so is a relative path in `socket`, `executor_socket`,
//! `skills_dirs` or `audit_db` (or their flags): it would depend on the
//! daemon's working directory, `/` under systemd. Precedence: command-line flag > file > built-in default. The
//! allow-list roots are the file's `skills_dirs` (or the default
//! `/etc/ongrid/skills`) followed by `ONGRID_SKILLS_EXTERNAL_DIRS`.
//!
//! ```toml
//! socket = "/run/ongrid/skilld.sock"
//! socket_mode = "0660"
//! executor_socket = "/run/ongrid/executor.sock"
//! skills_dirs = ["/etc/ongrid/skills"]
//! metrics_listen = "127.0.0.1:9464"   # "" disables the listener
//! max_body_bytes = 1048576
//! max_connections = 256
//! max_concurrent_runs = 64             # runs at once, each until its answer is taken
//! queue_timeout_seconds = 10
//! request_timeout_seconds = 30
//! header_timeout_seconds = 10         # a request head must be complete this long after its first byte
//! idle_timeout_seconds = 60           # a connection with no request in progress is closed after
//! drain_timeout_seconds = 75          # SIGTERM: the longest wait for runs in flight (under TimeoutStopSec)
//! socket_group = "ongrid"             # who may connect at all (with socket_mode 0660)
//! approval_max_ttl_seconds = 900
//! audit_db = "/var/lib/ongrid/audit.db"
//! audit_required = true                # false: run unaudited when the DB fails
//! audit_max_rows = 1000000             # 0 = no row cap
//! audit_max_age_days = 90              # 0 = keep forever
//! audit_max_bytes = 1073741824         # 0 = no size cap
//! audit_synchronous = "interval"       # or "full", "normal" (see [`AuditSync`])
//! audit_sync_interval_ms = 100         # "interval": the longest a commit waits for its fsync
//!
//! [[callers]]                          # exactly one of uid, user, gid, group
//! user = "alice"
//! role = "operator"
//! mode = "dual-sign-required"          # read-only | mutating-with-confirm | dual-sign-required
//! audit = true                         # may read GET /v1/audit
//!
//! [[approvers]]
//! name = "bob"
//! public_key = "<base64 of the 32-byte Ed25519 public key>"
//! ```
//!
//! Callers: a `uid`/`user` entry matches the peer's uid; a `gid`/`group`
//! entry its primary gid or (read from `/proc` when a request is authorised) a
//! supplementary group. Names are resolved once, here; an unknown name is a
//! configuration error.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use policy::approval::{Approver, DEFAULT_MAX_TTL_SECONDS};
use policy::PermissionMode;
use serde::Deserialize;

/// Where the daemon looks for its file when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ongrid/skilld.toml";
/// The client API socket.
pub const DEFAULT_SOCKET: &str = "/run/ongrid/skilld.sock";
/// The executor's socket.
pub const DEFAULT_EXECUTOR_SOCKET: &str = "/run/ongrid/executor.sock";
/// The packaged skills directory.
pub const DEFAULT_SKILLS_DIR: &str = "/etc/ongrid/skills";
/// The Prometheus listener.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
/// Largest request body accepted: a larger one is a 413.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// The audit database.
pub const DEFAULT_AUDIT_DB: &str = "/var/lib/ongrid/audit.db";
/// Default of `audit_max_rows`.
pub const DEFAULT_AUDIT_MAX_ROWS: u64 = 1_000_000;
/// Default of `audit_max_age_days`.
pub const DEFAULT_AUDIT_MAX_AGE_DAYS: u64 = 90;
/// Default of `audit_max_bytes` (1 GiB).
pub const DEFAULT_AUDIT_MAX_BYTES: u64 = 1 << 30;
/// Smallest `audit_max_bytes` other than 0 (1 MiB): below the few pages an
/// empty database takes, every row would go.
pub const MIN_AUDIT_MAX_BYTES: u64 = 1 << 20;
/// Default of `audit_sync_interval_ms`.
pub const DEFAULT_AUDIT_SYNC_INTERVAL_MS: u64 = 100;
/// Longest `audit_sync_interval_ms` accepted (one minute).
pub const MAX_AUDIT_SYNC_INTERVAL_MS: u64 = 60_000;
/// Longest `approval_max_ttl_seconds` accepted (one day).
pub const MAX_APPROVAL_TTL_SECONDS: u64 = 86_400;

/// Longest drain on SIGTERM by default (`drain_timeout_seconds`): under
/// systemd's default stop timeout (90 s, `TimeoutStopSec=` of
/// ongrid-skilld.service), with time left to cut the runs still going,
/// record them and flush the audit trail.
pub const MAX_DRAIN: Duration = Duration::from_secs(75);

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

/// Whom a caller rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Principal {
    /// The peer's uid.
    Uid(u32),
    /// The peer's primary or a supplementary gid.
    Gid(u32),
}

/// A resolved `[[callers]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerRule {
    /// Whom it matches.
    pub who: Principal,
    /// The role label.
    pub role: String,
    /// The permission mode.
    pub mode: PermissionMode,
    /// May read the audit trail.
    pub audit: bool,
}

/// When an audit commit reaches the disk (SQLite's `synchronous` in WAL
/// mode). Every mode commits a row before its answer, so an answered run's
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
    /// The value of SQLite's `PRAGMA synchronous` for an ordinary commit.
    pub fn pragma(self) -> &'static str {
        match self {
            AuditSync::Full => "FULL",
            AuditSync::Normal | AuditSync::Interval => "NORMAL",
        }
    }
}

/// The audit trail's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSettings {
    /// The SQLite file.
    pub db: PathBuf,
    /// Refuse runs (503 `audit_unavailable`) when a row cannot be written.
    pub required: bool,
    /// Keep at most this many rows (0 = no cap).
    pub max_rows: u64,
    /// Drop rows older than this many days (0 = keep forever).
    pub max_age_days: u64,
    /// Drop the oldest rows while the rows take more than this many bytes
    /// of the database (0 = no cap).
    pub max_bytes: u64,
    /// When a commit reaches the disk.
    pub synchronous: AuditSync,
    /// With [`AuditSync::Interval`], the longest a commit waits for its
    /// `fsync`.
    pub sync_interval: Duration,
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

/// The resolved configuration the daemon runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Client API socket path.
    pub socket: PathBuf,
    /// Mode of the client socket file.
    pub socket_mode: u32,
    /// The executor's socket path.
    pub executor_socket: PathBuf,
    /// Allow-list roots, in priority order (configured, then the env var).
    pub skills_dirs: Vec<PathBuf>,
    /// Metrics listener, `None` when disabled.
    pub metrics_listen: Option<SocketAddr>,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// Client connections served at once.
    pub max_connections: usize,
    /// Runs forwarded to the executor at once.
    pub max_concurrent_runs: usize,
    /// How long a run may wait for a slot.
    pub queue_timeout: Duration,
    /// How long a client may take to send its request body.
    pub request_timeout: Duration,
    /// How long a client may take to send its request head.
    pub header_timeout: Duration,
    /// How long an idle connection is kept.
    pub idle_timeout: Duration,
    /// The longest drain on SIGTERM.
    pub drain_timeout: Duration,
    /// Group of the client socket, `None` to leave the daemon's.
    pub socket_group: Option<u32>,
    /// Caller rules, in file order.
    pub callers: Vec<CallerRule>,
    /// The approvers.
    pub approvers: Vec<Approver>,
    /// How far ahead an approval may expire, in seconds.
    pub approval_max_ttl: u64,
    /// The audit trail.
    pub audit: AuditSettings,
}

/// Why the configuration is not usable. The daemon exits 78 (EX_CONFIG).
/// Each names the file (when there is one) and the key or flag; print it
/// with its sources (the OS error of [`ConfigError::Read`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys or wrong types.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A value of the file (or a default) is out of range.
    #[error("{}{key}: {message}", in_file(.file.as_deref()))]
    Value {
        /// The file the value is from; `None` without a file.
        file: Option<PathBuf>,
        /// The key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A command-line value is out of range.
    #[error("{flag}: {message}")]
    Flag {
        /// The flag, e.g. `--metrics-listen`.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
}

fn in_file(file: Option<&Path>) -> String {
    file.map(|f| format!("{}: ", f.display())).unwrap_or_default()
}

/// The path of `key`: the command line's (`flag`), else the file's, else
/// `default`; it must be absolute.
fn absolute(
    key: &'static str,
    flag: &'static str,
    from_flag: Option<PathBuf>,
    from_file: Option<PathBuf>,
    default: PathBuf,
) -> Result<PathBuf, ConfigError> {
    let (path, flagged) = match (from_flag, from_file) {
        (Some(p), _) => (p, true),
        (None, Some(p)) => (p, false),
        (None, None) => (default, false),
    };
    if path.is_absolute() {
        return Ok(path);
    }
    let message = format!(
        "{path:?} is not an absolute path (a relative one would depend on the daemon's \
         working directory, / under systemd)"
    );
    Err(if flagged { ConfigError::Flag { flag, message } } else { value(key, message) })
}

/// A [`ConfigError::Value`] of `key`, its file filled in by
/// [`FileConfig::resolve`].
fn value(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Value { file: None, key, message: message.into() }
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

    /// Applies `overrides` and the defaults; `env_dirs` (the roots of
    /// `ONGRID_SKILLS_EXTERNAL_DIRS`) are appended to the roots.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Value`] (naming the file) for a bad mode, address or
    /// zero limit, [`ConfigError::Flag`] for a bad command-line value.
    pub fn resolve(
        self,
        overrides: Overrides,
        env_dirs: Vec<PathBuf>,
    ) -> Result<Settings, ConfigError> {
        let origin = self.origin.clone();
        self.resolve_values(overrides, env_dirs).map_err(|e| match e {
            ConfigError::Value { file: None, key, message } => {
                ConfigError::Value { file: origin, key, message }
            }
            e => e,
        })
    }

    /// The steps of [`FileConfig::resolve`], in the order their errors are
    /// reported: the sockets and listeners, the paths, the permission keys,
    /// the audit trail, then the limits.
    fn resolve_values(
        self,
        overrides: Overrides,
        env_dirs: Vec<PathBuf>,
    ) -> Result<Settings, ConfigError> {
        let socket_mode = socket_mode(self.socket_mode.as_deref())?;
        let metrics_listen = metrics_listen(overrides.metrics_listen, self.metrics_listen)?;
        // Every configured path is absolute: a relative one would depend on
        // the daemon's working directory (`/` under systemd). The roots of
        // ONGRID_SKILLS_EXTERNAL_DIRS are not checked here: the scan skips
        // a relative one with its log line.
        let socket =
            absolute("socket", "--socket", overrides.socket, self.socket, DEFAULT_SOCKET.into())?;
        let executor_socket = absolute(
            "executor_socket",
            "--executor-socket",
            overrides.executor_socket,
            self.executor_socket,
            DEFAULT_EXECUTOR_SOCKET.into(),
        )?;
        let mut skills_dirs = skills_dirs(overrides.skills_dirs, self.skills_dirs)?;
        skills_dirs.extend(env_dirs);
        let audit_db = absolute(
            "audit_db",
            "the audit database",
            overrides.audit_db,
            self.audit_db,
            DEFAULT_AUDIT_DB.into(),
        )?;
        let approval_max_ttl = approval_max_ttl(self.approval_max_ttl_seconds)?;
        let socket_group = self
            .socket_group
            .as_deref()
            .map(|g| resolve_group(g).map_err(|m| value("socket_group", m)))
            .transpose()?;
        let callers = self
            .callers
            .unwrap_or_default()
            .into_iter()
            .map(CallerEntry::resolve)
            .collect::<Result<Vec<_>, _>>()?;
        let approvers = approvers(self.approvers.unwrap_or_default())?;
        let audit = AuditSettings {
            db: audit_db,
            required: self.audit_required.unwrap_or(true),
            max_rows: self.audit_max_rows.unwrap_or(DEFAULT_AUDIT_MAX_ROWS),
            max_age_days: self.audit_max_age_days.unwrap_or(DEFAULT_AUDIT_MAX_AGE_DAYS),
            max_bytes: audit_max_bytes(self.audit_max_bytes)?,
            synchronous: self.audit_synchronous.unwrap_or_default(),
            sync_interval: audit_sync_interval(self.audit_sync_interval_ms)?,
        };
        Ok(Settings {
            socket_group,
            callers,
            approvers,
            approval_max_ttl,
            audit,
            socket,
            socket_mode,
            executor_socket,
            skills_dirs,
            metrics_listen,
            max_body_bytes: positive(
                "max_body_bytes",
                self.max_body_bytes,
                DEFAULT_MAX_BODY_BYTES,
            )?,
            max_connections: positive("max_connections", self.max_connections, 256)?,
            max_concurrent_runs: positive("max_concurrent_runs", self.max_concurrent_runs, 64)?,
            queue_timeout: seconds("queue_timeout_seconds", self.queue_timeout_seconds, 10)?,
            request_timeout: seconds("request_timeout_seconds", self.request_timeout_seconds, 30)?,
            header_timeout: seconds("header_timeout_seconds", self.header_timeout_seconds, 10)?,
            idle_timeout: seconds("idle_timeout_seconds", self.idle_timeout_seconds, 60)?,
            drain_timeout: seconds(
                "drain_timeout_seconds",
                self.drain_timeout_seconds,
                MAX_DRAIN.as_secs(),
            )?,
        })
    }
}

/// `socket_mode`: an octal mode (`"0660"`, `"0o660"`), 0660 by default.
fn socket_mode(mode: Option<&str>) -> Result<u32, ConfigError> {
    match mode {
        None => Ok(0o660),
        Some(s) => u32::from_str_radix(s.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| {
                value("socket_mode", format!("{s:?} is not an octal mode like \"0660\""))
            }),
    }
}

/// `--metrics-listen`, else `metrics_listen`, else the default; empty
/// turns the listener off.
fn metrics_listen(
    flag: Option<String>,
    file: Option<String>,
) -> Result<Option<SocketAddr>, ConfigError> {
    let flagged = flag.is_some();
    let metrics = flag.or(file).unwrap_or_else(|| DEFAULT_METRICS_LISTEN.to_owned());
    if metrics.trim().is_empty() {
        return Ok(None);
    }
    let addr = metrics.trim().parse::<SocketAddr>().map_err(|e| {
        let message = format!("{metrics:?}: {e}");
        if flagged {
            ConfigError::Flag { flag: "--metrics-listen", message }
        } else {
            value("metrics_listen", message)
        }
    })?;
    Ok(Some(addr))
}

/// The `--skills-dir` flags, else `skills_dirs`, else the default; each
/// one absolute.
fn skills_dirs(
    flags: Vec<PathBuf>,
    file: Option<Vec<PathBuf>>,
) -> Result<Vec<PathBuf>, ConfigError> {
    if flags.is_empty() {
        let dirs = file.unwrap_or_else(|| vec![PathBuf::from(DEFAULT_SKILLS_DIR)]);
        for dir in &dirs {
            absolute("skills_dirs", "", None, Some(dir.clone()), PathBuf::new())?;
        }
        return Ok(dirs);
    }
    for dir in &flags {
        absolute("skills_dirs", "--skills-dir", Some(dir.clone()), None, PathBuf::new())?;
    }
    Ok(flags)
}

/// `approval_max_ttl_seconds`, within 1..=[`MAX_APPROVAL_TTL_SECONDS`].
fn approval_max_ttl(seconds: Option<u64>) -> Result<u64, ConfigError> {
    match seconds {
        None => Ok(DEFAULT_MAX_TTL_SECONDS),
        Some(n) if (1..=MAX_APPROVAL_TTL_SECONDS).contains(&n) => Ok(n),
        Some(n) => Err(value(
            "approval_max_ttl_seconds",
            format!("{n} is not within 1..={MAX_APPROVAL_TTL_SECONDS}"),
        )),
    }
}

/// The `[[approvers]]`, each key valid, no two sharing a name or a key.
fn approvers(entries: Vec<ApproverEntry>) -> Result<Vec<Approver>, ConfigError> {
    let mut approvers: Vec<Approver> = Vec::new();
    for a in entries {
        let approver = Approver::new(&a.name, &a.public_key)
            .map_err(|e| value("approvers", format!("approver {:?}: public_key: {e}", a.name)))?;
        if let Some(dup) = approvers
            .iter()
            .find(|p| p.key_id() == approver.key_id() || p.name() == approver.name())
        {
            return Err(value(
                "approvers",
                format!(
                    "approvers {:?} and {:?} share a name or a key: each approver needs its own",
                    dup.name(),
                    a.name
                ),
            ));
        }
        approvers.push(approver);
    }
    Ok(approvers)
}

/// `audit_max_bytes`: 0 (no size cap) or at least [`MIN_AUDIT_MAX_BYTES`].
fn audit_max_bytes(bytes: Option<u64>) -> Result<u64, ConfigError> {
    match bytes {
        None => Ok(DEFAULT_AUDIT_MAX_BYTES),
        Some(n) if n == 0 || n >= MIN_AUDIT_MAX_BYTES => Ok(n),
        Some(n) => Err(value(
            "audit_max_bytes",
            format!("{n} is below {MIN_AUDIT_MAX_BYTES} (0: no size cap)"),
        )),
    }
}

/// `audit_sync_interval_ms`, within 1..=[`MAX_AUDIT_SYNC_INTERVAL_MS`].
fn audit_sync_interval(ms: Option<u64>) -> Result<Duration, ConfigError> {
    match ms {
        None => Ok(Duration::from_millis(DEFAULT_AUDIT_SYNC_INTERVAL_MS)),
        Some(n) if (1..=MAX_AUDIT_SYNC_INTERVAL_MS).contains(&n) => Ok(Duration::from_millis(n)),
        Some(n) => Err(value(
            "audit_sync_interval_ms",
            format!("{n} is not within 1..={MAX_AUDIT_SYNC_INTERVAL_MS}"),
        )),
    }
}

/// A count `key`: at least 1, `default` when not given.
fn positive(key: &'static str, v: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    match v {
        Some(0) => Err(value(key, "must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(default),
    }
}

/// A duration `key` in seconds: at least 1, `default` when not given.
fn seconds(key: &'static str, v: Option<u64>, default: u64) -> Result<Duration, ConfigError> {
    match v {
        Some(0) => Err(value(key, "must be at least 1")),
        Some(n) => Ok(Duration::from_secs(n)),
        None => Ok(Duration::from_secs(default)),
    }
}

impl CallerEntry {
    /// Resolves the user or group name.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Value`] unless exactly one of `uid`, `user`, `gid`,
    /// `group` is given, or when a name does not exist.
    pub fn resolve(self) -> Result<CallerRule, ConfigError> {
        let role = &self.role;
        let bad = |m: String| value("callers", format!("caller with role {role:?}: {m}"));
        let who = match (self.uid, self.user.as_deref(), self.gid, self.group.as_deref()) {
            (Some(uid), None, None, None) => Principal::Uid(uid),
            (None, Some(user), None, None) => Principal::Uid(resolve_user(user).map_err(bad)?),
            (None, None, Some(gid), None) => Principal::Gid(gid),
            (None, None, None, Some(group)) => Principal::Gid(resolve_group(group).map_err(bad)?),
            _ => return Err(bad("give exactly one of uid, user, gid, group".into())),
        };
        Ok(CallerRule { who, role: self.role, mode: self.mode, audit: self.audit })
    }
}

/// A user name's uid, or what is wrong.
fn resolve_user(name: &str) -> Result<u32, String> {
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        Ok(None) => Err(format!("no user named {name:?}")),
        Err(e) => Err(format!("looking up user {name:?}: {e}")),
    }
}

/// A group name or number's gid, or what is wrong.
fn resolve_group(name: &str) -> Result<u32, String> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(name) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!("no group named {name:?}")),
        Err(e) => Err(format!("looking up group {name:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        FileConfig::parse(text, Path::new("/etc/ongrid/skilld.toml"))
    }

    /// The commented `/etc/ongrid/skilld.toml` the package ships: with every
    /// `#key = value` and `#[[table]]` line uncommented it still parses
    /// (no stale key, each key in the right place), and its top-level
    /// values are the defaults.
    #[test]
    fn the_shipped_config_uncommented_parses_and_shows_the_defaults() {
        let shipped = include_str!("../../../packaging/skilld.toml");
        fn uncomment(l: &str) -> &str {
            let Some(rest) = l.strip_prefix('#') else { return l };
            let name = rest.split(" = ").next().unwrap_or_default();
            let is_key =
                rest.contains(" = ") && name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
            if rest.starts_with("[[") || is_key {
                rest
            } else {
                l
            }
        }
        let uncommented: String = shipped.lines().map(|l| format!("{}\n", uncomment(l))).collect();
        assert!(uncommented.contains("\n[[callers]]\n"), "{uncommented}");
        let all = parse(&uncommented).unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
        assert_eq!(all.callers.as_ref().map(Vec::len), Some(2));
        let top = uncommented.split("\n[[").next().unwrap();
        let mut shown = parse(top).unwrap().resolve(Overrides::default(), vec![]).unwrap();
        // `socket_group = "ongrid"` is shown for the default "the daemon's
        // own group", which is `ongrid` under the unit.
        shown.socket_group = None;
        let defaults = parse("").unwrap().resolve(Overrides::default(), vec![]).unwrap();
        assert_eq!(format!("{shown:?}"), format!("{defaults:?}"));
    }

    #[test]
    fn empty_file_gives_the_defaults() {
        let s = parse("").unwrap().resolve(Overrides::default(), vec![]).unwrap();
        assert_eq!(s.socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(s.socket_mode, 0o660);
        assert_eq!(s.executor_socket, PathBuf::from(DEFAULT_EXECUTOR_SOCKET));
        assert_eq!(s.skills_dirs, [PathBuf::from(DEFAULT_SKILLS_DIR)]);
        assert_eq!(s.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(s.max_body_bytes, 1 << 20);
        assert_eq!(s.max_connections, 256);
        assert_eq!(s.header_timeout, Duration::from_secs(10));
        assert_eq!(s.idle_timeout, Duration::from_secs(60));
    }

    #[test]
    fn every_key_parses_and_flags_win() {
        let f = parse(
            r#"socket = "/a.sock"
               socket_mode = "0600"
               executor_socket = "/e.sock"
               skills_dirs = ["/s1", "/s2"]
               metrics_listen = "127.0.0.1:1"
               max_body_bytes = 10
               max_connections = 2
               max_concurrent_runs = 3
               queue_timeout_seconds = 4
               request_timeout_seconds = 5
               header_timeout_seconds = 6
               idle_timeout_seconds = 7
               drain_timeout_seconds = 8"#,
        )
        .unwrap();
        let s = f.clone().resolve(Overrides::default(), vec![PathBuf::from("/env")]).unwrap();
        assert_eq!(s.socket, PathBuf::from("/a.sock"));
        assert_eq!(s.socket_mode, 0o600);
        assert_eq!(s.skills_dirs, [PathBuf::from("/s1"), "/s2".into(), "/env".into()]);
        assert_eq!(s.max_concurrent_runs, 3);
        assert_eq!(s.queue_timeout, Duration::from_secs(4));
        assert_eq!(s.request_timeout, Duration::from_secs(5));
        assert_eq!(s.header_timeout, Duration::from_secs(6));
        assert_eq!(s.drain_timeout, Duration::from_secs(8));
        assert_eq!(s.idle_timeout, Duration::from_secs(7));
        let o = Overrides {
            socket: Some("/b.sock".into()),
            executor_socket: Some("/f.sock".into()),
            metrics_listen: Some(String::new()),
            skills_dirs: vec!["/cli".into()],
            audit_db: Some("/up/audit.db".into()),
        };
        let s = f.resolve(o, vec![]).unwrap();
        assert_eq!(s.socket, PathBuf::from("/b.sock"));
        assert_eq!(s.executor_socket, PathBuf::from("/f.sock"));
        assert_eq!(s.metrics_listen, None);
        assert_eq!(s.skills_dirs, [PathBuf::from("/cli")]);
        assert_eq!(s.audit.db, PathBuf::from("/up/audit.db"));
    }

    #[test]
    fn permissions_and_audit_keys() {
        let key = policy::approval::SecretKey::from_seed([7; 32]).public_key();
        let other = policy::approval::SecretKey::from_seed([8; 32]).public_key();
        let text = format!(
            r#"socket_group = "0"
               approval_max_ttl_seconds = 60
               audit_db = "/a.db"
               audit_required = false
               audit_max_rows = 10
               audit_max_age_days = 0
               audit_max_bytes = 2097152
               audit_synchronous = "normal"
               audit_sync_interval_ms = 250
               [[callers]]
               uid = 1000
               role = "operator"
               mode = "dual-sign-required"
               audit = true
               [[callers]]
               group = "root"
               role = "admins"
               mode = "mutating-with-confirm"
               [[callers]]
               user = "root"
               role = "root"
               mode = "read-only"
               [[approvers]]
               name = "alice"
               public_key = "{key}"
               [[approvers]]
               name = "bob"
               public_key = "{other}""#
        );
        let s = parse(&text).unwrap().resolve(Overrides::default(), vec![]).unwrap();
        assert_eq!(s.socket_group, Some(0));
        assert_eq!(s.approval_max_ttl, 60);
        assert_eq!(
            s.audit,
            AuditSettings {
                db: "/a.db".into(),
                required: false,
                max_rows: 10,
                max_age_days: 0,
                max_bytes: 2 << 20,
                synchronous: AuditSync::Normal,
                sync_interval: Duration::from_millis(250),
            }
        );
        assert_eq!(s.callers.len(), 3);
        assert_eq!(s.callers[0].who, Principal::Uid(1000));
        assert!(s.callers[0].audit);
        assert_eq!(s.callers[1].who, Principal::Gid(0));
        assert_eq!(s.callers[1].mode, PermissionMode::MutatingWithConfirm);
        assert_eq!(s.callers[2].who, Principal::Uid(0));
        assert!(!s.callers[2].audit);
        assert_eq!(s.approvers[1].name(), "bob");

        let d = parse("").unwrap().resolve(Overrides::default(), vec![]).unwrap();
        assert_eq!(d.approval_max_ttl, 900);
        assert_eq!(d.audit.db, PathBuf::from(DEFAULT_AUDIT_DB));
        assert!(d.audit.required);
        assert_eq!(d.audit.synchronous, AuditSync::Interval);
        assert_eq!(d.audit.sync_interval, Duration::from_millis(DEFAULT_AUDIT_SYNC_INTERVAL_MS));
        for (text, mode) in [("full", AuditSync::Full), ("interval", AuditSync::Interval)] {
            let text = format!("audit_synchronous = \"{text}\"");
            let s = parse(&text).unwrap().resolve(Overrides::default(), vec![]).unwrap();
            assert_eq!(s.audit.synchronous, mode);
        }
        assert!(matches!(parse("audit_synchronous = \"off\""), Err(ConfigError::Parse { .. })));
        assert!(d.callers.is_empty() && d.approvers.is_empty() && d.socket_group.is_none());

        let dup = format!(
            "[[approvers]]\nname = \"a\"\npublic_key = \"{key}\"\n\
             [[approvers]]\nname = \"b\"\npublic_key = \"{key}\""
        );
        for text in [
            "approval_max_ttl_seconds = 0",
            "approval_max_ttl_seconds = 86401",
            "audit_sync_interval_ms = 0",
            "audit_sync_interval_ms = 60001",
            "audit_max_bytes = 4096",
            "socket_group = \"no-such-group-here\"",
            "[[callers]]\nrole = \"x\"\nmode = \"read-only\"",
            "[[callers]]\nuid = 1\ngid = 1\nrole = \"x\"\nmode = \"read-only\"",
            "[[callers]]\nuser = \"no-such-user-here\"\nrole = \"x\"\nmode = \"read-only\"",
            "[[approvers]]\nname = \"a\"\npublic_key = \"AAAA\"",
            dup.as_str(),
        ] {
            let r = parse(text).unwrap().resolve(Overrides::default(), vec![]);
            assert!(matches!(r, Err(ConfigError::Value { .. })), "{text}");
        }
        for text in [
            "[[callers]]\nuid = 1\nrole = \"x\"\nmode = \"admin\"",
            "[[callers]]\nuid = 1\nrole = \"x\"\nmode = \"read-only\"\nextra = 1",
        ] {
            assert!(matches!(parse(text), Err(ConfigError::Parse { .. })), "{text}");
        }
    }

    #[test]
    fn bad_files_and_values_are_errors() {
        for text in ["sockett = \"/x\"", "max_connections = \"many\"", "socket = ", "[x]\na=1"] {
            assert!(matches!(parse(text), Err(ConfigError::Parse { .. })), "{text}");
        }
        for text in [
            "socket_mode = \"rw\"",
            "socket_mode = \"7777\"",
            "metrics_listen = \"localhost\"",
            "max_body_bytes = 0",
            "queue_timeout_seconds = 0",
            "header_timeout_seconds = 0",
            "idle_timeout_seconds = 0",
            "drain_timeout_seconds = 0",
        ] {
            let r = parse(text).unwrap().resolve(Overrides::default(), vec![]);
            assert!(matches!(r, Err(ConfigError::Value { .. })), "{text}");
        }
    }

    /// Every error names the file and the key (or the flag), a group too.
    #[test]
    fn errors_name_the_file_and_the_key() {
        let resolve = |text: &str| {
            parse(text).unwrap().resolve(Overrides::default(), vec![]).unwrap_err().to_string()
        };
        assert_eq!(
            resolve("max_connections = 0"),
            "/etc/ongrid/skilld.toml: max_connections: must be at least 1"
        );
        assert_eq!(
            resolve("socket_group = \"no-such-group-here\""),
            "/etc/ongrid/skilld.toml: socket_group: no group named \"no-such-group-here\""
        );
        assert_eq!(
            resolve("[[callers]]\nuser = \"no-such-user-here\"\nrole = \"x\"\nmode = \"read-only\""),
            "/etc/ongrid/skilld.toml: callers: caller with role \"x\": no user named \"no-such-user-here\""
        );
        assert!(resolve("metrics_listen = \"x\"")
            .starts_with("/etc/ongrid/skilld.toml: metrics_listen: "));
        let flag = Overrides { metrics_listen: Some("x".into()), ..Overrides::default() };
        let e = parse("").unwrap().resolve(flag, vec![]).unwrap_err().to_string();
        assert!(e.starts_with("--metrics-listen: \"x\": "), "{e}");
        // Without a file, the key alone.
        let e = FileConfig { max_connections: Some(0), ..FileConfig::default() }
            .resolve(Overrides::default(), vec![])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "max_connections: must be at least 1");
    }

    /// A relative path in any path-valued key (or flag) is refused,
    /// naming the file and the key; the env var's roots are the scan's to
    /// skip.
    #[test]
    fn relative_paths_are_refused() {
        for (text, key) in [
            ("skills_dirs = [\"/ok\", \"packs\"]", "skills_dirs"),
            ("audit_db = \"rel.db\"", "audit_db"),
            ("socket = \"relative.sock\"", "socket"),
            ("executor_socket = \"./executor.sock\"", "executor_socket"),
            ("socket = \"\"", "socket"),
        ] {
            let e = parse(text).unwrap().resolve(Overrides::default(), vec![]).unwrap_err();
            assert!(matches!(e, ConfigError::Value { .. }), "{text}: {e:?}");
            let e = e.to_string();
            assert!(e.starts_with(&format!("/etc/ongrid/skilld.toml: {key}: ")), "{text}: {e}");
            assert!(e.contains("is not an absolute path"), "{text}: {e}");
        }
        let flags = [
            (Overrides { socket: Some("s.sock".into()), ..Overrides::default() }, "--socket"),
            (
                Overrides { executor_socket: Some("e.sock".into()), ..Overrides::default() },
                "--executor-socket",
            ),
            (
                Overrides { skills_dirs: vec!["packs".into()], ..Overrides::default() },
                "--skills-dir",
            ),
        ];
        for (o, flag) in flags {
            let e = parse("").unwrap().resolve(o, vec![]).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{flag}: ")), "{e}");
        }
        let s = parse("").unwrap().resolve(Overrides::default(), vec!["rel".into()]).unwrap();
        assert_eq!(s.skills_dirs, [PathBuf::from(DEFAULT_SKILLS_DIR), "rel".into()]);
    }

    #[test]
    fn missing_default_file_is_fine_but_missing_given_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let r = FileConfig::load(Some(&dir.path().join("nope.toml")));
        assert!(matches!(r, Err(ConfigError::Read { .. })));
    }
}
