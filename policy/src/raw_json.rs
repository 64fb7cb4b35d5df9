//! [`RawJson`]: one JSON value kept as the text it arrived as.
//!
//! A skill's stdout is returned verbatim: the same key order,
//! number spelling and string escapes as the skill printed, never a parsed
//! and re-serialised copy. The one change made is for framing: the executor
//! wire and the NDJSON stream carry one JSON document per line, so a value
//! printed across several lines has its insignificant whitespace removed
//! (strings cannot hold a raw line break, so nothing inside them changes).
//! Whitespace around the value is not part of it.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// One valid JSON value as text, on one line.
#[derive(Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// Parses one JSON value from `bytes` (surrounding whitespace allowed).
    ///
    /// # Errors
    ///
    /// When `bytes` is not exactly one JSON value in UTF-8.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        check(bytes)?;
        serde_json::from_slice::<Box<RawValue>>(bytes).map(Self::one_line)
    }

    /// The JSON text of `value` (for values built in code).
    #[must_use]
    pub fn from_value(value: &Value) -> Self {
        // A Value always serialises, and its text is one line.
        Self(RawValue::from_string(value.to_string()).unwrap_or_else(|_| null()))
    }

    /// The JSON text, exactly as received (on one line).
    #[must_use]
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The value parsed into a [`Value`] (key order is not kept).
    #[must_use]
    pub fn to_value(&self) -> Value {
        // The text was validated when this was built.
        serde_json::from_str(self.get()).unwrap_or(Value::Null)
    }

    fn one_line(raw: Box<RawValue>) -> Self {
        if !raw.get().bytes().any(|b| b == b'\n' || b == b'\r') {
            return Self(raw);
        }
        let compact = compact(raw.get());
        // Removing whitespace between tokens keeps the text valid JSON.
        Self(RawValue::from_string(compact).unwrap_or(raw))
    }
}

/// Checks that `bytes` is one JSON value exactly as a [`Value`] would
/// accept it (UTF-8, numbers in range, nesting depth), without building
/// one: a raw value alone skips what it does not look at.
///
/// # Errors
///
/// What parsing `bytes` into a [`Value`] would return.
pub fn check(bytes: &[u8]) -> Result<(), serde_json::Error> {
    serde_json::from_slice::<Checked>(bytes).map(|_| ())
}

/// Visits every token like a [`Value`] does, keeping nothing.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("null is JSON")
}

/// Removes the whitespace between the tokens of valid JSON text.
fn compact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    out
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for RawJson {}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl fmt::Display for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(d).map(Self::one_line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_is_kept_byte_for_byte() {
        for text in [
            r#"{"z":1,"a":2}"#,
            r#"{"n": 1.50, "e": 1E3, "big": 123456789012345678901234567890}"#,
            r#"{"s":"\u00e9\/x","t":"é"}"#,
            r#"[1, 2 ,3]"#,
            "\"just a string\"",
            "null",
        ] {
            let r = RawJson::from_slice(text.as_bytes()).unwrap();
            assert_eq!(r.get(), text);
        }
    }

    #[test]
    fn surrounding_whitespace_is_not_part_of_the_value() {
        let r = RawJson::from_slice(b"\n  {\"b\":1,\"a\":2}\n\n").unwrap();
        assert_eq!(r.get(), r#"{"b":1,"a":2}"#);
    }

    #[test]
    fn multi_line_values_become_one_line_with_strings_untouched() {
        let text = "{\n  \"b\": \"x y\\\" \\\\\",\n\t\"a\": [1,\r\n 2]\n}";
        let r = RawJson::from_slice(text.as_bytes()).unwrap();
        assert_eq!(r.get(), r#"{"b":"x y\" \\","a":[1,2]}"#);
        assert_eq!(r.to_value(), json!({"b": "x y\" \\", "a": [1, 2]}));
    }

    #[test]
    fn not_one_value_is_an_error() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for text in [
            &b""[..],
            b"{} {}",
            b"{",
            b"\xff",
            b"{\"a\":1}x",
            // What a Value refuses: out-of-range numbers, bad UTF-8 in a
            // string, nesting past 128.
            b"{\"a\":1e999}",
            b"44444E44444444444444444444444180754",
            b"[\"\xcc0\"]",
            deep.as_bytes(),
        ] {
            assert!(RawJson::from_slice(text).is_err(), "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn serialises_verbatim_inside_a_document() {
        #[derive(Serialize, Deserialize)]
        struct Doc {
            result: Option<RawJson>,
        }
        let doc = Doc { result: Some(RawJson::from_slice(br#"{"z":0.10,"a":[]}"#).unwrap()) };
        let text = serde_json::to_string(&doc).unwrap();
        assert_eq!(text, r#"{"result":{"z":0.10,"a":[]}}"#);
        let back: Doc = serde_json::from_str(&text).unwrap();
        assert_eq!(back.result.unwrap().get(), r#"{"z":0.10,"a":[]}"#);
        let none: Doc = serde_json::from_str(r#"{"result":null}"#).unwrap();
        assert!(none.result.is_none());
    }

    #[test]
    fn from_value_round_trips() {
        let v = json!({"k": [1, "two", null]});
        assert_eq!(RawJson::from_value(&v).to_value(), v);
    }
}
