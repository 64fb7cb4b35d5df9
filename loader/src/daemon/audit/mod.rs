//! The audit trail: one SQLite row per decision
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
//! - `full`: every commit is `fsync`ed (the WAL's `fdatasync`, by the
//!   thread after the commit) before its answer; a run's decision row
//!   alone is answered once committed, its `fsync` covered by its
//!   completion's wait.
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
//! ~10 µs (measured with the loader benchmarks).
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
//! ([`Audit::record_before_run`]) is answered as soon as its batch is
//! committed, before the `fsync` the batch may wait for: the run starts
//! then, and its answer waits for the commit (and `fsync`) of its
//! completion ([`RunRow::finish`]), which comes after on the same
//! connection (FIFO), so it covers both. A refusal's row
//! ([`Audit::record`]) is answered once committed and synced, since the
//! answer follows it directly. If a commit fails, every row of its batch
//! is lost and every caller of the batch gets the error: a run whose
//! first row it held is refused, never started (SQLite's insert fits in
//! its page cache on a full file system; the commit is what fails). If the
//! `fsync` after a decision row's commit fails, its run has started: its
//! completion fails then (its answer must not say the trail holds it), even
//! once a later `fsync` succeeds (the kernel reports a lost write-back
//! once). Each failure counts in `ongrid_audit_write_errors_total`. Args and result are stored as JSON text of at most
//! [`FIELD_MAX_BYTES`] (a refused request's args at most
//! [`REFUSED_ARGS_MAX_BYTES`]; cut on a character boundary and marked
//! `*_truncated`); error texts at most [`ERROR_MAX_BYTES`].
//!
//! The approvals a run uses are written in the same transaction as its row,
//! in `used_approvals` under a unique key: the replay store's disk half
//! (the daemon's `replay` module keeps the memory half).
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
//! (refusals first, then allowed `safe` runs, then the rest; never the row
//! of a run still in flight, open less than two days), and so are used
//! approvals a day past their expiry. (A caller refused again and again
//! writes a row each time, and any caller may make `safe` runs: the size
//! cap bounds the file whatever the rows hold, and such a flood pushes out
//! older rows of its own kind before any `mutating` or `dangerous` run's.)

mod handle;
mod job;
mod journal;
mod rows;
mod sql;
mod syncer;
pub mod words;
mod worker;

pub use handle::{Audit, RunRow};
pub use rows::{
    now_ms, AuditError, Entry, Finish, Incomplete, Query, Record, Trail, ERROR_MAX_BYTES,
    FIELD_MAX_BYTES, MAX_QUERY_ROWS, PRUNE_EVERY, REFUSED_ARGS_MAX_BYTES,
};
pub use words::{CANCELLED, DECISIONS, EXECUTOR_UNAVAILABLE, INTERRUPTED, OUTCOMES};

#[cfg(test)]
mod full_disk_tests;
#[cfg(test)]
mod retention_tests;
#[cfg(test)]
mod tests;
