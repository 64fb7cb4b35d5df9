//! A manifest's args schema, kept as its compact JSON text.
//!
//! A registry of 10,000 skills holds 10,000 schemas; as `serde_json::Value`
//! trees (a B-tree node per object) they took ~2.5 KB each, as text they
//! take their length. The tree is rebuilt when a validator is compiled
//! ([`Schema::to_value`]); listings serialise the text as it is.

use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// A JSON Schema (always a JSON object), as compact JSON text.
#[derive(Clone)]
pub struct Schema(Box<RawValue>);

impl Schema {
    /// The schema of `value` (an object; the manifest checks that).
    ///
    /// # Errors
    ///
    /// Serialising `value` failed (it cannot: a `Value`'s keys are
    /// strings).
    pub fn from_value(value: &Value) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Self)
    }

    /// The compact JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The text as a raw JSON value (serialised verbatim).
    pub fn as_raw(&self) -> &RawValue {
        &self.0
    }

    /// The schema as a JSON tree (parsed again on every call).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or_else(|_| Value::Object(Default::default()))
    }
}

impl PartialEq for Schema {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Value> for Schema {
    fn eq(&self, other: &Value) -> bool {
        self.to_value() == *other
    }
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schema({})", self.as_str())
    }
}

impl Serialize for Schema {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn text_round_trips_and_serialises_verbatim() {
        let v = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let s = Schema::from_value(&v).unwrap();
        assert_eq!(s.to_value(), v);
        assert_eq!(s, v);
        assert!(!s.as_str().contains(' '), "{}", s.as_str());
        let out = serde_json::to_value(json!({"schema": s})).unwrap();
        assert_eq!(out["schema"], v);
        assert_eq!(Schema::from_value(&v).unwrap(), s);
    }
}
