//! Both real daemons as real processes on temp sockets, requests through
//! the loader's own HTTP client (the test kit's `http`), and `/proc`
//! checks. Raw sockets remain only where a case needs the connection
//! itself: `bounds` (heads cut short, header and idle timeouts, keep-alive),
//! `queue` (an answer whose head is read while its body is held back),
//! `cancel` and `reload` (a client hanging up, or half-closing, mid-run),
//! `malformed` (requests no client would send), and the metrics listener's
//! `scrape`, over TCP.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// A binary of the workspace, next to the test binary's directory
/// (`<target>/<profile>/`), built by `cargo build --workspace --bins`.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// The signals the main thread of process `pid` blocks (`SigBlk` of
/// `/proc/PID/status`).
pub fn blocked_signals(pid: u32) -> nix::sys::signal::SigSet {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("SigBlk:")).unwrap();
    let bits = u64::from_str_radix(line.trim(), 16).unwrap();
    let mut set = nix::sys::signal::SigSet::empty();
    for sig in Signal::iterator() {
        if bits & (1u64 << (sig as i32 - 1)) != 0 {
            set.add(sig);
        }
    }
    set
}

/// The soft and hard `Max open files` of process `pid` (`/proc/PID/limits`).
pub fn nofile_limits(pid: u32) -> (u64, u64) {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let mut n = line.split_whitespace().filter_map(|w| w.parse::<u64>().ok());
    (n.next().unwrap(), n.next().unwrap())
}

/// Runs `f` on this thread with `signals` blocked (restored after), so that
/// the processes it spawns inherit the mask, as from a parent that blocks
/// its stop signals around a spawn.
pub fn with_blocked<T>(signals: &[Signal], f: impl FnOnce() -> T + std::panic::UnwindSafe) -> T {
    let mut set = nix::sys::signal::SigSet::empty();
    for sig in signals {
        set.add(*sig);
    }
    let old = set.thread_swap_mask(nix::sys::signal::SigmaskHow::SIG_BLOCK).unwrap();
    let out = std::panic::catch_unwind(f);
    old.thread_set_mask().unwrap();
    out.unwrap_or_else(|e| std::panic::resume_unwind(e))
}

pub use ongrid_tests::{free_port, temp_dir};

/// Writes a pack `root/name/` with `skill.json` (entry `run`, plus
/// `extra` fields, JSON text starting with `,`) and an executable
/// `/bin/sh` entry holding `script` ([`ongrid_tests::write_pack`]).
pub fn write_skill(root: &Path, name: &str, extra: &str, script: &str) -> PathBuf {
    ongrid_tests::write_pack(root, name, "run", extra, script)
}

/// The standard skills of the suite, under `root`.
pub fn standard_skills(root: &Path) {
    fs::create_dir_all(root).unwrap();
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
    write_skill(
        root,
        "echo",
        r#","category":"test","schema":{"type":"object","properties":{"n":{"type":"integer"}}}"#,
        "echo 'echo: starting' >&2\nexec /bin/cat",
    );
    write_skill(root, "fail", "", "echo boom >&2\necho '{\"partial\":true}'\nexit 3");
    write_skill(root, "slow", r#","timeout_seconds":1"#, "exec /bin/sleep 30");
    write_skill(
        root,
        "strict",
        r#","schema":{"type":"object","properties":{"path":{"type":"string"},"depth":{"type":"integer","minimum":0}},"required":["path"],"additionalProperties":false}"#,
        "exec /bin/cat",
    );
    // Prints its pid on stderr (streamed), then sleeps: the cancel cases
    // look for that process in /proc.
    write_skill(
        root,
        "sleeper",
        r#","timeout_seconds":60"#,
        "echo \"pid=$$\" >&2\nexec /bin/sleep 30",
    );
    write_skill(
        root,
        "finisher",
        r#","timeout_seconds":20"#,
        "echo \"pid=$$\" >&2\n/bin/sleep 1\necho '{\"done\":true}'",
    );
}

pub use ongrid_tests::http::{parse_response, Resp};

/// One request through the loader's own client (`ongrid_tests::http`),
/// read to the end (60 s at most); the answer is checked against
/// `docs/openapi.json` ([`crate::contract`]).
pub fn http(socket: &Path, method: &str, path: &str, accept: &str, body: Option<&[u8]>) -> Resp {
    let resp = ongrid_tests::http::request(socket, method, path, accept, body)
        .unwrap_or_else(|e| panic!("{method} {path} on {}: {e}", socket.display()));
    // Every answer of the e2e suite is held to the API's contract (the soak
    // binary, which shares this file, carries the oracle only in its tests).
    #[cfg(test)]
    crate::contract::check(method, path, &resp);
    resp
}

/// Polls `f` until it returns true or `timeout` passes (the kit's `poll`).
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    ongrid_tests::poll(timeout, || f().then_some(())).is_some()
}

/// Returns true if and only if `pid` is a live (not zombie) user process
/// whose command line contains `needle`.
pub fn process_alive(pid: i32, needle: &str) -> bool {
    // A process in the middle of an `execve` (a skill's shell that just
    // printed its pid and is exec'ing `sleep`) shows an empty command line
    // until the new image's arguments are set up, which on a loaded host
    // can take a while: read it again, for 2 s at most. A kernel thread's
    // command line is always empty: it is no match, at once (a /proc scan
    // waiting on each of them took longer than its run's life on a host
    // with many CPUs).
    for _ in 0..1000 {
        match running(pid) {
            Some(Running::User) => {}
            Some(Running::Kernel) | None => return false,
        }
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !cmdline.is_empty() {
            return String::from_utf8_lossy(&cmdline).contains(needle);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Returns true if and only if `pid` is a live (not zombie) user process,
/// whatever it runs: for a pid a skill reported itself, which may be
/// between its shell and the program it execs.
pub fn process_running(pid: i32) -> bool {
    running(pid) == Some(Running::User)
}

#[derive(PartialEq, Eq)]
enum Running {
    User,
    Kernel,
}

/// What `/proc/<pid>/stat` says of `pid`: `None` if it is gone or a zombie.
fn running(pid: i32) -> Option<Running> {
    /// `PF_KTHREAD` in the stat line's flags (include/linux/sched.h).
    const PF_KTHREAD: u64 = 0x0020_0000;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state, ppid, pgrp, session,
    // tty_nr, tpgid, flags, ...
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    if fields.first().is_none_or(|s| *s == "Z" || *s == "X") {
        return None;
    }
    let flags: u64 = fields.get(6)?.parse().ok()?;
    Some(if flags & PF_KTHREAD != 0 { Running::Kernel } else { Running::User })
}

/// Pids of live processes whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<i32> {
    let me = std::process::id();
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if u32::try_from(pid).ok() == Some(me) {
            continue;
        }
        if process_alive(pid, needle) {
            pids.push(pid);
        }
    }
    pids
}

fn signal(child: &Child, sig: Signal) {
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
    let _ = kill(pid, sig);
}

fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_socket(child: &mut Child, socket: &Path, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("{what} exited {st}:\n{}", fs::read_to_string(log).unwrap_or_default());
        }
        if UnixStream::connect(socket).is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not ready:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ongrid-executor serve` and `ongrid-skilld` on temp sockets, serving
/// [`standard_skills`] from `<base>/skills`.
pub struct Stack {
    _tmp: tempfile::TempDir,
    pub base: PathBuf,
    pub skills: PathBuf,
    pub executor_socket: PathBuf,
    pub socket: PathBuf,
    pub metrics: SocketAddr,
    executor: Option<Child>,
    skilld: Child,
    executor_starts: usize,
    /// Shell commands run before each daemon's `exec` (`ulimit -Sn 1024`).
    prelude: Option<String>,
}

/// `program`, or `sh -c 'PRELUDE; exec program ...'` (the same pid).
fn daemon_command(program: &Path, prelude: Option<&str>) -> Command {
    match prelude {
        None => Command::new(program),
        Some(prelude) => {
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c").arg(format!("{prelude}; exec \"$0\" \"$@\"")).arg(program);
            cmd
        }
    }
}

/// `text` with the `key = value` lines of `extra` set: a line of `text`
/// with the same key is replaced, other keys are appended.
fn with_keys(text: &str, extra: &str) -> String {
    let key = |l: &str| l.split_once('=').map(|(k, _)| k.trim().to_owned());
    let extra_keys: Vec<String> = extra.lines().filter_map(key).collect();
    let mut out: String = text
        .lines()
        .filter(|l| key(l).is_none_or(|k| !extra_keys.contains(&k)))
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(extra);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

impl Stack {
    pub fn start() -> Self {
        Self::start_with("", "")
    }

    /// [`Stack::start`] with keys of `executor.toml` and `skilld.toml`
    /// set (`key = value` lines replacing the suite's own).
    pub fn start_with(executor_extra: &str, skilld_extra: &str) -> Self {
        Self::start_under(executor_extra, skilld_extra, None)
    }

    /// [`Stack::start_with`], each daemon started through `sh -c` running
    /// `prelude` first (a shell's limits, say).
    pub fn start_under(executor_extra: &str, skilld_extra: &str, prelude: Option<&str>) -> Self {
        if nix::unistd::geteuid().is_root() {
            ongrid_tests::host::skill_user();
        }
        let (tmp, base) = temp_dir("ongrid-e2e-");
        let skills = base.join("skills");
        standard_skills(&skills);
        let executor_socket = base.join("executor.sock");
        let socket = base.join("skilld.sock");
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        let q = |p: &Path| serde_json::Value::String(p.display().to_string()).to_string();
        let executor_toml = with_keys(
            &format!(
                "roots = [{skills}]\nruntime_dir = {run}\nsocket = {sock}\n\
                 socket_owner = \"{uid}\"\nsocket_group = \"{gid}\"\nsocket_mode = \"0600\"\n\
                 allowed_uids = [{uid}]\nallowed_gids = []\nlandlock = \"best-effort\"\n\
                 max_line_bytes = 65536\nmax_concurrent_runs = 16\n",
                skills = q(&skills),
                run = q(&base.join("run")),
                sock = q(&executor_socket),
            ),
            executor_extra,
        );
        fs::write(base.join("executor.toml"), executor_toml).unwrap();
        let metrics = free_port();
        let skilld_toml = with_keys(
            &format!(
                "socket = {sock}\nexecutor_socket = {ex}\nskills_dirs = [{skills}]\n\
                 metrics_listen = \"{metrics}\"\nrequest_timeout_seconds = 3\nmax_connections = 128\n\
                 audit_db = {audit}\n",
                sock = q(&socket),
                ex = q(&executor_socket),
                skills = q(&skills),
                audit = q(&base.join("audit.db")),
            ),
            skilld_extra,
        );
        fs::write(base.join("skilld.toml"), skilld_toml).unwrap();
        let mut stack = Stack {
            _tmp: tmp,
            base,
            skills,
            executor_socket,
            socket,
            metrics,
            executor: None,
            skilld: Command::new("true").spawn().unwrap(),
            executor_starts: 0,
            prelude: prelude.map(str::to_owned),
        };
        stack.start_executor();
        let log = stack.base.join("skilld.log");
        stack.skilld = daemon_command(&bin("ongrid-skilld"), stack.prelude.as_deref())
            .arg("--config")
            .arg(stack.base.join("skilld.toml"))
            .env_remove("ONGRID_SKILLS_EXTERNAL_DIRS")
            // `E2E_SKILLD_LOG=debug` (and `E2E_EXECUTOR_LOG`) to chase a
            // failure: the logs are printed with it.
            .env("RUST_LOG", std::env::var("E2E_SKILLD_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let socket = stack.socket.clone();
        wait_socket(&mut stack.skilld, &socket, "ongrid-skilld", &log);
        stack
    }

    /// Starts (or restarts) the executor and waits for its socket.
    pub fn start_executor(&mut self) {
        assert!(self.executor.is_none(), "executor already running");
        self.executor_starts += 1;
        let log = self.base.join(format!("executor.{}.log", self.executor_starts));
        let mut child = daemon_command(&bin("ongrid-executor"), self.prelude.as_deref())
            .arg("serve")
            .arg("--config")
            .arg(self.base.join("executor.toml"))
            .env("ONGRID_LOG", std::env::var("E2E_EXECUTOR_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        wait_socket(&mut child, &self.executor_socket, "ongrid-executor", &log);
        self.executor = Some(child);
    }

    /// Sends `sig` to the executor and waits for it to exit.
    pub fn stop_executor(&mut self, sig: Signal) -> ExitStatus {
        let mut child = self.executor.take().expect("executor running");
        signal(&child, sig);
        wait_exit(&mut child, Duration::from_secs(30)).unwrap_or_else(|| {
            let _ = child.kill();
            panic!("ongrid-executor did not exit after {sig}:\n{}", self.logs())
        })
    }

    /// The executor's pid, if it runs.
    pub fn executor_pid(&self) -> Option<u32> {
        self.executor.as_ref().map(Child::id)
    }

    pub fn skilld_pid(&self) -> u32 {
        self.skilld.id()
    }

    /// SIGKILLs ongrid-skilld and waits for it (it is not restarted).
    pub fn kill_skilld(&mut self) {
        let _ = self.skilld.kill();
        let _ = self.skilld.wait();
    }

    /// Forgets the executor (after it was killed from outside) and reaps it.
    pub fn reap_executor(&mut self) -> Option<ExitStatus> {
        let mut child = self.executor.take()?;
        wait_exit(&mut child, Duration::from_secs(30))
    }

    /// Signals the executor without waiting.
    pub fn signal_skilld(&self, sig: Signal) {
        signal(&self.skilld, sig);
    }

    /// Waits up to `timeout` for the signalled skilld to exit.
    pub fn wait_skilld(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_exit(&mut self.skilld, timeout)
    }

    pub fn signal_executor(&self, sig: Signal) {
        signal(self.executor.as_ref().expect("executor running"), sig);
    }

    /// Waits for the signalled executor to exit.
    pub fn wait_executor(&mut self) -> ExitStatus {
        let mut child = self.executor.take().expect("executor running");
        wait_exit(&mut child, Duration::from_secs(30)).expect("executor exits")
    }

    /// Both daemons still running (the executor counts only if started).
    pub fn both_alive(&mut self) -> bool {
        let skilld = self.skilld.try_wait().unwrap().is_none();
        let executor = self.executor.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none());
        skilld && executor
    }

    /// Both daemons' logs, for assertion messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        let mut names: Vec<PathBuf> = fs::read_dir(&self.base)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        names.sort();
        for p in names {
            text.push_str(&format!(
                "== {}\n{}\n",
                p.display(),
                fs::read_to_string(&p).unwrap_or_default()
            ));
        }
        text
    }

    pub fn get(&self, path: &str) -> Resp {
        http(&self.socket, "GET", path, "application/json", None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Resp {
        http(&self.socket, "POST", path, "application/json", Some(body.to_string().as_bytes()))
    }

    pub fn execute(&self, skill: &str, args: &Value) -> Resp {
        self.post(&format!("/v1/skills/{skill}/execute"), &serde_json::json!({ "args": args }))
    }

    pub fn stream(&self, skill: &str, args: &Value) -> Resp {
        let body = serde_json::json!({ "args": args }).to_string();
        http(
            &self.socket,
            "POST",
            &format!("/v1/skills/{skill}/execute"),
            "application/x-ndjson",
            Some(body.as_bytes()),
        )
    }

    /// `GET /metrics` on the metrics listener.
    pub fn scrape(&self) -> String {
        let mut s = TcpStream::connect(self.metrics).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let r = parse_response(&raw).unwrap();
        assert_eq!(r.status, 200);
        String::from_utf8(r.body).unwrap()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(mut c) = self.executor.take() {
            signal(&c, Signal::SIGTERM);
            if wait_exit(&mut c, Duration::from_secs(10)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = self.skilld.kill();
        let _ = self.skilld.wait();
    }
}
