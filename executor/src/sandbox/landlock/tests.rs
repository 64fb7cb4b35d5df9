use std::sync::Arc;

use policy::Enforcement;

use super::build::missing_rights;
use super::cache::CACHE_SIZE;
use super::paths::{stamp, system_paths, SystemPaths};
use super::*;
use crate::config::LandlockMode;

#[test]
fn rights_per_abi() {
    assert_eq!(fs_handled(0).bits(), 0);
    assert_eq!(fs_handled(1).bits(), 0x1fff);
    assert_eq!(fs_handled(2).bits(), 0x3fff);
    assert_eq!(fs_handled(4).bits(), 0x7fff);
    assert_eq!(fs_handled(7).bits(), 0xffff);
    assert_eq!((net_handled(3).bits(), net_handled(4).bits()), (0, 3));
    assert_eq!((scopes(5).bits(), scopes(6).bits()), (0, 3));
    assert!(missing_rights(7).is_empty());
    assert_eq!(missing_rights(3).len(), 3);
}

#[test]
fn default_box_never_grants_all_of_etc_or_refer() {
    let p = FsPolicy::new(
        Path::new("/skills/x"),
        Path::new("/skills/x/run"),
        Path::new("/run/ongrid/runs/1"),
        &[],
        &[],
        false,
    );
    assert!(p.rules.iter().all(|r| r.path != Path::new("/etc")));
    assert!(p.rules.iter().all(|r| !r.access.contains(AccessFs::Refer)));
    let writable: Vec<_> = p
        .rules
        .iter()
        .filter(|r| r.access.contains(AccessFs::WriteFile))
        .map(|r| &r.path)
        .collect();
    assert_eq!(writable, [Path::new("/dev/null"), Path::new("/run/ongrid/runs/1")]);
    assert!(!ETC_READ.contains(&"/etc/shadow"));
}

/// What `Cache::take` relies on to skip looking rules up: a rule that
/// is not explicit is always a path the system snapshot holds, and an
/// explicit one never is.
#[test]
fn the_rules_that_are_not_explicit_are_the_system_paths() {
    let p = FsPolicy::new(
        Path::new("/opt/skills/s"),
        Path::new("/opt/skills/s/run"),
        Path::new("/run/ongrid/runs/1"),
        &[GrantedPath::granted("/srv/in"), GrantedPath::granted("/etc/hosts")],
        &[GrantedPath::granted("/srv/out")],
        false,
    );
    let system = SystemPaths::current();
    assert!(p.rules.iter().filter(|r| !r.explicit).count() >= system_paths().count());
    for r in &p.rules {
        assert_eq!(!r.explicit, system.get(r).is_some(), "{}", r.path.display());
    }
}

#[test]
fn system_paths_are_opened_once_and_reopened_when_a_parent_changes() {
    let a = SystemPaths::current();
    let b = SystemPaths::current();
    assert!(Arc::ptr_eq(&a, &b), "reopened although nothing changed");
    let rule = |explicit| Rule {
        path: "/usr".into(),
        access: fs::READ_EXEC,
        explicit,
        pinned: false,
        beneath: Vec::new(),
    };
    let usr = rule(false);
    assert!(a.get(&usr).is_some_and(|o| o.is_some_and(|o| o.is_dir)));
    let mine = rule(true);
    assert!(a.get(&mine).is_none(), "explicit paths are opened per run");
    assert!(a.stamps.iter().any(|(d, _, _)| d == Path::new("/etc")));
    // A directory's stamp changes with any entry made or renamed over.
    let dir = tempfile::tempdir().unwrap();
    let before = stamp(dir.path());
    std::thread::sleep(std::time::Duration::from_millis(10));
    std::fs::write(dir.path().join("new"), "x").unwrap();
    std::fs::rename(dir.path().join("new"), dir.path().join("other")).unwrap();
    assert_ne!(before, stamp(dir.path()));
}

/// A watched parent that changes (an entry made or renamed over) makes
/// the snapshot stale, for good; a parent that could not be watched
/// (missing) is compared by its stamp.
#[test]
fn a_changed_parent_makes_the_snapshot_stale() {
    let t = tempfile::tempdir().unwrap();
    let etc = t.path().join("etc");
    std::fs::create_dir(&etc).unwrap();
    std::fs::write(etc.join("cache"), "a").unwrap();
    let later = t.path().join("later");
    let list = [etc.join("cache"), later.join("file")];
    let open = || SystemPaths::open_paths(list.iter().map(PathBuf::as_path));
    let snap = open();
    if snap.watch.lock().unwrap().is_none() {
        println!("SKIP: a_changed_parent_makes_the_snapshot_stale: no inotify here");
        return;
    }
    let watched = |d: &Path| snap.stamps.iter().find(|(p, _, _)| p == d).map(|(_, _, w)| *w);
    assert_eq!((watched(&etc), watched(&later)), (Some(true), Some(false)));
    assert!(snap.fresh() && snap.fresh(), "nothing changed");
    std::fs::write(etc.join("new"), "b").unwrap();
    std::fs::rename(etc.join("new"), etc.join("cache")).unwrap();
    assert!(!snap.fresh(), "a file renamed over a system path");
    assert!(!snap.fresh(), "stale for good once an event was read");
    assert!(snap.watch.lock().unwrap().is_none(), "its watch closed");
    let again = open();
    assert!(again.fresh());
    std::fs::create_dir(&later).unwrap();
    assert!(!again.fresh(), "a missing parent that appears");
}

#[test]
fn best_effort_without_landlock_is_reported() {
    let p = FsPolicy::new(Path::new("/"), Path::new("/"), Path::new("/"), &[], &[], false);
    let out = prepare(0, LandlockMode::BestEffort, &p, None).unwrap();
    assert!(out.fd.is_none());
    assert_eq!(out.report.status, Enforcement::None);
    assert!(!out.degraded.is_empty());
    assert!(matches!(
        prepare(0, LandlockMode::Required, &p, None),
        Err(LandlockError::Unsupported)
    ));
}

/// A ruleset is taken from the cache only for the very inputs it was
/// built from: the same policy with every explicit path still naming
/// the same file. Another file at a path, or another grant, builds anew.
#[test]
fn a_cached_ruleset_serves_only_the_same_inputs() {
    let abi = crate::sys::landlock::abi();
    if abi == 0 {
        println!("SKIP: no Landlock in this kernel");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (skill, home, extra) = (t.path().join("skill"), t.path().join("home"), t.path().join("x"));
    for d in [&skill, &home, &extra] {
        std::fs::create_dir(d).unwrap();
    }
    let entry = skill.join("run");
    std::fs::write(&entry, "#!/bin/sh\n").unwrap();
    let policy = |grants: &[PathBuf]| {
        let grants: Vec<_> = grants.iter().map(GrantedPath::granted).collect();
        FsPolicy::new(&skill, &entry, &home, &grants, &[], false)
    };
    let mut cache = Cache::default();
    // Rulesets taken from the cache so far.
    let taken = std::cell::Cell::new(0u64);
    let run = |p: &FsPolicy, cache: &mut Cache| {
        let out = prepare(abi, LandlockMode::Required, p, Some(cache)).unwrap();
        taken.set(taken.get() + u64::from(out.reused));
        assert!(out.fd.is_some(), "no ruleset");
        assert_eq!(
            out.report.status,
            if abi >= FULL_ABI { Enforcement::Full } else { Enforcement::Partial }
        );
        out
    };
    let first = run(&policy(&[]), &mut cache);
    assert_eq!(taken.get(), 0);
    let second = run(&policy(&[]), &mut cache);
    assert_eq!(taken.get(), 1, "the same inputs: taken from the cache");
    assert_eq!(second.report, first.report);
    // Another grant: built anew (and kept beside the first).
    run(&policy(std::slice::from_ref(&extra)), &mut cache);
    assert_eq!(taken.get(), 1);
    run(&policy(&[]), &mut cache);
    assert_eq!(taken.get(), 2, "the first policy is still kept");
    // The skill folder replaced by another directory at the same path.
    std::fs::rename(&skill, t.path().join("old")).unwrap();
    std::fs::create_dir(&skill).unwrap();
    std::fs::write(&entry, "#!/bin/sh\n").unwrap();
    run(&policy(&[]), &mut cache);
    assert_eq!(taken.get(), 2, "a replaced folder must not hit");
    run(&policy(&[]), &mut cache);
    assert_eq!(taken.get(), 3);
    // A grant whose path is gone and comes back as another directory.
    run(&policy(std::slice::from_ref(&extra)), &mut cache);
    std::fs::remove_dir(&extra).unwrap();
    std::fs::create_dir(&extra).unwrap();
    let hits = taken.get();
    run(&policy(std::slice::from_ref(&extra)), &mut cache);
    assert_eq!(taken.get(), hits, "a recreated grant must not hit");
    assert!(cache.entries.len() <= CACHE_SIZE);
}

/// A path below a grant gets its rule only while it resolves below the
/// grant: a symlink there (an earlier run may make one) leading out of it
/// gets none, and the run's `degraded` lines say why.
#[test]
fn a_path_below_a_grant_that_resolves_outside_it_gets_no_rule() {
    let abi = crate::sys::landlock::abi();
    if abi == 0 {
        println!("SKIP: no Landlock in this kernel");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (skill, home, grant, beyond) =
        (t.path().join("skill"), t.path().join("home"), t.path().join("g"), t.path().join("b"));
    for d in [&skill, &home, &grant, &beyond, &grant.join("sub")] {
        std::fs::create_dir(d).unwrap();
    }
    let entry = skill.join("run");
    std::fs::write(&entry, "#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink(&beyond, grant.join("esc")).unwrap();
    let below = |p: &str| GrantedPath { path: grant.join(p), beneath: vec![grant.clone()] };
    let prepared = |paths: &[GrantedPath]| {
        let p = FsPolicy::new(&skill, &entry, &home, &[], paths, false);
        prepare(abi, LandlockMode::Required, &p, None).unwrap().degraded
    };
    let not_granted = |d: &[String]| d.iter().filter(|l| l.contains("not granted")).count();
    assert_eq!(not_granted(&prepared(&[below("sub")])), 0, "a real directory below the grant");
    let escaped = prepared(&[below("sub"), below("esc")]);
    assert_eq!(not_granted(&escaped), 1, "{escaped:?}");
    let line = escaped.iter().find(|l| l.contains("not granted")).unwrap();
    let real = std::fs::canonicalize(&beyond).unwrap();
    assert!(line.contains(&format!("resolves to {}", real.display())), "{line}");
    // The grant's own path is the operator's: its links are followed.
    let own = GrantedPath::granted(grant.join("esc"));
    assert_eq!(not_granted(&prepared(&[own])), 0);
}
