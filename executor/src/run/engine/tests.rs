use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use super::*;

/// A skill folder (0755) holding `skill.json` (`name`, `timeout`) and
/// an executable `run.sh` of `script`; returns it and the manifest.
fn skill(name: &str, timeout: u32, script: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = dir.path().join("skill.json");
    std::fs::write(
        &manifest,
        format!(
            r#"{{"name":"{name}","description":"t","entry":"run.sh","timeout_seconds":{timeout}}}"#
        ),
    )
    .unwrap();
    let entry = dir.path().join("run.sh");
    std::fs::write(&entry, script).unwrap();
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, manifest)
}

/// An engine with its own runtime directory and a skill `name` that
/// runs `cat`; `None` (after a visible SKIP) when root lacks the
/// run-as user.
fn cat_engine(name: &str) -> Option<(tempfile::TempDir, tempfile::TempDir, PathBuf, Engine)> {
    let root = nix::unistd::geteuid().is_root();
    if root && nix::unistd::User::from_name(crate::config::DEFAULT_RUN_AS).ok().flatten().is_none()
    {
        eprintln!("SKIP: run-as user missing (scripts/test creates it)");
        return None;
    }
    let runtime = tempfile::tempdir().unwrap();
    let (skill, manifest) = skill(name, 5, "#!/bin/sh\nexec cat\n");
    let config = Config { runtime_dir: Some(runtime.path().to_owned()), ..Config::default() };
    let engine = Engine::new(config).unwrap();
    Some((runtime, skill, manifest, engine))
}

/// A new engine (runtime directory `dir`) and a runtime on the calling
/// thread, as a function running one manifest with `{}`. The engine
/// starts its spawner threads at its first run, from this thread, so
/// they (and their children) take this thread's policy and CPUs.
fn engine_on_this_thread(dir: PathBuf) -> impl Fn(PathBuf) -> RunReport {
    let engine = Engine::new(Config { runtime_dir: Some(dir), ..Config::default() }).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    move |manifest| {
        let (report, _, _) = rt.block_on(engine.run_source_then(
            ManifestSource::Path(manifest),
            b"{}".to_vec(),
            None,
            &mut |_| {},
            std::future::ready(true),
            std::future::pending(),
        ));
        report
    }
}

/// `setup_us` ends when the child calls `execve`, not when the run's
/// thread gets to run after it. Made to happen every time: the run's
/// thread and the skill share one CPU, and the skill (a child of a
/// spawner thread, which carries `SCHED_FIFO` here) keeps it busy for a
/// while after its exec, so the run's thread (`SCHED_OTHER`) runs only
/// when the skill is done. Root only (`SCHED_FIFO`).
#[test]
fn setup_ends_at_the_childs_exec_however_late_the_run_gets_a_cpu() {
    // For the run-as user's SKIP; this engine is not used.
    let Some((runtime, _cat, cat, _)) = cat_engine("late") else { return };
    let busy = "#!/bin/sh\ni=0\nwhile [ $i -lt 400000 ]; do i=$((i+1)); done\necho '{}'\n";
    let (_busy, manifest) = skill("late", 10, busy);
    let runtime_dir = runtime.path().to_owned();
    let report = std::thread::spawn(move || {
        crate::sys::process::pin_thread_to_first_cpu();
        if crate::sys::process::set_thread_policy(libc::SCHED_FIFO, 10).is_err() {
            return None;
        }
        let run = engine_on_this_thread(runtime_dir);
        // The first run starts the spawner threads, which (and so the
        // children) inherit the policy and the CPU; the run's thread
        // then goes back to the default.
        assert_eq!(run(cat).outcome, Outcome::Ok);
        crate::sys::process::set_thread_policy(libc::SCHED_OTHER, 0).expect("SCHED_OTHER");
        Some(run(manifest))
    })
    .join()
    .unwrap();
    let Some(report) = report else {
        println!("SKIP: SCHED_FIFO refused (it needs root)");
        return;
    };
    assert_eq!(report.outcome, Outcome::Ok, "{report:?}");
    assert!(report.duration_ms >= 300, "the CPU was not held after the exec: {report:?}");
    assert!(
        report.setup_us < 150_000,
        "setup counted time after the exec: {} us of {} ms",
        report.setup_us,
        report.duration_ms
    );
}

/// A skill never runs with the executor's real-time policy or
/// negative nice value, which children inherit, and cannot take them
/// back: from inside the sandbox it reads its own policy, nice value
/// and limits, with an executor in `SCHED_FIFO` at nice -5 whose
/// limits allow both. Root only.
#[test]
fn a_skill_gets_neither_the_executors_real_time_policy_nor_its_priority() {
    let Some((runtime, _cat, cat, _)) = cat_engine("sched") else { return };
    let probe = "#!/bin/sh\nread -r stat < /proc/self/stat\nset -- $stat\n\
                 rt=$(grep 'Max realtime priority' /proc/self/limits | tr -s ' ' | cut -d' ' -f4)\n\
                 ni=$(grep 'Max nice priority' /proc/self/limits | tr -s ' ' | cut -d' ' -f4)\n\
                 echo \"{\\\"nice\\\":${19},\\\"policy\\\":${41},\\\"rtprio\\\":$rt,\\\"nicelim\\\":$ni}\"\n";
    let (_probe, manifest) = skill("sched", 10, probe);
    let runtime_dir = runtime.path().to_owned();
    let report = std::thread::spawn(move || {
        if crate::sys::process::set_thread_policy(libc::SCHED_FIFO, 10).is_err()
            || crate::sys::process::set_thread_nice(-5).is_err()
        {
            return None;
        }
        // Limits that would let it take them back (per process: nothing
        // else here depends on them), where raising them is allowed.
        use nix::sys::resource::{setrlimit, Resource};
        let raised = setrlimit(Resource::RLIMIT_RTPRIO, 10, 10).is_ok()
            && setrlimit(Resource::RLIMIT_NICE, 25, 25).is_ok();
        let run = engine_on_this_thread(runtime_dir);
        // The spawner threads start with the first run, in this policy.
        assert_eq!(run(cat).outcome, Outcome::Ok);
        Some((run(manifest), raised))
    })
    .join()
    .unwrap();
    let Some((report, raised)) = report else {
        println!("SKIP: SCHED_FIFO or nice -5 refused (it needs root)");
        return;
    };
    assert_eq!(report.outcome, Outcome::Ok, "{report:?}");
    let seen = report.result.as_ref().expect("the probe's JSON").to_value();
    assert_eq!(seen["policy"], 0, "SCHED_OTHER: {seen}");
    assert_eq!(seen["nice"], 0, "{seen}");
    assert_eq!((&seen["rtprio"], &seen["nicelim"]), (&0.into(), &0.into()), "{seen}");
    if !raised {
        println!(
            "SKIP (part): RLIMIT_RTPRIO and RLIMIT_NICE could not be raised here (no \
             CAP_SYS_RESOURCE), so the skill's limits of 0 are the executor's own"
        );
    }
}

/// A finished run's pipes and pidfd stay open until its `AfterReport`
/// is dropped (after the report is written), and close then.
#[test]
fn a_runs_pipes_and_pidfd_close_when_its_after_report_is_dropped() {
    let Some((_runtime, _skill, manifest, engine)) = cat_engine("after") else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let link = |fd: i32| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
    let open_links = || -> Vec<PathBuf> {
        let fds = std::fs::read_dir("/proc/self/fd").unwrap();
        fds.filter_map(|e| std::fs::read_link(e.unwrap().path()).ok()).collect()
    };
    for _ in 0..2 {
        let (report, _, after) = rt.block_on(engine.run_source_then(
            ManifestSource::Path(manifest.clone()),
            br#"{"a":1}"#.to_vec(),
            None,
            &mut |_| {},
            std::future::ready(true),
            std::future::pending(),
        ));
        assert_eq!(report.outcome, Outcome::Ok, "{report:?}");
        let held = after.leftovers.as_ref().expect("leftovers").fds();
        assert_eq!(held.len(), 3, "stdout, stderr and the pidfd: {held:?}");
        let pipes: Vec<PathBuf> = held
            .iter()
            .filter_map(|fd| link(*fd))
            .filter(|l| l.to_string_lossy().starts_with("pipe:"))
            .collect();
        assert_eq!(pipes.len(), 2, "both pipes open until the drop: {pipes:?}");
        drop(after);
        let still: Vec<PathBuf> = open_links().into_iter().filter(|l| pipes.contains(l)).collect();
        assert!(still.is_empty(), "closed with the drop: {still:?}");
    }
}

/// Runs made from the janitor's ready slots work, and dropping the
/// engine removes every run directory and cgroup leaf it made.
#[test]
fn pooled_slots_serve_runs_and_nothing_outlives_the_engine() {
    let Some((runtime, _skill, manifest, engine)) = cat_engine("pool") else { return };
    let leaves = engine.host().cgroups.clone();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let runs = engine.host().runs_dir.clone();
    assert!(runs.starts_with(runtime.path().join("runs")), "{}", runs.display());
    let mut seen = BTreeSet::new();
    let mut leaves_seen = BTreeSet::new();
    for i in 0..12 {
        let args = format!(r#"{{"i":{i}}}"#).into_bytes();
        let req = RunRequest { manifest_path: manifest.clone(), args };
        let r = rt.block_on(engine.run(req, &mut |_| {}, std::future::pending()));
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        assert_eq!(r.result.map(|v| v.to_value()), Some(serde_json::json!({ "i": i })));
        for e in std::fs::read_dir(&runs).unwrap() {
            seen.insert(e.unwrap().file_name());
        }
        if let Some(base) = &leaves.v2 {
            for e in std::fs::read_dir(base).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    leaves_seen.insert(e.file_name());
                }
            }
        }
        // The janitor catches up between runs (its pool back at depth)
        // however busy the host.
        let ready = || std::fs::read_dir(&runs).unwrap().count() - 1;
        let until = std::time::Instant::now() + Duration::from_secs(5);
        std::thread::sleep(Duration::from_millis(20));
        while ready() < crate::run::janitor::POOL_DEPTH && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    seen.remove(std::ffi::OsStr::new(crate::host::sweep::GUARD));
    assert!(seen.len() > 1, "{seen:?}");
    // Runs named by path share one parse of their unchanged manifest.
    assert_eq!(engine.parsed.len(), 1);
    // A reused slot's ruleset serves the next run of this policy there.
    let (built, reused) = engine.landlock_rulesets();
    if crate::sys::landlock::abi() > 0 {
        assert_eq!(built + reused, 12, "built {built}, reused {reused}");
        if leaves.v2.is_some() {
            assert!(reused > 0, "no ruleset reused in 12 runs (built {built})");
        }
    } else {
        println!("SKIP: no Landlock here: no ruleset to reuse");
    }
    // Finished runs' leaves serve again (fresh ones would be 12 + the
    // pool).
    if leaves.v2.is_some() {
        assert!(leaves_seen.len() < 12, "{} leaves for 12 runs", leaves_seen.len());
    }
    // Ready slots carry their run's pipes, made off the runs' path.
    let (ready, with_pipes) = engine.janitor.ready_with_pipes();
    assert!(ready > 0 && with_pipes == ready, "{with_pipes} of {ready} ready slots have pipes");
    // Idle, the pool goes back to its depth.
    std::thread::sleep(crate::run::janitor::TRIM_AFTER);
    let idle = || std::fs::read_dir(&runs).unwrap().count() - 1;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while idle() > crate::run::janitor::POOL_DEPTH && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(idle() <= crate::run::janitor::POOL_DEPTH, "{} ready slots when idle", idle());
    drop(engine);
    assert!(!runs.exists(), "instance directory left: {}", runs.display());
    let left: Vec<_> = std::fs::read_dir(runtime.path().join("runs")).unwrap().collect();
    assert!(left.is_empty(), "run directories left: {left:?}");
    for base in [&leaves.v2, &leaves.v1_pids, &leaves.v1_memory].into_iter().flatten() {
        assert!(!base.exists(), "instance cgroup {} left", base.display());
    }
}

/// An engine of its own (as root, with the run-as user) and one skill,
/// run one request at a time with a pause after each for the janitor
/// to recycle the run's leaves into the pool: the next run gets them.
struct Recycling {
    engine: Engine,
    rt: tokio::runtime::Runtime,
    manifest: PathBuf,
    _skill: tempfile::TempDir,
    _runtime: tempfile::TempDir,
}

impl Recycling {
    /// `None` after a visible SKIP naming `test` when not root or
    /// without the run-as user.
    fn new(test: &str, name: &str, script: &str, tune: impl FnOnce(&mut Config)) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: {test} needs root (cgroups)");
            return None;
        }
        let user = nix::unistd::User::from_name(crate::config::DEFAULT_RUN_AS);
        if user.ok().flatten().is_none() {
            eprintln!("SKIP: run-as user missing (scripts/test creates it)");
            return None;
        }
        let runtime = tempfile::tempdir().unwrap();
        let (skill, manifest) = skill(name, 10, script);
        let mut config =
            Config { runtime_dir: Some(runtime.path().to_owned()), ..Config::default() };
        tune(&mut config);
        Some(Recycling {
            engine: Engine::new(config).unwrap(),
            rt: tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap(),
            manifest,
            _skill: skill,
            _runtime: runtime,
        })
    }

    fn run(&self, args: &str) -> RunReport {
        let req = RunRequest { manifest_path: self.manifest.clone(), args: args.into() };
        let r = self.rt.block_on(self.engine.run(req, &mut |_| {}, std::future::pending()));
        // Time for the janitor to recycle the leaves into the pool.
        std::thread::sleep(Duration::from_millis(30));
        r
    }
}

/// Leaves seen empty at one run's end are read afresh for the next run
/// they serve: the background process of a run on recycled leaves is
/// killed when its main process exits, as on new leaves.
#[test]
fn recycled_leaves_still_kill_what_a_run_leaves_behind() {
    let test = "recycled_leaves_still_kill_what_a_run_leaves_behind";
    let script = concat!(
        "#!/bin/sh\n",
        "args=$(cat)\n",
        "case $args in\n",
        "*bg*) sleep 30 </dev/null >/dev/null 2>&1 & echo \"{\\\"pid\\\":$!}\" ;;\n",
        "*) echo '{}' ;;\n",
        "esac\n",
    );
    let Some(t) = Recycling::new(test, "bg", script, |_| {}) else { return };
    if t.engine.host().cgroups.v2.is_none() {
        eprintln!("SKIP: {test}: no cgroup v2");
        return;
    }
    let run = |args: &str| t.run(args);
    for i in 0..6 {
        let r = run(&format!(r#"{{"i":{i}}}"#));
        assert_eq!(r.exit_code, Some(0), "run {i}: {r:?}");
    }
    for round in 0..3 {
        let r = run(r#"{"bg":true}"#);
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        let pid = r.result.as_ref().and_then(|v| v.to_value()["pid"].as_i64());
        let pid = i32::try_from(pid.expect("the pid")).unwrap();
        let gone = (0..200).any(|_| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
            let alive = stat.is_ok_and(|s| {
                s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
            });
            if alive {
                std::thread::sleep(Duration::from_millis(10));
            }
            !alive
        });
        assert!(gone, "round {round}: the background sleep {pid} outlived its run");
    }
    let counts = t.engine.run_slots();
    assert!(counts.ready >= 6, "the runs took recycled slots: {counts:?}");
}

/// The OOM verdict is this run's own on reused leaves: a run that blows
/// its memory bound is reported so, and the runs after it, which get
/// its recycled leaves (their files kept open and read again), are not.
#[test]
fn reused_leaves_report_only_their_own_oom() {
    let test = "reused_leaves_report_only_their_own_oom";
    // {"hog":true}: hold 96 MB in the shell (a command substitution)
    // under a 32 MiB bound; otherwise echo the args and exit 3 (an OOM
    // kill is the verdict only for a run that did not exit 0).
    let script = concat!(
        "#!/bin/sh\n",
        "args=$(cat)\n",
        "case $args in\n",
        "*hog*) x=$(head -c 96000000 /dev/zero | tr '\\0' a); echo '{}' ;;\n",
        "*) printf '%s' \"$args\"; exit 3 ;;\n",
        "esac\n",
    );
    let tune = |c: &mut Config| c.limits.memory_bytes = 32 << 20;
    let Some(t) = Recycling::new(test, "oom", script, tune) else { return };
    let c = &t.engine.host().cgroups;
    if c.v1_memory.is_none() && !c.v2_limits {
        eprintln!("SKIP: {test}: no memory cgroup here");
        return;
    }
    let run = |args: &str| t.run(args);
    for round in 0..2 {
        for i in 0..5 {
            let r = run(&format!(r#"{{"i":{i}}}"#));
            assert_eq!((r.exit_code, r.limit), (Some(3), None), "round {round} run {i}: {r:?}");
        }
        let r = run(r#"{"hog":true}"#);
        assert_eq!(r.limit, Some(policy::LimitKind::Memory), "round {round} hog: {r:?}");
    }
    let r = run(r#"{"i":9}"#);
    assert_eq!((r.exit_code, r.limit), (Some(3), None), "{r:?}");
}

/// A warm run dropped on a path that neither supervises nor kills it (a
/// panic unwinding through its holder) is killed with its cgroup leaf,
/// which drops before its stdin closes: it does not read the end of its
/// stdin as its args and run on unwatched (this `cat` would exit 0).
#[test]
fn a_warm_run_dropped_unused_is_killed() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: a_warm_run_dropped_unused_is_killed needs root (a cgroup leaf)");
        return;
    }
    let Some((_runtime, _skill, manifest, engine)) = cat_engine("dropped") else { return };
    let warm = crate::run::warm::Maker::make(&engine, &manifest, None).expect("a warm run");
    let pid = warm.child.pid;
    drop(warm);
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let exit = loop {
        match engine.reaper.collect(pid) {
            Some(exit) => break exit,
            None if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(5));
            }
            None => panic!("the dropped warm run {pid} still runs"),
        }
    };
    assert_eq!((exit.code, exit.signal), (None, Some(libc::SIGKILL)), "{exit:?}");
}

/// The engine's pool thread, each `make` waiting for the test's word
/// first (or for its sender to be gone).
struct GatedMaker {
    engine: Arc<Engine>,
    gate: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl crate::run::warm::Maker for GatedMaker {
    fn make(&self, path: &std::path::Path, tool: Option<&str>) -> Result<Warm, String> {
        let _ = self.gate.lock().unwrap().recv();
        crate::run::warm::Maker::make(&*self.engine, path, tool)
    }

    fn kill(&self, warm: Warm) {
        crate::run::warm::Maker::kill(&*self.engine, warm);
    }
}

/// A warm run whose making was under way while a request came to wait in
/// the queue for a run slot is put down once made, its slot going to the
/// queue: kept idle, it would hold that slot until it expired.
#[test]
fn a_warm_run_made_while_a_request_queues_gives_it_its_slot() {
    use tokio::sync::Semaphore;
    let Some((runtime, _cat, manifest, _)) = cat_engine("queued") else { return };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: a_warm_run_made_while_a_request_queues_gives_it_its_slot needs root");
        return;
    }
    let text = "max_concurrent_runs = 3\n[skills.queued]\nwarm = 1\n";
    let mut config = Config::parse(text, std::path::Path::new("t.toml")).unwrap();
    config.runtime_dir = Some(runtime.path().to_owned());
    let engine = Arc::new(Engine::new(config).unwrap());
    let slots = Arc::new(Semaphore::new(3));
    let (open, gate) = std::sync::mpsc::channel();
    let maker = GatedMaker { engine: Arc::clone(&engine), gate: std::sync::Mutex::new(gate) };
    let thread = {
        let (engine, slots) = (Arc::clone(&engine), Arc::clone(&slots));
        std::thread::spawn(move || engine.warm.serve(&maker, &slots))
    };
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        let until = Instant::now() + Duration::from_secs(5);
        while !f() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(f(), "{what}");
    };
    // A first run (a miss) starts the pool: its first making takes a slot.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let req = RunRequest { manifest_path: manifest.clone(), args: b"{}".to_vec() };
    let report = rt.block_on(engine.run(req, &mut |_| {}, std::future::pending()));
    assert_eq!(report.outcome, policy::Outcome::Ok, "{report:?}");
    wait("the pool thread never took a slot", &|| slots.available_permits() == 2);
    // Two runs in flight take the others; a third request queues.
    let running = Arc::clone(&slots).try_acquire_many_owned(2).unwrap();
    let queued = engine.warm.wait_for_slot();
    open.send(()).unwrap();
    wait("the warm run made kept its slot from the queue", &|| slots.available_permits() == 1);
    let stats = engine.warm_stats();
    let (_, s) = stats.iter().find(|(n, _)| n == "queued").unwrap();
    assert_eq!((s.idle, s.discarded), (0, 1), "{s:?}");
    drop((queued, running, open));
    engine.finish_warm();
    thread.join().unwrap();
}
