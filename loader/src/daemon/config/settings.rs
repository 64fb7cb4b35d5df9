//! The resolved configuration the daemon runs with: every value checked,
//! every name resolved, every default filled in.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use policy::approval::Approver;
use policy::PermissionMode;

use super::AuditSync;

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
