//! Faults, beyond `restart` and `cancel`: the executor
//! SIGKILLed mid-run (its watchdog kills the runs; with the watchdog gone
//! too, the next executor sweeps what was left), ongrid-skilld SIGKILLed
//! mid-run, the audit database on a full and on a read-only file system
//! or unusable (not a database, no folder: `/v1/health` says so),
//! the executor's socket removed or replaced, and a pack changed between
//! the scan and the run.

use std::fs;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

use crate::cancel::stream_with_pid;
use crate::harness::{eventually, process_alive, process_running, temp_dir, write_skill, Stack};

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A skill that prints its pid and the pid of a background child (a
/// grandchild of the executor that no parent-death signal reaches), then
/// sleeps: `pid=<main> child=<bg>`.
fn write_forker(s: &Stack) {
    write_skill(
        &s.skills,
        "forker",
        r#","timeout_seconds":60"#,
        "/bin/sleep 40 &\necho \"child=$! pid=$$\" >&2\nexec /bin/sleep 30",
    );
    let r = s.post("/v1/reload", &json!({}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// Starts `forker` as a stream and returns (main pid, background pid,
/// the thread reading the rest of the answer).
fn start_forker(s: &Stack) -> (i32, i32, std::thread::JoinHandle<String>) {
    let socket = s.socket.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let run = std::thread::spawn(move || stream_with_pid(&socket, "forker", &tx));
    let main = rx.recv_timeout(Duration::from_secs(20)).expect("forker started");
    // The background sleep is the main process's child.
    let mut bg = None;
    assert!(eventually(Duration::from_secs(5), || {
        bg = children_of(main).split_whitespace().filter_map(|p| p.parse().ok()).next();
        bg.is_some()
    }));
    (main, bg.unwrap(), run)
}

fn children_of(pid: i32) -> String {
    let mut out = String::new();
    for t in fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        out.push_str(&fs::read_to_string(t.path().join("children")).unwrap_or_default());
        out.push(' ');
    }
    out
}

/// The executor instance directories under the stack's runs dir.
fn instances(s: &Stack) -> Vec<PathBuf> {
    fs::read_dir(s.base.join("run/runs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("ex-")))
        .collect()
}

/// cgroup directories of instance `name` in every hierarchy.
fn cgroups(name: &str) -> Vec<PathBuf> {
    fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|h| h.path().join("ongrid").join(name))
        .filter(|p| p.is_dir())
        .collect()
}

fn assert_executor_503(s: &Stack, started: Instant) -> String {
    let r = s.execute("echo", &json!({"n": 1}));
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    let body = r.json();
    assert_eq!(body["error"]["code"], "executor_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(
        message.contains(&s.executor_socket.display().to_string()),
        "the message names the socket: {message}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "503 took {:?}", started.elapsed());
    message
}

/// SIGKILL of the executor alone: its watchdog kills every process of its
/// runs (the background grandchild too) and removes the instance's
/// directory and cgroups before any new executor starts; skilld answers
/// 503 naming the socket, then runs again once a new executor is up.
#[test]
fn executor_sigkill_the_watchdog_kills_the_runs() {
    if !root() {
        eprintln!("SKIP executor_sigkill_the_watchdog_kills_the_runs: needs root (cgroups)");
        return;
    }
    let mut s = Stack::start();
    write_forker(&s);
    let (main, bg, run) = start_forker(&s);
    let instance = instances(&s).pop().expect("instance dir");
    let name = instance.file_name().unwrap().to_string_lossy().into_owned();
    assert!(!cgroups(&name).is_empty(), "instance cgroups exist");
    // Both are their `sleep` (past the exec) before the kill, so that their
    // absence after it is the watchdog's doing.
    let sleeping = || process_alive(main, "sleep") && process_alive(bg, "sleep");
    assert!(eventually(Duration::from_secs(5), sleeping), "the run's two sleeps never ran");
    s.stop_executor(Signal::SIGKILL);
    for pid in [main, bg] {
        assert!(
            eventually(Duration::from_secs(5), || !process_alive(pid, "sleep")),
            "{pid} outlived the executor (no restart yet)\n{}",
            s.logs()
        );
    }
    let rest = run.join().unwrap();
    assert!(rest.contains("\"event\":\"error\""), "the stream ends with an error: {rest}");
    assert!(rest.contains("executor"), "{rest}");
    assert!(
        eventually(Duration::from_secs(5), || !instance.exists() && cgroups(&name).is_empty()),
        "the watchdog left {} or cgroups {:?}",
        instance.display(),
        cgroups(&name)
    );
    let message = assert_executor_503(&s, Instant::now());
    assert!(message.contains("unreachable"), "{message}");
    s.start_executor();
    let r = s.execute("echo", &json!({"n": 2}));
    assert_eq!(r.status, 200, "skilld reconnects: {}", String::from_utf8_lossy(&r.body));
}

/// SIGKILL of the executor and of its watchdog together: the runs' main
/// processes die with the executor (parent-death signal), the background
/// grandchild and the instance's directory and cgroups stay until the next
/// executor starts and sweeps them. (The killed watchdog stays a zombie
/// here, where PID 1 does not reap: the sweep must not take it for alive.)
#[test]
fn executor_and_watchdog_sigkill_the_next_executor_sweeps() {
    if !root() {
        eprintln!("SKIP executor_and_watchdog_sigkill_the_next_executor_sweeps: needs root");
        return;
    }
    let mut s = Stack::start();
    write_forker(&s);
    let (main, bg, run) = start_forker(&s);
    let instance = instances(&s).pop().expect("instance dir");
    let name = instance.file_name().unwrap().to_string_lossy().into_owned();
    let executor = i32::try_from(s.executor_pid().unwrap()).unwrap();
    let watchdog: Vec<i32> = children_of(executor)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|p| process_alive(*p, "watchdog"))
        .collect();
    assert_eq!(watchdog.len(), 1, "one watchdog child of {executor}: {watchdog:?}");
    let _ = kill(Pid::from_raw(watchdog[0]), Signal::SIGKILL);
    let _ = kill(Pid::from_raw(executor), Signal::SIGKILL);
    s.reap_executor();
    assert!(
        eventually(Duration::from_secs(5), || !process_alive(main, "sleep")),
        "main process {main} survived its executor (parent-death signal)"
    );
    let _ = run.join();
    std::thread::sleep(Duration::from_millis(300));
    assert!(process_alive(bg, "sleep"), "the grandchild {bg} is left for the sweep");
    assert!(instance.exists(), "nobody cleaned {} yet", instance.display());
    assert!(!cgroups(&name).is_empty());
    assert_executor_503(&s, Instant::now());
    s.start_executor();
    assert!(
        eventually(Duration::from_secs(10), || !process_alive(bg, "sleep")),
        "the new executor's sweep did not kill {bg}\n{}",
        s.logs()
    );
    assert!(
        eventually(Duration::from_secs(5), || !instance.exists() && cgroups(&name).is_empty()),
        "the sweep left {} or cgroups {:?}",
        instance.display(),
        cgroups(&name)
    );
    let r = s.execute("echo", &json!({"n": 3}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// SIGKILL of ongrid-skilld mid-run: the executor sees the connection
/// close and kills the run; the executor carries on.
#[test]
fn skilld_sigkill_the_executor_kills_its_runs() {
    let mut s = Stack::start();
    let socket = s.socket.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let run = std::thread::spawn(move || stream_with_pid(&socket, "sleeper", &tx));
    let pid = rx.recv_timeout(Duration::from_secs(20)).expect("sleeper started");
    assert!(process_running(pid), "sleeper {pid} running");
    s.kill_skilld();
    let _ = run.join();
    assert!(
        eventually(Duration::from_secs(5), || !process_alive(pid, "sleep")),
        "sleeper {pid} outlived ongrid-skilld\n{}",
        s.logs()
    );
    let executor = s.executor_pid().unwrap();
    assert!(process_alive(i32::try_from(executor).unwrap(), "ongrid-executor"));
}

/// A tmpfs mounted for one test, unmounted (lazily) when dropped.
struct Tmpfs(PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl Tmpfs {
    fn mount(options: &str) -> Self {
        let (tmp, dir) = temp_dir("ongrid-e2e-fs-");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "ongrid-e2e"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs {options}");
        Tmpfs(dir, tmp)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn audit_errors(s: &Stack) -> u64 {
    let text = s.scrape();
    text.lines()
        .find_map(|l| l.strip_prefix("ongrid_audit_write_errors_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn assert_audit_503(s: &Stack, what: &str) {
    let r = s.execute("echo", &json!({"n": 1}));
    assert_eq!(r.status, 503, "{what}: {}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], "audit_unavailable", "{what}");
    let message = r.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("audit"), "{what}: {message}");
}

/// The audit database on a file system that fills up while the daemon
/// runs, then on one mounted read-only: runs are refused with 503
/// `audit_unavailable` and every failed write counts in
/// `ongrid_audit_write_errors_total`; once space is back, runs work.
#[test]
fn audit_on_a_full_or_read_only_file_system_refuses_runs() {
    if !root() {
        eprintln!("SKIP audit_on_a_full_or_read_only_file_system_refuses_runs: needs root (mount)");
        return;
    }
    let fs_full = Tmpfs::mount("size=2m,mode=0755");
    let db = fs_full.0.join("audit.db");
    let q = |p: &Path| serde_json::Value::String(p.display().to_string()).to_string();
    let s = Stack::start_with("", &format!("audit_db = {}\n", q(&db)));
    let r = s.execute("echo", &json!({"n": 1}));
    assert_eq!(r.status, 200, "audit on the tmpfs works: {}", String::from_utf8_lossy(&r.body));
    let before = audit_errors(&s);
    // Fill the file system.
    let fill = fs_full.0.join("fill");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=64k", "count=100"])
        .arg(format!("of={}", fill.display()))
        .stderr(std::process::Stdio::null())
        .status();
    // A few runs: the first ones may still fit in pages the WAL holds.
    let mut refused = false;
    for _ in 0..20 {
        let r = s.execute("echo", &json!({"n": 2}));
        if r.status == 503 {
            assert_eq!(r.json()["error"]["code"], "audit_unavailable");
            refused = true;
            break;
        }
        // A run whose decision still fit and whose completion did not:
        // it ran, so it is not answered as refused.
        if r.status == 500 {
            assert_eq!(r.json()["error"]["code"], "audit_incomplete");
            continue;
        }
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    assert!(refused, "runs go on with a full audit file system\n{}", s.logs());
    assert_audit_503(&s, "full");
    assert_health_audit_unavailable(&s, "full", "full");
    assert!(audit_errors(&s) > before, "ongrid_audit_write_errors_total did not grow");
    fs::remove_file(&fill).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || s.execute("echo", &json!({"n": 3})).status == 200),
        "runs do not come back once space is free\n{}",
        s.logs()
    );
    assert_health_ok(&s, "space back");
    drop(s);

    let fs_ro = Tmpfs::mount("size=1m,mode=0755,ro");
    let s = Stack::start_with("", &format!("audit_db = {}\n", q(&fs_ro.0.join("audit.db"))));
    assert_audit_503(&s, "read-only");
    assert_audit_503(&s, "read-only");
    assert_health_audit_unavailable(&s, "read-only", "audit.db");
    assert!(audit_errors(&s) >= 2, "ongrid_audit_write_errors_total");
    assert!(s.logs().contains("audit"), "{}", s.logs());
}

/// `/v1/health` with the audit unusable: 200 (as with the executor
/// down), `status` `degraded`, `audit` `unavailable` and why, naming
/// `cause`.
fn assert_health_audit_unavailable(s: &Stack, what: &str, cause: &str) {
    let r = s.get("/v1/health");
    assert_eq!(r.status, 200, "{what}");
    let h = r.json();
    assert_eq!(h["status"], "degraded", "{what}: {h}");
    assert_eq!(h["audit"], "unavailable", "{what}: {h}");
    assert_eq!(h["executor"], "up", "{what}: {h}");
    let why = h["audit_error"].as_str().unwrap_or_default();
    assert!(why.contains(cause), "{what}: {h}");
}

fn assert_health_ok(s: &Stack, what: &str) {
    let h = s.get("/v1/health").json();
    assert_eq!((&h["status"], &h["audit"]), (&json!("ok"), &json!("ok")), "{what}: {h}");
}

/// An audit database that cannot be used at all (a file that is not a
/// database, a folder that does not exist): every run is refused 503
/// `audit_unavailable`, and `/v1/health` says so instead of `ok`; once
/// the file or folder is fixed, health and runs are back, no restart.
#[test]
fn an_unusable_audit_database_is_reported_by_health() {
    let (_tmp, dir) = temp_dir("ongrid-e2e-audit-");
    let q = |p: &Path| serde_json::Value::String(p.display().to_string()).to_string();
    let corrupt = dir.join("corrupt.db");
    fs::write(&corrupt, vec![b'x'; 8192]).unwrap();
    let missing = dir.join("missing").join("audit.db");
    for (db, what, cause) in
        [(&corrupt, "corrupt file", "not a database"), (&missing, "missing folder", "missing")]
    {
        let s = Stack::start_with("", &format!("audit_db = {}\n", q(db)));
        assert_audit_503(&s, what);
        assert_health_audit_unavailable(&s, what, cause);
        if db == &corrupt {
            fs::remove_file(db).unwrap();
        } else {
            fs::create_dir(db.parent().unwrap()).unwrap();
        }
        assert_health_ok(&s, what);
        let r = s.execute("echo", &json!({"n": 1}));
        assert_eq!(r.status, 200, "{what}: {}", String::from_utf8_lossy(&r.body));
    }
}

/// The executor's socket removed, replaced by a regular file, or by a
/// socket nobody listens on: each run gets a 503 naming the socket at
/// once; after the executor is restarted runs work.
#[test]
fn executor_socket_removed_or_replaced_is_a_quick_503() {
    let mut s = Stack::start();
    let sock = s.executor_socket.clone();
    fs::remove_file(&sock).unwrap();
    let m = assert_executor_503(&s, Instant::now());
    assert!(m.contains("No such file"), "removed: {m}");
    fs::write(&sock, b"not a socket").unwrap();
    let m = assert_executor_503(&s, Instant::now());
    assert!(m.contains("refused"), "regular file: {m}");
    fs::remove_file(&sock).unwrap();
    // A socket node whose listener is gone.
    drop(UnixListener::bind(&sock).unwrap());
    let m = assert_executor_503(&s, Instant::now());
    assert!(m.contains("refused"), "dead socket: {m}");
    assert_eq!(s.get("/v1/health").json()["executor"], "down");
    s.stop_executor(Signal::SIGTERM);
    s.start_executor();
    let r = s.execute("echo", &json!({"n": 4}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// A pack changed after the scan: its entry swapped for a symlink, or its
/// folder deleted. The run is refused (`rejected`), nothing crashes.
#[test]
fn pack_changed_between_scan_and_run_is_rejected() {
    let mut s = Stack::start();
    let (_outside_tmp, outside) = temp_dir("ongrid-e2e-outside-");
    write_skill(&outside, "evil", "", "echo '{\"escaped\":true}'");
    write_skill(&s.skills, "swapped", "", "echo '{\"fine\":true}'");
    write_skill(&s.skills, "deleted", "", "echo '{\"fine\":true}'");
    let r = s.post("/v1/reload", &json!({}));
    assert_eq!(r.status, 200);
    for name in ["swapped", "deleted"] {
        let r = s.execute(name, &json!({}));
        assert_eq!(r.json()["outcome"], "ok", "{name} before the change: {}", r.json());
    }
    let entry = s.skills.join("swapped/run");
    fs::remove_file(&entry).unwrap();
    std::os::unix::fs::symlink(outside.join("evil/run"), &entry).unwrap();
    fs::remove_dir_all(s.skills.join("deleted")).unwrap();
    for name in ["swapped", "deleted"] {
        let r = s.execute(name, &json!({}));
        let body = r.json();
        assert_eq!(body["outcome"], "rejected", "{name}: HTTP {} {body}", r.status);
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{name}: {body}");
        assert!(body["result"].is_null(), "{name}: {body}");
    }
    assert!(s.both_alive(), "{}", s.logs());
    let r = s.execute("echo", &json!({"n": 5}));
    assert_eq!(r.status, 200);
}

/// Two valid packs swapped, and a schema edited in place, without a
/// reload: a request checked against skilld's reading of one skill never
/// runs another manifest (another skill, args its schema refuses, an
/// audit row naming the wrong skill); after a reload both run again.
#[test]
fn a_pack_swapped_or_edited_after_the_scan_is_not_run_under_the_old_reading() {
    let s = Stack::start();
    let schema = |max: u32| {
        format!(
            r#","schema":{{"type":"object","properties":{{"n":{{"type":"integer","maximum":{max}}}}}}}"#
        )
    };
    write_skill(&s.skills, "alpha", &schema(5), "echo '{\"who\":\"alpha\"}'");
    write_skill(&s.skills, "beta", &schema(500), "echo '{\"who\":\"beta\"}'");
    write_skill(&s.skills, "gamma", &schema(5), "exec /bin/cat");
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    let r = s.execute("alpha", &json!({"n": 1}));
    assert_eq!(r.json()["result"], json!({"who": "alpha"}), "{}", r.json());

    // The folders swapped: each name now holds the other's manifest.
    let tmp = s.skills.join("swap-tmp");
    fs::rename(s.skills.join("alpha"), &tmp).unwrap();
    fs::rename(s.skills.join("beta"), s.skills.join("alpha")).unwrap();
    fs::rename(&tmp, s.skills.join("beta")).unwrap();
    // gamma's maximum raised in place: skilld still holds 5.
    let gamma = s.skills.join("gamma/skill.json");
    let text = fs::read_to_string(&gamma).unwrap().replace("\"maximum\":5", "\"maximum\":50");
    fs::write(&gamma, text).unwrap();
    for (name, n) in [("alpha", 1), ("beta", 200), ("gamma", 3)] {
        let r = s.execute(name, &json!({ "n": n }));
        let body = r.json();
        assert_eq!(body["outcome"], "rejected", "{name}: HTTP {} {body}", r.status);
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains("changed since the loader read it"), "{name}: {body}");
        assert!(body["result"].is_null(), "{name}: {body}");
    }
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    // A skill's name is its manifest's: each is found in its new folder.
    for (name, n) in [("alpha", 1), ("beta", 200)] {
        let r = s.execute(name, &json!({ "n": n }));
        assert_eq!(r.json()["result"], json!({ "who": name }), "{}", r.json());
    }
    let r = s.execute("gamma", &json!({"n": 50}));
    assert_eq!(r.json()["result"], json!({"n": 50}), "{}", r.json());
}

/// The field `key` (hex mask) of a `/proc/.../status` text.
fn status_mask(status: &str, key: &str) -> u64 {
    let hex = status.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_default().trim();
    u64::from_str_radix(hex, 16).unwrap_or_default()
}

/// Every thread of the executor blocks SIGCHLD, so its runs' exits leave
/// the signal pending for the process instead of waking a thread only to
/// drop it (one wake-up per run, measured); the runs still end and report
/// as before.
#[test]
fn the_executor_blocks_sigchld_and_runs_still_end() {
    let s = Stack::start();
    for n in 0..3 {
        let r = s.execute("echo", &json!({ "n": n }));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let executor = s.executor_pid().unwrap();
    let sigchld = 1u64 << (libc::SIGCHLD - 1);
    let tasks = fs::read_dir(format!("/proc/{executor}/task")).unwrap();
    let mut threads = 0;
    for task in tasks.flatten() {
        let status = fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if status.is_empty() {
            continue; // a thread that ended meanwhile
        }
        threads += 1;
        assert_ne!(status_mask(&status, "SigBlk:") & sigchld, 0, "{status}");
    }
    assert!(threads >= 4, "{threads} threads");
    let status = fs::read_to_string(format!("/proc/{executor}/status")).unwrap();
    assert_ne!(
        status_mask(&status, "ShdPnd:") & sigchld,
        0,
        "runs' exits left it pending: {status}"
    );
}

/// An executor whose run-as user does not exist (a host without the
/// package's sysusers entry) says so when it starts, not only in each
/// run's report; every run is then `sandbox_failed`, naming the user.
#[test]
fn a_missing_run_as_user_is_named_at_start_and_in_each_report() {
    if !root() {
        println!("SKIP a_missing_run_as_user_is_named_at_start_and_in_each_report: needs root");
        return;
    }
    let s = Stack::start_with("run_as = \"ongrid-e2e-no-such-user\"\n", "");
    let warned = "run-as user \"ongrid-e2e-no-such-user\" does not exist: every run as it fails";
    assert!(s.logs().contains(warned), "no start-up warning:\n{}", s.logs());
    let r = s.execute("echo", &json!({"n": 1}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let report = r.json();
    assert_eq!(report["outcome"], "sandbox_failed", "{report}");
    assert!(
        report["error"].as_str().is_some_and(|e| e.contains("\"ongrid-e2e-no-such-user\"")),
        "{report}"
    );
}
