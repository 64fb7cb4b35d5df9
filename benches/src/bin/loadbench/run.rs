//! One run of a variant ([`run_one`]): what it runs against ([`Ctx`]) and
//! the connections a client thread keeps between its runs ([`Client`]).

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{wait_readable, Http};
use crate::opts::{Opts, Variant};
use crate::skills::skill_name;
use crate::stack::Stack;
use crate::worker::Worker;
use crate::ARGS;

pub(crate) struct Ctx<'a> {
    pub(crate) o: &'a Opts,
    /// `bwrap` and `firejail` found on `PATH` (the children's is empty).
    pub(crate) bwrap: PathBuf,
    pub(crate) firejail: PathBuf,
    pub(crate) config: PathBuf,
    pub(crate) stacks: BTreeMap<&'static str, Stack>,
    pub(crate) workers: Mutex<BTreeMap<&'static str, Worker>>,
}

/// How long skilld keeps an executor connection unused
/// (`loader::daemon::executor_client::IDLE_FOR`).
const IDLE_FOR: Duration = Duration::from_millis(500);

/// Per client thread: its keep-alive connections.
#[derive(Default)]
pub(crate) struct Client {
    conns: BTreeMap<&'static str, Http>,
    /// `executor-rpc`'s kept connection and the end of its last run.
    executor: Option<(BufReader<UnixStream>, Instant)>,
    /// `bare-warm`'s process for its next run, spawned after its last.
    ahead: Option<(PathBuf, Child)>,
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some((_, c)) = self.ahead.take() {
            kill(c);
        }
    }
}

/// One run of `v`: its latency and, when there is one, the report's
/// `setup_us`.
pub(crate) fn run_one(
    v: Variant,
    ctx: &Ctx<'_>,
    cl: &mut Client,
    manifest: &Path,
) -> (Duration, Option<u64>) {
    let dir = manifest.parent().unwrap();
    let entry = dir.join("run");
    let spawn_echo = |cmd: &mut Command| {
        // The skill gets the environment it gets in the sandbox: exactly
        // its manifest's `env_allow`, here nothing. With the bench's own
        // (`LANG=C.UTF-8` here) `cat` loads the locale: 119 system calls
        // instead of 45, which made every ratio to `bare` look better than
        // it was.
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
    if v == Variant::BareWarm {
        return (bare_warm(&entry, cl), None);
    }
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
        | Variant::DaemonB
        | Variant::DaemonWarm
        | Variant::DaemonWarmB => {
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
                    | policy::wire::Reply::Started { .. }
                    | policy::wire::Reply::ToolsGeneration { .. } => {}
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
        Variant::BareWarm => unreachable!("timed by bare_warm"),
        Variant::Engine | Variant::Engine1g => {
            let mut workers = ctx.workers.lock().unwrap();
            let (el, setup) = workers.get_mut(v.name()).expect("worker").run(manifest);
            return (el, Some(setup));
        }
    };
    (t0.elapsed(), setup)
}

/// `bare-warm`: the entry spawned unboxed with no environment after the
/// last run (as a warm pool is refilled) and waited for, untimed, until
/// it sleeps reading its stdin; then timed from the args' write to its
/// reaping. A process started ahead with no box and no daemon: the floor
/// under `daemon-warm` (what the skill itself does once it has its args).
fn bare_warm(entry: &Path, cl: &mut Client) -> Duration {
    let mut c = match cl.ahead.take() {
        Some((path, c)) if path == entry => c,
        other => {
            if let Some((_, c)) = other {
                kill(c);
            }
            spawn_ahead(entry)
        }
    };
    wait_reading_stdin(c.id());
    let t0 = Instant::now();
    let mut stdin = c.stdin.take().expect("stdin");
    stdin.write_all(ARGS).expect("write args");
    drop(stdin);
    let out = c.wait_with_output().expect("wait");
    let el = t0.elapsed();
    assert!(out.status.success() && out.stdout.trim_ascii_end() == ARGS, "bare-warm: {out:?}");
    // Started to its read before the next variant's run, so that its
    // start-up falls on no other run.
    let next = spawn_ahead(entry);
    wait_reading_stdin(next.id());
    cl.ahead = Some((entry.to_path_buf(), next));
    el
}

/// `bare-warm`'s process, spawned as `bare`'s is, its args not written.
fn spawn_ahead(entry: &Path) -> Child {
    Command::new(entry)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

/// Kills and reaps a `bare-warm` process never given its args.
fn kill(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// Waits until process `pid` sleeps in `read(0, ...)`: its
/// `/proc/PID/syscall` names the call's number and then its arguments,
/// the first the descriptor ("running" while it runs).
fn wait_reading_stdin(pid: u32) {
    let path = format!("/proc/{pid}/syscall");
    let want = format!("{} 0x0 ", nix::libc::SYS_read);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = fs::read_to_string(&path).expect("read /proc/PID/syscall (root)");
        if now.starts_with(&want) {
            return;
        }
        assert!(Instant::now() < deadline, "bare-warm: the skill never read its stdin: {now}");
        std::thread::sleep(Duration::from_micros(200));
    }
}
