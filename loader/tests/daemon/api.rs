//! Reading the registry: list, show, tools, unknown names and routes.

use serde_json::json;

use crate::setup;

/// `GET /v1/skills` lists every skill with the documented fields, sorted
/// by name; `?category=` filters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_category() {
    let (_env, _ex, d) = setup();
    let c = d.client();
    let r = c.get("/v1/skills").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["total"], 5);
    let names: Vec<&str> =
        r.body["items"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["echo", "fail", "sleeper", "slow", "strict"]);
    let strict = &r.body["items"][4];
    for key in
        ["name", "description", "class", "category", "schema", "timeout_seconds", "env_allow"]
    {
        assert!(strict.get(key).is_some(), "{key} missing: {strict}");
    }
    assert_eq!(strict["source"], "skill.json");
    assert_eq!(strict["class"], "mutating");

    let r = c.get("/v1/skills?category=test").await.unwrap();
    assert_eq!(r.body["total"], 1);
    assert_eq!(r.body["items"][0]["name"], "echo");
    let r = c.get("/v1/skills?category=none").await.unwrap();
    assert_eq!(r.body, json!({"items": [], "total": 0}));

    let r = c.get("/v1/skills/slow").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["timeout_seconds"], 1);
}

/// Unknown skills are 404 with an error object, for show and execute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_skill_is_404() {
    let (_env, ex, d) = setup();
    let c = d.client();
    let r = c.get("/v1/skills/nope").await.unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.body["error"]["code"], "not_found");
    let r = c.post("/v1/skills/nope/execute", &json!({"args": {}})).await.unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.body["error"]["code"], "not_found");
    let r = c.get("/v2/anything").await.unwrap();
    assert_eq!(r.status, 404);
    let r = c.post("/v1/skills", &json!({})).await.unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(r.body["error"]["code"], "method_not_allowed");
    assert_eq!(ex.stats.runs_started.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// `GET /v1/tools` in both formats; an unknown format is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_in_openai_and_mcp_formats() {
    let (_env, _ex, d) = setup();
    let c = d.client();
    let r = c.get("/v1/tools").await.unwrap();
    assert_eq!(r.status, 200);
    let t = &r.body["tools"][0];
    assert_eq!(t["type"], "function");
    assert_eq!(t["function"]["name"], "echo");
    assert_eq!(t["function"]["parameters"]["properties"]["n"]["type"], "integer");
    assert_eq!(r.body["tools"].as_array().unwrap().len(), 5);

    let r = c.get("/v1/tools?format=mcp").await.unwrap();
    let t = &r.body["tools"][0];
    assert_eq!(t["name"], "echo");
    assert_eq!(t["description"], "echo test skill");
    assert_eq!(t["inputSchema"]["type"], "object");

    let r = c.get("/v1/tools?format=yaml").await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"]["code"], "bad_request");
}

/// `GET /v1/health` reports the executor's and the audit's state; either
/// one missing is `degraded`, still a 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health() {
    let (_env, ex, d) = setup();
    let r = d.client().get("/v1/health").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"], "ok");
    assert_eq!(r.body["executor"], "up");
    assert_eq!(r.body["audit"], "ok");
    assert!(r.body.get("audit_error").is_none(), "{}", r.body);
    assert_eq!(r.body["skills"], 5);
    ex.stop().await;
    let r = d.client().get("/v1/health").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["executor"], "down");
    assert_eq!(r.body["status"], "degraded");
}

/// A request body with a `Content-Encoding` other than `identity` is
/// refused with 415, not read as plain text; `identity` runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_body_is_a_415() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_env, ex, d) = setup();
    let ask = |encoding: &'static str| {
        let socket = d.socket.clone();
        async move {
            let body = r#"{"args":{"n":1}}"#;
            let req = format!(
                "POST /v1/skills/echo/execute HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                 Content-Encoding: {encoding}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let mut s = tokio::net::UnixStream::connect(&socket).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            let (head, body) = out.split_once("\r\n\r\n").unwrap();
            (head.to_ascii_lowercase(), serde_json::from_str::<serde_json::Value>(body).unwrap())
        }
    };
    for encoding in ["gzip", "identity, deflate", "BR"] {
        let (head, body) = ask(encoding).await;
        assert!(head.starts_with("http/1.1 415 "), "{encoding}: {head}");
        assert!(head.contains("\r\naccept-encoding: identity"), "{head}");
        assert_eq!(body["error"]["code"], "unsupported_encoding", "{body}");
    }
    let (head, body) = ask("Identity").await;
    assert!(head.starts_with("http/1.1 200 "), "{head}");
    assert_eq!(body["result"]["n"], 1, "{body}");
    assert_eq!(ex.stats.runs_started.load(std::sync::atomic::Ordering::SeqCst), 1);
    let text = d.scrape();
    assert!(
        text.contains(
            "ongrid_http_requests_total{code=\"415\",route=\"/v1/skills/{name}/execute\"} 3\n"
        ),
        "{text}"
    );
}

/// A 404 echoes at most 128 characters of the name asked for, however
/// long it is (show and execute alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_echoes_a_bounded_name() {
    let (_env, _ex, d) = setup();
    let c = d.client();
    let name = "n".repeat(60_000);
    let shown = format!("no skill named \"{}\"… (60000 bytes)", "n".repeat(128));
    let r = c.get(&format!("/v1/skills/{name}")).await.unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.body["error"]["message"], shown.as_str());
    let r = c.post(&format!("/v1/skills/{name}/execute"), &json!({})).await.unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.body["error"]["message"], shown.as_str());
    assert!(r.body.to_string().len() < 400, "{}", r.body);
}
