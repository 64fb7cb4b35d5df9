//! The audit trail of the real daemon: rows committed before the
//! answer (SIGKILL right after it), the audit unavailable (503
//! `audit_unavailable` and the metric, or unaudited runs when not
//! required), and the `keygen`/`approve`/`audit` commands.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::permissions::{me, rows, start};
use crate::skilld::{audit_journal, Skilld, CLI};

/// Every answer is sent after its rows are written where a crash of the
/// daemon cannot lose them: SIGKILL the daemon as soon as the answer is
/// read. The safe run's rows were appended to the journal (`<db>-rows`),
/// and the next daemon writes them into the database at start-up,
/// complete, once; the denial of a `mutating` skill is in the database
/// already (it is `fsync`ed before its answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_survive_a_sigkill_right_after_the_answer() {
    let callers = format!(
        "\n[[callers]]\nuid = {}\nrole = \"operator\"\nmode = \"mutating-with-confirm\"\n",
        me()
    );
    let (env, _ex, mut d) = start("operator", "mutating-with-confirm", "");
    let c = d.client();
    let r = c.post("/v1/skills/strict/execute", &json!({"args": {"path": "/x"}})).await.unwrap();
    assert_eq!(r.status, 403);
    let r = c
        .post("/v1/skills/echo/execute", &json!({"args": {"n": 7}, "session_id": "kill-me"}))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    d.signal(Signal::SIGKILL);
    for _ in 0..200 {
        if !d.alive() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!d.alive());
    // The run's decision and completion, as journal lines.
    let journal = audit_journal(&env.audit_db());
    let text = std::fs::read_to_string(&journal).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let ops: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l["op"].as_str().unwrap(), l["skill"].as_str().unwrap_or("")))
        .collect();
    assert!(ops.contains(&("insert", "echo")) && ops.contains(&("finish", "")), "{text}");

    // The next daemon replays them into the database, and empties the journal.
    let d = Skilld::start(&env, &[&env.path("skills")], &callers);
    assert_eq!(
        rows(&env.audit_db(), "strict"),
        [("deny".into(), "confirm_required".into(), Some("denied".into()), "[]".into())]
    );
    let db = rusqlite::Connection::open(env.audit_db()).unwrap();
    let (session, outcome, result, exit_code, finished): (String, String, String, i64, Option<i64>) = db
        .query_row(
            "SELECT session_id, outcome, result, exit_code, finished_at FROM audit WHERE skill = 'echo'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    assert_eq!((session.as_str(), outcome.as_str(), exit_code), ("kill-me", "ok", 0));
    assert_eq!(serde_json::from_str::<Value>(&result).unwrap(), json!({"n": 7}));
    assert!(finished.is_some());
    let mode: String = db.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    // Emptied once the replayed rows are committed: a moment after they
    // can be read.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::metadata(&journal).unwrap().len() != 0 {
        assert!(std::time::Instant::now() < until, "the journal was not emptied");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(d.log().contains("journal replayed"), "{}", d.log());
    // A new row takes an id past the replayed ones.
    let r = d.client().post("/v1/skills/echo/execute", &json!({"args": {"n": 8}})).await.unwrap();
    assert_eq!(r.status, 200);
    let ids: Vec<i64> = {
        crate::skilld::audit_settled(&env.audit_db());
        let mut stmt = db.prepare("SELECT id FROM audit ORDER BY id").unwrap();
        stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
    };
    assert_eq!(ids, [1, 2, 3]);
}

/// An audit database that cannot be written: runs are refused with 503
/// `audit_unavailable` before reaching the executor, denials still deny,
/// each failed write counts in `ongrid_audit_write_errors_total`; with
/// `audit_required = false` the run goes ahead unaudited (still counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_audit_refuses_runs_unless_not_required() {
    for required in [true, false] {
        let config = format!(
            "audit_db = \"/nonexistent-ongrid-dir/audit.db\"\naudit_required = {required}\n"
        );
        let (_env, ex, d) = start("operator", "mutating-with-confirm", &config);
        let c = d.client();
        let r = c.post("/v1/skills/echo/execute", &json!({"args": {"n": 1}})).await.unwrap();
        if required {
            assert_eq!(r.status, 503, "{}", r.body);
            assert_eq!(r.body["error"]["code"], "audit_unavailable");
            let message = r.body["error"]["message"].as_str().unwrap();
            assert!(message.contains("/nonexistent-ongrid-dir/audit.db"), "{message}");
            // The request went out held while the row was tried; the
            // failed row closed its connection instead of starting it.
            let cancelled = || ex.stats.held_cancelled.load(std::sync::atomic::Ordering::SeqCst);
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while cancelled() == 0 && std::time::Instant::now() < until {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            assert_eq!(cancelled(), 1);
            assert_eq!(ex.stats.held.load(std::sync::atomic::Ordering::SeqCst), 1);
            assert_eq!(ex.stats.runs_started.load(std::sync::atomic::Ordering::SeqCst), 0);
        } else {
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(ex.stats.held.load(std::sync::atomic::Ordering::SeqCst), 1);
            assert_eq!(ex.stats.runs_started.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
        let r = c.post("/v1/skills/strict/execute", &json!({"args": {"path": "/"}})).await.unwrap();
        assert_eq!(r.body["error"]["reason"], "confirm_required");
        let text = d.scrape();
        assert!(text.contains("\nongrid_audit_write_errors_total 2\n"), "{required}: {text}");
        assert!(d.log().contains("cannot write the audit trail"), "{}", d.log());
        let r = c.get("/v1/audit").await.unwrap();
        assert_eq!(r.status, 503);
    }
}

fn cli(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(CLI).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `keygen` writes a 0600 key and prints its `[[approvers]]` block;
/// `approve` refuses a key others can read and signs what the daemon
/// accepts; `run --approval` sends them; `audit` shows the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keygen_approve_run_and_audit_commands() {
    let dir = tempfile::tempdir().unwrap();
    let key = |n: &str| dir.path().join(format!("{n}.key"));
    let mut approvers = String::new();
    for name in ["alice", "bob"] {
        let (code, out, err) = cli(&["keygen", "--out", key(name).to_str().unwrap()]);
        assert_eq!(code, Some(0), "{err}");
        assert!(
            out.starts_with(&format!("[[approvers]]\nname = \"{name}\"\npublic_key = \"")),
            "{out}"
        );
        assert!(out.contains("# key_id = "), "{out}");
        let mode = std::fs::metadata(key(name)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        approvers.push_str(&out);
    }
    let (code, _, err) = cli(&["keygen", "--out", key("alice").to_str().unwrap()]);
    assert_eq!(code, Some(1), "an existing key is kept: {err}");
    let config = format!("{approvers}\n[[callers]]\nuid = {}\nrole = \"ops\"\nmode = \"dual-sign-required\"\naudit = true\n", me());
    let (_env, _ex, d) = start("", "", &config);
    let socket = d.socket.to_str().unwrap().to_owned();
    let args = r#"{"days": 2}"#;
    let mut files = Vec::new();
    for name in ["alice", "bob"] {
        let (code, out, err) = cli(&[
            "approve",
            "--key",
            key(name).to_str().unwrap(),
            "--skill",
            "wipe",
            "--args",
            args,
            "--session-id",
            "s-7",
            "--ttl",
            "5m",
        ]);
        assert_eq!(code, Some(0), "{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["key_id"].as_str().unwrap().len(), 16);
        let file = dir.path().join(format!("{name}.json"));
        std::fs::write(&file, out).unwrap();
        files.push(file.to_str().unwrap().to_owned());
    }
    // Key order and spacing of --args do not matter (canonical JSON).
    let (code, out, err) = cli(&[
        "run",
        "wipe",
        "--socket",
        &socket,
        "--args",
        r#"{"days":2}"#,
        "--session-id",
        "s-7",
        "--approval",
        &files[0],
        "--approval",
        &files[1],
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), json!({"days": 2}));
    let (code, _, err) = cli(&[
        "run",
        "wipe",
        "--socket",
        &socket,
        "--args",
        args,
        "--session-id",
        "s-7",
        "--approval",
        &files[0],
        "--approval",
        &files[1],
    ]);
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("approval_replayed"), "{err}");

    let (code, out, err) = cli(&["audit", "--socket", &socket, "--skill", "wipe", "--since", "1h"]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("ID"), "{out}");
    assert!(lines[1].contains("deny") && lines[1].contains("approval_replayed"), "{out}");
    assert!(lines[2].contains("allow") && lines[2].contains("dual_signed"), "{out}");
    let (code, out, _) =
        cli(&["audit", "--socket", &socket, "--outcome", "ok", "--json", "--limit", "5"]);
    assert_eq!(code, Some(0));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["total"], 1);
    assert_eq!(v["items"][0]["approvers"].as_array().unwrap().len(), 2);
    // A `--since` that is no duration is a usage error, checked before asking.
    let (code, _, err) = cli(&["audit", "--socket", &socket, "--since", "soon"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("want e.g. 90s"), "{err}");

    // A key readable by others is refused.
    std::fs::set_permissions(key("bob"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, _, err) =
        cli(&["approve", "--key", key("bob").to_str().unwrap(), "--skill", "wipe"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("chmod 600"), "{err}");
}

/// While the rows the daemon journaled cannot be written into the
/// database, `ongrid-skill audit` does not pass what it reads for the
/// whole trail: an error while the database cannot be opened, else the
/// rows it can read with a warning on stderr (and `incomplete` in the
/// JSON). The log names the database once in each error. Triggers refuse
/// the inserts (as a lock or a full disk would) and the deletes of the
/// retention run at every open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_read_while_rows_cannot_be_written_says_so() {
    let config = format!(
        "audit_max_rows = 2\n[[callers]]\nuid = {}\nrole = \"auditor\"\nmode = \"read-only\"\n\
         audit = true\n",
        me()
    );
    let (env, _ex, d) = start("", "", &config);
    let c = d.client();
    let socket = d.socket.to_str().unwrap().to_owned();
    for n in 0..3 {
        let r = c.post("/v1/skills/echo/execute", &json!({"args": {"n": n}})).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    crate::skilld::audit_settled(&env.audit_db());
    let db = rusqlite::Connection::open(env.audit_db()).unwrap();
    db.execute_batch(
        "CREATE TRIGGER no_insert BEFORE INSERT ON audit \
           BEGIN SELECT RAISE(ABORT, 'refused by the test'); END; \
         CREATE TRIGGER no_delete BEFORE DELETE ON audit \
           BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
    )
    .unwrap();
    // Journaled and answered; the thread cannot write it, and then cannot
    // open the database again (retention's delete is refused).
    let r = c.post("/v1/skills/echo/execute", &json!({"args": {"n": 9}})).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let refused = |log: &str| log.lines().filter(|l| l.contains("refused by the test")).count();
    assert!(
        crate::skilld::eventually(std::time::Duration::from_secs(10), || refused(&d.log()) >= 2)
            .await,
        "{}",
        d.log()
    );
    let (code, _, err) = cli(&["audit", "--socket", &socket]);
    assert_eq!(code, Some(6), "{err}");
    assert!(err.contains("audit_unavailable"), "{err}");
    let log = d.log();
    assert!(!log.contains("unavailable: audit database"), "the database named twice:\n{log}");

    // It opens again, the inserts are still refused: the rows it can read,
    // said to be incomplete.
    db.execute_batch("DROP TRIGGER no_delete").unwrap();
    let (code, out, err) = cli(&["audit", "--socket", &socket]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("ID "), "{out}");
    assert!(
        err.starts_with("ongrid-skill: warning: the audit trail shown is incomplete: 2 journaled"),
        "{err}"
    );
    assert!(err.contains("unavailable: refused by the test"), "{err}");
    let (code, out, err) = cli(&["audit", "--socket", &socket, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("warning: the audit trail shown is incomplete"), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["incomplete"]["unwritten"], 2, "the run's row and its completion: {v}");

    // Whole again once they go in.
    db.execute_batch("DROP TRIGGER no_insert").unwrap();
    let (code, out, err) = cli(&["audit", "--socket", &socket, "--json"]);
    assert_eq!((code, err.as_str()), (Some(0), ""));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v.get("incomplete").is_none(), "{v}");
    assert_eq!(v["total"], 3, "two kept by retention, and the journaled run: {v}");
}

/// An outcome or decision no row can hold is a 400 naming the valid
/// words, not an empty answer; the valid ones filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_audit_filters_are_refused_with_the_valid_words() {
    let callers = format!(
        "\n[[callers]]\nuid = {}\nrole = \"auditor\"\nmode = \"mutating-with-confirm\"\naudit = true\n",
        me()
    );
    let (_env, _ex, d) = start("", "", &callers);
    let c = d.client();
    assert_eq!(c.post("/v1/skills/echo/execute", &json!({"args": {}})).await.unwrap().status, 200);
    for (query, valid) in
        [("outcome=timedout", "cancelled"), ("decision=permit", "reject"), ("outcome=OK", "ok")]
    {
        let r = c.get(&format!("/v1/audit?{query}")).await.unwrap();
        assert_eq!(r.status, 400, "{query}: {}", r.body);
        assert_eq!(r.body["error"]["code"], "bad_request");
        let message = r.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("is not one of"), "{message}");
        assert!(message.contains(valid), "{message}");
    }
    for query in ["outcome=ok", "decision=allow", "outcome=ok&decision=allow&skill=echo"] {
        let r = c.get(&format!("/v1/audit?{query}")).await.unwrap();
        assert_eq!(r.status, 200, "{query}: {}", r.body);
        assert_eq!(r.body["total"], 1, "{query}: {}", r.body);
    }
    let r = c.get("/v1/audit?outcome=cancelled&decision=deny").await.unwrap();
    assert_eq!((r.status.as_u16(), &r.body["total"]), (200, &json!(0)));
}
