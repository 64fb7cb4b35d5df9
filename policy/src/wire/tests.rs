use serde_json::{json, Value};

use super::*;
use crate::report::RunReport;
use crate::RawJson;

#[test]
fn execute_round_trip() {
    let p = ExecuteParams {
        manifest: "/s/skill.json".into(),
        args: RawJson::from_slice(br#"{"z":1.50,"a":123456789012345678901234567890}"#).unwrap(),
        session_id: None,
        class: None,
        tool: None,
        manifest_sha256: None,
        hold: false,
    };
    let l = encode_execute(7, &p);
    assert!(!l.windows(4).any(|w| w == b"hold"), "hold is left out when false");
    assert!(!l.windows(6).any(|w| w == b"sha256"), "no digest: left out");
    let text = br#""args":{"z":1.50,"a":123456789012345678901234567890}"#;
    assert!(l.windows(text.len()).any(|w| w == text), "args as sent");
    assert_eq!(l.last(), Some(&b'\n'));
    match decode_line(&l[..l.len() - 1]).unwrap() {
        Request::Execute { id, params } => {
            assert_eq!(id, json!(7));
            assert_eq!(params, p);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn execute_args_are_read_as_text_and_checked_later() {
    // Not an object, a key twice: decoded as sent; the executor's plan
    // refuses them with an `invalid_args` report.
    for args in [r#"{"a":1,"a":2}"#, "[1]", r#"{"b":1E3,"a":"\u00e9"}"#] {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"execute","params":{{"manifest":"/x","args":{args}}}}}"#
        );
        match decode_line(line.as_bytes()).unwrap() {
            Request::Execute { params, .. } => assert_eq!(params.args.get(), args),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_held_execute_and_its_start_round_trip() {
    let p = ExecuteParams {
        manifest: "/s/skill.json".into(),
        args: RawJson::from_slice(b"{}").unwrap(),
        session_id: None,
        class: None,
        tool: None,
        manifest_sha256: Some(crate::ManifestDigest::of(b"{}")),
        hold: true,
    };
    let l = encode_execute(3, &p);
    match decode_line(&l[..l.len() - 1]).unwrap() {
        Request::Execute { params, .. } => assert_eq!(params, p),
        other => panic!("{other:?}"),
    }
    // A digest that is not 64 hex digits: the request is refused whole.
    let bad = br#"{"jsonrpc":"2.0","id":1,"method":"execute","params":{"manifest":"/x","args":{},"manifest_sha256":"ab"}}"#;
    assert!(decode_line(bad).is_err());
    let l = encode_start(3);
    assert_eq!(decode_line(&l[..l.len() - 1]).unwrap(), Request::Start { run: json!(3) });
    assert_eq!(
        decode_line(br#"{"jsonrpc":"2.0","method":"start","params":{"id":"r"}}"#).unwrap(),
        Request::Start { run: json!("r") }
    );
}

#[test]
fn bad_lines_get_the_right_code() {
    let with_id =
        |n: usize| format!(r#"{{"jsonrpc":"2.0","id":"{}","method":"ping"}}"#, "i".repeat(n));
    let longest = "i".repeat(MAX_ID_BYTES);
    assert_eq!(
        decode_line(with_id(MAX_ID_BYTES).as_bytes()).unwrap(),
        Request::Ping { id: json!(longest) }
    );
    let long_id = with_id(MAX_ID_BYTES + 1);
    let cases: &[(&[u8], i64, Value)] = &[
        (b"", code::PARSE_ERROR, Value::Null),
        (b"{", code::PARSE_ERROR, Value::Null),
        (b"\xff", code::PARSE_ERROR, Value::Null),
        (b"[]", code::INVALID_REQUEST, Value::Null),
        (br#"{"jsonrpc":"2.0","method":"ping"}"#, code::INVALID_REQUEST, Value::Null),
        (br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#, code::INVALID_REQUEST, Value::Null),
        (long_id.as_bytes(), code::INVALID_REQUEST, Value::Null),
        (br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#, code::INVALID_REQUEST, json!(1)),
        (br#"{"jsonrpc":"2.0","id":"a","method":5}"#, code::INVALID_REQUEST, json!("a")),
        (br#"{"jsonrpc":"2.0","id":2,"method":"rm"}"#, code::METHOD_NOT_FOUND, json!(2)),
        (br#"{"jsonrpc":"2.0","id":3,"method":"execute"}"#, code::INVALID_PARAMS, json!(3)),
        (br#"{"jsonrpc":"2.0","id":4,"method":"execute","params":{"manifest":1,"args":{}}}"#, code::INVALID_PARAMS, json!(4)),
        (br#"{"jsonrpc":"2.0","id":5,"method":"execute","params":{"manifest":"/x","args":{},"evil":1}}"#, code::INVALID_PARAMS, json!(5)),
        (br#"{"jsonrpc":"2.0","id":6,"method":"execute","params":{"manifest":"/x","args":{},"hold":"yes"}}"#, code::INVALID_PARAMS, json!(6)),
        (br#"{"jsonrpc":"2.0","id":9,"method":"execute","params":null}"#, code::INVALID_PARAMS, json!(9)),
        (br#"{"jsonrpc":"2.0","id":10,"method":"execute","params":{},"params":{}}"#, code::INVALID_REQUEST, json!(10)),
        (br#"{"jsonrpc":"2.0","method":"execute","params":{}}"#, code::INVALID_REQUEST, Value::Null),
        (br#"{"jsonrpc":"2.0","method":"start"}"#, code::INVALID_PARAMS, Value::Null),
        (br#"{"jsonrpc":"2.0","method":"start","params":{"id":null}}"#, code::INVALID_PARAMS, Value::Null),
        (br#"{"jsonrpc":"2.0","method":"start","params":{"id":[1]}}"#, code::INVALID_PARAMS, Value::Null),
        (br#"{"jsonrpc":"1.0","method":"start","params":{"id":1}}"#, code::INVALID_REQUEST, Value::Null),
    ];
    for (line, want, want_id) in cases {
        let (id, e) = decode_line(line).unwrap_err();
        assert_eq!(e.code(), *want, "{:?}: {e}", String::from_utf8_lossy(line));
        assert_eq!(&id, want_id);
        let enc = encode_error(&id, &e);
        let v: Value = serde_json::from_slice(&enc).unwrap();
        assert_eq!(v["error"]["code"], json!(want));
    }
}

#[test]
fn ping() {
    assert_eq!(
        decode_line(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).unwrap(),
        Request::Ping { id: json!(1) }
    );
}

#[test]
fn warm_requests_name_a_skill() {
    let l = encode_warm(4, "py");
    let want = Request::Warm { id: json!(4), skill: "py".into() };
    assert_eq!(decode_line(&l[..l.len() - 1]).unwrap(), want);
    for bad in [
        &br#"{"jsonrpc":"2.0","id":1,"method":"warm"}"#[..],
        br#"{"jsonrpc":"2.0","id":1,"method":"warm","params":{"skill":1}}"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"warm","params":{"skill":"a","x":1}}"#,
    ] {
        let (_, e) = decode_line(bad).unwrap_err();
        assert!(matches!(e, WireError::InvalidParams(_)), "{e}");
    }
    let r = WarmResult { size: 2, idle: 1, hits: 5, misses: 1, discarded: 0 };
    let back: WarmResult = serde_json::from_value(json!(r)).unwrap();
    assert_eq!(back, r);
}

#[test]
fn warm_discard_takes_no_params() {
    let l = encode_warm_discard(5);
    assert_eq!(decode_line(&l[..l.len() - 1]).unwrap(), Request::WarmDiscard { id: json!(5) });
    let empty = br#"{"jsonrpc":"2.0","id":6,"method":"warm_discard","params":{}}"#;
    assert_eq!(decode_line(empty).unwrap(), Request::WarmDiscard { id: json!(6) });
    for bad in [
        &br#"{"jsonrpc":"2.0","id":1,"method":"warm_discard","params":{"skill":"a"}}"#[..],
        br#"{"jsonrpc":"2.0","id":1,"method":"warm_discard","params":[]}"#,
    ] {
        let (_, e) = decode_line(bad).unwrap_err();
        assert!(matches!(e, WireError::InvalidParams(_)), "{e}");
    }
    let r = WarmDiscardResult { discarded: 3 };
    assert_eq!(serde_json::to_value(r).unwrap(), json!({"discarded": 3}));
}

#[test]
fn mcp_watch_takes_since_and_an_optional_timeout() {
    let l = br#"{"jsonrpc":"2.0","id":7,"method":"mcp_watch","params":{"since":3}}"#;
    let params = McpWatchParams { since: 3, timeout_ms: None };
    assert_eq!(decode_line(l).unwrap(), Request::McpWatch { id: json!(7), params });
    let l =
        br#"{"jsonrpc":"2.0","id":8,"method":"mcp_watch","params":{"since":0,"timeout_ms":500}}"#;
    let params = McpWatchParams { since: 0, timeout_ms: Some(500) };
    assert_eq!(decode_line(l).unwrap(), Request::McpWatch { id: json!(8), params });
    for bad in [
        &br#"{"jsonrpc":"2.0","id":1,"method":"mcp_watch"}"#[..],
        br#"{"jsonrpc":"2.0","id":1,"method":"mcp_watch","params":{"since":-1}}"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"mcp_watch","params":{"since":1,"x":2}}"#,
    ] {
        let (_, e) = decode_line(bad).unwrap_err();
        assert!(matches!(e, WireError::InvalidParams(_)), "{e}");
    }
    let r = McpWatchResult {
        changes: 4,
        packs: vec![McpPackMoved { manifest: "/s/p/skill.json".into(), generation: 9 }],
    };
    let v = json!({"changes": 4, "packs": [{"manifest": "/s/p/skill.json", "generation": 9}]});
    assert_eq!(serde_json::to_value(&r).unwrap(), v);
    assert_eq!(serde_json::from_value::<McpWatchResult>(v).unwrap(), r);
}

#[test]
fn metrics_request_and_replies_round_trip() {
    let l = encode_metrics(3);
    assert_eq!(decode_line(&l[..l.len() - 1]).unwrap(), Request::Metrics { id: json!(3) });

    let text = json!(MetricsResult { text: "a 1\n".into() });
    let l = encode_result(&json!(3), &text);
    assert_eq!(
        decode_reply(&l[..l.len() - 1]).unwrap(),
        Reply::Result { id: json!(3), result: RawJson::from_value(&json!({"text": "a 1\n"})) }
    );
    let l = encode_stderr(&json!(1), "warn: x");
    assert_eq!(
        decode_reply(&l[..l.len() - 1]).unwrap(),
        Reply::Stderr { id: json!(1), line: "warn: x".into() }
    );
    let l = encode_queued(&json!(4));
    assert_eq!(decode_reply(&l[..l.len() - 1]).unwrap(), Reply::Queued { id: json!(4) });
    let l = encode_started(&json!(4));
    assert_eq!(decode_reply(&l[..l.len() - 1]).unwrap(), Reply::Started { id: json!(4) });
    let l = encode_tools_generation(&json!(4), u64::MAX);
    assert_eq!(
        decode_reply(&l[..l.len() - 1]).unwrap(),
        Reply::ToolsGeneration { id: json!(4), generation: u64::MAX }
    );
    let l = br#"{"jsonrpc":"2.0","method":"tools_generation","params":{"id":4}}"#;
    assert!(matches!(decode_reply(l), Err(WireError::InvalidParams(_))));
    let l = encode_error_code(&json!(1), code::BUSY, "full");
    assert_eq!(
        decode_reply(&l[..l.len() - 1]).unwrap(),
        Reply::Error { id: json!(1), code: code::BUSY, message: "full".into() }
    );
    let report = RunReport::not_run("x", crate::Outcome::Busy, "full");
    let l = encode_report(&json!(1), &report);
    match decode_reply(&l[..l.len() - 1]).unwrap() {
        Reply::Result { result, .. } => {
            assert_eq!(serde_json::from_str::<RunReport>(result.get()).unwrap(), report);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_report_result_crosses_the_wire_verbatim() {
    let mut report = RunReport::not_run("x", crate::Outcome::Ok, "");
    let text = r#"{"zeta":1.50,"alpha":"\u00e9","n":[1E3]}"#;
    report.result = Some(RawJson::from_slice(text.as_bytes()).unwrap());
    let l = encode_report(&json!(7), &report);
    assert!(l.windows(text.len()).any(|w| w == text.as_bytes()));
    let Reply::Result { id, result } = decode_reply(&l[..l.len() - 1]).unwrap() else {
        panic!("not a result");
    };
    assert_eq!(id, json!(7));
    let back: RunReport = serde_json::from_str(result.get()).unwrap();
    assert_eq!(back.result.unwrap().get(), text);
    // A null result is still a result.
    assert!(matches!(
        decode_reply(br#"{"jsonrpc":"2.0","id":1,"result":null}"#),
        Ok(Reply::Result { .. })
    ));
}

#[test]
fn bad_replies_are_errors() {
    for line in [
        &b""[..],
        b"\xff",
        b"[]",
        br#"{"id":1,"result":{}}"#,
        br#"{"jsonrpc":"2.0","id":1}"#,
        br#"{"jsonrpc":"2.0","method":"exit","params":{}}"#,
        br#"{"jsonrpc":"2.0","method":"stderr","params":{"id":1,"line":5}}"#,
        br#"{"jsonrpc":"2.0","method":"stderr"}"#,
        br#"{"jsonrpc":"2.0","id":1,"result":{},"result":{}}"#,
    ] {
        assert!(decode_reply(line).is_err(), "{:?}", String::from_utf8_lossy(line));
    }
    // A member given twice in a line that is not JSON is a parse error
    // (fuzz wire_reply crash-cfb1ce55).
    for (line, parse) in [
        (&br#"{"jsonrpc":"2.0","id":1,"id":1,"result":{}}"#[..], false),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":1,\xff\"result\":{}}", true),
        // Not UTF-8 inside a member a reply does not read (crash-cd146a1e).
        (b"{\"jsonr-pc\":\"2\xcc0\",\"id\":1,\"error\":{}}", true),
    ] {
        let e = decode_reply(line).unwrap_err();
        assert_eq!(matches!(e, WireError::Parse(_)), parse, "{e:?}");
    }
}

#[test]
fn serde_json_private_raw_value_token_is_json_but_not_a_reply() {
    // serde_json's `Value` refuses an object keyed by its private
    // `RawValue` token (fuzz wire_reply, crash-8f55b833): the line is
    // JSON, so it is an invalid request, never a parse error or a panic.
    let line = b"{\"jsonrpc\":\"2.0\",\"method\":\"stderr\",\"params\":\n{\"$serde_json::private::RawValue\":0,\"line\":\"x\"}}";
    let e = decode_reply(line).unwrap_err();
    assert!(matches!(e, WireError::InvalidRequest(_)), "{e:?}");
    // In a result, the raw text is kept as it came.
    let line = br#"{"jsonrpc":"2.0","id":1,"result":{"$serde_json::private::RawValue":0}}"#;
    match decode_reply(line).unwrap() {
        Reply::Result { result, .. } => {
            assert_eq!(result.get(), r#"{"$serde_json::private::RawValue":0}"#);
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn line_buffer_splits_and_caps() {
    let mut b = LineBuffer::new(8);
    let out = b.push(b"abc\nde");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].as_ref().unwrap(), b"abc");
    assert_eq!(b.pending(), 2);
    let out = b.push(b"f\n0123456789abc");
    assert_eq!(out[0].as_ref().unwrap(), b"def");
    assert!(matches!(out[1], Err(WireError::LineTooLong(8))));
    assert_eq!(b.pending(), 0, "an oversized line must not be buffered");
    let out = b.push(b"more junk\nok\n");
    assert_eq!(out.len(), 1, "the rest of the long line is skipped silently");
    assert_eq!(out[0].as_ref().unwrap(), b"ok");
    let out = b.push(b"12345678\n123456789\n");
    assert_eq!(out[0].as_ref().unwrap(), b"12345678");
    assert!(matches!(out[1], Err(WireError::LineTooLong(8))));
}
