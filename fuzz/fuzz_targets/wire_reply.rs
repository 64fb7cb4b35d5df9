//! The loader's side of the wire: `decode_reply` on any line. What decodes
//! re-encodes (with the executor's encoders) to the same reply.
//!
//! The oracle for "is this JSON" is serde_json's parser driven by a visitor
//! that keeps nothing ([`Plain`]), not a `Value`: `Value`'s visitor treats an
//! object whose first key is serde_json's private `RawValue` token as a raw
//! value, refusing valid JSON (as a data error) and, when that member is
//! followed by a syntax error, reporting the data error first. Such a line
//! is JSON or not by the parser alone; `decode_reply` may then take it or
//! call it an invalid request, never a parse error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use policy::wire::{self, code, decode_reply, Reply, WireError};
use serde_json::Value;

/// Any JSON value, as the parser reads it (UTF-8, number range, depth),
/// with no special keys.
struct Plain;

impl<'de> serde::Deserialize<'de> for Plain {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PlainVisitor)
    }
}

struct PlainVisitor;

impl<'de> serde::de::Visitor<'de> for PlainVisitor {
    type Value = Plain;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Plain, E> {
        Ok(Plain)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Plain, E> {
        Ok(Plain)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Plain, E> {
        Ok(Plain)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Plain, E> {
        Ok(Plain)
    }
    fn visit_str<E>(self, _: &str) -> Result<Plain, E> {
        Ok(Plain)
    }
    fn visit_unit<E>(self) -> Result<Plain, E> {
        Ok(Plain)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Plain, A::Error> {
        while a.next_element::<Plain>()?.is_some() {}
        Ok(Plain)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Plain, A::Error> {
        while a.next_entry::<String, Plain>()?.is_some() {}
        Ok(Plain)
    }
}

fn strip(mut l: Vec<u8>) -> Vec<u8> {
    assert_eq!(l.pop(), Some(b'\n'));
    assert!(!l.contains(&b'\n'));
    l
}

fuzz_target!(|data: &[u8]| {
    let parsed = serde_json::from_slice::<Value>(data);
    let is_json = serde_json::from_slice::<Plain>(data).is_ok();
    match decode_reply(data) {
        Ok(reply) => {
            assert!(is_json, "decoded a reply that is not JSON");
            if let Ok(v) = &parsed {
                assert_eq!(v["jsonrpc"], "2.0");
            }
            let enc = match &reply {
                Reply::Stderr { id, line } => wire::encode_stderr(id, line),
                Reply::Queued { id } => wire::encode_queued(id),
                Reply::Started { id } => wire::encode_started(id),
                Reply::ToolsGeneration { id, generation } => {
                    wire::encode_tools_generation(id, *generation)
                }
                Reply::Result { id, result } => wire::encode_result(id, result),
                Reply::Error { id, code, message } => wire::encode_error_code(id, *code, message),
            };
            assert_eq!(decode_reply(&strip(enc)).expect("re-encoded reply"), reply);
            if let Reply::Result { result, .. } = &reply {
                // The loader reads a report out of it: no panic either way.
                let _ = serde_json::from_str::<policy::RunReport>(result.get());
            }
        }
        Err(e) => {
            let c = e.code();
            match (&e, is_json) {
                (WireError::Parse(_), false) => assert_eq!(c, code::PARSE_ERROR),
                (WireError::Parse(_), true) => panic!("JSON but a parse error"),
                (_, false) => panic!("not JSON but {e:?}"),
                (WireError::InvalidRequest(_), _) => assert_eq!(c, code::INVALID_REQUEST),
                (WireError::MethodNotFound(m), _) => {
                    assert_eq!(c, code::METHOD_NOT_FOUND);
                    assert!(m.chars().count() <= 64);
                }
                (WireError::InvalidParams(_), _) => assert_eq!(c, code::INVALID_PARAMS),
                (WireError::LineTooLong(_), _) => panic!("decode_reply never sees long lines"),
            }
            assert!(!e.to_string().is_empty());
        }
    }
});
