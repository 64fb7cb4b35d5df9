//! `ongrid-skill list|show|run|reload` against the daemon, and their exit
//! codes.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::skilld::CLI;
use crate::{setup, Env, FakeExecutor, Skilld};

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

/// A pack's description and a skill's stderr and result reach the
/// operator's terminal without their control characters in human output
/// (escaped, as journalctl does; the result as JSON escapes), and as they
/// are with `--json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn human_output_escapes_control_characters_and_json_keeps_them() {
    let env = Env::new();
    let hostile = |name: &str, exit: u8| {
        let dir = env.skill(
            "skills",
            name,
            "",
            &format!(
                "printf 'a\\033[2Jb\\rc\\n' >&2\nprintf 'next\\n' >&2\n\
                 printf '{{\"r\":\"\\302\\233x\\177\"}}'\nexit {exit}"
            ),
        );
        let manifest = format!(
            r#"{{"name":"{name}","entry":"run",
                "description":"line one\nline two \u001b[31mred\u001b]0;title\u0007 \u009b2J"}}"#
        );
        std::fs::write(dir.join("skill.json"), manifest).unwrap();
    };
    hostile("ansi", 0);
    hostile("ansi_fail", 1);
    let ex = FakeExecutor::start(&env.executor_socket());
    let d = Skilld::start(&env, &[&env.path("skills")], "");
    let s = &d.socket;
    let raw = "line one\nline two \x1b[31mred\x1b]0;title\x07 \u{9b}2J";
    let shown = "line one\\nline two \\x1b[31mred\\x1b]0;title\\x07 \\u{9b}2J";
    let no_controls = |text: &str| !text.chars().any(|c| c.is_control() && c != '\n');

    let o = cli(s, &["list"], None).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(no_controls(&o.stdout), "{:?}", o.stdout);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "one line per skill: {lines:?}");
    assert!(lines[1].ends_with(shown), "{lines:?}");
    let o = cli(s, &["list", "--json"], None).await;
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["items"][0]["description"], raw);

    let o = cli(s, &["show", "ansi"], None).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(no_controls(&o.stdout), "{:?}", o.stdout);
    assert!(o.stdout.contains(&format!("description:  {shown}\n")), "{}", o.stdout);
    let o = cli(s, &["show", "ansi", "--json"], None).await;
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["description"], raw);

    // The stream: one line each, as the skill wrote them, escaped; the
    // result the same JSON value, without raw C1 or DEL.
    let o = cli(s, &["run", "ansi", "--stream"], None).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stderr, "a\\x1b[2Jb\\rc\nnext\n");
    assert!(no_controls(&o.stdout), "{:?}", o.stdout);
    assert_eq!(o.stdout, "{\"r\":\"\\u009bx\\u007f\"}\n");
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["r"], "\u{9b}x\u{7f}");
    let o = cli(s, &["run", "ansi", "--stream", "--json"], None).await;
    let first: serde_json::Value = serde_json::from_str(o.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(first["line"], "a\x1b[2Jb\rc");

    // A failure's stderr tail.
    let o = cli(s, &["run", "ansi_fail"], None).await;
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(no_controls(&o.stderr), "{:?}", o.stderr);
    assert!(o.stderr.ends_with("stderr (tail):\n  a\\x1b[2Jb\\rc\n  next\n"), "{}", o.stderr);
    // Streamed, the lines are printed once, as they came, then the failure.
    let o = cli(s, &["run", "ansi_fail", "--stream"], None).await;
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.starts_with("a\\x1b[2Jb\\rc\nnext\n"), "{}", o.stderr);
    assert_eq!(o.stderr.matches("next").count(), 1, "printed twice: {}", o.stderr);
    assert!(!o.stderr.contains("stderr (tail)"), "{}", o.stderr);
    assert!(o.stderr.contains("failed: exit_nonzero"), "{}", o.stderr);
    let o = cli(s, &["run", "ansi_fail", "--json"], None).await;
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["stderr"], "a\x1b[2Jb\rc\nnext\n");
    drop(d);
    ex.stop().await;
}

/// An empty `ONGRID_SOCKET` counts as unset: the default socket, not a
/// usage error about a `--socket` nobody gave.
#[test]
fn an_empty_ongrid_socket_means_the_default() {
    let out = Command::new(CLI).arg("list").env("ONGRID_SOCKET", "").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("a value is required"), "{stderr}");
    match out.status.code() {
        // A daemon answers there on this host.
        Some(0) => {}
        Some(3) => assert!(stderr.contains(loader::daemon::config::DEFAULT_SOCKET), "{stderr}"),
        other => panic!("{other:?}: {stderr}"),
    }
}
