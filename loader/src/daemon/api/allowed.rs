//! [`Allowed`]: a run request that was allowed, from its decision until
//! its outcome is known, holding its audit row.
//!
//! Every way such a request ends is counted once in
//! `ongrid_executions_total` by skill and outcome, here. The ways the
//! handler decides (a report, `busy`, the executor gone...) complete the
//! row through [`Allowed::finish`], which counts its outcome. The one it
//! does not decide is the request dropped unfinished: its client went away
//! (hyper drops the handler's future, or the NDJSON body), or the drain of
//! a stopping skilld cut it. The row's own drop then completes it
//! `cancelled` ([`RunRow`]), and this one's drop counts it `cancelled`,
//! with the run's time in `ongrid_run_duration_seconds` once the executor
//! had the run. A request [`Allowed::settle`]d (refused after all: its
//! approval was replayed, or no audit row could be written) is counted
//! by whoever refuses it.

use std::sync::Arc;
use std::time::Instant;

use crate::daemon::app::App;
use crate::daemon::audit::{AuditError, Finish, RunRow, CANCELLED};

/// An allowed request whose outcome is not known yet; see the module docs.
#[derive(Debug)]
pub(super) struct Allowed {
    app: Arc<App>,
    skill: String,
    /// The decision's row, once written (its id is `None` when it could
    /// not be and the audit is not required).
    row: Option<RunRow>,
    /// When the run was handed to the executor.
    started: Option<Instant>,
    /// The outcome was decided (and counted, if it is counted, where it
    /// was): the drop counts nothing.
    settled: bool,
}

impl Allowed {
    /// The request to run `skill`, allowed: dropped from now on without
    /// [`Allowed::finish`] or [`Allowed::settle`], it counts as
    /// `cancelled`.
    pub(super) fn new(app: &Arc<App>, skill: &str) -> Self {
        Self {
            app: Arc::clone(app),
            skill: skill.to_owned(),
            row: None,
            started: None,
            settled: false,
        }
    }

    /// The decision's row was written.
    pub(super) fn decided(&mut self, row: RunRow) {
        self.row = Some(row);
    }

    /// The decision's row id, if it was written.
    pub(super) fn row_id(&self) -> Option<i64> {
        self.row.as_ref().and_then(RunRow::id)
    }

    /// The run went to the executor at `started`: a drop from now on cut a
    /// run, whose time is observed.
    pub(super) fn handed_over(&mut self, started: Instant) {
        if let Some(row) = &mut self.row {
            row.handed_over();
        }
        self.started = Some(started);
    }

    /// The outcome was decided without a row to complete (the decision's
    /// row was refused, or could not be written).
    pub(super) fn settle(&mut self) {
        self.settled = true;
    }

    /// The outcome was decided: counts it, completes the row with `finish`
    /// (once; a second call does nothing) and waits for the commit
    /// ([`RunRow::finish`]).
    ///
    /// # Errors
    ///
    /// [`AuditError`] when the commit failed.
    pub(super) async fn finish(&mut self, finish: Finish) -> Result<(), AuditError> {
        if self.settled {
            return Ok(());
        }
        self.settled = true;
        let m = self.app.metrics();
        m.executions_total.with_label_values(&[&self.skill, &finish.outcome]).inc();
        match self.row.take() {
            Some(row) => row.finish(finish).await,
            None => Ok(()),
        }
    }
}

impl Drop for Allowed {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let m = self.app.metrics();
        m.executions_total.with_label_values(&[&self.skill, CANCELLED]).inc();
        if let Some(started) = self.started {
            m.run_duration_seconds
                .with_label_values(&[&self.skill])
                .observe(started.elapsed().as_secs_f64());
        }
        tracing::info!(skill = %self.skill, run_started = self.started.is_some(), "run cancelled");
    }
}
