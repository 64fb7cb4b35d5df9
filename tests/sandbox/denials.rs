//! The box explains itself: what Landlock, the seccomp filter and the
//! egress allowlist refused a run is listed in that run's report
//! (`sandbox.denials`), in no other run's, bounded under a flood; a run
//! that hit nothing lists nothing; with `report_denials = "off"` the
//! report says they were not watched.
//!
//! The cases ask for `report_denials = "on"`: the executor enables the
//! kernel's audit when it is off and restores it when the last executor
//! relying on it exits. On a kernel without Landlock ABI 7 or audit the
//! report says why, and the cases print `SKIP` after checking that.

use std::net::TcpListener;

use ongrid_tests::{Config, Run, SkillDir};
use policy::{Denial, DenialKind};
use serde_json::json;

use crate::{args, attack, outside, shared};

fn on() -> Config {
    Config::new().setting("report_denials = \"on\"")
}

/// The run's denials, or `None` (after a SKIP line) when the host cannot
/// watch them (the report says why).
fn denials(case: &str, run: &Run) -> Option<Vec<Denial>> {
    let sandbox = run.report.sandbox.as_ref().unwrap_or_else(|| panic!("{}", run.dump()));
    if let Some(why) = &sandbox.denials_off {
        assert!(!why.is_empty(), "{}", run.dump());
        println!("SKIP: {case}: denials are not watched here: {why}");
        return None;
    }
    assert!(sandbox.denials.len() <= policy::MAX_DENIALS, "{}", run.dump());
    let listed: u64 = sandbox.denials.iter().map(|d| d.count).sum();
    assert!(sandbox.denials_total >= listed, "{}", run.dump());
    Some(sandbox.denials.clone())
}

/// The entry of `kind` whose target (path, syscall or destination) is
/// `target`.
fn find<'a>(list: &'a [Denial], kind: DenialKind, target: &str) -> Option<&'a Denial> {
    list.iter().find(|d| {
        d.kind == kind
            && [&d.path, &d.syscall, &d.destination].iter().any(|t| t.as_deref() == Some(target))
    })
}

fn listed<'a>(run: &Run, list: &'a [Denial], kind: DenialKind, target: &str) -> &'a Denial {
    let d = find(list, kind, target)
        .unwrap_or_else(|| panic!("no {kind:?} denial of {target} in {list:?}:\n{}", run.dump()));
    assert!(d.count >= 1, "{d:?}");
    d
}

/// A file outside the box that the file modes let the run's user at, so
/// that Landlock is the wall (a refusal by the modes is the kernel's
/// permission check, not the box's, and is not listed).
fn planted(skill: &SkillDir, suffix: &str) -> (std::path::PathBuf, String) {
    let target = outside(skill, "/tmp", suffix);
    std::fs::write(&target, b"x").expect("plant the file");
    ongrid_tests::skill::set_mode(&target, 0o666);
    let path = target.to_str().expect("utf-8").to_owned();
    (target, path)
}

/// Reading `/etc/shadow` (as a run granted root, whom the file modes let
/// in) and writing outside the run directory are `fs` denials naming the
/// access and the file.
#[test]
fn file_refusals_name_the_access_and_the_file() {
    let case = "file_refusals_name_the_access_and_the_file";
    let Some(g) = shared(case) else { return };
    let root = attack("denials-root").with("sandbox", json!({"run_as": "root"}));
    let config = on().grant(root.name(), "run_as = [\"root\"]");
    let run = root.run(&config, &args("read", json!({"path": "/etc/shadow"})));
    crate::blocked_with(&run, &[libc::EACCES]);
    let Some(list) = denials(case, &run) else { return };
    let d = listed(&run, &list, DenialKind::Fs, "/etc/shadow");
    assert!(d.access.split(',').any(|a| a == "read_file"), "{d:?}");
    crate::no_leftovers(&root, &g);

    // An existing file outside the run directory, writable by its mode.
    let skill = attack("denials-fs");
    let (target, path) = planted(&skill, "denied-write");
    let run = skill.run(&on(), &args("write", json!({"path": path})));
    let list = denials(case, &run).expect("watched");
    let d = listed(&run, &list, DenialKind::Fs, &path);
    assert!(d.access.split(',').any(|a| a == "write_file"), "{d:?}");
    let _ = std::fs::remove_file(&target);
    crate::no_leftovers(&skill, &g);
}

/// Each call the filter refuses is a `syscall` denial with its name.
#[test]
fn syscall_refusals_name_the_call() {
    let case = "syscall_refusals_name_the_call";
    let Some(g) = shared(case) else { return };
    let skill = attack("denials-syscall");
    let attempts = [
        (args("syscall", json!({"name": "unshare_user"})), "unshare"),
        (args("syscall", json!({"name": "mount"})), "mount"),
        (args("syscall", json!({"name": "io_uring_setup"})), "io_uring_setup"),
        (args("ptrace", json!({"pid": 1})), "ptrace"),
        (args("tcp_connect", json!({"addr": "127.0.0.1:9"})), "socket"),
    ];
    for (a, name) in attempts {
        let run = skill.run(&on(), &a);
        crate::blocked(&run);
        let Some(list) = denials(case, &run) else { return };
        let d = listed(&run, &list, DenialKind::Syscall, name);
        assert_eq!(d.access, "errno", "{d:?}");
        assert!(list.iter().all(|d| d.kind == DenialKind::Syscall), "{list:?}");
    }
    crate::no_leftovers(&skill, &g);
}

/// The egress allowlist's refusals are `network` denials.
#[test]
fn egress_refusals_are_network_denials() {
    let case = "egress_refusals_are_network_denials";
    let Some(g) = shared(case) else { return };
    let skill = attack("denials-net").with("sandbox", json!({"network": true}));
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr().expect("addr").to_string();
    let config = on().grant(skill.name(), "network = true");
    let cases = json!([{"kind": "tcp", "addr": addr}]);
    let run = skill.run(&config, &args("egress", json!({"cases": cases})));
    let Some(list) = denials(case, &run) else { return };
    let d = listed(&run, &list, DenialKind::Network, &addr);
    assert_eq!(d.access, "tcp", "{d:?}");
    crate::no_leftovers(&skill, &g);
}

/// A run that hits nothing lists nothing; with `report_denials = "off"`
/// the report says so.
#[test]
fn a_clean_run_lists_nothing_and_off_says_so() {
    let case = "a_clean_run_lists_nothing_and_off_says_so";
    let Some(g) = shared(case) else { return };
    let skill = attack("denials-clean");
    let run = skill.run(&on(), &args("exit", json!({"stdout": "{}", "code": 0})));
    run.expect(policy::Outcome::Ok);
    if let Some(list) = denials(case, &run) {
        assert_eq!(list, [], "{}", run.dump());
        assert_eq!(run.report.sandbox.as_ref().map(|s| s.denials_total), Some(0));
    }
    let off = Config::new().setting("report_denials = \"off\"");
    let run = skill.run(&off, &args("read", json!({"path": "/etc/shadow"})));
    let sandbox = run.report.sandbox.as_ref().expect("sandbox");
    assert_eq!(sandbox.denials_off.as_deref(), Some("report_denials = \"off\""));
    assert_eq!(sandbox.denials, [], "{}", run.dump());
    crate::no_leftovers(&skill, &g);
}

/// Two runs at once: each report lists its own refusal only.
#[test]
fn overlapping_runs_see_their_own_refusals() {
    let case = "overlapping_runs_see_their_own_refusals";
    let Some(g) = shared(case) else { return };
    let a = attack("denials-overlap-a");
    let b = attack("denials-overlap-b");
    let ((fa, pa), (fb, pb)) = (planted(&a, "overlap"), planted(&b, "overlap"));
    let flood = |path: &str| args("open_flood", json!({"path": path, "count": 200}));
    let (ra, rb) = std::thread::scope(|s| {
        let ta = s.spawn(|| a.run(&on(), &flood(&pa)));
        let tb = s.spawn(|| b.run(&on(), &flood(&pb)));
        (ta.join().expect("run a"), tb.join().expect("run b"))
    });
    let _ = (std::fs::remove_file(fa), std::fs::remove_file(fb));
    let (Some(la), Some(lb)) = (denials(case, &ra), denials(case, &rb)) else { return };
    assert_eq!(listed(&ra, &la, DenialKind::Fs, &pa).count, 200, "{la:?}");
    assert_eq!(listed(&rb, &lb, DenialKind::Fs, &pb).count, 200, "{lb:?}");
    assert!(find(&la, DenialKind::Fs, &pb).is_none(), "{la:?}");
    assert!(find(&lb, DenialKind::Fs, &pa).is_none(), "{lb:?}");
    crate::no_leftovers(&a, &g);
    crate::no_leftovers(&b, &g);
}

/// A million refused opens: the report stays bounded (one entry, a
/// total) and the run ends normally. Alone: the kernel's rate limit and
/// backlog are the host's, and a flood takes other runs' records with it
/// (counted lost by the kernel).
#[test]
fn a_flood_of_refusals_stays_bounded() {
    let case = "a_flood_of_refusals_stays_bounded";
    let Some(g) = crate::exclusive(case) else { return };
    let skill: SkillDir = attack("denials-flood").with("timeout_seconds", json!(120));
    let (target, path) = planted(&skill, "flood");
    let a = args("open_flood", json!({"path": path, "count": 1_000_000}));
    let run = skill.run(&on(), &a);
    let _ = std::fs::remove_file(target);
    assert_eq!(run.result()["refused"], json!(1_000_000), "{}", run.dump());
    let Some(list) = denials(case, &run) else { return };
    let d = listed(&run, &list, DenialKind::Fs, &path);
    assert_eq!(list.len(), 1, "{list:?}");
    let total = run.report.sandbox.as_ref().map_or(0, |s| s.denials_total);
    assert_eq!(total, d.count, "{}", run.dump());
    crate::no_leftovers(&skill, &g);
    // The kernel's queue of the flood's records drains before the next
    // cases (theirs would wait behind it past their runs' grace).
    std::thread::sleep(std::time::Duration::from_secs(1));
}
