//! The audit writer: one SQLite connection, every job waiting at once
//! written in one transaction (group commit), and when each commit is made
//! durable (the parent module's Durability section).
//!
//! The connection is behind a mutex ([`Writer`]) so that a job may be
//! written in place, by the task that asks for it, when no other run is
//! in flight and nobody else is writing ([`Writer::try_in_place`]): the
//! audit thread then has nothing queued and is not in a batch. That saves the run's two hops to the
//! thread and back (a wake-up of another thread each, the dearest thing
//! on a guest), for a write that takes tens of microseconds. Only a write
//! that needs no `fsync` before its answer is written in place, on a
//! connection already open; anything that may take longer (an `fsync`,
//! a read, opening the database, retention) stays on the thread.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use prometheus::IntCounter;
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::sql::{self, run_cached, WriteError};
use super::syncer::{sync_commits, wal_path, Syncer};
use super::{AuditError, Job, PRUNE_EVERY};
use crate::config::{AuditSettings, AuditSync};

/// Most critical run rows remembered until their completion.
const MAX_CRITICAL_IN_FLIGHT: usize = 1 << 16;
/// Most jobs written in one transaction.
const MAX_BATCH: usize = 256;

/// The writer shared by the audit thread and the tasks that write in
/// place.
pub(super) struct Writer {
    worker: Mutex<Worker>,
    /// Jobs sent to the thread and not yet taken into a batch.
    queued: AtomicUsize,
    /// Allowed runs whose row is written and not yet completed
    /// ([`super::RunRow`]).
    open_runs: AtomicUsize,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("queued", &self.queued).finish_non_exhaustive()
    }
}

impl Writer {
    /// The writer of `worker`.
    pub(super) fn new(worker: Worker) -> Self {
        Self {
            worker: Mutex::new(worker),
            queued: AtomicUsize::new(0),
            open_runs: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Worker> {
        // A panic inside a batch leaves at worst an open transaction, which
        // the next `BEGIN` fails on and the connection is reopened.
        self.worker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `job` to the audit thread over its queue `tx`.
    pub(super) fn queue(&self, tx: &mpsc::Sender<Job>, job: Job) -> Result<(), AuditError> {
        self.queued.fetch_add(1, Ordering::SeqCst);
        tx.send(job).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            AuditError::Closed
        })
    }

    /// A run's row was written ([`super::RunRow::new`]).
    pub(super) fn run_opened(&self) {
        self.open_runs.fetch_add(1, Ordering::SeqCst);
    }

    /// A run's row is being completed, or given up.
    pub(super) fn run_closed(&self) {
        let _ =
            self.open_runs.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Writes `job` here and now when that is quick: no other run is in
    /// flight, nothing is queued for the thread, nobody holds the
    /// connection, and the job is a row whose answer needs no `fsync`
    /// ([`Worker::fits_in_place`]). Gives the job back otherwise. A
    /// caller's answer is sent before this returns; the retention a commit
    /// makes due goes to the thread over `tx`.
    ///
    /// With other runs in flight, their rows come in close together and
    /// the thread's group commit writes several in one transaction; one
    /// transaction per row cost more there than the hops it saves (8
    /// clients: daemon runs/s x bare 0.54 → 0.51, BENCHMARKS.md).
    pub(super) fn try_in_place(&self, job: Job, tx: &mpsc::Sender<Job>) -> Option<Job> {
        if self.open_runs.load(Ordering::SeqCst) != 0 || self.queued.load(Ordering::SeqCst) != 0 {
            return Some(job);
        }
        let mut worker = match self.worker.try_lock() {
            Ok(w) => w,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Some(job),
        };
        if !worker.fits_in_place(&job) {
            return Some(job);
        }
        worker.in_place += 1;
        worker.run_batch(vec![job]);
        if std::mem::take(&mut worker.prune_due) {
            drop(worker);
            let _ = self.queue(tx, Job::Prune);
        }
        None
    }

    /// The audit thread's loop: every job waiting at once is one batch,
    /// until every [`super::Audit`] is dropped.
    pub(super) fn run(&self, rx: &mpsc::Receiver<Job>) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let mut worker = self.lock();
            self.queued.fetch_sub(batch.len(), Ordering::SeqCst);
            worker.run_batch(batch);
            if std::mem::take(&mut worker.prune_due) {
                worker.prune();
            }
        }
        if let Some(syncer) = &self.lock().syncer {
            syncer.stop();
        }
    }

    /// Returns once nobody holds the connection (the thread's batch in
    /// progress is done).
    #[cfg(test)]
    pub(super) fn settle(&self) {
        drop(self.lock());
    }

    /// Jobs written in place so far.
    #[cfg(test)]
    pub(super) fn in_place(&self) -> u64 {
        self.lock().in_place
    }
}

/// The connection and what the writes remember.
pub(super) struct Worker {
    settings: AuditSettings,
    db: Option<Connection>,
    errors: IntCounter,
    /// `ongrid_audit_syncs_total{when="commit"}`.
    commit_syncs: IntCounter,
    /// With `interval`: the thread that `fsync`s the other commits.
    syncer: Option<Arc<Syncer>>,
    /// With `interval`: rows of runs in flight whose completion is
    /// `fsync`ed before its answer.
    critical: HashSet<i64>,
    inserts: u64,
    /// A commit crossed a multiple of [`PRUNE_EVERY`] inserts.
    prune_due: bool,
    /// Jobs written in place.
    in_place: u64,
}

impl Worker {
    /// The writer of `settings`' database, opened on first use.
    pub(super) fn new(
        settings: AuditSettings,
        errors: IntCounter,
        commit_syncs: IntCounter,
        syncer: Option<Arc<Syncer>>,
    ) -> Self {
        Self {
            settings,
            db: None,
            errors,
            commit_syncs,
            syncer,
            critical: HashSet::new(),
            inserts: 0,
            prune_due: false,
            in_place: 0,
        }
    }

    /// Whether `job` may be written by the task that asks for it: a row
    /// (a decision, or a completion someone waits for) on an open
    /// connection, whose commit is not `fsync`ed before the answer.
    fn fits_in_place(&self, job: &Job) -> bool {
        if self.db.is_none() || self.settings.synchronous == AuditSync::Full {
            return false;
        }
        match job {
            Job::Record(record, ..) => !(record.syncs_before_answer() && self.syncer.is_some()),
            Job::Finish(id, _, Some(_)) => !self.critical.contains(id),
            _ => false,
        }
    }

    /// Writes the batch's rows in one transaction, in order; a read first
    /// commits what is written before it, so it sees it.
    fn run_batch(&mut self, batch: Vec<Job>) {
        let mut group = Group::default();
        for job in batch {
            match job {
                Job::Record(record, reply, early) => {
                    let r = self.stage(&mut group, |db| sql::insert(db, &record));
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
                    match self.stage(&mut group, |db| sql::update(db, id, &finish)) {
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
                    let _ = reply.send(self.read(|db| sql::select(db, &q)));
                }
                Job::UsedApprovals(reply) => {
                    self.commit(&mut group);
                    let _ = reply.send(self.read(sql::used_approvals));
                }
                Job::Prune => {
                    self.commit(&mut group);
                    self.prune();
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
            let db = sql::open(&self.settings).map_err(|e| self.unavailable(&e))?;
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
                    self.prune_due = true;
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
                if let Err(e) = sync_commits(&self.settings.db) {
                    let e = AuditError::Unavailable {
                        path: wal_path(&self.settings.db),
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
