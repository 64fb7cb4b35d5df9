//! The audit trail's unit tests.

use policy::RawJson;
use serde_json::json;

use std::time::{Duration, Instant};

use prometheus::{HistogramVec, IntCounter, IntCounterVec};

use super::sql::bounded;
use super::*;
use crate::daemon::config::{AuditSettings, AuditSync};

pub(super) fn settings(dir: &std::path::Path, max_rows: u64) -> AuditSettings {
    AuditSettings {
        db: dir.join("audit.db"),
        required: true,
        max_rows,
        max_age_days: 0,
        max_bytes: 0,
        synchronous: AuditSync::Full,
        sync_interval: Duration::from_millis(100),
    }
}

pub(super) fn syncs() -> IntCounterVec {
    IntCounterVec::new(prometheus::Opts::new("s", "s"), &["when"]).unwrap()
}

pub(super) fn record(skill: &str, used: &[(&str, u64)]) -> Record {
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
        args: Some(RawJson::from_slice(br#"{"n": 1}"#).unwrap()),
        ..Record::default()
    }
}

/// An `ok` completion.
pub(super) fn ok() -> Finish {
    Finish { outcome: "ok".into(), ..Finish::default() }
}

/// A finished run's row, written whole (retention keeps a run's row
/// while it has no outcome: its run is in flight).
fn finished(record: Record) -> Record {
    Record { outcome: Some("ok".into()), ..record }
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
                network_denied: Some(7),
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

    let rows = audit.query(Query { limit: 10, ..Query::default() }).await.unwrap().items;
    assert_eq!(rows.len(), 1);
    let e = &rows[0];
    assert_eq!((e.decision.as_str(), e.reason.as_str()), ("allow", "dual_signed"));
    assert_eq!(e.approvers, ["aa", "bb"]);
    assert_eq!(e.args.get(), r#"{"n": 1}"#, "the args as sent");
    assert!(e.result_truncated && !e.args_truncated);
    assert!(e.result.to_value().as_str().unwrap().len() <= FIELD_MAX_BYTES);
    assert_eq!(e.exit_code, Some(0));
    assert!(e.finished_at.is_some() && e.duration_ms.is_some());
    assert_eq!(e.network_denied, Some(7));
    let none = Query { skill: Some("other".into()), limit: 10, ..Query::default() };
    assert!(audit.query(none).await.unwrap().items.is_empty());
    let future = Query { since_ms: Some(now_ms() + 60_000), limit: 10, ..Query::default() };
    assert!(audit.query(future).await.unwrap().items.is_empty());
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
    // What the syncer syncs is there: the WAL of an open connection.
    assert!(super::syncer::wal_path(&interval_settings.db).is_file());
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
    let rows = audit.query(Query { limit: 100, ..Query::default() }).await.unwrap().items;
    assert!(rows.iter().filter(|e| e.skill != "first").all(|e| e.outcome.as_deref() == Some("ok")));
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
        audit.record(finished(record(&format!("s{i}"), &[]))).await.unwrap();
    }
    assert_eq!(audit.count().await.unwrap(), 15);
    let newest = audit.query(Query { limit: 1, ..Query::default() }).await.unwrap().items;
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

#[tokio::test]
async fn health_says_why_the_trail_cannot_be_written_until_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let start =
        |s: &AuditSettings| Audit::start(s, IntCounter::new("e", "e").unwrap(), &syncs()).unwrap();
    // A directory that does not exist, then does.
    let missing = dir.path().join("missing");
    let audit = start(&settings(&missing, 0));
    let e = audit.health().await.unwrap_err();
    assert!(e.to_string().contains("missing/audit.db"), "{e}");
    std::fs::create_dir(&missing).unwrap();
    assert_eq!(audit.health().await, Ok(()));
    drop(audit);

    // A file that is not a database.
    let corrupt = dir.path().join("corrupt");
    std::fs::create_dir(&corrupt).unwrap();
    std::fs::write(corrupt.join("audit.db"), vec![b'x'; 8192]).unwrap();
    let audit = start(&settings(&corrupt, 0));
    let e = audit.health().await.unwrap_err();
    assert!(e.to_string().contains("not a database"), "{e}");
    drop(audit);

    // A write that failed (another process holds the database locked):
    // unavailable until a write succeeds again, though reads work.
    let fine = dir.path().join("fine");
    std::fs::create_dir(&fine).unwrap();
    let s = settings(&fine, 0);
    let audit = start(&s);
    audit.record(record("rm", &[])).await.unwrap();
    assert_eq!(audit.health().await, Ok(()));
    let other = rusqlite::Connection::open(&s.db).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let e = audit.record(record("rm", &[])).await.unwrap_err();
    assert!(e.to_string().contains("locked"), "{e}");
    assert_eq!(audit.health().await, Err(e.clone()));
    other.execute_batch("ROLLBACK").unwrap();
    assert_eq!(audit.health().await, Err(e), "known to work only once a write does");
    audit.record(record("rm", &[])).await.unwrap();
    assert_eq!(audit.health().await, Ok(()));
}

/// Only skilld's user reads the rows: not the world, and not the group
/// (skilld's group is its API clients'). A database an earlier version
/// left readable is tightened at open.
#[tokio::test]
async fn the_database_and_its_wal_are_readable_by_skilld_alone() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path(), 0);
    let wal = dir.path().join("audit.db-wal");
    let audit = Audit::start(&s, IntCounter::new("e", "e").unwrap(), &syncs()).unwrap();
    audit.record(record("rm", &[])).await.unwrap();
    for path in [&s.db, &wal] {
        assert_eq!(mode(path), 0o600, "{}", path.display());
    }
    drop(audit);
    for path in [&s.db, &wal] {
        if path.exists() {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    let audit = Audit::start(&s, IntCounter::new("e", "e").unwrap(), &syncs()).unwrap();
    audit.record(record("rm", &[])).await.unwrap();
    for path in [&s.db, &wal] {
        assert_eq!(mode(path), 0o600, "{} after an open", path.display());
    }
}

/// Retention by row count takes refusals, then allowed `safe` runs, before
/// any other run's row: a flood of `safe` runs and refusals (which any
/// caller may make) does not erase a `dangerous` run's row.
#[tokio::test]
async fn a_flood_of_safe_runs_and_refusals_does_not_erase_a_dangerous_runs_row() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let audit = Audit::start(&settings(dir.path(), 10), errors, &syncs()).unwrap();
    audit.record(record("dual_signed_run", &[])).await.unwrap();
    for i in 0..PRUNE_EVERY * 2 {
        let decision = if i % 2 == 0 { "deny" } else { "allow" };
        let r = Record { decision, class: "safe".into(), ..record(&format!("s{i}"), &[]) };
        audit.record(finished(r)).await.unwrap();
    }
    let rows = audit.query(Query { limit: 100, ..Query::default() }).await.unwrap().items;
    assert!(rows.len() <= 10 + usize::try_from(PRUNE_EVERY).unwrap(), "pruned: {}", rows.len());
    assert!(rows.iter().any(|e| e.skill == "dual_signed_run"), "the dangerous run's row stays");
}

#[test]
fn bounded_cuts_on_a_character_boundary() {
    assert_eq!(bounded("abc".into(), 3), ("abc".into(), false));
    assert_eq!(bounded("aé".into(), 2), ("a".into(), true));
}

/// A sync finds the WAL, or else syncs the database file; with neither it
/// is an error, never a sync counted for nothing.
#[test]
fn a_sync_always_syncs_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("a.db");
    let wal = super::syncer::wal_path(&db);
    assert_eq!(wal, dir.path().join("a.db-wal"));
    assert!(super::syncer::sync_commits(&db).is_err());
    std::fs::write(&db, b"x").unwrap();
    super::syncer::sync_commits(&db).unwrap();
    std::fs::write(&wal, b"y").unwrap();
    std::fs::remove_file(&db).unwrap();
    super::syncer::sync_commits(&db).unwrap();
}

/// The lines of the journal of `settings`' database.
fn journal_lines(settings: &AuditSettings) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(super::syncer::journal_path(&settings.db)).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The rows of `db` read with a connection of its own: (id, skill,
/// outcome).
fn db_rows(db: &std::path::Path) -> Vec<(i64, String, Option<String>)> {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut stmt = c.prepare("SELECT id, skill, outcome FROM audit ORDER BY id").unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A row whose answer needs no `fsync` (under `interval`) is appended to
/// the journal and answered at once; the thread writes it into the
/// database shortly after, before any read, and at a flush. A row synced
/// before its answer, a row that uses an approval, the completion of a row
/// written directly and anything before the database is first opened go
/// to the database directly. Ids come from one counter, in order.
#[tokio::test]
async fn safe_rows_are_journaled_then_written_into_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let interval = AuditSettings { synchronous: AuditSync::Interval, ..settings(dir.path(), 0) };
    let counts = syncs();
    let audit = Audit::start(&interval, errors.clone(), &counts).unwrap();
    let safe = |skill: &str| Record { class: "safe".into(), ..record(skill, &[]) };
    let done = || Finish { outcome: "ok".into(), exit_code: Some(0), ..Finish::default() };

    // The first row opens the database, directly; so does its completion.
    let first = audit.record_before_run(safe("df")).await.unwrap();
    RunRow::new(audit.clone(), Some(first)).finish(done()).await.unwrap();
    assert!(journal_lines(&interval).is_empty());
    // The next safe run and a refusal: journaled, the ids next in line.
    let id = audit.record_before_run(safe("du")).await.unwrap();
    assert_eq!(id, first + 1);
    RunRow::new(audit.clone(), Some(id)).finish(done()).await.unwrap();
    let refused = audit.record(Record { decision: "deny", ..safe("ls") }).await.unwrap();
    assert_eq!(refused, first + 2);
    let lines = journal_lines(&interval);
    let ops: Vec<_> =
        lines.iter().map(|l| (l["op"].as_str().unwrap(), l["id"].as_i64().unwrap())).collect();
    assert_eq!(ops, [("insert", id), ("finish", id), ("insert", refused)]);
    assert_eq!(lines[0]["skill"], "du");
    assert_eq!(lines[1]["outcome"], "ok");
    assert_eq!(counts.with_label_values(&["commit"]).get(), 0);
    // A dangerous run: directly, synced before both answers.
    let rm = audit.record_before_run(record("rm", &[])).await.unwrap();
    assert_eq!(rm, first + 3);
    RunRow::new(audit.clone(), Some(rm)).finish(done()).await.unwrap();
    assert_eq!(counts.with_label_values(&["commit"]).get(), 2);
    // A safe row that uses an approval: directly (the unique key).
    let far = u64::try_from(now_ms() / 1000).unwrap() + 600;
    let used = audit.record(Record { class: "safe".into(), ..record("df", &[("aa:d1", far)]) });
    assert_eq!(used.await.unwrap(), first + 4);
    assert_eq!(journal_lines(&interval).len(), 3);

    // The thread writes the journaled rows without being asked to read.
    let until = Instant::now() + Duration::from_secs(10);
    while db_rows(&interval.db).len() < 5 {
        assert!(Instant::now() < until, "the journal's rows never reached the database");
        std::thread::sleep(Duration::from_millis(5));
    }
    let want = |id, skill: &str, outcome: &str| (id, skill.to_owned(), Some(outcome.to_owned()));
    assert_eq!(
        db_rows(&interval.db),
        [
            want(first, "df", "ok"),
            want(id, "du", "ok"),
            (refused, "ls".to_owned(), None),
            want(rm, "rm", "ok"),
            (first + 4, "df".to_owned(), None),
        ]
    );
    // A read sees a row journaled just before it.
    audit.record(Record { decision: "deny", ..safe("ps") }).await.unwrap();
    assert_eq!(audit.count().await.unwrap(), 6);
    // A flush writes everything and empties the journal.
    audit.record(Record { decision: "deny", ..safe("ps") }).await.unwrap();
    audit.flush().await;
    assert!(journal_lines(&interval).is_empty());
    // Closed: its write-ahead log is checkpointed and gone.
    assert!(!super::syncer::wal_path(&interval.db).exists(), "the WAL is left");
    assert_eq!(db_rows(&interval.db).len(), 7);
    // A later write opens it again.
    audit.record(Record { decision: "deny", ..safe("ps") }).await.unwrap();
    assert_eq!(audit.count().await.unwrap(), 8);
    assert_eq!(errors.get(), 0);

    // `full`: every row goes to the database, synced: no journal.
    let dir = tempfile::tempdir().unwrap();
    let full = settings(dir.path(), 0);
    let audit = Audit::start(&full, errors.clone(), &syncs()).unwrap();
    for _ in 0..2 {
        let id = audit.record_before_run(safe("df")).await.unwrap();
        RunRow::new(audit.clone(), Some(id)).finish(done()).await.unwrap();
    }
    assert_eq!(db_rows(&full.db).len(), 2);
    assert!(!super::syncer::journal_path(&full.db).exists());
}

/// A read while the journal's rows cannot be written into the database
/// (here a trigger refuses every insert, as a lock or a full disk would)
/// answers the rows it can read, marked incomplete, with why (named once:
/// `audit database X unavailable: ...`); once the rows go in, it is whole.
#[tokio::test]
async fn a_read_that_lacks_journaled_rows_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let interval = AuditSettings { synchronous: AuditSync::Interval, ..settings(dir.path(), 0) };
    let audit = Audit::start(&interval, IntCounter::new("e", "e").unwrap(), &syncs()).unwrap();
    let safe =
        |skill: &str| Record { class: "safe".into(), decision: "deny", ..record(skill, &[]) };
    let all = || Query { limit: 10, ..Query::default() };
    // The first row opens the database (and the journal).
    audit.record(safe("df")).await.unwrap();
    let trail = audit.query(all()).await.unwrap();
    assert_eq!((trail.items.len(), &trail.incomplete), (1, &None));

    let other = rusqlite::Connection::open(&interval.db).unwrap();
    other
        .execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON audit \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    audit.record(safe("du")).await.unwrap();
    assert_eq!(journal_lines(&interval).len(), 1, "journaled, answered");
    let trail = audit.query(all()).await.unwrap();
    let names: Vec<&str> = trail.items.iter().map(|e| e.skill.as_str()).collect();
    assert_eq!(names, ["df"], "the database lacks the journaled row");
    let incomplete = trail.incomplete.expect("the answer says it is incomplete");
    assert_eq!(incomplete.unwritten, 1);
    let want = format!("audit database {} unavailable: refused by the test", interval.db.display());
    assert_eq!(incomplete.reason, want);

    other.execute_batch("DROP TRIGGER refuse").unwrap();
    let trail = audit.query(all()).await.unwrap();
    let names: Vec<&str> = trail.items.iter().map(|e| e.skill.as_str()).collect();
    assert_eq!((names, trail.incomplete), (vec!["du", "df"], None));
}

/// What a crash leaves in the journal is written into the database when it
/// is next opened, once: a row already there is kept as it is, a
/// completion whose row is gone is skipped, a line cut short is skipped;
/// then the journal is emptied and new rows take ids past every replayed
/// one. Under `full`, a journal left by an earlier `interval` run is
/// replayed too, then removed.
#[tokio::test]
async fn a_journal_left_by_a_crash_is_replayed_once_at_the_next_open() {
    use super::journal::Line;
    use super::sql::{Done, Row};
    use super::syncer::journal_path;

    for mode in [AuditSync::Normal, AuditSync::Full] {
        let dir = tempfile::tempdir().unwrap();
        let errors = IntCounter::new("e", "e").unwrap();
        let normal = AuditSettings { synchronous: AuditSync::Normal, ..settings(dir.path(), 0) };
        let audit = Audit::start(&normal, errors.clone(), &syncs()).unwrap();
        let safe = |skill: &str| Record { class: "safe".into(), ..record(skill, &[]) };
        assert_eq!(audit.record(safe("one")).await.unwrap(), 1);
        assert_eq!(audit.record(safe("two")).await.unwrap(), 2);
        audit.flush().await;
        drop(audit);
        assert_eq!(db_rows(&normal.db).len(), 2);

        // The journal of a daemon killed after answering: row 2 again (it
        // was in the database already), row 3 and its completion, the
        // completion of a row retention removed, and a line cut short.
        let line = |l: Line| serde_json::to_string(&l).unwrap() + "\n";
        let mut text = line(Line::Insert(Row::new(2, &safe("changed"))));
        text += &line(Line::Insert(Row::new(3, &safe("three"))));
        let finish = Finish { outcome: "ok".into(), exit_code: Some(0), ..Finish::default() };
        text += &line(Line::Finish(Done::new(3, &finish)));
        text += &line(Line::Finish(Done::new(99, &finish)));
        text += r#"{"op":"insert","id":4,"sess"#;
        std::fs::write(journal_path(&normal.db), text).unwrap();

        let again = AuditSettings { synchronous: mode, ..normal.clone() };
        let audit = Audit::start(&again, errors.clone(), &syncs()).unwrap();
        assert_eq!(audit.count().await.unwrap(), 3, "{mode:?}");
        let want = |id, skill: &str, outcome: Option<&str>| {
            (id, skill.to_owned(), outcome.map(str::to_owned))
        };
        // Rows 1 and 2 were left open by the daemon that crashed: its runs
        // ended with it, unreported.
        let left = Some("interrupted");
        assert_eq!(
            db_rows(&normal.db),
            [want(1, "one", left), want(2, "two", left), want(3, "three", Some("ok"))]
        );
        match mode {
            AuditSync::Full => assert!(!journal_path(&normal.db).exists()),
            _ => assert!(journal_lines(&again).is_empty()),
        }
        assert_eq!(audit.record(safe("five")).await.unwrap(), 4, "{mode:?}");
        assert_eq!(errors.get(), 0);
        // Replayed once: the next open finds nothing more.
        audit.flush().await;
        drop(audit);
        let audit = Audit::start(&again, errors.clone(), &syncs()).unwrap();
        assert_eq!(audit.count().await.unwrap(), 4);
    }
}

/// Under a steady stream of journaled rows, the journal is still emptied
/// once past its size (the last lines are written and the file cut with
/// the appends stopped for it), and every row reaches the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_empties_under_a_steady_stream_of_rows() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let normal = AuditSettings { synchronous: AuditSync::Normal, ..settings(dir.path(), 0) };
    let audit = Audit::start(&normal, errors.clone(), &syncs()).unwrap();
    let big = |i: usize| Record {
        class: "safe".into(),
        decision: "deny",
        args: Some(RawJson::from_value(&json!({"i": i, "pad": "x".repeat(16 << 10)}))),
        ..record("df", &[])
    };
    // The first row opens the database (directly).
    audit.record(big(0)).await.unwrap();
    let path = super::syncer::journal_path(&normal.db);
    let size = || std::fs::metadata(&path).map_or(0, |m| m.len());
    // ~6 MiB of lines, appended back to back. How far past EMPTY_AT the
    // file grows before it is cut depends on how fast the thread's
    // transaction and `fsync` are against the appends (3.6 MiB seen on a
    // loaded CI host): what must hold is that it is cut while they go on.
    let rows = 400;
    let (mut largest, mut last, mut cut) = (0, 0, false);
    for i in 1..rows {
        audit.record(big(i)).await.unwrap();
        let now = size();
        cut |= now < last;
        (largest, last) = (largest.max(now), now);
    }
    assert!(largest >= super::journal::EMPTY_AT, "the stream was too small: {largest}");
    assert!(cut, "the journal was not emptied during the stream: {largest} bytes at most");
    assert_eq!(audit.count().await.unwrap(), i64::try_from(rows).unwrap());
    assert_eq!(errors.get(), 0);
}

/// While the thread empties the journal (the appends stopped for a
/// transaction and an `fsync`), a request does not wait on the journal's
/// lock: its row goes to the thread. (Called from inside the emptying, on
/// the thread that holds the lock, a wait would never end.)
#[test]
fn a_request_does_not_wait_while_the_journal_is_emptied() {
    use std::sync::{mpsc, Arc};

    use tokio::sync::oneshot;

    use super::job::Job;
    use super::journal::Journal;

    let dir = tempfile::tempdir().unwrap();
    let normal = AuditSettings { synchronous: AuditSync::Normal, ..settings(dir.path(), 0) };
    let db = super::sql::open(&normal).unwrap();
    let journal = Arc::new(Journal::new(&normal.db, true, None));
    journal.opened(&db, &normal.db).unwrap();
    let (tx, _rx) = mpsc::channel();
    let job = |skill: &str| {
        let r = Record { class: "safe".into(), decision: "deny", ..record(skill, &[]) };
        Job::Record(Box::new(r), oneshot::channel().0, false)
    };
    assert!(journal.try_append(job("ls"), &tx).is_none(), "journaled");
    // A request on another thread while the lock is held for emptying.
    let during = journal
        .empty(
            |_| {
                let (done, answer) = mpsc::channel();
                let (j, tx) = (Arc::clone(&journal), tx.clone());
                std::thread::spawn(move || {
                    let back = j.try_append(job("ps"), &tx);
                    let _ = done.send(matches!(back, Some(Job::Record(..))));
                });
                Ok(answer.recv_timeout(Duration::from_secs(5)).ok())
            },
            || Ok(()),
        )
        .unwrap();
    assert_eq!(during, Some(true), "the request waited for the lock, or was journaled");
    // Once emptied, rows are journaled again.
    assert!(journal.try_append(job("df"), &tx).is_none());
}

/// A sync clears only the commits and lines made before it began: one
/// made while it ran still waits for the timer.
#[test]
fn a_sync_clears_only_what_came_before_it() {
    let syncer = super::syncer::Syncer::default();
    let began = Instant::now();
    syncer.committed();
    syncer.synced(began);
    assert!(syncer.pending());
    syncer.synced(Instant::now());
    assert!(!syncer.pending());
}

/// `ongrid_audit_wait_seconds{row}` times each wait a request makes for
/// its row, once: the decision before a run, its completion, a refusal; a
/// completion nobody waits for (the client went away) is not timed.
#[tokio::test]
async fn each_wait_for_a_row_is_timed_once_under_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let waits = HistogramVec::new(
        prometheus::HistogramOpts::new("w", "w")
            .buckets(crate::daemon::metrics::AUDIT_WAIT_BUCKETS.to_vec()),
        &["row"],
    )
    .unwrap();
    let audit = Audit::start(&settings(dir.path(), 0), errors.clone(), &syncs())
        .unwrap()
        .observe_waits(&waits);
    let count = |row: &str| waits.with_label_values(&[row]).get_sample_count();
    let safe = |skill: &str| Record { class: "safe".into(), ..record(skill, &[]) };

    let started = Instant::now();
    let id = audit.record_before_run(safe("ls")).await.unwrap();
    let row = RunRow::new(audit.clone(), Some(id));
    row.finish(Finish { outcome: "ok".into(), exit_code: Some(0), ..Finish::default() })
        .await
        .unwrap();
    let took = started.elapsed().as_secs_f64();
    assert_eq!((count("decision"), count("completion"), count("refusal")), (1, 1, 0));
    let timed = waits.with_label_values(&["decision"]).get_sample_sum()
        + waits.with_label_values(&["completion"]).get_sample_sum();
    assert!(timed > 0.0 && timed <= took, "timed {timed} s of {took} s");

    audit
        .record(Record { decision: "deny", reason: "class_not_allowed".into(), ..safe("rm") })
        .await
        .unwrap();
    assert_eq!((count("decision"), count("completion"), count("refusal")), (1, 1, 1));

    // Dropped unfinished: completed as `cancelled` in the background.
    let id = audit.record_before_run(safe("ls")).await.unwrap();
    drop(RunRow::new(audit.clone(), Some(id)));
    assert_eq!(audit.count().await.unwrap(), 3);
    assert_eq!((count("decision"), count("completion"), count("refusal")), (2, 1, 1));
    assert_eq!(errors.get(), 0);
}

/// A row an earlier skilld left open (it was killed mid-run) is completed
/// as `interrupted` when the next one opens the database; its own rows in
/// flight are not touched.
#[tokio::test]
async fn rows_left_open_by_an_earlier_skilld_are_completed_as_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let s = settings(dir.path(), 0);
    let first = Audit::start(&s, errors.clone(), &syncs()).unwrap();
    let open = first.record(record("left", &[])).await.unwrap();
    let done = first.record(record("done", &[])).await.unwrap();
    let ok = Finish { outcome: "ok".into(), exit_code: Some(0), ..Finish::default() };
    first.finish(done, ok.clone()).await.unwrap();
    first.flush().await;
    drop(first);

    let second = Audit::start(&s, errors, &syncs()).unwrap();
    let mine = second.record(record("mine", &[])).await.unwrap();
    let rows = second.query(Query { limit: 10, ..Query::default() }).await.unwrap().items;
    let by_id = |id: i64| rows.iter().find(|e| e.id == id).unwrap();
    let left = by_id(open);
    assert_eq!(left.outcome.as_deref(), Some("interrupted"), "{left:?}");
    assert!(left.error.as_deref().unwrap_or("").contains("skilld stopped"), "{left:?}");
    assert!(left.finished_at.is_some());
    assert_eq!(by_id(done).outcome.as_deref(), Some("ok"));
    // This skilld's own run in flight stays open until it finishes.
    assert_eq!(by_id(mine).outcome, None);
    second.finish(mine, ok).await.unwrap();
}

#[test]
fn stored_json_is_served_so_that_any_client_can_read_it() {
    use super::sql::stored_json;
    // As written, spelling and order kept.
    let t = r#"{"z": 1.50, "a": 123456789012345678901234567890}"#;
    assert_eq!(stored_json(Some(t.into()), false).get(), t);
    // A cut text is a string even when the cut left valid JSON.
    let cut = stored_json(Some("123456".into()), true);
    assert_eq!(cut.to_value(), serde_json::json!("123456"));
    // A result with the key serde_json reserves: a string, or a client
    // reading the listing as a `Value` would fail on the whole page.
    let reserved = r#"{"$serde_json::private::RawValue":0}"#;
    let served = stored_json(Some(reserved.into()), false);
    assert_eq!(served.to_value(), serde_json::json!(reserved));
    assert!(serde_json::from_str::<serde_json::Value>(served.get()).is_ok());
    assert_eq!(stored_json(None, false).get(), "null");
}

/// A decision's row whose caller is dropped before it has the id (the
/// client went away): completed `cancelled`, whether the thread had not
/// handed the id over yet or had and nobody took it. None stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_whose_caller_went_away_is_completed_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let audit = Audit::start(&settings(dir.path(), 0), errors.clone(), &syncs()).unwrap();
    let safe = |skill: &str| Record { class: "safe".into(), ..record(skill, &[]) };
    for i in 0..40u64 {
        let r = if i % 2 == 0 { record("rm", &[]) } else { safe("df") };
        let asked = audit.record_before_run(r);
        if i % 4 < 2 {
            // Dropped at its first poll unless that answered (a journaled
            // row is answered in place): then held as the handler holds it.
            if let Ok(Ok(id)) = tokio::time::timeout(Duration::ZERO, asked).await {
                drop(RunRow::new(audit.clone(), Some(id)));
            }
        } else {
            // Dropped after the thread may have answered.
            let mut asked = Box::pin(asked);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            if let std::task::Poll::Ready(Ok(id)) =
                std::future::Future::poll(asked.as_mut(), &mut cx)
            {
                // Answered in place (journaled): held as the handler does.
                drop(RunRow::new(audit.clone(), Some(id)));
                continue;
            }
            std::thread::sleep(Duration::from_millis(2));
            drop(asked);
        }
    }
    let rows = audit.query(Query { limit: 100, ..Query::default() }).await.unwrap().items;
    assert_eq!(rows.len(), 40);
    for e in &rows {
        assert_eq!(e.outcome.as_deref(), Some("cancelled"), "{e:?}");
        assert!(e.error.as_deref().is_some_and(|t| t.starts_with("the client went away")));
        assert!(e.finished_at.is_some(), "{e:?}");
    }
    assert_eq!(errors.get(), 0);
}

/// A run cut because skilld stops says so, not that its client left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_by_a_stopping_skilld_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let audit = Audit::start(&settings(dir.path(), 0), errors, &syncs()).unwrap();
    let left = audit.record_before_run(record("rm", &[])).await.unwrap();
    let mut ran = RunRow::new(audit.clone(), Some(left));
    ran.handed_over();
    drop(ran);
    let queued = audit.record_before_run(record("rm", &[])).await.unwrap();
    drop(RunRow::new(audit.clone(), Some(queued)));
    audit.stopping();
    let cut = audit.record_before_run(record("rm", &[])).await.unwrap();
    drop(RunRow::new(audit.clone(), Some(cut)));
    let rows = audit.query(Query { limit: 10, ..Query::default() }).await.unwrap().items;
    let error = |id: i64| rows.iter().find(|e| e.id == id).and_then(|e| e.error.clone());
    assert_eq!(error(left).as_deref(), Some("the client went away before the run ended"));
    assert_eq!(error(queued).as_deref(), Some("the client went away before the run started"));
    assert_eq!(error(cut).as_deref(), Some("ongrid-skilld stopped before the run ended"));
}

/// `audit_max_bytes`: rows with large args stop the database growing past
/// the cap; the newest rows stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rows_stay_under_the_byte_cap() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let capped = AuditSettings { max_bytes: 1 << 20, ..settings(dir.path(), 0) };
    let audit = Audit::start(&capped, errors.clone(), &syncs()).unwrap();
    let big = RawJson::from_value(&json!({"pad": "x".repeat(30_000)}));
    for i in 0..400 {
        let r = Record { args: Some(big.clone()), skill: format!("s{i}"), ..record("rm", &[]) };
        audit.record(finished(r)).await.unwrap();
    }
    drop(audit);
    // 400 rows of 30 KB would be ~12 MB; pruned at open (and every 100).
    let audit = Audit::start(&capped, errors.clone(), &syncs()).unwrap();
    let rows = audit.query(Query { limit: 1000, ..Query::default() }).await.unwrap().items;
    assert!(rows.len() < 40 && rows.len() >= 10, "{} rows kept", rows.len());
    assert_eq!(rows[0].skill, "s399", "the newest row stays");
    drop(audit);
    let db = rusqlite::Connection::open(dir.path().join("audit.db")).unwrap();
    assert!(super::sql::used_bytes(&db).unwrap() <= 1 << 20);
    assert_eq!(errors.get(), 0);
}

/// Under the byte cap refusals go before allowed runs' rows, and a refused
/// request keeps at most 4 KiB of its args (marked truncated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_pruned_first_and_keep_short_args() {
    let dir = tempfile::tempdir().unwrap();
    let errors = IntCounter::new("e", "e").unwrap();
    let capped = AuditSettings { max_bytes: 1 << 20, ..settings(dir.path(), 0) };
    let audit = Audit::start(&capped, errors.clone(), &syncs()).unwrap();
    let big = RawJson::from_value(&json!({"pad": "x".repeat(30_000)}));
    // Ten allowed runs with large args, then a flood of refusals.
    for i in 0..10 {
        let r = Record { args: Some(big.clone()), skill: format!("run{i}"), ..record("rm", &[]) };
        audit.record(r).await.unwrap();
    }
    for i in 0..2000 {
        let r = Record {
            decision: "deny",
            args: Some(big.clone()),
            skill: format!("refused{i}"),
            ..record("rm", &[])
        };
        audit.record(r).await.unwrap();
    }
    drop(audit);
    let audit = Audit::start(&capped, errors.clone(), &syncs()).unwrap();
    let rows = audit.query(Query { limit: 3000, ..Query::default() }).await.unwrap().items;
    let runs = rows.iter().filter(|e| e.decision == "allow").count();
    assert_eq!(runs, 10, "every allowed run's row stays");
    let refused: Vec<_> = rows.iter().filter(|e| e.decision == "deny").collect();
    assert!(refused.len() < 2000, "refusals pruned: {}", refused.len());
    assert_eq!(refused[0].skill, "refused1999", "the newest refusal stays");
    // A cut text comes back as a JSON string of what was kept.
    let kept = |e: &Entry| e.args.to_value().as_str().map(str::len);
    assert!(refused.iter().all(|e| e.args_truncated && kept(e) == Some(REFUSED_ARGS_MAX_BYTES)));
    assert_eq!(errors.get(), 0);
}

/// A database made before `network_denied` existed (schema version 1,
/// kept across an upgrade) gains the column when opened: its rows read
/// back with none, and new rows store the count.
#[tokio::test]
async fn an_earlier_versions_database_gains_the_network_denied_column() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path(), 0);
    {
        let db = rusqlite::Connection::open(&s.db).unwrap();
        db.execute_batch(
            "CREATE TABLE audit (
                id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, skill TEXT NOT NULL,
                class TEXT NOT NULL, caller_uid INTEGER NOT NULL, caller_pid INTEGER,
                role TEXT NOT NULL, mode TEXT NOT NULL, decision TEXT NOT NULL,
                reason TEXT NOT NULL, approvers TEXT NOT NULL, args TEXT,
                args_truncated INTEGER NOT NULL DEFAULT 0, result TEXT,
                result_truncated INTEGER NOT NULL DEFAULT 0, outcome TEXT, error TEXT,
                exit_code INTEGER, started_at INTEGER NOT NULL, finished_at INTEGER,
                duration_ms INTEGER);
             INSERT INTO audit (skill, class, caller_uid, role, mode, decision, reason,
                approvers, outcome, started_at, finished_at)
             VALUES ('old', 'safe', 0, 'root', 'open', 'allow', 'open', '[]', 'ok', 1, 2);
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let errors = IntCounter::new("e", "e").unwrap();
    let audit = Audit::start(&s, errors.clone(), &syncs()).unwrap();
    let id = audit.record(record("new", &[])).await.unwrap();
    let done = Finish { outcome: "ok".into(), network_denied: Some(3), ..Finish::default() };
    audit.finish(id, done).await.unwrap();
    let rows = audit.query(Query { limit: 10, ..Query::default() }).await.unwrap().items;
    let by = |skill: &str| rows.iter().find(|e| e.skill == skill).map(|e| e.network_denied);
    assert_eq!(by("old"), Some(None), "{rows:?}");
    assert_eq!(by("new"), Some(Some(3)), "{rows:?}");
    assert_eq!(errors.get(), 0);
    drop(audit);
    let db = rusqlite::Connection::open(&s.db).unwrap();
    let v: i64 = db.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v, 2);
}
