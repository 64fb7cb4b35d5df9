//! [`Audit`], the handle requests share to write and read the trail on
//! its own thread, and [`RunRow`], an allowed run's row until it is
//! completed.

use std::sync::{mpsc, Arc};

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};
use tokio::sync::oneshot;

use super::job::Job;
use super::journal::Journal;
use super::rows::{unclaimed, AuditError, Finish, Query, Record, Trail};
use super::syncer::Syncer;
use super::words::CANCELLED;
use super::worker::Worker;
use crate::daemon::config::{AuditSettings, AuditSync};

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
    /// labelled `row`): from the request for the row until it is committed
    /// (a decision's row: before its batch's `fsync`) or committed and
    /// synced as due (a completion, a refusal).
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

    /// Hands over a refusal row whose answer does not wait for it (a
    /// hidden skill's 404 comes at once, as an unknown name's does):
    /// journaled or queued now; the thread commits it, and logs and counts
    /// a failure as for any row.
    pub fn record_unawaited(&self, record: Record) {
        let (tx, _) = oneshot::channel();
        if let Err(e) = self.submit(Job::Record(Box::new(record), tx, false)) {
            tracing::warn!(error = %e, "audit: a refusal row could not be handed over");
        }
    }

    /// Writes the decision of a run that is about to start; returns the
    /// row id once committed, before the `fsync` its batch may wait for: a
    /// run never starts without its row (a full file system fails the
    /// commit, and the run is refused). The `fsync` that [`Audit::finish`]
    /// of this id waits for covers this row too (one writer, FIFO), so a
    /// run's answer follows both rows' durability. Use [`Audit::record`]
    /// when the answer follows directly.
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

    /// The approvals used that expired less than a day ago or not yet
    /// (`replay::FORGET_AFTER`): replay key and expiry.
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
