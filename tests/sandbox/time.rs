//! Deadlines and process trees: every run ends by its deadline
//! plus the kill grace, and takes its whole tree with it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ongrid_tests::procs::{cgroup_dirs, leftovers};
use ongrid_tests::run::executor_bin;
use ongrid_tests::{Config, SkillDir};
use policy::limits::KILL_GRACE;
use policy::{LimitKind, Outcome};
use serde_json::json;

use crate::{args, attack, ended_within, exclusive, no_leftovers};

/// Entries of the executor's per-run directory root.
fn run_dirs() -> std::collections::BTreeSet<std::path::PathBuf> {
    std::fs::read_dir("/run/ongrid/runs")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

const DEADLINE: Duration = Duration::from_secs(1);

fn timed_out(case: &str, skill: &SkillDir) {
    let Some(g) = exclusive(case) else { return };
    let run = skill.run(&Config::new(), &json!({"case": case}));
    run.expect(Outcome::Timeout);
    assert_eq!(run.report.limit, Some(LimitKind::WallTime), "{}", run.dump());
    assert!(
        run.elapsed >= DEADLINE - Duration::from_millis(100),
        "ended before the deadline:\n{}",
        run.dump()
    );
    ended_within(&run, DEADLINE + KILL_GRACE);
    no_leftovers(skill, &g);
}

fn timed_out_attack(case: &str) {
    if ongrid_tests::host::is_root() {
        timed_out(case, &attack(case).with("timeout_seconds", json!(1)));
    } else {
        ongrid_tests::host::skip(case, "needs root");
    }
}

/// Sleeping forever uses no CPU; the wall deadline ends it.
#[test]
fn sleep_forever_hits_the_wall_deadline() {
    timed_out_attack("sleep_forever");
}

/// A SIGTERM ignorer is SIGKILLed after the grace.
#[test]
fn sigterm_ignorer_is_killed_after_the_grace() {
    timed_out_attack("ignore_term");
}

/// The same from a shell trap, with children inheriting the ignore.
#[test]
fn shell_sigterm_trap_is_killed_after_the_grace() {
    if !ongrid_tests::host::is_root() {
        return ongrid_tests::host::skip("shell_sigterm_trap", "needs root");
    }
    let skill = SkillDir::script("shell_trap", "trap '' TERM\nwhile :; do /bin/sleep 1; done")
        .with("timeout_seconds", json!(1));
    timed_out("shell_sigterm_trap", &skill);
}

/// A self-stopped process (SIGTERM stays pending) is still killed.
#[test]
fn stopped_process_is_killed() {
    timed_out_attack("sigstop");
}

/// A stopped child of a SIGTERM-ignoring parent is still killed.
#[test]
fn stopped_child_is_killed() {
    timed_out_attack("stopped_tree");
}

fn ends_at_main_exit(case: &str) {
    let Some(g) = exclusive(case) else { return };
    let skill = attack(case).with("timeout_seconds", json!(5));
    let run = skill.run(&Config::new(), &args(case, json!({})));
    run.expect(Outcome::Ok);
    assert_eq!(run.result()["attempt"], json!(case), "{}", run.dump());
    ended_within(&run, Duration::from_secs(2));
    no_leftovers(&skill, &g);
}

/// A background child does not outlive the main process.
#[test]
fn background_child_dies_with_the_run() {
    ends_at_main_exit("bg_child");
}

/// Setsid plus double fork escapes process groups, not the run.
#[test]
fn setsid_double_fork_daemon_dies_with_the_run() {
    ends_at_main_exit("daemon");
}

/// A daemonised grandchild holding stdout and stderr open does not
/// hold the run past main's exit: the run ends with main (the executor
/// watches for main's exit even while the pipes stay open), well before
/// its deadline.
#[test]
fn grandchild_holding_stdout_does_not_hold_the_run() {
    let Some(g) = exclusive("grandchild_holding_stdout") else { return };
    let skill = attack("hold_stdout").with("timeout_seconds", json!(3));
    let run = skill.run(&Config::new(), &args("hold_stdout", json!({})));
    run.expect(Outcome::Ok);
    ended_within(&run, Duration::from_secs(1));
    no_leftovers(&skill, &g);
}

/// The same with the grandchild stopped (SIGTERM cannot reach it).
#[test]
fn stopped_grandchild_holding_stdout_does_not_hold_the_run() {
    let Some(g) = exclusive("stopped_grandchild_holding_stdout") else { return };
    let skill = attack("hold_stdout_stopped").with("timeout_seconds", json!(3));
    let run = skill.run(&Config::new(), &args("hold_stdout_stopped", json!({})));
    run.expect(Outcome::Ok);
    ended_within(&run, Duration::from_secs(1));
    no_leftovers(&skill, &g);
}

/// Both pipes at end of file before the exit: the executor waits for the
/// exit (300 ms later) and reports its real status, not one made up when
/// the pipes closed.
#[test]
fn an_exit_after_the_pipes_closed_is_waited_for() {
    let Some(g) = exclusive("exit_after_closed_stdio") else { return };
    let skill = attack("close_stdio_exit").with("timeout_seconds", json!(5));
    let run = skill.run(&Config::new(), &args("close_stdio_exit", json!({})));
    assert_eq!(run.report.exit_code, Some(7), "{}", run.dump());
    assert_ne!(run.outcome(), Outcome::Timeout, "{}", run.dump());
    assert!(run.elapsed >= Duration::from_millis(300), "{}", run.dump());
    ended_within(&run, Duration::from_secs(2));
    no_leftovers(&skill, &g);
}

/// Closing stdout and stderr (EOF on both pipes) does not end
/// supervision: the deadline still fires.
#[test]
fn closed_stdio_does_not_end_supervision() {
    timed_out_attack("close_stdio_sleep");
}

/// SIGKILL of the executor mid-run takes the skill with it.
#[test]
fn executor_killed_mid_run_takes_the_skill_with_it() {
    let Some(g) = exclusive("executor_killed_mid_run") else { return };
    let cgroups = cgroup_dirs();
    let dirs_before = run_dirs();
    let skill = attack("executor_killed").with("timeout_seconds", json!(30));
    skill.write_manifest();
    let cfg = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(cfg.path(), Config::new().to_toml()).expect("write config");
    let mut child = Command::new(executor_bin())
        .args(["run", "--json", "--manifest"])
        .arg(skill.manifest_path())
        .args(["--args", r#"{"case":"stopped_tree"}"#, "--config"])
        .arg(cfg.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn executor");
    // Wait until the skill's main process and its stopped child both run.
    let started = Instant::now();
    let running = || leftovers(&skill, &Default::default()).len();
    while running() < 2 && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(running() >= 2, "the skill's tree never started");
    child.kill().expect("SIGKILL executor");
    child.wait().expect("reap executor");
    // The watchdog kills the tree (no grace): gone within 10 s however
    // loaded the host (a survivor never goes).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !leftovers(&skill, &g.scope()).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut failures = Vec::new();
    let survivors = leftovers(&skill, &g.scope());
    if !survivors.is_empty() {
        failures.push(format!("processes of the run survived the executor: {survivors:#?}"));
        for p in &survivors {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid),
                nix::sys::signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // The dead executor's cgroups are swept by the next executor at the latest.
    attack("after_kill").run(&Config::new(), &args("sleep", json!({"ms": 0}))).expect(Outcome::Ok);
    let mut leaked: Vec<_> = cgroup_dirs().difference(&cgroups).cloned().collect();
    if !leaked.is_empty() {
        failures.push(format!("the killed run's cgroups remain after the next run: {leaked:?}"));
        // Deepest first, so the host is left clean for the next case.
        leaked.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for dir in leaked {
            let _ = std::fs::remove_dir(dir);
        }
    }
    let stale: Vec<_> = run_dirs().difference(&dirs_before).cloned().collect();
    if !stale.is_empty() {
        failures.push(format!("the killed run's dirs remain after the next run: {stale:?}"));
        for dir in stale {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `Timeout_seconds: 0` means the 30 s default, not "kill at once".
#[test]
fn zero_timeout_means_the_default() {
    let Some(g) = crate::shared("zero_timeout_means_the_default") else { return };
    let skill = attack("zero_timeout").with("timeout_seconds", json!(0));
    let run = skill.run(&Config::new(), &args("sleep", json!({"ms": 2500})));
    assert_eq!(run.result()["slept_ms"], json!(2500), "{}", run.dump());
    no_leftovers(&skill, &g);
}
