//! Runs side by side: two sandboxed runs of the same executor user cannot
//! reach each other (the persistence, ptrace and signal cases with a live
//! sandboxed neighbour as the victim instead of a process outside). Both
//! run as `ongrid-skill`, so file modes, signal permission and ptrace's uid
//! check would all let one reach the other: each run's own Landlock domain
//! is what stops it. Served (`ONGRID_SANDBOX_VIA=serve`), both runs come
//! from one executor, its spawner threads and its sibling cgroup leaves.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ongrid_tests::procs::{leftovers, Scope};
use ongrid_tests::run::unsandboxed;
use ongrid_tests::{host, Config, SkillDir};
use policy::Outcome;
use serde_json::json;

use crate::{args, attack, blocked_with, exclusive, no_leftovers, shared, signals_scoped};

/// What the neighbour writes into its run directory.
const SECRET: &str = "ONGRID-NEIGHBOUR-SECRET";

/// Waits up to 10 s for `f` to give a value.
fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    crate::poll(Duration::from_secs(10), f)
        .unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// A live neighbour run's directory and file, its processes and memory are
/// out of reach of another run; the neighbour ends `ok`, untouched.
#[test]
fn a_concurrent_run_is_out_of_reach() {
    let Some(g) = shared("a_concurrent_run_is_out_of_reach") else { return };
    let neighbour = SkillDir::script(
        "neighbour",
        // Alive until the test has made every attempt (its `go` file).
        &format!("printf '{SECRET}' > secret.txt\nuntil [ -e go ]; do sleep 0.05; done\ncat secret.txt >/dev/null\necho '{{\"done\": true}}'"),
    )
    .with("timeout_seconds", json!(20));
    let intruder = attack("intruder");
    std::thread::scope(|s| {
        let running = s.spawn(|| neighbour.run(&Config::new(), &json!({})));
        // The neighbour's shell (its command line names the skill folder)
        // and its run directory, once the secret is written.
        let pid = wait_for("the neighbour's shell", || {
            leftovers(&neighbour, &Scope::default())
                .into_iter()
                .find(|p| p.cmdline.contains("run.sh"))
                .map(|p| p.pid)
        });
        let dir: PathBuf = wait_for("the neighbour's run directory", || {
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
            (std::fs::read_to_string(cwd.join("secret.txt")).ok()? == SECRET).then_some(cwd)
        });
        let secret = dir.join("secret.txt");
        let path = |p: &Path| p.to_str().expect("utf-8 path").to_owned();

        // Baseline: as the same user, outside the sandbox, the file reads.
        let (uid, gid) = host::skill_user();
        let base = unsandboxed(
            Path::new(crate::ATTACK),
            uid,
            gid,
            &args("read", json!({"path": path(&secret)})),
        );
        assert_eq!(
            base["succeeded"],
            json!(true),
            "baseline: the neighbour's file is unreadable: {base}"
        );

        let attempts = [
            ("read", json!({"path": path(&secret)})),
            ("list", json!({"path": path(&dir)})),
            ("write", json!({"path": path(&dir.join("pwned"))})),
            ("list", json!({"path": path(dir.parent().expect("runs directory"))})),
        ];
        for (case, a) in attempts {
            let run = intruder.run(&Config::new(), &args(case, a));
            blocked_with(&run, &[libc::EACCES, libc::EPERM]);
        }
        let mut scoped = true;
        for case in ["ptrace", "process_vm_readv", "kill"] {
            if case == "kill" && !scoped {
                continue;
            }
            // addr 0: a permitted read would fail with EFAULT, not EPERM.
            let run = intruder.run(&Config::new(), &args(case, json!({"pid": pid, "addr": 0})));
            blocked_with(&run, &[libc::EPERM, libc::EACCES]);
            scoped = signals_scoped("a_concurrent_run_is_out_of_reach", &run);
        }

        std::fs::write(dir.join("go"), "").expect("the neighbour's go file");
        let done = running.join().expect("the neighbour's run");
        done.expect(Outcome::Ok);
        assert_eq!(done.result(), json!({"done": true}), "{}", done.dump());
        assert!(!dir.join("pwned").exists(), "the intruder wrote into the neighbour's directory");
    });
    no_leftovers(&neighbour, &g);
    no_leftovers(&intruder, &g);
}

/// A run's files are charged to its memory cgroup, and the runs tmpfs they
/// share has room for every run slot's run at its memory bound: three runs
/// with the default limits (512 MiB of memory, files of at most 64 MiB)
/// that each keep 420 MiB of files at once all get their room, where a
/// tmpfs of 1 GiB for all runs let two of them leave the third none
/// (ENOSPC).
#[test]
fn runs_cannot_fill_the_disk_for_one_another() {
    let Some(g) = exclusive("runs_cannot_fill_the_disk_for_one_another") else { return };
    // One skill folder per run: a run rewrites its manifest as it starts.
    let skills: Vec<_> = (0..3)
        .map(|i| attack(&format!("disk_share_{i}")).with("timeout_seconds", json!(30)))
        .collect();
    let fill = args("disk_fill", json!({"file_mb": 60, "cap_mb": 420, "hold_ms": 3000}));
    let runs: Vec<_> = std::thread::scope(|s| {
        let each: Vec<_> =
            skills.iter().map(|skill| s.spawn(|| skill.run(&Config::new(), &fill))).collect();
        each.into_iter().map(|h| h.join().expect("a filling run")).collect()
    });
    for run in &runs {
        run.expect(Outcome::Ok);
        if run.report.sandbox.as_ref().is_some_and(|s| s.cgroup.memory.is_none()) {
            println!("SKIP: runs_cannot_fill_the_disk_for_one_another: no memory cgroup");
            return;
        }
        assert_eq!(
            run.result()["succeeded"],
            json!(true),
            "a run was left no room:\n{}",
            run.dump()
        );
    }
    for skill in &skills {
        no_leftovers(skill, &g);
    }
}
