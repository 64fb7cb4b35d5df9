//! The client API against the real executor: list, show, every outcome a
//! client sees, the stream, unknown skills.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::Stack;

#[test]
fn list_show_and_run_outcomes() {
    let s = Stack::start();

    let r = s.get("/v1/skills");
    assert_eq!(r.status, 200);
    let list = r.json();
    let mut names: Vec<&str> =
        list["items"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["echo", "fail", "finisher", "sleeper", "slow", "strict"]);
    assert_eq!(list["total"], 6);
    let r = s.get("/v1/skills?category=test");
    assert_eq!(r.json()["total"], 1);
    let r = s.get("/v1/skills/echo");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["name"], "echo");
    assert_eq!(r.json()["schema"]["properties"]["n"]["type"], "integer");

    // ok: the result is the args, the report says what was enforced.
    let r = s.execute("echo", &json!({"n": 7}));
    assert_eq!(r.status, 200, "{}", s.logs());
    let report = r.json();
    assert_eq!(report["outcome"], "ok", "{report}");
    assert_eq!(report["result"], json!({"n": 7}));
    assert_eq!(report["exit_code"], 0);
    assert!(report["stderr"].as_str().unwrap().contains("echo: starting"));
    assert!(report["sandbox"]["no_new_privs"].as_bool().unwrap());
    assert!(report["sandbox"]["degraded"].is_array());
    if nix::unistd::geteuid().is_root() {
        let (uid, _) = ongrid_tests::host::skill_user();
        assert_eq!(report["sandbox"]["uid"], uid);
    }

    // A failing skill is a finished run: 200 with the outcome.
    let r = s.execute("fail", &json!({}));
    assert_eq!(r.status, 200);
    let report = r.json();
    assert_eq!(report["outcome"], "exit_nonzero", "{report}");
    assert_eq!(report["exit_code"], 3);
    assert!(report["stderr"].as_str().unwrap().contains("boom"));

    // Timing out: killed after 1 s (+2 s grace at most).
    let t = Instant::now();
    let r = s.execute("slow", &json!({}));
    let took = t.elapsed();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["outcome"], "timeout", "{}", r.json());
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(8), "{took:?}");

    // Schema-rejected: 400 listing the violations, nothing runs.
    let r = s.execute("strict", &json!({"depth": -1, "extra": true}));
    assert_eq!(r.status, 400);
    let body = r.json();
    assert_eq!(body["error"]["code"], "invalid_args", "{body}");
    let text = body.to_string();
    assert!(text.contains("path") && text.contains("depth"), "{text}");
    let r = s.execute("strict", &json!({"path": "/tmp", "depth": 2}));
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["result"], json!({"path": "/tmp", "depth": 2}));

    // Bad JSON body.
    let r = crate::harness::http(
        &s.socket,
        "POST",
        "/v1/skills/echo/execute",
        "application/json",
        Some(b"{\"args\":"),
    );
    assert_eq!(r.status, 400);

    // Unknown skill: 404 for show and execute.
    let r = s.get("/v1/skills/nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "not_found", "{}", r.json());
    let r = s.execute("nope", &json!({}));
    assert_eq!(r.status, 404);

    // The NDJSON stream: stderr lines, then the report.
    let r = s.stream("echo", &json!({"n": 1}));
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("application/x-ndjson"));
    let events = r.events();
    assert_eq!(events[0], json!({"event": "stderr", "line": "echo: starting"}), "{events:?}");
    let last = events.last().unwrap();
    assert_eq!(last["event"], "report");
    assert_eq!(last["report"]["result"], json!({"n": 1}));

    let health = s.get("/v1/health").json();
    assert_eq!(health["executor"], "up", "{health}");
    assert_eq!(health["skills"], 6);

    // One scrape target with both daemons' metrics.
    let text = s.scrape();
    assert!(text.contains("ongrid_"), "{text}");
    assert!(text.contains("skill=\"echo\""), "{text}");
}

/// The result reaches every client as the skill printed it: the API answer,
/// the NDJSON stream and `ongrid-skill run` (its `--json` report too) keep
/// key order, number spelling and escapes: a skill's stdout is its result,
/// verbatim.
#[test]
fn the_result_is_returned_verbatim() {
    let s = Stack::start();
    let printed =
        r#"{"zeta": 1.50, "alpha": "\u00e9\/", "n": [1E3, 123456789012345678901234567890]}"#;
    crate::harness::write_skill(&s.skills, "verbatim", "", &format!("echo '{printed}'"));
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);

    let r = s.execute("verbatim", &json!({}));
    assert_eq!(r.status, 200, "{}", s.logs());
    let body = String::from_utf8_lossy(&r.body).into_owned();
    assert!(body.contains(&format!(r#""result":{printed}"#)), "{body}");

    let r = s.stream("verbatim", &json!({}));
    let last = String::from_utf8_lossy(&r.body).lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with(r#"{"event":"report""#), "{last}");
    assert!(last.contains(&format!(r#""result":{printed}"#)), "{last}");

    for stream in [false, true] {
        let mut cli = std::process::Command::new(crate::harness::bin("ongrid-skill"));
        cli.args(["run", "verbatim", "--socket"]).arg(&s.socket);
        if stream {
            cli.arg("--stream");
        }
        let out = cli.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{printed}\n"), "stream {stream}");
        // `--json`: the report (the last event, streamed) with the result as printed.
        let out = cli.arg("--json").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let last = stdout.lines().last().unwrap_or_default();
        assert!(last.contains(&format!(r#""result":{printed}"#)), "stream {stream}: {stdout}");
    }
}

/// The args reach the skill's stdin as the caller sent them, exactly: key
/// order, number spelling and escapes, through the API and `ongrid-skill
/// run`. `echo` is `cat`, so its result is its stdin. A key given twice is refused before anything runs:
/// the schema would check one value while the skill read another.
#[test]
fn the_args_reach_the_skill_exactly() {
    let s = Stack::start();
    let args = r#"{"zeta":1.50,"n":123456789012345678901234567890,"e":1E3,"s":"\u00e9\/"}"#;
    let body = format!(r#"{{"args":{args}}}"#);
    let post = |accept: &str| {
        crate::harness::http(
            &s.socket,
            "POST",
            "/v1/skills/echo/execute",
            accept,
            Some(body.as_bytes()),
        )
    };
    let r = post("application/json");
    assert_eq!(r.status, 200, "{}", s.logs());
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(text.contains(&format!(r#""result":{args}"#)), "{text}");
    let r = post("application/x-ndjson");
    let last = String::from_utf8_lossy(&r.body).lines().last().unwrap_or_default().to_owned();
    assert!(last.contains(&format!(r#""result":{args}"#)), "{last}");

    let out = std::process::Command::new(crate::harness::bin("ongrid-skill"))
        .args(["run", "echo", "--args", args, "--socket"])
        .arg(&s.socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{args}\n"));

    // The audit trail holds the same text.
    let audit = s.get("/v1/audit?skill=echo&limit=10");
    assert_eq!(audit.status, 200);
    let text = String::from_utf8_lossy(&audit.body).into_owned();
    assert!(text.contains(&format!(r#""args":{args}"#)), "{text}");

    // The schema still reads the parsed copy.
    let r = crate::harness::http(
        &s.socket,
        "POST",
        "/v1/skills/echo/execute",
        "application/json",
        Some(br#"{"args":{"n":1.5}}"#),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "invalid_args", "{}", r.json());

    // A key twice: 400, no run, in the API and the CLI.
    let before = s.scrape();
    let r = crate::harness::http(
        &s.socket,
        "POST",
        "/v1/skills/echo/execute",
        "application/json",
        Some(br#"{"args":{"n":1,"n":"x; rm -rf /"}}"#),
    );
    assert_eq!(r.status, 400);
    let e = r.json();
    assert_eq!(e["error"]["code"], "bad_request", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains(r#""n" twice"#), "{e}");
    let out = std::process::Command::new(crate::harness::bin("ongrid-skill"))
        .args(["run", "echo", "--args", r#"{"n":1,"n":2}"#, "--socket"])
        .arg(&s.socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("twice"));
    let runs = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("ongrid_executions_total{") && l.contains("skill=\"echo\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert_eq!(runs(&s.scrape()), runs(&before), "a refused body is not an execution");
}

/// An executor whose `max_timeout_seconds` is shorter than a manifest's
/// timeout: skilld advertises the timeout runs will get (the executor's,
/// from its `ping`), not the manifest's, in the listing and the skill.
#[test]
fn the_advertised_timeout_is_the_executors_clamp() {
    let s = Stack::start_with("max_timeout_seconds = 5\n", "");
    // The stack's executor may have come up after skilld's first scan.
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    let sleeper = s.get("/v1/skills/sleeper").json();
    assert_eq!(sleeper["timeout_seconds"], 5, "{sleeper}");
    let list = s.get("/v1/skills").json();
    let listed = list["items"].as_array().unwrap().iter().find(|i| i["name"] == "sleeper").cloned();
    assert_eq!(listed.map(|i| i["timeout_seconds"].clone()), Some(json!(5)));
    // A shorter one is kept.
    assert_eq!(s.get("/v1/skills/slow").json()["timeout_seconds"], 1);
}
