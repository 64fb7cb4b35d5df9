//! The client API of `ongrid-skilld`: an arbitrary method, path, query,
//! headers and body, sent through the real router (`loader::daemon::api::router`,
//! or the metrics listener's) of a real `App`: three skills scanned from a
//! temporary allow-list root, the audit trail in a temporary SQLite file,
//! caller rules and two approvers, and a fake executor on a Unix socket
//! whose behaviour (report, stderr then report, busy, error, garbage,
//! hang-up) the input picks. The caller (what `SO_PEERCRED` gives the real
//! server) is picked too.
//!
//! Checked: no panic; the status is one of the documented ones (200, 400,
//! 403, 404, 405, 408, 413, 503); every error body is JSON
//! `{"error":{"code","message"}}` whose code matches the status; a 405
//! says `Allow`; a 200 of the API is JSON (or NDJSON lines of JSON).
#![no_main]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arbitrary::{Arbitrary, Unstructured};
use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use axum::Router;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use loader::daemon::app::App;
use loader::daemon::config::{FileConfig, Overrides};
use loader::daemon::connection::Caller;
use loader::daemon::metrics::Metrics;
use policy::approval::{SecretKey, Subject};
use policy::wire::{self, Request as WireRequest};
use policy::{Outcome, RunReport};
use serde_json::{json, Value};
use tower::ServiceExt;

/// How the fake executor answers the next connection.
static EXECUTOR_MODE: AtomicU8 = AtomicU8::new(0);

#[derive(Debug, Clone, Copy, Arbitrary)]
enum ExecutorMode {
    Report,
    StderrThenReport,
    BusyReport,
    BusyError,
    RemoteError,
    Garbage,
    HangUp,
}

const MODES: [ExecutorMode; 7] = [
    ExecutorMode::Report,
    ExecutorMode::StderrThenReport,
    ExecutorMode::BusyReport,
    ExecutorMode::BusyError,
    ExecutorMode::RemoteError,
    ExecutorMode::Garbage,
    ExecutorMode::HangUp,
];

struct Harness {
    rt: tokio::runtime::Runtime,
    api: Router,
    metrics: Router,
    keys: [SecretKey; 3],
    _dir: tempfile::TempDir,
}

fn pack(root: &Path, name: &str, class: &str, schema: Value) {
    let dir = root.join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let entry = dir.join("run");
    std::fs::write(&entry, "#!/bin/sh\ncat\n").unwrap();
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = json!({
        "name": name, "description": format!("{name} skill"), "entry": "run",
        "class": class, "category": "fuzz", "schema": schema, "timeout_seconds": 5,
    });
    std::fs::write(dir.join("skill.json"), manifest.to_string()).unwrap();
}

/// Answers one connection the way `mode` says, like `ongrid-executor serve`.
fn answer(stream: std::os::unix::net::UnixStream, mode: ExecutorMode) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    let mut line = Vec::new();
    if reader.read_until(b'\n', &mut line).is_err() {
        return;
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    }
    let reply: Vec<u8> = match (wire::decode_line(&line), mode) {
        (_, ExecutorMode::HangUp) => Vec::new(),
        (_, ExecutorMode::Garbage) => b"{\"jsonrpc\":\"2.0\",\"id\":1,\"resu\xff\n".to_vec(),
        (Err((id, e)), _) => wire::encode_error(&id, &e),
        (Ok(WireRequest::Ping { id }), _) => wire::encode_result(&id, &json!({"ok": true})),
        (Ok(WireRequest::McpTools { id, .. }), _) => {
            wire::encode_result(&id, &json!({"tools": []}))
        }
        (Ok(WireRequest::McpWatch { id, params }), _) => {
            wire::encode_result(&id, &json!({"changes": params.since, "packs": []}))
        }
        // The first line is never a start (skilld holds an execute first).
        (Ok(WireRequest::Start { .. }), _) => Vec::new(),
        (Ok(WireRequest::Warm { id, .. }), _) => wire::encode_result(&id, &json!(null)),
        (Ok(WireRequest::WarmDiscard { id }), _) => {
            wire::encode_result(&id, &json!({"discarded": 0}))
        }
        (Ok(WireRequest::Metrics { id }), _) => wire::encode_result(
            &id,
            &json!({"text": "# TYPE ongrid_runs_total counter\nongrid_runs_total 1\nprocess_open_fds 3\n"}),
        ),
        (Ok(WireRequest::Execute { id, params }), mode) => {
            let skill = Path::new(&params.manifest)
                .parent()
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut ok = RunReport::not_run(&skill, Outcome::Ok, "");
            ok.error = None;
            ok.exit_code = Some(0);
            ok.result = Some(params.args.clone());
            match mode {
                ExecutorMode::Report => wire::encode_report(&id, &ok),
                ExecutorMode::StderrThenReport => {
                    let mut l = wire::encode_stderr(&id, "warming up");
                    l.extend(wire::encode_stderr(&id, "\u{1b}[31m\0odd"));
                    l.extend(wire::encode_report(&id, &ok));
                    l
                }
                ExecutorMode::BusyReport => {
                    wire::encode_report(&id, &RunReport::not_run(&skill, Outcome::Busy, "full"))
                }
                ExecutorMode::BusyError => {
                    wire::encode_error_code(&id, wire::code::BUSY, "at capacity")
                }
                _ => wire::encode_error_code(&id, wire::code::FORBIDDEN, "no"),
            }
        }
    };
    let _ = out.write_all(&reply);
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        // libFuzzer's C main does not ignore SIGPIPE as a Rust main (and so
        // the daemon) does: a peer that hangs up must not kill the process.
        // SAFETY: setting a signal disposition to SIG_IGN has no
        // preconditions; nothing else in the process handles SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
        let base = Path::new("/dev/shm");
        let dir = if base.is_dir() { tempfile::tempdir_in(base) } else { tempfile::tempdir() }
            .expect("tempdir");
        let root = dir.path().join("skills");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let schema = json!({"type": "object", "properties": {
            "message": {"type": "string", "maxLength": 64},
            "count": {"type": "integer", "minimum": 0, "maximum": 9}},
            "additionalProperties": false});
        pack(&root, "echo", "safe", schema.clone());
        pack(&root, "restart", "mutating", schema.clone());
        pack(&root, "wipe", "dangerous", json!({"type": "object"}));

        let sock = dir.path().join("executor.sock");
        let listener = UnixListener::bind(&sock).expect("bind the fake executor");
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mode = MODES[usize::from(EXECUTOR_MODE.load(Ordering::SeqCst)) % MODES.len()];
                answer(stream, mode);
            }
        });

        let keys = [
            SecretKey::from_seed([7; 32]),
            SecretKey::from_seed([8; 32]),
            SecretKey::from_seed([9; 32]),
        ];
        let toml = format!(
            r#"
executor_socket = {sock:?}
skills_dirs = [{root:?}]
metrics_listen = ""
audit_db = {db:?}
audit_max_rows = 2000
queue_timeout_seconds = 1
request_timeout_seconds = 2
[[callers]]
uid = 1000
role = "operator"
mode = "mutating-with-confirm"
[[callers]]
uid = 1001
role = "admin"
mode = "dual-sign-required"
audit = true
[[callers]]
gid = 2000
role = "viewer"
mode = "read-only"
[[approvers]]
name = "alice"
public_key = "{a}"
[[approvers]]
name = "bob"
public_key = "{b}"
"#,
            sock = sock.to_str().unwrap(),
            root = root.to_str().unwrap(),
            db = dir.path().join("audit.db").to_str().unwrap(),
            a = keys[0].public_key(),
            b = keys[1].public_key(),
        );
        let settings = FileConfig::parse(&toml, Path::new("fuzz.toml"))
            .expect("config")
            .resolve(Overrides::default(), Vec::new())
            .expect("settings");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (api, metrics) = rt.block_on(async {
            let prometheus = prometheus::Registry::new();
            let metrics = Metrics::new(&prometheus).expect("metrics");
            let app = Arc::new(App::new(&settings, metrics, prometheus).expect("app"));
            app.preload_approvals().await;
            let summary = app.reload().await;
            assert_eq!(summary.registered, 3, "the harness' skills did not register: {summary:?}");
            (
                loader::daemon::api::router(Arc::clone(&app)),
                loader::daemon::api::metrics_router(app),
            )
        });
        Harness { rt, api, metrics, keys, _dir: dir }
    })
}

/// A small JSON value.
fn json_value(u: &mut Unstructured<'_>, depth: u8) -> arbitrary::Result<Value> {
    Ok(match u.int_in_range(0u8..=7)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => json!(u.arbitrary::<i64>()?),
        3 => json!(u.arbitrary::<f64>()?),
        4 | 5 => Value::String(u.arbitrary()?),
        6 if depth > 0 => {
            let n = u.int_in_range(0..=4)?;
            Value::Array((0..n).map(|_| json_value(u, depth - 1)).collect::<Result<_, _>>()?)
        }
        _ if depth > 0 => Value::Object(args(u, depth - 1)?),
        _ => Value::Null,
    })
}

fn args(u: &mut Unstructured<'_>, depth: u8) -> arbitrary::Result<serde_json::Map<String, Value>> {
    let n = u.int_in_range(0..=4)?;
    let mut m = serde_json::Map::new();
    for _ in 0..n {
        let key = match u.int_in_range(0u8..=3)? {
            0 => "message".to_owned(),
            1 => "count".to_owned(),
            _ => u.arbitrary()?,
        };
        m.insert(key, json_value(u, depth)?);
    }
    Ok(m)
}

#[derive(Debug)]
struct Input {
    metrics_listener: bool,
    mode: ExecutorMode,
    caller: Caller,
    method: Method,
    uri: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

const SKILLS: [&str; 5] = ["echo", "restart", "wipe", "missing", ""];

fn input(u: &mut Unstructured<'_>) -> arbitrary::Result<Input> {
    let metrics_listener = u.ratio(1u8, 16)?;
    let mode: ExecutorMode = u.arbitrary()?;
    let uid = *u.choose(&[0u32, 1000, 1001, 1002, 65534, u32::MAX])?;
    let gid = *u.choose(&[0u32, 2000, 1000, 65534])?;
    let pid = match u.int_in_range(0u8..=2)? {
        0 => None,
        1 => Some(i32::try_from(std::process::id()).unwrap_or(1)),
        _ => Some(u.arbitrary()?),
    };
    let method = match u.int_in_range(0u8..=8)? {
        0..=2 => Method::POST,
        3..=5 => Method::GET,
        6 => Method::HEAD,
        7 => u.choose(&[Method::PUT, Method::DELETE, Method::OPTIONS, Method::PATCH])?.clone(),
        _ => Method::from_bytes(u.arbitrary::<&[u8]>()?).unwrap_or(Method::TRACE),
    };
    let skill = *u.choose(&SKILLS)?;
    let path = match u.int_in_range(0u8..=10)? {
        0..=3 => format!("/v1/skills/{skill}/execute"),
        4 => format!("/v1/skills/{skill}"),
        5 => "/v1/skills".to_owned(),
        6 => "/v1/tools".to_owned(),
        7 => "/v1/audit".to_owned(),
        8 => (*u.choose(&["/v1/health", "/v1/reload", "/metrics", "/v1/registry"])?).to_owned(),
        _ => u.arbitrary::<String>()?,
    };
    let query = match u.int_in_range(0u8..=3)? {
        0 | 1 => String::new(),
        2 => format!(
            "?{}={}",
            u.choose(&[
                "format", "category", "skill", "since", "limit", "outcome", "decision", "wait",
            ])?,
            u.arbitrary::<&str>()?
        ),
        _ => format!("?{}", u.arbitrary::<&str>()?),
    };
    let mut headers = Vec::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let (name, value): (String, Vec<u8>) = match u.int_in_range(0u8..=4)? {
            0 => (
                "accept".into(),
                (*u.choose(&["application/x-ndjson", "application/json", "*/*"])?).into(),
            ),
            1 => (
                "content-type".into(),
                (*u.choose(&["application/json", "text/plain", ""])?).into(),
            ),
            2 => ("content-length".into(), u.arbitrary::<u32>()?.to_string().into_bytes()),
            3 => ("transfer-encoding".into(), b"chunked".to_vec()),
            _ => (u.arbitrary()?, u.arbitrary()?),
        };
        headers.push((name, value));
    }
    let body = match u.int_in_range(0u8..=4)? {
        0 => Vec::new(),
        1 => u.arbitrary::<Vec<u8>>()?,
        2 => vec![b' '; (1 << 20) + usize::from(u.arbitrary::<u8>()?)],
        _ => {
            let a = args(u, 2)?;
            let args_v = Value::Object(a);
            let session: Option<String> = u.arbitrary()?;
            let mut body = json!({"args": args_v});
            if let Some(s) = &session {
                body["session_id"] = json!(s);
            }
            if u.arbitrary()? {
                body["confirm"] = json!(u.arbitrary::<bool>()?);
            }
            match u.int_in_range(0u8..=3)? {
                0 => {}
                1 => body["approvals"] = json_value(u, 2)?,
                _ => 'signed: {
                    // Signed approvals of this very request: valid, expired,
                    // too far ahead, by an unknown key, or the same key twice.
                    let h = harness();
                    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
                    // The body carries `args_v` as serde_json writes it
                    // (args the daemon refuses, e.g. a reserved key, get none).
                    let text = serde_json::to_vec(&args_v).unwrap();
                    let Ok(args_a) = policy::Args::from_slice(&text) else { break 'signed };
                    let subject = Subject { skill, args: &args_a, session_id: session.as_deref() };
                    let mut list = Vec::new();
                    for _ in 0..u.int_in_range(0..=3)? {
                        let key = u.choose(&h.keys)?;
                        let exp = match u.int_in_range(0u8..=3)? {
                            0 => now.saturating_sub(5),
                            1 => now + 100_000,
                            _ => now + 300,
                        };
                        list.push(json!(key.approve(&subject, exp)));
                    }
                    body["approvals"] = Value::Array(list);
                }
            }
            if u.ratio(1u8, 8)? {
                body[u.arbitrary::<String>()?] = json!(1);
            }
            body.to_string().into_bytes()
        }
    };
    Ok(Input {
        metrics_listener,
        mode,
        caller: Caller { uid, gid, pid },
        method,
        uri: format!("{path}{query}"),
        headers,
        body,
    })
}

fn code_of(status: StatusCode) -> &'static [&'static str] {
    match status.as_u16() {
        400 => &["bad_request", "invalid_args"],
        403 => &["denied", "forbidden"],
        404 => &["not_found"],
        405 => &["method_not_allowed"],
        408 => &["request_timeout"],
        413 => &["payload_too_large"],
        503 => &["executor_unavailable", "busy", "audit_unavailable"],
        s => panic!("undocumented status {s}"),
    }
}

fn check(inp: Input) {
    let h = harness();
    let Ok(uri) = Uri::try_from(inp.uri.as_str()) else { return };
    let mut req = Request::builder().method(inp.method.clone()).uri(uri);
    for (n, v) in &inp.headers {
        let (Ok(n), Ok(v)) = (HeaderName::try_from(n.as_str()), HeaderValue::from_bytes(v)) else {
            return;
        };
        req = req.header(n, v);
    }
    let Ok(mut req) = req.body(Body::from(inp.body)) else { return };
    req.extensions_mut().insert(inp.caller);
    EXECUTOR_MODE.store(inp.mode as u8, Ordering::SeqCst);
    let router = if inp.metrics_listener { h.metrics.clone() } else { h.api.clone() };
    // The one route that may wait: `GET /v1/registry?since=` is a long poll
    // (up to its `wait`, 300 s at most). Any other request must answer.
    let long_poll = req.uri().path() == "/v1/registry" && !inp.metrics_listener;

    let answered = h.rt.block_on(async {
        let Ok(resp) = tokio::time::timeout(Duration::from_secs(5), router.oneshot(req)).await
        else {
            assert!(long_poll, "no answer in 5 s to {} {}", inp.method, inp.uri);
            return None;
        };
        let resp = resp.unwrap_or_else(|e| match e {});
        let (parts, body) = resp.into_parts();
        let body = tokio::time::timeout(Duration::from_secs(5), body.collect())
            .await
            .expect("response body not finished in 5 s")
            .expect("response body failed")
            .to_bytes();
        Some((parts.status, parts.headers, body))
    });
    let Some((status, headers, body)) = answered else { return };

    if std::env::var_os("FUZZ_HTTP_TRACE").is_some() {
        // `FUZZ_HTTP_TRACE=1 cargo fuzz run http_request corpus/http_request -- -runs=0`
        // shows what the corpus reaches.
        eprintln!(
            "TRACE {} {} {:?} -> {status} {}",
            inp.method,
            inp.uri,
            inp.mode,
            String::from_utf8_lossy(&body[..body.len().min(120)])
        );
    }
    if status == StatusCode::OK {
        if inp.method == Method::HEAD || inp.metrics_listener {
            return;
        }
        let ndjson = headers.get(header::CONTENT_TYPE).is_some_and(|v| v == "application/x-ndjson");
        if ndjson {
            for l in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                serde_json::from_slice::<Value>(l).expect("an NDJSON line is not JSON");
            }
        } else {
            serde_json::from_slice::<Value>(&body).unwrap_or_else(|e| {
                panic!("200 body is not JSON ({e}): {:?}", String::from_utf8_lossy(&body))
            });
        }
        return;
    }
    if inp.metrics_listener
        && matches!(status, StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED)
    {
        // The metrics listener answers off `GET /metrics` in plain text.
        if status == StatusCode::METHOD_NOT_ALLOWED {
            assert!(headers.contains_key(header::ALLOW), "405 without Allow");
        }
        if inp.method != Method::HEAD {
            assert!(body.ends_with(b"serves GET /metrics only\n"), "{status}: {body:?}");
        }
        return;
    }
    let codes = code_of(status);
    if status == StatusCode::METHOD_NOT_ALLOWED {
        assert!(headers.contains_key(header::ALLOW), "405 without Allow");
    }
    if inp.method == Method::HEAD {
        return;
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!("{status} body is not JSON ({e}): {:?}", String::from_utf8_lossy(&body))
    });
    let code =
        v["error"]["code"].as_str().unwrap_or_else(|| panic!("{status} without error.code: {v}"));
    assert!(codes.contains(&code), "{status} with code {code:?}");
    let message = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{status} without error.message: {v}"));
    assert!(!message.is_empty(), "{status} with an empty message");
}

fuzz_target!(|data: &[u8]| {
    let _ = harness();
    if let Ok(inp) = input(&mut Unstructured::new(data)) {
        check(inp);
    }
});
