use std::ffi::{c_char, CString};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;

use super::*;
use crate::sys::child;
use crate::sys::spec::Step;

/// The default run's program: no network, its own files' metadata.
fn test_program() -> &'static [crate::sandbox::seccomp::Insn] {
    crate::sandbox::seccomp::program(crate::sandbox::seccomp::Variant {
        network: false,
        lock_metadata: false,
    })
}

fn status_field(status: &str, key: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Runs `/bin/cat /proc/self/status` through `spawn`; returns its output.
fn child_status(spawn: impl FnOnce(&ChildSpec<'_>) -> Result<Spawned, SpawnFailure>) -> String {
    child_status_result(spawn).expect("spawn")
}

fn child_status_result(
    spawn: impl FnOnce(&ChildSpec<'_>) -> Result<Spawned, SpawnFailure>,
) -> Result<String, SpawnFailure> {
    child_cat("/proc/self/status", spawn)
}

/// Runs `/bin/cat FILE` through `spawn`; returns its output.
fn child_cat(
    file: &str,
    spawn: impl FnOnce(&ChildSpec<'_>) -> Result<Spawned, SpawnFailure>,
) -> Result<String, SpawnFailure> {
    let pipe = || {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        // Numbered >= 3, as ChildSpec wants.
        (r.try_clone().unwrap(), w.try_clone().unwrap())
    };
    let (in_r, in_w) = pipe();
    let (out_r, out_w) = pipe();
    let (_err_r, err_w) = pipe();
    let path = CString::new("/bin/cat").unwrap();
    let arg = CString::new(file).unwrap();
    let argv: [*const c_char; 3] = [path.as_ptr(), arg.as_ptr(), std::ptr::null()];
    let envp: [*const c_char; 1] = [std::ptr::null()];
    let cwd = CString::new("/").unwrap();
    let spec = ChildSpec {
        path: &path,
        argv: &argv,
        envp: &envp,
        stdio: [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
        cwd: &cwd,
        cgroup_procs: &[],
        rlimits: &[],
        identity: None,
        capabilities: 0,
        cap_last: 40,
        landlock: None,
        share_below: None,
        seccomp: &[],
        log_denials: false,
        parent: nix::unistd::getpid().as_raw(),
        bounding_cleared: false,
        exec_at: None,
        mount_ns: None,
        start_idle: false,
    };
    let spawned = spawn(&spec)?;
    drop((in_r, in_w, out_w, err_w));
    let mut out = String::new();
    std::fs::File::from(out_r).read_to_string(&mut out).unwrap();
    // ECHILD: an engine test running at the same time reaped it with
    // its orphans (`wait4(-1)`, process-wide); the output is what counts.
    match crate::sys::process::wait(spawned.pid, false) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {}
        Err(e) => panic!("wait: {e}"),
    }
    Ok(out)
}

/// The child carries the spawner thread's filter although its spec has
/// no program, and the filter stays off the other threads.
#[test]
fn children_inherit_the_filter_and_nothing_else_gets_it() {
    let program = test_program();
    let spawner = Spawner::start(program, 2, "test-spawner").expect("spawner");
    for _ in 0..3 {
        let status = child_status(|s| spawner.spawn(s));
        assert_eq!(status_field(&status, "Seccomp"), "2", "{status}");
        assert_eq!(status_field(&status, "Seccomp_filters"), "1", "{status}");
        assert_eq!(status_field(&status, "NoNewPrivs"), "1", "{status}");
        if nix::unistd::geteuid().is_root() {
            assert_eq!(status_field(&status, "CapBnd"), "0000000000000000", "{status}");
        }
    }
    let me = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    assert_eq!(status_field(&me, "Seccomp"), "0", "the calling thread got the filter");
    let main = std::fs::read_to_string("/proc/self/status").unwrap();
    assert_eq!(status_field(&main, "Seccomp"), "0", "the main thread got the filter");
    if nix::unistd::geteuid().is_root() {
        assert_ne!(
            status_field(&me, "CapBnd"),
            "0000000000000000",
            "the calling thread's bounding set"
        );
        assert_ne!(
            status_field(&main, "CapBnd"),
            "0000000000000000",
            "the main thread's bounding set"
        );
    }
    // Without a spawner, a spec without a program means no filter.
    let plain = child_status(child::spawn);
    assert_eq!(status_field(&plain, "Seccomp"), "0", "{plain}");
    drop(spawner);
}

/// Many callers at once share the threads: every spawn is served
/// once, by a thread carrying the filter, and dropping the spawner
/// ends its threads.
#[test]
fn concurrent_callers_are_each_served_once() {
    let spawner = Spawner::start(test_program(), 2, "test-queue").unwrap();
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| {
                for _ in 0..4 {
                    let status = child_status(|spec| spawner.spawn(spec));
                    assert_eq!(status_field(&status, "Seccomp_filters"), "1", "{status}");
                }
            });
        }
    });
    let queue = Arc::clone(&spawner.queue);
    drop(spawner);
    let state = queue.lock();
    assert!(state.closed && state.jobs.is_empty() && state.idle.is_empty());
    assert!(queue.berths.iter().all(|b| !b.holds_job()));
    drop(state);
    assert_eq!(Arc::strong_count(&queue), 1, "a spawner thread outlived its spawner");
}

/// The identity of descriptor `fd` of this process, if open.
fn identity(fd: i32) -> Option<(u64, u64)> {
    // The magic link names the open file itself (a pipe, a socket...).
    use std::os::unix::fs::MetadataExt;
    let st = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?;
    Some((st.dev(), st.ino()))
}

/// A child that shares the table until its cgroups are joined
/// (`share_below`, host::fdtable) leaves the parent's table as it was:
/// its stdio went onto 0..2 of its own table, not ours, and its
/// `close_range` above the floor closed nothing of ours.
#[test]
fn a_child_sharing_the_table_leaves_the_parents_alone() {
    let Some(floor) = crate::host::fdtable::floor() else {
        println!("SKIP: no descriptor floor here (see host::fdtable)");
        return;
    };
    let high = crate::host::fdtable::lift_file(std::fs::File::open("/dev/null").unwrap());
    assert!(u32::try_from(high.as_raw_fd()).unwrap() >= floor);
    let before: Vec<_> = (0..3).map(identity).chain([identity(high.as_raw_fd())]).collect();
    let spawner = Spawner::start(test_program(), 2, "test-share").unwrap();
    for shared in [true, false] {
        let share = shared.then_some(floor);
        let status = child_status(|s| spawner.spawn(&ChildSpec { share_below: share, ..*s }));
        assert_eq!(status_field(&status, "Seccomp"), "2", "{status}");
        let direct = child_status(|s| child::spawn(&ChildSpec { share_below: share, ..*s }));
        assert_eq!(status_field(&direct, "Seccomp"), "0", "{direct}");
    }
    let after: Vec<_> = (0..3).map(identity).chain([identity(high.as_raw_fd())]).collect();
    assert_eq!(before, after, "the parent's stdio or lifted descriptor changed");
    // A stdio source at or above the floor is refused (it would be gone
    // in the child's own table).
    let refused = child_status_result(|s| child::spawn(&ChildSpec { share_below: Some(3), ..*s }));
    assert_eq!(refused, Err(SpawnFailure { step: Step::Clone, errno: libc::EINVAL }));
    drop(spawner);
}

/// A child told to start idle runs its program at `SCHED_IDLE` (stat's
/// policy field: 5), made by a spawner thread's parked child or
/// directly; any other child at the default (0).
#[test]
fn a_child_told_to_start_idle_runs_at_sched_idle() {
    let policy =
        |stat: String| stat.rsplit_once(") ").unwrap().1.split(' ').nth(38).unwrap().to_owned();
    let spawner = Spawner::start(test_program(), 1, "test-idle").unwrap();
    for idle in [true, false] {
        let want = if idle { "5" } else { "0" };
        let parked =
            child_cat("/proc/self/stat", |s| spawner.spawn(&ChildSpec { start_idle: idle, ..*s }));
        assert_eq!(policy(parked.unwrap()), want, "through a parked child, start_idle {idle}");
        let direct =
            child_cat("/proc/self/stat", |s| child::spawn(&ChildSpec { start_idle: idle, ..*s }));
        assert_eq!(policy(direct.unwrap()), want, "made directly, start_idle {idle}");
    }
    drop(spawner);
}

/// Now on `CLOCK_MONOTONIC`, in nanoseconds.
fn now_ns() -> u64 {
    crate::sys::call::monotonic_now_ns().expect("CLOCK_MONOTONIC")
}

/// A child times its own `execve`, parked or made for the run: the
/// time it stores falls between the spawn's call and its return, so a
/// caller that gets to run late still knows when the setup ended.
#[test]
fn the_child_times_its_own_exec() {
    let spawner = Spawner::start(test_program(), 2, "test-exec-at").unwrap();
    for parked in [true, false, true] {
        let at = AtomicU64::new(0);
        let (before, returned) = (now_ns(), std::cell::Cell::new(0));
        let status = child_status(|s| {
            let spec = ChildSpec { exec_at: Some(&at), ..*s };
            let r = if parked { spawner.spawn(&spec) } else { child::spawn(&spec) };
            returned.set(now_ns());
            r
        });
        assert_eq!(status_field(&status, "NoNewPrivs"), "1", "{status}");
        let at = at.load(std::sync::atomic::Ordering::Acquire);
        assert!(before < at && at <= returned.get(), "{before} < {at} <= {returned:?}");
    }
    // A failed exec is timed too, and still reported as failed.
    let at = AtomicU64::new(0);
    let missing = CString::new("/nonexistent/entry").unwrap();
    let failed = child_status_result(|s| {
        spawner.spawn(&ChildSpec { path: &missing, exec_at: Some(&at), ..*s })
    });
    assert_eq!(failed.map(|_| ()).unwrap_err().step, Step::Exec);
    assert_ne!(at.load(std::sync::atomic::Ordering::Acquire), 0);
    drop(spawner);
}

/// The children of this process's threads whose name is `name` (the
/// creating thread's, which a child parked by it still has).
fn children_named(name: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        pids.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    pids.retain(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
    });
    pids
}

/// Waits until `spawner` has `n` children parked; their pids.
fn parked_children(spawner: &Spawner, name: &str, n: usize) -> Vec<i32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let pids = children_named(name);
        if spawner.parked() == n && pids.len() == n {
            return pids;
        }
        assert!(std::time::Instant::now() < deadline, "parked {pids:?}, want {n}");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Each thread parks a child ahead of the first spawn; a spawn is run
/// by one of those children (its pid is a parked one's), the thread
/// parks another, and dropping the spawner makes the parked children
/// leave: none is left, alive or a zombie.
#[test]
fn children_are_parked_ahead_run_the_spawns_and_leave_with_the_spawner() {
    let spawner = Spawner::start(test_program(), 2, "test-park").unwrap();
    let before = parked_children(&spawner, "test-park", 2);
    let mut ran = 0;
    let status = child_status(|s| {
        let r = spawner.spawn(s);
        ran = r.as_ref().map_or(0, |sp| sp.pid);
        r
    });
    assert_eq!(status_field(&status, "Seccomp_filters"), "1", "{status}");
    assert_eq!(status_field(&status, "Pid"), ran.to_string(), "{status}");
    assert!(before.contains(&ran), "the spawn's child {ran} was not parked: {before:?}");
    let after = parked_children(&spawner, "test-park", 2);
    assert!(!after.contains(&ran), "{after:?}");
    drop(spawner);
    for pid in before.iter().chain(&after).filter(|p| **p != ran) {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "parked child {pid} outlived its spawner"
        );
    }
}

/// A thread with a child parked sleeps interruptibly: a thread in
/// uninterruptible sleep (`D`, as one suspended in `clone(CLONE_VFORK)`
/// is) counts in the load average, so an idle executor read one per
/// spawner thread on `uptime`. Before, after a spawn, and with the
/// replacement parked.
#[test]
fn threads_with_a_child_parked_do_not_count_in_the_load_average() {
    fn states(name: &str) -> Vec<(String, char)> {
        let mut out = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim() != name {
                continue;
            }
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised name.
            let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
            let wchan = std::fs::read_to_string(task.path().join("wchan")).unwrap_or_default();
            out.push((wchan, state.unwrap_or('?')));
        }
        out
    }
    let spawner = Spawner::start(test_program(), 2, "test-load").unwrap();
    for round in 0..2 {
        parked_children(&spawner, "test-load", 2);
        // A thread parks its child right after it left `parked_children`'s
        // count; let it get to its wait.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let threads = states("test-load");
        assert_eq!(threads.len(), 2, "{threads:?}");
        assert!(
            threads.iter().all(|(_, state)| *state == 'S'),
            "round {round}: spawner threads (wchan, state): {threads:?}"
        );
        child_status(|s| spawner.spawn(s));
    }
    drop(spawner);
}

/// Sets or clears the hold of `spawner`'s threads after `park`; when
/// setting, waits until `n` threads are held.
fn hold(spawner: &Spawner, on: bool, n: usize) {
    use std::sync::atomic::Ordering;
    spawner.queue.hold.store(on, Ordering::Release);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while on && spawner.queue.held.load(Ordering::Acquire) < n {
        assert!(std::time::Instant::now() < deadline, "no thread held");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Runs `child_status` through `spawner` on a thread of its own; the
/// receiver gets the spawned pid and the status. A run that never
/// returns leaves the thread behind, and the test fails on its timeout
/// instead of hanging.
fn spawn_apart(spawner: &Arc<Spawner>) -> mpsc::Receiver<(i32, String)> {
    let (tx, rx) = mpsc::channel();
    let spawner = Arc::clone(spawner);
    std::thread::spawn(move || {
        let mut pid = 0;
        let status = child_status(|s| {
            let r = spawner.spawn(s);
            pid = r.as_ref().map_or(0, |sp| sp.pid);
            r
        });
        let _ = tx.send((pid, status));
    });
    rx
}

/// The run learns that its child exec'd from the child's exec itself:
/// the spawn returns while the spawner thread that parked the child is
/// held on its way back from `park`, before it could answer.
#[test]
fn the_exec_itself_wakes_the_run() {
    let spawner = Arc::new(Spawner::start(test_program(), 1, "test-exec").unwrap());
    let parked = parked_children(&spawner, "test-exec", 1);
    hold(&spawner, true, 0);
    let run = spawn_apart(&spawner);
    let answer = run.recv_timeout(std::time::Duration::from_secs(10));
    // The thread is held from its child's exec on: it could not have
    // answered.
    hold(&spawner, true, 1);
    hold(&spawner, false, 0);
    let (pid, status) = answer.expect("the spawn waited for the spawner thread");
    assert_eq!(pid, parked[0]);
    assert_eq!(status_field(&status, "Pid"), parked[0].to_string(), "{status}");
    assert_eq!(status_field(&status, "Seccomp_filters"), "1", "{status}");
    parked_children(&spawner, "test-exec", 1);
}

/// A run watching for its child's exec yields its CPU meanwhile: a
/// child queued behind it there runs at once. Made to happen every
/// time: the run and the spawner thread (so its child) are on one CPU
/// in `SCHED_FIFO` at one priority, where nothing but a yield or a
/// sleep lets the child run, and the spin's budget is long. Root only.
#[test]
fn a_spinning_run_lets_a_child_on_its_cpu_go_first() {
    let budget = std::time::Duration::from_millis(400);
    let took = std::thread::spawn(move || {
        crate::sys::process::pin_thread_to_first_cpu();
        if crate::sys::process::set_thread_policy(libc::SCHED_FIFO, 10).is_err() {
            return None;
        }
        let spawner = Spawner::start(test_program(), 1, "test-yield").unwrap();
        parked_children(&spawner, "test-yield", 1);
        // Until the child reaches its `exec`, as it timed it: there it
        // leaves SCHED_FIFO, and the rest waits for the spin anyway.
        let (t0, at) = (now_ns(), AtomicU64::new(0));
        let status = child_status(|s| {
            spawner.spawn_spinning(&ChildSpec { exec_at: Some(&at), ..*s }, budget, || {})
        });
        crate::sys::process::set_thread_policy(libc::SCHED_OTHER, 0).unwrap();
        assert_eq!(status_field(&status, "Seccomp_filters"), "1", "{status}");
        let at = at.load(std::sync::atomic::Ordering::Acquire);
        Some(std::time::Duration::from_nanos(at.saturating_sub(t0)))
    })
    .join()
    .unwrap();
    let Some(took) = took else {
        println!("SKIP: SCHED_FIFO refused (it needs root)");
        return;
    };
    assert!(took < budget / 2, "the child ran only after the spin: {took:?}");
}

/// A spawn given to a parked child that died before it took the spec
/// is served by a child made for it, and its run woken to read the
/// answer.
#[test]
fn a_spawn_given_to_a_dead_parked_child_is_served() {
    let spawner = Arc::new(Spawner::start(test_program(), 1, "test-dead").unwrap());
    let parked = parked_children(&spawner, "test-dead", 1);
    // Held after `park` returns: the dead child's berth stays listed as
    // parked, so the next spawn is given to it.
    hold(&spawner, true, 0);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(parked[0]), nix::sys::signal::SIGKILL)
        .unwrap();
    hold(&spawner, true, 1);
    assert_eq!(spawner.parked(), 1, "the dead child's berth is still listed");
    let run = spawn_apart(&spawner);
    let early = run.recv_timeout(std::time::Duration::from_millis(50));
    hold(&spawner, false, 0);
    assert!(early.is_err(), "answered before the thread looked at the berth");
    let (pid, status) = run
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the run was not woken for the answer");
    assert_ne!(pid, parked[0]);
    assert_eq!(status_field(&status, "Pid"), pid.to_string(), "{status}");
    assert_eq!(status_field(&status, "Seccomp_filters"), "1", "{status}");
}

/// A file standing in for a `cgroup.procs` (what is written to it is
/// what a join wrote): open for writing, and its path.
fn procs_file(name: &str) -> (std::fs::File, std::path::PathBuf) {
    let dir =
        std::env::temp_dir().join(format!("ongrid-spawner-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cgroup.procs");
    let file = std::fs::File::create(&path).unwrap();
    (file, path)
}

/// The only run in flight (it spins) writes its parked child's pid into
/// the `cgroup.procs` files itself, once the child took its offer up,
/// and the child execs only after; a run that does not spin leaves the
/// child to write "0" itself. A failed write is the child's failure at
/// the cgroup step either way, and nothing is exec'd.
#[test]
fn a_spinning_run_makes_its_parked_childs_cgroup_joins() {
    // Ends as soon as the child takes the offer up: long, so that a host
    // busy with other tests does not leave the join to the child (50 ms
    // once did, under CI's load).
    let spin = Duration::from_secs(10);
    let spawner = Spawner::start(test_program(), 1, "test-join").unwrap();
    let (file, path) = procs_file("join");
    let procs = [file.as_raw_fd()];
    let parked = parked_children(&spawner, "test-join", 1);
    let mut pid = 0;
    let status = child_status(|s| {
        let r = spawner.spawn_spinning(&ChildSpec { cgroup_procs: &procs, ..*s }, spin, || {});
        pid = r.as_ref().map_or(0, |sp| sp.pid);
        r
    });
    assert_eq!(pid, parked[0], "not the parked child");
    assert_eq!(status_field(&status, "Pid"), pid.to_string(), "{status}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), pid.to_string());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());

    let (file, path) = procs_file("join-self");
    let procs = [file.as_raw_fd()];
    parked_children(&spawner, "test-join", 1);
    let status = child_status(|s| spawner.spawn(&ChildSpec { cgroup_procs: &procs, ..*s }));
    assert_eq!(status_field(&status, "Seccomp_filters"), "1", "{status}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "0");

    let read_only = std::fs::File::open(&path).unwrap();
    let procs = [file.as_raw_fd(), read_only.as_raw_fd()];
    for spin in [spin, Duration::ZERO] {
        parked_children(&spawner, "test-join", 1);
        let failed = child_status_result(|s| {
            spawner.spawn_spinning(&ChildSpec { cgroup_procs: &procs, ..*s }, spin, || {})
        });
        let failure = failed.map(|_| ()).unwrap_err();
        assert_eq!((failure.step, failure.errno), (Step::Cgroup, libc::EBADF), "spin {spin:?}");
    }

    drop(spawner);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A spinning run whose parked child died before it took the spec
/// makes no join: the child made for the run joins itself.
#[test]
fn a_spinning_run_given_a_dead_parked_child_leaves_the_join_to_the_next() {
    let spawner = Arc::new(Spawner::start(test_program(), 1, "test-join-dead").unwrap());
    let parked = parked_children(&spawner, "test-join-dead", 1);
    hold(&spawner, true, 0);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(parked[0]), nix::sys::signal::SIGKILL)
        .unwrap();
    hold(&spawner, true, 1);
    let (file, path) = procs_file("join-dead");
    let fd = file.as_raw_fd();
    let (tx, rx) = mpsc::channel();
    let run = Arc::clone(&spawner);
    std::thread::spawn(move || {
        let procs = [fd];
        let mut pid = 0;
        let status = child_status(|s| {
            let spec = ChildSpec { cgroup_procs: &procs, ..*s };
            let r = run.spawn_spinning(&spec, Duration::from_millis(50), || {});
            pid = r.as_ref().map_or(0, |sp| sp.pid);
            r
        });
        let _ = tx.send((pid, status));
    });
    // Let the thread go only once the run's job was given to the dead
    // child's berth, however late the run's thread gets there.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !spawner.queue.berths[0].holds_job() {
        assert!(std::time::Instant::now() < deadline, "the run's job was not given");
        std::thread::sleep(Duration::from_millis(1));
    }
    hold(&spawner, false, 0);
    let (pid, status) = rx.recv_timeout(Duration::from_secs(10)).expect("the run was not answered");
    drop(file);
    assert_ne!(pid, parked[0]);
    assert_eq!(status_field(&status, "Pid"), pid.to_string(), "{status}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "0");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A parked child killed while it waits is reaped and replaced; the
/// next spawn is served.
#[test]
fn a_parked_child_killed_is_replaced() {
    let spawner = Spawner::start(test_program(), 1, "test-kill").unwrap();
    let first = parked_children(&spawner, "test-kill", 1);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first[0]), nix::sys::signal::SIGKILL)
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while children_named("test-kill") == first {
        assert!(std::time::Instant::now() < deadline, "not replaced");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let status = child_status(|s| spawner.spawn(s));
    assert_eq!(status_field(&status, "Seccomp_filters"), "1", "{status}");
    assert!(!std::path::Path::new(&format!("/proc/{}", first[0])).exists());
}

/// A program the kernel refuses fails the start and leaves no thread.
#[test]
fn a_refused_program_fails_the_start() {
    static BAD: [libc::sock_filter; 1] = [libc::sock_filter { code: 0xffff, jt: 0, jf: 0, k: 0 }];
    let e = Spawner::start(&BAD, 2, "test-spawner").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
}
