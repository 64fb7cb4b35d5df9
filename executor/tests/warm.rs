//! Warm runs through the engine (`run::warm`): an engine granting a skill
//! warm runs, its pool thread on a thread of the test, runs named by path.
//! Root only (the sandbox needs it); as another user each test prints SKIP.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use executor::run::warm::WarmStats;
use executor::{Config, Engine, RunRequest};
use policy::{Outcome, RunReport};
use tokio::sync::Semaphore;

/// A skill folder (0755) with `skill.json` and an executable `run.sh`, in
/// a temporary root.
fn skill(name: &str, timeout: u32, script: &str) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let extra = format!(r#","timeout_seconds":{timeout}"#);
    let pack = testkit::write_pack(root.path(), name, "run.sh", &extra, script);
    (root, pack.join("skill.json"))
}

/// Writes `run.sh` as a new file renamed over the old one (a new inode).
fn write_entry(dir: &Path, script: &str) {
    let tmp = dir.join("run.sh.new");
    std::fs::write(&tmp, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, dir.join("run.sh")).unwrap();
}

/// An engine granting `name` `warm` runs, with its pool thread running,
/// stopped (its warm runs killed) when dropped.
struct Pooled {
    engine: Arc<Engine>,
    /// The run slots the pool thread takes from.
    slots: Arc<Semaphore>,
    thread: Option<std::thread::JoinHandle<()>>,
    _runtime: tempfile::TempDir,
}

impl Pooled {
    fn new(test: &str, name: &str, warm: u32, tune: impl FnOnce(&mut Config)) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: {test} needs root (the sandbox)");
            return None;
        }
        let user = nix::unistd::User::from_name(executor::config::DEFAULT_RUN_AS);
        if user.ok().flatten().is_none() {
            eprintln!("SKIP: {test}: run-as user missing (scripts/test creates it)");
            return None;
        }
        let runtime = tempfile::tempdir().unwrap();
        let mut text = format!("[skills.{name}]\nwarm = {warm}\n");
        text.insert_str(0, "warm_idle_seconds = 60\n");
        let mut config = Config::parse(&text, Path::new("t.toml")).unwrap();
        config.runtime_dir = Some(runtime.path().to_owned());
        tune(&mut config);
        let engine = Arc::new(Engine::new(config).unwrap());
        let slots = Arc::new(Semaphore::new(engine.config().max_concurrent_runs));
        let (serving, serving_slots) = (Arc::clone(&engine), Arc::clone(&slots));
        let thread = std::thread::spawn(move || serving.serve_warm(&serving_slots));
        Some(Pooled { engine, slots, thread: Some(thread), _runtime: runtime })
    }

    fn run(&self, manifest: &Path, args: &str) -> RunReport {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let req = RunRequest { manifest_path: manifest.to_owned(), args: args.as_bytes().to_vec() };
        rt.block_on(self.engine.run(req, &mut |_| {}, std::future::pending()))
    }

    /// A first run of the skill `name` (a miss, which starts its pool),
    /// then up to 10 s for `idle` warm runs of it.
    fn start_pool(&self, name: &str, manifest: &Path, idle: u64) {
        assert_eq!(self.run(manifest, "{}").outcome, Outcome::Ok);
        self.wait_for(name, |s| s.idle == idle);
    }

    fn stats(&self, name: &str) -> WarmStats {
        let all = self.engine.warm_stats();
        all.into_iter().find(|(n, _)| n == name).map(|(_, s)| s).unwrap_or_default()
    }

    /// A pool of one started ([`Pooled::start_pool`]), its idle warm run's
    /// pid, and every run slot left free then, held by the caller.
    fn one_idle_run_and_no_free_slot(
        &self,
        name: &str,
        manifest: &Path,
    ) -> (BTreeSet<i32>, tokio::sync::OwnedSemaphorePermit) {
        self.start_pool(name, manifest, 1);
        let idle = procs_under(manifest.parent().unwrap(), 1, &BTreeSet::new());
        assert_eq!(idle.len(), 1, "one idle warm run: {idle:?}");
        let all = self.slots.available_permits() as u32;
        (idle, Arc::clone(&self.slots).try_acquire_many_owned(all).unwrap())
    }

    /// Waits up to 10 s for `f` of the skill's stats to hold.
    fn wait_for(&self, name: &str, f: impl Fn(&WarmStats) -> bool) -> WarmStats {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.stats(name);
            if f(&s) || Instant::now() > until {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.engine.finish_warm();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `{"pid": $$, "args": ARGS}`.
const ECHO_PID: &str = "args=$(cat)\nprintf '{\"pid\":%s,\"args\":%s}' $$ \"$args\"";

/// The first run of a granted skill is a miss and starts its pool; later
/// runs take warm processes, each once, with the request's args, their
/// deadline from the take (a warm run made longer ago than its timeout
/// still runs to its end), `setup_us` near zero.
#[test]
fn warm_runs_serve_each_request_once_with_its_args() {
    let test = "warm_runs_serve_each_request_once_with_its_args";
    let Some(p) = Pooled::new(test, "echo", 2, |_| {}) else { return };
    let (_dir, manifest) = skill("echo", 1, ECHO_PID);
    let first = p.run(&manifest, r#"{"n":0}"#);
    assert_eq!((first.outcome, first.warm), (Outcome::Ok, false), "{first:?}");
    let s = p.wait_for("echo", |s| s.idle == 2);
    assert_eq!((s.size, s.idle, s.hits, s.misses), (2, 2, 0, 1), "{s:?}");
    // Older than the skill's 1 s timeout when taken.
    std::thread::sleep(Duration::from_millis(1300));
    let mut pids = std::collections::BTreeSet::new();
    for n in 1..=4 {
        p.wait_for("echo", |s| s.idle == 2);
        let r = p.run(&manifest, &format!(r#"{{"n":{n}}}"#));
        assert_eq!((r.outcome, r.warm), (Outcome::Ok, true), "run {n}: {r:?}");
        let v = r.result.as_ref().expect("a result").to_value();
        assert_eq!(v["args"], serde_json::json!({ "n": n }), "{v}");
        assert!(pids.insert(v["pid"].as_i64().unwrap()), "a process served twice: {v}");
        assert!(r.setup_us < 50_000, "setup_us {} for a warm run", r.setup_us);
    }
    let s = p.stats("echo");
    assert_eq!((s.hits, s.misses), (4, 1), "{s:?}");
}

/// Args larger than a pipe holds reach a warm run whole: what the write at
/// the take leaves is written as the skill reads, then stdin is closed.
#[test]
fn a_warm_run_reads_args_larger_than_its_pipe() {
    let test = "a_warm_run_reads_args_larger_than_its_pipe";
    let Some(p) = Pooled::new(test, "big", 1, |_| {}) else { return };
    // The byte count of its stdin, as JSON.
    let (_dir, manifest) = skill("big", 5, "printf '{\"bytes\":%s}' \"$(wc -c)\"");
    p.start_pool("big", &manifest, 1);
    let args = format!(r#"{{"pad":"{}"}}"#, "x".repeat(300_000));
    let r = p.run(&manifest, &args);
    assert_eq!((r.outcome, r.warm), (Outcome::Ok, true), "{r:?}");
    let v = r.result.map(|v| v.to_value());
    assert_eq!(v, Some(serde_json::json!({ "bytes": args.len() })));
}

/// A warm process that writes before it is taken, exits or closes its
/// stdin is discarded and never handed a request (its pool then rests for a while, so the
/// runs meanwhile are cold).
#[test]
fn a_warm_process_that_wrote_or_exited_is_never_used() {
    let test = "a_warm_process_that_wrote_or_exited_is_never_used";
    // Writes to stderr before reading its args; dies before reading them;
    // closes its stdin and waits (a cold run of it times out).
    let cases = [
        ("early", 5, "echo early >&2\nexec cat"),
        ("crash", 5, "kill -SEGV $$"),
        ("noin", 1, "exec 0<&-\nexec sleep 30"),
    ];
    for (name, timeout, script) in cases {
        let Some(p) = Pooled::new(test, name, 2, |_| {}) else { return };
        let (_dir, manifest) = skill(name, timeout, script);
        let r = p.run(&manifest, r#"{"a":1}"#);
        assert!(!r.warm, "{r:?}");
        let s = p.wait_for(name, |s| s.discarded >= 1 && s.idle == 0);
        assert!(s.discarded >= 1 && s.idle == 0, "{name}: {s:?}");
        let r = p.run(&manifest, r#"{"a":1}"#);
        assert!(!r.warm, "{name}: {r:?}");
        if name == "early" {
            assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        }
        assert_eq!(p.stats(name).hits, 0, "{name}");
    }
}

/// Replacing the entry discards the pool: the next run runs the new file,
/// and the pool is made again from it.
#[test]
fn replacing_the_entry_discards_the_pool() {
    let test = "replacing_the_entry_discards_the_pool";
    let Some(p) = Pooled::new(test, "swap", 2, |_| {}) else { return };
    let (_root, manifest) = skill("swap", 5, "cat >/dev/null\necho '{\"v\":1}'");
    p.start_pool("swap", &manifest, 2);
    write_entry(manifest.parent().unwrap(), "cat >/dev/null\necho '{\"v\":2}'");
    let r = p.run(&manifest, "{}");
    assert_eq!(r.result.map(|v| v.to_value()), Some(serde_json::json!({"v": 2})));
    let s = p.wait_for("swap", |s| s.discarded >= 2 && s.idle == 2);
    assert!(s.discarded >= 2 && s.idle == 2, "{s:?}");
    let r = p.run(&manifest, "{}");
    assert!(r.warm, "{r:?}");
    assert_eq!(r.result.map(|v| v.to_value()), Some(serde_json::json!({"v": 2})));
}

/// The pool thread's sweep finds idle runs of a replaced entry with no
/// request asking: they are discarded, the pool is made again from the new
/// file, and the next run is a hit that runs it.
#[test]
fn the_sweep_discards_the_runs_of_a_replaced_entry() {
    let test = "the_sweep_discards_the_runs_of_a_replaced_entry";
    let Some(p) = Pooled::new(test, "swept", 2, |_| {}) else { return };
    let (_root, manifest) = skill("swept", 5, "cat >/dev/null\necho '{\"v\":1}'");
    p.start_pool("swept", &manifest, 2);
    write_entry(manifest.parent().unwrap(), "cat >/dev/null\necho '{\"v\":2}'");
    let s = p.wait_for("swept", |s| s.discarded >= 2 && s.idle == 2);
    assert!(s.discarded >= 2 && s.idle == 2, "{s:?}");
    assert_eq!((s.hits, s.misses), (0, 1), "no request took or missed: {s:?}");
    let r = p.run(&manifest, "{}");
    assert!(r.warm, "{r:?}");
    assert_eq!(r.result.map(|v| v.to_value()), Some(serde_json::json!({"v": 2})));
}

/// Idle warm runs expire after `warm_idle_seconds` (and are made again);
/// a warm run's output cap and timeout hold as a cold run's.
#[test]
fn warm_runs_expire_and_keep_their_limits() {
    let test = "warm_runs_expire_and_keep_their_limits";
    let tune = |c: &mut Config| {
        c.warm_idle_seconds = 1;
        c.limits.stdout_bytes = 4096;
    };
    let Some(p) = Pooled::new(test, "lim", 1, tune) else { return };
    let script = "args=$(cat)\ncase $args in\n*flood*) exec yes ;;\n*sleep*) exec sleep 30 ;;\n\
                  *) echo '{}' ;;\nesac";
    let (_dir, manifest) = skill("lim", 1, script);
    p.start_pool("lim", &manifest, 1);
    let s = p.wait_for("lim", |s| s.discarded >= 1 && s.idle == 1);
    assert!(s.discarded >= 1 && s.idle == 1, "expired and made again: {s:?}");
    let r = p.run(&manifest, r#"{"flood":1}"#);
    assert_eq!((r.outcome, r.warm), (Outcome::OutputLimit, true), "{r:?}");
    p.wait_for("lim", |s| s.idle == 1);
    let r = p.run(&manifest, r#"{"sleep":1}"#);
    assert_eq!((r.outcome, r.warm), (Outcome::Timeout, true), "{r:?}");
    assert!(r.duration_ms >= 1000, "{r:?}");
}

/// Whether none of `pids` is a live process any more.
fn all_gone(pids: &BTreeSet<i32>) -> bool {
    pids.iter().all(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// The shells running `DIR/run.sh` that have a child: a skill's warm runs
/// past their start, blocked in their `cat` (a shell's child between its
/// fork and its exec of `cat` has the shell's command line, and no child),
/// once they are `n` and none of `not` for 100 ms, or what there is after
/// 10 s.
fn procs_under(dir: &Path, n: usize, not: &BTreeSet<i32>) -> BTreeSet<i32> {
    let needle = dir.display().to_string();
    let has_child = |pid: i32| {
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"));
        children.is_ok_and(|c| !c.trim().is_empty())
    };
    let scan = || -> BTreeSet<i32> {
        let procs = testkit::procs::with_cmdline(&needle);
        procs.into_iter().filter(|p| p.state != 'Z' && has_child(p.pid)).map(|p| p.pid).collect()
    };
    let until = Instant::now() + Duration::from_secs(10);
    let mut last = scan();
    let mut since = Instant::now();
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
        let now = scan();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if last.len() == n
            && last.is_disjoint(not)
            && since.elapsed() >= Duration::from_millis(100)
        {
            break;
        }
    }
    last
}

/// What the entry reads at start (a file beside it) is not part of a warm
/// run's identity: a warm run made before that file changed runs what it
/// read. A discard (what skilld's reload sends) kills every idle warm run,
/// the pool is made again, and the next warm run reads the file as it is.
#[test]
fn a_discard_remakes_the_pool_from_the_files_as_they_are() {
    let test = "a_discard_remakes_the_pool_from_the_files_as_they_are";
    let Some(p) = Pooled::new(test, "lib", 2, |_| {}) else { return };
    let script = ". \"${0%/*}/lib.sh\"\ncat >/dev/null\nprintf '{\"v\":%s}' \"$V\"";
    let (_root, manifest) = skill("lib", 5, script);
    let dir = manifest.parent().unwrap().to_owned();
    let lib = |v: u32| std::fs::write(dir.join("lib.sh"), format!("V={v}\n")).unwrap();
    let v = |r: &RunReport| r.result.as_ref().map(|v| v.to_value()["v"].clone());
    lib(1);
    let r = p.run(&manifest, "{}");
    assert_eq!((r.warm, v(&r)), (false, Some(serde_json::json!(1))), "{r:?}");
    p.wait_for("lib", |s| s.idle == 2);
    // Both have read `lib.sh` once they wait in their `cat`.
    assert_eq!(procs_under(&dir, 2, &BTreeSet::new()).len(), 2);
    lib(2);
    let r = p.run(&manifest, "{}");
    assert_eq!((r.warm, v(&r)), (true, Some(serde_json::json!(1))), "made before: {r:?}");
    let s = p.wait_for("lib", |s| s.idle == 2);
    let before = procs_under(&dir, 2, &BTreeSet::new());
    assert_eq!(before.len(), 2, "two idle warm runs: {before:?} {s:?}");
    assert_eq!(p.engine.discard_warm(), 2);
    let now = procs_under(&dir, 2, &before);
    assert!(now.is_disjoint(&before), "an idle warm run outlived the discard: {before:?} {now:?}");
    assert_eq!(now.len(), 2, "the pool was not made again: {now:?}");
    let r = p.run(&manifest, "{}");
    assert_eq!((r.warm, v(&r)), (true, Some(serde_json::json!(2))), "{r:?}");
    let s = p.stats("lib");
    assert_eq!((s.hits, s.misses, s.discarded), (2, 1, 2), "{s:?}");
}

/// A discarded warm run's slot is free once the discard returns, its tree
/// killed, whatever the pool thread is doing: here the test holds every
/// other slot, so the pool thread makes no run with the one freed.
#[test]
fn a_discarded_warm_runs_slot_is_free_at_once() {
    let test = "a_discarded_warm_runs_slot_is_free_at_once";
    let Some(p) = Pooled::new(test, "slot", 1, |_| {}) else { return };
    let (_root, manifest) = skill("slot", 5, "cat >/dev/null\necho '{}'");
    let (before, held) = p.one_idle_run_and_no_free_slot("slot", &manifest);
    assert_eq!(p.slots.available_permits(), 0);
    assert_eq!(p.engine.discard_warm(), 1);
    assert_eq!(p.slots.available_permits(), 1, "the discarded run's slot is still held");
    // The pool thread reaps it; one slot free is not room for another.
    testkit::wait_for("the discarded run to go", Duration::from_secs(10), || all_gone(&before));
    assert_eq!((p.stats("slot").idle, p.slots.available_permits()), (0, 1));
    drop(held);
    let s = p.wait_for("slot", |s| s.idle == 1);
    assert_eq!(s.idle, 1, "the pool was not made again: {s:?}");
}

/// A pool whose idle run was evicted for a request's run slot rests
/// before it makes another (slots are short: one made at once would
/// likely be evicted again), then fills again.
#[test]
fn an_evicted_pool_rests_before_it_fills_again() {
    let test = "an_evicted_pool_rests_before_it_fills_again";
    let Some(p) = Pooled::new(test, "ev", 1, |_| {}) else { return };
    let (_root, manifest) = skill("ev", 5, "cat >/dev/null\necho '{}'");
    p.start_pool("ev", &manifest, 1);
    assert!(p.engine.evict_warm(), "no idle run to evict");
    let evicted = Instant::now();
    // Slots are free all the while: only the rest keeps the pool empty.
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(p.stats("ev").idle, 0, "made again at once after an eviction");
    let s = p.wait_for("ev", |s| s.idle == 1);
    assert_eq!(s.idle, 1, "not made again after its rest: {s:?}");
    assert!(evicted.elapsed() >= Duration::from_secs(2), "{:?}", evicted.elapsed());
}

/// A reload's discard reaches a warm run already taken by a request that
/// is still held (skilld holds each until its audit row is written): once
/// started, the request runs cold, with the files as they are then.
#[test]
fn a_discard_reaches_a_warm_run_taken_by_a_held_request() {
    let test = "a_discard_reaches_a_warm_run_taken_by_a_held_request";
    let Some(p) = Pooled::new(test, "relo", 1, |_| {}) else { return };
    let script = ". \"${0%/*}/lib.sh\"\ncat >/dev/null\nprintf '{\"v\":%s}' \"$V\"";
    let (_root, manifest) = skill("relo", 5, script);
    let dir = manifest.parent().unwrap().to_owned();
    let lib = |v: u32| std::fs::write(dir.join("lib.sh"), format!("V={v}\n")).unwrap();
    lib(1);
    p.start_pool("relo", &manifest, 1);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let req = RunRequest { manifest_path: manifest.clone(), args: b"{}".to_vec() };
    // The idle run is taken, so the discard finds none idle.
    let start = async {
        lib(2);
        assert_eq!(p.engine.discard_warm(), 0, "the taken run was still idle");
        true
    };
    let mut sink = |_: &str| {};
    let (r, _) =
        rt.block_on(p.engine.run_held(req, None, &mut sink, start, std::future::pending()));
    let v = r.result.as_ref().map(|v| v.to_value()["v"].clone());
    assert_eq!((r.outcome, r.warm, v), (Outcome::Ok, false, Some(serde_json::json!(2))), "{r:?}");
    let s = p.stats("relo");
    assert_eq!((s.hits, s.misses), (0, 2), "{s:?}");
    assert!(s.discarded >= 1, "{s:?}");
}

/// Stopping the pools (SIGTERM) puts every idle warm run down at once,
/// whatever the pool thread is doing: its slot is free when the stop
/// returns, and its process goes.
#[test]
fn stopping_puts_idle_warm_runs_down_at_once() {
    let test = "stopping_puts_idle_warm_runs_down_at_once";
    let Some(p) = Pooled::new(test, "stop", 1, |_| {}) else { return };
    let (_root, manifest) = skill("stop", 5, "cat >/dev/null\necho '{}'");
    let (before, _held) = p.one_idle_run_and_no_free_slot("stop", &manifest);
    p.engine.stop_warm();
    assert_eq!(p.slots.available_permits(), 1, "the idle run's slot is still held");
    assert_eq!(p.stats("stop").idle, 0);
    testkit::wait_for("the idle run to go after the stop", Duration::from_secs(10), || {
        all_gone(&before)
    });
    assert!(p.stats("stop").discarded >= 1);
}

/// A warm run taken by a held request (skilld's `hold`) and spoiled while
/// the request was held (here it exits) is not handed the args: the
/// request runs cold, counted a miss.
#[test]
fn a_warm_run_spoiled_while_held_is_not_used() {
    let test = "a_warm_run_spoiled_while_held_is_not_used";
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let die = root.path().join("held").join("die");
    // Made before `die` exists: waits for it, then exits 7. After: a cat.
    let script = format!(
        "if [ -e {die} ]; then exec cat; fi\nwhile [ ! -e {die} ]; do sleep 0.02; done\nexit 7",
        die = die.display()
    );
    let pack = testkit::write_pack(root.path(), "held", "run.sh", "", &script);
    let manifest = pack.join("skill.json");
    let pin = |c: &mut Config| c.skills.get_mut("held").unwrap().manifest = Some(manifest.clone());
    let Some(p) = Pooled::new(test, "held", 1, pin) else { return };
    let s = p.wait_for("held", |s| s.idle == 1);
    assert_eq!(s.idle, 1, "the pinned pool was not made: {s:?}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let req = RunRequest { manifest_path: manifest.clone(), args: br#"{"a":1}"#.to_vec() };
    // The start: `die` made, and the warm run's exit waited for.
    let start = async {
        std::fs::write(&die, "").unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        true
    };
    let mut sink = |_: &str| {};
    let held = p.engine.run_held(req, None, &mut sink, start, std::future::pending());
    let (r, _) = rt.block_on(held);
    assert_eq!((r.outcome, r.warm), (Outcome::Ok, false), "{r:?}");
    // The cold run's set-up starts after the hold (500 ms).
    assert!(r.setup_us < 400_000, "setup_us {} counts the hold", r.setup_us);
    assert_eq!(r.result.map(|v| v.to_value()), Some(serde_json::json!({"a": 1})));
    let s = p.stats("held");
    assert_eq!((s.hits, s.misses), (0, 1), "{s:?}");
    assert!(s.discarded >= 1, "{s:?}");
}
