//! Retention and runs in flight: the caps never delete the row of a run
//! that has not ended, whose completion is still to come.

use prometheus::IntCounter;

use super::tests::{ok, record, settings, syncs};
use super::*;

fn safe(skill: &str) -> Record {
    Record {
        class: "safe".into(),
        mode: "read-only".into(),
        reason: "safe".into(),
        ..record(skill, &[])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_in_flight_keeps_its_row_through_retention() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let audit = Audit::start(&settings(dir.path(), 50), errors.clone(), &syncs()).unwrap();
    // `full`: every row through the thread, as a run whose completion
    // finds its row there.
    let long = audit.record_before_run(safe("long")).await.unwrap();
    let long = RunRow::new(audit.clone(), Some(long));
    for i in 0..PRUNE_EVERY + 10 {
        let id = audit.record_before_run(safe(&format!("s{i}"))).await.unwrap();
        RunRow::new(audit.clone(), Some(id)).finish(ok()).await.unwrap();
    }
    long.finish(ok()).await.expect("the long run's completion finds its row");
    assert_eq!(errors.get(), 0);
    let rows = audit.query(Query { limit: 500, ..Query::default() }).await.unwrap().items;
    assert!(rows.len() <= 50 + usize::try_from(PRUNE_EVERY).unwrap(), "pruned: {}", rows.len());
    let long = rows.iter().find(|e| e.skill == "long").expect("the long run's row");
    assert_eq!(long.outcome.as_deref(), Some("ok"));
}

/// A row left open for more than two days (its completion lost while
/// skilld ran) is no longer a run in flight: retention takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_open_for_days_is_pruned_like_a_finished_one() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let audit = Audit::start(&settings(dir.path(), 50), errors.clone(), &syncs()).unwrap();
    let lost = audit.record_before_run(safe("lost")).await.unwrap();
    let open = audit.record_before_run(safe("open")).await.unwrap();
    let db = rusqlite::Connection::open(dir.path().join("audit.db")).unwrap();
    let three_days = 3 * 86_400_000_i64;
    db.execute("UPDATE audit SET started_at = started_at - ?1 WHERE id = ?2", (three_days, lost))
        .unwrap();
    drop(db);
    for i in 0..PRUNE_EVERY + 10 {
        let id = audit.record_before_run(safe(&format!("s{i}"))).await.unwrap();
        RunRow::new(audit.clone(), Some(id)).finish(ok()).await.unwrap();
    }
    let rows = audit.query(Query { limit: 500, ..Query::default() }).await.unwrap().items;
    assert!(rows.iter().all(|e| e.id != lost), "the row open for three days stays");
    assert!(rows.iter().any(|e| e.id == open), "the run in flight lost its row");
    drop(RunRow::new(audit.clone(), Some(open)));
    assert_eq!(errors.get(), 0);
}
