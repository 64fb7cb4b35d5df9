//! Corpora of malformed HTTP requests (to ongrid-skilld) and malformed
//! JSON-RPC lines (straight to the executor socket) never crash or wedge
//! either daemon: every answer is an error, and afterwards a normal run
//! works and both processes are alive.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::Stack;

/// Writes `bytes` (ignoring a peer that closes early), half-closes when
/// `half_close`, then reads whatever comes back for at most `wait`.
fn exchange(socket: &Path, bytes: &[u8], half_close: bool, wait: Duration) -> Vec<u8> {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    if half_close {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
        if !half_close && out.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    out
}

fn status_of(answer: &[u8]) -> Option<u16> {
    answer
        .strip_prefix(b"HTTP/1.1 ")?
        .get(..3)
        .and_then(|s| std::str::from_utf8(s).ok())?
        .parse()
        .ok()
}

/// A complete `POST /v1/skills/echo/execute` with `body`.
fn post(body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST /v1/skills/echo/execute HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

fn still_works(s: &mut Stack, n: i64) {
    assert!(s.both_alive(), "a daemon died\n{}", s.logs());
    let r = s.execute("echo", &json!({"n": n}));
    assert_eq!(r.status, 200, "{}\n{}", String::from_utf8_lossy(&r.body), s.logs());
    assert_eq!(r.json()["result"], json!({"n": n}));
}

#[test]
fn malformed_http_never_crashes_or_wedges_skilld() {
    let mut s = Stack::start();
    let big_header = format!("GET /v1/skills HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(200_000));
    let big_body = format!(
        "POST /v1/skills/echo/execute HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{{\"args\":{{\"s\":\"{}\"}}}}",
        2_000_016,
        "a".repeat(2_000_000)
    );
    let corpus: Vec<(&str, Vec<u8>, Option<u16>)> = vec![
        ("garbage", b"\x00\x01\x02\xff\xfe\r\n\r\n".to_vec(), Some(400)),
        ("not http", b"hello world\r\n\r\n".to_vec(), Some(400)),
        ("truncated request line", b"GET /v1/sk".to_vec(), None),
        ("truncated headers", b"GET /v1/skills HTTP/1.1\r\nHost: x\r\n".to_vec(), None),
        ("invalid utf-8 path", b"GET /v1/skills/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), Some(400)),
        ("percent invalid utf-8", b"GET /v1/skills/%ff%fe HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), Some(400)),
        ("huge header", big_header.into_bytes(), Some(431)),
        ("oversized body", big_body.into_bytes(), Some(413)),
        (
            "truncated body",
            b"POST /v1/skills/echo/execute HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"args\":".to_vec(),
            None,
        ),
        (
            "invalid utf-8 body",
            b"POST /v1/skills/echo/execute HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n\xff\xfe\xfd\xfc".to_vec(),
            Some(400),
        ),
        ("args not an object", post(b"{\"args\":[1]}"), Some(400)),
        ("wrong types", post(b"{\"args\":{},\"confirm\":\"yes\",\"approvals\":7}"), Some(400)),
        ("body not an object", post(b"[]"), Some(400)),
        ("trailing garbage", post(b"{\"args\":{}} x"), Some(400)),
        (
            "deep nesting",
            post(format!("{{\"args\":{{\"n\":{}{}}}}}", "[".repeat(5000), "]".repeat(5000)).as_bytes()),
            Some(400),
        ),
        ("schema mismatch", post(b"{\"args\":{\"n\":\"x\"}}"), Some(400)),
        (
            "bad chunked body",
            b"POST /v1/skills/echo/execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".to_vec(),
            Some(400),
        ),
        ("wrong method", b"DELETE /v1/skills HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), Some(405)),
    ];
    for (name, bytes, want) in &corpus {
        // Truncated requests end with the client's EOF or the request
        // timeout (3 s); the others are answered at once.
        let answer = exchange(&s.socket, bytes, false, Duration::from_secs(6));
        let got = status_of(&answer);
        if let Some(want) = want {
            assert_eq!(
                got,
                Some(*want),
                "{name}: {:?}",
                String::from_utf8_lossy(&answer[..answer.len().min(300)])
            );
        } else {
            assert!(got.is_none_or(|c| c >= 400), "{name}: {got:?}");
        }
        assert!(s.both_alive(), "{name} killed a daemon\n{}", s.logs());
    }
    // Many idle half-requests at once do not wedge the daemon.
    let idle: Vec<UnixStream> = (0..50)
        .map(|_| {
            let mut c = UnixStream::connect(&s.socket).unwrap();
            let _ = c.write_all(b"GET /v1/sk");
            c
        })
        .collect();
    still_works(&mut s, 1);
    drop(idle);
    still_works(&mut s, 2);
}

/// Sends `bytes` straight to the executor, half-closes and collects the
/// answer lines (until the executor closes; 20 s of silence at most, for
/// the sandboxed runs some lines start on a loaded host).
fn rpc(s: &Stack, bytes: &[u8]) -> Vec<Value> {
    let raw = exchange(&s.executor_socket, bytes, true, Duration::from_secs(20));
    raw.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            serde_json::from_slice(l).unwrap_or_else(|e| {
                panic!("executor answered a non-JSON line ({e}): {:?}", String::from_utf8_lossy(l))
            })
        })
        .collect()
}

#[test]
fn malformed_jsonrpc_never_crashes_or_wedges_the_executor() {
    let mut s = Stack::start();
    let echo = s.skills.join("echo/skill.json").display().to_string();
    let execute = |params: Value| {
        format!("{}\n", json!({"jsonrpc": "2.0", "id": 1, "method": "execute", "params": params}))
            .into_bytes()
    };
    let corpus: Vec<(&str, Vec<u8>)> = vec![
        ("empty line", b"\n".to_vec()),
        ("truncated", b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"exec".to_vec()),
        ("truncated line", b"{\"jsonrpc\":\"2.0\",\"id\":1,\"meth\n".to_vec()),
        ("not json", b"hello\n".to_vec()),
        ("invalid utf-8", b"\xff\xfe\xfd\n".to_vec()),
        (
            "utf-8 in a string",
            b"{\"jsonrpc\":\"2.0\",\"id\":\"\xff\",\"method\":\"ping\"}\n".to_vec(),
        ),
        ("nul bytes", b"\x00\x00\x00\n".to_vec()),
        ("oversized", {
            let mut v = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":\"".to_vec();
            v.extend(std::iter::repeat_n(b'a', 200_000));
            v.extend_from_slice(b"\"}\n");
            v
        }),
        ("oversized without newline", vec![b'x'; 300_000]),
        ("array", b"[]\n".to_vec()),
        ("batch", b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]\n".to_vec()),
        ("null", b"null\n".to_vec()),
        ("string", b"\"execute\"\n".to_vec()),
        ("no version", b"{\"id\":1,\"method\":\"ping\"}\n".to_vec()),
        ("wrong version", b"{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}\n".to_vec()),
        ("method a number", b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":5}\n".to_vec()),
        ("unknown method", b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"rm -rf\"}\n".to_vec()),
        ("id an object", b"{\"jsonrpc\":\"2.0\",\"id\":{\"a\":1},\"method\":\"ping\"}\n".to_vec()),
        ("no params", b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"execute\"}\n".to_vec()),
        (
            "params a string",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"execute\",\"params\":\"x\"}\n".to_vec(),
        ),
        ("manifest a number", execute(json!({"manifest": 5, "args": {}}))),
        ("args an array", execute(json!({"manifest": echo, "args": [1]}))),
        ("unknown param", execute(json!({"manifest": echo, "args": {}, "evil": true}))),
        ("class unknown", execute(json!({"manifest": echo, "args": {}, "class": "root"}))),
        ("relative manifest", execute(json!({"manifest": "skills/echo/skill.json", "args": {}}))),
        ("manifest outside roots", execute(json!({"manifest": "/etc/passwd", "args": {}}))),
        (
            "manifest traversal",
            execute(json!({"manifest": format!("{echo}/../../../../../etc/passwd"), "args": {}})),
        ),
        (
            "manifest missing",
            execute(json!({"manifest": s.skills.join("nope/skill.json"), "args": {}})),
        ),
        ("deep nesting", format!("{}{}\n", "[".repeat(10_000), "]".repeat(10_000)).into_bytes()),
        ("crlf", b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r\n".to_vec()),
        (
            "many lines",
            b"x\ny\n{}\n[]\n\n\n{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"ping\"}\n".to_vec(),
        ),
    ];
    for (name, bytes) in &corpus {
        let answers = rpc(&s, bytes);
        // A whole line with something on it is answered (an empty line,
        // or bytes that never end a line, may be not).
        if bytes.ends_with(b"\n") && bytes.len() > 1 {
            assert!(!answers.is_empty(), "{name}: no answer\n{}", s.logs());
        }
        for a in &answers {
            assert_eq!(a["jsonrpc"], "2.0", "{name}: {a}");
            // Never a successful run: an error, a ping's answer, or a
            // report that did not run anything.
            if let Some(report) = a["result"].get("outcome") {
                assert_ne!(report, "ok", "{name}: {a}");
            }
        }
        assert!(s.both_alive(), "{name} killed a daemon\n{}", s.logs());
    }

    // A valid ping still answers on a fresh connection, and a whole run
    // goes through both daemons.
    let answers = rpc(&s, b"{\"jsonrpc\":\"2.0\",\"id\":42,\"method\":\"ping\"}\n");
    assert_eq!(answers.last().map(|a| a["id"].clone()), Some(json!(42)), "{answers:?}");
    assert!(answers.last().unwrap().get("result").is_some(), "{answers:?}");
    let answers = rpc(&s, &execute(json!({"manifest": echo, "args": {"n": 3}})));
    let report = &answers.last().unwrap()["result"];
    assert_eq!(report["outcome"], "ok", "{answers:?}");
    assert_eq!(report["result"], json!({"n": 3}));
    still_works(&mut s, 4);
}

/// A 405 names the methods of the route it came to (RFC 9110 §15.5.6):
/// the execute and reload routes take POST only, the others GET (and
/// HEAD); the body is the API's JSON error.
#[test]
fn a_wrong_method_is_told_the_routes_own_methods() {
    let s = Stack::start();
    for (method, path, allow) in [
        ("GET", "/v1/skills/echo/execute", "POST"),
        ("GET", "/v1/reload", "POST"),
        ("POST", "/v1/health", "GET,HEAD"),
        ("DELETE", "/v1/skills", "GET,HEAD"),
        ("PUT", "/v1/skills/echo", "GET,HEAD"),
    ] {
        let r = crate::harness::http(&s.socket, method, path, "application/json", None);
        assert_eq!(r.status, 405, "{method} {path}");
        assert_eq!(r.header("allow"), Some(allow), "{method} {path}");
        assert_eq!(r.json()["error"]["code"], "method_not_allowed", "{method} {path}");
    }
}
