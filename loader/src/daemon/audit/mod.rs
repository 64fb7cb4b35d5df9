//! The audit trail (DESIGN.md §3, issue 5): one SQLite row per decision
//! and run, in WAL mode, at `audit_db` (`/var/lib/ongrid/audit.db`).
//!
//! # Layout
//!
//! - this file: the handle requests share ([`Audit`], [`RunRow`]) and the
//!   row types;
//! - `journal`: the rows appended by the requests, their ids, the replay;
//! - `worker`: the audit thread's writer (group commit, durability, the
//!   journal's lines into the database);
//! - `sql`: the schema, opening, retention and each statement;
//! - `syncer`: the background `fsync` of `audit_synchronous = "interval"`.
//!
//! # Rows
//!
//! A row is written when the decision is made ([`Audit::record`]):
//! `allow` (reason `safe`, `confirmed` or `dual_signed`, with the approver
//! key ids), `deny` (reason = the 403's code) or `reject` (`invalid_args`,
//! or the code of a request body refused before the args were read:
//! `bad_request`, `payload_too_large`, `request_timeout`,
//! `unsupported_encoding`, with outcome `rejected` and no args).
//! An allowed run's row is completed when the run ends
//! ([`RunRow::finish`]): outcome, error, exit code, result, finished_at,
//! duration_ms. Both writes are committed before the client gets its
//! answer, so a daemon killed right after answering has the row. A run
//! whose client went away is completed as `cancelled` without waiting.
//!
//! # Durability
//!
//! When a commit is `fsync`ed (what a power loss or kernel crash needs) is
//! `audit_synchronous` ([`crate::daemon::config::AuditSync`]):
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
//! `ongrid_audit_wait_seconds{row}` times what each answer waited for
//! ([`Audit::observe_waits`]): `decision` (an allowed run's first row),
//! `completion` (its commit), `refusal`.
//!
//! # The journal
//!
//! A row whose answer needs no `fsync` (under `interval`, a `safe` run's
//! rows and the refusal of a `safe` skill; under `normal`, every row) and
//! uses no approval is not written into SQLite by the request: it is
//! appended as one JSON line to the journal, `<audit_db>-rows`, with one
//! `write` on a file opened `O_APPEND`, and the request is answered
//! (`journal`). The line is then in the kernel's page cache, where a crash
//! or SIGKILL of the daemon cannot lose it, as a commit in SQLite's WAL
//! could not; under `interval` the background `fsync` covers the journal
//! too. The audit thread writes the lines into the database in one
//! transaction [`journal::INGEST_AFTER`] after the first of them, before
//! any read of the database (`GET /v1/audit`; when they cannot be written
//! then, the read's answer says it lacks them: [`Trail::incomplete`]),
//! and at a clean stop
//! ([`Audit::flush`]); it empties the file once all of it is in the
//! database and the WAL is `fsync`ed, when the file has grown past
//! [`journal::EMPTY_AT`] or at the stop. When the database is next opened
//! (at start-up), whatever the journal holds (a crash) is written into it
//! first, once: rows by id, `INSERT OR IGNORE`, then completions; a line
//! cut short is skipped with a warning. Row ids come from one counter for
//! the journal's rows and the database's alike, set past the largest id
//! the database has used when it is opened. The rows reach `audit.db` a
//! few milliseconds after their answers; `sqlite3` on it during a run may
//! miss the last ones. If the journal cannot be opened or appended to, the
//! rows go to the database directly (logged).
//!
//! One SQLite `INSERT` and `COMMIT` per row cost ~70-180 µs of the
//! daemon's CPU on each run's path with cold caches; the journal line
//! ~10 µs (BENCHMARKS.md, nineteenth pass).
//!
//! # Group commit
//!
//! Everything else (rows synced before their answer, rows that use an
//! approval, the completion of a row written so, reads, retention) goes to
//! the audit thread, which owns the one connection. It takes every job
//! waiting on its channel at once and writes them in one transaction, so
//! one commit (one `fsync`) covers all the rows of that batch; each caller
//! waits for the commit of its own batch only. Statements are prepared once
//! per connection (`prepare_cached`). An allowed run's first row
//! ([`Audit::record_before_run`]) is answered as soon as it is inserted,
//! before its commit: the run's answer waits for the commit of its
//! completion ([`RunRow::finish`]), which comes after the insert on the
//! same connection (FIFO), so it covers both. A refusal's row
//! ([`Audit::record`]) is answered once committed, since the answer
//! follows it directly. If a commit fails, every row of its batch is lost;
//! the completion of a run whose first row was lost finds no row and fails
//! (logged, counted in `ongrid_audit_write_errors_total`). Args and result are stored as JSON text of at most
//! [`FIELD_MAX_BYTES`] (a refused request's args at most
//! [`REFUSED_ARGS_MAX_BYTES`]; cut on a character boundary and marked
//! `*_truncated`); error texts at most [`ERROR_MAX_BYTES`].
//!
//! The approvals a run uses are written in the same transaction as its row,
//! in `used_approvals` under a unique key: the replay store's disk half
//! ([`crate::daemon::replay`]).
//!
//! # Failures
//!
//! SQLite calls block: they run on one dedicated thread (`ongrid-audit`);
//! requests reach it over a channel and wait on a oneshot. A journal
//! append is one `write` under a mutex, in the request; while the thread
//! holds that mutex for a long step (the replay, or emptying the file with
//! its `fsync`), requests send their rows to the thread instead of
//! blocking a runtime worker on it. A failed write
//! counts in `ongrid_audit_write_errors_total`, is logged at error level
//! and returns [`AuditError::Unavailable`]; the handler then refuses the
//! run (503 `audit_unavailable`) unless `audit_required = false`. A failed
//! append sends its row to the thread instead and cuts the file back to
//! its last whole line; if that fails too, nothing more is appended until
//! the thread has emptied the journal. Journaled lines the thread cannot write into the
//! database stay in the journal and in memory, and are tried again every
//! second (each failed try counted); beyond 16 MiB of them, new rows go to
//! the thread, which refuses them while the database fails (the
//! completions of journaled rows are still journaled). The thread opens
//! the database lazily and again after a failure, so fixing the file or its
//! directory needs no restart.
//!
//! # Retention
//!
//! At open and every [`PRUNE_EVERY`] inserts: rows beyond `audit_max_rows`,
//! rows older than `audit_max_age_days` and, while the rows take more than
//! `audit_max_bytes` of the database, the oldest rows are deleted
//! (refusals first, then allowed `safe` runs, then the rest), and so are
//! used approvals past their expiry. (A caller refused again and again
//! writes a row each time, and any caller may make `safe` runs: the size
//! cap bounds the file whatever the rows hold, and such a flood pushes out
//! older rows of its own kind before any `mutating` or `dangerous` run's.)

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};

use serde::Serialize;
use tokio::sync::oneshot;

use crate::daemon::config::{AuditSettings, AuditSync};
use journal::Journal;
use syncer::Syncer;
use worker::Worker;

mod journal;
mod sql;
mod syncer;
pub mod words;
mod worker;

pub use words::{CANCELLED, DECISIONS, EXECUTOR_UNAVAILABLE, INTERRUPTED, OUTCOMES};

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

enum Job {
    /// A row; `early`: answered once inserted, before the commit.
    Record(Box<Record>, oneshot::Sender<Result<i64, AuditError>>, bool),
    Finish(i64, Box<Finish>, Option<oneshot::Sender<Result<(), AuditError>>>),
    Query(Query, oneshot::Sender<Result<Trail, AuditError>>),
    UsedApprovals(oneshot::Sender<Result<Vec<(String, u64)>, AuditError>>),
    Count(oneshot::Sender<Result<i64, AuditError>>),
    /// Can the trail be written? ([`Audit::health`])
    Health(oneshot::Sender<Result<(), AuditError>>),
    /// Lines were journaled: write them in time (`true`: now).
    Ingest(bool),
    /// Write every journaled line now and empty the journal.
    Flush(oneshot::Sender<()>),
}

/// The handle requests share; the thread stops when the last is dropped.
#[derive(Debug, Clone)]
pub struct Audit {
    tx: mpsc::Sender<Job>,
    journal: Arc<Journal>,
    required: bool,
    /// `ongrid_audit_wait_seconds{row}`, when observed ([`Audit::observe_waits`]).
    waits: Option<Arc<Waits>>,
    /// Set by [`Audit::stopping`]: runs cut from now on were cut by skilld.
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

/// The children of `ongrid_audit_wait_seconds` by `row`.
#[derive(Debug)]
struct Waits {
    decision: Histogram,
    completion: Histogram,
    refusal: Histogram,
}

/// Which wait a request is timed in (a decision's: in
/// [`Audit::record_before_run`]).
#[derive(Clone, Copy)]
enum Row {
    Completion,
    Refusal,
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
        let syncer = match settings.synchronous {
            AuditSync::Interval => {
                let syncer = Arc::new(Syncer::default());
                let (s, db) = (syncer.clone(), settings.db.clone());
                let (interval, counted) =
                    (settings.sync_interval, syncs.with_label_values(&["interval"]));
                let errors = errors.clone();
                std::thread::Builder::new()
                    .name("ongrid-audit-sync".into())
                    .spawn(move || s.run(&db, interval, &counted, &errors))?;
                Some(syncer)
            }
            AuditSync::Full | AuditSync::Normal => None,
        };
        let commit_syncs = syncs.with_label_values(&["commit"]);
        let journaled = settings.synchronous != AuditSync::Full;
        let journal = Arc::new(Journal::new(&settings.db, journaled, syncer.clone()));
        let worker = Worker::new(
            settings.clone(),
            Arc::clone(&journal),
            errors,
            commit_syncs,
            syncer.clone(),
        );
        let (tx, rx) = mpsc::channel();
        // The thread holds the queue's receiver: it stops when the last
        // `Audit` (the last sender) is dropped.
        let spawned =
            std::thread::Builder::new().name("ongrid-audit".into()).spawn(move || worker.run(&rx));
        if let Err(e) = spawned {
            if let Some(syncer) = syncer {
                syncer.stop();
            }
            return Err(e);
        }
        Ok(Self { tx, journal, required: settings.required, waits: None, stopping: Arc::default() })
    }

    /// Times every wait for a row in `waits` (`ongrid_audit_wait_seconds`,
    /// labelled `row`): from the request for the row until it is written
    /// (a decision's row, inserted) or committed (a completion, a refusal).
    #[must_use]
    pub fn observe_waits(mut self, waits: &HistogramVec) -> Self {
        self.waits = Some(Arc::new(Waits {
            decision: waits.with_label_values(&["decision"]),
            completion: waits.with_label_values(&["completion"]),
            refusal: waits.with_label_values(&["refusal"]),
        }));
        self
    }

    /// [`Audit::ask`], timed in `row`'s histogram.
    async fn ask_timed<T>(
        &self,
        row: Row,
        job: impl FnOnce(oneshot::Sender<Result<T, AuditError>>) -> Job,
    ) -> Result<T, AuditError> {
        let started = std::time::Instant::now();
        let r = self.ask(job).await;
        if let Some(w) = &self.waits {
            let h = match row {
                Row::Completion => &w.completion,
                Row::Refusal => &w.refusal,
            };
            h.observe(started.elapsed().as_secs_f64());
        }
        r
    }

    /// Whether runs are refused when the audit cannot be written.
    pub fn required(&self) -> bool {
        self.required
    }

    /// skilld is stopping and cuts the runs still in flight: a [`RunRow`]
    /// dropped from now on says so, rather than that its client went away.
    pub fn stopping(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::Release);
    }

    async fn ask<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, AuditError>>) -> Job,
    ) -> Result<T, AuditError> {
        let (tx, rx) = oneshot::channel();
        self.submit(job(tx))?;
        rx.await.map_err(|_| AuditError::Closed)?
    }

    /// Hands `job` to the journal, else to the thread.
    fn submit(&self, job: Job) -> Result<(), AuditError> {
        match self.journal.try_append(job, &self.tx) {
            Some(job) => self.tx.send(job).map_err(|_| AuditError::Closed),
            None => Ok(()),
        }
    }

    /// Writes a decision whose answer follows it directly (the handler's
    /// refusals: `deny`, `reject`; timed as `row="refusal"`); returns the
    /// row id once committed, or journaled.
    ///
    /// # Errors
    ///
    /// [`AuditError`]; [`AuditError::Replayed`] when one of
    /// `record.approvals_used` is already in the database.
    pub async fn record(&self, record: Record) -> Result<i64, AuditError> {
        self.ask_timed(Row::Refusal, |tx| Job::Record(Box::new(record), tx, false)).await
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
    ///
    /// A caller dropped before it has the id leaves no row open: the
    /// thread completes a row whose id it could not hand over, and one
    /// handed over but never taken is completed here, both as `cancelled`
    /// (nothing ran). Once the id is returned, the caller holds it in a
    /// [`RunRow`] at once.
    pub async fn record_before_run(&self, record: Record) -> Result<i64, AuditError> {
        let started = std::time::Instant::now();
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Record(Box::new(record), tx, true))?;
        let mut unclaimed = Unclaimed { rx, audit: self };
        let r = (&mut unclaimed.rx).await.map_err(|_| AuditError::Closed);
        if let Some(w) = &self.waits {
            w.decision.observe(started.elapsed().as_secs_f64());
        }
        r?
    }

    /// Completes row `id`; returns once committed, or journaled.
    ///
    /// # Errors
    ///
    /// [`AuditError`].
    pub async fn finish(&self, id: i64, finish: Finish) -> Result<(), AuditError> {
        self.ask_timed(Row::Completion, |tx| Job::Finish(id, Box::new(finish), Some(tx))).await
    }

    /// Completes row `id` without waiting.
    pub fn finish_detached(&self, id: i64, finish: Finish) {
        let _ = self.submit(Job::Finish(id, Box::new(finish), None));
    }

    /// Writes every journaled row into the database and empties the
    /// journal; for a clean stop, so that the database alone holds the
    /// whole trail (a crash loses nothing either: the next start replays
    /// the journal).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Job::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Reads rows, newest first, once the journal's rows are written into
    /// the database; when they cannot be, the rows read are returned
    /// marked [`Trail::incomplete`].
    ///
    /// # Errors
    ///
    /// [`AuditError`].
    pub async fn query(&self, query: Query) -> Result<Trail, AuditError> {
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

    /// Whether the trail can be written, as far as can be told without
    /// writing a row (`GET /v1/health`): the database opens and reads,
    /// and the last write did not fail. After a failed write it stays
    /// unavailable until a write succeeds again (a full file system that
    /// was freed shows once the next row is written).
    ///
    /// # Errors
    ///
    /// [`AuditError`]: why not.
    pub async fn health(&self) -> Result<(), AuditError> {
        self.ask(Job::Health).await
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

/// What completes a decision's row whose caller went away before its run
/// started.
pub(super) fn unclaimed() -> Finish {
    Finish {
        outcome: CANCELLED.into(),
        error: Some("the client went away before the run started".into()),
        ..Finish::default()
    }
}

/// The receiving end of [`Audit::record_before_run`]'s id: dropped with
/// the id in it (sent, never taken: the caller was dropped meanwhile), it
/// completes that row.
struct Unclaimed<'a> {
    rx: oneshot::Receiver<Result<i64, AuditError>>,
    audit: &'a Audit,
}

impl Drop for Unclaimed<'_> {
    fn drop(&mut self) {
        // Closed first: a send after this fails, and the thread completes
        // the row itself; one before is found here.
        self.rx.close();
        if let Ok(Ok(id)) = self.rx.try_recv() {
            self.audit.finish_detached(id, unclaimed());
        }
    }
}

/// An allowed run's row, completed by [`RunRow::finish`]; dropped
/// unfinished (the client went away), it is completed as `cancelled`.
#[derive(Debug)]
pub struct RunRow {
    audit: Audit,
    id: Option<i64>,
    started: std::time::Instant,
    /// The run was handed to the executor ([`RunRow::handed_over`]).
    handed_over: bool,
}

impl RunRow {
    /// The row `id` (`None` when it could not be written and the audit is
    /// not required).
    pub fn new(audit: Audit, id: Option<i64>) -> Self {
        Self { audit, id, started: std::time::Instant::now(), handed_over: false }
    }

    /// The run went to the executor: a drop from now on cut a run, not a
    /// request that never started one.
    pub fn handed_over(&mut self) {
        self.handed_over = true;
    }

    /// The row's id, if it was written.
    pub fn id(&self) -> Option<i64> {
        self.id
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
            let stopping = self.audit.stopping.load(std::sync::atomic::Ordering::Acquire);
            let why = match (stopping, self.handed_over) {
                (true, _) => "ongrid-skilld stopped before the run ended",
                (false, true) => "the client went away before the run ended",
                (false, false) => "the client went away before the run started",
            };
            self.audit.finish_detached(
                id,
                Finish {
                    outcome: CANCELLED.into(),
                    error: Some(why.into()),
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

#[cfg(test)]
mod tests;
