//! Start-up and shutdown of the daemon process.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::skilld::{Env, Skilld, SKILLD};

/// The socket gets the configured mode; a second daemon on the same socket
/// refuses to start; SIGTERM exits 0 and removes the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_mode_in_use_and_clean_exit() {
    let env = Env::new();
    let skills = env.standard_skills();
    let d = Skilld::start(&env, &[&skills], "socket_mode = \"0600\"\n");
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let out = Command::new(SKILLD)
        .args(["--config", env.path("skilld.toml").to_str().unwrap(), "--metrics-listen", ""])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"), "{out:?}");
    assert!(d.client().get("/v1/health").await.unwrap().status.is_success());

    let socket = d.socket.clone();
    assert!(d.stop().success());
    assert!(!socket.exists(), "the socket is removed on exit");
}

/// A stale socket file (no daemon behind it) is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_socket_is_replaced() {
    let env = Env::new();
    let skills = env.standard_skills();
    drop(std::os::unix::net::UnixListener::bind(env.path("skilld.sock")).unwrap());
    assert!(env.path("skilld.sock").exists());
    let d = Skilld::start(&env, &[&skills], "");
    assert!(d.client().get("/v1/health").await.unwrap().status.is_success());
}

/// Bad configuration exits 78 (EX_CONFIG), `--check-config` too.
#[test]
fn bad_config_exits_78() {
    let env = Env::new();
    let cfg = env.path("bad.toml");
    for text in ["sokcet = \"/x\"", "max_body_bytes = 0", "metrics_listen = \"nowhere\""] {
        std::fs::write(&cfg, text).unwrap();
        for extra in [&[][..], &["--check-config"][..]] {
            let out = Command::new(SKILLD)
                .args(["--config", cfg.to_str().unwrap()])
                .args(extra)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(78), "{text}: {out:?}");
        }
    }
    std::fs::write(&cfg, "socket = \"/tmp/x.sock\"\n").unwrap();
    let out = Command::new(SKILLD)
        .args(["--config", cfg.to_str().unwrap(), "--check-config"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let missing = env.path("missing.toml");
    let out = Command::new(SKILLD).args(["--config", missing.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(78));
}

/// Each configuration error names the file, the key and the OS error: a
/// missing file, a directory, a value out of range, an unknown group.
#[test]
fn config_errors_name_the_file_the_key_and_the_cause() {
    let env = Env::new();
    let run = |cfg: &std::path::Path| {
        let out = Command::new(SKILLD)
            .args(["--config", cfg.to_str().unwrap(), "--check-config"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(78), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing = env.path("missing.toml");
    let err = run(&missing);
    assert!(err.contains(&format!("cannot read {}: ", missing.display())), "{err}");
    assert!(err.contains("No such file or directory"), "{err}");
    let dir = env.path("conf.d");
    std::fs::create_dir(&dir).unwrap();
    let err = run(&dir);
    assert!(err.contains(&format!("cannot read {}: ", dir.display())), "{err}");
    assert!(err.contains("Is a directory"), "{err}");
    let cfg = env.path("bad.toml");
    std::fs::write(&cfg, "max_connections = 0\n").unwrap();
    let err = run(&cfg);
    assert!(
        err.contains(&format!("{}: max_connections: must be at least 1", cfg.display())),
        "{err}"
    );
    std::fs::write(&cfg, "socket_group = \"no-such-group-zq\"\n").unwrap();
    let err = run(&cfg);
    assert!(err.contains(&format!("{}: socket_group: no group named", cfg.display())), "{err}");
}

/// Relative paths in the file are refused (exit 78, naming the file and
/// the key), as they would break under systemd (working directory `/`);
/// a valid file is summed up in plain lines, not a Debug dump.
#[test]
fn check_config_refuses_relative_paths_and_sums_up() {
    let env = Env::new();
    let cfg = env.path("skilld.toml");
    for (text, key) in [
        ("skills_dirs = [\"packs\"]", "skills_dirs"),
        ("audit_db = \"rel.db\"", "audit_db"),
        ("socket = \"relative.sock\"", "socket"),
        ("executor_socket = \"e.sock\"", "executor_socket"),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let out = Command::new(SKILLD)
            .args(["--config", cfg.to_str().unwrap(), "--check-config"])
            .env_remove("ONGRID_SKILLS_EXTERNAL_DIRS")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(78), "{text}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("{}: {key}: ", cfg.display())), "{text}: {err}");
        assert!(err.contains("is not an absolute path"), "{text}: {err}");
    }
    std::fs::write(&cfg, "socket = \"/tmp/x.sock\"\nmetrics_listen = \"\"\n").unwrap();
    let out = Command::new(SKILLD)
        .args(["--config", cfg.to_str().unwrap(), "--check-config"])
        .env_remove("ONGRID_SKILLS_EXTERNAL_DIRS")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&format!("ok: {}\n", cfg.display())), "{text}");
    assert!(text.contains("socket: /tmp/x.sock (mode 0660"), "{text}");
    assert!(text.contains("metrics: off"), "{text}");
    assert!(!text.contains("Settings") && !text.contains('{'), "a Debug dump:\n{text}");
}

/// A start that fails after the client socket is bound (the metrics port
/// is taken) exits 1 and removes the socket it bound: clients then find no
/// daemon instead of a refused connection.
#[test]
fn failed_start_after_the_bind_removes_the_socket() {
    let env = Env::new();
    let skills = env.standard_skills();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let socket = env.path("skilld.sock");
    let cfg = env.path("skilld.toml");
    std::fs::write(
        &cfg,
        format!(
            "socket = {:?}\nexecutor_socket = {:?}\nskills_dirs = [{:?}]\naudit_db = {:?}\n",
            socket.display().to_string(),
            env.executor_socket().display().to_string(),
            skills.display().to_string(),
            env.audit_db().display().to_string(),
        ),
    )
    .unwrap();
    let out = Command::new(SKILLD)
        .args(["--config", cfg.to_str().unwrap(), "--metrics-listen", &addr.to_string()])
        .env_remove("ONGRID_SKILLS_EXTERNAL_DIRS")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    assert!(std::fs::symlink_metadata(&socket).is_err(), "the socket was left behind: {err}");
    drop(taken);
}
