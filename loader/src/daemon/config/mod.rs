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
//!                                     # (so is an answer blocked this long, under 16 KiB/s taken)
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

mod error;
mod file;
mod resolve;
mod settings;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use error::ConfigError;
pub use file::{ApproverEntry, AuditSync, CallerEntry, FileConfig, Overrides};
pub use settings::{AuditSettings, CallerRule, Principal, Settings};

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
