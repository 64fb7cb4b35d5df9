//! The client API's contract, `docs/openapi.json`, as an oracle: every
//! answer the harness's HTTP client gets back ([`crate::harness::http`]) is
//! looked up by method, path template and status in the document, and its
//! body validated against the documented schema ([`violations`]). An
//! undocumented status, an undocumented media type or a body that does not
//! conform fails the test that made the request.
//!
//! Two answers are the router's rather than an operation's, as the
//! document's description says: a path no template matches is a 404
//! `not_found`, a method its path does not document a 405
//! `method_not_allowed`; and a 431 `head_too_large` can answer any request.
//! The media type must be one the answer documents; bodies that are neither
//! JSON nor NDJSON are not read, nor is an empty body without a media type
//! (hyper's bare answer to a head it cannot parse). NDJSON answers are
//! checked line by line against the media type's schema (one `StreamEvent`
//! per line).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::harness::Resp;

/// The document, as the daemon under test was built with it.
pub const DOCUMENT: &str = include_str!("../../docs/openapi.json");

/// The router's own answers, not tied to one operation.
const NOT_FOUND: &str = "/components/responses/NotFound";
const HEAD_TOO_LARGE: &str = "/components/responses/HeadTooLarge";
const ERROR_BODY: &str = "/components/schemas/ErrorBody";

/// The parsed document, and one compiled validator per schema location.
struct Contract {
    doc: Value,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

fn contract() -> &'static Contract {
    static CONTRACT: OnceLock<Contract> = OnceLock::new();
    CONTRACT.get_or_init(|| Contract {
        doc: serde_json::from_str(DOCUMENT).expect("docs/openapi.json is JSON"),
        validators: Mutex::new(HashMap::new()),
    })
}

impl Contract {
    /// The validator of the schema at `pointer` (a JSON Pointer into the
    /// document): the document itself as the root schema, with a `$ref` to
    /// that location, so that every `#/components/...` reference resolves.
    fn validator(&self, pointer: &str) -> Arc<jsonschema::Validator> {
        let mut cache = self.validators.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let compiled = cache.entry(pointer.to_owned()).or_insert_with(|| {
            let mut root = self.doc.clone();
            root["$schema"] = "https://json-schema.org/draft/2020-12/schema".into();
            root["$ref"] = format!("#{}", fragment(pointer)).into();
            let v = jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .build(&root)
                .unwrap_or_else(|e| panic!("the schema at #{pointer} does not compile: {e}"));
            Arc::new(v)
        });
        Arc::clone(compiled)
    }

    /// The errors of `instance` against the schema at `pointer`.
    fn errors(&self, pointer: &str, instance: &Value) -> Vec<String> {
        self.validator(pointer)
            .iter_errors(instance)
            .map(|e| format!("{} (at {})", e, e.instance_path()))
            .collect()
    }

    /// The pointer of the response object documented for `method` on
    /// `path` (no query) with `status`, a `$ref` followed.
    fn response(&self, method: &str, path: &str, status: u16) -> Result<String, String> {
        if status == 431 {
            return Ok(HEAD_TOO_LARGE.to_owned());
        }
        let Some(template) = self.template(path) else {
            return if status == 404 {
                Ok(NOT_FOUND.to_owned())
            } else {
                Err(format!("{path} matches no path of the document, so only a 404 is expected"))
            };
        };
        // HEAD is a GET without its body (the router answers it for every
        // GET route).
        let method = if method.eq_ignore_ascii_case("HEAD") { "get" } else { method };
        let item = format!("/paths/{}", escape(template));
        let operation = format!("{item}/{}", method.to_ascii_lowercase());
        if self.doc.pointer(&operation).is_none() {
            return if status == 405 {
                Ok(String::new())
            } else {
                Err(format!("{method} is not documented on {template}, so only a 405 is expected"))
            };
        }
        let at = format!("{operation}/responses/{status}");
        let response = self
            .doc
            .pointer(&at)
            .ok_or_else(|| format!("status {status} is not documented for {method} {template}"))?;
        match response.get("$ref").and_then(Value::as_str) {
            Some(r) => Ok(r.trim_start_matches('#').to_owned()),
            None => Ok(at),
        }
    }

    /// The path template of the document that `path` matches.
    fn template(&self, path: &str) -> Option<&str> {
        let segments: Vec<&str> = path.split('/').collect();
        self.doc["paths"].as_object()?.keys().map(String::as_str).find(|t| {
            let parts: Vec<&str> = t.split('/').collect();
            parts.len() == segments.len()
                && parts.iter().zip(&segments).all(|(p, s)| {
                    (p.starts_with('{') && p.ends_with('}') && !s.is_empty()) || p == s
                })
        })
    }
}

/// `pointer` as a URI fragment: the characters a fragment may not hold
/// (the braces of a path template...) percent-encoded.
fn fragment(pointer: &str) -> String {
    let mut out = String::with_capacity(pointer.len());
    for b in pointer.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/!$&'()*+,;=:@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `text` as one JSON Pointer token.
fn escape(text: &str) -> String {
    text.replace('~', "~0").replace('/', "~1")
}

/// Everything in `resp` (the answer to `method target`) that the document
/// does not allow; empty when it conforms.
pub fn violations(method: &str, target: &str, resp: &Resp) -> Vec<String> {
    let c = contract();
    let path = target.split(['?', '#']).next().unwrap_or_default();
    let response = match c.response(method, path, resp.status) {
        Ok(r) => r,
        Err(e) => return vec![e],
    };
    let media = resp
        .header("content-type")
        .map(|t| t.split(';').next().unwrap_or_default().trim().to_ascii_lowercase());
    // A HEAD answer has no body; nor does hyper's bare answer to a head it
    // cannot parse (no media type either).
    if method.eq_ignore_ascii_case("HEAD") || (media.is_none() && resp.body.is_empty()) {
        return Vec::new();
    }
    let media = media.unwrap_or_default();
    let schema = if response.is_empty() {
        // The router's 405, for any path.
        if media != "application/json" {
            return vec![format!("a 405 is application/json, not {media:?}")];
        }
        ERROR_BODY.to_owned()
    } else {
        let at = format!("{response}/content/{}/schema", escape(&media));
        if c.doc.pointer(&at).is_none() {
            return vec![format!("{media:?} is not a documented media type of this answer")];
        }
        at
    };
    // Only JSON is read; another documented media type is taken as is.
    if !matches!(media.as_str(), "application/json" | NDJSON) {
        return Vec::new();
    }
    if media == NDJSON {
        return resp
            .body
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .enumerate()
            .flat_map(|(i, line)| match serde_json::from_slice::<Value>(line) {
                Ok(v) => {
                    c.errors(&schema, &v).into_iter().map(|e| format!("line {i}: {e}")).collect()
                }
                Err(e) => vec![format!("line {i} is not JSON: {e}")],
            })
            .collect();
    }
    match serde_json::from_slice::<Value>(&resp.body) {
        Ok(v) => {
            let mut errors = c.errors(&schema, &v);
            if resp.status == 405 && v["error"]["code"] != "method_not_allowed" {
                errors.push("a 405's code is method_not_allowed".to_owned());
            }
            errors
        }
        Err(e) => vec![format!("the body is not JSON: {e}")],
    }
}

/// The media type of a streamed run.
const NDJSON: &str = "application/x-ndjson";

/// Panics, naming the request and what is wrong, if `resp` does not
/// conform to the document.
pub fn check(method: &str, target: &str, resp: &Resp) {
    let errors = violations(method, target, resp);
    assert!(
        errors.is_empty(),
        "{method} {target}: the {} answer does not conform to docs/openapi.json:\n  {}\nbody: {}",
        resp.status,
        errors.join("\n  "),
        String::from_utf8_lossy(&resp.body.iter().take(2000).copied().collect::<Vec<u8>>()),
    );
}
