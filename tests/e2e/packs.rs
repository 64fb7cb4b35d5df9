//! The example packs of `packaging/examples/skills` in the real sandbox
//! (`ongrid-executor run --config` with the grants `up` writes), against
//! loopback listeners each test opens itself: a TCP listener, a tiny HTTP
//! server, a UDP DNS responder, a log file under /var/log.

use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::harness::{bin, temp_dir};

/// Loopback is refused unless a grant names it: these grants name the
/// loopback address the tests' listeners use (port 53 never among them).
const GRANTS: &str = "[skills.probe_tcp]\nnetwork = true\nconnect = [\"127.0.0.1:*\"]\n\
    [skills.probe_http]\nnetwork = true\nconnect = [\"127.0.0.1:*\"]\n\
    [skills.probe_dns]\nnetwork = true\nconnect = [\"127.0.0.1:*\"]\n\
    [skills.tail_file]\nfs_read = [\"/var/log\"]\n";

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/examples/skills")
        .canonicalize()
        .unwrap()
}

struct Sandbox {
    _tmp: tempfile::TempDir,
    config: PathBuf,
}

impl Sandbox {
    fn new(grants: &str) -> Self {
        let (tmp, base) = temp_dir("ongrid-packs-");
        let config = base.join("executor.toml");
        let q = |p: &Path| Value::String(p.display().to_string()).to_string();
        std::fs::write(
            &config,
            format!(
                "roots = [{}]\nruntime_dir = {}\nlandlock = \"best-effort\"\n{grants}",
                q(&examples()),
                q(&base.join("run"))
            ),
        )
        .unwrap();
        Sandbox { _tmp: tmp, config }
    }

    /// Runs a pack and returns its report.
    fn run(&self, skill: &str, args: &Value) -> Value {
        let out = Command::new(bin("ongrid-executor"))
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .arg("--manifest")
            .arg(examples().join(skill).join("skill.json"))
            .arg("--args")
            .arg(args.to_string())
            .arg("--json")
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{skill}: no report ({e}): {}", String::from_utf8_lossy(&out.stderr))
        })
    }

    fn ok(&self, skill: &str, args: &Value) -> Value {
        let report = self.run(skill, args);
        assert_eq!(report["outcome"], "ok", "{skill}: {report}");
        report["result"].clone()
    }
}

#[test]
fn example_packs_validate_cleanly() {
    let out = Command::new(bin("ongrid-skill")).arg("validate").arg(examples()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for name in ["probe_tcp", "probe_http", "probe_dns", "tail_file", "disk_usage", "host_load"] {
        assert!(text.contains(&format!("registered subprocess skill \"{name}\"")), "{text}");
    }
}

/// `validate --grants` names each `connect` entry of a manifest that its
/// grant does not cover, and none when a bare network grant covers all.
#[test]
fn validate_names_connect_entries_no_grant_covers() {
    let dir = tempfile::tempdir().unwrap();
    let grants = dir.path().join("grants.toml");
    std::fs::write(
        &grants,
        "[skills.probe_http]\nnetwork = true\nconnect = [\"0.0.0.0/0:443\", \"[::]/0:*\"]\n\
         [skills.probe_tcp]\nnetwork = true\n",
    )
    .unwrap();
    let out = Command::new(bin("ongrid-skill"))
        .arg("validate")
        .arg("--grants")
        .arg(&grants)
        .arg(examples())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "notes only: {text}");
    let note = |skill: &str| {
        text.lines().find(|l| l.starts_with("note") && l.contains(&format!("[skills.{skill}]")))
    };
    let http = note("probe_http").unwrap_or_else(|| panic!("{text}"));
    assert!(http.contains("covers 0.0.0.0/0:80 (a run gets the grant's list only"), "{http}");
    assert!(note("probe_tcp").is_none(), "a bare grant covers any destination: {text}");
    let dns = note("probe_dns").unwrap_or_else(|| panic!("{text}"));
    assert!(dns.contains("0.0.0.0/0:53, [::]/0:53"), "no grant at all: {dns}");
}

#[test]
fn probe_tcp_open_and_closed_ports_and_no_grant() {
    let sb = Sandbox::new(GRANTS);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = sb.ok("probe_tcp", &json!({"host": "127.0.0.1", "port": port}));
    assert_eq!(r["reachable"], true, "{r}");
    assert_eq!(r["address"], "127.0.0.1");
    assert!(r["latency_ms"].as_f64().unwrap() >= 0.0);
    drop(listener);
    let r = sb.ok("probe_tcp", &json!({"host": "127.0.0.1", "port": port, "timeout_seconds": 1}));
    assert_eq!(r["reachable"], false, "{r}");
    assert!(r["error"].as_str().unwrap().contains("refused"), "{r}");

    // Without the operator's grant the network request is rejected.
    let report = Sandbox::new("").run("probe_tcp", &json!({"host": "127.0.0.1", "port": port}));
    assert_eq!(report["outcome"], "rejected", "{report}");
    assert!(report["error"].as_str().unwrap().contains("network"), "{report}");
}

#[test]
fn probe_http_against_a_loopback_server() {
    let sb = Sandbox::new(GRANTS);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let n = conn.read(&mut buf).unwrap();
        let request = String::from_utf8_lossy(&buf[..n]).into_owned();
        let body = "hello from the test";
        write!(
            conn,
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nServer: e2e\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        request
    });
    let url = format!("http://127.0.0.1:{port}/health?x=1");
    let r = sb.ok("probe_http", &json!({"url": url, "body_bytes": 5}));
    let request = server.join().unwrap();
    assert!(request.starts_with("GET /health?x=1 HTTP/1.1\r\n"), "{request}");
    assert_eq!(r["status"], 503, "{r}");
    assert_eq!(r["headers"]["server"], "e2e");
    assert_eq!(r["body"], "hello");
    assert_eq!(r["body_truncated"], true);

    // Nothing listening: a finished probe with the error.
    let r = sb.ok("probe_http", &json!({"url": url, "timeout_seconds": 1}));
    assert!(r["status"].is_null() && r["error"].as_str().unwrap().contains("Connection"), "{r}");
}

/// Answers one A query with 192.0.2.7 (TTL 60).
fn dns_responder() -> (u16, std::thread::JoinHandle<String>) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sock.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        let (n, peer) = sock.recv_from(&mut buf).unwrap();
        let q = &buf[..n];
        // Header: same id, QR + RD + RA, 1 question, 1 answer.
        let mut resp = vec![q[0], q[1], 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0];
        resp.extend_from_slice(&q[12..]);
        resp.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 7]);
        sock.send_to(&resp, peer).unwrap();
        // The queried name, from its labels.
        let mut name = Vec::new();
        let mut at = 12;
        while q[at] != 0 {
            let len = q[at] as usize;
            name.push(String::from_utf8_lossy(&q[at + 1..at + 1 + len]).into_owned());
            at += 1 + len;
        }
        name.join(".")
    });
    (port, handle)
}

#[test]
fn probe_dns_against_a_loopback_responder() {
    let sb = Sandbox::new(GRANTS);
    let (port, responder) = dns_responder();
    let r = sb
        .ok("probe_dns", &json!({"name": "db.example.test", "server": "127.0.0.1", "port": port}));
    assert_eq!(responder.join().unwrap(), "db.example.test");
    assert_eq!(r["rcode"], "NOERROR", "{r}");
    assert_eq!(
        r["answers"],
        json!([{"name": "db.example.test.", "type": "A", "ttl": 60, "data": "192.0.2.7"}])
    );

    // No answer: a finished probe saying timeout.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let r = sb.ok(
        "probe_dns",
        &json!({"name": "x.test", "server": "127.0.0.1", "port": port, "timeout_seconds": 0.5}),
    );
    assert_eq!(r["error"], "timeout", "{r}");
}

#[test]
fn tail_file_reads_under_var_log_only() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: tail_file needs a file under /var/log (root only)");
        return;
    }
    let sb = Sandbox::new(GRANTS);
    let dir = tempfile::Builder::new().prefix("ongrid-e2e-").tempdir_in("/var/log").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let log = dir.path().join("app.log");
    std::fs::write(&log, "one\ntwo\nthree\n").unwrap();
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = sb.ok("tail_file", &json!({"path": log, "lines": 2}));
    assert_eq!(r["lines"], json!(["two", "three"]), "{r}");
    assert_eq!(r["size_bytes"], 14);

    // A symlink out of /var/log is refused by the script and, were it
    // not, by Landlock (only /var/log is granted).
    let link = dir.path().join("shadow");
    std::os::unix::fs::symlink("/etc/shadow", &link).unwrap();
    let report = sb.run("tail_file", &json!({"path": link}));
    assert_eq!(report["outcome"], "exit_nonzero", "{report}");
    assert!(report["stderr"].as_str().unwrap().contains("outside /var/log"));

    // Without the fs_read grant the pack is rejected.
    let report = Sandbox::new("").run("tail_file", &json!({"path": log}));
    assert_eq!(report["outcome"], "rejected", "{report}");
}

#[test]
fn host_packs_run() {
    let sb = Sandbox::new("");
    let r = sb.ok("disk_usage", &json!({"mount_prefix": "/"}));
    let fs = r["filesystems"].as_array().unwrap();
    assert!(fs.iter().any(|f| f["mount"] == "/"), "{r}");
    let r = sb.ok("host_load", &json!({}));
    assert!(r["load1"].is_number() && r["total_tasks"].as_u64().unwrap() > 0, "{r}");
}
