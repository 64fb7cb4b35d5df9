//! `egressbench`: what a networked run's egress allowlist costs, side by
//! side in one process (`executor::Engine::run`, interleaved so a shared
//! machine's noise falls on every variant alike):
//!
//! - `off`: the same skill without the network (the non-networked path,
//!   which attaches nothing).
//! - `bare`: `network = true` without a list (every destination but the
//!   default refusals: still attached).
//! - `list32`: `network = true` with 32 `connect` entries.
//!
//! Each run's skill is a copy of `/bin/cat` echoing its args; nothing is
//! sent anywhere. Root, for the BPF programs and cgroups.
//!
//! ```sh
//! cargo build --release -p ongrid-benches
//! sudo target/release/egressbench --iters 2000
//! ```

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use executor::{Config, Engine, RunRequest};
use policy::Outcome;

const ARGS: &[u8] = br#"{"bench":1}"#;

/// A `/bin/cat` skill folder (0755), granted the network when `network`.
fn make_skill(base: &Path, name: &str, network: bool) -> PathBuf {
    let sandbox = if network { r#","sandbox":{"network":true}"# } else { "" };
    let extra = format!(r#","timeout_seconds":10{sandbox}"#);
    let cat = std::fs::read("/bin/cat").unwrap();
    testkit::write_pack_entry(base, name, "run", &extra, &cat).join("skill.json")
}

fn config(text: &str) -> Config {
    Config::parse(text, Path::new("egressbench.toml")).expect("config")
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let mut iters = 1000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--iters", Some(n)) => iters = n,
            _ => {
                eprintln!("usage: egressbench [--iters N]");
                std::process::exit(2);
            }
        }
    }
    let tmp = tempfile::Builder::new().prefix("egressbench").tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let off = make_skill(tmp.path(), "bench_off", false);
    let net = make_skill(tmp.path(), "bench_net", true);
    let list: Vec<String> = (0..32).map(|i| format!("\"10.{i}.0.0/16:{}\"", 1000 + i)).collect();
    let engines = [
        ("off", Engine::new(config("")).expect("engine"), off),
        (
            "bare",
            Engine::new(config("[skills.bench_net]\nnetwork = true\n")).expect("engine"),
            net.clone(),
        ),
        (
            "list32",
            Engine::new(config(&format!(
                "[skills.bench_net]\nnetwork = true\nconnect = [{}]\n",
                list.join(", ")
            )))
            .expect("engine"),
            net,
        ),
    ];
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut lat: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    let mut setup: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    for i in 0..iters + 20 {
        for k in 0..engines.len() {
            let (name, engine, manifest) = &engines[(i + k) % engines.len()];
            let req = RunRequest { manifest_path: manifest.clone(), args: ARGS.to_vec() };
            let t = Instant::now();
            let r = rt.block_on(engine.run(req, &mut |_| {}, std::future::pending()));
            let us = t.elapsed().as_secs_f64() * 1e6;
            assert_eq!(r.outcome, Outcome::Ok, "{name}: {r:?}");
            if i >= 20 {
                lat[(i + k) % engines.len()].push(us);
                setup[(i + k) % engines.len()].push(r.setup_us as f64);
            }
        }
    }
    println!("egressbench: {iters} runs each, interleaved (Engine::run, /bin/cat)");
    println!(
        "{:<8} {:>9} {:>9} {:>12} {:>10}",
        "variant", "p50 us", "p90 us", "setup p50", "+p50 us"
    );
    let mut base = None;
    for (k, (name, _, _)) in engines.iter().enumerate() {
        let mut l = lat[k].clone();
        l.sort_by(f64::total_cmp);
        let mut s = setup[k].clone();
        s.sort_by(f64::total_cmp);
        let p50 = pct(&l, 0.5);
        let b = *base.get_or_insert(p50);
        println!(
            "{name:<8} {p50:>9.0} {:>9.0} {:>12.0} {:>+10.0}",
            pct(&l, 0.9),
            pct(&s, 0.5),
            p50 - b
        );
    }
}
