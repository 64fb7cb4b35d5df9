use super::*;

fn state_with_run(leaf: &str) -> (State, u64) {
    let mut st = State::default();
    st.runs.insert(1, Run { leaves: vec![PathBuf::from(leaf)], ..Run::default() });
    (st, 1)
}

fn access(serial: u64, domain: u64, path: &str) -> record::Parsed {
    record::Parsed {
        serial,
        record: Record::Access {
            domain,
            blockers: "fs.read_file".into(),
            path: Some(path.into()),
            destination: None,
        },
    }
}

#[test]
fn a_domain_is_its_makers_run_and_counts_are_bounded() {
    let (mut st, key) = state_with_run("/sys/fs/cgroup/none");
    st.pids.insert(42, key);
    st.runs.get_mut(&key).unwrap().pids.push(42);
    let late = AtomicU64::new(0);
    // The first refusal of a domain comes before the record naming its maker.
    st.take(access(7, 0xd, "/etc/shadow"), &late);
    st.take(record::Parsed { serial: 7, record: Record::Domain { domain: 0xd, pid: 42 } }, &late);
    st.take(access(8, 0xd, "/etc/shadow"), &late);
    for i in 0..100u64 {
        st.take(access(9 + i, 0xd, &format!("/f{i}")), &late);
    }
    let run = st.remove(key);
    assert_eq!(run.total, 102);
    assert_eq!(run.listed.len(), MAX_DENIALS);
    assert_eq!(run.listed[0].path.as_deref(), Some("/etc/shadow"));
    assert_eq!(run.listed[0].count, 2);
    assert_eq!(run.listed[0].access, "read_file");
    // After the report: late, counted, not kept.
    st.take(access(200, 0xd, "/etc/shadow"), &late);
    assert_eq!(late.load(Ordering::Relaxed), 1);
    assert!(st.pids.is_empty() && st.domains.is_empty());
}

#[test]
fn records_of_other_processes_are_dropped() {
    let (mut st, key) = state_with_run("/sys/fs/cgroup/ongrid/ex-x/none-such-leaf");
    let late = AtomicU64::new(0);
    let me = i32::try_from(std::process::id()).unwrap();
    let rec =
        Record::Seccomp { pid: me, syscall: libc::SYS_unshare, native: true, action: "errno" };
    st.take(record::Parsed { serial: 1, record: rec }, &late);
    st.take(access(2, 0xe, "/etc/shadow"), &late);
    st.take(record::Parsed { serial: 2, record: Record::Syscall { pid: me } }, &late);
    assert!(st.strangers.contains(&me));
    // Held in case the pid turns out to be a run's, until far behind.
    assert_eq!(st.pending.len(), 2);
    st.take(
        record::Parsed { serial: 2 + PENDING_SERIALS + 1, record: Record::Syscall { pid: me } },
        &late,
    );
    let run = st.remove(key);
    assert_eq!((run.total, late.load(Ordering::Relaxed)), (0, 0));
    assert!(st.pending.is_empty(), "a held record far behind is dropped");
}

#[test]
fn a_pid_in_the_runs_leaf_is_the_runs() {
    // This test's own cgroup stands for a run's leaf.
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let Some(path) = text.lines().filter_map(|l| l.splitn(3, ':').nth(2)).find(|p| *p != "/")
    else {
        // At the root of every hierarchy: nothing to tell it by.
        assert!(text.lines().all(|l| l.ends_with(":/")), "{text}");
        println!("SKIP: a_pid_in_the_runs_leaf_is_the_runs: this process is in no leaf");
        return;
    };
    let (mut st, key) = state_with_run(&format!("/sys/fs/cgroup{path}"));
    let late = AtomicU64::new(0);
    let me = i32::try_from(std::process::id()).unwrap();
    let rec = Record::Seccomp {
        pid: me,
        syscall: libc::SYS_io_uring_setup,
        native: true,
        action: "errno",
    };
    st.take(record::Parsed { serial: 1, record: rec }, &late);
    let run = st.remove(key);
    assert_eq!(run.total, 1);
    assert_eq!(run.listed[0].syscall.as_deref(), Some("io_uring_setup"));
    assert_eq!(run.listed[0].kind, DenialKind::Syscall);
}

#[test]
fn landlock_blockers_map_to_kinds() {
    let net = Record::Access {
        domain: 1,
        blockers: "net.connect_tcp".into(),
        path: None,
        destination: Some("127.0.0.1:80".into()),
    };
    let d = access_denial(&net);
    assert_eq!((d.kind, d.access.as_str()), (DenialKind::Network, "connect_tcp"));
    let fs = Record::Access {
        domain: 1,
        blockers: "fs.write_file,fs.truncate".into(),
        path: Some("/etc/x".into()),
        destination: None,
    };
    assert_eq!(access_denial(&fs).access, "write_file,truncate");
}

#[test]
fn off_says_why() {
    let d = Denials::start(ReportDenials::Off, 7);
    assert_eq!(d.off(), Some("report_denials = \"off\""));
    assert!(d.watch(Vec::new()).is_none());
    let old = Denials::start(ReportDenials::On, 6);
    assert!(old.off().is_some_and(|w| w.contains("ABI 6")), "{:?}", old.off());
}

#[test]
fn kauditd_is_idle_when_it_sleeps() {
    let dir = tempfile::tempdir().unwrap();
    let stat = dir.path().join("stat");
    std::fs::write(&stat, "45 (kauditd) S 2 0 0 0 -1").unwrap();
    assert!(kauditd_idle(Some(&stat)));
    std::fs::write(&stat, "45 (kau) dit) R 2 0 0 0 -1").unwrap();
    assert!(!kauditd_idle(Some(&stat)));
    assert!(!kauditd_idle(None), "unknown: the grace applies");
    assert!(find_kauditd().is_none_or(|p| p.ends_with("stat")));
}

#[test]
fn a_record_before_its_pid_is_known_is_held_for_it() {
    let (mut st, key) = state_with_run("/sys/fs/cgroup/none-such-leaf");
    let late = AtomicU64::new(0);
    // A pid no process has now: its records came before the run's thread
    // registered it, and it has exited.
    let gone = i32::MAX - 7;
    let rec =
        Record::Seccomp { pid: gone, syscall: libc::SYS_mount, native: true, action: "errno" };
    st.take(record::Parsed { serial: 1, record: rec }, &late);
    st.take(access(2, 0xf, "/etc/shadow"), &late);
    st.take(record::Parsed { serial: 2, record: Record::Domain { domain: 0xf, pid: gone } }, &late);
    assert_eq!(st.pending.len(), 3);
    st.pids.insert(gone, key);
    st.runs.get_mut(&key).unwrap().pids.push(gone);
    st.claim(gone, key, &late);
    let run = st.remove(key);
    assert_eq!(run.total, 2, "{:?}", run.listed);
    assert_eq!(run.listed[0].syscall.as_deref(), Some("mount"));
    assert_eq!(run.listed[1].path.as_deref(), Some("/etc/shadow"));
    assert!(st.pending.is_empty());
}

/// A short run's flood, read after its process is gone: the domain's
/// record and its 201 refusals are held for its pid (the repeats counted
/// together) next to another run's flood; once the pid is registered every
/// refusal is the run's. Past `PENDING` held records, the domain's record
/// is the last to go.
#[test]
fn a_gone_runs_flood_is_held_whole_for_its_pid() {
    let (mut st, key) = state_with_run("/sys/fs/cgroup/none-such-leaf");
    let late = AtomicU64::new(0);
    let gone = i32::MAX - 9;
    let domain = Record::Domain { domain: 0xb, pid: gone };
    st.take(access(1, 0xb, "/tmp/b"), &late);
    st.take(record::Parsed { serial: 1, record: domain.clone() }, &late);
    for i in 0..200u64 {
        st.take(access(2 + 2 * i, 0xb, "/tmp/b"), &late);
        st.take(access(3 + 2 * i, 0xa, "/tmp/a"), &late);
    }
    assert_eq!(st.pending.len(), 3, "the floods are held as counts");
    st.pids.insert(gone, key);
    st.runs.get_mut(&key).unwrap().pids.push(gone);
    st.claim(gone, key, &late);
    let run = st.remove(key);
    assert_eq!(run.total, 201, "{:?}", run.listed);
    assert_eq!(run.listed.len(), 1, "{:?}", run.listed);
    assert_eq!((run.listed[0].path.as_deref(), run.listed[0].count), (Some("/tmp/b"), 201));

    // Other processes' records, distinct, more than are held.
    st.take(record::Parsed { serial: 1000, record: domain.clone() }, &late);
    for i in 0..(PENDING as u64 + 10) {
        st.take(access(1001 + i, 0x100 + i, "/x"), &late);
    }
    assert_eq!(st.pending.len(), PENDING);
    assert!(st.pending.iter().any(|h| h.record == domain), "the domain's record went");
}
