//! The audit journal: the rows that need no `fsync` before their answer,
//! appended to `<audit_db>-rows` by the request that makes them and
//! copied into the database by the audit thread afterwards (the parent
//! module's Journal section).
//!
//! A line is one row or one completion as JSON, written with one `write`
//! on a file opened `O_APPEND`: once the `write` returns, the row survives
//! a crash or SIGKILL of the daemon (it is in the kernel's page cache, as
//! a commit in SQLite's WAL is), and the request is answered. The audit
//! thread takes the lines appended since its last look (kept in memory
//! too, so it never reads the file back) and writes them in one
//! transaction, [`INGEST_AFTER`] after the first of them, before any read
//! of the database, and at shutdown. The file is emptied once everything
//! in it is in the database and the WAL is `fsync`ed, when it has grown
//! past [`EMPTY_AT`] or at shutdown (the last lines are written, synced
//! and the file cut with the appends stopped for that one transaction
//! and `fsync`, so it empties under any load); at start-up, before any row is
//! written, whatever it holds (a crash) is written into the database
//! again (`INSERT OR IGNORE` by id, then the completions) and the file
//! emptied.
//!
//! Row ids come from one counter here, for the journal's rows and the
//! database's alike, set past the largest id the database has used once it
//! is opened (and the journal replayed).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::Connection;
use serde::{Deserialize, Serialize};

use super::job::Job;
use super::sql::{self, run_cached, Done, Row, WriteError};
use super::syncer::{journal_path, sync_commits, Syncer};

/// How long the audit thread lets lines gather before it writes them.
pub const INGEST_AFTER: Duration = Duration::from_millis(20);
/// Bytes of lines waiting for the thread beyond which it is asked to write
/// them at once.
const INGEST_NOW_BYTES: usize = 1 << 20;
/// Bytes of lines waiting beyond which rows are no longer journaled (the
/// database is failing): they go to the thread, which fails them.
const MAX_PENDING_BYTES: usize = 16 << 20;
/// Size past which the file is emptied once all of it is in the database.
pub const EMPTY_AT: u64 = 1 << 20;
/// Most run rows written to the database directly remembered until their
/// completion.
const MAX_DIRECT_IN_FLIGHT: usize = 1 << 16;
/// Lines replayed per transaction at start-up.
const REPLAY_BATCH: usize = 1024;

/// One line of the journal.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub(super) enum Line {
    /// A decision's row.
    Insert(Row),
    /// A run's completion.
    Finish(Done),
}

/// The journal and the row id counter, shared by every request and the
/// audit thread.
pub(super) struct Journal {
    path: PathBuf,
    /// Rows may be journaled (`audit_synchronous` is not `full`).
    enabled: bool,
    /// With `interval`: told of each line, which it `fsync`s in time.
    syncer: Option<Arc<Syncer>>,
    state: Mutex<State>,
    /// The thread holds the state for a long step (a replay, or emptying
    /// the file with an `fsync`): requests send their rows to the thread
    /// rather than block a runtime worker on the mutex meanwhile.
    busy: AtomicBool,
}

#[derive(Default)]
struct State {
    /// Open for appending, once replayed.
    file: Option<File>,
    /// A failed append may have left part of a line: nothing is appended
    /// until the file is emptied.
    broken: bool,
    /// The journal was replayed (once per process).
    replayed: bool,
    /// The next row id; 0 until the database was first opened.
    next_id: i64,
    /// Lines appended and not yet taken by the thread, with their sizes.
    pending: Vec<(Line, usize)>,
    pending_bytes: usize,
    /// Bytes in the file.
    len: u64,
    /// Run rows written to the database directly and not yet completed:
    /// their completion goes the same way.
    direct: HashSet<i64>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Journal {
    /// The journal of `db`; `enabled` unless every commit is `fsync`ed.
    pub(super) fn new(db: &Path, enabled: bool, syncer: Option<Arc<Syncer>>) -> Self {
        Self {
            path: journal_path(db),
            enabled,
            syncer,
            state: Mutex::default(),
            busy: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing here leaves the state half-changed on a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends `job` and answers it, when it may be journaled: a row that
    /// uses no approval (those need the database's unique key) and whose
    /// commit need not be `fsync`ed before its answer, or the completion
    /// of a row that was journaled. Gives the job back otherwise, or when
    /// the journal is not open or the append fails (logged; the thread
    /// then writes it, or fails it). Asks the thread over `tx` to write
    /// the lines in time.
    pub(super) fn try_append(&self, job: Job, tx: &mpsc::Sender<Job>) -> Option<Job> {
        let appendable = matches!(job, Job::Record(..) | Job::Finish(..));
        if !self.enabled || !appendable || self.busy.load(Ordering::Acquire) {
            return Some(job);
        }
        let mut st = self.lock();
        // A row written directly is completed directly (and synced before
        // the answer, when it is).
        if let Job::Finish(id, ..) = &job {
            if st.direct.remove(id) {
                return Some(job);
            }
        }
        if st.file.is_none() || st.broken {
            return Some(job);
        }
        let line = match &job {
            // Beyond MAX_PENDING_BYTES the database is failing: new rows go
            // to the thread, which refuses them; the completions of rows
            // journaled already still come here.
            Job::Record(r, ..)
                if r.approvals_used.is_empty()
                    && !(r.syncs_before_answer() && self.syncer.is_some())
                    && st.pending_bytes < MAX_PENDING_BYTES =>
            {
                Line::Insert(Row::new(st.next_id, r))
            }
            Job::Finish(id, f, _) => Line::Finish(Done::new(*id, f)),
            _ => return Some(job),
        };
        let mut text = match serde_json::to_vec(&line) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "audit: cannot encode a journal line");
                return Some(job);
            }
        };
        text.push(b'\n');
        let written = st.file.as_mut().map(|f| f.write_all(&text));
        if let Some(Err(e)) = written {
            // Part of the line may be there: cut the file back to its last
            // whole line. Only if that fails too, nothing more is appended
            // until the thread empties it. The thread writes this row.
            tracing::error!(path = %self.path.display(), error = %e, "audit: cannot append to the journal");
            let len = st.len;
            if !matches!(st.file.as_ref().map(|f| f.set_len(len)), Some(Ok(()))) {
                st.broken = true;
                drop(st);
                let _ = tx.send(Job::Ingest(true));
            }
            return Some(job);
        }
        let size = text.len();
        st.len += size as u64;
        let id = match &line {
            Line::Insert(row) => {
                st.next_id += 1;
                row.id
            }
            Line::Finish(done) => done.id,
        };
        let first = st.pending.is_empty();
        let before = st.pending_bytes;
        st.pending_bytes += size;
        let now = before < INGEST_NOW_BYTES && st.pending_bytes >= INGEST_NOW_BYTES;
        st.pending.push((line, size));
        drop(st);
        if let Some(syncer) = &self.syncer {
            syncer.committed();
        }
        if first || now {
            let _ = tx.send(Job::Ingest(now));
        }
        match job {
            Job::Record(_, reply, _) => {
                let _ = reply.send(Ok(id));
            }
            Job::Finish(_, _, Some(reply)) => {
                let _ = reply.send(Ok(()));
            }
            _ => {}
        }
        None
    }

    /// An id for a row written to the database directly.
    pub(super) fn take_id(&self) -> i64 {
        let mut st = self.lock();
        let id = st.next_id.max(1);
        st.next_id = id + 1;
        id
    }

    /// Run row `id` was written to the database directly: its completion
    /// is too.
    pub(super) fn written_directly(&self, id: i64) {
        if !self.enabled {
            return;
        }
        let mut st = self.lock();
        if st.direct.len() >= MAX_DIRECT_IN_FLIGHT {
            // Rows whose runs never completed (their handler was dropped
            // in between): such a completion, if any, is journaled.
            st.direct.clear();
        }
        st.direct.insert(id);
    }

    /// Run row `id`'s completion reached the thread: whichever way it came,
    /// the row is no longer awaited.
    pub(super) fn completed_directly(&self, id: i64) {
        if self.enabled {
            self.lock().direct.remove(&id);
        }
    }

    /// The database `db` (at `db_path`) was opened: on the first open,
    /// writes what the journal holds into it (and, with `enabled`, opens
    /// the journal for appending, emptied); sets the id counter past the
    /// database's. Returns the lines replayed.
    pub(super) fn opened(&self, db: &Connection, db_path: &Path) -> Result<usize, WriteError> {
        let _busy = Busy::hold(&self.busy);
        let mut st = self.lock();
        let mut replayed = 0;
        if !st.replayed {
            replayed = self.replay(db)?;
            if replayed > 0 {
                sync_commits(db_path).map_err(WriteError::Io)?;
            }
            st.replayed = true;
        }
        st.next_id = st.next_id.max(sql::next_id(db)?);
        if st.file.is_none() {
            self.reopen(&mut st);
        }
        Ok(replayed)
    }

    /// Opens the journal for appending, emptied (everything in it is in the
    /// database); without `enabled`, removes it.
    fn reopen(&self, st: &mut State) {
        if !self.enabled {
            match std::fs::remove_file(&self.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "audit: cannot remove the journal")
                }
            }
            return;
        }
        let opened = OpenOptions::new().append(true).create(true).mode(0o600).open(&self.path);
        match opened.and_then(|f| f.set_len(0).map(|()| f)) {
            Ok(f) => {
                st.file = Some(f);
                st.len = 0;
                st.broken = false;
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "audit: no journal; every row goes to the database directly");
            }
        }
    }

    /// Writes every line of the file into `db`: rows not there yet, then
    /// completions, in order. A line that does not parse (the end of one
    /// cut by a crash or a full disk) is skipped with a warning.
    fn replay(&self, db: &Connection) -> Result<usize, WriteError> {
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(WriteError::Io(e)),
        };
        let mut n = 0;
        let mut batch = Vec::new();
        for (i, text) in BufReader::new(file).split(b'\n').enumerate() {
            let text = text.map_err(WriteError::Io)?;
            match serde_json::from_slice::<Line>(&text) {
                Ok(line) => batch.push((line, text.len())),
                Err(e) if text.is_empty() => drop(e),
                Err(e) => tracing::warn!(
                    path = %self.path.display(),
                    line = i + 1,
                    error = %e,
                    "audit: skipping a damaged journal line"
                ),
            }
            if batch.len() >= REPLAY_BATCH {
                n += write_lines(db, &batch, true)?.0;
                batch.clear();
            }
        }
        n += write_lines(db, &batch, true)?.0;
        if n > 0 {
            tracing::info!(path = %self.path.display(), lines = n, "audit: journal replayed into the database");
        }
        Ok(n)
    }

    /// Whether lines wait for the thread.
    pub(super) fn has_pending(&self) -> bool {
        !self.lock().pending.is_empty()
    }

    /// How many lines wait for the thread.
    pub(super) fn pending_lines(&self) -> usize {
        self.lock().pending.len()
    }

    /// The lines appended since the last call, oldest first.
    pub(super) fn take_pending(&self) -> Vec<(Line, usize)> {
        let mut st = self.lock();
        st.pending_bytes = 0;
        std::mem::take(&mut st.pending)
    }

    /// Lines taken by [`Journal::take_pending`] that could not be written:
    /// they go back before any appended since.
    pub(super) fn put_back(&self, mut lines: Vec<(Line, usize)>) {
        let mut st = self.lock();
        lines.append(&mut st.pending);
        st.pending_bytes = lines.iter().map(|(_, n)| n).sum();
        st.pending = lines;
    }

    /// Whether the file is to be emptied: it has grown past [`EMPTY_AT`]
    /// (or holds anything, with `force`), or an append failed in a way
    /// that may have left part of a line.
    pub(super) fn empty_due(&self, force: bool) -> bool {
        let st = self.lock();
        st.file.is_some() && (st.broken || (st.len > 0 && (force || st.len >= EMPTY_AT)))
    }

    /// Empties the file, with the appends stopped meanwhile: `write`
    /// writes the lines appended since the last [`Journal::take_pending`]
    /// into the database, `sync` makes the database durable (the caller
    /// synced what was written before, without stopping anything), then
    /// the file is cut to nothing. Returns what `write` returned. When
    /// `write` fails, the lines wait for the next try; when `sync` fails,
    /// the file is kept (its lines are in the database, and would be
    /// replayed, once).
    ///
    /// The caller checks [`Journal::empty_due`] first: this stalls every
    /// append for one transaction and one `fsync`, once per [`EMPTY_AT`]
    /// of lines.
    pub(super) fn empty<T: Default>(
        &self,
        write: impl FnOnce(&[(Line, usize)]) -> Result<T, WriteError>,
        sync: impl FnOnce() -> std::io::Result<()>,
    ) -> Result<T, WriteError> {
        let _busy = Busy::hold(&self.busy);
        let mut st = self.lock();
        let rest = std::mem::take(&mut st.pending);
        st.pending_bytes = 0;
        let written = if rest.is_empty() {
            T::default()
        } else {
            match write(&rest) {
                Ok(w) => w,
                Err(e) => {
                    st.pending_bytes = rest.iter().map(|(_, n)| n).sum();
                    st.pending = rest;
                    return Err(e);
                }
            }
        };
        if let Err(e) = sync() {
            tracing::warn!(error = %e, "audit: cannot fsync the database; the journal is kept");
            return Ok(written);
        }
        match st.file.as_ref().map(|f| f.set_len(0)) {
            Some(Ok(())) => {
                st.len = 0;
                st.broken = false;
            }
            Some(Err(e)) => {
                tracing::warn!(path = %self.path.display(), error = %e, "audit: cannot empty the journal");
            }
            None => {}
        }
        Ok(written)
    }
}

/// [`Journal::busy`] set while held.
struct Busy<'a>(&'a AtomicBool);

impl<'a> Busy<'a> {
    fn hold(flag: &'a AtomicBool) -> Self {
        flag.store(true, Ordering::Release);
        Busy(flag)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Writes `lines` into `db` in one transaction; returns how many, and how
/// many were completions whose row is not there (skipped; `replayed`: not
/// an error, retention may have removed the row since).
pub(super) fn write_lines(
    db: &Connection,
    lines: &[(Line, usize)],
    replayed: bool,
) -> Result<(usize, usize), WriteError> {
    if lines.is_empty() {
        return Ok((0, 0));
    }
    run_cached(db, "BEGIN")?;
    let mut lost = 0;
    let r = lines.iter().try_for_each(|(line, _)| match line {
        Line::Insert(row) => sql::insert_row(db, row, true),
        Line::Finish(done) => match sql::update(db, done) {
            Err(WriteError::Lost(id)) => {
                if replayed {
                    tracing::debug!(id, "audit: a journaled completion's row is gone");
                } else {
                    tracing::error!(id, "audit: a journaled completion's row is missing");
                    lost += 1;
                }
                Ok(())
            }
            r => r,
        },
    });
    match r.and_then(|()| run_cached(db, "COMMIT").map_err(WriteError::Sql)) {
        Ok(()) => Ok((lines.len(), lost)),
        Err(e) => {
            let _ = db.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}
