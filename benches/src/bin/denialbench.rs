//! `denialbench`: what reporting the runs' refusals (`report_denials`)
//! costs a clean run, and what a flood of refusals in one run does to the
//! executor's memory and to other runs' latency.
//!
//! One engine in this process with `report_denials` as `--mode` says
//! (`on` enables the kernel's audit when it is off and restores it at the
//! end). Phase 1: `--iters` sequential clean runs of a `/bin/cat` skill.
//! Phase 2 (`--flood N`): a Python skill opens a file outside its box N
//! times (each refused by Landlock) while this thread keeps running clean
//! runs one after another; the flood run's report must stay bounded.
//!
//! ```sh
//! cargo build --release -p ongrid-benches
//! sudo target/release/denialbench --mode off --iters 500
//! sudo target/release/denialbench --mode on --iters 500 --flood 1000000
//! ```

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use executor::{Config, Engine, RunRequest};
use ongrid_benches::{first_line, kernel_release, pct, sorted};
use policy::{Outcome, RunReport};

const ARGS: &[u8] = br#"{"bench":1}"#;

/// A skill folder (0755) whose entry is a copy of the file `entry` when
/// `copy`, else the script `entry`.
fn skill(base: &Path, name: &str, entry: &str, copy: bool) -> PathBuf {
    let bytes = if copy { std::fs::read(entry).unwrap() } else { entry.as_bytes().to_vec() };
    let extra = r#","timeout_seconds":600"#;
    testkit::write_pack_entry(base, name, "run", extra, &bytes).join("skill.json")
}

fn status_kib(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn run(engine: &Engine, rt: &tokio::runtime::Runtime, manifest: &Path, args: &[u8]) -> RunReport {
    let req = RunRequest { manifest_path: manifest.to_owned(), args: args.to_vec() };
    rt.block_on(engine.run(req, &mut |_| {}, std::future::pending()))
}

/// Clean runs until `until` says stop; their latencies, µs.
fn clean_runs(
    engine: &Engine,
    rt: &tokio::runtime::Runtime,
    manifest: &Path,
    mut more: impl FnMut(usize) -> bool,
) -> Vec<f64> {
    let mut lat = Vec::new();
    while more(lat.len()) {
        let t = Instant::now();
        let r = run(engine, rt, manifest, ARGS);
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        let sandbox = r.sandbox.as_ref().expect("sandbox");
        assert!(sandbox.denials.is_empty(), "a clean run listed {:?}", sandbox.denials);
    }
    lat
}

fn line(what: &str, lat: &[f64]) {
    let s = sorted(lat);
    println!(
        "{what:<28} n {:>6}  p50 {:>8.0} us  p90 {:>8.0} us  p99 {:>8.0} us",
        s.len(),
        pct(&s, 0.5),
        pct(&s, 0.9),
        pct(&s, 0.99)
    );
}

fn main() {
    let mut mode = "on".to_owned();
    let (mut iters, mut flood) = (300usize, 0u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--mode" => mode = v,
            "--iters" => iters = v.parse().expect("--iters N"),
            "--flood" => flood = v.parse().expect("--flood N"),
            _ => panic!("usage: denialbench [--mode on|off|auto] [--iters N] [--flood N]"),
        }
    }
    println!(
        "denialbench: mode {mode} iters {iters} flood {flood} | kernel {} | {} CPUs",
        kernel_release(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!("loadavg at start: {}", first_line("/proc/loadavg"));
    let tmp = tempfile::Builder::new().prefix("denialbench").tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let text = format!("report_denials = \"{mode}\"\n");
    let config = Config::parse(&text, Path::new("denialbench.toml")).expect("config");
    let engine = Engine::new(config).expect("engine");
    println!("denials off: {:?}", engine.denials().0);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let cat = skill(tmp.path(), "bench_cat", "/bin/cat", true);
    let _ = clean_runs(&engine, &rt, &cat, |n| n < 20);
    let rss0 = status_kib("VmRSS:");
    line("clean runs", &clean_runs(&engine, &rt, &cat, |n| n < iters));
    if flood == 0 {
        return;
    }
    let target = tmp.path().join("outside");
    std::fs::write(&target, "x").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    let py = format!(
        "#!/usr/bin/python3\nn = 0\nfor _ in range({flood}):\n    try:\n        open({:?}).close()\n    except OSError:\n        n += 1\nprint(n)\n",
        target.display().to_string()
    );
    let flooder = skill(tmp.path(), "bench_flood", &py, false);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (report, during, took) = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let t = Instant::now();
            let r = run(&engine, &rt, &flooder, b"{}");
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            (r, t.elapsed())
        });
        let during =
            clean_runs(&engine, &rt, &cat, |_| !done.load(std::sync::atomic::Ordering::Relaxed));
        let (r, took) = h.join().expect("flood run");
        (r, during, took)
    });
    line("clean runs during the flood", &during);
    let sandbox = report.sandbox.as_ref().expect("sandbox");
    println!(
        "flood run: {:?} in {:.1} s, result {:?}, {} entries, denials_total {}, first {:?}",
        report.outcome,
        took.as_secs_f64(),
        report.result.as_ref().map(|r| r.get().to_owned()),
        sandbox.denials.len(),
        sandbox.denials_total,
        sandbox.denials.first()
    );
    println!(
        "executor VmRSS {rss0} KiB before the flood, {} KiB after; VmHWM {} KiB; records lost/late {:?}",
        status_kib("VmRSS:"),
        status_kib("VmHWM:"),
        engine.denials().1
    );
}
