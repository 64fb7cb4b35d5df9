//! The client API's OpenAPI 3.1 document, `docs/openapi.json`: valid for a
//! real validator (PyPI `openapi-spec-validator`), served as is at
//! `GET /v1/openapi.json`, an oracle that catches a wrong answer
//! ([`crate::contract`]), and fuzzed against the live daemon by
//! Schemathesis (PyPI `schemathesis`) through a loopback TCP relay to the
//! Unix socket, with all its default checks.
//!
//! The fuzz here is bounded for CI (`FUZZ_EXAMPLES` cases per operation
//! and phase). The long run takes more, set by `ONGRID_FUZZ_EXAMPLES`:
//!
//! ```text
//! ONGRID_FUZZ_EXAMPLES=1000 cargo test -p ongrid-tests --test e2e -- \
//!     openapi::schemathesis --nocapture
//! ```
//!
//! Both Python packages are pinned in `.ci/run`; a test whose package is
//! missing prints a `SKIP:` line naming it and passes.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use crate::contract::{violations, DOCUMENT};
use crate::harness::{http, write_skill, Resp, Stack};

/// Cases per operation and phase of the bounded fuzz.
const FUZZ_EXAMPLES: u32 = 20;

/// `docs/openapi.json` in the source tree.
fn document_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json")
}

/// Returns true if and only if `python3` can import `module`; prints the
/// `SKIP:` line of `test` when it cannot.
fn python_has(module: &str, test: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIP: {test}: python3 cannot import {module} (pip install it, as .ci/run does)");
    }
    ok
}

#[test]
fn the_document_is_valid_openapi_3_1() {
    if !python_has("openapi_spec_validator", "the_document_is_valid_openapi_3_1") {
        return;
    }
    let out = Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(document_path())
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "openapi-spec-validator: {text}");
    assert!(text.contains("OK"), "{text}");
    let doc: Value = serde_json::from_str(DOCUMENT).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
}

#[test]
fn the_daemon_serves_the_document_as_it_is() {
    let s = Stack::start();
    let r = s.get("/v1/openapi.json");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(
        r.body == DOCUMENT.as_bytes(),
        "GET /v1/openapi.json is not docs/openapi.json as it is ({} bytes, the file {})",
        r.body.len(),
        DOCUMENT.len()
    );
    // Read as any other route: HEAD too, and a 405 naming the methods.
    let r = http(&s.socket, "POST", "/v1/openapi.json", "application/json", Some(b"{}"));
    assert_eq!((r.status, r.header("allow")), (405, Some("GET,HEAD")));
}

/// The oracle is not a no-op: answers that break the document are named.
#[test]
fn the_contract_catches_a_wrong_answer() {
    let answer = |status: u16, media: &str, body: Value| Resp {
        status,
        headers: vec![("content-type".into(), media.into())],
        body: body.to_string().into_bytes(),
    };
    let health =
        json!({"status": "ok", "version": "1", "skills": 6, "executor": "up", "audit": "ok"});
    assert_eq!(
        violations("GET", "/v1/health", &answer(200, "application/json", health.clone())),
        Vec::<String>::new()
    );
    let mut wrong = health.clone();
    wrong["skills"] = json!("6");
    assert!(!violations("GET", "/v1/health", &answer(200, "application/json", wrong)).is_empty());
    let mut extra = health;
    extra["uptime"] = json!(1);
    assert!(!violations("GET", "/v1/health", &answer(200, "application/json", extra)).is_empty());
    // An undocumented status, media type or code.
    let err = json!({"error": {"code": "not_found", "message": "no"}});
    assert!(
        !violations("GET", "/v1/health", &answer(404, "application/json", err.clone())).is_empty()
    );
    assert!(violations("GET", "/v1/skills/x?y=1", &answer(404, "application/json", err.clone()))
        .is_empty());
    assert!(violations("GET", "/nowhere", &answer(404, "application/json", err.clone())).is_empty());
    assert!(!violations("GET", "/v1/skills/x", &answer(404, "text/html", err.clone())).is_empty());
    let denied = json!({"error": {"code": "denied", "message": "no"}});
    let path = "/v1/skills/x/execute";
    assert!(!violations("POST", path, &answer(403, "application/json", denied)).is_empty());
    assert!(!violations(
        "POST",
        path,
        &answer(404, "application/json", json!({"error": {"code": "busy", "message": "x"}}))
    )
    .is_empty());
    // A stream line that is no event.
    let line = answer(200, "application/x-ndjson", json!({"event": "stdout", "line": "x"}));
    assert!(!violations("POST", path, &line).is_empty());
    // The router's 405 on a documented path, and nothing else there.
    let e405 = json!({"error": {"code": "method_not_allowed", "message": "method not allowed"}});
    assert!(violations("DELETE", "/v1/skills", &answer(405, "application/json", e405.clone()))
        .is_empty());
    assert!(!violations("DELETE", "/v1/skills", &answer(200, "application/json", e405)).is_empty());
}

/// What the fuzz found, each case kept (every answer here is also checked
/// against the document by the harness).
#[test]
fn the_fuzzers_findings_stay_fixed() {
    let s = Stack::start();
    // `since=0`: humantime's zero without a unit is a duration; the
    // document's pattern refused it while the daemon answered 200.
    let r = s.get("/v1/audit?since=0");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(s.get("/v1/audit?since=00").status, 400);
    // A `session_id` within the document's `maxLength` (256 characters) of
    // two-byte characters: refused 400 while the daemon counted bytes.
    let run = |session: &str| {
        let body = json!({"args": {"n": 1}, "session_id": session}).to_string();
        let path = "/v1/skills/echo/execute";
        http(&s.socket, "POST", path, "application/json", Some(body.as_bytes()))
    };
    let r = run(&"é".repeat(256));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = run(&"é".repeat(257));
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (400, json!("bad_request")));
    // A skill's own schema is not the document's: a request the document
    // calls valid gets the documented 400 `invalid_args` from `strict`.
    let r = s.execute("strict", &json!({}));
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (400, json!("invalid_args")));
}

/// A loopback TCP listener whose connections are copied both ways to a
/// Unix socket: what an HTTP client without Unix socket support (the
/// fuzzer) talks to.
struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on 127.0.0.1 (a free port) for `socket`.
    fn start(socket: &Path) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, socket) = (Arc::clone(&stop), socket.to_owned());
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((tcp, _)) => {
                        let socket = socket.clone();
                        std::thread::spawn(move || relay(tcp, &socket));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => panic!("relay accept: {e}"),
                }
            }
        });
        Relay { addr, stop, thread: Some(thread) }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Copies `tcp` to a new connection to `socket` and back until either side
/// ends, passing each end of file on as a shutdown of the write side.
fn relay(tcp: TcpStream, socket: &Path) {
    let Ok(unix) = UnixStream::connect(socket) else { return };
    let _ = tcp.set_nonblocking(false);
    let (Ok(mut tcp_in), Ok(mut unix_out)) = (tcp.try_clone(), unix.try_clone()) else { return };
    let up = std::thread::spawn(move || {
        let _ = copy(&mut tcp_in, &mut unix_out);
        let _ = unix_out.shutdown(Shutdown::Write);
    });
    let (mut unix_in, mut tcp_out) = (unix, tcp);
    let _ = copy(&mut unix_in, &mut tcp_out);
    let _ = tcp_out.shutdown(Shutdown::Write);
    let _ = up.join();
}

fn copy(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<u64> {
    std::io::copy(from, to)
}

/// Schemathesis, with its default checks (every one it has: no 5xx, status
/// codes and media types documented, bodies and headers conforming, valid
/// data accepted and invalid data refused, 405 with `Allow` for other
/// methods...), against the live daemon through [`Relay`].
///
/// The skills fuzzed (`echo`, `fail`) take any args object: a skill's own
/// args schema is not in the document (the 400 `invalid_args` it causes
/// is documented), and with it open every request the document calls valid
/// must run. Schemathesis finds their names itself, from the listing.
#[test]
fn schemathesis_finds_nothing() {
    if !python_has("schemathesis", "schemathesis_finds_nothing") {
        return;
    }
    let examples = std::env::var("ONGRID_FUZZ_EXAMPLES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(FUZZ_EXAMPLES);
    let s = Stack::start();
    write_skill(&s.skills, "echo", r#","category":"test""#, "exec /bin/cat");
    // Only skills whose schema takes any object (`fail`'s default one):
    // the others' required or typed args make a request the document
    // calls valid a 400 `invalid_args`, and the slow ones hold runs.
    for other in ["slow", "sleeper", "finisher", "strict"] {
        std::fs::remove_dir_all(s.skills.join(other)).unwrap();
    }
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    let relay = Relay::start(&s.socket);
    let work = s.base.join("schemathesis");
    std::fs::create_dir_all(&work).unwrap();
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())",
        ])
        .arg("run")
        .arg(document_path())
        .arg("--url")
        .arg(format!("http://{}", relay.addr))
        .args(["--max-examples", &examples.to_string()])
        .args(["--workers", "1", "--request-timeout", "30", "--no-color"])
        .args(["--generation-database", "none"])
        // Hypothesis' own timing of its data generation, not a check of the
        // API: on a loaded CI host it fails runs that found nothing.
        .args(["--suppress-health-check", "too_slow"])
        .current_dir(&work)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    drop(relay);
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "schemathesis failed:\n{text}\n{}", s.logs());
}
