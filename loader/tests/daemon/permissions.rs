//! Permission modes, the class gate, dual-sign approvals (every
//! allow and deny path), and the exact audit row of each decision.
//! The daemon is the real binary; its caller is this test process (uid
//! `me()`), mapped to a mode by each case's `[[callers]]`, or a CLI child
//! run as another uid through `setpriv`.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use policy::approval::{SecretKey, Subject};
use serde_json::{json, Value};

use crate::fake_executor::FakeExecutor;
use crate::skilld::{Env, Skilld, CLI};

pub fn me() -> u32 {
    nix::unistd::geteuid().as_raw()
}

pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// alice and bob are configured approvers; mallory is not.
pub struct Keys {
    pub alice: SecretKey,
    pub bob: SecretKey,
    pub mallory: SecretKey,
}

impl Keys {
    pub fn new() -> Self {
        Keys {
            alice: SecretKey::from_seed([0xa1; 32]),
            bob: SecretKey::from_seed([0xb0; 32]),
            mallory: SecretKey::from_seed([0x66; 32]),
        }
    }

    pub fn config(&self) -> String {
        format!(
            "[[approvers]]\nname = \"alice\"\npublic_key = \"{}\"\n\
             [[approvers]]\nname = \"bob\"\npublic_key = \"{}\"\n",
            self.alice.public_key(),
            self.bob.public_key()
        )
    }
}

/// `key`'s approval of running `wipe` with `args` in session `s-1`.
pub fn approve(key: &SecretKey, args: &Value, expires_at: u64) -> Value {
    // The body sends `args` as serde_json writes it: sign that text.
    let args = policy::Args::from_slice(&serde_json::to_vec(args).unwrap()).unwrap();
    let subject = Subject { skill: "wipe", args: &args, session_id: Some("s-1") };
    serde_json::to_value(key.approve(&subject, expires_at)).unwrap()
}

/// The standard skills plus `wipe` (dangerous), a fake executor, and a
/// daemon whose config is `config` (with a `[[callers]]` entry for this
/// process of role `role` and mode `mode`, unless `mode` is empty).
pub fn start(role: &str, mode: &str, config: &str) -> (Env, FakeExecutor, Skilld) {
    let env = Env::new();
    let skills = env.standard_skills();
    env.skill(
        "skills",
        "wipe",
        r#","class":"dangerous","schema":{"type":"object","properties":{"days":{"type":"integer"}},"required":["days"]}"#,
        "cat",
    );
    let executor = FakeExecutor::start(&env.executor_socket());
    let mut text = config.to_owned();
    if !mode.is_empty() {
        text.push_str(&format!(
            "\n[[callers]]\nuid = {}\nrole = \"{role}\"\nmode = \"{mode}\"\n",
            me()
        ));
    }
    let daemon = Skilld::start(&env, &[&skills], &text);
    (env, executor, daemon)
}

/// The audit rows of `skill` read straight from the database once the
/// journal's rows are in it, oldest first: (decision, reason, outcome,
/// approvers as JSON text).
pub fn rows(db: &Path, skill: &str) -> Vec<(String, String, Option<String>, String)> {
    crate::skilld::audit_settled(db);
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let mut stmt = c
        .prepare(
            "SELECT decision, reason, outcome, approvers FROM audit WHERE skill = ?1 ORDER BY id",
        )
        .unwrap();
    stmt.query_map([skill], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn row(decision: &str, reason: &str, outcome: &str) -> (String, String, Option<String>, String) {
    (decision.into(), reason.into(), Some(outcome.into()), "[]".into())
}

async fn names(d: &Skilld, path: &str) -> Vec<String> {
    let r = d.client().get(path).await.unwrap();
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    let list = r.body.get("items").or_else(|| r.body.get("tools")).unwrap().as_array().unwrap();
    list.iter()
        .map(|i| {
            i.get("name")
                .or_else(|| i.pointer("/function/name"))
                .and_then(Value::as_str)
                .unwrap()
                .to_owned()
        })
        .collect()
}

fn sample(text: &str, needle: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(needle))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse().unwrap())
}

/// read-only: safe runs; mutating and dangerous are hidden: listings show
/// the safe skills only, and show and execute answer the others with the
/// 404 of no such skill (even confirmed, even signed, even with args the
/// schema refuses or a body that is not JSON), while each well-formed
/// request's denial is audited and counted with its reason,
/// `class_not_permitted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_runs_and_sees_safe_skills_only() {
    let keys = Keys::new();
    let (env, ex, d) = start("viewer", "read-only", &keys.config());
    let c = d.client();
    let r = c.post("/v1/skills/echo/execute", &json!({"args": {"n": 1}})).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = c
        .post("/v1/skills/strict/execute", &json!({"args": {"path": "/"}, "confirm": true}))
        .await
        .unwrap();
    // The answer to a skill that does not exist, with its name.
    assert_eq!(r.status, 404);
    let unknown = c.post("/v1/skills/nope/execute", &json!({})).await.unwrap();
    assert_eq!(unknown.body["error"]["message"], "no skill named \"nope\"");
    assert_eq!(
        r.body,
        json!({"error": {"code": "not_found", "message": "no skill named \"strict\""}})
    );
    assert_eq!(r.body, c.get("/v1/skills/strict").await.unwrap().body);
    let args = json!({"days": 3});
    let approvals =
        [approve(&keys.alice, &args, now() + 60), approve(&keys.bob, &args, now() + 60)];
    let body = json!({"args": args, "session_id": "s-1", "approvals": approvals});
    let r = c.post("/v1/skills/wipe/execute", &body).await.unwrap();
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "not_found", "{}", r.body);
    // Nothing about the request tells a hidden skill from a missing one:
    // args the schema refuses, a body that is not JSON.
    for body in [json!({"args": {"depth": -1}, "confirm": true}), json!("not an object")] {
        let r = c.post("/v1/skills/strict/execute", &body).await.unwrap();
        assert_eq!(r.status, 404, "{body}: {}", r.body);
        assert_eq!(r.body["error"]["message"], "no skill named \"strict\"");
    }
    // Nor its time: the 404 comes at once, its body unread (one promised
    // and never sent here), as for an unknown name.
    for skill in ["strict", "nope"] {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
        let head = format!(
            "POST /v1/skills/{skill}/execute HTTP/1.1\r\nHost: x\r\n\
             Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let mut answer = [0u8; 12];
        let read = tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut answer));
        let n = read.await.unwrap_or_else(|_| panic!("{skill}: no answer in 2 s"));
        assert_eq!(n.unwrap(), 12);
        assert_eq!(&answer, b"HTTP/1.1 404", "{skill}");
    }
    assert_eq!(ex.stats.runs_started.load(Ordering::SeqCst), 1);

    let safe = ["echo", "fail", "sleeper", "slow"];
    assert_eq!(names(&d, "/v1/skills").await, safe);
    for format in ["openai", "mcp", "anthropic"] {
        assert_eq!(names(&d, &format!("/v1/tools?format={format}")).await, safe, "{format}");
    }
    assert_eq!(c.get("/v1/skills/strict").await.unwrap().status, 404);
    assert_eq!(c.get("/v1/skills/echo").await.unwrap().status, 200);

    assert_eq!(rows(&env.audit_db(), "echo"), [row("allow", "safe", "ok")]);
    // Every request for the hidden skill is a denial with its reason,
    // decided before its body is read (so whatever the body held).
    let denied = |_| row("deny", "class_not_permitted", "denied");
    assert_eq!(rows(&env.audit_db(), "strict"), (0..4).map(denied).collect::<Vec<_>>());
    assert_eq!(rows(&env.audit_db(), "wipe"), [row("deny", "class_not_permitted", "denied")]);
    // The approvals of a denied request are not used up.
    let text = d.scrape();
    assert_eq!(
        sample(
            &text,
            "ongrid_authz_decisions_total{decision=\"deny\",reason=\"class_not_permitted\"}"
        ),
        5
    );
    assert_eq!(
        sample(&text, "ongrid_authz_decisions_total{decision=\"allow\",reason=\"safe\"}"),
        1
    );
    assert_eq!(sample(&text, "ongrid_executions_total{outcome=\"denied\",skill=\"wipe\"}"), 1);
}

/// A hidden skill's 404 does not wait for its denial's row, which could
/// tell it from an unknown name: with every row committed and synced before
/// its answer (`audit_synchronous = "full"`) and the database locked by
/// another process, it still comes at once; its row is written once the
/// lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hidden_skills_404_does_not_wait_for_its_row() {
    let (env, _ex, d) = start("viewer", "read-only", "audit_synchronous = \"full\"\n");
    let c = d.client();
    assert_eq!(c.post("/v1/skills/echo/execute", &json!({})).await.unwrap().status, 200);
    let lock = rusqlite::Connection::open(env.audit_db()).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    for skill in ["strict", "nope"] {
        let (path, body) = (format!("/v1/skills/{skill}/execute"), json!({}));
        let r = tokio::time::timeout(Duration::from_secs(2), c.post(&path, &body))
            .await
            .unwrap_or_else(|_| panic!("{skill}: no answer in 2 s with the database locked"))
            .unwrap();
        assert_eq!(r.status, 404, "{skill}: {}", r.body);
    }
    lock.execute_batch("COMMIT").unwrap();
    drop(lock);
    let want = [row("deny", "class_not_permitted", "denied")];
    let mut written = rows(&env.audit_db(), "strict");
    for _ in 0..100 {
        if written == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        written = rows(&env.audit_db(), "strict");
    }
    assert_eq!(written, want, "the row once the lock went");
}

/// A caller no entry matches is `unmapped`, read-only; an entry for its
/// primary gid applies when no uid entry does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmapped_callers_are_read_only_and_primary_gid_entries_match() {
    let other = "[[callers]]\nuid = 4242\nrole = \"x\"\nmode = \"dual-sign-required\"\n";
    let (env, _ex, d) = start("", "", other);
    let body = json!({"args": {"path": "/"}, "confirm": true});
    let r = d.client().post("/v1/skills/strict/execute", &body).await.unwrap();
    assert_eq!((r.status.as_u16(), &r.body["error"]["code"]), (404, &json!("not_found")));
    let got = d.client().get("/v1/audit?skill=strict").await.unwrap();
    assert_eq!(got.body["items"][0]["reason"], "class_not_permitted");
    assert_eq!(got.body["items"][0]["role"], "unmapped");
    assert_eq!(got.body["items"][0]["mode"], "read-only");
    drop((env, d));

    let gid = nix::unistd::getegid().as_raw();
    let by_gid =
        format!("[[callers]]\ngid = {gid}\nrole = \"admins\"\nmode = \"mutating-with-confirm\"\n");
    let (_env, _ex, d) = start("", "", &by_gid);
    let r = d.client().post("/v1/skills/strict/execute", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let got = d.client().get("/v1/audit").await.unwrap();
    assert_eq!(got.body["items"][0]["role"], "admins");
    assert_eq!(got.body["items"][0]["reason"], "confirmed");
}

/// mutating-with-confirm: a mutating skill without `"confirm": true` is
/// 403 `confirm_required` (the caller sees it); confirmed, it runs;
/// dangerous stays out, hidden (404, audited `class_not_permitted`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_needs_confirm() {
    let keys = Keys::new();
    let (env, ex, d) = start("operator", "mutating-with-confirm", &keys.config());
    let c = d.client();
    let r = c.post("/v1/skills/strict/execute", &json!({"args": {"path": "/"}})).await.unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(r.body["error"]["reason"], "confirm_required");
    assert!(r.body["error"]["message"].as_str().unwrap().contains("confirm"), "{}", r.body);
    let body = json!({"args": {"path": "/"}, "confirm": true, "session_id": "s-9"});
    let r = c.post("/v1/skills/strict/execute", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = c.post("/v1/skills/wipe/execute", &json!({"args": {"days": 1}})).await.unwrap();
    assert_eq!((r.status.as_u16(), &r.body["error"]["code"]), (404, &json!("not_found")));
    assert_eq!(rows(&env.audit_db(), "wipe"), [row("deny", "class_not_permitted", "denied")]);
    assert_eq!(ex.stats.runs_started.load(Ordering::SeqCst), 1);
    assert_eq!(
        names(&d, "/v1/tools?format=mcp").await,
        ["echo", "fail", "sleeper", "slow", "strict"]
    );
    assert_eq!(
        rows(&env.audit_db(), "strict"),
        [row("deny", "confirm_required", "denied"), row("allow", "confirmed", "ok")]
    );
    // The full row of the run.
    let got = c.get("/v1/audit?skill=strict&outcome=ok").await.unwrap();
    assert_eq!(got.body["total"], 1);
    let e = &got.body["items"][0];
    assert_eq!(e["session_id"], "s-9");
    assert_eq!(e["class"], "mutating");
    assert_eq!(e["caller_uid"], me());
    assert_eq!(e["role"], "operator");
    assert_eq!(e["mode"], "mutating-with-confirm");
    assert_eq!(e["args"], json!({"path": "/"}));
    assert_eq!(e["result"], json!({"path": "/"}));
    assert_eq!(e["exit_code"], 0);
    assert!(e["finished_at"].as_i64().unwrap() >= e["started_at"].as_i64().unwrap());
    assert!(e["duration_ms"].is_number());
    assert_eq!(e["args_truncated"], false);

    // The default `audit_synchronous = "interval"`: the rows of mutating
    // and dangerous skills were fsynced before their answers (the refusal,
    // the run's decision and completion, the dangerous refusal); a safe
    // run adds none.
    let commit_syncs = || sample(&d.scrape(), "ongrid_audit_syncs_total{when=\"commit\"}");
    assert_eq!(commit_syncs(), 4);
    let r = c.post("/v1/skills/echo/execute", &json!({"args": {"n": 1}})).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(commit_syncs(), 4);
}

/// dual-sign-required: every way an approval can be wrong is refused with
/// its reason and audited, nothing reaches the executor until two valid
/// approvals from two keys come, and those are accepted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dangerous_needs_two_valid_distinct_approvals_once() {
    let keys = Keys::new();
    let (env, ex, d) = start("ops", "dual-sign-required", &keys.config());
    let c = d.client();
    let args = json!({"days": 30});
    let t = now();
    let alice = approve(&keys.alice, &args, t + 300);
    let bob = approve(&keys.bob, &args, t + 300);
    let mut forged = bob.clone();
    let sig = forged["signature"].as_str().unwrap().to_owned();
    let flipped = if sig.starts_with('A') { "B" } else { "A" };
    forged["signature"] = json!(format!("{flipped}{}", &sig[1..]));
    // Signed by bob's key but sent under alice's key id.
    let mut wrong_key = bob.clone();
    wrong_key["key_id"] = alice["key_id"].clone();
    let changed = approve(&keys.bob, &json!({"days": 31}), t + 300);
    let cases: Vec<(&str, Vec<Value>, &str)> = vec![
        ("none", vec![], "approvals_required"),
        ("one", vec![alice.clone()], "approvals_required"),
        ("forged signature", vec![alice.clone(), forged], "approval_invalid_signature"),
        ("wrong key", vec![bob.clone(), wrong_key], "approval_invalid_signature"),
        (
            "unknown key",
            vec![alice.clone(), approve(&keys.mallory, &args, t + 300)],
            "approval_unknown_key",
        ),
        (
            "same key twice",
            vec![alice.clone(), approve(&keys.alice, &args, t + 200)],
            "approval_duplicate_key",
        ),
        ("expired", vec![alice.clone(), approve(&keys.bob, &args, t - 1)], "approval_expired"),
        (
            "too far ahead",
            vec![alice.clone(), approve(&keys.bob, &args, t + 3600)],
            "approval_ttl_too_long",
        ),
        ("args changed after signing", vec![alice.clone(), changed], "approval_mismatch"),
        ("not an approval", vec![alice.clone(), json!({"key_id": 7})], "approval_malformed"),
    ];
    let n = cases.len();
    for (what, approvals, reason) in cases {
        let body = json!({"args": args, "session_id": "s-1", "approvals": approvals});
        let r = c.post("/v1/skills/wipe/execute", &body).await.unwrap();
        assert_eq!(r.status, 403, "{what}: {}", r.body);
        assert_eq!(r.body["error"]["reason"], reason, "{what}: {}", r.body);
    }
    // Another session id: the approvals were not for this request.
    let body = json!({"args": args, "session_id": "s-2", "approvals": [alice, bob]});
    let r = c.post("/v1/skills/wipe/execute", &body).await.unwrap();
    assert_eq!(r.body["error"]["reason"], "approval_mismatch", "{}", r.body);
    assert_eq!(ex.stats.runs_started.load(Ordering::SeqCst), 0);

    // Valid: runs, with the approver key ids in the row.
    let body = json!({"args": args, "session_id": "s-1", "approvals": [alice, bob]});
    let r = c.post("/v1/skills/wipe/execute", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["result"], args);
    // Replayed, whole or in part.
    let r = c.post("/v1/skills/wipe/execute", &body).await.unwrap();
    assert_eq!(r.body["error"]["reason"], "approval_replayed", "{}", r.body);
    let fresh_bob = approve(&keys.bob, &args, t + 299);
    let partly = json!({"args": args, "session_id": "s-1", "approvals": [alice, fresh_bob]});
    let r = c.post("/v1/skills/wipe/execute", &partly).await.unwrap();
    assert_eq!(r.body["error"]["reason"], "approval_replayed", "{}", r.body);
    assert_eq!(ex.stats.runs_started.load(Ordering::SeqCst), 1);
    // Two fresh approvals: runs again.
    let again = json!({"args": args, "session_id": "s-1",
        "approvals": [approve(&keys.alice, &args, t + 298), fresh_bob]});
    assert_eq!(c.post("/v1/skills/wipe/execute", &again).await.unwrap().status, 200);

    let got = rows(&env.audit_db(), "wipe");
    let reasons: Vec<&str> = got.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "approvals_required",
            "approvals_required",
            "approval_invalid_signature",
            "approval_invalid_signature",
            "approval_unknown_key",
            "approval_duplicate_key",
            "approval_expired",
            "approval_ttl_too_long",
            "approval_mismatch",
            "approval_malformed",
            "approval_mismatch",
            "dual_signed",
            "approval_replayed",
            "approval_replayed",
            "dual_signed",
        ]
    );
    assert!(got[..=n].iter().all(|r| r.0 == "deny" && r.2.as_deref() == Some("denied")));
    let ids = format!("[\"{}\",\"{}\"]", keys.alice.key_id(), keys.bob.key_id());
    assert_eq!(got[n + 1], ("allow".into(), "dual_signed".into(), Some("ok".into()), ids));
    let text = d.scrape();
    let deny = |r: &str| {
        sample(&text, &format!("ongrid_authz_decisions_total{{decision=\"deny\",reason=\"{r}\"}}"))
    };
    assert_eq!(deny("approvals_required"), 2);
    assert_eq!(deny("approval_invalid_signature"), 2);
    assert_eq!(deny("approval_mismatch"), 2);
    assert_eq!(deny("approval_replayed"), 2);
    assert_eq!(deny("approval_expired"), 1);
    assert_eq!(
        sample(&text, "ongrid_authz_decisions_total{decision=\"allow\",reason=\"dual_signed\"}"),
        2
    );
    assert_eq!(sample(&text, "ongrid_executions_total{outcome=\"denied\",skill=\"wipe\"}"), 13);
    assert_eq!(sample(&text, "ongrid_audit_write_errors_total"), 0);
}

/// The used approvals are in the database: a restarted daemon refuses
/// them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_does_not_reopen_the_replay_window() {
    let keys = Keys::new();
    let config = format!(
        "{}\n[[callers]]\nuid = {}\nrole = \"ops\"\nmode = \"dual-sign-required\"\n",
        keys.config(),
        me()
    );
    let (env, _ex, d) = start("", "", &config);
    let args = json!({"days": 1});
    let body = json!({"args": args, "session_id": "s-1", "approvals":
        [approve(&keys.alice, &args, now() + 600), approve(&keys.bob, &args, now() + 600)]});
    assert_eq!(d.client().post("/v1/skills/wipe/execute", &body).await.unwrap().status, 200);
    assert!(d.stop().success());
    let skills = env.path("skills");
    let d = Skilld::start(&env, &[&skills], &config);
    let r = d.client().post("/v1/skills/wipe/execute", &body).await.unwrap();
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.body["error"]["reason"], "approval_replayed");
}

/// Another uid, through the CLI: unmapped, it is read-only, sees the safe
/// skills, may not read the audit trail nor reload; mapped through a
/// supplementary group (read from /proc), it gets that entry's mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_through_the_cli_and_supplementary_groups() {
    if me() != 0 || !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("SKIP: needs root and setpriv to run the CLI as another uid");
        return;
    }
    let config = "socket_mode = \"0666\"\n\
                  [[callers]]\ngid = 4242\nrole = \"ops-group\"\nmode = \"mutating-with-confirm\"\n";
    let (_env, _ex, d) = start("", "", config);
    let socket = d.socket.clone();
    let as_nobody = move |groups: &str, args: &[&str]| {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", &format!("--groups={groups}"), "--"])
            .arg(CLI)
            .args(args)
            .env("ONGRID_SOCKET", &socket)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = as_nobody("65534", &["list", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["total"], 4, "{listed}");
    // A skill the caller may not see is no such skill, to it.
    let (code, _, err) =
        as_nobody("65534", &["run", "strict", "--confirm", "--args", r#"{"path":"/"}"#]);
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("not_found: no skill named \"strict\""), "{err}");
    let (code, _, err) = as_nobody("65534", &["audit"]);
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("forbidden"), "{err}");
    // Read-only callers may not make the daemon rescan; a mode beyond
    // read-only may.
    let (code, _, err) = as_nobody("65534", &["reload"]);
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("may not reload"), "{err}");
    let (code, _, err) = as_nobody("65534,4242", &["reload"]);
    assert_eq!(code, Some(0), "{err}");

    let (code, out, err) =
        as_nobody("65534,4242", &["run", "strict", "--confirm", "--args", r#"{"path":"/"}"#]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), json!({"path": "/"}));
    // Root reads the trail: the two runs of uid 65534.
    let got = d.client().get("/v1/audit?skill=strict").await.unwrap();
    let items = got.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["caller_uid"], 65534);
    assert_eq!(items[0]["role"], "ops-group");
    assert_eq!(items[0]["reason"], "confirmed");
    assert_eq!(items[1]["role"], "unmapped");
    assert_eq!(items[1]["reason"], "class_not_permitted");
}
