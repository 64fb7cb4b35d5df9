//! Warm runs (`[skills.NAME] warm = N`), checked from inside the box: a
//! process made before its request and blocked reading its args is boxed
//! exactly as a cold run, sees nothing of the request before its args,
//! serves one request, and keeps a cold run's limits. Warm runs exist only
//! in `serve`, so every case runs served whatever `ONGRID_SANDBOX_VIA`
//! says, and compares with a one-shot run where that applies.
//!
//! A warm run's refusals are watched from its spawn, as a cold run's:
//! the report of the request that takes it lists them.
//!
//! Each case writes its manifest once (a rewritten `skill.json` is another
//! file: its pool would be discarded) and, at its end, removes it and
//! waits until its pool's processes are gone, so no idle warm run of the
//! run-as user outlives the case into another case's leftover checks.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use ongrid_tests::procs::{leftovers, Scope};
use ongrid_tests::run::{run_via, RunOptions};
use ongrid_tests::served::Via;
use ongrid_tests::{Config, Run, SkillDir};
use policy::Outcome;
use serde_json::{json, Value};

use crate::{args, shared, Guard, ATTACK};

/// A skill granted `n` warm runs, its manifest written once.
struct WarmSkill {
    skill: SkillDir,
    config: Config,
}

impl WarmSkill {
    fn new(skill: SkillDir, n: u32, timeout: u64) -> Self {
        let skill = skill.with("timeout_seconds", json!(timeout));
        skill.write_manifest();
        let config = Config::new().grant(skill.name(), &format!("warm = {n}"));
        WarmSkill { skill, config }
    }

    fn attack(case: &str, n: u32, timeout: u64) -> Self {
        Self::new(SkillDir::served_attack(case, Path::new(ATTACK)), n, timeout)
    }

    fn run(&self, via: Via, a: &Value) -> Run {
        let timeout = 10;
        run_via(via, &self.skill.manifest_path(), &self.config, RunOptions::args(a), timeout)
    }

    /// A served run that took a warm run: runs (the first of a skill is a
    /// miss and starts its pool) until one did, for at most 10 s.
    fn warm(&self, a: &Value) -> Run {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let run = self.run(Via::Serve, a);
            if run.report.warm {
                return run;
            }
            assert!(Instant::now() < until, "no warm run within 10 s:\n{}", run.dump());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the pool's processes are all asleep (start-up done,
    /// blocked reading their args), for at most 30 s: idle warm runs start
    /// up at `SCHED_IDLE`, which on a busy host (an emulated guest running
    /// other cases) can take a while.
    fn settled(&self) {
        let asleep = crate::poll(Duration::from_secs(30), || {
            let procs = leftovers(&self.skill, &Scope::default());
            (!procs.is_empty() && procs.iter().all(|p| p.state == 'S')).then_some(())
        });
        assert!(asleep.is_some(), "the pool's processes never finished starting");
    }

    /// The served executor's `ongrid_warm_*` sample `name` for this skill.
    fn metric(&self, name: &str) -> f64 {
        let text = ongrid_tests::served::metrics(&self.config);
        let key = format!("{name}{{skill=\"{}\"}} ", self.skill.name());
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Removes the manifest and waits until the pool's processes are gone
    /// (the pool thread finds the file missing), then checks no process of
    /// the skill is left.
    fn finish(self, guard: &Guard) {
        std::fs::remove_file(self.skill.manifest_path()).expect("remove skill.json");
        let gone = crate::poll(Duration::from_secs(10), || {
            leftovers(&self.skill, &Scope::default()).is_empty().then_some(())
        });
        assert!(gone.is_some(), "the warm pool's processes outlived its manifest");
        crate::no_leftovers(&self.skill, guard);
    }
}

/// What must be the same in a probe of any two runs of one skill: ids,
/// privileges, seccomp, limits, environment, session, scheduling policy
/// and nice value, Landlock (a file in
/// world-writable `/tmp` refused), an empty run directory, the stdio kinds,
/// the cgroup hierarchies and controllers a run joins.
fn boxed(probe: &Value) -> Value {
    let fds: Vec<(String, String)> = probe["fds"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| {
                    let t = v.as_str().unwrap_or("");
                    (k.clone(), t.split(':').next().unwrap_or("").to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let cgroup: Vec<String> = probe["cgroup"]
        .as_str()
        .unwrap_or("")
        .lines()
        .map(|l| l.rsplit_once(':').map_or(l, |(h, _)| h).to_owned())
        .collect();
    json!({
        "ids": [&probe["uid"], &probe["euid"], &probe["gid"], &probe["egid"]],
        "status": &probe["status"],
        "rlimits": &probe["rlimits"],
        "env": &probe["env"],
        "environ": &probe["environ"],
        "own_session": probe["session"] == probe["pid"] && probe["pgrp"] == probe["pid"],
        "tty_nr": &probe["tty_nr"],
        "scheduling": [&probe["policy"], &probe["nice"]],
        "tmp_write": &probe["tmp_write"],
        "cwd_entries": &probe["cwd_entries"],
        "fds": fds,
        "cgroup": cgroup,
    })
}

/// The run's cgroup paths (the last field of each line).
fn cgroup_paths(probe: &Value) -> Vec<String> {
    let text = probe["cgroup"].as_str().unwrap_or("");
    text.lines().filter_map(|l| l.rsplit_once(':').map(|(_, p)| p.to_owned())).collect()
}

/// A warm run is boxed exactly as a cold one, served or one-shot: the same
/// user, privileges, seccomp, Landlock, limits, environment and stdio, a
/// fresh empty run directory and cgroup leaves of the same hierarchies;
/// and its report's sandbox section is a served cold run's.
#[test]
fn a_warm_run_is_boxed_as_a_cold_one() {
    let Some(g) = shared("a_warm_run_is_boxed_as_a_cold_one") else { return };
    let w = WarmSkill::attack("warm_same", 2, 5);
    let probe = args("probe", json!({}));
    let oneshot = w.run(Via::Oneshot, &probe);
    oneshot.expect(Outcome::Ok);
    let cold = w.run(Via::Serve, &probe);
    cold.expect(Outcome::Ok);
    assert!(!cold.report.warm, "the first served run of a skill is cold:\n{}", cold.dump());
    let warm = w.warm(&probe);
    warm.expect(Outcome::Ok);
    let (o, c, h) = (oneshot.result(), cold.result(), warm.result());
    assert_eq!(boxed(&h), boxed(&c), "warm and served cold differ:\n{}", warm.dump());
    assert_eq!(boxed(&h), boxed(&o), "warm and one-shot differ:\n{}", warm.dump());
    assert_eq!(h["tmp_write"], json!(libc::EACCES), "Landlock: {h}");
    assert_eq!(h["cwd_entries"], json!([]), "a fresh run directory: {h}");
    // The reports' sandbox sections are the same, refusals watched alike.
    assert_eq!(warm.raw["sandbox"], cold.raw["sandbox"], "the reports' sandbox sections");
    assert!(warm.report.setup_us < 100_000, "setup_us {} for a warm run", warm.report.setup_us);
    // Its own run directory and leaves, under the same parents.
    assert_ne!(h["cwd"], c["cwd"]);
    let (cold_cg, warm_cg) = (cgroup_paths(&c), cgroup_paths(&h));
    for (a, b) in cold_cg.iter().zip(&warm_cg) {
        assert_eq!(Path::new(a).parent(), Path::new(b).parent(), "{cold_cg:?} {warm_cg:?}");
    }
    w.finish(&g);
}

/// Two runs never share a process, a run directory or a cgroup leaf: each
/// warm run serves one request.
#[test]
fn warm_runs_share_no_process_directory_or_cgroup() {
    let Some(g) = shared("warm_runs_share_no_process_directory_or_cgroup") else { return };
    let w = WarmSkill::attack("warm_distinct", 2, 5);
    let probe = args("probe", json!({}));
    let mut seen = Vec::new();
    for _ in 0..5 {
        let r = w.warm(&probe);
        r.expect(Outcome::Ok);
        seen.push(r.result());
    }
    for (i, a) in seen.iter().enumerate() {
        for b in &seen[i + 1..] {
            assert_ne!(a["pid"], b["pid"], "a process served twice");
            assert_ne!(a["cwd"], b["cwd"], "a run directory served twice");
        }
    }
    // A leaf is recycled only once its run is gone; live processes never
    // share one: the idle warm runs each have their own leaf and directory.
    let idle = crate::poll(Duration::from_secs(10), || {
        let procs = leftovers(&w.skill, &Scope::default());
        (procs.len() >= 2).then_some(procs)
    })
    .expect("two idle warm runs");
    let of = |pid: i32, what: &str| {
        let p = format!("/proc/{pid}/{what}");
        std::fs::read_to_string(&p)
            .ok()
            .or_else(|| std::fs::read_link(&p).ok().map(|l| l.display().to_string()))
            .unwrap_or_default()
    };
    let cgroups: std::collections::BTreeSet<String> =
        idle.iter().map(|p| of(p.pid, "cgroup")).collect();
    let dirs: std::collections::BTreeSet<String> = idle.iter().map(|p| of(p.pid, "cwd")).collect();
    assert_eq!(cgroups.len(), idle.len(), "idle warm runs share a cgroup: {cgroups:?}");
    assert_eq!(dirs.len(), idle.len(), "idle warm runs share a directory: {dirs:?}");
    for seen in &seen {
        assert!(!dirs.contains(seen["cwd"].as_str().unwrap_or("")), "a directory reused");
    }
    w.finish(&g);
}

/// A warm process that reads the clock, its pid and `/proc` before its
/// args sees nothing of the request: what it saw then (taken before a
/// request existed) holds no byte of the request and is what it sees
/// after the args, and its environment is a cold run's.
#[test]
fn a_warm_run_sees_nothing_of_its_request_before_its_args() {
    let Some(g) = shared("a_warm_run_sees_nothing_of_its_request_before_its_args") else {
        return;
    };
    let w = WarmSkill::attack("warm_early", 2, 5);
    let cold = w.run(Via::Oneshot, &args("early", json!({})));
    cold.expect(Outcome::Ok);
    // Made before this request: give the pool time to be full and idle.
    w.warm(&args("early", json!({})));
    std::thread::sleep(Duration::from_millis(300));
    let token = format!("ongrid-request-token-{}", std::process::id());
    let sent_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
    let run = w.warm(&args("early", json!({ "token": token })));
    run.expect(Outcome::Ok);
    let r = run.result();
    let (early, late) = (&r["early"], &r["late"]);
    assert!(
        early["time_ms"].as_u64().is_some_and(|t| t <= sent_ms),
        "not made before the request (sent at {sent_ms}): {r}"
    );
    assert!(!early.to_string().contains(&token), "the request was visible before its args: {r}");
    for key in ["pid", "cmdline", "environ", "cwd_entries", "cgroup"] {
        assert_eq!(early[key], late[key], "{key} changed with the args: {r}");
    }
    let c = cold.result();
    assert_eq!(early["environ"], c["early"]["environ"], "warm and one-shot environments");
    assert_eq!(early["cmdline"].as_str().map(|s| s.split('\0').count()), Some(2), "{r}");
    w.finish(&g);
}

/// Replacing the entry file discards the skill's warm runs: the next run
/// runs the new file, and the pool is made again from it.
#[test]
fn replacing_the_entry_discards_the_warm_pool() {
    let Some(g) = shared("replacing_the_entry_discards_the_warm_pool") else { return };
    let script = |v: u32| format!("#!/bin/sh\ncat >/dev/null\necho '{{\"v\":{v}}}'\n");
    let skill = SkillDir::served_script("warm_swap", "true");
    skill.write_file("run.sh", &script(1), 0o755);
    let w = WarmSkill::new(skill, 2, 5);
    let r = w.warm(&json!({}));
    assert_eq!(r.result(), json!({"v": 1}));
    // A new file renamed over the entry, as a package upgrade does.
    let new = w.skill.write_file("run.sh.new", &script(2), 0o755);
    std::fs::rename(&new, w.skill.path().join("run.sh")).expect("rename over the entry");
    let r = w.run(Via::Serve, &json!({}));
    assert_eq!(r.result(), json!({"v": 2}), "an old warm run served:\n{}", r.dump());
    let r = w.warm(&json!({}));
    assert_eq!(r.result(), json!({"v": 2}), "{}", r.dump());
    assert!(w.metric("ongrid_warm_discarded_total") >= 1.0, "the old pool was discarded");
    w.finish(&g);
}

/// A warm run waits at `SCHED_IDLE` (its start-up takes no CPU time a
/// request wants), and once taken every process of it, one it started
/// before its args included, runs at the default policy, as a cold run's.
#[test]
fn a_taken_warm_run_is_scheduled_as_a_cold_one() {
    let Some(g) = shared("a_taken_warm_run_is_scheduled_as_a_cold_one") else { return };
    // Each process's [nice, policy]: stat's fields 19 and 41 (policy 0 is
    // SCHED_OTHER, 5 SCHED_IDLE).
    let body = "sleep 30 &\nbg=$!\ncat >/dev/null\n\
        sched() { cut -d' ' -f41,19 /proc/$1/stat | tr ' ' ,; }\n\
        printf '{\"own\":[%s],\"bg\":[%s]}' \"$(sched $$)\" \"$(sched $bg)\"\n\
        kill $bg";
    let w = WarmSkill::new(SkillDir::served_script("warm_sched", body), 2, 5);
    let cold = w.run(Via::Serve, &json!({}));
    assert_eq!(cold.result(), json!({"own": [0, 0], "bg": [0, 0]}), "{}", cold.dump());
    // The pool's idle scripts (both warm runs) wait at SCHED_IDLE.
    let idle = crate::poll(Duration::from_secs(10), || {
        let procs = leftovers(&w.skill, &Scope::default());
        let policies: Vec<String> = procs
            .iter()
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{}/stat", p.pid)).ok())
            .filter_map(|s| Some(s.rsplit_once(") ")?.1.split(' ').nth(38)?.to_owned()))
            .collect();
        (policies.len() >= 2 && policies.iter().all(|p| p == "5")).then_some(policies)
    });
    assert!(idle.is_some(), "the pool's idle processes are not at SCHED_IDLE");
    let warm = w.warm(&json!({}));
    assert_eq!(warm.result(), json!({"own": [0, 0], "bg": [0, 0]}), "{}", warm.dump());
    w.finish(&g);
}

/// A warm run's timeout and output limit hold as a cold run's, counted
/// from its request (not from when it was made).
#[test]
fn warm_runs_keep_their_timeout_and_output_limit() {
    let Some(g) = shared("warm_runs_keep_their_timeout_and_output_limit") else { return };
    let w = WarmSkill::attack("warm_limits", 2, 1);
    // Made more than the timeout ago, and still runs to its end. Each run
    // takes a warm run whose start-up is done, so the 1 s timeout is the
    // attempt's alone even in an emulated guest.
    w.warm(&args("probe", json!({})));
    w.settled();
    std::thread::sleep(Duration::from_millis(1200));
    let r = w.warm(&args("probe", json!({})));
    r.expect(Outcome::Ok);
    w.settled();
    let r = w.warm(&args("flood_stdout", json!({})));
    r.expect(Outcome::OutputLimit);
    w.settled();
    let r = w.warm(&args("sleep_forever", json!({})));
    r.expect(Outcome::Timeout);
    crate::ended_within(&r, Duration::from_secs(1) + policy::limits::KILL_GRACE);
    w.finish(&g);
}

/// A warm process that dies before it is taken is never handed a request:
/// every run of a skill that crashes before reading its args is cold, and
/// the executor counts the discarded ones.
#[test]
fn a_crashed_warm_process_is_never_used() {
    let Some(g) = shared("a_crashed_warm_process_is_never_used") else { return };
    let skill = SkillDir::served_script("warm_crash", "kill -SEGV $$");
    let w = WarmSkill::new(skill, 2, 5);
    // The first run is a miss and starts the pool, whose runs crash.
    let r = w.run(Via::Serve, &json!({}));
    assert!(!r.report.warm, "{}", r.dump());
    // Every warm run made so far has crashed (none is idle): the pool
    // rests for seconds after a crash.
    let discarded = crate::poll(Duration::from_secs(5), || {
        let n = w.metric("ongrid_warm_discarded_total");
        (n >= 1.0 && w.metric("ongrid_warm_idle") == 0.0).then_some(n)
    });
    assert!(discarded.is_some(), "no warm run discarded");
    // A run taken before its crash would be used (and crash as a cold run
    // does); the pool resting, the runs now find no warm run.
    for _ in 0..2 {
        let r = w.run(Via::Serve, &json!({}));
        assert!(!r.report.warm, "a crashed warm process served:\n{}", r.dump());
        assert_eq!(r.outcome(), Outcome::Signaled, "{}", r.dump());
    }
    assert_eq!(w.metric("ongrid_warm_hits_total"), 0.0);
    w.finish(&g);
}

/// A warm run's refusals are watched as a cold run's, from its spawn: the
/// report of the request that took it lists the call the filter refused,
/// as a cold run's does (on a host that cannot watch refusals, both say
/// why, and the case prints SKIP).
#[test]
fn a_warm_runs_refusals_are_in_its_report() {
    let case = "a_warm_runs_refusals_are_in_its_report";
    let Some(g) = shared(case) else { return };
    let mut w = WarmSkill::attack("warm_denials", 2, 5);
    w.config = w.config.setting("report_denials = \"on\"");
    let mount = args("syscall", json!({"name": "mount"}));
    let cold = w.run(Via::Serve, &mount);
    crate::blocked(&cold);
    let warm = w.warm(&mount);
    crate::blocked(&warm);
    let (c, h) = (&cold.raw["sandbox"], &warm.raw["sandbox"]);
    assert_eq!(h["denials_off"], c["denials_off"], "{}", warm.dump());
    if let Some(why) = c["denials_off"].as_str() {
        println!("SKIP: {case}: denials are not watched here: {why}");
        w.finish(&g);
        return;
    }
    let refused = |sandbox: &Value| {
        let list = sandbox["denials"].as_array().cloned().unwrap_or_default();
        list.into_iter().find(|d| d["kind"] == "syscall" && d["syscall"] == "mount")
    };
    let listed = refused(h).unwrap_or_else(|| panic!("mount not listed:\n{}", warm.dump()));
    assert_eq!(Some(listed), refused(c), "warm and cold list it alike");
    assert_eq!(h["denials"], c["denials"], "{}\n{}", warm.dump(), cold.dump());
    w.finish(&g);
}
