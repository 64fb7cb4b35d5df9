//! `loadbench`: one trivial JSON skill run every way we care about, side by
//! side in one invocation.
//!
//! # Layout
//!
//! - `opts`: the variants (`Variant`) and the command line (`Opts`).
//! - `skills`: the skill packs the variants run, and `daemon10k`'s
//!   generated ones.
//! - `stack`: a pair of daemons (`Stack`) and a process's CPU time and
//!   VmRSS read from `/proc`.
//! - `http`: the keep-alive HTTP/1.1 client of skilld's socket (`Http`).
//! - `worker`: the `engine` variants' worker process (`Worker`).
//! - `run`: one run of a variant (`run_one`, `Ctx`, `Client`).
//! - `scrape`: the figures read off skilld's `/metrics` (`Hist`, run
//!   slots, audit waits).
//! - `report`: the printed table and figures of a set of runs.
//! - `main.rs`: the phases, sequential and concurrent, each iteration's
//!   order of the variants, the daemons' figures when the measured runs
//!   start (`Mark`), and `main`.
//!
//! # What it runs and prints
//!
//! Variants (each iteration runs every variant once, in a shuffled order, so
//! the noise of a shared machine falls on all of them alike):
//!
//! - `bare`: `std::process::Command` (glibc `posix_spawn`), piped stdio, the
//!   args written to stdin, stdout read to the end, reaped. The baseline (a).
//! - `bare-warm`: the same process spawned after the last run (as a warm
//!   pool is refilled) and waited for, untimed, until it sleeps reading its
//!   stdin; timed from the args' write to its reaping.
//!   What a skill costs once it has its args with no box and no daemon:
//!   the floor under `daemon-warm` (sequential only).
//! - `cli`: `ongrid-executor run` as a process, start-up included (b).
//! - `daemon`: the full path (c): an in-process HTTP/1.1 client (one
//!   keep-alive connection per client thread) → `ongrid-skilld` (Unix
//!   socket) → `ongrid-executor serve` (Unix socket) → the skill. Both
//!   daemons are real processes started here on temp sockets, as the e2e
//!   suite starts them.
//! - `daemon10k`: the same against a second pair of daemons whose registry
//!   also holds `--loaded-skills` generated packs (default 10,000).
//! - `daemon-full`: the same as `daemon` (audit on the same disk) with
//!   `audit_synchronous = "full"` (both of a run's commits fsynced before
//!   its answer; the default is `"interval"`, which syncs a `safe` run's
//!   rows in the background). Not in the default set.
//! - `daemon-shm`: `daemon-full` with the audit database on `/dev/shm`
//!   (tmpfs: its fsyncs cost nothing), to show what the two fsyncs cost.
//!   Not in the default set.
//! - `daemon-normal`: the same as `daemon` with `audit_synchronous =
//!   "normal"` (no fsync but at checkpoints). Not in the default set.
//! - `daemon-b`: the same as `daemon`, with the daemons of another build
//!   (`--bin-dir-b DIR`): two builds compared run by run in one invocation,
//!   where comparing two invocations would compare the host's moods (on the
//!   dev machine the sequential daemon ratio moves by 0.1-0.3x between
//!   invocations, by well under 0.05x within one). Not in the default set.
//! - `daemon-warm`: the same as `daemon` with every skill granted
//!   `--warm N` warm runs (default 4; `[skills.NAME] warm`, pinned to its
//!   manifest so the pools fill at start): a run takes a process already
//!   boxed and blocked reading its args. Its idle warm runs' VmRSS and PSS
//!   are printed once the pools are full, its hits and misses after each set.
//! - `daemon-warm-b`: `daemon-warm` with the daemons of `--bin-dir-b`: the
//!   warm path's A/B in one invocation. Not in the default set.
//!   With `--host-proc-b`, daemon-b's executor grants every bench skill
//!   `proc = "host"` (the host's table; default: its own processes only):
//!   one build, both views.
//! - `executor-rpc`: `execute` sent straight to the `daemon` stack's
//!   executor socket (JSON-RPC): the executor daemon without skilld. Each
//!   client thread keeps its connection for the next run while it is
//!   younger than skilld's `IDLE_FOR`, as skilld keeps its own (a new
//!   connection per run cost ~130 µs more, traced). Not in the default
//!   set.
//! - `engine`, `engine1g`: `executor::Engine::run` in a worker process (this
//!   binary, `--engine-worker MB`) holding 0 MiB and `--ballast-mb` MiB of
//!   touched ballast; the time is taken inside the worker around
//!   `Engine::run` (sequential only).
//! - `bwrap`: `bwrap --unshare-all --die-with-parent` with the system dirs,
//!   the skill folder, `/proc` and `/dev` (d).
//! - `firejail`: `firejail --quiet --noprofile` (e).
//!
//! `bwrap` and `firejail` are skipped (with a note) when not installed;
//! `benches/run.sh` installs them.
//!
//! Skills (`--skills`, each a pack whose entry copies stdin to stdout):
//! `bin-cat` (`/bin/cat`, dynamically linked), `sh-cat` (`exec cat` from
//! `/bin/sh`), `static-cat` (raw system calls, no C library, so no
//! start-up CPU probing: what the boxes themselves cost, see
//! `build_static_cat`) and `py-json` (`/usr/bin/python3` importing `json`
//! and echoing its args: a script skill's interpreter start).
//!
//! `--gap-ms MS` idles that long before each sequential run (the state an
//! agent's calls find the host in: every thread parked, caches cold), and,
//! with clients at once, each client before each of its runs, spread
//! evenly over half to one and a half times it (so that the clients do not
//! stay in step): 8 clients then offer a load that leaves the host idle
//! time (warm pools refill in it) instead of keeping both CPUs queued, and
//! runs/s is that offered load rather than a throughput.
//!
//! `--max-runs N` sets every stack's `max_concurrent_runs` to N (past its
//! warm runs for `daemon-warm`): runs past it wait for a slot in order of
//! arrival, so 8 clients on fewer CPUs queue in the executor instead of in
//! the scheduler.
//!
//! `--settle` waits, untimed, after each `bwrap` and `firejail` run (or
//! round) until the host is quiet again (`ongrid_benches::settle`): their
//! namespaces are torn down after they exit, 1.5-2 ms of kernel CPU per
//! `bwrap` run here, which otherwise lands on the next variant's run. It
//! prints that CPU next to an idle host's over the same wait. The wait
//! leaves the next run after ~66 ms of idle time, as `--gap-ms` does.
//!
//! With clients at once, each round of a variant starts them together and
//! ends for the throughput when the first of them has made its 10 runs
//! (the others stop after the run they are in): runs/s, the host's CPU
//! per run and the wake-ups count the time while all of them ran, the
//! later runs their latency only (`ongrid_benches::run_round`); the rate
//! over each whole round, drain included, is printed too.
//!
//! Prints p50/p90/p99 latency, runs/s and the ratio of each to `bare`, the
//! daemons' VmRSS (idle, after the scan, after the load), and the
//! executor's `ongrid_sandbox_setup_seconds` histogram (scraped from
//! skilld's `/metrics` before and after each phase, so only the measured
//! runs count) next to the `setup_us` of the same runs' reports; how long
//! the runs through skilld waited for their audit rows
//! (`ongrid_audit_wait_seconds`, the decision's and the completion's); CPU per
//! run: each daemon's, the sandboxed skills' (the executor's children),
//! the bare skills' (loadbench's own children, when no other variant
//! spawns any), and with clients at once the whole host's (`/proc/stat`)
//! with how busy the host was. Every set's header and every host line give
//! the share of the CPUs the hypervisor gave to other guests meanwhile
//! (steal), which the host's CPU per run leaves out. Per variant, how
//! many times per run one CPU woke another (`RES` and `CAL` interrupts of
//! `/proc/interrupts`, the whole host's, read around each sequential run
//! and over each concurrent round's timed part): on a guest whose idle vCPUs halt, each is a
//! wait for the hypervisor, so they count the hops a path pays for.

mod http;
mod opts;
mod report;
mod run;
mod scrape;
mod skills;
mod stack;
mod worker;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ongrid_benches::interrupt::{self, Started};
use ongrid_benches::{
    cpu_wakeups, cpus, first_line, kernel_release, run_round, settle, HostTime, Quiet, Samples,
};

use crate::opts::{parse_opts, Variant};
use crate::report::{print_idle_settle, print_metrics, print_rss, print_table};
use crate::run::{run_one, Client, Ctx};
use crate::scrape::{parse_audit_waits, parse_hist, parse_slots, Hist, SETUP_HIST};
use crate::skills::{make_many, make_skill, skill_name};
use crate::stack::{proc_cpu, Stack};
use crate::worker::Worker;

const ARGS: &[u8] = br#"{"bench":1,"text":"hello"}"#;

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The order of the variants in iteration `i`: a shuffle (Fisher-Yates,
/// xorshift64 seeded by `i`, so every invocation runs the same orders).
/// Rotating one fixed order would make each variant always follow the same
/// one (bare right after firejail, say), whose traces in the caches it
/// would then always pay.
fn order(i: usize, n: usize) -> Vec<usize> {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut idx: Vec<usize> = (0..n).collect();
    for k in (1..n).rev() {
        let j = (next() % (k as u64 + 1)) as usize;
        idx.swap(k, j);
    }
    idx
}

/// `gap` spread evenly over [gap/2, 3 gap/2): clients at once that all
/// paused the same time would stay in step, their runs arriving as bursts
/// of all of them together.
fn jittered(gap: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static X: std::cell::Cell<u64> =
            std::cell::Cell::new(std::collections::hash_map::RandomState::new().build_hasher().finish() | 1);
    }
    let r = X.with(|x| {
        let mut v = x.get();
        v ^= v << 13;
        v ^= v >> 7;
        v ^= v << 17;
        x.set(v);
        v
    });
    gap / 2 + gap.mul_f64((r >> 11) as f64 / (1u64 << 53) as f64)
}

/// Sequential: every iteration runs each variant once, in a shuffled order
/// ([`order`]), each run after `--gap-ms` of idle time (an agent's calls
/// come between its thinking, not back to back). Throughput is runs /
/// summed latency.
fn sequential(ctx: &Ctx<'_>, variants: &[Variant], manifest: &Path) -> (Vec<Samples>, Mark) {
    let o = ctx.o;
    let mut cl = Client::default();
    let mut out = vec![Samples::default(); variants.len()];
    let n = variants.len();
    let mut mark = None;
    for i in 0..o.warmup + o.iters {
        if i == o.warmup {
            mark = Some(Mark::take(ctx));
        }
        for idx in order(i, n) {
            if !o.gap.is_zero() {
                std::thread::sleep(o.gap);
            }
            // Read outside the run's time; what the daemons do after a
            // report (a slot's recycling) falls in the next run's count.
            let woken = cpu_wakeups();
            let (el, setup) = run_one(variants[idx], ctx, &mut cl, manifest);
            if i >= o.warmup {
                out[idx].record(el, setup);
                out[idx].add_wakeups(cpu_wakeups().zip(woken).map(|(b, a)| b.saturating_sub(a)));
            }
            if o.settle {
                after_run(variants[idx], i >= o.warmup, &mut out[idx]);
            }
        }
    }
    (out, mark.unwrap_or_else(|| Mark::take(ctx)))
}

/// `conc` client threads (each with its own keep-alive connection) run one
/// variant at a time, up to `per` runs each, each run after `--gap-ms`;
/// variants alternate round by round. Throughput counts each round while
/// all its clients run ([`run_round`]).
fn concurrent(
    ctx: &Ctx<'_>,
    variants: &[Variant],
    manifest: &Path,
    conc: usize,
) -> (Vec<Samples>, Mark) {
    let o = ctx.o;
    let per = 10usize;
    let rounds = (o.iters / per).max(1);
    let warm_rounds = (o.warmup / per).max(1);
    let n = variants.len();
    let mut out = vec![Samples::default(); n];
    let clients: Vec<Mutex<Client>> = (0..conc).map(|_| Mutex::new(Client::default())).collect();
    let mut mark = None;
    for round in 0..warm_rounds + rounds {
        if round == warm_rounds {
            mark = Some(Mark::take(ctx));
        }
        for k in 0..n {
            let idx = (round + k) % n;
            let v = variants[idx];
            let clients: Vec<&Mutex<Client>> = clients.iter().collect();
            let (timed, results) = run_round(clients, per, |cl| {
                if !o.gap.is_zero() {
                    std::thread::sleep(jittered(o.gap));
                }
                run_one(v, ctx, &mut cl.lock().unwrap_or_else(PoisonError::into_inner), manifest)
            });
            if round >= warm_rounds {
                out[idx].record_round(timed, results);
                out[idx].add_wakeups(timed.wakeups);
            }
            if o.settle {
                after_run(v, round >= warm_rounds, &mut out[idx]);
            }
        }
    }
    (out, mark.unwrap_or_else(|| Mark::take(ctx)))
}

/// After a run (or round) of `v`: when it leaves kernel work behind,
/// waits untimed until the host is quiet again, so that the work falls on
/// no other variant's run, and keeps what the wait saw when `measured`.
fn after_run(v: Variant, measured: bool, s: &mut Samples) {
    if !v.leaves_teardown() {
        return;
    }
    if let Some(settled) = settle(Quiet::default()) {
        if measured {
            s.settled.push(settled);
        }
    }
}

/// The daemons' histograms and CPU when the measured runs start.
#[derive(Debug)]
struct Mark {
    hist: Vec<Hist>,
    /// `ongrid_executor_run_slots_total`: ready, recycled, made.
    slots: Vec<[f64; 3]>,
    /// `ongrid_audit_wait_seconds` by row: (sum, count) of each of
    /// [`AUDIT_ROWS`](scrape::AUDIT_ROWS).
    audit: Vec<[(f64, f64); 2]>,
    cpu: Vec<[f64; 3]>,
    /// This process's reaped children's CPU (the `bare` skills, when no
    /// other variant spawns children of its own).
    children: f64,
}

impl Mark {
    fn take(ctx: &Ctx<'_>) -> Mark {
        // One scrape per stack for everything read off `/metrics`.
        let texts: Vec<String> = ctx.stacks.values().map(Stack::scrape).collect();
        Mark {
            hist: texts.iter().map(|t| parse_hist(t, SETUP_HIST)).collect(),
            slots: texts.iter().map(|t| parse_slots(t)).collect(),
            audit: texts.iter().map(|t| parse_audit_waits(t)).collect(),
            cpu: ctx.stacks.values().map(Stack::cpu).collect(),
            children: proc_cpu(std::process::id())[1],
        }
    }
}

/// `tool` found on `PATH`, if it answers `--version`.
fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let found = std::env::split_paths(&path).map(|d| d.join(tool)).find(|p| p.is_file())?;
    Command::new(&found)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
        .then_some(found)
}

fn main() {
    // First, before any thread: an interrupted run stops its daemons.
    if let Err(e) = interrupt::watch() {
        eprintln!("loadbench: cannot watch for SIGINT/SIGTERM/SIGHUP: {e}");
        std::process::exit(2);
    }
    let mut o = parse_opts();
    println!(
        "loadbench: {} | kernel {} | {} CPUs | euid {} | iters {} warmup {} conc {:?}",
        std::env::args().collect::<Vec<_>>().join(" "),
        kernel_release(),
        cpus(),
        nix::unistd::geteuid(),
        o.iters,
        o.warmup,
        o.conc,
    );
    println!("loadavg at start: {}", first_line("/proc/loadavg"));
    println!(
        "environment of the skill: none in every variant (bare, bwrap and firejail as the \
         sandbox gives it)"
    );
    let [bwrap, firejail] = ["bwrap", "firejail"].map(|tool| {
        let v = Variant::parse(tool).unwrap();
        let found = which(tool);
        if o.variants.contains(&v) && found.is_none() {
            println!("note: {tool} not installed, variant skipped (benches/run.sh installs it)");
            o.variants.retain(|x| *x != v);
        }
        found.unwrap_or_default()
    });
    if o.settle && o.variants.iter().any(|v| v.leaves_teardown()) {
        print_idle_settle();
    }
    for bin in ["ongrid-executor", "ongrid-skilld"] {
        if !o.bin_dir.join(bin).exists() {
            eprintln!("{} missing: cargo build --release --workspace --bins", bin);
            std::process::exit(2);
        }
    }

    let tmp = tempfile::Builder::new().prefix("loadbench").tempdir().unwrap();
    let base = fs::canonicalize(tmp.path()).unwrap();
    Started::dir(&base);
    fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
    let skills_root = base.join("skills");
    fs::create_dir_all(&skills_root).unwrap();
    fs::set_permissions(&skills_root, fs::Permissions::from_mode(0o755)).unwrap();
    let manifests: Vec<(String, PathBuf)> =
        o.skills.iter().map(|k| (k.clone(), make_skill(&skills_root, k))).collect();
    let config = base.join("executor.toml");
    let cold_extra = o.max_runs.map(|n| format!("max_concurrent_runs = {n}\n")).unwrap_or_default();
    fs::write(&config, "").unwrap();
    let audit_dir = o.audit_dir.clone().unwrap_or_else(|| base.join("audit"));

    let mut stacks = BTreeMap::new();
    let mut shm_dirs = Vec::new();
    if o.variants.contains(&Variant::ExecutorRpc) && !o.variants.contains(&Variant::Daemon) {
        o.variants.push(Variant::Daemon);
    }
    // The stacks whose audit database is on the same disk (their
    // `audit_synchronous` follows the name, see `Stack::start`).
    for (variant, dir) in [
        (Variant::Daemon, "stack"),
        (Variant::DaemonNormal, "stack-normal"),
        (Variant::DaemonFull, "stack-full"),
    ] {
        if o.variants.contains(&variant) {
            let s = Stack::start(
                variant.name(),
                &o.bin_dir,
                &base.join(dir),
                std::slice::from_ref(&skills_root),
                &audit_dir,
                manifests.len(),
                &cold_extra,
            );
            stacks.insert(variant.name(), s);
        }
    }
    if o.variants.contains(&Variant::DaemonB) {
        let Some(dir) = o.bin_dir_b.clone() else {
            eprintln!("daemon-b needs --bin-dir-b DIR (the other build's daemons)");
            std::process::exit(2);
        };
        for bin in ["ongrid-executor", "ongrid-skilld"] {
            if !dir.join(bin).exists() {
                eprintln!("{} missing in --bin-dir-b {}", bin, dir.display());
                std::process::exit(2);
            }
        }
        println!("daemon-b: the daemons of {}", dir.display());
        // `--host-proc-b`: every bench skill granted the host's process
        // view, so its runs stay out of the runs' mount namespace.
        let grants: String = if o.host_proc_b {
            println!("daemon-b: every skill granted proc = \"host\"");
            o.skills
                .iter()
                .map(|k| format!("\n[skills.{}]\nproc = \"host\"\n", skill_name(k)))
                .collect()
        } else {
            String::new()
        };
        let s = Stack::start(
            "daemon-b",
            &dir,
            &base.join("stack-b"),
            std::slice::from_ref(&skills_root),
            &audit_dir,
            manifests.len(),
            &format!("{cold_extra}{grants}"),
        );
        stacks.insert("daemon-b", s);
    }
    if o.variants.contains(&Variant::DaemonShm) {
        let shm =
            tempfile::Builder::new().prefix("loadbench-audit").tempdir_in("/dev/shm").unwrap();
        Started::dir(shm.path());
        let s = Stack::start(
            "daemon-shm",
            &o.bin_dir,
            &base.join("stack-shm"),
            std::slice::from_ref(&skills_root),
            shm.path(),
            manifests.len(),
            &cold_extra,
        );
        stacks.insert("daemon-shm", s);
        shm_dirs.push(shm);
    }
    if o.variants.contains(&Variant::Daemon10k) {
        let many = base.join("many");
        let t0 = Instant::now();
        make_many(&many, o.loaded_skills);
        println!("generated {} packs in {:.1} s", o.loaded_skills, t0.elapsed().as_secs_f64());
        let s = Stack::start(
            "daemon10k",
            &o.bin_dir,
            &base.join("stack10k"),
            &[skills_root.clone(), many],
            &audit_dir,
            manifests.len() + o.loaded_skills,
            &cold_extra,
        );
        stacks.insert("daemon10k", s);
    }
    if o.variants.contains(&Variant::DaemonWarm) {
        let s =
            start_warm(&o, &o.bin_dir, "daemon-warm", &base, &skills_root, &audit_dir, &manifests);
        stacks.insert("daemon-warm", s);
    }
    if o.variants.contains(&Variant::DaemonWarmB) {
        let Some(dir) = o.bin_dir_b.clone() else {
            eprintln!("daemon-warm-b needs --bin-dir-b DIR (the other build's daemons)");
            std::process::exit(2);
        };
        let s = start_warm(&o, &dir, "daemon-warm-b", &base, &skills_root, &audit_dir, &manifests);
        stacks.insert("daemon-warm-b", s);
    }
    for s in stacks.values() {
        println!(
            "VmRSS {:<12} {:<10} executor {:>6.1} MiB  skilld {:>6.1} MiB",
            "idle",
            s.name,
            s.rss_idle_kb.0 as f64 / 1024.0,
            s.rss_idle_kb.1 as f64 / 1024.0
        );
    }
    let mut workers = BTreeMap::new();
    if o.variants.contains(&Variant::Engine) {
        workers.insert("engine", Worker::start(0));
    }
    if o.variants.contains(&Variant::Engine1g) {
        workers.insert("engine1g", Worker::start(o.ballast_mb));
    }
    for (name, w) in &workers {
        println!("worker {name}: VmRSS {:.1} MiB", w.rss_kb as f64 / 1024.0);
    }
    let ctx = Ctx { o: &o, bwrap, firejail, config, stacks, workers: Mutex::new(workers) };

    for (kind, manifest) in &manifests {
        for &conc in &o.conc {
            let variants: Vec<Variant> =
                o.variants.iter().copied().filter(|v| conc == 1 || !v.sequential_only()).collect();
            let (t0, host0) = (Instant::now(), HostTime::now());
            let (samples, mark) = if conc == 1 {
                sequential(&ctx, &variants, manifest)
            } else {
                concurrent(&ctx, &variants, manifest, conc)
            };
            // The share of the CPUs the hypervisor gave to other guests
            // meanwhile: the rounds of a set share it (variants alternate),
            // but a high one makes every figure of the set noisier.
            let stolen = HostTime::now()
                .zip(host0)
                .map_or(0.0, |(h, h0)| HostTime::share(h.since(h0).steal, t0.elapsed(), cpus()));
            println!(
                "\nskill {kind}, {} ({} s, loadavg {}, stolen {stolen:.0} % of {} CPUs):",
                if conc == 1 { "sequential".to_owned() } else { format!("{conc} clients") },
                t0.elapsed().as_secs(),
                first_line("/proc/loadavg"),
                cpus()
            );
            print_table(&variants, &samples);
            print_metrics(&ctx, &variants, &samples, &mark);
            for s in ["daemon-warm", "daemon-warm-b"].iter().filter_map(|n| ctx.stacks.get(n)) {
                let text = s.scrape();
                let sum = |name: &str| crate::scrape::labelled_sum(&text, name);
                println!(
                    "{}: since start: warm hits {:.0}, misses {:.0}, discarded {:.0}",
                    s.name,
                    sum("ongrid_warm_hits_total"),
                    sum("ongrid_warm_misses_total"),
                    sum("ongrid_warm_discarded_total")
                );
            }
            print_rss(&ctx, &format!("after c={conc}"));
        }
    }
    println!("\nloadavg at end: {}", first_line("/proc/loadavg"));
    drop(ctx);
    drop(shm_dirs);
}

/// The `daemon-warm` stack (`name`, daemons of `bin_dir`): every bench
/// skill granted `--warm` warm runs, pinned to its manifest so the pools
/// fill at start; waits for them to fill and prints what an idle warm run
/// holds.
fn start_warm(
    o: &opts::Opts,
    bin_dir: &Path,
    name: &'static str,
    base: &Path,
    skills_root: &Path,
    audit_dir: &Path,
    manifests: &[(String, PathBuf)],
) -> Stack {
    let total = o.warm as usize * manifests.len();
    let mut extra = format!(
        "max_warm_total = {total}\nmax_concurrent_runs = {}\n",
        match o.max_runs {
            Some(n) => total + n,
            None => (total + 8).max(16),
        }
    );
    for (kind, manifest) in manifests {
        let path = serde_json::Value::String(manifest.display().to_string());
        extra.push_str(&format!(
            "[skills.{}]\nwarm = {}\nmanifest = {path}\n",
            skill_name(kind),
            o.warm
        ));
    }
    let s = Stack::start(
        name,
        bin_dir,
        &base.join(name),
        &[skills_root.to_owned()],
        audit_dir,
        manifests.len(),
        &extra,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.idle_skills().len() < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Settled: what a warm run holds once its start-up is done.
    std::thread::sleep(Duration::from_millis(500));
    let idle = s.idle_skills();
    let n = idle.len().max(1) as f64;
    let (rss, pss): (u64, u64) = idle.iter().fold((0, 0), |(a, b), (r, p)| (a + r, b + p));
    println!(
        "{name}: {} idle warm runs of {total} ({} skills x {}): VmRSS {:.1} MiB each, \
         PSS {:.1} MiB each (mean)",
        idle.len(),
        manifests.len(),
        o.warm,
        rss as f64 / n / 1024.0,
        pss as f64 / n / 1024.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::{jittered, order};
    use std::time::Duration;

    /// Paced clients pause between half and one and a half times the gap,
    /// spread out rather than in step.
    #[test]
    fn jittered_gaps_stay_in_range_and_differ() {
        let gap = Duration::from_millis(20);
        let pauses: Vec<Duration> = (0..1000).map(|_| jittered(gap)).collect();
        assert!(pauses.iter().all(|p| *p >= gap / 2 && *p < gap * 3 / 2), "{pauses:?}");
        let low = pauses.iter().filter(|p| **p < gap).count();
        assert!((300..700).contains(&low), "{low} of 1000 below the gap");
    }

    /// Each iteration runs every variant once, and over the iterations
    /// every variant comes right after every other one (a rotation of one
    /// order never does that).
    #[test]
    fn orders_are_permutations_with_every_neighbour() {
        let n = 7;
        let mut follows = vec![vec![0u32; n]; n];
        for i in 0..2000 {
            let o = order(i, n);
            let mut seen = o.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "iteration {i}: {o:?}");
            for w in o.windows(2) {
                follows[w[1]][w[0]] += 1;
            }
        }
        for (b, row) in follows.iter().enumerate() {
            for (a, count) in row.iter().enumerate() {
                if a != b {
                    assert!(*count > 150, "{b} after {a} only {count} times in 2000");
                }
            }
        }
        assert_eq!(order(5, n), order(5, n), "the same order every invocation");
    }
}
