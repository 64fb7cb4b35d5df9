//! A pair of daemons, `ongrid-executor serve` and `ongrid-skilld`
//! ([`Stack`]), and what `/proc` says of a process: its CPU time and VmRSS.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ongrid_benches::interrupt::Started;
use serde_json::Value;

use crate::scrape::gauge;

fn toml_str(p: &Path) -> String {
    Value::String(p.display().to_string()).to_string()
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// `ongrid-executor serve` + `ongrid-skilld` on sockets under `base`, as
/// the e2e harness starts them (audit on, as packaged).
#[derive(Debug)]
pub(crate) struct Stack {
    pub(crate) name: &'static str,
    pub(crate) socket: PathBuf,
    pub(crate) executor_socket: PathBuf,
    metrics: SocketAddr,
    executor: Child,
    skilld: Child,
    pub(crate) rss_idle_kb: (u64, u64),
}

impl Stack {
    pub(crate) fn start(
        name: &'static str,
        bin_dir: &Path,
        base: &Path,
        roots: &[PathBuf],
        audit_dir: &Path,
        expected: usize,
        grants: &str,
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
                 allowed_uids = [{uid}]\nallowed_gids = []\nlandlock = \"best-effort\"\n{grants}",
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
    pub(crate) fn cpu(&self) -> [f64; 3] {
        let (d, e) = (proc_cpu(self.skilld.id()), proc_cpu(self.executor.id()));
        [d[0], e[0], e[1]]
    }

    pub(crate) fn rss_kb(&self) -> (u64, u64) {
        (vm_rss_kb(self.executor.id()), vm_rss_kb(self.skilld.id()))
    }

    pub(crate) fn scrape(&self) -> String {
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
pub(crate) fn proc_cpu(pid: u32) -> [f64; 2] {
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

pub(crate) fn vm_rss_kb(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
