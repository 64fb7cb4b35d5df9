//! The production path for the sandbox suite: with `ONGRID_SANDBOX_VIA=serve`
//! every run goes over the executor wire to a long-lived
//! `ongrid-executor serve`, as ongrid-skilld sends it, instead of through a
//! one-shot `ongrid-executor run`.
//!
//! The served path differs from the one-shot one where it matters to the
//! sandbox: children are created by spawner threads that carry the seccomp
//! filter and an emptied capability bounding set, which the child inherits
//! instead of installing; from an instance's second run on, a run gets a
//! slot made ahead of time by the janitor, and the cgroup leaves of
//! finished runs serve later runs once emptied and reset. So one served
//! executor is started per distinct configuration and environment, on
//! first use, and kept for the whole test binary: the cases that share a
//! configuration share its spawner threads and its reused leaves.
//!
//! Each served executor has its own directory under
//! `<tmp>/ongrid-sbx-served-<pid>/` (config, socket, log, runtime
//! directory); the skills of a served run live in `skills/` there, the
//! executors' one allow-list root (root's, mode 0755, as a packaged root is).
//! The executors are started by one long-lived thread with
//! `PR_SET_PDEATHSIG(SIGTERM)`, so they drain and exit if the test binary
//! dies; at a normal exit an `atexit` handler stops them (SIGTERM, then
//! SIGKILL after 10 s), waits for them and removes the directory.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use policy::wire::{self, Reply};
use policy::RunReport;
use serde_json::Value;

use crate::config::Config;
use crate::run::{Run, RunOptions};

/// How the suite's runs reach the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `ongrid-executor run --json`, one process per run (the default).
    Oneshot,
    /// The executor wire of a long-lived `ongrid-executor serve`.
    Serve,
}

/// `ONGRID_SANDBOX_VIA`: `serve`, or anything else (unset) for one-shot.
pub fn via() -> Via {
    static VIA: OnceLock<Via> = OnceLock::new();
    *VIA.get_or_init(|| match std::env::var("ONGRID_SANDBOX_VIA").as_deref() {
        Ok("serve") => Via::Serve,
        _ => Via::Oneshot,
    })
}

/// One served executor: its pid and its directory (config, socket, log,
/// runtime directory).
#[derive(Debug)]
struct Served {
    pid: u32,
    dir: PathBuf,
}

impl Served {
    fn socket(&self) -> PathBuf {
        self.dir.join("executor.sock")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("executor.log")
    }
}

/// The served executors, by configuration text, environment and network
/// namespace.
type Key = (String, Vec<(String, String)>, Option<String>);

struct Registry {
    base: PathBuf,
    started: HashMap<Key, Arc<Served>>,
    children: Vec<Child>,
    launcher: mpsc::Sender<Launch>,
}

/// A start request for the launcher thread.
struct Launch {
    command: Command,
    reply: mpsc::Sender<std::io::Result<Child>>,
}

static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();

fn registry() -> &'static Mutex<Registry> {
    REGISTRY.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("ongrid-sbx-served-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("skills")).expect("create the served base directory");
        crate::skill::set_mode(&base, 0o755);
        crate::skill::set_mode(&base.join("skills"), 0o755);
        // The parent-death signal follows the thread that forked, so every
        // executor is started by this thread, which lives as long as the
        // process (it blocks on a channel whose sender is never dropped).
        let (launcher, requests) = mpsc::channel::<Launch>();
        std::thread::Builder::new()
            .name("served-launcher".into())
            .spawn(move || {
                for Launch { mut command, reply } in requests {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("start the launcher thread");
        register_stop_all();
        Mutex::new(Registry { base, started: HashMap::new(), children: Vec::new(), launcher })
    })
}

/// The root-owned folder the skills of served runs are made in (the served
/// executors' allow-list root).
pub fn skills_root() -> PathBuf {
    registry().lock().unwrap_or_else(PoisonError::into_inner).base.join("skills")
}

/// The instance names (`ex-<hex>`) of the served executors started so far:
/// their cgroups and run directories are theirs to keep between runs, so
/// the leak checks leave them out ([`crate::procs::cgroup_dirs`]). Empty
/// when none was started.
pub fn instance_names() -> Vec<String> {
    let Some(reg) = REGISTRY.get() else { return Vec::new() };
    let reg = reg.lock().unwrap_or_else(PoisonError::into_inner);
    reg.started
        .values()
        .flat_map(|s| std::fs::read_dir(s.dir.join("run/runs")).into_iter().flatten().flatten())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| n.starts_with("ex-"))
        .collect()
}

/// The served executor for `config`, `env` and `netns`, started on first
/// use (in that network namespace while it lives: the executor keeps it).
fn served(config: &Config, env: &[(String, String)], netns: Option<&str>) -> Arc<Served> {
    let key = (config.to_toml(), env.to_vec(), netns.map(str::to_owned));
    let mut reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(s) = reg.started.get(&key) {
        return Arc::clone(s);
    }
    let dir = reg.base.join(format!("ex{}", reg.started.len()));
    std::fs::create_dir_all(&dir).expect("create a served executor's directory");
    let mut s = Served { pid: 0, dir };
    let (socket, log) = (s.socket(), s.log());
    let q = |p: &Path| Value::String(p.display().to_string()).to_string();
    // Top-level keys first: the rendered config ends with its tables.
    let toml = format!(
        "roots = [{root}]\nruntime_dir = {run}\nsocket = {sock}\nsocket_mode = \"0600\"\n\
         allowed_uids = [0]\nmax_line_bytes = {line}\nmax_concurrent_runs = 16\n{rest}",
        root = q(&reg.base.join("skills")),
        run = q(&s.dir.join("run")),
        sock = q(&socket),
        line = 16 << 20,
        rest = key.0,
    );
    let cfg = s.dir.join("executor.toml");
    std::fs::write(&cfg, toml).expect("write a served executor's config");
    let mut command = crate::run::executor_command(netns);
    command
        .arg("serve")
        .arg("--config")
        .arg(&cfg)
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("ONGRID_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("create a served executor's log"));
    die_with_launcher(&mut command);
    let (reply, answer) = mpsc::channel();
    reg.launcher.send(Launch { command, reply }).expect("the launcher thread is alive");
    let mut child = answer.recv().expect("launcher answers").expect("spawn ongrid-executor serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&socket).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("ongrid-executor serve exited {st}:\n{}", read(&log));
        }
        assert!(Instant::now() < deadline, "ongrid-executor serve not ready:\n{}", read(&log));
        std::thread::sleep(Duration::from_millis(20));
    }
    s.pid = child.id();
    let s = Arc::new(s);
    reg.children.push(child);
    reg.started.insert(key, Arc::clone(&s));
    s
}

/// Registers [`stop_all`] to run at the process's normal exit.
#[allow(unsafe_code)] // libtest has no teardown hook; atexit is the C one
fn register_stop_all() {
    // SAFETY: `stop_all` is an `extern "C" fn()` valid for the life of the
    // process; it only takes a lock no exiting thread holds (the tests are
    // over) and waits for our own children.
    let r = unsafe { libc::atexit(stop_all) };
    assert_eq!(r, 0, "atexit");
}

/// `PR_SET_PDEATHSIG(SIGTERM)` in the child before it execs.
#[allow(unsafe_code)] // `pre_exec` is unsafe: the closure runs after fork
fn die_with_launcher(command: &mut Command) {
    // SAFETY: the closure only calls prctl, which is async-signal-safe and
    // allocates nothing, and reads errno on failure.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Stops every served executor and removes their directory (`atexit`).
extern "C" fn stop_all() {
    let Some(reg) = REGISTRY.get() else { return };
    let mut reg = reg.lock().unwrap_or_else(PoisonError::into_inner);
    for child in &reg.children {
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for child in &mut reg.children {
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let _ = std::fs::remove_dir_all(&reg.base);
}

/// The metrics text of the served executor for `config` (started on
/// first use), through the wire's `metrics` method.
///
/// # Panics
///
/// When the executor cannot be reached or answers with no metrics.
pub fn metrics(config: &Config) -> String {
    let s = served(config, &[], None);
    let mut stream = UnixStream::connect(s.socket()).expect("connect the served executor");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("set a read timeout");
    stream
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"metrics\"}\n")
        .expect("send metrics");
    let mut line = Vec::new();
    BufReader::new(stream).read_until(b'\n', &mut line).expect("read the metrics answer");
    let v: Value = serde_json::from_slice(&line).expect("the metrics answer is JSON");
    v["result"]["text"].as_str().expect("metrics text").to_owned()
}

/// Runs the skill of `manifest` through the served executor for `config`
/// and `opts.env`: one connection, one held `execute` and its `start`, the
/// `stderr` notifications, then the report.
///
/// # Panics
///
/// When `opts.args` is not JSON (the wire carries JSON: raw hostile bytes
/// are a one-shot input), the executor cannot be reached, answers with an
/// error, or sends no report within `hang_after` (the skill's timeout
/// plus the kill grace plus slack, from [`crate::run::run`]).
pub fn run(manifest: &Path, config: &Config, opts: RunOptions, hang_after: Duration) -> Run {
    let args = policy::RawJson::from_slice(&opts.args).unwrap_or_else(|e| {
        panic!("served runs take JSON args ({e}); raw bytes are a one-shot input")
    });
    let s = served(config, &opts.env, opts.netns.as_deref());
    let started = Instant::now();
    let (socket, log) = (s.socket(), s.log());
    let mut stream = UnixStream::connect(&socket)
        .unwrap_or_else(|e| panic!("connect {}: {e}\n{}", socket.display(), read(&log)));
    stream.set_read_timeout(Some(hang_after)).expect("set a read timeout");
    // As ongrid-skilld sends a run when a slot is free: held (the executor
    // checks and prepares it) and started once the caller's audit row is
    // in, here at once.
    let params = wire::ExecuteParams {
        manifest: manifest.to_str().expect("a UTF-8 manifest path").to_owned(),
        args,
        session_id: Some("sandbox-suite".into()),
        class: None,
        tool: None,
        manifest_sha256: None,
        hold: true,
    };
    let mut lines = wire::encode_execute(1, &params);
    lines.extend(wire::encode_start(1));
    stream.write_all(&lines).expect("send execute and start");
    let mut reader = BufReader::new(stream);
    let mut stderr = String::new();
    let result = loop {
        let mut text = Vec::new();
        match reader.read_until(b'\n', &mut text) {
            Ok(0) => {
                panic!("the executor closed the connection before the report:\n{}", read(&log))
            }
            Ok(_) => {}
            Err(e) => panic!(
                "no report from the served executor within {hang_after:?} ({e}); its log:\n{}",
                read(&log)
            ),
        }
        let text = text.strip_suffix(b"\n").unwrap_or(&text);
        match wire::decode_reply(text) {
            Ok(Reply::Stderr { line, .. }) => {
                stderr.push_str(&line);
                stderr.push('\n');
            }
            Ok(Reply::Result { result, .. }) => break result,
            // Waiting for a run slot, then starting, or an MCP tool list's
            // generation: nothing to keep.
            Ok(Reply::Queued { .. } | Reply::Started { .. } | Reply::ToolsGeneration { .. }) => {}
            Ok(Reply::Error { code, message, .. }) => {
                panic!("the executor answered error {code}: {message}\n{}", read(&log))
            }
            Err(e) => panic!(
                "the executor sent a line that is no reply ({e}): {}",
                String::from_utf8_lossy(text)
            ),
        }
    };
    let elapsed = started.elapsed();
    // From the text, not a Value: `result` is kept as the skill printed it.
    let report: RunReport = serde_json::from_str(result.get()).unwrap_or_else(|e| {
        panic!("report does not match policy::RunReport ({e}):\n{}", result.get())
    });
    let raw: Value = serde_json::from_str(result.get()).expect("the report is JSON");
    Run {
        report,
        raw,
        status: None,
        elapsed,
        executor_peak_kib: crate::run::vm_hwm_kib(s.pid).unwrap_or(0),
        executor_stderr: format!(
            "(the skill's stderr)\n{stderr}(the served executor's log, {})\n{}",
            log.display(),
            read(&log)
        ),
    }
}
