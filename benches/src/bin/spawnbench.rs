//! `spawnbench`: what the full sandbox costs over a bare spawn of the same
//! skill, measured side by side in one process.
//!
//! Variants, interleaved (A B C D, B C D A, ...) so the noise of a shared
//! machine falls on all of them alike:
//!
//! - `bare`: `std::process::Command` (glibc `posix_spawn`), piped stdio, the
//!   args written to stdin, stdout read to the end, reaped.
//! - `fork`: the same, forced onto `fork` + `exec` (uid and gid set, which
//!   std cannot do through `posix_spawn`), as any `pre_exec` sandbox is; the
//!   contrast for `--ballast-mb`.
//! - `engine`: `executor::Engine::run` in this process: validation, the
//!   full sandbox, supervision, teardown, the report.
//! - `cli`: `ongrid-executor run` as a process (its start-up included).
//!
//! Skills: `sh-cat` (`#!/bin/sh` + `exec cat`) and `bin-cat` (a copy of
//! `/bin/cat` as the entry: one exec, no shell). Both echo the args JSON.
//!
//! ```sh
//! cargo build --release -p ongrid-executor -p ongrid-benches
//! sudo target/release/spawnbench --iters 2000
//! sudo target/release/spawnbench --iters 300 --conc 8
//! sudo target/release/spawnbench --iters 500 --ballast-mb 2048 --variants bare,fork,engine
//! ```
//!
//! Prints p50/p90/p99 latency, runs/s, CPU per run (sequential only; with
//! `--conc`, the whole host's CPU per run from `/proc/stat`), the
//! engine's `setup_us` (validation to exec), and each variant's ratio to
//! `bare`, plus the median of the per-iteration (engine - bare) pairs.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use executor::{Config, Engine, RunRequest};
use nix::sys::resource::{getrusage, UsageWho};
use policy::Outcome;

const ARGS: &[u8] = br#"{"bench":1,"text":"hello"}"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Bare,
    Fork,
    Engine,
    Cli,
}

impl Variant {
    fn parse(s: &str) -> Option<Variant> {
        Some(match s {
            "bare" => Variant::Bare,
            "fork" => Variant::Fork,
            "engine" => Variant::Engine,
            "cli" => Variant::Cli,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::Fork => "fork",
            Variant::Engine => "engine",
            Variant::Cli => "cli",
        }
    }
}

#[derive(Debug)]
struct Opts {
    iters: usize,
    warmup: usize,
    conc: usize,
    ballast_mb: usize,
    skills: Vec<String>,
    variants: Vec<Variant>,
    executor: PathBuf,
}

fn usage() -> ! {
    eprintln!(
        "usage: spawnbench [--iters N] [--warmup N] [--conc C] [--ballast-mb M] \
         [--skills sh-cat,bin-cat] [--variants bare,fork,engine,cli] [--executor PATH]"
    );
    std::process::exit(2)
}

fn parse_opts() -> Opts {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let mut o = Opts {
        iters: 1000,
        warmup: 50,
        conc: 1,
        ballast_mb: 0,
        skills: vec!["sh-cat".into(), "bin-cat".into()],
        variants: vec![Variant::Bare, Variant::Fork, Variant::Engine, Variant::Cli],
        executor: exe_dir.join("ongrid-executor"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<usize>().unwrap_or_else(|_| usage());
        match a.as_str() {
            "--iters" => o.iters = num(val()),
            "--warmup" => o.warmup = num(val()),
            "--conc" => o.conc = num(val()).max(1),
            "--ballast-mb" => o.ballast_mb = num(val()),
            "--skills" => o.skills = val().split(',').map(str::to_owned).collect(),
            "--variants" => {
                o.variants = val()
                    .split(',')
                    .map(|v| Variant::parse(v).unwrap_or_else(|| usage()))
                    .collect();
            }
            "--executor" => o.executor = PathBuf::from(val()),
            _ => usage(),
        }
    }
    o
}

/// A skill folder: mode 0755, owned by us (root), entry executable.
fn make_skill(base: &Path, kind: &str) -> PathBuf {
    let entry = match kind {
        "sh-cat" => b"#!/bin/sh\nexec cat\n".to_vec(),
        "bin-cat" => std::fs::read("/bin/cat").unwrap(),
        other => panic!("unknown skill {other} (sh-cat, bin-cat)"),
    };
    let name = format!("bench_{}", kind.replace('-', "_"));
    let extra = r#","timeout_seconds":10"#;
    testkit::write_pack_entry(base, &name, "run", extra, &entry).join("skill.json")
}

fn cpu_now() -> Duration {
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
    };
    let mut d = Duration::ZERO;
    // This thread (not the engine's janitor) and every reaped descendant.
    for who in [UsageWho::RUSAGE_THREAD, UsageWho::RUSAGE_CHILDREN] {
        if let Ok(u) = getrusage(who) {
            d += tv(u.user_time()) + tv(u.system_time());
        }
    }
    d
}

struct Ctx<'a> {
    engine: &'a Engine,
    executor: &'a Path,
    config: &'a Path,
}

/// One run of `v`; returns the engine's `setup_us` when there is one.
fn run_one(
    v: Variant,
    ctx: &Ctx<'_>,
    rt: &tokio::runtime::Runtime,
    manifest: &Path,
) -> Option<u64> {
    let entry = manifest.with_file_name("run");
    match v {
        Variant::Bare | Variant::Fork => {
            let mut cmd = Command::new(&entry);
            // The environment the skill gets in the sandbox (its manifest's
            // `env_allow`: nothing); see loadbench's `run_one`.
            cmd.env_clear();
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
            if v == Variant::Fork {
                cmd.uid(nix::unistd::geteuid().as_raw()).gid(nix::unistd::getegid().as_raw());
            }
            let mut c = cmd.spawn().expect("spawn");
            c.stdin.take().expect("stdin").write_all(ARGS).expect("write args");
            let out = c.wait_with_output().expect("wait");
            assert!(out.status.success() && out.stdout == ARGS, "bare run: {out:?}");
            None
        }
        Variant::Engine => {
            let req = RunRequest { manifest_path: manifest.to_owned(), args: ARGS.to_vec() };
            let r = rt.block_on(ctx.engine.run(req, &mut |_| {}, std::future::pending()));
            assert_eq!(r.outcome, Outcome::Ok, "engine run: {r:?}");
            Some(r.setup_us)
        }
        Variant::Cli => {
            let mut c = Command::new(ctx.executor)
                .arg("run")
                .arg("--manifest")
                .arg(manifest)
                .arg("--config")
                .arg(ctx.config)
                .arg("--args")
                .arg(std::str::from_utf8(ARGS).unwrap_or("{}"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn ongrid-executor");
            let mut out = Vec::new();
            c.stdout.take().expect("stdout").read_to_end(&mut out).expect("read");
            let st = c.wait().expect("wait");
            assert!(st.success() && out.trim_ascii_end() == ARGS, "cli run: {st} {out:?}");
            None
        }
    }
}

use ongrid_benches::{cpus, first_line, kernel_release, pct, run_round, sorted, HostTime, Samples};

/// Sequential: every iteration runs each variant once, in a rotating order.
fn sequential(o: &Opts, ctx: &Ctx<'_>, manifest: &Path) -> Vec<Samples> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut out: Vec<Samples> = o.variants.iter().map(|_| Samples::default()).collect();
    let n = o.variants.len();
    for i in 0..o.warmup + o.iters {
        for k in 0..n {
            let idx = (i + k) % n;
            let (c0, t0) = (cpu_now(), Instant::now());
            let setup = run_one(o.variants[idx], ctx, &rt, manifest);
            let (el, cpu) = (t0.elapsed(), cpu_now().saturating_sub(c0));
            if i >= o.warmup {
                out[idx].record(el, setup);
                out[idx].cpu_us.push(cpu.as_secs_f64() * 1e6);
            }
        }
    }
    out
}

/// `conc` threads (one current-thread runtime each) run one variant at a
/// time, up to `per` runs each; variants alternate round by round.
/// Throughput counts each round while all its threads run ([`run_round`]).
fn concurrent(o: &Opts, ctx: &Ctx<'_>, manifest: &Path) -> Vec<Samples> {
    let mut out: Vec<Samples> = o.variants.iter().map(|_| Samples::default()).collect();
    let per = 10usize;
    let rounds = (o.iters / per).max(1);
    let warm_rounds = (o.warmup / per).max(1);
    let n = o.variants.len();
    for round in 0..warm_rounds + rounds {
        for k in 0..n {
            let idx = (round + k) % n;
            let v = o.variants[idx];
            // One current-thread runtime per client, built outside the round.
            let runtimes: Vec<_> = (0..o.conc)
                .map(|_| {
                    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
                })
                .collect();
            let (timed, results) = run_round(runtimes, per, |rt| {
                let t0 = Instant::now();
                let setup = run_one(v, ctx, rt, manifest);
                (t0.elapsed(), setup)
            });
            if round >= warm_rounds {
                out[idx].record_round(timed, results);
            }
        }
    }
    out
}

fn ballast(mb: usize) -> Vec<u8> {
    let mut v = vec![0u8; mb << 20];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    std::hint::black_box(&mut v);
    v
}

fn status_field(name: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(name))
        .map(|l| l.trim_start_matches(name).trim().to_owned())
        .unwrap_or_default()
}

/// CPU time of this process's threads named `name` (`schedstat`), ns.
fn thread_cpu_ns(name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(Result::ok)
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
        .sum()
}

fn main() {
    let o = parse_opts();
    println!(
        "spawnbench: {} | kernel {} | {} CPUs | euid {} | iters {} warmup {} conc {} ballast {} MiB",
        std::env::args().collect::<Vec<_>>().join(" "),
        kernel_release(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        nix::unistd::geteuid(),
        o.iters,
        o.warmup,
        o.conc,
        o.ballast_mb,
    );
    println!("loadavg at start: {}", first_line("/proc/loadavg"));
    let _ballast = (o.ballast_mb > 0).then(|| ballast(o.ballast_mb));
    println!("VmRSS {} | VmSize {}", status_field("VmRSS:"), status_field("VmSize:"));
    if o.variants.contains(&Variant::Cli) && !o.executor.exists() {
        eprintln!(
            "{} missing: cargo build --release -p ongrid-executor (or --executor PATH)",
            o.executor.display()
        );
        std::process::exit(2);
    }

    let tmp = tempfile::Builder::new().prefix("spawnbench").tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let config_path = tmp.path().join("executor.toml");
    std::fs::write(&config_path, "").unwrap();
    let engine = Engine::new(Config::default()).expect("engine");
    let ctx = Ctx { engine: &engine, executor: &o.executor, config: &config_path };

    for kind in &o.skills {
        let manifest = make_skill(tmp.path(), kind);
        let janitor0 = thread_cpu_ns("ongrid-janitor");
        let t0 = Instant::now();
        let samples = if o.conc > 1 {
            concurrent(&o, &ctx, &manifest)
        } else {
            sequential(&o, &ctx, &manifest)
        };
        println!("\nskill {kind} ({} s):", t0.elapsed().as_secs());
        println!(
            "{:<8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>10}",
            "variant",
            "n",
            "p50 us",
            "p90 us",
            "p99 us",
            "mean us",
            "runs/s",
            "cpu p50 us",
            "x bare",
            "+p50 us"
        );
        let bare_p50 = o
            .variants
            .iter()
            .position(|v| *v == Variant::Bare)
            .map(|i| pct(&sorted(&samples[i].lat_us), 0.5));
        for (v, s) in o.variants.iter().zip(&samples) {
            let l = sorted(&s.lat_us);
            let p50 = pct(&l, 0.5);
            let mean = l.iter().sum::<f64>() / l.len().max(1) as f64;
            let rps = s.runs_per_s();
            let cpu = pct(&sorted(&s.cpu_us), 0.5);
            let (ratio, added) = match bare_p50 {
                Some(b) => (format!("{:.2}", p50 / b), format!("{:+.0}", p50 - b)),
                None => ("-".into(), "-".into()),
            };
            println!(
                "{:<8} {:>6} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>10.0} {:>8} {:>10}",
                v.name(),
                l.len(),
                p50,
                pct(&l, 0.9),
                pct(&l, 0.99),
                mean,
                rps,
                cpu,
                ratio,
                added
            );
        }
        for (v, s) in o.variants.iter().zip(&samples).filter(|(_, s)| !s.busy.is_zero()) {
            // With runs at once: the whole host's CPU per run, all processes,
            // and how much of the CPUs the hypervisor gave to others.
            let cpus = cpus();
            println!(
                "{} host CPU per run {:.0} us (all processes, /proc/stat, steal apart); stolen \
                 {:.0} % of {cpus} CPUs",
                v.name(),
                s.busy_per_run().as_secs_f64() * 1e6,
                HostTime::share(s.steal, s.wall, cpus)
            );
        }
        if let Some(i) = o.variants.iter().position(|v| *v == Variant::Engine) {
            // Made and removed off the runs' critical path, on its own thread.
            let ns = thread_cpu_ns("ongrid-janitor").saturating_sub(janitor0);
            let runs = samples[i].runs.max(1) as f64;
            println!(
                "engine janitor thread (slots made ahead, teardown after the report): {:.0} us CPU per run",
                ns as f64 / 1e3 / runs
            );
        }
        for (v, s) in o.variants.iter().zip(&samples) {
            if !s.setup_us.is_empty() {
                let st = sorted(&s.setup_us);
                println!(
                    "{} setup_us (validation to exec): p50 {:.0} p90 {:.0} p99 {:.0}",
                    v.name(),
                    pct(&st, 0.5),
                    pct(&st, 0.9),
                    pct(&st, 0.99)
                );
            }
        }
        if o.conc == 1 {
            if let Some(b) = o.variants.iter().position(|v| *v == Variant::Bare) {
                for (i, v) in o.variants.iter().enumerate() {
                    if i == b {
                        continue;
                    }
                    let d: Vec<f64> = samples[i]
                        .lat_us
                        .iter()
                        .zip(&samples[b].lat_us)
                        .map(|(x, y)| x - y)
                        .collect();
                    let d = sorted(&d);
                    println!(
                        "paired {} - bare, same iteration: p25 {:+.0} p50 {:+.0} p75 {:+.0} us",
                        v.name(),
                        pct(&d, 0.25),
                        pct(&d, 0.5),
                        pct(&d, 0.75)
                    );
                }
            }
        }
    }
    println!("\nloadavg at end: {}", first_line("/proc/loadavg"));
}
