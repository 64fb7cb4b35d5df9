//! What a run sees of the host's processes: by default only its own tree,
//! so neither the command lines nor the status or environment of another
//! user's process or of another run (same run-as user) can be read, and no
//! host pid can be signalled; the global files stay readable. With `proc =
//! "host"` it sees the host's table.

use std::collections::BTreeSet;
use std::time::Duration;

use ongrid_tests::procs::{leftovers, Scope};
use ongrid_tests::{Config, Run, SkillDir};
use policy::sandbox::ProcView;
use policy::Outcome;
use serde_json::{json, Value};

use crate::{args, attack, blocked_with, no_leftovers, shared, signals_scoped};

/// The `proc_view` case's result, and the view the report gives.
fn view(run: &Run) -> (Value, Option<ProcView>) {
    run.expect(Outcome::Ok);
    (run.result().clone(), run.report.sandbox.as_ref().map(|s| s.proc))
}

/// The pids a `proc_view` result lists.
fn pids(r: &Value) -> BTreeSet<u64> {
    r["pids"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect()
}

/// Every global file read, with content.
fn globals_read(r: &Value, run: &Run) {
    let globals = r["globals"].as_object().expect("globals");
    assert!(!globals.is_empty(), "{}", run.dump());
    for (file, read) in globals {
        assert_eq!(read, &json!(true), "/proc/{file} unreadable:\n{}", run.dump());
    }
}

/// By default the run's `/proc` lists exactly its own tree (the entry and
/// its child), and the global files read.
#[test]
fn a_run_sees_only_its_own_processes() {
    let Some(g) = shared("a_run_sees_only_its_own_processes") else { return };
    let skill = attack("proc_own");
    let run = skill.run(&Config::new(), &args("proc_view", json!({})));
    let (r, proc) = view(&run);
    assert_eq!(proc, Some(ProcView::Own), "{}", run.dump());
    let child = r["child"].as_u64().expect("the child's pid");
    let own = BTreeSet::from([r["pid"].as_u64().expect("pid"), child]);
    assert_eq!(pids(&r), own, "not just its own tree:\n{}", run.dump());
    globals_read(&r, &run);
    no_leftovers(&skill, &g);
}

/// A live neighbour run (same run-as user) and this test's own process
/// (root) are out of sight: their `cmdline`, `status` and `environ` do not
/// read, and neither can be signalled (`kill` fails). The neighbour is out
/// of `kill`'s reach by Landlock's signal scoping (ABI 6): where the kernel
/// lacks it, the report says so and the neighbour is spared the try.
#[test]
fn other_processes_are_unreadable_and_unsignalable() {
    let Some(g) = shared("other_processes_are_unreadable_and_unsignalable") else { return };
    let neighbour =
        SkillDir::script("proc_neighbour", "until [ -e go ]; do sleep 0.05; done\necho '{}'")
            .with("timeout_seconds", json!(20));
    let intruder = attack("proc_intruder");
    std::thread::scope(|s| {
        let running = s.spawn(|| neighbour.run(&Config::new(), &json!({})));
        let pid = crate::poll(Duration::from_secs(10), || {
            leftovers(&neighbour, &Scope::default())
                .into_iter()
                .find(|p| p.cmdline.contains("run.sh"))
                .map(|p| p.pid)
        })
        .expect("the neighbour's shell");
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).expect("the neighbour's cwd");
        let me = std::process::id();
        let neighbour_pid = u64::from(pid.unsigned_abs());
        for target in [neighbour_pid, u64::from(me)] {
            for file in ["cmdline", "status", "environ"] {
                let path = format!("/proc/{target}/{file}");
                let run = intruder.run(&Config::new(), &args("read", json!({"path": path})));
                blocked_with(&run, &[libc::ENOENT, libc::EACCES, libc::EPERM]);
                let proc = run.report.sandbox.as_ref().map(|s| s.proc);
                assert_eq!(proc, Some(ProcView::Own), "{}", run.dump());
            }
            let probe = intruder.run(&Config::new(), &args("proc_view", json!({})));
            if target == neighbour_pid
                && !signals_scoped("other_processes_are_unreadable_and_unsignalable", &probe)
            {
                continue;
            }
            let run = intruder.run(&Config::new(), &args("kill", json!({"pid": target})));
            blocked_with(&run, &[libc::ESRCH, libc::EPERM]);
        }
        std::fs::write(cwd.join("go"), "").expect("the neighbour's go file");
        running.join().expect("the neighbour's run").expect(Outcome::Ok);
    });
    no_leftovers(&neighbour, &g);
    no_leftovers(&intruder, &g);
}

/// A skill granted `proc = "host"` sees the host's table: PID 1 and this
/// test's own process, and the report says so.
#[test]
fn a_host_grant_sees_the_host_table() {
    let Some(g) = shared("a_host_grant_sees_the_host_table") else { return };
    let skill = attack("proc_host");
    let config = Config::new().grant(skill.name(), "proc = \"host\"");
    let run = skill.run(&config, &args("proc_view", json!({})));
    let (r, proc) = view(&run);
    assert_eq!(proc, Some(ProcView::Host), "{}", run.dump());
    let seen = pids(&r);
    assert!(seen.contains(&1), "PID 1 unseen:\n{}", run.dump());
    assert!(seen.contains(&u64::from(std::process::id())), "the test unseen:\n{}", run.dump());
    globals_read(&r, &run);
    no_leftovers(&skill, &g);
}
