//! [`Args`]: a run's args object, kept as the text the caller sent.
//!
//! The skill's stdin receives the args exactly as the caller sent them. The
//! loader validates a parsed copy against the skill's schema, but what
//! reaches the skill is the caller's text: its key order, number spelling
//! (`12345678901234567890123`, `1.50`, `1e3`) and string escapes, never a
//! re-serialised [`Value`]. The one change is framing: a value sent across
//! several lines loses the whitespace between its tokens (see [`RawJson`]).
//!
//! Because the skill reads the text and the schema reads the parsed copy,
//! both must see the same object, so a key given twice in any object is
//! refused: a parser that keeps the first of two `"path"` keys would
//! otherwise run with a value the schema never checked. So are the key
//! serde_json reserves ([`RESERVED_KEY`]) and nesting past
//! [`MAX_ARGS_DEPTH`]; the text must also be UTF-8 with numbers in range.
//!
//! One difference is left between the two readers: a number with more
//! digits than an `f64` holds (an integer past 2^53, say) is checked by the
//! schema as its nearest `f64`, while the skill reads every digit. A
//! schema's `maximum` of `1e20` passes `100000000000000000001`.

use std::fmt;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::raw_json::RawJson;
use crate::unique_json::{self, UniqueError};

/// Why a text is not an args object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// Not one JSON value (or not UTF-8, or a number out of range).
    #[error("args are not JSON: {0}")]
    NotJson(String),
    /// JSON, but not an object.
    #[error("args must be a JSON object")]
    NotObject,
    /// A key given twice in one object.
    #[error("args give the key {0:?} twice in one object")]
    DuplicateKey(String),
    /// The key serde_json reserves ([`RESERVED_KEY`]).
    #[error("args use the key {RESERVED_KEY:?}, which serde_json reserves")]
    ReservedKey,
    /// Nested deeper than [`MAX_ARGS_DEPTH`].
    #[error("args nest arrays and objects deeper than {MAX_ARGS_DEPTH} levels")]
    TooDeep,
}

/// A validated args object: its text as sent, and the parsed copy the
/// loader checks and records.
#[derive(Clone)]
pub struct Args {
    raw: RawJson,
    value: Value,
}

impl Args {
    /// Validates `bytes` (surrounding whitespace allowed) as an args object.
    ///
    /// # Errors
    ///
    /// [`ArgsError`] when it is not one JSON object with unique keys.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, ArgsError> {
        let raw = RawJson::from_slice(bytes).map_err(|e| ArgsError::NotJson(e.to_string()))?;
        Self::from_raw(raw)
    }

    /// `{}`.
    #[must_use]
    pub fn empty() -> Self {
        let value = Value::Object(serde_json::Map::new());
        Self { raw: RawJson::from_value(&value), value }
    }

    fn from_raw(raw: RawJson) -> Result<Self, ArgsError> {
        let text = raw.get();
        if !text.starts_with('{') {
            // Valid JSON (RawJson checked it) that is not an object.
            return Err(ArgsError::NotObject);
        }
        // What the schema and the audit see.
        let value = parse_unique(text)?;
        Ok(Self { raw, value })
    }

    /// The text sent to the skill's stdin.
    #[must_use]
    pub fn raw(&self) -> &str {
        self.raw.get()
    }

    /// The text as a [`RawJson`].
    #[must_use]
    pub fn raw_json(&self) -> &RawJson {
        &self.raw
    }

    /// The text, for the executor wire.
    #[must_use]
    pub fn into_raw(self) -> RawJson {
        self.raw
    }

    /// The parsed object (key order not kept; large numbers as `f64`).
    #[must_use]
    pub fn value(&self) -> &Value {
        &self.value
    }
}

impl Default for Args {
    fn default() -> Self {
        Self::empty()
    }
}

/// Equal when the texts are equal: two spellings of one object differ.
impl PartialEq for Args {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for Args {}

/// The size only: args may hold what a caller would not want in a log.
impl fmt::Debug for Args {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Args({} bytes)", self.raw().len())
    }
}

impl Serialize for Args {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

/// Read as raw text: exact from `serde_json::from_slice`/`from_str`; from
/// a [`Value`] it is that value's serialisation.
impl<'de> Deserialize<'de> for Args {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawJson::deserialize(d)?;
        Self::from_raw(raw).map_err(de::Error::custom)
    }
}

/// Deepest nesting of arrays and objects accepted in args. The executor
/// wire wraps them in two more objects, and serde_json reads 128 levels.
pub const MAX_ARGS_DEPTH: usize = 64;

/// A list of JSON values each read as args are (unique keys, at most
/// [`MAX_ARGS_DEPTH`] levels), any value allowed, for a field of a larger
/// request read by serde: `#[serde(deserialize_with =
/// "policy::args::unique_values")]` (a dual-sign request's `approvals`:
/// serde_json's `Value` would keep the last of two `key_id`s).
///
/// # Errors
///
/// The deserializer's error, naming a key given twice.
pub fn unique_values<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Value>, D::Error> {
    crate::unique_json::values(d, MAX_ARGS_DEPTH)
}

/// The key serde_json reserves for its raw values (refused in args).
pub use crate::unique_json::RESERVED_KEY;

/// Parses `text` (valid JSON) into a [`Value`] with [`unique_json`],
/// refusing a key given twice in any object, the reserved key, and
/// nesting past [`MAX_ARGS_DEPTH`].
fn parse_unique(text: &str) -> Result<Value, ArgsError> {
    unique_json::from_str(text, MAX_ARGS_DEPTH).map_err(|e| match e {
        UniqueError::Json(e) => ArgsError::NotJson(e.to_string()),
        UniqueError::DuplicateKey { key, .. } => ArgsError::DuplicateKey(key),
        UniqueError::ReservedKey => ArgsError::ReservedKey,
        UniqueError::TooDeep => ArgsError::TooDeep,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_text_is_kept_exactly() {
        for text in [
            r#"{"z":1,"a":2}"#,
            r#"{"big":123456789012345678901234567890,"n":1.50,"e":1E3}"#,
            r#"{ "s" : "\u00e9\/x", "t":"é" }"#,
            r#"{"nested":{"b":[1,{"a":null}],"a":true}}"#,
            "{}",
        ] {
            let a = Args::from_slice(text.as_bytes()).unwrap();
            assert_eq!(a.raw(), text);
            assert_eq!(serde_json::to_string(&a).unwrap(), text);
            let via_struct: Args = serde_json::from_str(text).unwrap();
            assert_eq!(via_struct, a);
        }
        let a = Args::from_slice(br#"{"z":1,"a":{"k":[2]}}"#).unwrap();
        assert_eq!(a.value(), &json!({"a": {"k": [2]}, "z": 1}));
    }

    #[test]
    fn a_value_over_several_lines_loses_only_whitespace() {
        let a = Args::from_slice(b"{\n  \"b\": \"x y\",\n  \"a\": 2\n}\n").unwrap();
        assert_eq!(a.raw(), r#"{"b":"x y","a":2}"#);
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        for (text, key) in [
            (r#"{"path":"/ok","path":"/etc/shadow"}"#, "path"),
            (r#"{"a":{"x":1,"y":2,"x":3}}"#, "x"),
            (r#"{"a":[{"k":1},{"k":2,"k":3}]}"#, "k"),
            (r#"{"\u0061":1,"a":2}"#, "a"),
        ] {
            assert_eq!(
                Args::from_slice(text.as_bytes()).unwrap_err(),
                ArgsError::DuplicateKey(key.into()),
                "{text}"
            );
        }
        // The same key in sibling objects is fine.
        Args::from_slice(br#"{"a":{"k":1},"b":{"k":2},"k":3}"#).unwrap();
        let e = serde_json::from_str::<Args>(r#"{"a":1,"a":1}"#).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }

    #[test]
    fn what_is_not_an_object_is_refused() {
        for text in ["[]", "1", "\"{}\"", "null", " [ {} ]"] {
            assert_eq!(
                Args::from_slice(text.as_bytes()).unwrap_err(),
                ArgsError::NotObject,
                "{text}"
            );
        }
        for text in [&b"{"[..], b"{} {}", b"{\"a\":1e999}", b"{\"\xff\":1}", b""] {
            assert!(matches!(Args::from_slice(text), Err(ArgsError::NotJson(_))), "{text:?}");
        }
        let deep = format!("{}{}", "{\"a\":".repeat(200), "}".repeat(200));
        assert!(matches!(Args::from_slice(deep.as_bytes()), Err(ArgsError::NotJson(_))));
    }

    #[test]
    fn serde_json_reserved_key_and_deep_nesting_are_refused() {
        // serde_json's `Value` reads the first as `{}` and refuses the
        // second: the schema would check another object, and readers of
        // the audit trail would choke on it.
        for text in [
            r#"{"$serde_json::private::RawValue":"{\"a\":1}","b":2}"#,
            r#"{"x":[{"$serde_json::private::RawValue":0}]}"#,
        ] {
            assert_eq!(Args::from_slice(text.as_bytes()).unwrap_err(), ArgsError::ReservedKey);
        }
        let nest = |n: usize| format!("{{\"a\":{}1{}}}", "[".repeat(n - 1), "]".repeat(n - 1));
        Args::from_slice(nest(MAX_ARGS_DEPTH).as_bytes()).unwrap();
        assert_eq!(
            Args::from_slice(nest(MAX_ARGS_DEPTH + 1).as_bytes()).unwrap_err(),
            ArgsError::TooDeep
        );
        // What is accepted fits an executor line, which serde_json reads.
        let args = Args::from_slice(nest(MAX_ARGS_DEPTH).as_bytes()).unwrap();
        let line = format!(r#"{{"jsonrpc":"2.0","id":1,"params":{{"args":{}}}}}"#, args.raw());
        serde_json::from_str::<Value>(&line).unwrap();
    }

    #[test]
    fn debug_shows_the_size_not_the_values() {
        let a = Args::from_slice(br#"{"token":"hunter2"}"#).unwrap();
        assert_eq!(format!("{a:?}"), "Args(19 bytes)");
    }
}
