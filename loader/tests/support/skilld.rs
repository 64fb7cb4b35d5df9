//! Starting the real `ongrid-skilld` binary on temp sockets, and a tree of
//! test skills.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loader::cli::client::DaemonClient;

pub const SKILLD: &str = env!("CARGO_BIN_EXE_ongrid-skilld");
pub const CLI: &str = env!("CARGO_BIN_EXE_ongrid-skill");

/// A temp dir holding sockets, config, logs and skill roots.
pub struct Env {
    _tmp: tempfile::TempDir,
    pub base: PathBuf,
}

impl Env {
    pub fn new() -> Self {
        let (tmp, base) = testkit::temp_dir("skilld");
        Env { _tmp: tmp, base }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    pub fn executor_socket(&self) -> PathBuf {
        self.path("executor.sock")
    }

    pub fn audit_db(&self) -> PathBuf {
        self.path("audit.db")
    }

    /// A skill pack `root/name/` with `skill.json` and an executable `run`
    /// holding `script` (a shell body).
    pub fn skill(&self, root: &str, name: &str, extra: &str, script: &str) -> PathBuf {
        testkit::write_pack(&self.path(root), name, "run", extra, script)
    }

    /// The standard packs under `skills/`.
    pub fn standard_skills(&self) -> PathBuf {
        self.skill(
            "skills",
            "echo",
            r#","category":"test","schema":{"type":"object","properties":{"n":{"type":"integer"}}}"#,
            "echo 'echo: starting' >&2\necho 'echo: second line' >&2\ncat",
        );
        self.skill("skills", "fail", "", "echo boom >&2\necho '{\"partial\":true}'\nexit 3");
        self.skill("skills", "slow", r#","timeout_seconds":1"#, "exec sleep 30");
        self.skill(
            "skills",
            "strict",
            r#","class":"mutating","schema":{"type":"object","properties":{"path":{"type":"string"},"depth":{"type":"integer","minimum":0}},"required":["path"],"additionalProperties":false}"#,
            "cat",
        );
        let pidfile = self.path("sleeper.pid");
        self.skill(
            "skills",
            "sleeper",
            "",
            &format!("echo $$ > {}\necho started >&2\nexec sleep 30", pidfile.display()),
        );
        self.path("skills")
    }
}

pub use testkit::free_port;

/// A running `ongrid-skilld`; killed on drop.
pub struct Skilld {
    child: Child,
    pub socket: PathBuf,
    pub metrics: SocketAddr,
    log: PathBuf,
}

impl Skilld {
    /// Starts the daemon with `config` (TOML) plus the socket, executor
    /// socket, metrics address and roots, and waits until it answers.
    /// Unless `config` says otherwise, the audit database is
    /// `<env>/audit.db` and the test's uid is a `mutating-with-confirm`
    /// caller (role `tester`).
    pub fn start(env: &Env, roots: &[&Path], config: &str) -> Self {
        let mut d = Self::spawn(env, roots, config, |_| {});
        d.wait_ready();
        d
    }

    /// As [`Skilld::start`], with `prepare` applied to the command (extra
    /// environment, a wrapper), without waiting for the socket.
    pub fn spawn(
        env: &Env,
        roots: &[&Path],
        config: &str,
        prepare: impl FnOnce(&mut Command),
    ) -> Self {
        let socket = env.path("skilld.sock");
        let metrics = free_port();
        let dirs: Vec<String> =
            roots.iter().map(|r| format!("{:?}", r.display().to_string())).collect();
        let mut text = format!(
            "socket = {:?}\nexecutor_socket = {:?}\nmetrics_listen = \"{metrics}\"\nskills_dirs = [{}]\n",
            socket.display().to_string(),
            env.executor_socket().display().to_string(),
            dirs.join(", "),
        );
        if !config.contains("audit_db") {
            text.push_str(&format!("audit_db = {:?}\n", env.audit_db().display().to_string()));
        }
        text.push_str(config);
        if !config.contains("[[callers]]") {
            text.push_str(&format!(
                "\n[[callers]]\nuid = {}\nrole = \"tester\"\nmode = \"mutating-with-confirm\"\n",
                nix::unistd::geteuid().as_raw()
            ));
        }
        let cfg = env.path("skilld.toml");
        fs::write(&cfg, text).unwrap();
        let log = env.path("skilld.log");
        let mut cmd = Command::new(SKILLD);
        cmd.arg("--config")
            .arg(&cfg)
            .env_remove("ONGRID_SKILLS_EXTERNAL_DIRS")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        prepare(&mut cmd);
        let child = cmd.spawn().unwrap();
        Skilld { child, socket, metrics, log }
    }

    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("ongrid-skilld exited {st}:\n{}", self.log());
            }
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "ongrid-skilld not ready:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn client(&self) -> DaemonClient {
        DaemonClient::new(&self.socket)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, sig).unwrap();
    }

    /// Waits up to `timeout` for the exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < deadline, "no exit:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Returns true if and only if the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < deadline, "no exit after SIGTERM:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET /metrics` on the metrics listener (HTTP/1.0, blocking).
    pub fn scrape(&self) -> String {
        let mut s = TcpStream::connect(self.metrics).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"));
        body.to_owned()
    }
}

impl Drop for Skilld {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` until it returns true or `timeout` passes.
pub async fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

/// The audit journal of the database `db` (`<db>-rows`): the rows the
/// daemon appended there and writes into `db` shortly after its answers.
pub fn audit_journal(db: &Path) -> PathBuf {
    PathBuf::from(format!("{}-rows", db.display()))
}

/// Waits (at most 10 s) until every row and completion in the journal of
/// `db` is in `db`.
pub fn audit_settled(db: &Path) {
    let until = Instant::now() + Duration::from_secs(10);
    while !journal_in_db(db) {
        assert!(Instant::now() < until, "the journal's rows never reached {}", db.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether each line of the journal of `db` is in `db`: the row of an
/// `insert`, the `finished_at` of a `finish`.
fn journal_in_db(db: &Path) -> bool {
    let text = fs::read_to_string(audit_journal(db)).unwrap_or_default();
    if text.is_empty() {
        return true;
    }
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let Ok(c) = rusqlite::Connection::open_with_flags(db, flags) else { return false };
    text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).all(|line| {
        let id = line["id"].as_i64().unwrap_or(0);
        let finished = c.query_row("SELECT finished_at FROM audit WHERE id = ?1", [id], |r| {
            r.get::<_, Option<i64>>(0)
        });
        match (line["op"].as_str(), finished) {
            (Some("insert"), Ok(_)) => true,
            (Some("finish"), Ok(at)) => at.is_some() && at == line["finished_at"].as_i64(),
            _ => false,
        }
    })
}
