//! `ongrid-skill list|show|run|reload` against the daemon, and their exit
//! codes.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::setup;
use crate::skilld::CLI;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the CLI (off the async workers) with `args` and optional stdin.
async fn cli(socket: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Out {
    let socket = socket.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(CLI)
            .args(&args)
            .env("ONGRID_SOCKET", &socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_run_reload_and_exit_codes() {
    let (env, ex, d) = setup();
    let s = &d.socket;

    let o = cli(s, &["list"], None).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(lines[0].starts_with("NAME "), "{}", o.stdout);
    assert_eq!(lines.len(), 6);
    let o = cli(s, &["list", "--json", "--category", "test"], None).await;
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["total"], 1);

    let o = cli(s, &["show", "strict"], None).await;
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("class:        mutating"), "{}", o.stdout);
    let o = cli(s, &["show", "nope"], None).await;
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(o.stderr.contains("not_found"), "{}", o.stderr);

    let o = cli(s, &["run", "echo", "--args", r#"{"n":5}"#], None).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&o.stdout).unwrap()["n"], 5);
    let o = cli(s, &["run", "echo", "--args", "-", "--json"], Some(r#"{"n":6}"#)).await;
    assert_eq!(o.code, 0);
    let report: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(report["outcome"], "ok");
    assert_eq!(report["result"]["n"], 6);
    let o = cli(s, &["run", "echo", "--stream"], None).await;
    assert_eq!(o.code, 0);
    assert_eq!(o.stderr, "echo: starting\necho: second line\n");
    let o = cli(s, &["run", "echo", "--stream", "--json"], None).await;
    assert_eq!(o.stdout.lines().count(), 3, "{}", o.stdout);

    let o = cli(s, &["run", "fail"], None).await;
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("exit_nonzero"), "{}", o.stderr);
    assert!(o.stderr.contains("  boom"), "{}", o.stderr);
    let o = cli(s, &["run", "nope"], None).await;
    assert_eq!(o.code, 4);
    let o = cli(s, &["run", "strict", "--args", r#"{"depth":"x"}"#], None).await;
    assert_eq!(o.code, 5);
    assert!(o.stderr.contains("/depth"), "{}", o.stderr);
    let o = cli(s, &["run", "strict", "--args", "{", "--json"], None).await;
    assert_eq!(o.code, 2);
    let o = cli(s, &["run", "strict", "--args", "[]"], None).await;
    assert_eq!(o.code, 2);

    env.skill("skills", "later", "", "echo '{}'");
    let o = cli(s, &["reload"], None).await;
    assert_eq!(o.code, 0);
    assert_eq!(o.stdout, "6 skills registered, 0 skipped\n");
    let o = cli(s, &["reload", "--json"], None).await;
    assert_eq!(o.stdout.trim().replace([' ', '\n'], ""), r#"{"registered":6,"skipped":0}"#);

    ex.stop().await;
    let o = cli(s, &["run", "echo"], None).await;
    assert_eq!(o.code, 6, "{}", o.stderr);
    assert!(o.stderr.contains("executor_unavailable"), "{}", o.stderr);

    let o = cli(&env.path("none.sock"), &["list"], None).await;
    assert_eq!(o.code, 3);
    assert!(o.stderr.contains("cannot connect"), "{}", o.stderr);
    let o = cli(&env.path("none.sock"), &["list", "--json"], None).await;
    assert_eq!(o.code, 3);
    let e: serde_json::Value = serde_json::from_str(o.stderr.trim()).unwrap();
    assert_eq!(e["error"]["code"], "unreachable");

    let o = cli(s, &["run", "--help"], None).await;
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("Exit codes:"), "{}", o.stdout);
}
