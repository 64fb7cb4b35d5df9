//! `loadbench`: one trivial JSON skill run every way we care about, side by
//! side in one invocation (issue 7).
//!
//! Variants (each iteration runs every variant once, in a shuffled order, so
//! the noise of a shared machine falls on all of them alike):
//!
//! - `bare`: `std::process::Command` (glibc `posix_spawn`), piped stdio, the
//!   args written to stdin, stdout read to the end, reaped. The baseline (a).
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
//! `/bin/sh`) and `static-cat` (raw system calls, no C library, so no
//! start-up CPU probing: what the boxes themselves cost, see
//! `build_static_cat`).
//!
//! `--gap-ms MS` idles that long before each sequential run (the state an
//! agent's calls find the host in: every thread parked, caches cold).
//!
//! `--settle` waits, untimed, after each `bwrap` and `firejail` run (or
//! round) until the host is quiet again (`ongrid_benches::settle`): their
//! namespaces are torn down after they exit, 1.5-2 ms of kernel CPU per
//! `bwrap` run here, which otherwise lands on the next variant's run. It
//! prints that CPU next to an idle host's over the same wait. The wait
//! leaves the next run after ~66 ms of idle time, as `--gap-ms` does
//! (BENCHMARKS.md, twenty-ninth pass).
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

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use executor::{Config, Engine, RunRequest};
use policy::Outcome;
use serde_json::Value;

const ARGS: &[u8] = br#"{"bench":1,"text":"hello"}"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Bare,
    Cli,
    Daemon,
    Daemon10k,
    DaemonShm,
    DaemonNormal,
    DaemonFull,
    DaemonB,
    ExecutorRpc,
    Engine,
    Engine1g,
    Bwrap,
    Firejail,
}

const ALL: [Variant; 13] = [
    Variant::Bare,
    Variant::Cli,
    Variant::Daemon,
    Variant::Daemon10k,
    Variant::DaemonShm,
    Variant::DaemonNormal,
    Variant::DaemonFull,
    Variant::DaemonB,
    Variant::ExecutorRpc,
    Variant::Engine,
    Variant::Engine1g,
    Variant::Bwrap,
    Variant::Firejail,
];

impl Variant {
    fn parse(s: &str) -> Option<Variant> {
        ALL.into_iter().find(|v| v.name() == s)
    }

    fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::Cli => "cli",
            Variant::Daemon => "daemon",
            Variant::Daemon10k => "daemon10k",
            Variant::DaemonShm => "daemon-shm",
            Variant::DaemonNormal => "daemon-normal",
            Variant::DaemonFull => "daemon-full",
            Variant::DaemonB => "daemon-b",
            Variant::ExecutorRpc => "executor-rpc",
            Variant::Engine => "engine",
            Variant::Engine1g => "engine1g",
            Variant::Bwrap => "bwrap",
            Variant::Firejail => "firejail",
        }
    }

    /// Its runs leave kernel work behind them (the teardown of their
    /// namespaces) that lands on the next variant's run; with `--settle`
    /// each is followed by an untimed [`settle`].
    fn leaves_teardown(self) -> bool {
        matches!(self, Variant::Bwrap | Variant::Firejail)
    }

    /// Runs inside a single worker process: sequential only.
    fn sequential_only(self) -> bool {
        matches!(self, Variant::Engine | Variant::Engine1g)
    }
}

#[derive(Debug)]
struct Opts {
    iters: usize,
    warmup: usize,
    conc: Vec<usize>,
    ballast_mb: usize,
    loaded_skills: usize,
    skills: Vec<String>,
    variants: Vec<Variant>,
    bin_dir: PathBuf,
    /// The other build's daemons, for `daemon-b`.
    bin_dir_b: Option<PathBuf>,
    audit_dir: Option<PathBuf>,
    /// Sequential runs: idle time before each run (0: back to back).
    gap: Duration,
    /// Wait untimed after each `bwrap` and `firejail` run (or round) until
    /// the host is quiet, and report what the wait saw.
    settle: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: loadbench [--iters N] [--warmup N] [--conc 1,8] [--ballast-mb M] \
         [--loaded-skills N] [--skills sh-cat,bin-cat,static-cat] \
         [--variants bare,cli,daemon,daemon10k,daemon-shm,daemon-normal,daemon-full,daemon-b,executor-rpc,engine,engine1g,bwrap,firejail] \
         [--bin-dir DIR] [--bin-dir-b DIR] [--audit-dir DIR] [--gap-ms MS] [--settle]\n       loadbench --engine-worker MB"
    );
    std::process::exit(2)
}

fn parse_opts() -> Opts {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let mut o = Opts {
        iters: 500,
        warmup: 30,
        conc: vec![1, 8],
        ballast_mb: 1024,
        loaded_skills: 10_000,
        skills: vec!["bin-cat".into(), "sh-cat".into()],
        variants: ALL
            .into_iter()
            .filter(|v| {
                !matches!(
                    v,
                    Variant::DaemonShm
                        | Variant::DaemonNormal
                        | Variant::DaemonFull
                        | Variant::DaemonB
                        | Variant::ExecutorRpc
                )
            })
            .collect(),
        bin_dir: exe_dir,
        bin_dir_b: None,
        audit_dir: None,
        gap: Duration::ZERO,
        settle: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<usize>().unwrap_or_else(|_| usage());
        match a.as_str() {
            "--engine-worker" => engine_worker(num(val())),
            "--iters" => o.iters = num(val()),
            "--warmup" => o.warmup = num(val()),
            "--conc" => o.conc = val().split(',').map(|c| num(c.to_owned()).max(1)).collect(),
            "--ballast-mb" => o.ballast_mb = num(val()),
            "--loaded-skills" => o.loaded_skills = num(val()),
            "--skills" => o.skills = val().split(',').map(str::to_owned).collect(),
            "--variants" => {
                o.variants = val()
                    .split(',')
                    .map(|v| Variant::parse(v).unwrap_or_else(|| usage()))
                    .collect();
            }
            "--bin-dir" => o.bin_dir = PathBuf::from(val()),
            "--bin-dir-b" => o.bin_dir_b = Some(PathBuf::from(val())),
            "--audit-dir" => o.audit_dir = Some(PathBuf::from(val())),
            "--settle" => o.settle = true,
            "--gap-ms" => {
                o.gap = Duration::from_millis(u64::try_from(num(val())).unwrap_or(u64::MAX))
            }
            _ => usage(),
        }
    }
    o
}

// ---------------------------------------------------------------- skills

/// A skill pack: folder 0755 owned by us (root), entry executable, class
/// `safe` (any caller may run it). Returns the manifest path.
fn make_skill(base: &Path, kind: &str) -> PathBuf {
    let dir = base.join(kind);
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let entry = dir.join("run");
    match kind {
        "sh-cat" => fs::write(&entry, "#!/bin/sh\nexec cat\n").unwrap(),
        "bin-cat" => {
            fs::copy("/bin/cat", &entry).unwrap();
        }
        "static-cat" => build_static_cat(&dir, &entry),
        other => panic!("unknown skill {other} (sh-cat, bin-cat, static-cat)"),
    }
    fs::set_permissions(&entry, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(
        dir.join("skill.json"),
        format!(
            r#"{{"name":"{}","description":"load bench","entry":"run","class":"safe","timeout_seconds":10,"schema":{{"type":"object","properties":{{"bench":{{"type":"integer"}},"text":{{"type":"string"}}}}}}}}"#,
            skill_name(kind)
        ),
    )
    .unwrap();
    dir.join("skill.json")
}

/// `static-cat`: stdin to stdout with raw system calls, linked without a C
/// library, so its own start costs next to nothing. glibc's start-up probes
/// the CPU with ~100 `cpuid` instructions, each a trap to the hypervisor
/// in a guest (~10 µs each on some of this project's machines), which a
/// dynamically linked skill (`bin-cat`, `sh-cat`) pays on every run, bare
/// or boxed alike: with this skill the ratios show what the boxes
/// themselves cost. Built here with the C compiler cargo links with
/// (x86_64 only).
fn build_static_cat(dir: &Path, entry: &Path) {
    const SOURCE: &str = r#"
static long sys3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
static char buf[65536];
void _start(void) {
    for (;;) {
        long n = sys3(0 /* read */, 0, (long)buf, sizeof buf);
        if (n <= 0) break;
        for (long off = 0; off < n;) {
            long w = sys3(1 /* write */, 1, (long)buf + off, n - off);
            if (w <= 0) sys3(60 /* exit */, 1, 0, 0);
            off += w;
        }
    }
    sys3(60 /* exit */, 0, 0, 0);
    for (;;) {}
}
"#;
    let arch = std::env::consts::ARCH;
    if arch != "x86_64" {
        panic!("static-cat is written for x86_64, not {arch}");
    }
    let src = dir.join("static-cat.c");
    fs::write(&src, SOURCE).unwrap();
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-static", "-nostdlib", "-fno-stack-protector", "-o"])
        .arg(entry)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("static-cat: cannot run {}: {e}", cc.to_string_lossy()));
    assert!(status.success(), "static-cat: {} failed: {status}", cc.to_string_lossy());
    fs::remove_file(&src).unwrap();
}

fn skill_name(kind: &str) -> String {
    format!("bench_{}", kind.replace('-', "_"))
}

/// `n` valid packs under `root` ([`ongrid_benches::write_packs`]), every
/// folder traversable by the run-as user.
fn make_many(root: &Path, n: usize) {
    ongrid_benches::write_packs(root, n);
    for d in walk_dirs(root) {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn walk_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_owned()];
    let mut i = 0;
    while i < out.len() {
        if let Ok(rd) = fs::read_dir(&out[i]) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                }
            }
        }
        i += 1;
    }
    out
}

// ---------------------------------------------------------------- daemons

fn toml_str(p: &Path) -> String {
    Value::String(p.display().to_string()).to_string()
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// `ongrid-executor serve` + `ongrid-skilld` on sockets under `base`, as
/// the e2e harness starts them (audit on, as packaged).
#[derive(Debug)]
struct Stack {
    name: &'static str,
    socket: PathBuf,
    executor_socket: PathBuf,
    metrics: SocketAddr,
    executor: Child,
    skilld: Child,
    rss_idle_kb: (u64, u64),
}

impl Stack {
    fn start(
        name: &'static str,
        bin_dir: &Path,
        base: &Path,
        roots: &[PathBuf],
        audit_dir: &Path,
        expected: usize,
    ) -> Stack {
        fs::create_dir_all(base).unwrap();
        fs::set_permissions(base, fs::Permissions::from_mode(0o755)).unwrap();
        let ex_sock = base.join("executor.sock");
        let socket = base.join("skilld.sock");
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        let roots_toml: Vec<String> = roots.iter().map(|r| toml_str(r)).collect();
        let roots_toml = roots_toml.join(", ");
        fs::write(
            base.join("executor.toml"),
            format!(
                "roots = [{roots_toml}]\nruntime_dir = {run}\nsocket = {sock}\n\
                 socket_owner = \"{uid}\"\nsocket_group = \"{gid}\"\nsocket_mode = \"0600\"\n\
                 allowed_uids = [{uid}]\nallowed_gids = []\nlandlock = \"best-effort\"\n",
                run = toml_str(&base.join("run")),
                sock = toml_str(&ex_sock),
            ),
        )
        .unwrap();
        let metrics = free_port();
        fs::create_dir_all(audit_dir).unwrap();
        fs::write(
            base.join("skilld.toml"),
            format!(
                "socket = {sock}\nexecutor_socket = {ex}\nskills_dirs = [{roots_toml}]\n\
                 metrics_listen = \"{metrics}\"\nmax_connections = 128\naudit_db = {audit}\n\
                 audit_synchronous = \"{sync}\"\n",
                sync = match name {
                    "daemon-normal" => "normal",
                    "daemon-full" | "daemon-shm" => "full",
                    _ => "interval",
                },
                sock = toml_str(&socket),
                ex = toml_str(&ex_sock),
                audit = toml_str(&audit_dir.join(format!("{name}-audit.db"))),
            ),
        )
        .unwrap();
        let mut executor = Command::new(bin_dir.join("ongrid-executor"))
            .arg("serve")
            .arg("--config")
            .arg(base.join("executor.toml"))
            // Its stdin's write end stays in `executor` (never written):
            // however this process ends, SIGKILL included, the executor
            // stops and unmounts its runs' tmpfs.
            .arg("--stop-on-stdin-eof")
            .env("ONGRID_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(fs::File::create(base.join("executor.log")).unwrap())
            .spawn()
            .expect("start ongrid-executor (cargo build --release --workspace --bins)");
        Started::pid(executor.id());
        wait_socket(&mut executor, &ex_sock, &base.join("executor.log"));
        let mut skilld = Command::new(bin_dir.join("ongrid-skilld"))
            .arg("--config")
            .arg(base.join("skilld.toml"))
            .env_remove("ONGRID_SKILLS_EXTERNAL_DIRS")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(base.join("skilld.log")).unwrap())
            .spawn()
            .expect("start ongrid-skilld");
        Started::pid(skilld.id());
        wait_socket(&mut skilld, &socket, &base.join("skilld.log"));
        let mut stack = Stack {
            name,
            socket,
            executor_socket: ex_sock,
            metrics,
            executor,
            skilld,
            rss_idle_kb: (0, 0),
        };
        // skilld binds, then scans: idle means the first scan is done.
        let deadline = Instant::now() + Duration::from_secs(120);
        while stack.registered().is_nan() || stack.registered() < expected as f64 {
            assert!(Instant::now() < deadline, "{name}: registry never reached {expected}");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        stack.rss_idle_kb = stack.rss_kb();
        stack
    }

    fn registered(&self) -> f64 {
        // The metrics listener is bound after the API socket.
        if TcpStream::connect(self.metrics).is_err() {
            return f64::NAN;
        }
        gauge(&self.scrape(), "ongrid_skills_registered")
    }

    /// CPU seconds so far: (skilld, executor itself, executor's reaped
    /// children, i.e. the skills).
    fn cpu(&self) -> [f64; 3] {
        let (d, e) = (proc_cpu(self.skilld.id()), proc_cpu(self.executor.id()));
        [d[0], e[0], e[1]]
    }

    fn rss_kb(&self) -> (u64, u64) {
        (vm_rss_kb(self.executor.id()), vm_rss_kb(self.skilld.id()))
    }

    fn scrape(&self) -> String {
        let mut s = TcpStream::connect(self.metrics).expect("metrics listener");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for c in [&mut self.skilld, &mut self.executor] {
            Started::gone(c.id());
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_socket(child: &mut Child, socket: &Path, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("daemon exited {st}:\n{}", fs::read_to_string(log).unwrap_or_default());
        }
        if UnixStream::connect(socket).is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "{} not ready", socket.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// (own, reaped children) CPU seconds of process `pid`, from
/// `/proc/PID/stat` (all threads).
fn proc_cpu(pid: u32) -> [f64; 2] {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<f64> = stat
        .rsplit_once(") ")
        .map(|(_, r)| r.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect())
        .unwrap_or_default();
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64);
    let at = |i: usize| f.get(i).copied().unwrap_or(0.0) / tck;
    [at(11) + at(12), at(13) + at(14)]
}

/// The value of an unlabelled sample in a Prometheus text exposition.
fn gauge(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .next()
        .unwrap_or(f64::NAN)
}

fn vm_rss_kb(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A keep-alive HTTP/1.1 client over a Unix socket.
#[derive(Debug)]
struct Http {
    r: BufReader<UnixStream>,
}

impl Http {
    fn connect(socket: &Path) -> Http {
        let s = UnixStream::connect(socket).expect("connect skilld");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Http { r: BufReader::with_capacity(64 << 10, s) }
    }

    fn post(&mut self, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        self.r.get_mut().write_all(&req).expect("write request");
        wait_readable(&self.r);
        let mut line = String::new();
        self.r.read_line(&mut line).expect("status line");
        let status: u16 = line.get(9..12).and_then(|s| s.parse().ok()).expect("HTTP status");
        let (mut len, mut chunked) = (None, false);
        loop {
            line.clear();
            self.r.read_line(&mut line).expect("header");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                if k == "content-length" {
                    len = v.parse::<usize>().ok();
                } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                    chunked = true;
                }
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.r.read_line(&mut line).expect("chunk size");
                let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .expect("chunk size");
                let start = body.len();
                body.resize(start + n + 2, 0);
                self.r.read_exact(&mut body[start..]).expect("chunk");
                body.truncate(start + n);
                if n == 0 {
                    break;
                }
            }
        } else {
            body.resize(len.expect("content-length"), 0);
            self.r.read_exact(&mut body).expect("body");
        }
        (status, body)
    }
}

/// Waits, with `poll`, until the connection has something to read, unless
/// its buffer already holds some: what a client with an event loop does.
/// A thread blocked in `read` on a Unix socket is also woken each time the
/// peer takes bytes it sent (the kernel wakes a socket's sleepers when it
/// frees their buffer, whatever they wait for), so a blocking read right
/// after a request is woken once for nothing when the daemon reads it:
/// 0.22 wake-ups of another CPU per run with 8 clients (BENCHMARKS.md,
/// twenty-sixth pass). `poll` wakes only for `POLLIN`.
fn wait_readable(r: &BufReader<UnixStream>) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    if !r.buffer().is_empty() {
        return;
    }
    let mut fds = [PollFd::new(r.get_ref().as_fd(), PollFlags::POLLIN)];
    // A timeout or an error leaves it to the read (and its own timeout).
    let _ = poll(&mut fds, PollTimeout::from(60_000u16));
}

// ---------------------------------------------------------------- engine worker

/// `--engine-worker MB`: holds MB of touched ballast and an `Engine`; for
/// each manifest path read on stdin, runs it once and prints
/// `<latency ns> <setup_us>`. The first line is `ready <VmRSS kB>`.
fn engine_worker(mb: usize) -> ! {
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
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    rss_kb: u64,
}

impl Worker {
    fn start(mb: usize) -> Worker {
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

    fn run(&mut self, manifest: &Path) -> (Duration, u64) {
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

// ---------------------------------------------------------------- one run

struct Ctx<'a> {
    o: &'a Opts,
    /// `bwrap` and `firejail` found on `PATH` (the children's is empty).
    bwrap: PathBuf,
    firejail: PathBuf,
    config: PathBuf,
    stacks: BTreeMap<&'static str, Stack>,
    workers: Mutex<BTreeMap<&'static str, Worker>>,
}

/// How long skilld keeps an executor connection unused
/// (`loader::executor_client::IDLE_FOR`).
const IDLE_FOR: Duration = Duration::from_millis(500);

/// Per client thread: its keep-alive connections.
#[derive(Default)]
struct Client {
    conns: BTreeMap<&'static str, Http>,
    /// `executor-rpc`'s kept connection and the end of its last run.
    executor: Option<(BufReader<UnixStream>, Instant)>,
}

/// One run of `v`: its latency and, when there is one, the report's
/// `setup_us`.
fn run_one(v: Variant, ctx: &Ctx<'_>, cl: &mut Client, manifest: &Path) -> (Duration, Option<u64>) {
    let dir = manifest.parent().unwrap();
    let entry = dir.join("run");
    let spawn_echo = |cmd: &mut Command| {
        // The skill gets the environment it gets in the sandbox: exactly
        // its manifest's `env_allow`, here nothing. With the bench's own
        // (`LANG=C.UTF-8` here) `cat` loads the locale: 119 system calls
        // instead of 45, which made every ratio to `bare` look better than
        // it was (BENCHMARKS.md, fifteenth pass).
        cmd.env_clear();
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut c = cmd.spawn().expect("spawn");
        c.stdin.take().expect("stdin").write_all(ARGS).expect("write args");
        let out = c.wait_with_output().expect("wait");
        assert!(
            out.status.success() && out.stdout.trim_ascii_end() == ARGS,
            "{}: {out:?}",
            v.name()
        );
    };
    let t0 = Instant::now();
    let setup = match v {
        Variant::Bare => {
            spawn_echo(&mut Command::new(&entry));
            None
        }
        Variant::Bwrap => {
            let mut cmd = Command::new(&ctx.bwrap);
            cmd.args(["--unshare-all", "--die-with-parent"]);
            for sys in ["/usr", "/bin", "/lib", "/lib64"] {
                match fs::read_link(sys) {
                    // Merged /usr (Debian 12): mirror the host's symlinks.
                    Ok(target) => cmd.arg("--symlink").arg(target).arg(sys),
                    Err(_) => cmd.arg("--ro-bind").arg(sys).arg(sys),
                };
            }
            cmd.arg("--ro-bind").arg(dir).arg(dir);
            cmd.args(["--proc", "/proc", "--dev", "/dev"]).arg(&entry);
            spawn_echo(&mut cmd);
            None
        }
        Variant::Firejail => {
            spawn_echo(Command::new(&ctx.firejail).args(["--quiet", "--noprofile"]).arg(&entry));
            None
        }
        Variant::Cli => {
            let out = Command::new(ctx.o.bin_dir.join("ongrid-executor"))
                .arg("run")
                .arg("--manifest")
                .arg(manifest)
                .arg("--config")
                .arg(&ctx.config)
                .arg("--args")
                .arg(std::str::from_utf8(ARGS).unwrap_or("{}"))
                .stdin(Stdio::null())
                .output()
                .expect("spawn ongrid-executor");
            assert!(
                out.status.success() && out.stdout.trim_ascii_end() == ARGS,
                "cli run: {out:?}"
            );
            None
        }
        Variant::Daemon
        | Variant::Daemon10k
        | Variant::DaemonShm
        | Variant::DaemonNormal
        | Variant::DaemonFull
        | Variant::DaemonB => {
            let stack = &ctx.stacks[v.name()];
            let conn = cl.conns.entry(stack.name).or_insert_with(|| Http::connect(&stack.socket));
            let name = skill_name(dir.file_name().unwrap().to_str().unwrap());
            let mut body = br#"{"args":"#.to_vec();
            body.extend_from_slice(ARGS);
            body.push(b'}');
            let (status, resp) = conn.post(&format!("/v1/skills/{name}/execute"), &body);
            let report: Value = serde_json::from_slice(&resp).expect("report JSON");
            let want: Value = serde_json::from_slice(ARGS).unwrap();
            assert!(
                status == 200 && report["outcome"] == "ok" && report["result"] == want,
                "daemon run: {status} {report}"
            );
            report["setup_us"].as_u64()
        }
        Variant::ExecutorRpc => {
            let stack = &ctx.stacks["daemon"];
            let params: policy::wire::ExecuteParams = serde_json::from_value(serde_json::json!({
                "manifest": manifest.display().to_string(),
                "args": serde_json::from_slice::<Value>(ARGS).unwrap(),
                "class": "safe",
            }))
            .unwrap();
            let kept = cl.executor.take().filter(|(_, at)| at.elapsed() < IDLE_FOR);
            let mut s = match kept {
                Some((s, _)) => s,
                None => BufReader::new(UnixStream::connect(&stack.executor_socket).unwrap()),
            };
            s.get_mut().write_all(&policy::wire::encode_execute(1, &params)).unwrap();
            let mut line = Vec::new();
            let setup = loop {
                line.clear();
                wait_readable(&s);
                s.read_until(b'\n', &mut line).unwrap();
                match policy::wire::decode_reply(line.trim_ascii_end()).expect("reply") {
                    policy::wire::Reply::Stderr { .. }
                    | policy::wire::Reply::Queued { .. }
                    | policy::wire::Reply::Started { .. } => {}
                    policy::wire::Reply::Result { result, .. } => {
                        let result = result.to_value();
                        assert_eq!(result["outcome"], "ok", "executor-rpc run: {result}");
                        break result["setup_us"].as_u64();
                    }
                    policy::wire::Reply::Error { message, .. } => panic!("executor-rpc: {message}"),
                }
            };
            cl.executor = Some((s, Instant::now()));
            setup
        }
        Variant::Engine | Variant::Engine1g => {
            let mut workers = ctx.workers.lock().unwrap();
            let (el, setup) = workers.get_mut(v.name()).expect("worker").run(manifest);
            return (el, Some(setup));
        }
    };
    (t0.elapsed(), setup)
}

// ---------------------------------------------------------------- phases

use ongrid_benches::interrupt::{self, Started};
use ongrid_benches::{
    cpu_wakeups, cpus, first_line, kernel_release, pct, run_round, settle, sorted, HostTime, Quiet,
    Samples,
};

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
/// variant at a time, up to `per` runs each; variants alternate round by
/// round. Throughput counts each round while all its clients run
/// ([`run_round`]).
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

/// The same wait as [`after_run`]'s on the idle host, before anything
/// runs: what its CPU figure holds when no run left anything behind.
fn print_idle_settle() {
    let runs: Vec<_> = (0..10).filter_map(|_| settle(Quiet::default())).collect();
    if runs.is_empty() {
        println!("note: the host's CPU time cannot be read: no wait after bwrap and firejail");
        return;
    }
    let cpu = sorted(&runs.iter().map(|x| x.cpu.as_secs_f64() * 1e6).collect::<Vec<_>>());
    let waited = sorted(&runs.iter().map(|x| x.waited.as_secs_f64() * 1e3).collect::<Vec<_>>());
    println!(
        "untimed wait after each bwrap and firejail run until the host is quiet (5 ms under 5 % \
         busy, at least 60 ms); on the idle host: {:.0} ms, host CPU p50 {:.0} us",
        pct(&waited, 0.5),
        pct(&cpu, 0.5)
    );
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
    /// `ongrid_audit_wait_seconds` by row: (sum, count) of each of [`AUDIT_ROWS`].
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

// ---------------------------------------------------------------- metrics

/// The executor's sandbox setup histogram, compared with the reports.
const SETUP_HIST: &str = "ongrid_sandbox_setup_seconds";

/// `ongrid_sandbox_setup_seconds` as scraped: cumulative buckets, sum, count.
#[derive(Debug, Default, Clone)]
struct Hist {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

/// `ongrid_executor_run_slots_total` by `how`: ready, recycled, made.
fn parse_slots(text: &str) -> [f64; 3] {
    ["ready", "recycled", "made"].map(|how| {
        let key = format!("ongrid_executor_run_slots_total{{how=\"{how}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(f64::NAN)
    })
}

/// The rows of `ongrid_audit_wait_seconds` a run waits for.
const AUDIT_ROWS: [&str; 2] = ["decision", "completion"];

/// `ongrid_audit_wait_seconds` of each of [`AUDIT_ROWS`]: (sum, count).
fn parse_audit_waits(text: &str) -> [(f64, f64); 2] {
    AUDIT_ROWS.map(|row| {
        let value = |part: &str| {
            let key = format!("ongrid_audit_wait_seconds_{part}{{row=\"{row}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(key.as_str()))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(f64::NAN)
        };
        (value("sum"), value("count"))
    })
}

fn parse_hist(text: &str, name: &str) -> Hist {
    let mut h = Hist::default();
    for line in text.lines() {
        let Some((key, val)) = line.rsplit_once(' ') else { continue };
        let Ok(val) = val.parse::<f64>() else { continue };
        if let Some(rest) = key.strip_prefix(&format!("{name}_bucket{{")) {
            let le = rest.split("le=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or("");
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
            h.buckets.push((le, val));
        } else if key == format!("{name}_sum") {
            h.sum = val;
        } else if key == format!("{name}_count") {
            h.count = val;
        }
    }
    h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    h
}

fn hist_delta(after: &Hist, before: &Hist) -> Hist {
    let buckets = after
        .buckets
        .iter()
        .map(|&(le, c)| {
            let b = before.buckets.iter().find(|x| x.0 == le).map_or(0.0, |x| x.1);
            (le, c - b)
        })
        .collect();
    Hist { buckets, sum: after.sum - before.sum, count: after.count - before.count }
}

/// `histogram_quantile`: linear interpolation inside the bucket.
fn hist_quantile(h: &Hist, q: f64) -> f64 {
    let rank = q * h.count;
    let mut prev = (0.0, 0.0);
    for &(le, c) in &h.buckets {
        if c >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            let inside = c - prev.1;
            let frac = if inside > 0.0 { (rank - prev.1) / inside } else { 1.0 };
            return prev.0 + (le - prev.0) * frac;
        }
        prev = (le, c);
    }
    f64::NAN
}

// ---------------------------------------------------------------- report

fn print_table(variants: &[Variant], samples: &[Samples]) {
    println!(
        "{:<10} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>10}",
        "variant",
        "n",
        "p50 us",
        "p90 us",
        "p99 us",
        "mean us",
        "runs/s",
        "x bare p50",
        "bare/x p50",
        "x bare run/s"
    );
    let bare = variants.iter().position(|v| *v == Variant::Bare);
    let stats = |s: &Samples| {
        let l = sorted(&s.lat_us);
        (pct(&l, 0.5), s.runs_per_s())
    };
    let (bare_p50, bare_rps) = bare.map_or((f64::NAN, f64::NAN), |b| stats(&samples[b]));
    for (v, s) in variants.iter().zip(samples) {
        let l = sorted(&s.lat_us);
        let (p50, rps) = stats(s);
        println!(
            "{:<10} {:>6} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>9.2} {:>9.2} {:>10.2}",
            v.name(),
            l.len(),
            p50,
            pct(&l, 0.9),
            pct(&l, 0.99),
            mean(&l),
            rps,
            p50 / bare_p50,
            bare_p50 / p50,
            rps / bare_rps
        );
    }
    // With clients at once: the whole host's CPU per run, every process and
    // the kernel included, and how busy the host was (near 100 %: the
    // throughput is bounded by CPU).
    let cpus = cpus();
    for (v, s) in variants.iter().zip(samples) {
        if !s.busy.is_zero() {
            println!(
                "{:<10} host CPU per run {:.0} us (all processes, /proc/stat, steal apart); host \
                 busy {:.0} % of {cpus} CPUs, stolen {:.0} %",
                v.name(),
                s.busy_per_run().as_secs_f64() * 1e6,
                HostTime::share(s.busy, s.wall, cpus),
                HostTime::share(s.steal, s.wall, cpus)
            );
        }
    }
    // The measure before the twenty-seventh pass: each round until its
    // last client was done, drain included.
    let bare_drained = bare.map_or(f64::NAN, |b| samples[b].drained_runs_per_s());
    for (v, s) in variants.iter().zip(samples) {
        if s.drained > s.wall {
            println!(
                "{:<10} rounds until their last client was done: {:.0} runs/s, x bare {:.2}",
                v.name(),
                s.drained_runs_per_s(),
                s.drained_runs_per_s() / bare_drained
            );
        }
    }
    // How many times per run one CPU had to wake another (or make it run
    // something): on a guest whose idle vCPUs halt, each is a wait for the
    // hypervisor to run that vCPU again.
    // What the untimed waits after `bwrap` and `firejail` saw: their
    // namespaces' teardown, a cost their callers do not wait for.
    for (v, s) in variants.iter().zip(samples) {
        if s.settled.is_empty() {
            continue;
        }
        let waited =
            sorted(&s.settled.iter().map(|x| x.waited.as_secs_f64() * 1e3).collect::<Vec<_>>());
        let cpu = sorted(&s.settled.iter().map(|x| x.cpu.as_secs_f64() * 1e6).collect::<Vec<_>>());
        let capped = s.settled.iter().filter(|x| x.capped).count();
        println!(
            "{:<10} after each run, untimed: host quiet again after p50 {:.0} ms (p90 {:.0}, \
             capped {capped}/{}), host CPU meanwhile p50 {:.0} us (p90 {:.0}; every task, idle \
             host included)",
            v.name(),
            pct(&waited, 0.5),
            pct(&waited, 0.9),
            s.settled.len(),
            pct(&cpu, 0.5),
            pct(&cpu, 0.9)
        );
    }
    for (v, s) in variants.iter().zip(samples) {
        if let Some(w) = s.wakeups_per_run() {
            println!(
                "{:<10} wake-ups of another CPU per run {w:.1} (RES + CAL interrupts, \
                 /proc/interrupts, whole host)",
                v.name()
            );
        }
    }
    for (v, s) in variants.iter().zip(samples) {
        if !s.setup_us.is_empty() {
            let st = sorted(&s.setup_us);
            println!(
                "{:<10} report setup_us: mean {:.0} p50 {:.0} p90 {:.0} p99 {:.0}",
                v.name(),
                mean(&st),
                pct(&st, 0.5),
                pct(&st, 0.9),
                pct(&st, 0.99)
            );
        }
    }
    // Ratios between sandboxes, from the same run.
    let p50_of = |want: Variant| {
        variants.iter().position(|v| *v == want).map(|i| pct(&sorted(&samples[i].lat_us), 0.5))
    };
    for ours in [Variant::Engine, Variant::Daemon] {
        for theirs in [Variant::Bwrap, Variant::Firejail] {
            if let (Some(a), Some(b)) = (p50_of(ours), p50_of(theirs)) {
                println!("{} p50 / {} p50 = {:.1}x faster", theirs.name(), ours.name(), b / a);
            }
        }
    }
    if let (Some(a), Some(b)) = (p50_of(Variant::Engine1g), p50_of(Variant::Engine)) {
        println!("engine1g p50 / engine p50 = {:.3}", a / b);
    }
    if let (Some(a), Some(b)) = (p50_of(Variant::Daemon10k), p50_of(Variant::Daemon)) {
        println!("daemon10k p50 / daemon p50 = {:.3}", a / b);
    }
}

fn print_metrics(ctx: &Ctx<'_>, variants: &[Variant], samples: &[Samples], mark: &Mark) {
    const NAME: &str = SETUP_HIST;
    // The bare skills are this process's only reaped children unless `cli`,
    // `bwrap` or `firejail` ran too: their CPU next to the sandboxed ones'.
    let own_children = [Variant::Cli, Variant::Bwrap, Variant::Firejail];
    if let Some(b) = variants.iter().position(|v| *v == Variant::Bare) {
        if !variants.iter().any(|v| own_children.contains(v)) {
            let cpu = proc_cpu(std::process::id())[1] - mark.children;
            println!(
                "bare: CPU per run: skill (loadbench's children) {:.0} us",
                cpu / samples[b].runs.max(1) as f64 * 1e6
            );
        }
    }
    let marks = mark.hist.iter().zip(&mark.slots).zip(&mark.cpu).zip(&mark.audit);
    for ((name, stack), (((before, slots0), cpu0), audit0)) in ctx.stacks.iter().zip(marks) {
        let text = stack.scrape();
        let audit = parse_audit_waits(&text);
        let h = hist_delta(&parse_hist(&text, NAME), before);
        let slots = parse_slots(&text);
        let slots: Vec<f64> = slots.iter().zip(slots0).map(|(a, b)| a - b).collect();
        // The runs this stack's executor served (`executor-rpc` uses the
        // `daemon` stack's executor, but not its skilld).
        let on_stack =
            |v: &Variant| v.name() == *name || (*name == "daemon" && *v == Variant::ExecutorRpc);
        let mut bench = Vec::new();
        let (mut runs, mut skilld_runs) = (0usize, 0usize);
        for (v, s) in variants.iter().zip(samples) {
            if on_stack(v) {
                bench.extend_from_slice(&s.setup_us);
                runs += s.runs;
                if v.name() == *name {
                    skilld_runs += s.runs;
                }
            }
        }
        let bench = sorted(&bench);
        let skilld_runs_seen = skilld_runs > 0;
        let (runs, skilld_runs) = (runs.max(1) as f64, skilld_runs.max(1) as f64);
        let cpu = stack.cpu();
        // No run went through skilld (`executor-rpc` alone): nothing to divide.
        let skilld = if skilld_runs_seen {
            format!("{:.0} us", (cpu[0] - cpu0[0]) / skilld_runs * 1e6)
        } else {
            "- (no run through it)".to_owned()
        };
        println!(
            "{name}: CPU per run: skilld {skilld}, executor {:.0} us, skill (executor's \
             children) {:.0} us",
            (cpu[1] - cpu0[1]) / runs * 1e6,
            (cpu[2] - cpu0[2]) / runs * 1e6,
        );
        println!(
            "{name}: {NAME} over the measured runs: count {:.0} mean {:.0} us, p50 ~{:.0} us, \
             p90 ~{:.0} us (bucket interpolation) | reports' setup_us: n {} mean {:.0} p50 {:.0} \
             p90 {:.0} us",
            h.count,
            h.sum / h.count.max(1.0) * 1e6,
            hist_quantile(&h, 0.5) * 1e6,
            hist_quantile(&h, 0.9) * 1e6,
            bench.len(),
            mean(&bench),
            pct(&bench, 0.5),
            pct(&bench, 0.9),
        );
        println!(
            "{name}: run slots over the measured runs: ready {:.0}, recycled on the run's path \
             {:.0}, made on the run's path {:.0}",
            slots[0], slots[1], slots[2]
        );
        if skilld_runs_seen {
            let rows: Vec<String> = AUDIT_ROWS
                .iter()
                .zip(audit.iter().zip(audit0))
                .map(|(row, (&(sum, n), &(sum0, n0)))| {
                    let n = n - n0;
                    format!("{row} n {n:.0} mean {:.0} us", (sum - sum0) / n.max(1.0) * 1e6)
                })
                .collect();
            println!(
                "{name}: ongrid_audit_wait_seconds over the measured runs: {}",
                rows.join(", ")
            );
        }
    }
}

fn print_rss(ctx: &Ctx<'_>, when: &str) {
    for (name, s) in &ctx.stacks {
        let (e, d) = s.rss_kb();
        println!(
            "VmRSS {when:<12} {name:<10} executor {:>6.1} MiB  skilld {:>6.1} MiB",
            e as f64 / 1024.0,
            d as f64 / 1024.0
        );
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
        let s = Stack::start(
            "daemon-b",
            &dir,
            &base.join("stack-b"),
            std::slice::from_ref(&skills_root),
            &audit_dir,
            manifests.len(),
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
        );
        stacks.insert("daemon10k", s);
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
            print_rss(&ctx, &format!("after c={conc}"));
        }
    }
    println!("\nloadavg at end: {}", first_line("/proc/loadavg"));
    drop(ctx);
    drop(shm_dirs);
}

#[cfg(test)]
mod tests {
    use super::order;

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
