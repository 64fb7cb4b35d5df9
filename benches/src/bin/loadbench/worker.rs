//! The worker process of the `engine` variants: `executor::Engine::run`
//! in this binary started again with `--engine-worker MB` ([`Worker`]).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use executor::{Config, Engine, RunRequest};
use policy::Outcome;

use crate::stack::vm_rss_kb;
use crate::ARGS;

/// `--engine-worker MB`: holds MB of touched ballast and an `Engine`; for
/// each manifest path read on stdin, runs it once and prints
/// `<latency ns> <setup_us>`. The first line is `ready <VmRSS kB>`.
pub(crate) fn engine_worker(mb: usize) -> ! {
    let mut ballast = vec![0u8; mb << 20];
    for i in (0..ballast.len()).step_by(4096) {
        ballast[i] = 1;
    }
    std::hint::black_box(&mut ballast);
    let engine = Engine::new(Config::default()).expect("engine");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {}", vm_rss_kb(std::process::id())).unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let req = RunRequest { manifest_path: PathBuf::from(line.trim()), args: ARGS.to_vec() };
        let t0 = Instant::now();
        let r = rt.block_on(engine.run(req, &mut |_| {}, std::future::pending()));
        let ns = t0.elapsed().as_nanos();
        assert_eq!(r.outcome, Outcome::Ok, "engine run: {r:?}");
        writeln!(out, "{ns} {}", r.setup_us).unwrap();
        out.flush().unwrap();
    }
    std::process::exit(0)
}

#[derive(Debug)]
pub(crate) struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub(crate) rss_kb: u64,
}

impl Worker {
    pub(crate) fn start(mb: usize) -> Worker {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .arg("--engine-worker")
            .arg(mb.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("engine worker");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let rss_kb = line.trim().strip_prefix("ready ").and_then(|s| s.parse().ok()).unwrap_or(0);
        Worker { child, stdin, stdout, rss_kb }
    }

    pub(crate) fn run(&mut self, manifest: &Path) -> (Duration, u64) {
        writeln!(self.stdin, "{}", manifest.display()).unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let mut it = line.split_whitespace().map(|s| s.parse::<u64>().unwrap());
        let ns = it.next().expect("worker answer");
        (Duration::from_nanos(ns), it.next().unwrap_or(0))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
