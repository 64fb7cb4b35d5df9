//! The executor's side of the wire: a byte stream cut by `LineBuffer` in
//! arbitrary chunks, each line decoded by `decode_line`.
//!
//! Checked: the buffer never holds more than its cap; its output equals a
//! plain model (split on `\n`, one `LineTooLong` per oversized line, however
//! the stream was chunked); each error carries the code of its kind and the
//! id the line had; what decodes re-encodes to the same request; every
//! error re-encodes to a response the loader reads back unchanged.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use policy::wire::{self, code, decode_line, LineBuffer, Reply, Request, WireError};
use serde_json::Value;

#[derive(Debug, PartialEq)]
enum Out {
    Line(Vec<u8>),
    TooLong,
}

/// What `LineBuffer` must produce for `data` pushed in any chunks, and the
/// bytes it may hold at the end.
fn model(data: &[u8], cap: usize) -> (Vec<Out>, usize) {
    let mut out = Vec::new();
    let mut parts: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let tail = parts.pop().unwrap_or_default();
    for p in parts {
        out.push(if p.len() > cap { Out::TooLong } else { Out::Line(p.to_vec()) });
    }
    if tail.len() > cap {
        out.push(Out::TooLong);
        (out, 0)
    } else {
        (out, tail.len())
    }
}

fn expected_code(e: &WireError) -> i64 {
    match e {
        WireError::Parse(_) => code::PARSE_ERROR,
        WireError::InvalidRequest(_) => code::INVALID_REQUEST,
        WireError::MethodNotFound(_) => code::METHOD_NOT_FOUND,
        WireError::InvalidParams(_) => code::INVALID_PARAMS,
        WireError::LineTooLong(_) => code::LINE_TOO_LONG,
    }
}

fn strip(mut l: Vec<u8>) -> Vec<u8> {
    assert_eq!(l.pop(), Some(b'\n'), "encoded line without its newline");
    assert!(!l.contains(&b'\n'), "encoded line with an inner newline");
    l
}

fn check_line(line: &[u8]) {
    let parsed = serde_json::from_slice::<Value>(line);
    match decode_line(line) {
        Ok(Request::Start { run }) => {
            // The one notification: no id, the run's id in params.
            let v = parsed.expect("decoded a line that is not JSON");
            assert_eq!(v["jsonrpc"], "2.0");
            assert_eq!(v["method"], "start");
            assert!(v.get("id").is_none(), "a start with an id");
            assert_eq!(v["params"]["id"], run);
            if let Some(n) = run.as_u64() {
                let l = strip(wire::encode_start(n));
                assert_eq!(decode_line(&l).expect("encode_start"), Request::Start { run });
            }
        }
        Ok(req) => {
            let v = parsed.expect("decoded a line that is not JSON");
            assert_eq!(v["jsonrpc"], "2.0");
            // Params as text: the args are kept as sent, so a `Value` copy
            // (sorted keys) would not decode to the same request.
            let (id, method, params) = match &req {
                Request::Execute { id, params } => {
                    (id, "execute", Some(serde_json::to_string(params).unwrap()))
                }
                Request::Ping { id } => (id, "ping", None),
                Request::Metrics { id } => (id, "metrics", None),
                Request::McpTools { id, params } => {
                    (id, "mcp_tools", Some(serde_json::to_string(params).unwrap()))
                }
                Request::Warm { id, skill } => {
                    (id, "warm", Some(serde_json::json!({ "skill": skill }).to_string()))
                }
                Request::WarmDiscard { id } => (id, "warm_discard", None),
                Request::McpWatch { id, params } => {
                    (id, "mcp_watch", Some(serde_json::to_string(params).unwrap()))
                }
                Request::Start { .. } => unreachable!("matched above"),
            };
            assert_eq!(&v["id"], id, "request id");
            assert_eq!(v["method"], method);
            if let Request::Execute { params: p, .. } = &req {
                // The args are JSON text on one line, read back unchanged.
                let a = policy::RawJson::from_slice(p.args.get().as_bytes()).expect("args re-read");
                assert_eq!(&a, &p.args);
            }
            // Re-encoded, it decodes to the same request.
            let params = params.map(|p| format!(r#","params":{p}"#)).unwrap_or_default();
            let enc = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}"{params}}}"#);
            let again = decode_line(enc.as_bytes()).expect("re-encoded");
            assert_eq!(again, req);
            if let (Request::Execute { params, .. }, Some(n)) = (&req, id.as_u64()) {
                let l = strip(wire::encode_execute(n, params));
                assert_eq!(decode_line(&l).expect("encode_execute"), req);
            }
        }
        Err((id, e)) => {
            assert_eq!(e.code(), expected_code(&e));
            assert!(!matches!(e, WireError::LineTooLong(_)), "decode_line never sees long lines");
            match &parsed {
                Err(_) => {
                    assert!(matches!(e, WireError::Parse(_)), "not JSON but {e:?}");
                    assert!(id.is_null());
                }
                Ok(v) => {
                    assert!(!matches!(e, WireError::Parse(_)), "JSON but a parse error");
                    match v.get("id") {
                        Some(i @ (Value::Number(_) | Value::String(_))) => assert_eq!(&id, i),
                        _ => {
                            assert!(id.is_null());
                            let start = v.get("method").and_then(Value::as_str) == Some("start");
                            assert!(
                                matches!(e, WireError::InvalidRequest(_))
                                    || (start && matches!(e, WireError::InvalidParams(_))),
                                "{e:?}"
                            );
                        }
                    }
                }
            }
            // The error response the executor would send reads back as is.
            let enc = strip(wire::encode_error(&id, &e));
            match wire::decode_reply(&enc).expect("encode_error output") {
                Reply::Error { id: rid, code: c, message } => {
                    assert_eq!(rid, id);
                    assert_eq!(c, e.code());
                    assert_eq!(message, e.to_string());
                }
                other => panic!("error response read as {other:?}"),
            }
        }
    }
}

fn run(mut u: Unstructured<'_>) -> arbitrary::Result<()> {
    let cap = usize::from(u.int_in_range(0u16..=512)?);
    let chunk_lens: Vec<u8> = Arbitrary::arbitrary(&mut u)?;
    let data = u.take_rest();

    // Each chunk is decoded like the executor does.
    check_line(data);

    let mut buf = LineBuffer::new(cap);
    let mut got = Vec::new();
    let mut rest = data;
    let mut lens = chunk_lens.iter().copied().cycle();
    while !rest.is_empty() {
        let n = match lens.next() {
            Some(n) => usize::from(n).clamp(1, rest.len()),
            None => rest.len(),
        };
        let (chunk, r) = rest.split_at(n);
        rest = r;
        for item in buf.push(chunk) {
            got.push(match item {
                Ok(line) => {
                    assert!(line.len() <= cap, "line of {} bytes over cap {cap}", line.len());
                    Out::Line(line)
                }
                Err(e) => {
                    assert!(matches!(e, WireError::LineTooLong(c) if c == cap), "{e:?}");
                    assert_eq!(e.code(), code::LINE_TOO_LONG);
                    Out::TooLong
                }
            });
        }
        assert!(buf.pending() <= cap, "buffer holds {} bytes, cap {cap}", buf.pending());
    }
    let (want, pending) = model(data, cap);
    assert_eq!(got, want, "cap {cap}, chunks {chunk_lens:?}");
    assert_eq!(buf.pending(), pending);
    for o in &got {
        if let Out::Line(l) = o {
            check_line(l);
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(Unstructured::new(data));
});
