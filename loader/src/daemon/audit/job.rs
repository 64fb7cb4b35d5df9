//! A job for the audit thread: what a request asks of it and where the
//! answer goes.

use tokio::sync::oneshot;

use super::rows::{AuditError, Finish, Query, Record, Trail};

pub(super) enum Job {
    /// A row; `early`: a run's decision, answered once committed, before
    /// the batch's `fsync`.
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

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}
