//! The loader's side of the wire: `decode_reply` on any line. What decodes
//! re-encodes (with the executor's encoders) to the same reply.
//!
//! The oracle for "is this JSON" is serde_json's `Value`, with one catch: it
//! refuses some valid JSON as data, not syntax (an object whose first key is
//! serde_json's private `RawValue` token). Such a line is JSON, so
//! `decode_reply` may take it or call it an invalid request, never a parse
//! error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use policy::wire::{self, code, decode_reply, Reply, WireError};
use serde_json::error::Category;
use serde_json::Value;

fn strip(mut l: Vec<u8>) -> Vec<u8> {
    assert_eq!(l.pop(), Some(b'\n'));
    assert!(!l.contains(&b'\n'));
    l
}

fuzz_target!(|data: &[u8]| {
    let parsed = serde_json::from_slice::<Value>(data);
    let is_json = match &parsed {
        Ok(_) => true,
        Err(e) => e.classify() == Category::Data,
    };
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
