//! The soak (not part of `cargo test`: run
//! `tests/soak/run.sh`). Drives both real daemons, started as
//! `ongrid-skill up --runtime-dir <tmp> --no-examples --skills <packs>
//! --config <skilld.toml>`, with N clients (default 16) for a while
//! (default 10 minutes) mixing six skills: `ok` (echo of the args), `fail`
//! (exit 3), `slow` (past its 1 s timeout), `flood` (stdout past the
//! 16 MiB cap), `bomb` (a fork bomb into the pids limit, then past its
//! timeout) and `net` (opens a TCP socket, which the sandbox denies),
//! every fifth request as an NDJSON stream, with a reload every 30 s.
//! With `--warm N`, `ok`, `slow`, `fail` and `flood` are granted N warm
//! runs each (`up --grants`): `ok` and `slow` wait for their args and are
//! taken, `fail` and `flood` exit or write first and are discarded, so
//! the pools are taken, refilled, discarded, rested and remade by each
//! reload under load.
//!
//! Then it checks, and exits 1 when any check fails:
//! - every request got an answer with the outcome its skill must give;
//! - resident memory, open fds and threads of the executor and of skilld
//!   (the `up` process) at the end are within 10 % of their value after
//!   the warm-up (both taken after the clients paused and the daemons
//!   settled, from `/proc/<pid>/status` and `/proc/<pid>/fd`);
//! - no process of the run-as user is alive, and the executor instance
//!   holds only its pre-made ready slots (run dirs and cgroup leaves),
//!   besides the idle warm runs (two processes and a slot each at most);
//! - after `up` is stopped: no instance directory, no cgroup of the
//!   instance, no watchdog;
//! - the audit database holds one row per request, with the same counts
//!   by outcome.
//!
//! ```text
//! soak [--duration SECS] [--warmup SECS] [--clients N] [--reload-every SECS] [--warm N] [--keep]
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[allow(dead_code)]
#[path = "../e2e/harness.rs"]
mod harness;

// The harness holds every answer to the API's contract when built as a
// test (its own unit tests), as in the e2e suite.
#[cfg(test)]
#[allow(dead_code)]
#[path = "../e2e/contract.rs"]
mod contract;

use harness::{free_port, http, temp_dir, write_skill};

/// Skill, expected outcome, what the soak calls it.
const SKILLS: [(&str, &str); 6] = [
    ("ok", "ok"),
    ("fail", "exit_nonzero"),
    ("slow", "timeout"),
    ("flood", "output_limit"),
    ("bomb", "timeout"),
    ("net", "ok"),
];

/// How long the daemons get to settle before a sample is compared (the
/// tokio blocking pool lets an idle thread go after 10 s).
const SETTLE: Duration = Duration::from_secs(12);

struct Opts {
    duration: Duration,
    warmup: Duration,
    clients: usize,
    reload_every: Duration,
    /// Warm runs granted to each of [`WARM_SKILLS`] (0: none).
    warm: u64,
    keep: bool,
}

/// The skills granted warm runs with `--warm`.
const WARM_SKILLS: [&str; 4] = ["ok", "slow", "fail", "flood"];

fn opts() -> Opts {
    let mut o = Opts {
        duration: Duration::from_secs(600),
        warmup: Duration::from_secs(60),
        clients: 16,
        reload_every: Duration::from_secs(30),
        warm: 0,
        keep: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = || -> u64 {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                eprintln!("soak: {a} needs a number");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--duration" => o.duration = Duration::from_secs(num()),
            "--warmup" => o.warmup = Duration::from_secs(num()),
            "--clients" => o.clients = usize::try_from(num()).unwrap_or(16).max(1),
            "--reload-every" => o.reload_every = Duration::from_secs(num().max(1)),
            // Two per skill at most: four skills within the executor's
            // default max_warm_total (8).
            "--warm" => o.warm = num().min(2),
            "--keep" => o.keep = true,
            _ => {
                eprintln!(
                    "usage: soak [--duration SECS] [--warmup SECS] [--clients N] \
                     [--reload-every SECS] [--warm N] [--keep]"
                );
                std::process::exit(2)
            }
        }
    }
    if o.warmup >= o.duration {
        o.warmup = o.duration / 5;
    }
    o
}

/// A binary next to this one (`target/<profile>/`).
fn sibling(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    let path = exe.parent().expect("bin dir").join(name);
    assert!(path.is_file(), "{} missing: cargo build --workspace --bins", path.display());
    path
}

fn write_packs(root: &Path) {
    fs::create_dir_all(root).unwrap();
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
    // Reads its args before it writes: it may be warm.
    write_skill(root, "ok", "", "args=$(cat)\necho 'ok: starting' >&2\nprintf '%s' \"$args\"");
    write_skill(root, "fail", "", "echo boom >&2\nexit 3");
    write_skill(root, "slow", r#","timeout_seconds":1"#, "exec /bin/sleep 30");
    write_skill(root, "flood", "", "exec /usr/bin/yes");
    // The bomb forks in a background subshell (a failed fork in the main
    // shell would end it with status 2); the main shell only execs.
    write_skill(
        root,
        "bomb",
        r#","timeout_seconds":1"#,
        "b(){ b | b & }\n( b ) &\nexec /bin/sleep 30",
    );
    write_skill(
        root,
        "net",
        "",
        "if /usr/bin/bash -c 'exec 3<>/dev/tcp/127.0.0.1/9' 2>/dev/null; then\n\
         echo '{\"net\":\"open\"}'\nelse\necho '{\"net\":\"denied\"}'\nfi",
    );
}

/// One sample of a process: resident kB, open fds, threads.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    rss_kb: u64,
    fds: u64,
    threads: u64,
}

fn sample(pid: u32) -> Sample {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count() as u64).unwrap_or(0);
    Sample { rss_kb: field("VmRSS:"), fds, threads: field("Threads:") }
}

/// The `ongrid-executor serve` child of `up`.
fn executor_pid(up: u32) -> Option<u32> {
    let children = fs::read_to_string(format!("/proc/{up}/task/{up}/children")).unwrap_or_default();
    children.split_whitespace().filter_map(|p| p.parse::<u32>().ok()).find(|pid| {
        let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmd).contains("ongrid-executor")
    })
}

/// Live processes owned by `uid`.
fn processes_of(uid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let owner = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u32>().ok());
        let zombie = status.lines().any(|l| l.starts_with("State:") && l.contains('Z'));
        if owner == Some(uid) && !zombie {
            out.push(pid);
        }
    }
    out
}

/// cgroup directories of `instance` in every hierarchy (leaves included).
fn cgroups_of(instance: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for h in fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        for base in [h.path().join("ongrid").join(instance), h.path().join(instance)] {
            if base.is_dir() {
                out.push(base.clone());
                for leaf in fs::read_dir(&base).into_iter().flatten().flatten() {
                    if leaf.path().is_dir() {
                        out.push(leaf.path());
                    }
                }
            }
        }
    }
    out
}

/// The instance directories under `runs`.
fn instances(runs: &Path) -> Vec<String> {
    fs::read_dir(runs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| n.starts_with("ex-"))
        .collect()
}

#[derive(Default)]
struct Tally {
    by_outcome: BTreeMap<String, u64>,
    by_skill: BTreeMap<String, u64>,
    wrong: Vec<String>,
    latency_ms: Vec<u64>,
}

/// One request; returns the outcome, or why the answer was wrong.
fn one(socket: &Path, skill: &str, want: &str, n: u64, stream: bool) -> Result<String, String> {
    let args = json!({"n": n, "pad": "x".repeat(usize::try_from(n % 512).unwrap_or(0))});
    let body = json!({"args": args, "session_id": format!("soak-{n}")}).to_string();
    let accept = if stream { "application/x-ndjson" } else { "application/json" };
    let r =
        http(socket, "POST", &format!("/v1/skills/{skill}/execute"), accept, Some(body.as_bytes()));
    let text = || String::from_utf8_lossy(&r.body[..r.body.len().min(400)]).into_owned();
    if r.status != 200 {
        return Err(format!("{skill}: HTTP {}: {}", r.status, text()));
    }
    let report = if stream {
        let events = r.events();
        let last = events.last().cloned().unwrap_or(Value::Null);
        if last["event"] != "report" {
            return Err(format!("{skill}: stream ended with {last}"));
        }
        last["report"].clone()
    } else {
        r.json()
    };
    let outcome = report["outcome"].as_str().unwrap_or("?").to_owned();
    if outcome != want {
        return Err(format!("{skill}: outcome {outcome}, want {want}: {}", text()));
    }
    let ok = match skill {
        "ok" => report["result"] == args,
        "net" => report["result"] == json!({"net": "denied"}),
        _ => true,
    };
    if !ok {
        return Err(format!("{skill}: wrong result {}", report["result"]));
    }
    Ok(outcome)
}

/// Runs `clients` client threads until `until`.
fn drive(
    socket: &Path,
    clients: usize,
    until: Instant,
    seq: &Arc<AtomicU64>,
    tally: &Mutex<Tally>,
) {
    std::thread::scope(|scope| {
        for c in 0..clients {
            let seq = Arc::clone(seq);
            scope.spawn(move || {
                let mut i = c;
                while Instant::now() < until {
                    let n = seq.fetch_add(1, Ordering::SeqCst);
                    let (skill, want) = SKILLS[i % SKILLS.len()];
                    i += 1;
                    let started = Instant::now();
                    let r = one(socket, skill, want, n, n.is_multiple_of(5));
                    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    let mut t = tally.lock().unwrap();
                    *t.by_skill.entry(skill.to_owned()).or_default() += 1;
                    t.latency_ms.push(ms);
                    match r {
                        Ok(outcome) => *t.by_outcome.entry(outcome).or_default() += 1,
                        Err(why) => {
                            *t.by_outcome.entry("WRONG".to_owned()).or_default() += 1;
                            if t.wrong.len() < 20 {
                                t.wrong.push(why);
                            }
                        }
                    }
                }
            });
        }
    });
}

/// The idle warm runs of [`WARM_SKILLS`] as `GET /v1/skills/{name}` says,
/// each pool's counts printed; a skill granted none counts 0.
fn warm_idle(socket: &Path, failures: &mut Vec<String>) -> u64 {
    let mut idle = 0;
    for skill in WARM_SKILLS {
        let r = http(socket, "GET", &format!("/v1/skills/{skill}"), "application/json", None);
        if r.status != 200 {
            failures.push(format!("GET /v1/skills/{skill}: HTTP {}", r.status));
            continue;
        }
        let warm = r.json()["warm"].clone();
        if !warm.is_null() {
            println!("soak: warm {skill}: {warm}");
        }
        idle += warm["idle"].as_u64().unwrap_or(0);
    }
    idle
}

fn within(a: u64, b: u64, pct: u64) -> bool {
    a.abs_diff(b) * 100 <= b * pct
}

fn main() {
    let o = opts();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("soak: needs root (skills run as ongrid-skill in cgroups)");
        std::process::exit(2);
    }
    let run_uid = ongrid_tests::host::skill_user().0;
    let (tmp, base) = temp_dir("ongrid-soak-");
    let packs = base.join("packs");
    write_packs(&packs);
    let rt = base.join("rt");
    let uid = nix::unistd::geteuid().as_raw();
    fs::write(
        base.join("skilld.toml"),
        format!(
            "[[callers]]\nuid = {uid}\nrole = \"soak\"\nmode = \"mutating-with-confirm\"\n\
             audit = true\n"
        ),
    )
    .unwrap();
    let metrics = free_port();
    let log = base.join("up.log");
    let mut cmd = Command::new(sibling("ongrid-skill"));
    cmd.args(["up", "--no-examples", "--runtime-dir"]).arg(&rt);
    if o.warm > 0 {
        let grants: String =
            WARM_SKILLS.iter().map(|s| format!("[skills.{s}]\nwarm = {}\n", o.warm)).collect();
        fs::write(base.join("grants.toml"), grants).unwrap();
        cmd.arg("--grants").arg(base.join("grants.toml"));
    }
    let mut up: Child = cmd
        .arg("--skills")
        .arg(&packs)
        .arg("--config")
        .arg(base.join("skilld.toml"))
        .arg("--metrics-listen")
        .arg(metrics.to_string())
        .env("ONGRID_EXECUTOR", sibling("ongrid-executor"))
        .env("RUST_LOG", "warn")
        .env("ONGRID_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let socket = rt.join("skilld.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if up.try_wait().unwrap().is_some() || Instant::now() > deadline {
            panic!("up did not start:\n{}", fs::read_to_string(&log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let skilld_pid = up.id();
    let executor = executor_pid(skilld_pid).expect("executor child of up");
    let instance = instances(&rt.join("runs")).pop().expect("executor instance dir");
    println!(
        "soak: {} clients, {} s ({} s warm-up), reload every {} s; skilld pid {skilld_pid}, \
         executor pid {executor}, instance {instance}, dir {}",
        o.clients,
        o.duration.as_secs(),
        o.warmup.as_secs(),
        o.reload_every.as_secs(),
        base.display()
    );

    let seq = Arc::new(AtomicU64::new(1));
    let tally = Mutex::new(Tally::default());
    let stop = AtomicBool::new(false);
    let reloads = AtomicU64::new(0);
    let reload_failures = Mutex::new(Vec::<String>::new());
    let samples = Mutex::new(Vec::<(u64, Sample, Sample)>::new());
    let start = Instant::now();
    let (warm, end) = std::thread::scope(|scope| {
        // Reloads.
        scope.spawn(|| {
            let mut next = Instant::now() + o.reload_every;
            while !stop.load(Ordering::SeqCst) {
                if Instant::now() >= next {
                    let r = http(&socket, "POST", "/v1/reload", "application/json", Some(b"{}"));
                    let registered =
                        if r.status == 200 { r.json()["registered"].clone() } else { Value::Null };
                    if registered != json!(6) {
                        reload_failures.lock().unwrap().push(format!(
                            "{} {}",
                            r.status,
                            String::from_utf8_lossy(&r.body)
                        ));
                    }
                    reloads.fetch_add(1, Ordering::SeqCst);
                    next += o.reload_every;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        // Samples under load, every 10 s.
        scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let t = start.elapsed().as_secs();
                samples.lock().unwrap().push((t, sample(executor), sample(skilld_pid)));
                for _ in 0..100 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        drive(&socket, o.clients, start + o.warmup, &seq, &tally);
        std::thread::sleep(SETTLE);
        let warm = (sample(executor), sample(skilld_pid));
        println!(
            "soak: after warm-up ({} requests): executor {:?}, skilld {:?}",
            seq.load(Ordering::SeqCst) - 1,
            warm.0,
            warm.1
        );
        drive(&socket, o.clients, start + o.duration, &seq, &tally);
        std::thread::sleep(SETTLE);
        let end = (sample(executor), sample(skilld_pid));
        stop.store(true, Ordering::SeqCst);
        (warm, end)
    });
    let elapsed = start.elapsed();
    let t = tally.into_inner().unwrap();
    let total: u64 = t.by_outcome.values().sum();
    let mut failures: Vec<String> = Vec::new();
    println!(
        "soak: {total} requests in {:.0} s ({:.1}/s), {} reloads",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        reloads.load(Ordering::SeqCst)
    );
    println!("soak: by skill {:?}", t.by_skill);
    println!("soak: by outcome {:?}", t.by_outcome);
    let mut lat = t.latency_ms.clone();
    lat.sort_unstable();
    let pct = |p: usize| lat.get((lat.len() * p / 100).min(lat.len().saturating_sub(1))).copied();
    println!("soak: latency ms p50 {:?} p99 {:?} max {:?}", pct(50), pct(99), lat.last());
    for w in &t.wrong {
        failures.push(format!("wrong answer: {w}"));
    }
    for r in reload_failures.lock().unwrap().iter() {
        failures.push(format!("reload: {r}"));
    }
    let s = samples.lock().unwrap();
    let max = |f: &dyn Fn(&(u64, Sample, Sample)) -> u64| s.iter().map(f).max().unwrap_or(0);
    println!(
        "soak: under load max: executor rss {} kB fds {} threads {}; skilld rss {} kB fds {} threads {}",
        max(&|x| x.1.rss_kb),
        max(&|x| x.1.fds),
        max(&|x| x.1.threads),
        max(&|x| x.2.rss_kb),
        max(&|x| x.2.fds),
        max(&|x| x.2.threads)
    );
    println!("soak: end (settled): executor {:?}, skilld {:?}", end.0, end.1);
    for (who, w, e) in [("executor", warm.0, end.0), ("skilld", warm.1, end.1)] {
        for (what, a, b) in [
            ("rss_kb", e.rss_kb, w.rss_kb),
            ("fds", e.fds, w.fds),
            ("threads", e.threads, w.threads),
        ] {
            if !within(a, b, 10) {
                failures.push(format!("{who} {what}: {b} after warm-up, {a} at the end (> 10 %)"));
            }
        }
    }

    // While the daemons are up: no run process, only ready slots, but
    // for the idle warm runs (a shell and its `$(cat)` each at most).
    let idle = warm_idle(&socket, &mut failures);
    let left = processes_of(run_uid);
    if left.len() as u64 > 2 * idle {
        failures.push(format!("processes of the run-as user alive: {left:?} ({idle} idle warm)"));
    }
    let inst_dir = rt.join("runs").join(&instance);
    let slots: Vec<String> = fs::read_dir(&inst_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| !n.starts_with('.'))
        .collect();
    let leaves = cgroups_of(&instance).len();
    println!(
        "soak: idle instance: {} run dirs (ready slots and {idle} idle warm runs), {leaves} cgroup \
         dirs",
        slots.len()
    );
    if slots.len() as u64 > 4 + idle {
        failures.push(format!(
            "{} run dirs in {} (> 4 ready slots and {idle} idle warm runs)",
            slots.len(),
            inst_dir.display()
        ));
    }

    // Stop both daemons.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(skilld_pid).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    );
    let stop_deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = up.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > stop_deadline {
            let _ = up.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !status.is_some_and(|s| s.success()) {
        failures.push(format!("up did not exit 0 after SIGTERM: {status:?}"));
    }
    // Gone at once, or within 10 s on a loaded host.
    let until = Instant::now() + Duration::from_secs(10);
    while (!processes_of(run_uid).is_empty() || !harness::processes_with(&instance).is_empty())
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = processes_of(run_uid);
    if !left.is_empty() {
        failures.push(format!("after stop: processes of the run-as user alive: {left:?}"));
    }
    let watchdogs: Vec<i32> = harness::processes_with(&instance);
    if !watchdogs.is_empty() {
        failures.push(format!("after stop: processes naming the instance: {watchdogs:?}"));
    }
    let dirs = instances(&rt.join("runs"));
    if !dirs.is_empty() {
        failures.push(format!("after stop: instance dirs left: {dirs:?}"));
    }
    let cg = cgroups_of(&instance);
    if !cg.is_empty() {
        failures.push(format!("after stop: cgroups left: {cg:?}"));
    }

    // The audit trail: one row per request, same outcomes.
    let db = rt.join("audit.db");
    let out = Command::new("sqlite3")
        .arg(&db)
        .arg("SELECT coalesce(outcome, 'NULL'), count(*) FROM audit GROUP BY 1 ORDER BY 1")
        .output();
    match out {
        Ok(out) if out.status.success() => {
            let mut rows: BTreeMap<String, u64> = BTreeMap::new();
            for l in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some((k, v)) = l.split_once('|') {
                    rows.insert(k.to_owned(), v.parse().unwrap_or(0));
                }
            }
            let n: u64 = rows.values().sum();
            println!("soak: audit rows {n} by outcome {rows:?}");
            if n != total {
                failures.push(format!("audit: {n} rows for {total} requests"));
            }
            let mut want = t.by_outcome.clone();
            want.remove("WRONG");
            if rows != want {
                failures.push(format!("audit outcomes {rows:?} != answered {want:?}"));
            }
        }
        Ok(out) => failures.push(format!("sqlite3: {}", String::from_utf8_lossy(&out.stderr))),
        Err(e) => failures.push(format!("sqlite3 (needed for the audit check): {e}")),
    }

    if o.keep {
        println!("soak: kept {}", base.display());
        std::mem::forget(tmp);
    }
    if failures.is_empty() {
        println!("soak: PASS");
    } else {
        for f in &failures {
            println!("soak: FAIL: {f}");
        }
        println!("soak: log:\n{}", fs::read_to_string(&log).unwrap_or_default());
        std::process::exit(1);
    }
}
