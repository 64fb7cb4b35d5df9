//! MCP servers as skills, in the executor: a pack's server boxed and
//! spoken to over its stdio, its tools called, a hostile server cut off
//! and restarted, secrets kept to the server's environment.

#[path = "../common/mod.rs"]
mod common;
mod real;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use executor::mcp::Servers;
use executor::{Config, Engine};
use policy::{Outcome, RunReport};
use serde_json::json;

const FAKE: &str = include_str!("fake_server.py");
const SECRET: &str = "tok-5d1e0c-never-anywhere-else";

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// An engine, or `None` (with a SKIP line) when the run-as user is missing.
pub fn engine(config: Config) -> Option<Engine> {
    if is_root() && nix::unistd::User::from_name(&config.run_as).ok().flatten().is_none() {
        eprintln!("SKIP: run-as user {} missing (scripts/test creates it)", config.run_as);
        return None;
    }
    Some(Engine::new(config).unwrap())
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A pack folder (mode 0755) with the fake server as its entry.
fn pack(extra: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = dir.path().join("skill.json");
    let text = format!(
        r#"{{"kind":"mcp","name":"fake","description":"t","entry":"server.py","timeout_seconds":2,"env_allow":["FAKE_TOKEN"]{extra}}}"#
    );
    std::fs::write(&manifest, text).unwrap();
    let entry = dir.path().join("server.py");
    std::fs::write(&entry, FAKE).unwrap();
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, manifest)
}

/// A config granting the pack `fake` the env file in `dir`, holding the secret.
fn config_with_secret(dir: &Path) -> Config {
    let env_file = dir.join("fake.env");
    std::fs::write(&env_file, format!("FAKE_TOKEN={SECRET}\nOTHER=not-allowed\n")).unwrap();
    std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let grant = policy::SkillGrant { env_file: Some(env_file), ..policy::SkillGrant::default() };
    let mut config = Config::default();
    config.skills.insert("fake".to_owned(), grant);
    config
}

fn text_of(r: &RunReport) -> String {
    let v = r.result.as_ref().map(|v| v.to_value()).unwrap_or_default();
    v["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

fn sha256_hex(s: &str) -> String {
    // The test computes it with the system's tool rather than a new dependency.
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(s.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_owned()
}

#[test]
fn tools_are_listed_and_called_in_the_box_and_secrets_reach_only_the_server() {
    let secrets_dir = tempfile::tempdir().unwrap();
    let Some(engine) = engine(config_with_secret(secrets_dir.path())) else { return };
    let (_d, m) = pack("");
    let servers = Servers::default();
    rt().block_on(async {
        let tools = servers.tools(&engine, &m).await.unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert!(names.contains(&"echo") && names.contains(&"stall"), "{names:?}");

        let r = servers.call(&engine, &m, "echo", json!({"a": [1, 2]})).await;
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        assert_eq!(r.skill, "fake.echo");
        assert_eq!(text_of(&r), r#"{"a": [1, 2]}"#);
        assert_eq!(r.result.as_ref().unwrap().to_value()["isError"], json!(false));
        let sandbox = r.sandbox.as_ref().expect("the box the server runs in");
        assert!(sandbox.no_new_privs && sandbox.seccomp);
        if is_root() {
            assert_ne!(sandbox.uid, 0, "not root: {sandbox:?}");
        }

        let args = json!({"name": "FAKE_TOKEN", "sha256": sha256_hex(SECRET)});
        let r = servers.call(&engine, &m, "secret_is", args).await;
        assert_eq!(text_of(&r), "True", "the secret is in the server's environment: {r:?}");
        let args = json!({"name": "OTHER", "sha256": sha256_hex("not-allowed")});
        let r = servers.call(&engine, &m, "secret_is", args).await;
        assert_eq!(text_of(&r), "False", "a name outside env_allow is not passed");
        let report = serde_json::to_string(&r).unwrap();
        assert!(!report.contains(SECRET), "{report}");

        let r = servers.call(&engine, &m, "not_listed", json!({})).await;
        assert_eq!(r.outcome, Outcome::Rejected, "{r:?}");
        assert!(r.error.as_deref().unwrap_or("").contains("did not list"), "{r:?}");
        let r = servers.call(&engine, &m, "echo", json!([1])).await;
        assert_eq!(r.outcome, Outcome::InvalidArgs, "{r:?}");
        servers.stop_all(&engine).await;
    });
}

#[test]
fn a_hostile_server_is_cut_off_with_a_clear_outcome_and_the_next_call_succeeds() {
    let Some(engine) = engine(Config::default()) else { return };
    let (d, m) = pack("");
    let marker = d.path().to_string_lossy().into_owned();
    let servers = Servers::default();
    rt().block_on(async {
        let cases = [
            ("garbage", Outcome::InvalidResult),
            ("flood", Outcome::OutputLimit),
            ("stall", Outcome::Timeout),
            ("die", Outcome::ExitNonzero),
            ("fork", Outcome::Timeout),
        ];
        for (tool, outcome) in cases {
            let before = servers.call(&engine, &m, "pid", json!({})).await;
            assert_eq!(before.outcome, Outcome::Ok, "{tool}: {before:?}");
            let r = servers.call(&engine, &m, tool, json!({})).await;
            assert_eq!(r.outcome, outcome, "{tool}: {r:?}");
            assert!(r.error.as_deref().unwrap_or("").contains("cut off"), "{tool}: {r:?}");
            // The whole tree is gone, forked children included.
            let left = common::procs_with(&marker);
            assert!(left.is_empty(), "{tool}: left behind: {left:?}");
            let after = servers.call(&engine, &m, "pid", json!({})).await;
            assert_eq!(after.outcome, Outcome::Ok, "{tool}: the next call: {after:?}");
            assert_ne!(text_of(&before), text_of(&after), "{tool}: a new server");
        }
        let r = servers.call(&engine, &m, "die", json!({})).await;
        assert_eq!(r.exit_code, Some(7), "{r:?}");
        servers.stop_all(&engine).await;
    });
    assert!(common::procs_with(&marker).is_empty());
}

#[test]
fn a_missing_required_variable_or_a_one_shot_run_is_refused() {
    let Some(engine) = engine(Config::default()) else { return };
    let (_d, m) = pack(r#","env_required":["FAKE_TOKEN"]"#);
    let servers = Servers::default();
    let rt = rt();
    rt.block_on(async {
        let r = servers.call(&engine, &m, "echo", json!({})).await;
        assert_eq!(r.outcome, Outcome::Rejected, "{r:?}");
        let e = r.error.unwrap_or_default();
        assert!(e.contains("required variable FAKE_TOKEN is not set"), "{e}");
        // Started again only after a backoff.
        let r = servers.call(&engine, &m, "echo", json!({})).await;
        assert!(r.error.unwrap_or_default().contains("next start in"));
    });
    // The pack's entry is a server: it is never run as a one-shot skill.
    let req = executor::RunRequest { manifest_path: m.clone(), args: b"{}".to_vec() };
    let mut sink = |_: &str| {};
    let r = rt.block_on(engine.run(req, &mut sink, std::future::pending()));
    assert_eq!(r.outcome, Outcome::Rejected, "{r:?}");
    assert!(r.error.unwrap_or_default().contains("not a one-shot skill"));
}

#[test]
fn an_idle_server_is_stopped_and_started_again_on_the_next_call() {
    let Some(engine) = engine(Config::default()) else { return };
    let (d, m) = pack(r#","idle_seconds":1"#);
    let marker = d.path().to_string_lossy().into_owned();
    let servers = Servers::default();
    rt().block_on(async {
        assert_eq!(servers.call(&engine, &m, "pid", json!({})).await.outcome, Outcome::Ok);
        assert_eq!(servers.stop_idle(&engine).await, 0, "used just now");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(servers.stop_idle(&engine).await, 1);
        assert!(common::procs_with(&marker).is_empty());
        assert_eq!(servers.call(&engine, &m, "pid", json!({})).await.outcome, Outcome::Ok);
        assert_eq!(servers.get(&m).lock().await.starts(), 2);
        servers.stop_all(&engine).await;
    });
}

#[test]
fn a_server_reaches_only_the_loopback_targets_its_egress_grant_names() {
    if !is_root() {
        println!("SKIP: not root: the egress allowlist needs root");
        return;
    }
    let granted = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (gp, op) = (granted.local_addr().unwrap().port(), other.local_addr().unwrap().port());
    let grant = policy::SkillGrant {
        network: true,
        connect: vec![format!("127.0.0.1:{gp}").parse().unwrap()],
        ..policy::SkillGrant::default()
    };
    let mut config = Config::default();
    config.skills.insert("fake".to_owned(), grant);
    let Some(engine) = engine(config) else { return };
    let (_d, m) = pack(r#","sandbox":{"network":true}"#);
    let servers = Servers::default();
    rt().block_on(async {
        let r =
            servers.call(&engine, &m, "connect", json!({"host": "127.0.0.1", "port": gp})).await;
        assert_eq!(text_of(&r), "connected", "{r:?}");
        let network = &r.sandbox.as_ref().unwrap().network;
        assert!(network.enabled, "{network:?}");
        let r =
            servers.call(&engine, &m, "connect", json!({"host": "127.0.0.1", "port": op})).await;
        assert!(text_of(&r).starts_with("refused"), "{r:?}");
        assert_eq!(r.result.as_ref().unwrap().to_value()["isError"], json!(true));
        servers.stop_all(&engine).await;
    });
}

#[test]
fn a_server_killed_mid_call_answers_signaled_and_the_next_call_succeeds() {
    let Some(engine) = engine(Config::default()) else { return };
    let (_d, m) = pack("");
    let servers = Servers::default();
    rt().block_on(async {
        let first = servers.call(&engine, &m, "pid", json!({})).await;
        let pid: i32 = text_of(&first).parse().expect("the server's pid");
        let killer = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL)
                .unwrap();
        };
        let (r, ()) = tokio::join!(servers.call(&engine, &m, "stall", json!({})), killer);
        assert_eq!(r.outcome, Outcome::Signaled, "{r:?}");
        assert_eq!(r.signal, Some(9), "{r:?}");
        assert!(r.error.as_deref().unwrap_or("").contains("closed its output"), "{r:?}");
        let next = servers.call(&engine, &m, "pid", json!({})).await;
        assert_eq!(next.outcome, Outcome::Ok, "{next:?}");
        assert_ne!(text_of(&next), text_of(&first));
        servers.stop_all(&engine).await;
    });
}

#[test]
fn a_calls_progress_is_handed_on_as_lines_and_its_stderr_is_not() {
    let Some(engine) = engine(Config::default()) else { return };
    let (_d, m) = pack("");
    let servers = Servers::default();
    rt().block_on(async {
        let mut lines = Vec::new();
        let mut sink = |l: &str| lines.push(l.to_owned());
        let call = servers.call_with_progress(
            &engine,
            &m,
            "progress",
            json!({}),
            &mut sink,
            std::future::pending(),
        );
        let (r, _) = call.await.expect("never given up");
        assert_eq!(text_of(&r), "done", "{r:?}");
        assert_eq!(r.result.as_ref().unwrap().to_value()["isError"], json!(true));
        let want: Vec<String> = (1..=3).map(|i| format!("progress {i}/3: step {i}")).collect();
        assert_eq!(lines, want, "this call's progress only, no stderr");
        assert!(r.stderr.is_empty(), "{r:?}");
        servers.stop_all(&engine).await;
    });
}

#[test]
fn an_idle_servers_list_change_is_listed_at_once_and_watched_and_its_garbage_cuts_it_off() {
    let Some(engine) = engine(Config::default()) else { return };
    let (_d, m) = pack("");
    let servers = Servers::default();
    rt().block_on(async {
        let test = async {
            for (tool, extra) in [("grow_soon", true), ("shrink_soon", false)] {
                let r = servers.call(&engine, &m, tool, json!({})).await;
                assert_eq!(text_of(&r), "soon", "{r:?}");
                let before = servers.generation(&m).await;
                // Any count but the current one answers at once with it.
                let since = servers.watch(u64::MAX, Duration::ZERO, std::future::pending()).await;
                let asked = std::time::Instant::now();
                let moves =
                    servers.watch(since.changes, Duration::from_secs(10), std::future::pending());
                let moves = moves.await;
                assert!(asked.elapsed() < Duration::from_secs(2), "{:?}", asked.elapsed());
                let now = servers.generation(&m).await;
                assert_ne!(now, before, "listed again without a call");
                assert_eq!(moves.packs, [(m.clone(), now)]);
                assert_eq!(moves.changes, since.changes + 1);
                let tools = servers.get(&m).lock().await.known_tools();
                assert_eq!(tools.iter().any(|t| t == "extra"), extra, "{tools:?}");
            }
            // A server that breaks the protocol while idle is cut off.
            let pid = servers.get(&m).lock().await.pid().expect("running");
            let r = servers.call(&engine, &m, "garbage_soon", json!({})).await;
            assert_eq!(text_of(&r), "soon", "{r:?}");
            let until = std::time::Instant::now() + Duration::from_secs(3);
            while servers.get(&m).lock().await.pid().is_some() && std::time::Instant::now() < until
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(servers.get(&m).lock().await.pid(), None, "cut off while idle");
            assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "its process is gone");
            let r = servers.call(&engine, &m, "echo", json!({})).await;
            assert_eq!(r.outcome, Outcome::Ok, "the next call starts it again: {r:?}");
            // Nothing moved since: the wait runs out with no pack.
            let since = servers.watch(u64::MAX, Duration::ZERO, std::future::pending()).await;
            let idle = servers.watch(since.changes, Duration::from_millis(300), async {});
            let idle = idle.await;
            assert!(idle.packs.is_empty() && idle.changes == since.changes, "{idle:?}");
        };
        tokio::select! {
            () = test => {}
            () = servers.watch_changes(&engine) => unreachable!("it watches for ever"),
        }
        servers.stop_all(&engine).await;
    });
}

#[test]
fn a_tools_list_changed_notification_refreshes_the_list_and_a_malformed_result_cuts_off() {
    let Some(engine) = engine(Config::default()) else { return };
    let (_d, m) = pack("");
    let servers = Servers::default();
    rt().block_on(async {
        let r = servers.call(&engine, &m, "extra", json!({})).await;
        assert_eq!(r.outcome, Outcome::Rejected, "not listed yet: {r:?}");
        let first = servers.generation(&m).await;
        let r = servers.call(&engine, &m, "grow", json!({})).await;
        assert_eq!(text_of(&r), "grown", "{r:?}");
        let grown = servers.generation(&m).await;
        assert_ne!(grown, first, "the list changed: its generation moved");
        let tools = servers.tools(&engine, &m).await.unwrap();
        assert!(tools.iter().any(|t| t.name == "extra"), "{tools:?}");
        let r = servers.call(&engine, &m, "extra", json!({})).await;
        assert_eq!(text_of(&r), "extra", "{r:?}");
        assert_eq!(servers.generation(&m).await, grown, "no change, no move");

        let r = servers.call(&engine, &m, "shrink", json!({})).await;
        assert_eq!(text_of(&r), "shrunk", "{r:?}");
        assert_ne!(servers.generation(&m).await, grown);
        let r = servers.call(&engine, &m, "extra", json!({})).await;
        assert_eq!(r.outcome, Outcome::Rejected, "a removed tool is refused: {r:?}");
        assert!(r.error.as_deref().unwrap_or("").contains("did not list"), "{r:?}");

        // A change said between calls is read before the next call's check.
        servers.call(&engine, &m, "grow", json!({})).await;
        let grown = servers.generation(&m).await;
        let r = servers.call(&engine, &m, "shrink_later", json!({})).await;
        assert_eq!(text_of(&r), "later", "{r:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = servers.call(&engine, &m, "extra", json!({})).await;
        assert_eq!(r.outcome, Outcome::Rejected, "removed between calls: {r:?}");
        assert_ne!(servers.generation(&m).await, grown);
        let pid = servers.get(&m).lock().await.pid();
        assert!(pid.is_some(), "the same server, not cut off");

        let r = servers.call(&engine, &m, "scalar", json!({})).await;
        assert_eq!(r.outcome, Outcome::InvalidResult, "{r:?}");
        assert!(r.error.as_deref().unwrap_or("").contains("cut off"), "{r:?}");
        assert_eq!(servers.get(&m).lock().await.pid(), None, "cut off");
        servers.stop_all(&engine).await;
    });
}

/// A call still waiting for its turn at the server while another holds it
/// is given up when its `give_up` resolves (the caller gone, the executor
/// stopping): never made. One that has its turn is made, whatever its
/// `give_up` does then (the server would be left mid-request).
#[test]
fn a_call_waiting_for_its_turn_is_given_up_and_one_begun_is_not() {
    let Some(engine) = engine(Config::default()) else { return };
    let (_d, m) = pack("");
    let servers = Servers::default();
    rt().block_on(async {
        let first = servers.call(&engine, &m, "pid", json!({})).await;
        assert_eq!(first.outcome, Outcome::Ok, "{first:?}");
        let soon = || tokio::time::sleep(Duration::from_millis(300));
        let (mut a, mut b) = (|_: &str| {}, |_: &str| {});
        let stall = servers.call_with_progress(&engine, &m, "stall", json!({}), &mut a, soon());
        let echo = async {
            // Asked once the stall has the server.
            tokio::time::sleep(Duration::from_millis(50)).await;
            servers.call_with_progress(&engine, &m, "echo", json!({}), &mut b, soon()).await
        };
        let (stalled, echoed) = tokio::join!(stall, echo);
        let (stalled, _) = stalled.expect("begun before its give_up: made");
        assert_eq!(stalled.outcome, Outcome::Timeout, "ran its 2 s: {stalled:?}");
        assert!(echoed.is_none(), "given up while the stall held the server: {echoed:?}");
        servers.stop_all(&engine).await;
    });
}
