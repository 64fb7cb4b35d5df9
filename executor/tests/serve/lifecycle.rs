//! Start-up and shutdown: the drain and its bound, the sweep of a
//! crash's leftovers, the binary under SIGTERM and SIGKILL.

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use executor::{Config, Engine};
use policy::wire::code;
use serde_json::json;

use crate::common;
use crate::support::*;

/// Shutdown: the socket stops accepting, new and queued runs get BUSY,
/// runs in flight finish (a slow one by its own deadline), then `run`
/// returns.
#[test]
fn shutdown_drains_runs_then_returns() {
    if !can_run() {
        return;
    }
    let mut server = Server::start(|_| {});
    // It runs until the test says go, so it is in flight whatever the load.
    let go = server.root.join("finishing").join("go");
    let script =
        format!("while [ ! -e {} ]; do sleep 0.05; done\necho '{{\"f\":1}}'", go.display());
    let finishing = skill(&server.root, "finishing", "safe", 10, &script);
    let mark = marker(3);
    let stuck = skill(&server.root, "stuck", "safe", 1, &format!("exec sleep {mark}"));
    let mut a = server.client();
    a.execute(1, &finishing, json!({}));
    let mut b = server.client();
    b.execute(2, &stuck, json!({}));
    server.wait_in_flight(2);
    let stopped_at = Instant::now();
    server.shutdown();
    wait_for("the socket to refuse connections", Duration::from_secs(2), || {
        UnixStream::connect(&server.socket).is_err()
    });
    // The connection with a run in flight still answers, but runs no more.
    a.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}));
    assert_eq!(a.recv()["result"]["ok"], true);
    a.execute(4, &finishing, json!({}));
    let v = a.recv();
    assert_eq!((v["id"].clone(), v["error"]["code"].clone()), (json!(4), json!(code::BUSY)));
    std::fs::write(&go, "").unwrap();
    let (_, v) = a.run_result();
    assert_eq!((v["id"].clone(), v["result"]["outcome"].clone()), (json!(1), json!("ok")));
    assert_eq!(a.recv_opt(), None, "closed once its runs are done");
    let (_, v) = b.run_result();
    assert_eq!(v["result"]["outcome"], "timeout", "{v}");
    assert!(server.finished_within(Duration::from_secs(5)));
    assert!(stopped_at.elapsed() < Duration::from_secs(6));
    assert!(common::procs_with(&mark).is_empty());
    let text = server.metrics();
    assert_eq!(runs_total(&text, "finishing", "ok"), 1.0);
    assert_eq!(runs_total(&text, "finishing", "busy"), 1.0);
    assert_eq!(runs_total(&text, "stuck", "timeout"), 1.0);
}

/// Shutdown is bounded by `drain_timeout_seconds` as well as by the
/// longest run: a run with a 30 s timeout in flight at SIGTERM is killed
/// once the drain's 1 s is up, and the server returns, leaving no process
/// (before: the drain waited for `max_timeout_seconds` and more, 607 s by
/// default, past the unit's stop timeout).
#[test]
fn shutdown_drain_is_bounded_by_drain_timeout_seconds() {
    if !can_run() {
        return;
    }
    let mut server = Server::start(|c| c.drain_timeout_seconds = 1);
    let mark = marker(5);
    let long = skill(&server.root, "long", "safe", 30, &format!("exec sleep {mark}"));
    let mut a = server.client();
    a.execute(1, &long, json!({}));
    server.wait_in_flight(1);
    let stopped_at = Instant::now();
    server.shutdown();
    assert!(server.finished_within(Duration::from_secs(8)), "the drain outlived its bound");
    let took = stopped_at.elapsed();
    assert!(took >= Duration::from_secs(1), "the run was not given its drain: {took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(common::procs_with(&mark).is_empty(), "the run outlived the executor");
}

/// On start the server removes run directories (without following
/// symlinks) and kills and removes the cgroups a crash left.
#[test]
fn start_up_sweeps_crash_leftovers() {
    if !can_run() {
        return;
    }
    let runtime = dir_0755();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), "x").unwrap();
    let id = format!("dead{:012x}", std::process::id());
    let run_dir = runtime.path().join("runs").join(&id);
    std::fs::create_dir_all(&run_dir).unwrap();
    std::os::unix::fs::symlink(outside.path(), run_dir.join("link")).unwrap();
    std::fs::write(run_dir.join("file"), "x").unwrap();

    let (h, _) = executor::sandbox::cgroup::Hierarchies::detect();
    let mark = marker(4);
    let mut orphan = std::process::Command::new("sleep").arg(&mark).spawn().unwrap();
    let mut leaves = Vec::new();
    for base in [&h.v2, &h.v1_pids, &h.v1_memory].into_iter().flatten() {
        let leaf = base.join(&id);
        std::fs::create_dir(&leaf).unwrap();
        std::fs::write(leaf.join("cgroup.procs"), orphan.id().to_string()).unwrap();
        leaves.push(leaf);
    }
    // An old, empty leaf without a run directory (a crash mid-setup).
    let stale = h.v2.as_ref().map(|b| b.join(format!("{id}-stale")));
    let mut stale_aged = false;
    if let Some(stale) = &stale {
        std::fs::create_dir(stale).unwrap();
        let old = nix::sys::time::TimeVal::new(1_000_000_000, 0);
        stale_aged = nix::sys::stat::utimes(stale, &old, &old).is_ok()
            && std::fs::metadata(stale).unwrap().mtime() == 1_000_000_000;
    }

    let rt_path = runtime.path().to_owned();
    let server = Server::start(|c| c.runtime_dir = Some(rt_path));
    let mut c = server.client();
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    assert_eq!(c.recv()["result"]["ok"], true, "the sweep ran before serving");
    if !leaves.is_empty() {
        // (No status at all: another test's engine reaped it as an
        // orphan; it ended long before its `sleep`, so it was killed too.)
        let status = wait_child(&mut orphan);
        assert!(
            matches!(status, (_, Some(libc::SIGKILL)) | (None, None)),
            "the leftover process was killed: {status:?}"
        );
        assert!(common::procs_with(&mark).is_empty());
    } else {
        println!("SKIP: no cgroup hierarchy here; the swept leftover's kill not checked");
        let _ = orphan.kill();
        wait_child(&mut orphan);
    }
    for leaf in &leaves {
        assert!(!leaf.exists(), "{} removed", leaf.display());
    }
    assert!(!run_dir.exists());
    assert!(outside.path().join("keep").exists(), "symlink not followed");
    if let Some(stale) = stale {
        if stale_aged {
            assert!(!stale.exists(), "old empty leaf removed");
        } else {
            println!("SKIP: cannot age a cgroup's mtime here; old-leaf sweep not checked");
            let _ = std::fs::remove_dir(stale);
        }
    }
}

/// The real binary: `serve --config`, a ping and a metrics call (with the
/// process collector), then SIGTERM: exit 0, the socket node removed, and
/// the watchdog gone at once (the executor told it the end was normal; it
/// does not wait on the users lock this test holds as another instance
/// would, and the runs tmpfs that instance still uses stays mounted).
#[test]
fn binary_serves_until_sigterm() {
    if !can_run() {
        return;
    }
    let root = dir_0755();
    let runtime = dir_0755();
    let (socket, config) = serve_config(root.path(), runtime.path());
    let mut spawned = spawn_serve(&config, std::process::Stdio::piped());
    let child = &mut spawned.0;
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let mut c = Client::connect(&socket);
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    assert_eq!(c.recv()["result"]["ok"], true);
    // The probes of the wait above count until the server sees them close.
    let mut text = String::new();
    wait_for("only this connection", Duration::from_secs(5), || {
        c.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "metrics"}));
        text = c.recv()["result"]["text"].as_str().unwrap().to_owned();
        sample(&text, "ongrid_executor_connections") == 1.0
    });
    assert!(text.contains("process_cpu_seconds_total"), "{text}");
    drop(c);
    let runs = runtime.path().join("runs");
    let guard = std::fs::read_dir(&runs)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("ex-"))
        .map(|e| std::fs::read_to_string(e.path().join(".guard")).unwrap())
        .expect("an instance directory");
    let watchdog: i32 = guard.split_whitespace().next().unwrap().parse().unwrap();
    assert!(
        executor::host::sweep::start_time(watchdog).is_some(),
        "watchdog {watchdog} not running"
    );
    let other_user = users_lock_shared(runtime.path());
    sigterm(child);
    let exit = wait_child(child);
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert_eq!(exit, (Some(0), None), "{log}");
    assert!(log.contains("serving on"), "{log}");
    assert!(!socket.exists(), "socket removed at exit");
    wait_for("the watchdog to exit", Duration::from_millis(1500), || {
        executor::host::sweep::start_time(watchdog).is_none()
    });
    assert!(std::fs::read_dir(&runs).unwrap().next().is_none(), "instance directory left");
    assert!(mounted(&runs), "unmounted under another user");
    drop(other_user);
    nix::mount::umount(&runs).unwrap();
}

/// A shared lock on the runtime directory's users lock, as another
/// executor instance holds it.
fn users_lock_shared(runtime: &Path) -> nix::fcntl::Flock<std::fs::File> {
    let f = std::fs::File::open(runtime.join(".runs-users.lock")).unwrap();
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock)
        .map_err(|(_, e)| e)
        .unwrap()
}

fn mounted(path: &Path) -> bool {
    let Ok(path) = std::fs::canonicalize(path) else { return false };
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == path.to_str())
}

/// SIGKILL of the real `serve` mid-run: the watchdog kills the run's whole
/// tree (a stopped child too), removes its cgroups and directory, and
/// unmounts the runs tmpfs once no one else uses it. Here "someone else"
/// is this test, holding the users lock as another instance would, or as
/// the dying executor does for a moment after the kernel closed the pipe
/// that woke the watchdog: the mount stays while it is held, and goes when
/// it is let go within the watchdog's patience.
#[test]
fn killed_binary_takes_its_runs_with_it() {
    if !can_run() {
        return;
    }
    let root = dir_0755();
    let runtime = dir_0755();
    let (socket, config) = serve_config(root.path(), runtime.path());
    let mark = marker(9);
    let m = skill(
        root.path(),
        "stubborn",
        "safe",
        60,
        &format!(
            "trap '' TERM\necho started >&2\n/bin/sh -c 'kill -STOP $$; exec sleep 1' {mark} &\n\
             exec sleep {mark}"
        ),
    );
    let mut spawned = spawn_serve(&config, std::process::Stdio::null());
    let child = &mut spawned.0;
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let runs = runtime.path().join("runs");
    assert!(mounted(&runs), "no tmpfs on {}", runs.display());
    let (h, _) = executor::sandbox::cgroup::Hierarchies::detect();
    let instance = std::fs::read_dir(&runs)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .find(|n| n.to_string_lossy().starts_with("ex-"))
        .expect("an instance directory");
    let parents: Vec<PathBuf> = [&h.v2, &h.v1_pids, &h.v1_memory]
        .into_iter()
        .flatten()
        .map(|b| b.join(&instance))
        .collect();
    assert!(parents.iter().all(|p| p.is_dir()), "{parents:?}");
    let other_user = users_lock_shared(runtime.path());
    let mut c = Client::connect(&socket);
    c.execute(1, &m, json!({}));
    assert_eq!(c.recv()["params"]["line"], "started");
    wait_for("both processes", Duration::from_secs(5), || common::procs_with(&mark).len() == 2);
    child.kill().unwrap();
    wait_child(child);
    wait_for("the run's tree to die", Duration::from_secs(10), || {
        common::procs_with(&mark).is_empty()
    });
    wait_for("the instance directory to be removed", Duration::from_secs(2), || {
        std::fs::read_dir(&runs).is_ok_and(|mut d| d.next().is_none())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(mounted(&runs), "unmounted while another user holds the lock");
    drop(other_user);
    wait_for("the runs tmpfs to be unmounted", Duration::from_secs(5), || !mounted(&runs));
    let left: Vec<_> = parents.iter().filter(|p| p.exists()).collect();
    assert!(left.is_empty(), "instance cgroups left: {left:?}");
}

/// An instance whose guard is dead (its watchdog was killed too) is swept
/// by the next engine: its processes killed, cgroups and directory removed;
/// a live instance's are left alone.
#[test]
fn next_engine_sweeps_dead_instances_only() {
    if !can_run() {
        return;
    }
    let runtime = dir_0755();
    let runs = runtime.path().join("runs");
    let (h, _) = executor::sandbox::cgroup::Hierarchies::detect();
    let mark = marker(10);
    let mut orphan = std::process::Command::new("sleep").arg(&mark).spawn().unwrap();
    let dead = format!("ex-dead{:08x}", std::process::id());
    let live = format!("ex-live{:08x}", std::process::id());
    let me = std::fs::read_to_string("/proc/self/stat").unwrap();
    let start = me[me.rfind(')').unwrap() + 1..].split_whitespace().nth(19).unwrap().to_owned();
    for (name, guard) in
        [(&dead, "999999999 1".to_owned()), (&live, format!("{} {start}", std::process::id()))]
    {
        let dir = runs.join(name);
        std::fs::create_dir_all(dir.join("0123456789abcdef")).unwrap();
        std::fs::write(dir.join(".guard"), guard).unwrap();
    }
    let mut leaves = Vec::new();
    for base in [&h.v2, &h.v1_pids, &h.v1_memory].into_iter().flatten() {
        for name in [&dead, &live] {
            let leaf = base.join(name).join("r1");
            std::fs::create_dir_all(&leaf).unwrap();
            if name == &dead {
                std::fs::write(leaf.join("cgroup.procs"), orphan.id().to_string()).unwrap();
            }
            leaves.push(leaf);
        }
    }
    let config = Config { runtime_dir: Some(runtime.path().to_owned()), ..Config::default() };
    let engine = Engine::new(config).unwrap();
    // (Another test's engine in this process may reap the orphan first.)
    if leaves.is_empty() {
        println!("SKIP: no cgroup hierarchy here; dead instances' leaves not checked");
    } else {
        wait_for("the dead instance's process to die", Duration::from_secs(2), || {
            common::procs_with(&mark).is_empty()
        });
    }
    let _ = orphan.kill();
    let _ = orphan.wait();
    // (The runs tmpfs now hides the directories; they are checked below.)
    for leaf in &leaves {
        let is_dead = leaf.parent().unwrap().ends_with(&dead);
        assert_eq!(leaf.exists(), !is_dead, "{}", leaf.display());
        assert_eq!(leaf.parent().unwrap().exists(), !is_dead, "{}", leaf.display());
    }
    drop(engine);
    assert!(!mounted(&runs), "runs tmpfs left mounted");
    assert!(!runs.join(&dead).exists(), "dead instance directory left");
    assert!(runs.join(&live).join("0123456789abcdef").exists(), "live instance swept");
    for leaf in &leaves {
        let _ = std::fs::remove_dir(leaf);
        let _ = std::fs::remove_dir(leaf.parent().unwrap());
    }
    let _ = std::fs::remove_dir_all(runs.join(&live));
}
