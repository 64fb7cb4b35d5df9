//! Warm runs served: idle warm runs hold run slots (a request that finds
//! none free takes one's slot, and the cap holds), and on SIGTERM the
//! idle ones are killed at once while a run taken from the pool is
//! drained as any other.

use std::collections::BTreeSet;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use policy::SkillGrant;
use serde_json::{json, Value};

use crate::support::*;

/// The `warm` answer for `skill` over a connection of its own.
fn pool(socket: &Path, skill: &str) -> Value {
    let mut c = Client::connect(socket);
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "warm", "params": {"skill": skill}}));
    c.recv()["result"].clone()
}

/// The shells running a script under `dir` that have a child (blocked in
/// the `cat` reading their args; a shell's child between its fork and its
/// exec has the shell's command line and no child), zombies aside, `but`
/// left out.
fn shells_under(dir: &Path, but: &[i32]) -> BTreeSet<i32> {
    let has_child = |pid: i32| {
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"));
        children.is_ok_and(|c| !c.trim().is_empty())
    };
    crate::common::procs_with(&dir.display().to_string())
        .into_iter()
        .filter(|p| p.state != 'Z' && !but.contains(&p.pid) && has_child(p.pid))
        .map(|p| p.pid)
        .collect()
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()))
        .is_some_and(|state| state != 'Z')
}

/// A skills root and a runtime dir (0755) and a `serve` configuration in
/// it ending with `extra`: the dirs, the socket's path, the
/// configuration's.
fn config_with(extra: &str) -> (tempfile::TempDir, tempfile::TempDir, PathBuf, PathBuf) {
    let (root, runtime) = (dir_0755(), dir_0755());
    let (socket, config) = serve_config(root.path(), runtime.path());
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(extra);
    std::fs::write(&config, text).unwrap();
    (root, runtime, socket, config)
}

/// A server with two run slots and two queue places, `pool` granted one
/// warm run: `pool`'s manifest (a skill that reads its args and answers
/// `{}`), `long`'s (one that answers once `go` exists) and `go`; `None`
/// where the sandbox cannot run.
fn two_slots() -> Option<(Server, PathBuf, PathBuf, PathBuf)> {
    if !can_run() {
        return None;
    }
    let server = Server::start(|c| {
        c.max_concurrent_runs = 2;
        c.max_queued_runs = 2;
        c.skills.insert("pool".into(), SkillGrant { warm: 1, ..SkillGrant::default() });
    });
    let warm = skill(&server.root, "pool", "safe", 5, "cat >/dev/null\necho '{}'");
    let go = server.root.join("long").join("go");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done\necho '{{}}'", go.display());
    let long = skill(&server.root, "long", "safe", 20, &script);
    Some((server, warm, long, go))
}

/// An idle warm run holds one of the `max_concurrent_runs` slots: with
/// both slots taken (one by a warm run, one by a run), a second run does
/// not queue but kills the idle warm run for its slot; the pool is not
/// made again while every slot is busy, and a third run queues.
#[test]
fn idle_warm_runs_hold_run_slots() {
    let Some((server, warm, long, go)) = two_slots() else { return };
    let warm_dir = warm.parent().unwrap().to_owned();
    let mut c = server.client();
    c.execute(1, &warm, json!({}));
    assert_eq!(c.run_result().1["result"]["warm"], false, "the first run is a miss");
    wait_for("the pool to fill", Duration::from_secs(10), || {
        pool(&server.socket, "pool")["idle"] == 1 && shells_under(&warm_dir, &[]).len() == 1
    });
    let idle = shells_under(&warm_dir, &[]);
    let mut a = server.client();
    a.execute(2, &long, json!({}));
    server.wait_in_flight(1);
    // Both slots are taken: the warm run's and A's.
    let mut b = server.client();
    b.execute(3, &long, json!({}));
    server.wait_in_flight(2);
    assert_eq!(server.metrics.runs_queued.get(), 0, "B queued behind an idle warm run");
    wait_for("the idle warm run to be killed", Duration::from_secs(5), || {
        idle.iter().all(|&pid| !alive(pid))
    });
    std::thread::sleep(Duration::from_millis(600));
    let p = pool(&server.socket, "pool");
    assert_eq!((p["idle"].clone(), p["discarded"].clone()), (json!(0), json!(1)), "{p}");
    assert!(shells_under(&warm_dir, &[]).is_empty(), "a warm run made over the cap");
    let mut d = server.client();
    d.execute(4, &long, json!({}));
    let v = d.recv();
    assert_eq!((&v["method"], &v["params"]["id"]), (&json!("queued"), &json!(4)), "{v}");
    std::fs::write(&go, "").unwrap();
    for (client, id) in [(&mut a, 2), (&mut b, 3)] {
        let (_, v) = client.run_result();
        assert_eq!((v["id"].clone(), v["result"]["outcome"].clone()), (json!(id), json!("ok")));
    }
    let (_, v) = d.run_result();
    assert_eq!(v["method"], "started", "{v}");
    let (_, v) = d.run_result();
    assert_eq!(v["result"]["outcome"], "ok", "{v}");
    wait_for("the pool to fill again", Duration::from_secs(10), || {
        pool(&server.socket, "pool")["idle"] == 1
    });
}

/// A run of a warm-granted skill that finds every slot taken, one by an
/// idle warm run of its own skill, takes that run and its slot: it is not
/// evicted, and the run is warm.
#[test]
fn at_the_cap_a_run_takes_its_own_skills_warm_run() {
    let Some((server, warm, long, go)) = two_slots() else { return };
    let mut c = server.client();
    c.execute(1, &warm, json!({}));
    assert_eq!(c.run_result().1["result"]["warm"], false, "the first run is a miss");
    wait_for("the pool to fill", Duration::from_secs(10), || {
        pool(&server.socket, "pool")["idle"] == 1
    });
    let mut a = server.client();
    a.execute(2, &long, json!({}));
    server.wait_in_flight(1);
    // Both slots are taken: the warm run's and A's.
    c.execute(3, &warm, json!({}));
    let (_, v) = c.run_result();
    let r = &v["result"];
    assert_eq!((r["outcome"].clone(), r["warm"].clone()), (json!("ok"), json!(true)), "{v}");
    let p = pool(&server.socket, "pool");
    assert_eq!((p["hits"].clone(), p["discarded"].clone()), (json!(1), json!(0)), "{p}");
    std::fs::write(&go, "").unwrap();
    let (_, v) = a.run_result();
    assert_eq!(v["result"]["outcome"], "ok", "{v}");
    wait_for("the pool to fill again", Duration::from_secs(10), || {
        pool(&server.socket, "pool")["idle"] == 1
    });
}

/// The binary under SIGTERM with a warm pool: the idle warm runs are gone
/// within a second (by pid), while a run taken from the pool before the
/// signal runs to its end and reports; then the executor exits 0.
#[test]
fn sigterm_kills_idle_warm_runs_and_drains_a_taken_one() {
    sigterm_with_a_warm_pool("");
}

/// As [`sigterm_kills_idle_warm_runs_and_drains_a_taken_one`] for a skill
/// granted the host's `/proc`, whose runs no spawner thread creates: the
/// pools' thread is their parent, and their parent-death signal fires when
/// it exits, so it stays until the drain is over.
#[test]
fn sigterm_drains_a_taken_warm_run_the_pools_thread_created() {
    sigterm_with_a_warm_pool("proc = \"host\"\n");
}

/// The SIGTERM case with `grant` added to the pool's grant.
fn sigterm_with_a_warm_pool(grant: &str) {
    if !can_run() {
        return;
    }
    let (root, _runtime, socket, config) =
        config_with(&format!("[skills.pool]\nwarm = 2\n{grant}"));
    let go = root.path().join("pool").join("go");
    let script = format!(
        "args=$(cat)\necho \"pid $$\" >&2\ncase $args in *wait*)\n\
         while [ ! -e {} ]; do sleep 0.05; done ;;\nesac\necho '{{}}'",
        go.display()
    );
    let manifest = skill(root.path(), "pool", "safe", 20, &script);
    let dir = manifest.parent().unwrap().to_owned();
    let mut spawned = spawn_serve(&config, std::process::Stdio::null());
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let mut c = Client::connect(&socket);
    c.execute(1, &manifest, json!({}));
    assert_eq!(c.run_result().1["result"]["warm"], false, "the first run is a miss");
    let full = || pool(&socket, "pool")["idle"] == 2;
    wait_for("the pool to fill", Duration::from_secs(10), full);
    // A run taken from the pool, in flight until `go` exists.
    let mut a = Client::connect(&socket);
    a.execute(2, &manifest, json!({"wait": true}));
    let v = a.recv();
    let line = v["params"]["line"].as_str().unwrap_or_default();
    let taken: i32 = line.strip_prefix("pid ").and_then(|p| p.parse().ok()).expect("its pid");
    wait_for("the pool to fill again", Duration::from_secs(10), || {
        full() && shells_under(&dir, &[taken]).len() == 2
    });
    let idle = shells_under(&dir, &[taken]);
    let signalled = Instant::now();
    sigterm(&spawned.0);
    wait_for("the idle warm runs to be killed", Duration::from_secs(1), || {
        idle.iter().all(|&pid| !alive(pid))
    });
    let gone_after = signalled.elapsed();
    assert!(alive(taken), "the taken run was not drained");
    assert!(matches!(spawned.0.try_wait(), Ok(None)), "the executor did not wait for its run");
    std::fs::write(&go, "").unwrap();
    let (_, v) = a.run_result();
    let r = &v["result"];
    assert_eq!((r["outcome"].clone(), r["warm"].clone()), (json!("ok"), json!(true)), "{v}");
    assert_eq!(wait_child(&mut spawned.0), (Some(0), None));
    assert!(gone_after < Duration::from_secs(1), "{gone_after:?}");
    assert!(shells_under(&dir, &[]).is_empty(), "a warm run outlived the executor");
}

/// An executor that is not root (as `ongrid-skill up` run by a user) runs
/// skills without a cgroup: a warm run it discards is killed with its
/// process group, so what it forked before its args goes with it.
#[test]
fn without_a_cgroup_a_discarded_warm_runs_children_go_with_it() {
    use std::os::unix::fs::PermissionsExt;
    if !can_run() {
        return;
    }
    let nobody = 65534;
    let extra = "allowed_uids = [0]\nlandlock = \"best-effort\"\n[skills.pool]\nwarm = 1\n";
    let (root, runtime, socket, config) = config_with(extra);
    std::os::unix::fs::chown(runtime.path(), Some(nobody), Some(nobody)).unwrap();
    std::fs::set_permissions(runtime.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&config, Some(nobody), Some(nobody)).unwrap();
    // A background sleep named by a number no other process has (ten
    // minutes at most, should it outlive a failed test).
    let marker = format!("sleep 600.{}", std::process::id());
    let script = format!("/bin/{marker} &\ncat >/dev/null\necho '{{}}'");
    let manifest = skill(root.path(), "pool", "safe", 20, &script);
    let mut spawned = spawn_serve_as_nobody(&config);
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let sleeps = || live_with(&marker);
    let mut c = Client::connect(&socket);
    c.execute(1, &manifest, json!({}));
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "ok", "{v}");
    let cgroup = &v["result"]["sandbox"]["cgroup"];
    assert!(cgroup["kill"].is_null() && cgroup["memory"].is_null(), "runs have a cgroup: {v}");
    wait_for("the warm run and its child", Duration::from_secs(10), || {
        pool(&socket, "pool")["idle"] == 1 && sleeps().len() == 1
    });
    let child = sleeps();
    c.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "warm_discard"}));
    let v = c.recv();
    assert_eq!(v["result"]["discarded"], 1, "{v}");
    wait_for("the discarded warm run's child to go with it", Duration::from_secs(5), || {
        child.iter().all(|&pid| !alive(pid))
    });
    sigterm(&spawned.0);
    assert_eq!(wait_child(&mut spawned.0), (Some(0), None));
    wait_for("every child gone", Duration::from_secs(5), || sleeps().is_empty());
}

/// Without a cgroup, a warm run whose main process exits unused (reaped
/// at once by the executor's reaper thread) is discarded with its process
/// group: what it started in the background goes with it.
#[test]
fn without_a_cgroup_a_warm_run_that_exits_unused_takes_its_group_with_it() {
    use std::os::unix::fs::PermissionsExt;
    if !can_run() {
        return;
    }
    let nobody = 65534;
    let extra = "allowed_uids = [0]\nlandlock = \"best-effort\"\n[skills.quitter]\nwarm = 1\n";
    let (root, runtime, socket, config) = config_with(extra);
    std::os::unix::fs::chown(runtime.path(), Some(nobody), Some(nobody)).unwrap();
    std::fs::set_permissions(runtime.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&config, Some(nobody), Some(nobody)).unwrap();
    let marker = format!("sleep 601.{}", std::process::id());
    let manifest = skill(root.path(), "quitter", "safe", 20, &format!("/bin/{marker} &\nexit 0"));
    let mut spawned = spawn_serve_as_nobody(&config);
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let sleeps = || live_with(&marker);
    // The first request runs cold (and answers nothing) and starts the pool.
    let mut c = Client::connect(&socket);
    c.execute(1, &manifest, json!({}));
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "invalid_result", "{v}");
    wait_for("a warm run discarded", Duration::from_secs(10), || {
        pool(&socket, "quitter")["discarded"].as_u64() >= Some(1)
    });
    wait_for("the discarded runs' helpers to go", Duration::from_secs(5), || sleeps().is_empty());
    sigterm(&spawned.0);
    assert_eq!(wait_child(&mut spawned.0), (Some(0), None));
    // The cold run's helper, left by its main process, went with its run.
    assert!(sleeps().is_empty(), "a helper outlived the executor");
}

/// A skill that writes before it reads its args cannot be warm: each warm
/// run of it is discarded, and the executor says so at its default log
/// level (no `ONGRID_LOG`), naming the skill and the rule.
#[test]
fn a_skill_that_writes_first_is_discarded_and_said_at_the_default_level() {
    if !can_run() {
        return;
    }
    let (root, runtime, socket, config) = config_with("[skills.eager]\nwarm = 1\n");
    let manifest = skill(root.path(), "eager", "safe", 5, "echo '{}'");
    let log = runtime.path().join("executor.log");
    let stderr = std::fs::File::create(&log).unwrap().into();
    let mut spawned = spawn_serve_logging(&config, stderr, None);
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let mut c = Client::connect(&socket);
    c.execute(1, &manifest, json!({}));
    assert_eq!(c.run_result().1["result"]["outcome"], "ok", "the cold run");
    wait_for("a discarded warm run", Duration::from_secs(10), || {
        pool(&socket, "eager")["discarded"].as_u64() >= Some(1)
    });
    sigterm(&spawned.0);
    assert_eq!(wait_child(&mut spawned.0), (Some(0), None));
    let text = std::fs::read_to_string(&log).unwrap();
    let said = text.lines().find(|l| l.contains("warm run of \"eager\" discarded"));
    let line = said.unwrap_or_else(|| panic!("no line said it:\n{text}"));
    // It wrote and exited: the exit is named first.
    assert!(line.contains("WARN") && line.contains("before it was taken"), "{line}");
    assert!(line.contains("reads its args before it writes or exits"), "{line}");
}
