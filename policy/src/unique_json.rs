//! JSON read into a [`Value`] with every object's keys unique: the one
//! reader of the texts whose keys must not repeat, a run's args
//! ([`crate::args`]) and a `skill.json` ([`crate::manifest`]).
//!
//! serde_json's own `Value` keeps the last of two equal keys, so
//! `{"class":"dangerous","class":"safe"}` would read as `safe` while
//! another reader (an editor, a reviewer, a JSON tool keeping the first)
//! sees `dangerous`. A key given twice in any object, at any depth, is
//! refused instead, naming the key and its line. So is the key serde_json
//! reserves ([`RESERVED_KEY`]), which `Value` reads specially, and nesting
//! past the caller's limit (serde_json stops at 128 levels anyway).

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// The key serde_json reserves for its raw values: `Value` reads an object
/// with it as first key as the value inside, or refuses it, so neither the
/// schema's copy nor any serde_json reader of the audit trail could be
/// trusted with it.
pub const RESERVED_KEY: &str = "$serde_json::private::RawValue";

/// Why a text was not read.
#[derive(Debug)]
pub(crate) enum UniqueError {
    /// Not JSON: serde_json's error, with its line and column.
    Json(serde_json::Error),
    /// A key given twice in one object; `line` is the second's.
    DuplicateKey {
        /// The key, unescaped.
        key: String,
        /// Its line, from 1.
        line: usize,
    },
    /// The key serde_json reserves ([`RESERVED_KEY`]).
    ReservedKey,
    /// Arrays and objects nested deeper than the caller's limit.
    TooDeep,
}

/// What the visitor refused; the line is taken from serde_json's error.
#[derive(Debug)]
enum Refusal {
    DuplicateKey(String),
    ReservedKey,
    TooDeep,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::DuplicateKey(key) => write!(f, "duplicate key {key:?}"),
            Refusal::ReservedKey => write!(f, "reserved key {RESERVED_KEY:?}"),
            Refusal::TooDeep => f.write_str("nested too deep"),
        }
    }
}

/// Reads `text`: one JSON value, unique keys, at most `max_depth` levels
/// of arrays and objects.
pub(crate) fn from_str(text: &str, max_depth: usize) -> Result<Value, UniqueError> {
    read(serde_json::Deserializer::from_str(text), max_depth)
}

/// As [`from_str`], from bytes that must be UTF-8.
pub(crate) fn from_slice(bytes: &[u8], max_depth: usize) -> Result<Value, UniqueError> {
    read(serde_json::Deserializer::from_slice(bytes), max_depth)
}

/// A list of JSON values read from any serde deserializer, each with
/// unique keys and at most `max_depth` levels (see
/// [`crate::args::unique_values`]).
pub(crate) fn values<'de, D: Deserializer<'de>>(
    d: D,
    max_depth: usize,
) -> Result<Vec<Value>, D::Error> {
    struct Each(usize);
    impl<'de> Visitor<'de> for Each {
        type Value = Vec<Value>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Value>, A::Error> {
            let why = Cell::new(None);
            let seed = Unique { why: &why, depth: 1, max_depth: self.0 };
            let mut all = Vec::new();
            while let Some(v) = seq.next_element_seed(seed)? {
                all.push(v);
            }
            Ok(all)
        }
    }
    d.deserialize_seq(Each(max_depth))
}

fn read<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    max_depth: usize,
) -> Result<Value, UniqueError> {
    let why = Cell::new(None);
    let value = (Unique { why: &why, depth: 0, max_depth })
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v));
    value.map_err(|e| match why.take() {
        None => UniqueError::Json(e),
        Some(Refusal::DuplicateKey(key)) => UniqueError::DuplicateKey { key, line: e.line() },
        Some(Refusal::ReservedKey) => UniqueError::ReservedKey,
        Some(Refusal::TooDeep) => UniqueError::TooDeep,
    })
}

/// Builds the value token by token; the first refusal is left in the cell.
#[derive(Clone, Copy)]
struct Unique<'a> {
    why: &'a Cell<Option<Refusal>>,
    depth: usize,
    max_depth: usize,
}

impl Unique<'_> {
    fn refuse<E: de::Error>(self, why: Refusal) -> E {
        let e = E::custom(&why);
        self.why.set(Some(why));
        e
    }

    fn inner<E: de::Error>(self) -> Result<Self, E> {
        if self.depth >= self.max_depth {
            return Err(self.refuse(Refusal::TooDeep));
        }
        Ok(Self { depth: self.depth + 1, ..self })
    }
}

impl<'de> DeserializeSeed<'de> for Unique<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Unique<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        // The parser yields finite numbers only.
        Ok(serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.inner()?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(inner)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.inner()?;
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == RESERVED_KEY {
                return Err(self.refuse(Refusal::ReservedKey));
            }
            // Refused before its value is read: the error's line is the
            // repeated key's.
            if out.contains_key(&key) {
                return Err(self.refuse(Refusal::DuplicateKey(key)));
            }
            let v = map.next_value_seed(inner)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_repeated_key_is_named_with_its_line() {
        let text = "{\n  \"a\": {\"k\": 1},\n  \"b\": [{\"k\": 1,\n  \"k\": 2}]\n}";
        match from_str(text, 64) {
            Err(UniqueError::DuplicateKey { key, line }) => assert_eq!((&*key, line), ("k", 4)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            from_slice(br#"{"x":1,"\u0078":2}"#, 64),
            Err(UniqueError::DuplicateKey { key, line: 1 }) if key == "x"
        ));
    }

    #[test]
    fn what_serde_json_reads_it_reads_alike() {
        let text = r#" {"a": [1, -2, 3.5, "s\n", null, true], "b": {"c": {}}} "#;
        assert_eq!(from_str(text, 64).unwrap(), serde_json::from_str::<Value>(text).unwrap());
        assert_eq!(
            from_slice(text.as_bytes(), 3).unwrap(),
            json!({"a": [1, -2, 3.5, "s\n", null, true], "b": {"c": {}}})
        );
        assert!(matches!(from_slice(text.as_bytes(), 2), Err(UniqueError::TooDeep)));
        for bad in [&b"{} {}"[..], b"{", b"", b"{\"\xff\":1}", b"[1,]"] {
            assert!(matches!(from_slice(bad, 64), Err(UniqueError::Json(_))), "{bad:?}");
        }
    }
}
