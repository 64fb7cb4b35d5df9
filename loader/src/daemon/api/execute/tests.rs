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
        assert!(check_encoding(true, &with(ok)).is_ok(), "{ok:?}");
    }
    for bad in [&["gzip"][..], &["identity, gzip"], &["identity", "br"], &["x-gzip"]] {
        let e = check_encoding(true, &with(bad)).unwrap_err();
        assert_eq!((e.status().as_u16(), e.code()), (415, "unsupported_encoding"), "{bad:?}");
    }
    let e = check_encoding(true, &with(&["identity, GZIP"])).unwrap_err();
    assert!(e.to_string().starts_with("Content-Encoding \"GZIP\" is not supported"), "{e}");
    // No body: nothing to decode.
    assert!(check_encoding(false, &with(&["gzip"])).is_ok());
    let r = e.into_response();
    assert_eq!(r.headers()[header::ACCEPT_ENCODING], "identity");
}

#[tokio::test]
async fn a_coded_body_is_refused_unless_it_turns_out_empty() {
    let limits = Limits {
        max_body_bytes: 1024,
        body_timeout: std::time::Duration::from_secs(5),
        queue_timeout: std::time::Duration::from_secs(5),
        drain_timeout: std::time::Duration::from_secs(5),
    };
    let mut gzip = HeaderMap::new();
    gzip.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    // Chunked: its length is known only once it is read.
    let chunked = |parts: Vec<&'static [u8]>| {
        let chunks = parts.into_iter().map(|p| Ok::<_, Infallible>(Bytes::from_static(p)));
        Body::from_stream(futures_util::stream::iter(chunks))
    };
    let empty = read_body(chunked(vec![]), &gzip, &limits).await.unwrap();
    assert!(empty.is_empty());
    let e = read_body(chunked(vec![b"\x1f\x8b"]), &gzip, &limits).await.unwrap_err();
    assert_eq!(e.code(), "unsupported_encoding");
    // A length that says it has bytes: refused before a byte is read.
    let mut sized = gzip.clone();
    sized.insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
    let never = Body::from_stream(futures_util::stream::pending::<Result<Bytes, Infallible>>());
    let e = read_body(never, &sized, &limits).await.unwrap_err();
    assert_eq!(e.code(), "unsupported_encoding");
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
        br#"{"approvals":[{"key_id":"a","key_id":"b"}]}"#,
        br#"{"approvals":[{"x":{"s":1,"s":2}}]}"#,
        br#"{"approvals":{}}"#,
    ] {
        let Err(e) = parse_request(bad) else { panic!("{:?}", String::from_utf8_lossy(bad)) };
        assert_eq!(e.code(), "bad_request", "{:?}", String::from_utf8_lossy(bad));
    }
    let e = parse_request(br#"{"args":{"p":"/ok","p":"/etc"}}"#).unwrap_err();
    assert!(e.to_string().contains(r#"key "p" twice"#), "{e}");
    let e = parse_request(br#"{"approvals":[{"key_id":"a","key_id":"b"}]}"#).unwrap_err();
    assert!(e.to_string().contains(r#"duplicate key "key_id""#), "{e}");
    // Any value still parses: what is not an approval is refused later,
    // as a denial naming it.
    let r = parse_request(br#"{"approvals":[1,"x",{"key_id":"a"}]}"#).unwrap();
    assert_eq!(r.approvals, [json!(1), json!("x"), json!({"key_id": "a"})]);
    // The skill gets the text as sent: key order, number spelling.
    let r = parse_request(br#"{"args":{"z":1.50,"n":123456789012345678901234567890}}"#).unwrap();
    assert_eq!(r.args.raw(), r#"{"z":1.50,"n":123456789012345678901234567890}"#);
    let long = format!(r#"{{"session_id":"{}"}}"#, "x".repeat(MAX_SESSION_ID + 1));
    assert!(parse_request(long.as_bytes()).is_err());
}
