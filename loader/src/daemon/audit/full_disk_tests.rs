//! The audit on a failing disk: on a file system that fills up, a run
//! whose decision row cannot be committed never starts, and the approvals
//! it named stay unused (needs root: a tmpfs is mounted; prints a SKIP
//! line otherwise); a run whose decision row was committed but whose
//! `fsync` failed is not answered as audited.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use prometheus::IntCounter;

use super::tests::{ok, record, settings, syncs};
use super::*;
use crate::daemon::config::{AuditSettings, AuditSync};

/// A tmpfs of `size` mounted on a temporary directory, unmounted
/// (lazily) when dropped.
struct Tmpfs(PathBuf, tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "ongrid-audit-test"])
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success(), "mount a tmpfs on {}", path.display());
        Tmpfs(path, dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = &self.1;
    }
}

/// Fills the file system holding `dir`; returns the file that does.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("fill");
    let mut file = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; 4096];
    while file.write_all(&block).is_ok() {}
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_decision_row_cannot_be_committed_never_starts() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIP a_run_whose_decision_row_cannot_be_committed_never_starts: needs root (mount)"
        );
        return;
    }
    let expires = u64::try_from(now_ms() / 1000).unwrap() + 600;
    for mode in [AuditSync::Interval, AuditSync::Full] {
        let fs = Tmpfs::mount("1m");
        let s = AuditSettings { synchronous: mode, ..settings(&fs.0, 0) };
        let errors = IntCounter::new("e", "e").unwrap();
        let audit = Audit::start(&s, errors.clone(), &syncs()).unwrap();
        let id = audit.record_before_run(record("before", &[("k:d", expires)])).await.unwrap();
        RunRow::new(audit.clone(), Some(id)).finish(ok()).await.unwrap();
        let full = fill(&fs.0);
        // SQLite's insert fits in its page cache; the commit does not.
        for i in 0..5 {
            let key = format!("k{i}:d{i}");
            let r = audit.record_before_run(record(&format!("full{i}"), &[(&key, expires)])).await;
            assert!(r.is_err(), "{mode:?}: run {i} would start with its row uncommitted: {r:?}");
        }
        assert!(errors.get() >= 5, "{mode:?}: {} errors counted", errors.get());
        std::fs::remove_file(&full).unwrap();
        let rows = audit.query(Query { limit: 100, ..Query::default() }).await.unwrap().items;
        let skills: Vec<&str> = rows.iter().map(|e| e.skill.as_str()).collect();
        assert_eq!(skills, ["before"], "{mode:?}");
        // Nothing ran: the refused runs' approvals stay usable.
        let used = audit.used_approvals().await.unwrap();
        assert_eq!(used.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["k:d"], "{mode:?}");
        let again = audit.record_before_run(record("after", &[("k0:d0", expires)])).await.unwrap();
        RunRow::new(audit.clone(), Some(again)).finish(ok()).await.unwrap();
        drop(audit);
    }
}

/// `full`: the decision row is committed and the run starts; the `fsync`
/// after it fails (here: the journal's path is a symlink loop, which the
/// sync opens first); the run's completion then fails even once the
/// syncs work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_decision_row_could_not_be_synced_is_not_answered_as_audited() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path(), 0);
    let errors = IntCounter::new("e", "e").unwrap();
    let audit = Audit::start(&s, errors.clone(), &syncs()).unwrap();
    let mutating = |skill: &str| Record {
        class: "mutating".into(),
        mode: "mutating-with-confirm".into(),
        reason: "confirmed".into(),
        ..record(skill, &[])
    };
    let id = audit.record_before_run(mutating("before")).await.unwrap();
    RunRow::new(audit.clone(), Some(id)).finish(ok()).await.unwrap();
    let rows = dir.path().join("audit.db-rows");
    std::os::unix::fs::symlink(&rows, &rows).unwrap();
    let started = audit.record_before_run(mutating("unsynced")).await;
    // The answer comes before the fsync: wait for its failure (counted).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while errors.get() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(errors.get(), 1, "the fsync did not fail");
    std::fs::remove_file(&rows).unwrap();
    let id = started.expect("committed: the run starts before the fsync");
    let r = RunRow::new(audit.clone(), Some(id)).finish(ok()).await;
    let e = r.expect_err("answered as audited though its decision's fsync failed");
    assert!(e.to_string().contains("may not be on disk"), "{e}");
    // The next run is audited as usual.
    let id = audit.record_before_run(mutating("after")).await.unwrap();
    RunRow::new(audit.clone(), Some(id)).finish(ok()).await.unwrap();
}
