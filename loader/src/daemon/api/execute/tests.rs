use serde_json::json;

use super::*;

#[test]
fn only_identity_bodies_are_read() {
    let with = |codings: &[&'static str]| {
        let mut h = HeaderMap::new();
        for c in codings {
            h.append(header::CONTENT_ENCODING, HeaderValue::from_static(c));
        }
        h
    };
    for ok in [&[][..], &["identity"], &["Identity, identity"], &["identity", " "]] {
        assert!(check_encoding(&Body::from("{}"), &with(ok)).is_ok(), "{ok:?}");
    }
    for bad in [&["gzip"][..], &["identity, gzip"], &["identity", "br"], &["x-gzip"]] {
        let e = check_encoding(&Body::from("{}"), &with(bad)).unwrap_err();
        assert_eq!((e.status().as_u16(), e.code()), (415, "unsupported_encoding"), "{bad:?}");
    }
    let e = check_encoding(&Body::from("{}"), &with(&["identity, GZIP"])).unwrap_err();
    assert!(e.to_string().starts_with("Content-Encoding \"GZIP\" is not supported"), "{e}");
    // No body: nothing to decode.
    assert!(check_encoding(&Body::empty(), &with(&["gzip"])).is_ok());
    let r = e.into_response();
    assert_eq!(r.headers()[header::ACCEPT_ENCODING], "identity");
}

#[test]
fn request_bodies() {
    assert_eq!(parse_request(b"").unwrap().args.raw(), "{}");
    assert_eq!(parse_request(b" \n").unwrap().args.raw(), "{}");
    assert_eq!(parse_request(b"{}").unwrap().args.raw(), "{}");
    let r = parse_request(br#"{"args":{"a":1},"session_id":"s","confirm":true,"approvals":[{}]}"#)
        .unwrap();
    assert_eq!(r.args.value(), &json!({"a": 1}));
    assert!(r.confirm);
    for bad in [
        &b"{"[..],
        b"[]",
        b"\xff",
        br#"{"args":[]}"#,
        br#"{"args":"x"}"#,
        br#"{"args":{},"confirm":"yes"}"#,
        br#"{"args":{},"uid":0}"#,
        br#"{"args":{}} trailing"#,
        br#"[{}]"#,
        br#"{"args":{},"args":{}}"#,
        br#"{"args":{"a":1,"a":2}}"#,
        br#"{"args":{"a":{"b":1,"b":1}}}"#,
    ] {
        let Err(e) = parse_request(bad) else { panic!("{:?}", String::from_utf8_lossy(bad)) };
        assert_eq!(e.code(), "bad_request", "{:?}", String::from_utf8_lossy(bad));
    }
    let e = parse_request(br#"{"args":{"p":"/ok","p":"/etc"}}"#).unwrap_err();
    assert!(e.to_string().contains(r#"key "p" twice"#), "{e}");
    // The skill gets the text as sent: key order, number spelling.
    let r = parse_request(br#"{"args":{"z":1.50,"n":123456789012345678901234567890}}"#).unwrap();
    assert_eq!(r.args.raw(), r#"{"z":1.50,"n":123456789012345678901234567890}"#);
    let long = format!(r#"{{"session_id":"{}"}}"#, "x".repeat(MAX_SESSION_ID + 1));
    assert!(parse_request(long.as_bytes()).is_err());
}
