//! The audit trail (DESIGN.md §3, issue 5): one SQLite row per decision
//! and run, in WAL mode, at `audit_db` (`/var/lib/ongrid/audit.db`).
//!
//! # Rows
//!
//! A row is written when the decision is made ([`Audit::record`]):
//! `allow` (reason `safe`, `confirmed` or `dual_signed`, with the approver
//! key ids), `deny` (reason = the 403's code) or `reject` (`invalid_args`).
//! An allowed run's row is completed when the run ends
//! ([`RunRow::finish`]): outcome, error, exit code, result, finished_at,
//! duration_ms. Both writes are committed before the client gets its
//! answer, so a daemon killed right after answering has the row. A run
//! whose client went away is completed as `cancelled` without waiting.
//!
//! # Durability
//!
//! When a commit is `fsync`ed (what a power loss or kernel crash needs) is
//! `audit_synchronous` ([`crate::config::AuditSync`]):
//!
//! - `interval` (default): the connection runs at SQLite's `synchronous =
//!   NORMAL`. A batch holding a row that matters after a power loss (a run
//!   of a `mutating` or `dangerous` skill, a row that uses an approval:
//!   [`Record::syncs_before_answer`]) is `fsync`ed (the WAL file's
//!   `fdatasync`) after its commit and before its callers are answered;
//!   the completion of such a run too (the thread remembers its row id).
//!   Any other commit is handed to the `ongrid-audit-sync` thread, which
//!   `fsync`s the WAL at most `audit_sync_interval_ms` after it, off every
//!   answer's path; one `fsync` covers every commit before it. So `safe`
//!   runs and refusals lose at most that interval to a power loss, as
//!   journald's `SyncIntervalSec` does for all but its critical messages.
//! - `full`: `synchronous = FULL`, every commit is `fsync`ed before its
//!   answer.
//! - `normal`: `synchronous = NORMAL`; only checkpoints `fsync`.
//!
//! `ongrid_audit_syncs_total{when}` counts the `fsync`s asked for:
//! `commit` before an answer, `interval` by the background thread.
//!
//! # Group commit
//!
//! One thread writes. It takes every job waiting on its channel at once
//! and writes them in one transaction, so one commit (one `fsync`) covers
//! all the rows of that batch; each caller waits for the commit of its own
//! batch only. Statements are prepared once per connection
//! (`prepare_cached`). An allowed run's first row
//! ([`Audit::record_before_run`]) is answered as soon as it is inserted,
//! before its commit: the run's answer waits for the commit of its
//! completion ([`RunRow::finish`]), which comes after the insert on the
//! same connection (FIFO), so it covers both. A refusal's row
//! ([`Audit::record`]) is answered once committed, since the answer
//! follows it directly. If a commit fails, every row of its batch is lost;
//! the completion of a run whose first row was lost finds no row and fails
//! (logged, counted in `ongrid_audit_write_errors_total`). Args and result are stored as JSON text of at most
//! [`FIELD_MAX_BYTES`] (cut on a character boundary and marked
//! `*_truncated`); error texts at most [`ERROR_MAX_BYTES`].
//!
//! The approvals a run uses are written in the same transaction as its row,
//! in `used_approvals` under a unique key: the replay store's disk half
//! ([`crate::replay`]).
//!
//! # Failures
//!
//! SQLite calls block: they run on one dedicated thread (`ongrid-audit`)
//! that owns the connection; requests reach it over a channel and wait on a
//! oneshot. A failed write counts in `ongrid_audit_write_errors_total`, is
//! logged at error level and returns [`AuditError::Unavailable`]; the
//! handler then refuses the run (503 `audit_unavailable`) unless
//! `audit_required = false`. The thread opens the database lazily and again
//! after a failure, so fixing the file or its directory needs no restart.
//!
//! # Retention
//!
//! At open and every [`PRUNE_EVERY`] inserts: rows beyond `audit_max_rows`
//! (oldest first) and rows older than `audit_max_age_days` are deleted, and
//! so are used approvals past their expiry.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus::{IntCounter, IntCounterVec};
use rusqlite::{params, Connection};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::config::{AuditSettings, AuditSync};

/// Largest args or result JSON text stored.
pub const FIELD_MAX_BYTES: usize = 64 << 10;
/// Largest error or reason text stored.
pub const ERROR_MAX_BYTES: usize = 4 << 10;
/// Retention runs every this many inserts.
pub const PRUNE_EVERY: u64 = 100;
/// Most rows one query returns.
pub const MAX_QUERY_ROWS: u32 = 1000;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT,
    skill TEXT NOT NULL,
    class TEXT NOT NULL,
    caller_uid INTEGER NOT NULL,
    caller_pid INTEGER,
    role TEXT NOT NULL,
    mode TEXT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT NOT NULL,
    approvers TEXT NOT NULL,
    args TEXT,
    args_truncated INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    result_truncated INTEGER NOT NULL DEFAULT 0,
    outcome TEXT,
    error TEXT,
    exit_code INTEGER,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    duration_ms INTEGER
);
CREATE INDEX IF NOT EXISTS audit_started ON audit (started_at);
CREATE INDEX IF NOT EXISTS audit_skill ON audit (skill, id);
CREATE TABLE IF NOT EXISTS used_approvals (
    approval TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    audit_id INTEGER NOT NULL
);
PRAGMA user_version = 1;
";

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
    /// The args.
    pub args: Option<Value>,
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
    /// Args JSON (a string when truncated).
    pub args: Value,
    /// Args were cut.
    pub args_truncated: bool,
    /// Result JSON (a string when truncated).
    pub result: Value,
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

/// Most critical run rows remembered until their completion.
const MAX_CRITICAL_IN_FLIGHT: usize = 1 << 16;
/// Most jobs written in one transaction.
const MAX_BATCH: usize = 256;

enum Job {
    /// A row; `early`: answered once inserted, before the commit.
    Record(Box<Record>, oneshot::Sender<Result<i64, AuditError>>, bool),
    Finish(i64, Box<Finish>, Option<oneshot::Sender<Result<(), AuditError>>>),
    Query(Query, oneshot::Sender<Result<Vec<Entry>, AuditError>>),
    UsedApprovals(oneshot::Sender<Result<Vec<(String, u64)>, AuditError>>),
    Count(oneshot::Sender<Result<i64, AuditError>>),
}

/// The handle requests share; the thread stops when the last is dropped.
#[derive(Debug, Clone)]
pub struct Audit {
    tx: mpsc::Sender<Job>,
    required: bool,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

impl Audit {
    /// Starts the audit thread for `settings` (and, with
    /// `audit_synchronous = "interval"`, the thread that `fsync`s on a
    /// timer); `errors` is `ongrid_audit_write_errors_total`, `syncs`
    /// `ongrid_audit_syncs_total{when}`. The database is opened on first
    /// use.
    ///
    /// # Errors
    ///
    /// A thread could not be spawned.
    pub fn start(
        settings: &AuditSettings,
        errors: IntCounter,
        syncs: &IntCounterVec,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let wal = wal_path(&settings.db);
        let syncer = match settings.synchronous {
            AuditSync::Interval => {
                let syncer = Arc::new(Syncer::default());
                let (s, wal) = (syncer.clone(), wal.clone());
                let (interval, counted) =
                    (settings.sync_interval, syncs.with_label_values(&["interval"]));
                let errors = errors.clone();
                std::thread::Builder::new()
                    .name("ongrid-audit-sync".into())
                    .spawn(move || s.run(&wal, interval, &counted, &errors))?;
                Some(syncer)
            }
            AuditSync::Full | AuditSync::Normal => None,
        };
        let worker = Worker {
            settings: settings.clone(),
            db: None,
            errors,
            commit_syncs: syncs.with_label_values(&["commit"]),
            wal,
            syncer: syncer.clone(),
            critical: HashSet::new(),
            inserts: 0,
        };
        let spawned =
            std::thread::Builder::new().name("ongrid-audit".into()).spawn(move || worker.run(rx));
        if let Err(e) = spawned {
            if let Some(syncer) = syncer {
                syncer.stop();
            }
            return Err(e);
        }
        Ok(Self { tx, required: settings.required })
    }

    /// Whether runs are refused when the audit cannot be written.
    pub fn required(&self) -> bool {
        self.required
    }

    async fn ask<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, AuditError>>) -> Job,
    ) -> Result<T, AuditError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(job(tx)).map_err(|_| AuditError::Closed)?;
        rx.await.map_err(|_| AuditError::Closed)?
    }

    /// Writes a decision; returns the row id once committed.
    ///
    /// # Errors
    ///
    /// [`AuditError`]; [`AuditError::Replayed`] when one of
    /// `record.approvals_used` is already in the database.
    pub async fn record(&self, record: Record) -> Result<i64, AuditError> {
        self.ask(|tx| Job::Record(Box::new(record), tx, false)).await
    }

    /// Writes the decision of a run that is about to start; returns the
    /// row id once inserted, before its transaction commits. The commit
    /// that [`Audit::finish`] of this id waits for covers this row too
    /// (one writer, FIFO), so a run's answer still follows both rows'
    /// commit. Use [`Audit::record`] when the answer follows directly.
    ///
    /// # Errors
    ///
    /// As [`Audit::record`].
    pub async fn record_before_run(&self, record: Record) -> Result<i64, AuditError> {
        self.ask(|tx| Job::Record(Box::new(record), tx, true)).await
    }

    /// Completes row `id`; returns once committed.
    ///
    /// # Errors
    ///
    /// [`AuditError`].
    pub async fn finish(&self, id: i64, finish: Finish) -> Result<(), AuditError> {
        self.ask(|tx| Job::Finish(id, Box::new(finish), Some(tx))).await
    }

    /// Completes row `id` without waiting.
    pub fn finish_detached(&self, id: i64, finish: Finish) {
        let _ = self.tx.send(Job::Finish(id, Box::new(finish), None));
    }

    /// Reads rows, newest first.
    ///
    /// # Errors
    ///
    /// [`AuditError`].
    pub async fn query(&self, query: Query) -> Result<Vec<Entry>, AuditError> {
        self.ask(|tx| Job::Query(query, tx)).await
    }

    /// The approvals used that have not expired: replay key and expiry.
    ///
    /// # Errors
    ///
    /// [`AuditError`].
    pub async fn used_approvals(&self) -> Result<Vec<(String, u64)>, AuditError> {
        self.ask(Job::UsedApprovals).await
    }

    /// The number of rows.
    ///
    /// # Errors
    ///
    /// [`AuditError`].
    pub async fn count(&self) -> Result<i64, AuditError> {
        self.ask(Job::Count).await
    }
}

/// An allowed run's row, completed by [`RunRow::finish`]; dropped
/// unfinished (the client went away), it is completed as `cancelled`.
#[derive(Debug)]
pub struct RunRow {
    audit: Audit,
    id: Option<i64>,
    started: std::time::Instant,
}

impl RunRow {
    /// The row `id` (`None` when it could not be written and the audit is
    /// not required).
    pub fn new(audit: Audit, id: Option<i64>) -> Self {
        Self { audit, id, started: std::time::Instant::now() }
    }

    /// Completes the row and waits for the commit (which covers the
    /// decision's row too, see [`Audit::record_before_run`]). A failure is
    /// logged and counted by the thread, and returned: the run happened,
    /// but its rows may not be on disk.
    ///
    /// # Errors
    ///
    /// [`AuditError`] when the commit failed.
    pub async fn finish(mut self, mut finish: Finish) -> Result<(), AuditError> {
        let Some(id) = self.id.take() else { return Ok(()) };
        finish.duration_ms.get_or_insert_with(|| elapsed_ms(self.started));
        self.audit.finish(id, finish).await
    }
}

impl Drop for RunRow {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.audit.finish_detached(
                id,
                Finish {
                    outcome: "cancelled".into(),
                    error: Some("the client went away before the run ended".into()),
                    duration_ms: Some(elapsed_ms(self.started)),
                    ..Finish::default()
                },
            );
        }
    }
}

fn elapsed_ms(since: std::time::Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Now, unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `text` cut to at most `max` bytes on a character boundary, and whether
/// it was cut.
fn bounded(text: String, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), true)
}

fn json_field(v: Option<&Value>) -> (Option<String>, bool) {
    match v {
        None => (None, false),
        Some(v) => {
            let (text, cut) = bounded(v.to_string(), FIELD_MAX_BYTES);
            (Some(text), cut)
        }
    }
}

fn short_text(v: Option<&str>) -> Option<String> {
    v.map(|s| bounded(s.to_owned(), ERROR_MAX_BYTES).0)
}

/// The thread's state.
struct Worker {
    settings: AuditSettings,
    db: Option<Connection>,
    errors: IntCounter,
    /// `ongrid_audit_syncs_total{when="commit"}`.
    commit_syncs: IntCounter,
    /// The database's WAL file, `fsync`ed by `interval`.
    wal: PathBuf,
    /// With `interval`: the thread that `fsync`s the other commits.
    syncer: Option<Arc<Syncer>>,
    /// With `interval`: rows of runs in flight whose completion is
    /// `fsync`ed before its answer.
    critical: HashSet<i64>,
    inserts: u64,
}

impl Worker {
    fn run(mut self, rx: mpsc::Receiver<Job>) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            self.run_batch(batch);
        }
        if let Some(syncer) = &self.syncer {
            syncer.stop();
        }
    }

    /// Writes the batch's rows in one transaction, in order; a read first
    /// commits what is written before it, so it sees it.
    fn run_batch(&mut self, batch: Vec<Job>) {
        let mut group = Group::default();
        for job in batch {
            match job {
                Job::Record(record, reply, early) => {
                    let r = self.stage(&mut group, |db| insert(db, &record));
                    if let Ok(id) = r {
                        if record.syncs_before_answer() {
                            group.critical = true;
                            if early && self.syncer.is_some() {
                                // A handler dropped between the insert and
                                // its `RunRow` never finishes its row: keep
                                // the set bounded (such a run's completion,
                                // if any, is then synced by the interval).
                                if self.critical.len() >= MAX_CRITICAL_IN_FLIGHT {
                                    self.critical.clear();
                                }
                                self.critical.insert(id);
                            }
                        }
                    }
                    match r {
                        Ok(id) if early => {
                            group.written += 1;
                            let _ = reply.send(Ok(id));
                        }
                        Ok(id) => {
                            group.written += 1;
                            group.waiters.push(Waiter::Record(id, reply));
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
                Job::Finish(id, finish, reply) => {
                    group.critical |= self.critical.remove(&id);
                    match self.stage(&mut group, |db| update(db, id, &finish)) {
                        Ok(()) => {
                            group.written += 1;
                            group.waiters.push(Waiter::Finish(reply));
                        }
                        Err(e) => {
                            if let Some(reply) = reply {
                                let _ = reply.send(Err(e));
                            }
                        }
                    }
                }
                Job::Query(q, reply) => {
                    self.commit(&mut group);
                    let _ = reply.send(self.read(|db| select(db, &q)));
                }
                Job::UsedApprovals(reply) => {
                    self.commit(&mut group);
                    let _ = reply.send(self.read(used_approvals));
                }
                Job::Count(reply) => {
                    self.commit(&mut group);
                    let _ =
                        reply.send(self.read(|db| {
                            db.query_row("SELECT count(*) FROM audit", [], |r| r.get(0))
                        }));
                }
            }
        }
        self.commit(&mut group);
    }

    fn unavailable(&self, e: &rusqlite::Error) -> AuditError {
        AuditError::Unavailable { path: self.settings.db.clone(), message: e.to_string() }
    }

    fn connection(&mut self) -> Result<&mut Connection, AuditError> {
        if self.db.is_none() {
            let db = open(&self.settings).map_err(|e| self.unavailable(&e))?;
            self.db = Some(db);
        }
        self.db.as_mut().ok_or(AuditError::Closed)
    }

    /// Runs one write inside the group's transaction (begun on the first
    /// write). A job refused as a replay leaves the transaction as it was;
    /// an SQL error fails the job and the whole group.
    fn stage<T>(
        &mut self,
        group: &mut Group,
        f: impl FnOnce(&Connection) -> Result<T, WriteError>,
    ) -> Result<T, AuditError> {
        let open = group.open;
        let mut lost = false;
        let r = match self.connection() {
            Err(e) => Err(e),
            Ok(db) => {
                let begun = if open { Ok(()) } else { run_cached(db, "BEGIN") };
                match begun {
                    Err(e) => Err(WriteError::Sql(e)),
                    Ok(()) => {
                        group.open = true;
                        f(db)
                    }
                }
                .map_err(|e| match e {
                    WriteError::Replayed(k) => AuditError::Replayed(k),
                    WriteError::Lost(id) => {
                        lost = true;
                        AuditError::Unavailable {
                            path: self.settings.db.clone(),
                            message: format!("row {id} is missing (its transaction failed)"),
                        }
                    }
                    WriteError::Sql(e) => self.unavailable(&e),
                })
            }
        };
        match &r {
            // Only this job failed: the transaction and the connection are
            // fine, the rest of the batch goes on.
            Err(e) if lost => {
                self.errors.inc();
                tracing::error!(error = %e, "audit: cannot write the audit trail");
            }
            Err(e @ AuditError::Unavailable { .. }) => {
                self.fail(e);
                let e = e.clone();
                self.abort(group, &e);
            }
            _ => {}
        }
        r
    }

    /// Counts and logs a failed write, and drops the connection: the file
    /// or its directory may have been fixed, or replaced, by the next one.
    fn fail(&mut self, e: &AuditError) {
        self.errors.inc();
        tracing::error!(error = %e, "audit: cannot write the audit trail");
        self.db = None;
    }

    /// The group's transaction failed: every job of it fails with `e`.
    fn abort(&mut self, group: &mut Group, e: &AuditError) {
        if group.open {
            if let Some(db) = self.db.as_ref() {
                let _ = db.execute_batch("ROLLBACK");
            }
            self.db = None;
        }
        let lost = group.written.saturating_sub(group.waiters.len());
        for _ in 0..lost {
            self.errors.inc();
        }
        for w in group.waiters.drain(..) {
            self.errors.inc();
            w.send(Err(e.clone()));
        }
        *group = Group::default();
    }

    /// Commits the group's transaction and answers its waiters.
    fn commit(&mut self, group: &mut Group) {
        if !group.open {
            return;
        }
        let r = match self.db.as_ref() {
            Some(db) => run_cached(db, "COMMIT").map_err(|e| self.unavailable(&e)),
            None => Err(AuditError::Closed),
        };
        let r = r.and_then(|()| self.made_durable(group.critical));
        match r {
            Ok(()) => {
                let before = self.inserts;
                self.inserts += group.written as u64;
                for w in group.waiters.drain(..) {
                    w.send(Ok(()));
                }
                *group = Group::default();
                if self.inserts / PRUNE_EVERY != before / PRUNE_EVERY {
                    self.prune();
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "audit: cannot write the audit trail");
                self.abort(group, &e);
            }
        }
    }

    /// After a commit: under `full` SQLite has `fsync`ed it; under
    /// `interval` a critical batch is `fsync`ed now, any other is handed to
    /// the syncer.
    fn made_durable(&mut self, critical: bool) -> Result<(), AuditError> {
        match (&self.syncer, self.settings.synchronous) {
            (_, AuditSync::Full) => self.commit_syncs.inc(),
            (Some(syncer), AuditSync::Interval) if critical => {
                if let Err(e) = sync_wal(&self.wal) {
                    let e = AuditError::Unavailable {
                        path: self.wal.clone(),
                        message: format!("fsync: {e}"),
                    };
                    // What was committed may not be on disk: the batch
                    // fails as a failed commit would.
                    self.db = None;
                    return Err(e);
                }
                self.commit_syncs.inc();
                syncer.synced();
            }
            (Some(syncer), _) => syncer.committed(),
            (None, _) => {}
        }
        Ok(())
    }

    fn read<T>(
        &mut self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, AuditError> {
        let r = {
            let db = self.connection()?;
            f(db)
        };
        r.map_err(|e| {
            let e = self.unavailable(&e);
            self.db = None;
            e
        })
    }

    fn prune(&mut self) {
        let settings = self.settings.clone();
        if let Some(db) = self.db.as_mut() {
            if let Err(e) = prune(db, &settings) {
                tracing::warn!(error = %e, "audit: retention failed");
            }
        }
    }
}

/// The writes of one transaction not yet committed.
#[derive(Default)]
struct Group {
    /// `BEGIN` was run.
    open: bool,
    /// It holds a row whose commit is `fsync`ed before the answer.
    critical: bool,
    /// Rows written in it (early-answered ones included).
    written: usize,
    /// Who waits for the commit.
    waiters: Vec<Waiter>,
}

/// A caller waiting for its batch's commit.
enum Waiter {
    Record(i64, oneshot::Sender<Result<i64, AuditError>>),
    Finish(Option<oneshot::Sender<Result<(), AuditError>>>),
}

impl Waiter {
    fn send(self, r: Result<(), AuditError>) {
        match self {
            Waiter::Record(id, tx) => {
                let _ = tx.send(r.map(|()| id));
            }
            Waiter::Finish(Some(tx)) => {
                let _ = tx.send(r);
            }
            Waiter::Finish(None) => {}
        }
    }
}

/// The background `fsync` of `audit_synchronous = "interval"`: the audit
/// thread reports each commit it did not sync; this thread `fsync`s the WAL
/// `interval` after the oldest of them, which covers them all.
#[derive(Default)]
struct Syncer {
    state: Mutex<SyncState>,
    wake: Condvar,
}

#[derive(Default)]
struct SyncState {
    /// When the oldest commit not yet `fsync`ed was made.
    since: Option<Instant>,
    /// The audit thread is gone: sync what is left and stop.
    stop: bool,
}

impl Syncer {
    fn lock(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A commit was made and not `fsync`ed.
    fn committed(&self) {
        let mut st = self.lock();
        if st.since.is_none() {
            st.since = Some(Instant::now());
            self.wake.notify_one();
        }
    }

    /// The WAL was just `fsync`ed: every commit so far is on disk.
    fn synced(&self) {
        self.lock().since = None;
    }

    fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_one();
    }

    fn run(&self, wal: &Path, interval: Duration, syncs: &IntCounter, errors: &IntCounter) {
        let mut st = self.lock();
        loop {
            let Some(since) = st.since else {
                if st.stop {
                    return;
                }
                st = self.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            let due = since + interval;
            let now = Instant::now();
            if now < due && !st.stop {
                st =
                    self.wake.wait_timeout(st, due - now).unwrap_or_else(PoisonError::into_inner).0;
                continue;
            }
            st.since = None;
            drop(st);
            match sync_wal(wal) {
                Ok(()) => syncs.inc(),
                Err(e) => {
                    errors.inc();
                    tracing::error!(path = %wal.display(), error = %e, "audit: cannot fsync the audit trail");
                }
            }
            st = self.lock();
        }
    }
}

/// `<db>-wal`, SQLite's write-ahead log of `db`.
fn wal_path(db: &Path) -> PathBuf {
    let mut p = OsString::from(db.as_os_str());
    p.push("-wal");
    PathBuf::from(p)
}

/// `fdatasync` of the WAL file: every frame written to it so far, by any
/// descriptor, reaches the disk (Linux syncs the inode). No file: the last
/// connection checkpointed it into the database (SQLite syncs that) and
/// removed it.
fn sync_wal(wal: &Path) -> std::io::Result<()> {
    match std::fs::File::open(wal) {
        Ok(f) => f.sync_data(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Runs a statement without parameters, prepared once per connection.
fn run_cached(db: &Connection, sql: &str) -> rusqlite::Result<()> {
    db.prepare_cached(sql)?.execute([]).map(drop)
}

enum WriteError {
    Replayed(String),
    /// The row to complete is not there.
    Lost(i64),
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for WriteError {
    fn from(e: rusqlite::Error) -> Self {
        WriteError::Sql(e)
    }
}

fn open(settings: &AuditSettings) -> rusqlite::Result<Connection> {
    let mut db = Connection::open(&settings.db)?;
    db.busy_timeout(std::time::Duration::from_secs(5))?;
    // WAL: readers (ongrid-skill audit --db, sqlite3) never block the
    // daemon; FULL (`full`): SQLite syncs every commit; NORMAL (`interval`,
    // `normal`): only checkpoints, the rest is ours (module docs).
    let mode: String = db.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(mode, "audit: the database is not in WAL mode");
    }
    db.pragma_update(None, "synchronous", settings.synchronous.pragma())?;
    db.execute_batch(SCHEMA)?;
    prune(&mut db, settings)?;
    tracing::info!(path = %settings.db.display(), "audit: database open");
    Ok(db)
}

fn prune(db: &mut Connection, settings: &AuditSettings) -> rusqlite::Result<()> {
    let tx = db.transaction()?;
    if settings.max_rows > 0 {
        let keep = i64::try_from(settings.max_rows).unwrap_or(i64::MAX);
        tx.execute(
            "DELETE FROM audit WHERE id <= (SELECT max(id) FROM audit) - ?1",
            params![keep],
        )?;
    }
    if settings.max_age_days > 0 {
        let age_ms =
            i64::try_from(settings.max_age_days.saturating_mul(86_400_000)).unwrap_or(i64::MAX);
        tx.execute(
            "DELETE FROM audit WHERE started_at < ?1",
            params![now_ms().saturating_sub(age_ms)],
        )?;
    }
    tx.execute("DELETE FROM used_approvals WHERE expires_at < ?1", params![now_ms() / 1000])?;
    tx.commit()
}

/// Inserts a decision's row. With approvals, inside a savepoint, so that a
/// replayed approval rolls back this row only, not the rest of the batch.
fn insert(db: &Connection, r: &Record) -> Result<i64, WriteError> {
    if r.approvals_used.is_empty() {
        return insert_row(db, r);
    }
    run_cached(db, "SAVEPOINT job")?;
    match insert_row(db, r) {
        Ok(id) => {
            run_cached(db, "RELEASE job")?;
            Ok(id)
        }
        Err(e) => {
            run_cached(db, "ROLLBACK TO job")?;
            run_cached(db, "RELEASE job")?;
            Err(e)
        }
    }
}

fn insert_row(db: &Connection, r: &Record) -> Result<i64, WriteError> {
    let (args, args_cut) = json_field(r.args.as_ref());
    let approvers = Value::from(r.approvers.clone()).to_string();
    db.prepare_cached(
        "INSERT INTO audit (session_id, skill, class, caller_uid, caller_pid, role, mode,
             decision, reason, approvers, args, args_truncated, outcome, error, started_at,
             finished_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )?
    .execute(params![
        r.session_id,
        r.skill,
        r.class,
        r.caller_uid,
        r.caller_pid,
        r.role,
        r.mode,
        r.decision,
        short_text(Some(&r.reason)),
        approvers,
        args,
        args_cut,
        r.outcome,
        short_text(r.error.as_deref()),
        now_ms(),
        // A refusal is finished when decided.
        r.outcome.as_ref().map(|_| now_ms()),
    ])?;
    let id = db.last_insert_rowid();
    for (key, expires_at) in &r.approvals_used {
        let key_id = key.split(':').next().unwrap_or_default();
        let expires = i64::try_from(*expires_at).unwrap_or(i64::MAX);
        let n = db
            .prepare_cached(
                "INSERT OR IGNORE INTO used_approvals (approval, key_id, expires_at, audit_id)
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![key, key_id, expires, id])?;
        if n == 0 {
            // The caller's savepoint rolls the row back.
            return Err(WriteError::Replayed(key_id.to_owned()));
        }
    }
    Ok(id)
}

fn update(db: &Connection, id: i64, f: &Finish) -> Result<(), WriteError> {
    let (result, result_cut) = match &f.result {
        None => (None, false),
        Some(r) => {
            let (text, cut) = bounded(r.get().to_owned(), FIELD_MAX_BYTES);
            (Some(text), cut)
        }
    };
    let n = db
        .prepare_cached(
            "UPDATE audit SET outcome = ?2, error = ?3, exit_code = ?4, result = ?5,
                 result_truncated = ?6, finished_at = ?7,
                 duration_ms = COALESCE(?8, ?7 - started_at)
             WHERE id = ?1",
        )?
        .execute(params![
            id,
            f.outcome,
            short_text(f.error.as_deref()),
            f.exit_code,
            result,
            result_cut,
            now_ms(),
            f.duration_ms.map(|d| i64::try_from(d).unwrap_or(i64::MAX)),
        ])?;
    if n == 0 {
        return Err(WriteError::Lost(id));
    }
    Ok(())
}

fn used_approvals(db: &Connection) -> rusqlite::Result<Vec<(String, u64)>> {
    let mut stmt =
        db.prepare("SELECT approval, expires_at FROM used_approvals WHERE expires_at >= ?1")?;
    let rows = stmt.query_map(params![now_ms() / 1000], |r| {
        Ok((r.get::<_, String>(0)?, u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0)))
    })?;
    rows.collect()
}

fn select(db: &Connection, q: &Query) -> rusqlite::Result<Vec<Entry>> {
    let mut stmt = db.prepare(
        "SELECT id, session_id, skill, class, caller_uid, caller_pid, role, mode, decision,
                reason, approvers, args, args_truncated, result, result_truncated, outcome,
                error, exit_code, started_at, finished_at, duration_ms
         FROM audit
         WHERE (?1 IS NULL OR skill = ?1) AND (?2 IS NULL OR outcome = ?2)
           AND (?3 IS NULL OR decision = ?3) AND (?4 IS NULL OR started_at >= ?4)
         ORDER BY id DESC LIMIT ?5",
    )?;
    let limit = q.limit.clamp(1, MAX_QUERY_ROWS);
    let rows = stmt.query_map(params![q.skill, q.outcome, q.decision, q.since_ms, limit], |r| {
        let approvers: String = r.get(10)?;
        Ok(Entry {
            id: r.get(0)?,
            session_id: r.get(1)?,
            skill: r.get(2)?,
            class: r.get(3)?,
            caller_uid: r.get(4)?,
            caller_pid: r.get(5)?,
            role: r.get(6)?,
            mode: r.get(7)?,
            decision: r.get(8)?,
            reason: r.get(9)?,
            approvers: serde_json::from_str(&approvers).unwrap_or_default(),
            args: stored_json(r.get(11)?),
            args_truncated: r.get(12)?,
            result: stored_json(r.get(13)?),
            result_truncated: r.get(14)?,
            outcome: r.get(15)?,
            error: r.get(16)?,
            exit_code: r.get(17)?,
            started_at: r.get(18)?,
            finished_at: r.get(19)?,
            duration_ms: r.get(20)?,
        })
    })?;
    rows.collect()
}

/// Stored JSON text back as JSON; a cut text stays a string.
fn stored_json(text: Option<String>) -> Value {
    match text {
        None => Value::Null,
        Some(t) => serde_json::from_str(&t).unwrap_or(Value::String(t)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn settings(dir: &std::path::Path, max_rows: u64) -> AuditSettings {
        AuditSettings {
            db: dir.join("audit.db"),
            required: true,
            max_rows,
            max_age_days: 0,
            synchronous: AuditSync::Full,
            sync_interval: Duration::from_millis(100),
        }
    }

    fn syncs() -> IntCounterVec {
        IntCounterVec::new(prometheus::Opts::new("s", "s"), &["when"]).unwrap()
    }

    fn record(skill: &str, used: &[(&str, u64)]) -> Record {
        Record {
            skill: skill.into(),
            class: "dangerous".into(),
            caller_uid: 1000,
            role: "ops".into(),
            mode: "dual-sign-required".into(),
            decision: "allow",
            reason: "dual_signed".into(),
            approvers: used.iter().map(|(k, _)| k.split(':').next().unwrap().to_owned()).collect(),
            approvals_used: used.iter().map(|(k, e)| ((*k).to_owned(), *e)).collect(),
            args: Some(json!({"n": 1})),
            ..Record::default()
        }
    }

    #[tokio::test]
    async fn rows_are_written_completed_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let errors = IntCounter::new("e", "e").unwrap();
        let audit = Audit::start(&settings(dir.path(), 0), errors.clone(), &syncs()).unwrap();
        let far = u64::try_from(now_ms() / 1000).unwrap() + 600;
        let id = audit.record(record("rm", &[("aa:d1", far), ("bb:d1", far)])).await.unwrap();
        let big = "é".repeat(FIELD_MAX_BYTES);
        audit
            .finish(
                id,
                Finish {
                    outcome: "ok".into(),
                    exit_code: Some(0),
                    result: Some(policy::RawJson::from_value(&json!({"big": big}))),
                    ..Finish::default()
                },
            )
            .await
            .unwrap();
        // The same approval again: refused, and no row is left behind.
        let again = audit.record(record("rm", &[("cc:d2", far), ("bb:d1", far)])).await;
        assert_eq!(again, Err(AuditError::Replayed("bb".into())));
        assert_eq!(audit.count().await.unwrap(), 1);
        let mut used = audit.used_approvals().await.unwrap();
        used.sort();
        assert_eq!(used, [("aa:d1".to_owned(), far), ("bb:d1".to_owned(), far)]);

        let rows = audit.query(Query { limit: 10, ..Query::default() }).await.unwrap();
        assert_eq!(rows.len(), 1);
        let e = &rows[0];
        assert_eq!((e.decision.as_str(), e.reason.as_str()), ("allow", "dual_signed"));
        assert_eq!(e.approvers, ["aa", "bb"]);
        assert_eq!(e.args, json!({"n": 1}));
        assert!(e.result_truncated && !e.args_truncated);
        assert!(e.result.as_str().unwrap().len() <= FIELD_MAX_BYTES);
        assert_eq!(e.exit_code, Some(0));
        assert!(e.finished_at.is_some() && e.duration_ms.is_some());
        let none = Query { skill: Some("other".into()), limit: 10, ..Query::default() };
        assert!(audit.query(none).await.unwrap().is_empty());
        let future = Query { since_ms: Some(now_ms() + 60_000), limit: 10, ..Query::default() };
        assert!(audit.query(future).await.unwrap().is_empty());
        assert_eq!(errors.get(), 0);

        // A restarted daemon sees the used approvals.
        drop(audit);
        let audit = Audit::start(&settings(dir.path(), 0), errors.clone(), &syncs()).unwrap();
        assert_eq!(audit.used_approvals().await.unwrap().len(), 2);
    }

    /// `interval`: rows that matter after a power loss (a run of a
    /// mutating or dangerous skill, its completion, a row with an
    /// approval) are synced before their answer; a safe run's are synced
    /// by the background thread, no sooner than the interval after their
    /// commit; `full` syncs every commit, `normal` none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn interval_syncs_critical_rows_before_the_answer_and_the_rest_later() {
        let dir = tempfile::tempdir().unwrap();
        let errors = IntCounter::new("e", "e").unwrap();
        let interval = Duration::from_millis(500);
        let interval_settings = AuditSettings {
            synchronous: AuditSync::Interval,
            sync_interval: interval,
            ..settings(dir.path(), 0)
        };
        let counts = syncs();
        let audit = Audit::start(&interval_settings, errors.clone(), &counts).unwrap();
        let commit = counts.with_label_values(&["commit"]);
        let timer = counts.with_label_values(&["interval"]);
        let safe = |skill: &str| Record { class: "safe".into(), ..record(skill, &[]) };
        let done = || Finish { outcome: "ok".into(), ..Finish::default() };

        // A safe run: committed, not synced before its answer ...
        let asked = Instant::now();
        let id = audit.record_before_run(safe("df")).await.unwrap();
        RunRow::new(audit.clone(), Some(id)).finish(done()).await.unwrap();
        assert_eq!(commit.get(), 0);
        // (On a host slow enough for the interval to pass already, the
        // syncer may have run: only a sync before it is a failure.)
        if asked.elapsed() < interval {
            assert_eq!(timer.get(), 0);
        }
        // ... but by the syncer, once, and not before the interval.
        let until = Instant::now() + Duration::from_secs(10);
        while timer.get() == 0 {
            assert!(Instant::now() < until, "the interval sync never came");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(asked.elapsed() >= interval, "synced after {:?}", asked.elapsed());
        // A refusal of a safe skill waits for nobody either.
        audit.record(Record { decision: "deny", ..safe("df") }).await.unwrap();
        assert_eq!(commit.get(), 0);

        // A dangerous run: its decision's commit and its completion's are
        // synced before their answers.
        let id = audit.record_before_run(record("rm", &[])).await.unwrap();
        RunRow::new(audit.clone(), Some(id)).finish(done()).await.unwrap();
        assert_eq!(commit.get(), 2);
        // A safe skill's row that uses an approval: synced before the answer.
        let far = u64::try_from(now_ms() / 1000).unwrap() + 600;
        let used = Record { class: "safe".into(), ..record("df", &[("aa:d1", far)]) };
        audit.record(used).await.unwrap();
        assert_eq!(commit.get(), 3);
        // A mutating refusal too.
        audit
            .record(Record { class: "mutating".into(), decision: "deny", ..safe("mv") })
            .await
            .unwrap();
        assert_eq!(commit.get(), 4);
        assert_eq!(audit.count().await.unwrap(), 5);
        assert_eq!(errors.get(), 0);

        // Full: every commit (the decision's, the completion's, the
        // refusal's); normal: none.
        for (mode, expected) in [(AuditSync::Full, 3), (AuditSync::Normal, 0)] {
            let dir = tempfile::tempdir().unwrap();
            let counts = syncs();
            let other = AuditSettings { synchronous: mode, ..settings(dir.path(), 0) };
            let audit = Audit::start(&other, errors.clone(), &counts).unwrap();
            let id = audit.record_before_run(safe("df")).await.unwrap();
            RunRow::new(audit.clone(), Some(id)).finish(done()).await.unwrap();
            audit.record(safe("df")).await.unwrap();
            let got = (
                counts.with_label_values(&["commit"]).get(),
                counts.with_label_values(&["interval"]).get(),
            );
            assert_eq!(got, (expected, 0), "{mode:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_rows_share_commits_and_a_replay_rolls_back_only_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let errors = IntCounter::new("e", "e").unwrap();
        let audit = Audit::start(&settings(dir.path(), 0), errors.clone(), &syncs()).unwrap();
        let far = u64::try_from(now_ms() / 1000).unwrap() + 600;
        audit.record(record("first", &[("aa:d1", far)])).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..40 {
            let audit = audit.clone();
            tasks.push(tokio::spawn(async move {
                let used = if i == 17 { vec![("aa:d1", far)] } else { vec![] };
                let r = record(&format!("s{i}"), &used);
                let id = if i % 2 == 0 {
                    audit.record_before_run(r).await?
                } else {
                    audit.record(r).await?
                };
                audit.finish(id, Finish { outcome: "ok".into(), ..Finish::default() }).await?;
                Ok::<_, AuditError>(id)
            }));
        }
        let mut replayed = 0;
        for (i, t) in tasks.into_iter().enumerate() {
            match t.await.unwrap() {
                Ok(_) => {}
                Err(AuditError::Replayed(k)) if i == 17 => {
                    assert_eq!(k, "aa");
                    replayed += 1;
                }
                Err(e) => panic!("{i}: {e}"),
            }
        }
        assert_eq!(replayed, 1);
        assert_eq!(audit.count().await.unwrap(), 40);
        let rows = audit.query(Query { limit: 100, ..Query::default() }).await.unwrap();
        assert!(rows
            .iter()
            .filter(|e| e.skill != "first")
            .all(|e| e.outcome.as_deref() == Some("ok")));
        assert_eq!(errors.get(), 0);
        // Completing a row that is not there is an error, not a silent
        // no-op, and fails only itself, not the rows written with it.
        let a = audit.clone();
        let lost = tokio::spawn(async move { a.finish(9999, Finish::default()).await });
        let id = audit.record_before_run(record("after", &[])).await.unwrap();
        assert!(lost.await.unwrap().is_err());
        audit.finish(id, Finish { outcome: "ok".into(), ..Finish::default() }).await.unwrap();
        assert_eq!(audit.count().await.unwrap(), 41);
        assert_eq!(errors.get(), 1);
    }

    #[tokio::test]
    async fn retention_keeps_the_newest_rows() {
        let dir = tempfile::tempdir().unwrap();
        let errors = IntCounter::new("e", "e").unwrap();
        let audit = Audit::start(&settings(dir.path(), 10), errors, &syncs()).unwrap();
        for i in 0..PRUNE_EVERY + 5 {
            audit.record(record(&format!("s{i}"), &[])).await.unwrap();
        }
        assert_eq!(audit.count().await.unwrap(), 15);
        let newest = audit.query(Query { limit: 1, ..Query::default() }).await.unwrap();
        assert_eq!(newest[0].skill, format!("s{}", PRUNE_EVERY + 4));
    }

    #[tokio::test]
    async fn an_unwritable_database_is_an_error_and_a_metric_then_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let errors = IntCounter::new("e", "e").unwrap();
        let audit = Audit::start(&settings(&missing, 0), errors.clone(), &syncs()).unwrap();
        let e = audit.record(record("rm", &[])).await.unwrap_err();
        assert!(matches!(e, AuditError::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains("missing/audit.db"), "{e}");
        assert!(audit.finish(1, Finish::default()).await.is_err());
        assert_eq!(errors.get(), 2);
        std::fs::create_dir(&missing).unwrap();
        assert_eq!(audit.record(record("rm", &[])).await, Ok(1));
        assert_eq!(errors.get(), 2);
    }

    #[test]
    fn bounded_cuts_on_a_character_boundary() {
        assert_eq!(bounded("abc".into(), 3), ("abc".into(), false));
        assert_eq!(bounded("aé".into(), 2), ("a".into(), true));
    }
}
