//! One run of a skill: an `ongrid-executor run --json` invocation, or an
//! `execute` on a served executor's wire ([`crate::served`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use policy::{Outcome, RunReport};
use serde_json::Value;

use crate::config::Config;

/// How long past the skill's own timeout (plus the kill grace) the harness
/// waits for the executor before declaring it hung and killing it.
const HANG_SLACK: Duration = Duration::from_secs(15);

/// The invocation of one run, beyond the manifest and config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Bytes fed to `--args -` (the executor's stdin).
    pub args: Vec<u8>,
    /// Environment of the executor (which `env_allow` selects from), on top
    /// of a fixed `PATH`.
    pub env: Vec<(String, String)>,
    /// A network namespace (a name under `/run/netns`) the executor runs
    /// in, entered with `nsenter --net`, which keeps the host's `/sys` and
    /// so its cgroup mounts.
    pub netns: Option<String>,
}

impl RunOptions {
    /// The args object serialised as JSON.
    pub fn args(args: &Value) -> Self {
        Self { args: args.to_string().into_bytes(), env: Vec::new(), netns: None }
    }

    /// Raw bytes as args (hostile input).
    pub fn raw(args: &[u8]) -> Self {
        Self { args: args.to_vec(), env: Vec::new(), netns: None }
    }

    /// Adds an environment variable of the executor.
    #[must_use]
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Runs the executor in the network namespace `name`.
    #[must_use]
    pub fn netns(mut self, name: &str) -> Self {
        self.netns = Some(name.to_owned());
        self
    }
}

/// A command starting the executor, in `netns` when one is named.
pub(crate) fn executor_command(netns: Option<&str>) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{ns}")).arg(executor_bin());
            c
        }
        None => Command::new(executor_bin()),
    }
}

/// What one executor invocation produced.
#[derive(Debug)]
pub struct Run {
    /// The parsed run report.
    pub report: RunReport,
    /// The report as raw JSON (for fields the struct may not model yet).
    pub raw: Value,
    /// The one-shot executor process's exit status (`None` for a served
    /// run, [`crate::served`]).
    pub status: Option<ExitStatus>,
    /// Wall time of the whole invocation, as the caller sees it.
    pub elapsed: Duration,
    /// Peak resident memory of the executor process (VmHWM), KiB: of the
    /// one-shot executor as last sampled before it exited, of a served one
    /// over its whole life so far.
    pub executor_peak_kib: u64,
    /// The executor's own stderr (its log; for a served run, the skill's
    /// stderr lines and the served executor's log).
    pub executor_stderr: String,
}

impl Run {
    /// The report and the executor's log, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "report: {}\nexecutor exit: {:?} (None: served), elapsed {:?}\nexecutor stderr:\n{}",
            serde_json::to_string_pretty(&self.raw).unwrap_or_default(),
            self.status,
            self.elapsed,
            self.executor_stderr
        )
    }

    /// The outcome.
    pub fn outcome(&self) -> Outcome {
        self.report.outcome
    }

    /// The result of an `ok` run, parsed.
    ///
    /// # Panics
    ///
    /// When the run did not end `ok`.
    pub fn result(&self) -> Value {
        self.result_text().to_value()
    }

    /// The result of an `ok` run as the skill printed it.
    ///
    /// # Panics
    ///
    /// When the run did not end `ok`.
    pub fn result_text(&self) -> &policy::RawJson {
        assert_eq!(self.report.outcome, Outcome::Ok, "run not ok:\n{}", self.dump());
        self.report.result.as_ref().expect("ok run has a result")
    }

    /// Asserts the outcome, showing the whole report when it differs.
    ///
    /// # Panics
    ///
    /// When the outcome differs.
    pub fn expect(&self, outcome: Outcome) -> &Self {
        assert_eq!(self.report.outcome, outcome, "unexpected outcome:\n{}", self.dump());
        self
    }
}

/// Path of the executor binary: `$ONGRID_EXECUTOR`, else
/// `<target>/<profile>/ongrid-executor` next to the running test binary
/// (tests run from `<target>/<profile>/deps/`).
///
/// # Panics
///
/// When the binary does not exist (build it with `cargo build -p ongrid-executor`).
pub fn executor_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ONGRID_EXECUTOR") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("test binary has a parent dir");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("deps has a parent dir");
    }
    let bin = dir.join("ongrid-executor");
    assert!(
        bin.is_file(),
        "{} missing: build it first (`cargo build -p ongrid-executor`) or set ONGRID_EXECUTOR",
        bin.display()
    );
    bin
}

pub(crate) fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs the skill of `manifest` once under `config`, the way
/// [`crate::served::via`] says: `ongrid-executor run --manifest M --args -
/// --config C --json` feeding `opts.args` on stdin, or the wire of a served
/// executor ([`crate::served::run`]).
///
/// # Panics
///
/// When the executor cannot be started, hangs past the skill's timeout plus
/// grace plus [`HANG_SLACK`] (a one-shot one is then killed), or gives no
/// report.
pub fn run(manifest: &Path, config: &Config, opts: RunOptions, timeout_s: u64) -> Run {
    run_via(crate::served::via(), manifest, config, opts, timeout_s)
}

/// [`run`] through the given path whatever `ONGRID_SANDBOX_VIA` says (the
/// warm-run cases compare a served run with a one-shot one).
///
/// # Panics
///
/// As [`run`].
pub fn run_via(
    via: crate::served::Via,
    manifest: &Path,
    config: &Config,
    opts: RunOptions,
    timeout_s: u64,
) -> Run {
    // No case waits out a long timeout on purpose (huge ones are clamping tests).
    let hang_after =
        Duration::from_secs(timeout_s.min(60)) + policy::limits::KILL_GRACE + HANG_SLACK;
    let once = |opts| match via {
        crate::served::Via::Serve => crate::served::run(manifest, config, opts, hang_after),
        crate::served::Via::Oneshot => oneshot(manifest, config, opts, hang_after),
    };
    for _ in 0..TEXT_BUSY_RETRIES {
        let run = once(opts.clone());
        if !text_busy(&run) {
            return run;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    once(opts)
}

/// How many times a run whose `exec` met `ETXTBSY` is tried again.
const TEXT_BUSY_RETRIES: usize = 5;

/// The run's `exec` failed with `ETXTBSY`: the entry (copied or written
/// by this test just before) was still open for writing somewhere. Tests
/// run as threads of one process; a child that another test forks while
/// this test's copy is open inherits the descriptor (close-on-exec closes
/// it only at that child's own `exec`), and the kernel refuses to execute
/// a file open for writing. Nothing of the skill ran, so the run is tried
/// again. The product reports it as it should (`spawn_failed`, naming the
/// cause); only the harness retries.
fn text_busy(run: &Run) -> bool {
    run.report.outcome == Outcome::SpawnFailed
        && run.report.error.as_deref().is_some_and(|e| e.contains("os error 26"))
}

fn oneshot(manifest: &Path, config: &Config, opts: RunOptions, hang_after: Duration) -> Run {
    let cfg_dir = tempfile::Builder::new().prefix("ongrid-sbx-cfg-").tempdir().expect("cfg dir");
    let cfg = cfg_dir.path().join("executor.toml");
    std::fs::write(&cfg, config.to_toml()).expect("write executor.toml");

    let started = Instant::now();
    let mut child = executor_command(opts.netns.as_deref())
        .arg("run")
        .arg("--manifest")
        .arg(manifest)
        .args(["--args", "-", "--config"])
        .arg(&cfg)
        .arg("--json")
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ongrid-executor");
    let pid = child.id();

    let mut stdin = child.stdin.take().expect("piped stdin");
    let args = opts.args;
    let feeder = std::thread::spawn(move || {
        // The executor may legitimately stop reading (rejected run): ignore EPIPE.
        let _ = stdin.write_all(&args);
    });
    let mut stdout = child.stdout.take().expect("piped stdout");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let mut stderr = child.stderr.take().expect("piped stderr");
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });

    let mut peak = 0;
    let status = loop {
        if let Some(kib) = vm_hwm_kib(pid) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().expect("wait executor") {
            break status;
        }
        if started.elapsed() > hang_after {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
            panic!(
                "ongrid-executor hung: no report {hang_after:?} after start (killed it; \
                 the skill's processes may survive)\nexecutor stderr:\n{err}"
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = started.elapsed();
    let _ = feeder.join();
    let out = out_reader.join().unwrap_or_default();
    let executor_stderr =
        String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();

    let raw: Value = serde_json::from_slice(&out).unwrap_or_else(|e| {
        panic!(
            "executor printed no JSON report ({e}); exit {status:?}\nstdout:\n{}\nstderr:\n{executor_stderr}",
            String::from_utf8_lossy(&out)
        )
    });
    // From the text, not the Value: `result` is kept as the skill printed it.
    let report: RunReport = serde_json::from_slice(&out).unwrap_or_else(|e| {
        panic!(
            "report does not match policy::RunReport ({e}):\n{raw:#}\nstderr:\n{executor_stderr}"
        )
    });
    Run { report, raw, status: Some(status), elapsed, executor_peak_kib: peak, executor_stderr }
}

/// Runs the `attack` binary directly, outside any sandbox, as `uid:gid`
/// with `args` on stdin, and returns its JSON line. Baselines prove an
/// attack works on this host, so the sandboxed run's failure means the
/// sandbox stopped it.
///
/// # Panics
///
/// When it cannot run or prints no JSON.
pub fn unsandboxed(attack_bin: &Path, uid: u32, gid: u32, args: &Value) -> Value {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::Builder::new().prefix("ongrid-sbx-base-").tempdir().expect("tempdir");
    crate::skill::set_mode(dir.path(), 0o777);
    let mut child = Command::new(attack_bin)
        .current_dir(dir.path())
        .env_clear()
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn unsandboxed attack");
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(args.to_string().as_bytes()).expect("write args");
    drop(stdin);
    let out = child.wait_with_output().expect("wait unsandboxed attack");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("unsandboxed attack printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout))
    })
}
