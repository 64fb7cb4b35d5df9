//! The rows of the audit trail as requests write and read them: a
//! decision ([`Record`]), its completion ([`Finish`]), a row read back
//! ([`Entry`]) and a query of them ([`Query`], [`Trail`]), with the bounds
//! on what is stored and the error of every audit call.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::words::CANCELLED;

/// Largest args or result JSON text stored.
pub const FIELD_MAX_BYTES: usize = 64 << 10;
/// Largest args JSON text stored for a refused request (`deny`,
/// `reject`): anyone who may connect can send refused requests, and the
/// start of the args is what an operator reads them for.
pub const REFUSED_ARGS_MAX_BYTES: usize = 4 << 10;
/// Largest error or reason text stored.
pub const ERROR_MAX_BYTES: usize = 4 << 10;
/// Retention runs every this many inserts.
pub const PRUNE_EVERY: u64 = 100;
/// Most rows one query returns.
pub const MAX_QUERY_ROWS: u32 = 1000;

/// Why the audit trail could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The database could not be opened or written.
    #[error("audit database {path} unavailable: {message}")]
    Unavailable {
        /// The database file.
        path: PathBuf,
        /// SQLite's message.
        message: String,
    },
    /// An approval was already used (the database's unique key).
    #[error("approval {0} was already used")]
    Replayed(String),
    /// The audit thread is gone.
    #[error("the audit thread stopped")]
    Closed,
}

/// A decision, as written when it is made.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// The request's session id.
    pub session_id: Option<String>,
    /// The skill.
    pub skill: String,
    /// Its class.
    pub class: String,
    /// The caller's uid.
    pub caller_uid: u32,
    /// The caller's pid.
    pub caller_pid: Option<i32>,
    /// The caller's role.
    pub role: String,
    /// The caller's permission mode.
    pub mode: String,
    /// `allow`, `deny` or `reject`.
    pub decision: &'static str,
    /// Why.
    pub reason: String,
    /// Key ids of the approvals the run uses.
    pub approvers: Vec<String>,
    /// The approvals used: replay key and expiry (unix seconds).
    pub approvals_used: Vec<(String, u64)>,
    /// The args, as the caller sent them (the text the skill reads).
    pub args: Option<policy::RawJson>,
    /// For a refusal: the outcome (`denied`, `invalid_args`) ...
    pub outcome: Option<String>,
    /// ... and the message.
    pub error: Option<String>,
}

impl Record {
    /// Whether this row's commit is `fsync`ed before its answer under
    /// `audit_synchronous = "interval"`: the run can change the host (a
    /// `mutating` or `dangerous` skill), or it uses an approval (whose
    /// replay key must not come back after a power loss).
    pub fn syncs_before_answer(&self) -> bool {
        self.class != policy::SkillClass::Safe.as_str() || !self.approvals_used.is_empty()
    }
}

/// How an allowed run ended.
#[derive(Debug, Clone, Default)]
pub struct Finish {
    /// The report's outcome, or `cancelled`, `executor_unavailable`.
    pub outcome: String,
    /// The error text.
    pub error: Option<String>,
    /// The exit code.
    pub exit_code: Option<i32>,
    /// The result JSON, as the skill printed it.
    pub result: Option<policy::RawJson>,
    /// The run's duration (the report's, else the time since the decision).
    pub duration_ms: Option<u64>,
    /// For a run with network: how many connects and sends its egress
    /// allowlist refused.
    pub network_denied: Option<u64>,
}

/// A row as read back (`GET /v1/audit`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// Row id.
    pub id: i64,
    /// Session id.
    pub session_id: Option<String>,
    /// Skill.
    pub skill: String,
    /// Class.
    pub class: String,
    /// Caller uid.
    pub caller_uid: u32,
    /// Caller pid.
    pub caller_pid: Option<i32>,
    /// Role.
    pub role: String,
    /// Permission mode.
    pub mode: String,
    /// `allow`, `deny` or `reject`.
    pub decision: String,
    /// Reason code.
    pub reason: String,
    /// Approver key ids.
    pub approvers: Vec<String>,
    /// Args JSON as sent (a string when truncated).
    pub args: policy::RawJson,
    /// Args were cut.
    pub args_truncated: bool,
    /// Result JSON as the skill printed it (a string when truncated).
    pub result: policy::RawJson,
    /// Result was cut.
    pub result_truncated: bool,
    /// Outcome.
    pub outcome: Option<String>,
    /// Error.
    pub error: Option<String>,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// Decision time, unix milliseconds.
    pub started_at: i64,
    /// End of the run, unix milliseconds.
    pub finished_at: Option<i64>,
    /// Duration of the run.
    pub duration_ms: Option<i64>,
    /// Refusals of the run's egress allowlist (runs with network only).
    pub network_denied: Option<i64>,
}

/// The rows a query read, and whether they can be the whole trail.
#[derive(Debug, Clone, PartialEq)]
pub struct Trail {
    /// The rows, newest first.
    pub items: Vec<Entry>,
    /// Set when rows or completions journaled before the read could not
    /// be written into the database first (it is locked by another
    /// writer, its file system is full...): the items may lack the newest
    /// rows, or show finished runs as unfinished.
    pub incomplete: Option<Incomplete>,
}

/// What a read of the trail lacks ([`Trail::incomplete`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Incomplete {
    /// Journal lines (rows and completions) not in the database.
    pub unwritten: usize,
    /// Why they could not be written.
    pub reason: String,
}

/// Filters of a query; newest first.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only this skill.
    pub skill: Option<String>,
    /// Only this outcome.
    pub outcome: Option<String>,
    /// Only this decision.
    pub decision: Option<String>,
    /// Only rows decided at or after this time (unix milliseconds).
    pub since_ms: Option<i64>,
    /// At most this many rows.
    pub limit: u32,
}

/// What completes a decision's row whose caller went away before its run
/// started.
pub(super) fn unclaimed() -> Finish {
    Finish {
        outcome: CANCELLED.into(),
        error: Some("the client went away before the run started".into()),
        ..Finish::default()
    }
}

/// Now, unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
