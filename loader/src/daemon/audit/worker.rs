//! The audit thread's writer: one SQLite connection; the journal's lines
//! written in batches ([`super::journal`]); every other job waiting at
//! once written in one transaction (group commit), and when each commit
//! is made durable (the parent module's Durability section).

use std::collections::HashSet;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use prometheus::IntCounter;
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::job::Job;
use super::journal::{self, Journal, INGEST_AFTER};
use super::rows::{unclaimed, AuditError, Finish, Incomplete, Trail, PRUNE_EVERY};
use super::sql::{self, run_cached, Done, Row, WriteError};
use super::syncer::{sync_commits, wal_path, Syncer};
use crate::daemon::config::{AuditSettings, AuditSync};

/// Most critical run rows remembered until their completion.
const MAX_CRITICAL_IN_FLIGHT: usize = 1 << 16;
/// Most jobs written in one transaction.
const MAX_BATCH: usize = 256;
/// After a failed write of the journal's lines, the next try.
const INGEST_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The connection and what the writes remember.
pub(super) struct Worker {
    settings: AuditSettings,
    db: Option<Connection>,
    /// The journal and the row ids.
    journal: Arc<Journal>,
    errors: IntCounter,
    /// `ongrid_audit_syncs_total{when="commit"}`.
    commit_syncs: IntCounter,
    /// With `interval`: the thread that `fsync`s the other commits.
    syncer: Option<Arc<Syncer>>,
    /// With `interval`: rows of runs in flight whose completion is
    /// `fsync`ed before its answer.
    critical: HashSet<i64>,
    /// Rows of runs in flight whose decision's `fsync` failed after their
    /// run started: their completions fail ([`Worker::doubt`]).
    unsynced: HashSet<i64>,
    inserts: u64,
    /// A commit crossed a multiple of [`PRUNE_EVERY`] inserts.
    prune_due: bool,
    /// When the journal's lines are to be written, if any wait.
    ingest_due: Option<Instant>,
    /// The rows an earlier skilld left open were closed (on the first
    /// open only: later, open rows are this skilld's runs in flight).
    swept: bool,
    /// A write into the open database failed with this, and none
    /// succeeded since (the database not opening is seen by opening it).
    failing: Option<AuditError>,
}

impl Worker {
    /// The writer of `settings`' database, opened on first use.
    pub(super) fn new(
        settings: AuditSettings,
        journal: Arc<Journal>,
        errors: IntCounter,
        commit_syncs: IntCounter,
        syncer: Option<Arc<Syncer>>,
    ) -> Self {
        Self {
            settings,
            db: None,
            journal,
            errors,
            commit_syncs,
            syncer,
            critical: HashSet::new(),
            unsynced: HashSet::new(),
            inserts: 0,
            prune_due: false,
            ingest_due: None,
            swept: false,
            failing: None,
        }
    }

    /// The audit thread's loop: every job waiting at once is one batch,
    /// the journal's lines are written when due, until every
    /// the `Audit` handle is dropped; then the rest of the journal.
    pub(super) fn run(mut self, rx: &mpsc::Receiver<Job>) {
        loop {
            let first = match self.ingest_due {
                None => match rx.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                },
                Some(due) => match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                    Ok(job) => job,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        self.ingest();
                        if std::mem::take(&mut self.prune_due) {
                            self.prune();
                        }
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                },
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            self.run_batch(batch);
            if std::mem::take(&mut self.prune_due) {
                self.ingest();
                self.prune();
            }
        }
        self.flush();
        if let Some(syncer) = &self.syncer {
            syncer.stop();
        }
    }

    /// [`Worker::try_ingest`], whose failure is logged, counted and tried
    /// again later.
    fn ingest(&mut self) {
        let _ = self.try_ingest();
    }

    /// Writes the journal's lines into the database, if any wait, then
    /// empties the journal when that is due; on a failure (logged and
    /// counted) the lines wait for the next try ([`INGEST_RETRY`]).
    ///
    /// # Errors
    ///
    /// Why the lines could not be written.
    fn try_ingest(&mut self) -> Result<(), AuditError> {
        self.ingest_due = None;
        let lines = self.journal.take_pending();
        if !lines.is_empty() {
            let path = self.settings.db.clone();
            // `wrote`: the database opened, the write failed. An error of
            // the opening names the database already.
            let written = match self.connection() {
                Ok(db) => journal::write_lines(db, &lines, false)
                    .map_err(|e| (true, AuditError::Unavailable { path, message: e.to_string() })),
                Err(e) => Err((false, e)),
            };
            match written {
                Ok(counts) => self.ingested(counts),
                Err((wrote, e)) => {
                    if wrote {
                        self.failing = Some(e.clone());
                    }
                    // Counted once per failed try, not per line: the lines
                    // are kept and written by a later one.
                    self.fail(&e);
                    self.journal.put_back(lines);
                    self.ingest_due = Some(Instant::now() + INGEST_RETRY);
                    return Err(e);
                }
            }
        }
        self.empty_journal(false);
        Ok(())
    }

    /// Counts `n` rows and completions written from the journal, `lost`
    /// of them completions whose row is missing.
    fn ingested(&mut self, (n, lost): (usize, usize)) {
        if n > 0 {
            self.failing = None;
        }
        let before = self.inserts;
        self.inserts += n as u64;
        if self.inserts / PRUNE_EVERY != before / PRUNE_EVERY {
            self.prune_due = true;
        }
        for _ in 0..lost {
            self.errors.inc();
        }
        if n > 0 {
            if let Some(syncer) = &self.syncer {
                syncer.committed();
            }
        }
    }

    /// Empties the journal when it is due ([`Journal::empty_due`]; always
    /// with `force`): the database is `fsync`ed first with the appends
    /// going on, then the lines appended since are written and synced and
    /// the file cut with them stopped, so that it empties under any load.
    fn empty_journal(&mut self, force: bool) {
        if self.db.is_none() || !self.journal.empty_due(force) {
            return;
        }
        if let Err(e) = sync_commits(&self.settings.db) {
            tracing::warn!(error = %e, "audit: cannot fsync the database; the journal is kept");
            return;
        }
        let Some(db) = self.db.as_ref() else { return };
        let db_path = &self.settings.db;
        let emptied = self
            .journal
            .empty(|rest| journal::write_lines(db, rest, false), || sync_commits(db_path));
        match emptied {
            Ok(counts) => self.ingested(counts),
            Err(e) => {
                let e = AuditError::Unavailable {
                    path: self.settings.db.clone(),
                    message: e.to_string(),
                };
                self.failing = Some(e.clone());
                self.fail(&e);
                self.ingest_due = Some(Instant::now() + INGEST_RETRY);
            }
        }
    }

    /// Everything journaled into the database, the journal emptied, and
    /// the connection closed: as the last one, SQLite checkpoints its
    /// write-ahead log into the database and removes it, so a clean stop
    /// leaves the database file whole. A later job opens it again.
    fn flush(&mut self) {
        self.ingest();
        if self.ingest_due.is_none() {
            self.empty_journal(true);
        }
        if let Some(Err((_, e))) = self.db.take().map(Connection::close) {
            tracing::warn!(error = %e, "audit: closing the audit database");
        }
    }

    /// Writes the batch's rows in one transaction, in order; a read first
    /// commits what is written before it, so it sees it.
    fn run_batch(&mut self, batch: Vec<Job>) {
        let mut group = Group::default();
        for job in batch {
            match job {
                Job::Record(record, reply, early) => {
                    // The id is taken once the database is open (and the
                    // counter set past its ids), inside the stage.
                    let journal = Arc::clone(&self.journal);
                    let r = self.stage(&mut group, |db| {
                        let row = Row::new(journal.take_id(), &record);
                        sql::insert(db, &row, &record).map(|()| row.id)
                    });
                    if let (Ok(id), true) = (&r, early) {
                        self.journal.written_directly(*id);
                    }
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
                            group.early.push((id, reply));
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
                Job::Finish(id, finish, reply) => self.finish(&mut group, id, &finish, reply),
                Job::Query(q, reply) => {
                    self.commit(&mut group);
                    // Rows journaled before the read and not in the
                    // database: the answer says it lacks them.
                    let unwritten = self.try_ingest().err();
                    let items = self.read(|db| sql::select(db, &q));
                    let incomplete = unwritten.map(|e| Incomplete {
                        unwritten: self.journal.pending_lines(),
                        reason: e.to_string(),
                    });
                    let _ = reply.send(items.map(|items| Trail { items, incomplete }));
                }
                Job::UsedApprovals(reply) => {
                    self.commit(&mut group);
                    let _ = reply.send(self.read(sql::used_approvals));
                }
                Job::Health(reply) => {
                    self.commit(&mut group);
                    let _ = reply.send(self.health());
                }
                Job::Count(reply) => {
                    self.commit(&mut group);
                    self.ingest();
                    let _ =
                        reply.send(self.read(|db| {
                            db.query_row("SELECT count(*) FROM audit", [], |r| r.get(0))
                        }));
                }
                Job::Ingest(now) => {
                    if now {
                        self.commit(&mut group);
                        self.ingest();
                    } else {
                        self.ingest_due.get_or_insert_with(|| Instant::now() + INGEST_AFTER);
                    }
                }
                Job::Flush(reply) => {
                    self.commit(&mut group);
                    self.flush();
                    let _ = reply.send(());
                }
            }
        }
        self.commit(&mut group);
    }

    /// Completes row `id` in `group`; `reply` hears of the commit.
    fn finish(
        &mut self,
        group: &mut Group,
        id: i64,
        finish: &Finish,
        mut reply: Option<oneshot::Sender<Result<(), AuditError>>>,
    ) {
        if self.unsynced.remove(&id) {
            if let Some(reply) = reply.take() {
                self.errors.inc();
                let _ = reply.send(Err(AuditError::Unavailable {
                    path: wal_path(&self.settings.db),
                    message: "the run's decision row may not be on disk (its fsync failed)".into(),
                }));
            }
        }
        // Its row may be journaled and not yet written (the journal failed
        // since): write the journal's rows first.
        if self.journal.has_pending() {
            self.commit(group);
            self.ingest();
        }
        self.journal.completed_directly(id);
        group.critical |= self.critical.remove(&id);
        match self.stage(group, |db| sql::update(db, &Done::new(id, finish))) {
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

    fn unavailable(&self, e: &rusqlite::Error) -> AuditError {
        AuditError::Unavailable { path: self.settings.db.clone(), message: e.to_string() }
    }

    /// The connection, opened (and the journal replayed into it, on the
    /// first open) when there is none.
    fn connection(&mut self) -> Result<&mut Connection, AuditError> {
        if self.db.is_none() {
            let mut db = sql::open(&self.settings).map_err(|e| self.unavailable(&e))?;
            let replayed = self.journal.opened(&db, &self.settings.db).map_err(|e| {
                AuditError::Unavailable {
                    path: self.settings.db.clone(),
                    message: format!("replaying the journal: {e}"),
                }
            })?;
            if replayed > 0 {
                // Replayed rows may be past retention already.
                if let Err(e) = sql::prune(&mut db, &self.settings) {
                    tracing::warn!(error = %e, "audit: retention failed");
                }
            }
            if !self.swept {
                // Before this skilld's first row: every open one is an
                // earlier skilld's, whose runs ended with it.
                match sql::close_interrupted(&db) {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(
                        rows = n,
                        "audit: completed the rows of runs an earlier skilld left unreported \
                         as {:?}",
                        super::words::INTERRUPTED
                    ),
                    Err(e) => return Err(self.unavailable(&e)),
                }
                self.swept = true;
            }
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
        // The database opened, the write failed.
        let mut wrote = true;
        let r = match self.connection() {
            Err(e) => {
                wrote = false;
                Err(e)
            }
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
                    WriteError::Io(e) => AuditError::Unavailable {
                        path: self.settings.db.clone(),
                        message: e.to_string(),
                    },
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
                if wrote {
                    self.failing = Some(e.clone());
                }
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

    /// Whether the trail can be written, as far as can be told without
    /// writing a row: the journal's rows go in (when any wait), the
    /// database opens and reads, and the last write into it did not fail.
    /// A failed write (a full file system) is only known to be over once
    /// a write succeeds again.
    fn health(&mut self) -> Result<(), AuditError> {
        if self.journal.has_pending() {
            self.ingest();
        }
        self.read(|db| db.prepare_cached("SELECT 1 FROM audit LIMIT 1")?.exists([]))?;
        self.failing.clone().map_or(Ok(()), Err)
    }

    /// The group's transaction failed: every job of it fails with `e`.
    fn abort(&mut self, group: &mut Group, e: &AuditError) {
        if group.open {
            if let Some(db) = self.db.as_ref() {
                let _ = db.execute_batch("ROLLBACK");
            }
            self.db = None;
        }
        let lost = group.written.saturating_sub(group.waiters.len() + group.early.len());
        for _ in 0..lost {
            self.errors.inc();
        }
        for (_, reply) in group.early.drain(..) {
            // The run is refused: it never starts without its row.
            self.errors.inc();
            let _ = reply.send(Err(e.clone()));
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
        // A run's decision row is answered once committed (its run starts
        // then), before the `fsync` its batch may wait for: the run's
        // answer waits for its completion's, which covers both.
        let r = r.map(|()| self.answer_early(group));
        let r = r.and_then(|(started, unclaimed)| match self.made_durable(group.critical) {
            Ok(()) => Ok(unclaimed),
            Err(e) => {
                self.doubt(started);
                Err(e)
            }
        });
        match r {
            Ok(unclaimed) => {
                self.failing = None;
                let before = self.inserts;
                self.inserts += group.written as u64;
                for w in group.waiters.drain(..) {
                    w.send(Ok(()));
                }
                *group = Group::default();
                if self.inserts / PRUNE_EVERY != before / PRUNE_EVERY {
                    self.prune_due = true;
                }
                self.complete_unclaimed(unclaimed);
            }
            Err(e) => {
                tracing::error!(error = %e, "audit: cannot write the audit trail");
                self.failing = Some(e.clone());
                self.abort(group, &e);
            }
        }
    }

    /// Hands the group's decision rows their ids, now committed; returns
    /// the rows handed over (their runs start) and those whose handler
    /// went away before it had its id.
    fn answer_early(&mut self, group: &mut Group) -> (Vec<i64>, Vec<i64>) {
        let (mut started, mut unclaimed) = (Vec::new(), Vec::new());
        for (id, reply) in group.early.drain(..) {
            match reply.send(Ok(id)) {
                Ok(()) => started.push(id),
                Err(_) => unclaimed.push(id),
            }
        }
        (started, unclaimed)
    }

    /// The `fsync` after the commit of these runs' decision rows failed,
    /// their runs started: their completions fail (the answer must not say
    /// the trail holds them), even if a later `fsync` succeeds (the kernel
    /// reports a lost write-back once).
    fn doubt(&mut self, started: Vec<i64>) {
        if self.unsynced.len() + started.len() > MAX_CRITICAL_IN_FLIGHT {
            self.unsynced.clear();
        }
        self.unsynced.extend(started);
    }

    /// Completes the rows of runs whose handler went away before it had
    /// the row's id: nothing ran, nobody else will finish them.
    fn complete_unclaimed(&mut self, ids: Vec<i64>) {
        if ids.is_empty() {
            return;
        }
        let mut group = Group::default();
        for id in ids {
            self.finish(&mut group, id, &unclaimed(), None);
        }
        self.commit(&mut group);
    }

    /// After a commit: under `full` every batch is `fsync`ed now (the
    /// WAL's `fdatasync`), under `interval` a critical batch is and any
    /// other is handed to the syncer; under `normal` none.
    fn made_durable(&mut self, critical: bool) -> Result<(), AuditError> {
        let now = match self.settings.synchronous {
            AuditSync::Full => true,
            AuditSync::Interval => critical,
            AuditSync::Normal => false,
        };
        if !now {
            if let Some(syncer) = &self.syncer {
                syncer.committed();
            }
            return Ok(());
        }
        let at = Instant::now();
        if let Err(e) = sync_commits(&self.settings.db) {
            let e = AuditError::Unavailable {
                path: wal_path(&self.settings.db),
                message: format!("fsync: {e}"),
            };
            // What was committed may not be on disk: the batch fails as a
            // failed commit would.
            self.db = None;
            return Err(e);
        }
        self.commit_syncs.inc();
        if let Some(syncer) = &self.syncer {
            syncer.synced(at);
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
            if let Err(e) = sql::prune(db, &settings) {
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
    /// Rows written in it.
    written: usize,
    /// Runs' decision rows, answered with their ids once committed, before
    /// any `fsync` (`Audit::record_before_run`).
    early: Vec<(i64, oneshot::Sender<Result<i64, AuditError>>)>,
    /// Who waits for the commit (and its `fsync`, when due).
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
