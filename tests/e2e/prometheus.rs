//! A real Prometheus server for the monitoring case: Debian's `prometheus`
//! binary on 127.0.0.1 (a free port), storage in a temp dir, scraping one
//! ongrid-skilld metrics listener on loopback every second and evaluating
//! the packaged alerting rules every second; and a small client for its
//! HTTP API. Nothing here sends a packet off loopback.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::harness::{free_port, parse_response};

/// The scrape job's name: the one the packaged rules expect.
pub const JOB: &str = "ongrid-skilld";

/// An executable named `name` on `PATH`, if any.
pub fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// A running Prometheus server, stopped (SIGTERM, then SIGKILL) on drop.
pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts `binary` scraping `target` (job [`JOB`]) and evaluating the
    /// rules of `rule_file`, and waits until it is ready.
    pub fn start(binary: &Path, target: SocketAddr, rule_file: &Path) -> Self {
        assert!(target.ip().is_loopback(), "scrape targets stay on loopback: {target}");
        let dir = tempfile::Builder::new().prefix("ongrid-prometheus-").tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        fs::write(&config, config_text(target, rule_file)).unwrap();
        let addr = free_port();
        let log = dir.path().join("prometheus.log");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let mut prometheus = Prometheus { child, addr, dir };
        prometheus.wait_ready();
        prometheus
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("prometheus exited {st}:\n{}", self.log());
            }
            if self.try_get("/-/ready").is_some_and(|(status, _)| status == 200) {
                return;
            }
            assert!(Instant::now() < deadline, "prometheus not ready:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's log, for assertion messages.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` (already encoded): status and body, or `None` when the
    /// server does not answer.
    fn try_get(&self, path: &str) -> Option<(u16, Vec<u8>)> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.addr);
        s.write_all(req.as_bytes()).ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).ok()?;
        parse_response(&raw).map(|r| (r.status, r.body))
    }

    /// `GET path` of the HTTP API, its JSON answer (`status` checked).
    pub fn api(&self, path: &str) -> Value {
        let (status, body) = self
            .try_get(path)
            .unwrap_or_else(|| panic!("GET {path}: no answer from prometheus:\n{}", self.log()));
        let v: Value = serde_json::from_slice(&body).unwrap_or_else(|e| {
            panic!("GET {path}: {status}, not JSON ({e}): {}", String::from_utf8_lossy(&body))
        });
        assert_eq!(v["status"], "success", "GET {path}: {status} {v}");
        v
    }

    /// The instant vector of `query`, evaluated now (`/api/v1/query`).
    pub fn query(&self, query: &str) -> Vec<Value> {
        let v = self.api(&format!("/api/v1/query?query={}", encode(query)));
        assert_eq!(v["data"]["resultType"], "vector", "{query}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The value of a one-sample `query`, or `None` when it has no sample.
    pub fn scalar(&self, query: &str) -> Option<f64> {
        self.query(query).first().and_then(sample_value)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's configuration: one loopback target, 1 s scrapes and rule
/// evaluations.
fn config_text(target: SocketAddr, rule_file: &Path) -> String {
    let rules = Value::String(rule_file.display().to_string());
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {rules}\n\
         scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: [\"{target}\"]\n"
    )
}

/// The number of an instant-vector sample (`[time, "value"]`); NaN and
/// the infinities parse as such.
pub fn sample_value(sample: &Value) -> Option<f64> {
    sample["value"][1].as_str()?.parse().ok()
}

/// `text` percent-encoded for a query string (RFC 3986 unreserved bytes
/// kept).
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
