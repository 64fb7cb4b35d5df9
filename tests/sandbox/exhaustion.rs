//! Resource exhaustion: every bound holds, the run ends
//! with the right outcome and limit, and the host is back to baseline.

use std::time::Duration;

use ongrid_tests::procs::{busy_served_cgroups, cgroup_dirs, count_uid};
use ongrid_tests::{host, Config, SkillDir};
use policy::{LimitKind, Outcome};
use serde_json::json;

use crate::{args, attack, blocked_with, ended_within, exclusive, no_leftovers, shared};

/// After a heavy case: no process of the run-as user, no new cgroup (no
/// busy one of a served executor), and the executor still answers.
fn back_to_baseline(before: &std::collections::BTreeSet<std::path::PathBuf>) {
    let uid = host::skill_user().0;
    assert_eq!(count_uid(uid), 0, "processes of uid {uid} remain");
    let after = cgroup_dirs();
    let leaked: Vec<_> = after.difference(before).collect();
    assert!(leaked.is_empty(), "cgroups leaked: {leaked:?}");
    // A served executor keeps its runs' leaves for later runs: empty ones.
    let busy = busy_served_cgroups();
    assert!(busy.is_empty(), "served executors' cgroups still hold processes: {busy:?}");
    let probe = attack("responsive");
    probe.run(&Config::new(), &args("sleep", json!({"ms": 0}))).expect(Outcome::Ok);
}

/// `fork()` until it fails: the pids bound stops it with EAGAIN.
#[test]
fn fork_bomb_is_stopped_by_the_pids_bound() {
    let Some(g) = exclusive("fork_bomb_is_stopped_by_the_pids_bound") else { return };
    let cgroups = cgroup_dirs();
    let skill = attack("fork_bomb").with("timeout_seconds", json!(5));
    let run =
        skill.run(&Config::new().limit("max_pids", 32), &args("forkbomb", json!({"cap": 2000})));
    let r = blocked_with(&run, &[libc::EAGAIN]);
    assert!(r["forks"].as_u64().unwrap_or(999) < 32, "more forks than max_pids:\n{}", run.dump());
    let cg = &run.report.sandbox.as_ref().expect("sandbox report").cgroup;
    assert!(cg.pids.is_some(), "no pids bound reported:\n{}", run.dump());
    no_leftovers(&skill, &g);
    back_to_baseline(&cgroups);
}

/// The classic shell fork bomb ends with the run and leaves nothing.
#[test]
fn shell_fork_bomb_is_contained() {
    let Some(g) = exclusive("shell_fork_bomb_is_contained") else { return };
    let cgroups = cgroup_dirs();
    let skill = SkillDir::script("shell_fork_bomb", "f() { f | f & }\nf\nsleep 3")
        .with("timeout_seconds", json!(2));
    let run = skill.run(&Config::new().limit("max_pids", 32), &json!({}));
    assert_ne!(run.outcome(), Outcome::Ok, "{}", run.dump());
    let cg = &run.report.sandbox.as_ref().expect("sandbox report").cgroup;
    assert!(cg.pids.is_some(), "no pids bound held the bomb:\n{}", run.dump());
    assert!(run.report.stderr.contains("fork"), "no fork was refused:\n{}", run.dump());
    ended_within(&run, Duration::from_secs(2) + policy::limits::KILL_GRACE);
    no_leftovers(&skill, &g);
    back_to_baseline(&cgroups);
}

/// Detached helpers started one after another, each exiting at once: the
/// executor (their subreaper once their parent is gone) reaps them as they
/// exit, so their zombies never fill the pids bound though far more than
/// it are started in one run.
#[test]
fn exited_orphans_do_not_fill_the_pids_bound() {
    let Some(g) = exclusive("exited_orphans_do_not_fill_the_pids_bound") else { return };
    let cgroups = cgroup_dirs();
    let script = r#"i=0; failed=0
while [ $i -lt 100 ] && [ $failed -lt 50 ]; do
  if ( /bin/true & ) 2>/dev/null; then i=$((i+1)); else failed=$((failed+1)); sleep 0.02; fi
done
echo "{\"started\":$i,\"failed\":$failed}""#;
    let skill = SkillDir::script("orphans", script).with("timeout_seconds", json!(20));
    let run = skill.run(&Config::new().limit("max_pids", 16), &json!({}));
    run.expect(Outcome::Ok);
    let r = run.result();
    assert_eq!(r["started"], 100, "helpers' zombies held the pids bound:\n{}", run.dump());
    no_leftovers(&skill, &g);
    back_to_baseline(&cgroups);
}

/// One process touching memory past the bound is OOM-killed and the
/// report says `limit: memory`.
#[test]
fn memory_hog_is_killed_at_the_memory_bound() {
    let Some(g) = exclusive("memory_hog_is_killed_at_the_memory_bound") else { return };
    let cgroups = cgroup_dirs();
    let skill = attack("memory_hog").with("timeout_seconds", json!(10));
    let config = Config::new().limit("memory_bytes", 64 << 20);
    let run = skill.run(&config, &args("memhog", json!({"cap_mb": 512})));
    assert_ne!(
        run.outcome(),
        Outcome::Ok,
        "hog touched 512 MiB under a 64 MiB bound:\n{}",
        run.dump()
    );
    assert_eq!(run.report.limit, Some(LimitKind::Memory), "{}", run.dump());
    let cg = &run.report.sandbox.as_ref().expect("sandbox report").cgroup;
    assert!(cg.memory.is_some(), "no memory bound reported:\n{}", run.dump());
    no_leftovers(&skill, &g);
    back_to_baseline(&cgroups);
}

/// Memory split across children (each under any per-process
/// limit) still meets the run's total bound.
#[test]
fn memory_split_across_children_meets_the_total_bound() {
    let Some(g) = exclusive("memory_split_across_children_meets_the_total_bound") else { return };
    let cgroups = cgroup_dirs();
    let skill = attack("memory_split").with("timeout_seconds", json!(8));
    let config = Config::new().limit("memory_bytes", 96 << 20);
    let run = skill.run(&config, &args("memsplit", json!({"children": 4, "mb_each": 40})));
    let contained = match run.outcome() {
        Outcome::Ok => run.result()["killed"].as_u64().unwrap_or(0) >= 1,
        _ => run.report.limit == Some(LimitKind::Memory),
    };
    assert!(contained, "160 MiB held across 4 children under a 96 MiB bound:\n{}", run.dump());
    no_leftovers(&skill, &g);
    back_to_baseline(&cgroups);
}

/// A CPU busy loop ends at the CPU limit, reported distinctly from
/// the wall deadline.
#[test]
fn cpu_busy_loop_ends_at_the_cpu_limit() {
    let Some(g) = exclusive("cpu_busy_loop_ends_at_the_cpu_limit") else { return };
    let skill = attack("cpu_spin").with("timeout_seconds", json!(10));
    let run = skill.run(&Config::new().limit("cpu_seconds", 1), &args("cpu_spin", json!({})));
    run.expect(Outcome::Timeout);
    assert_eq!(run.report.limit, Some(LimitKind::CpuTime), "{}", run.dump());
    // One CPU second can take a few wall seconds on a busy host; the wall
    // deadline (10 s) is still well out of reach.
    ended_within(&run, Duration::from_secs(6));
    no_leftovers(&skill, &g);
}

/// An endless stdout flood is killed at the cap (not the deadline),
/// reported `output_limit`, and the executor's memory stays bounded.
#[test]
fn stdout_flood_is_killed_at_the_cap() {
    let Some(g) = exclusive("stdout_flood_is_killed_at_the_cap") else { return };
    let skill = attack("stdout_flood").with("timeout_seconds", json!(10));
    let run =
        skill.run(&Config::new().limit("stdout_bytes", 1 << 20), &args("flood_stdout", json!({})));
    run.expect(Outcome::OutputLimit);
    assert_eq!(run.report.limit, Some(LimitKind::Output), "{}", run.dump());
    assert!(run.report.result.is_none(), "a cut stdout must not be a result:\n{}", run.dump());
    ended_within(&run, Duration::from_secs(3));
    assert!(
        run.executor_peak_kib < 48 << 10,
        "executor peaked at {} KiB draining a flood capped at 1 MiB",
        run.executor_peak_kib
    );
    no_leftovers(&skill, &g);
}

/// The same from Python (`while True: print`); also proves a Python
/// skill starts under the default sandbox.
#[test]
fn python_stdout_flood_is_killed_at_the_cap() {
    let Some(g) = exclusive("python_stdout_flood_is_killed_at_the_cap") else { return };
    let skill = SkillDir::new("python_flood", "run.py").with("timeout_seconds", json!(10));
    skill.write_file("run.py", "#!/usr/bin/python3\nwhile True:\n    print('x' * 4096)\n", 0o755);
    let run = skill.run(&Config::new().limit("stdout_bytes", 1 << 20), &json!({}));
    run.expect(Outcome::OutputLimit);
    ended_within(&run, Duration::from_secs(4));
    no_leftovers(&skill, &g);
}

/// Stderr is kept as a bounded tail with the dropped bytes counted; a
/// flood of it does not fail the run.
#[test]
fn stderr_flood_keeps_a_bounded_tail() {
    let Some(g) = exclusive("stderr_flood_keeps_a_bounded_tail") else { return };
    let skill = attack("stderr_flood").with("timeout_seconds", json!(10));
    let run = skill.run(
        &Config::new().limit("stderr_bytes", 4096),
        &args("flood_stderr", json!({"bytes": 4 << 20, "line": 100})),
    );
    run.expect(Outcome::Ok);
    let r = &run.report;
    assert!(
        r.stderr.len() <= 4096 + 256,
        "stderr tail {} bytes > 4096:\n{}",
        r.stderr.len(),
        run.dump()
    );
    assert!(
        r.stderr.contains("TAIL-MARKER"),
        "the tail (last lines) was not kept:\n{}",
        run.dump()
    );
    assert!(
        r.stderr_truncated_bytes >= (4 << 20) - 8192,
        "dropped bytes not counted:\n{}",
        run.dump()
    );
    no_leftovers(&skill, &g);
}

/// One 1 MiB stderr line cannot blow the stderr bound either.
#[test]
fn stderr_giant_line_is_bounded() {
    let Some(g) = exclusive("stderr_giant_line_is_bounded") else { return };
    let skill = attack("stderr_line");
    let run = skill.run(
        &Config::new().limit("stderr_bytes", 8192).limit("stderr_line_bytes", 1024),
        &args("flood_stderr", json!({"bytes": 1 << 20, "line": 1 << 20})),
    );
    run.expect(Outcome::Ok);
    assert!(
        run.report.stderr.len() <= 8192 + 256,
        "stderr {} bytes:\n{}",
        run.report.stderr.len(),
        run.dump()
    );
    // What the cut left out (the line less its newline and the 1024 bytes
    // kept) is counted like the tail's drops.
    assert!(
        run.report.stderr_truncated_bytes >= (1 << 20) - 1 - 1024,
        "the line's cut bytes were not counted:\n{}",
        run.dump()
    );
    no_leftovers(&skill, &g);
}

/// A write past RLIMIT_FSIZE fails with EFBIG (SIGXFSZ ignored).
#[test]
fn write_past_fsize_fails() {
    let Some(g) = shared("write_past_fsize_fails") else { return };
    let skill = attack("fsize_ignored");
    let run = skill.run(
        &Config::new().limit("fsize_bytes", 1 << 20),
        &args("fsize", json!({"bytes": 8 << 20, "ignore_sigxfsz": true})),
    );
    let r = blocked_with(&run, &[libc::EFBIG]);
    assert_eq!(r["written"], json!(1 << 20), "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// With SIGXFSZ's default action the run is reported as ended by
/// the file-size limit.
#[test]
fn sigxfsz_is_reported_as_file_size_limit() {
    let Some(g) = shared("sigxfsz_is_reported_as_file_size_limit") else { return };
    let skill = attack("fsize_default");
    let run = skill.run(
        &Config::new().limit("fsize_bytes", 1 << 20),
        &args("fsize", json!({"bytes": 8 << 20})),
    );
    run.expect(Outcome::Signaled);
    assert_eq!(run.report.signal, Some(libc::SIGXFSZ), "{}", run.dump());
    assert_eq!(run.report.limit, Some(LimitKind::FileSize), "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// RLIMIT_NOFILE bounds open files (EMFILE).
#[test]
fn open_files_are_bounded() {
    let Some(g) = shared("open_files_are_bounded") else { return };
    let skill = attack("nofile");
    let run =
        skill.run(&Config::new().limit("nofile", 64), &args("nofile", json!({"max": 10_000})));
    let r = blocked_with(&run, &[libc::EMFILE]);
    assert!(r["opened"].as_u64().unwrap_or(999) <= 61, "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// RLIMIT_AS bounds a single mapping (ENOMEM).
#[test]
fn address_space_is_bounded() {
    let Some(g) = shared("address_space_is_bounded") else { return };
    let skill = attack("address_space");
    let run = skill.run(
        &Config::new().limit("address_space_bytes", 1 << 30),
        &args("address_space", json!({"bytes": 2u64 << 30})),
    );
    blocked_with(&run, &[libc::ENOMEM]);
    no_leftovers(&skill, &g);
}

/// The rlimits seen inside are the configured ones (core 0), and the report
/// lists them.
#[test]
fn rlimits_inside_match_the_config() {
    let Some(g) = shared("rlimits_inside_match_the_config") else { return };
    let skill = attack("rlimits");
    let config = Config::new()
        .limit("nofile", 64)
        .limit("fsize_bytes", 1 << 20)
        .limit("address_space_bytes", 1 << 30)
        .limit("cpu_seconds", 3);
    let run = skill.run(&config, &args("probe", json!({})));
    let r = run.result();
    let soft = |k: &str| r["rlimits"][k][0].as_u64();
    let hard = |k: &str| r["rlimits"][k][1].as_u64();
    assert_eq!((soft("core"), hard("core")), (Some(0), Some(0)), "{}", run.dump());
    assert_eq!((soft("nofile"), hard("nofile")), (Some(64), Some(64)), "{}", run.dump());
    assert_eq!(soft("fsize"), Some(1 << 20), "{}", run.dump());
    assert_eq!(soft("as"), Some(1 << 30), "{}", run.dump());
    assert_eq!(soft("cpu"), Some(3), "{}", run.dump());
    let listed = &run.report.sandbox.as_ref().expect("sandbox report").rlimits;
    assert_eq!(listed.get("RLIMIT_CORE"), Some(&0), "report rlimits: {listed:?}");
    assert_eq!(listed.get("RLIMIT_NOFILE"), Some(&64), "report rlimits: {listed:?}");
    no_leftovers(&skill, &g);
}

/// The stdout cap is exact: a result of exactly the cap is kept,
/// one byte more is `output_limit`.
#[test]
fn stdout_cap_is_exact() {
    let Some(g) = shared("stdout_cap_is_exact") else { return };
    let skill = SkillDir::script("stdout_cap", "exec /bin/cat");
    let config = Config::new().limit("stdout_bytes", 65536);
    let fill = |n: usize| json!({"s": "a".repeat(n - r#"{"s":""}"#.len())});
    let exact = fill(65536);
    assert_eq!(exact.to_string().len(), 65536);
    let run = skill.run(&config, &exact);
    assert_eq!(&run.result(), &exact, "a result of exactly stdout_bytes was refused");
    let run = skill.run(&config, &fill(65537));
    run.expect(Outcome::OutputLimit);
    no_leftovers(&skill, &g);
}

/// Many files each under RLIMIT_FSIZE cannot fill the host disk:
/// the run dir's footprint is bounded (a sized per-run tmpfs, a quota, or
/// the memory bound), well below 1 GiB when files are capped at 1 MiB and
/// memory at 64 MiB.
#[test]
fn many_files_cannot_fill_the_disk() {
    let Some(g) = exclusive("many_files_cannot_fill_the_disk") else { return };
    let skill = attack("disk_fill").with("timeout_seconds", json!(20));
    let config = Config::new().limit("fsize_bytes", 1 << 20).limit("memory_bytes", 64 << 20);
    let run = skill.run(&config, &args("disk_fill", json!({"file_mb": 1, "cap_mb": 1024})));
    match run.outcome() {
        // Refused a file or a write before 1 GiB: the folder is full.
        Outcome::Ok => {
            let r = blocked_with(&run, &[libc::ENOSPC, libc::EDQUOT]);
            assert!(r["mib"].as_u64().is_some_and(|m| m < 1024), "{}", run.dump());
        }
        // Or the run's memory bound, which the folder's pages count in.
        _ => assert_eq!(run.report.limit, Some(LimitKind::Memory), "{}", run.dump()),
    }
    no_leftovers(&skill, &g);
}
