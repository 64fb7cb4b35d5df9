//! Canonical JSON of a text, for the approvals' digest
//! ([`crate::approval`]): object keys sorted by their UTF-8 bytes at every
//! depth, no whitespace, strings as serde_json writes them, numbers and
//! literals as written (the skill reads the args' text, so `1E3` and
//! `1000`, or two integers past 2^53 that round to one `f64`, are different
//! requests).
//!
//! One pass: the text is checked as JSON, then read once into a tree of
//! spans, whose objects are sorted and written out. Its cost is linear in
//! the text (and `n log n` in the members of one object), whatever the
//! depth, where reading each level's members again as raw values would
//! cost depth × size.

use std::ops::Range;

use serde_json::Value;

/// Deepest nesting read; deeper text yields `null`, as text that is not
/// JSON does (an [`crate::Args`] is at most 64 levels deep).
const MAX_DEPTH: usize = 128;

/// Canonical JSON of `text`; `null` when `text` is not one JSON value.
#[must_use]
pub fn canonical_json(text: &str) -> String {
    if crate::raw_json::check(text.as_bytes()).is_err() {
        return "null".to_owned();
    }
    let mut reader = Reader { text, at: 0 };
    let Some(node) = reader.value(0) else { return "null".to_owned() };
    let mut out = String::with_capacity(text.len());
    node.write(text, &mut out);
    out
}

/// A value of the text, by spans.
enum Node {
    /// Members: the key decoded (for sorting), the value.
    Object(Vec<(String, Node)>),
    Array(Vec<Node>),
    /// A string, quotes included.
    String(Range<usize>),
    /// A number, `true`, `false` or `null`, as written.
    Scalar(Range<usize>),
}

impl Node {
    fn write(mut self, text: &str, out: &mut String) {
        match &mut self {
            Node::Object(members) => {
                members.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                out.push('{');
                for (i, (key, value)) in std::mem::take(members).into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(key).to_string());
                    out.push(':');
                    value.write(text, out);
                }
                out.push('}');
            }
            Node::Array(items) => {
                out.push('[');
                for (i, item) in std::mem::take(items).into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(text, out);
                }
                out.push(']');
            }
            Node::String(span) => {
                // Checked JSON: the literal decodes.
                let s: String = serde_json::from_str(&text[span.clone()]).unwrap_or_default();
                out.push_str(&Value::String(s).to_string());
            }
            Node::Scalar(span) => out.push_str(&text[span.clone()]),
        }
    }
}

/// Reads checked JSON text into [`Node`]s.
struct Reader<'a> {
    text: &'a str,
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        self.skip_ws();
        (self.peek() == Some(byte)).then(|| self.at += 1)
    }

    fn value(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.skip_ws();
        match self.peek()? {
            b'{' => {
                self.at += 1;
                let mut members = Vec::new();
                if self.eat(b'}').is_some() {
                    return Some(Node::Object(members));
                }
                loop {
                    self.skip_ws();
                    let key = self.string()?;
                    let key: String = serde_json::from_str(&self.text[key]).ok()?;
                    self.eat(b':')?;
                    members.push((key, self.value(depth + 1)?));
                    if self.eat(b',').is_none() {
                        self.eat(b'}')?;
                        return Some(Node::Object(members));
                    }
                }
            }
            b'[' => {
                self.at += 1;
                let mut items = Vec::new();
                if self.eat(b']').is_some() {
                    return Some(Node::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    if self.eat(b',').is_none() {
                        self.eat(b']')?;
                        return Some(Node::Array(items));
                    }
                }
            }
            b'"' => self.string().map(Node::String),
            _ => {
                let start = self.at;
                while matches!(
                    self.peek(),
                    Some(b'0'..=b'9' | b'a'..=b'z' | b'+' | b'-' | b'.' | b'E')
                ) {
                    self.at += 1;
                }
                (self.at > start).then_some(Node::Scalar(start..self.at))
            }
        }
    }

    /// The span of the string literal at the cursor, quotes included.
    fn string(&mut self) -> Option<Range<usize>> {
        let start = self.at;
        if self.peek()? != b'"' {
            return None;
        }
        self.at += 1;
        loop {
            match self.peek()? {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    return Some(start..self.at);
                }
                _ => self.at += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::value::RawValue;

    use super::*;

    /// The former implementation, which reads each level's members again
    /// as raw values: the oracle.
    fn reparse(text: &str) -> String {
        fn write(text: &str, out: &mut String) -> Result<(), serde_json::Error> {
            match text.as_bytes().first() {
                Some(b'{') => {
                    let mut map = serde_json::from_str::<Entries<'_>>(text)?.0;
                    map.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                    out.push('{');
                    for (i, (k, v)) in map.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&Value::from(k.as_str()).to_string());
                        out.push(':');
                        write(v.get(), out)?;
                    }
                    out.push('}');
                }
                Some(b'[') => {
                    let items: Vec<&RawValue> = serde_json::from_str(text)?;
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        write(item.get(), out)?;
                    }
                    out.push(']');
                }
                Some(b'"') => {
                    out.push_str(&Value::String(serde_json::from_str(text)?).to_string());
                }
                _ => out.push_str(text),
            }
            Ok(())
        }
        let mut out = String::new();
        match write(text.trim_ascii(), &mut out) {
            Ok(()) => out,
            Err(_) => "null".to_owned(),
        }
    }

    struct Entries<'a>(Vec<(String, &'a RawValue)>);

    impl<'de: 'a, 'a> serde::Deserialize<'de> for Entries<'a> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Entries<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Entries<'de>, A::Error> {
                    let mut out = Vec::new();
                    while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                        out.push((k, v));
                    }
                    Ok(Entries(out))
                }
            }
            d.deserialize_map(V)
        }
    }

    #[test]
    fn sorts_keys_drops_whitespace_keeps_numbers() {
        let text =
            r#" { "b": [1, {"z": null, "a": "\u00e9\n"}], "a": 1.50, "B": true, "n": 1E3 } "#;
        assert_eq!(
            canonical_json(text),
            r#"{"B":true,"a":1.50,"b":[1,{"a":"é\n","z":null}],"n":1E3}"#
        );
        for bad in ["", "{", "{} {}", "[1,]", "\"\\x\"", "{\"a\":1e999}"] {
            assert_eq!(canonical_json(bad), "null", "{bad:?}");
        }
    }

    /// A small deterministic generator of JSON texts with odd spellings:
    /// escapes, exponents, big integers, `-0`, whitespace everywhere.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % n
        }
        fn ws(&mut self, out: &mut String) {
            out.push_str([" ", "", "\n\t", "", "\r\n "][self.next(5) as usize]);
        }
        fn string(&mut self, out: &mut String) {
            const PARTS: [&str; 10] =
                ["a", "b", "\\u00e9", "é", "\\n", "\\\"", "\\/", "\\\\", "A", "\\ud83d\\ude00"];
            out.push('"');
            for _ in 0..self.next(4) {
                out.push_str(PARTS[self.next(10) as usize]);
            }
            out.push('"');
        }
        fn value(&mut self, depth: u32, out: &mut String) {
            self.ws(out);
            match if depth > 4 { 2 + self.next(3) } else { self.next(5) } {
                0 => {
                    out.push('{');
                    for i in 0..self.next(5) {
                        if i > 0 {
                            out.push(',');
                        }
                        self.ws(out);
                        self.string(out);
                        self.ws(out);
                        out.push(':');
                        self.value(depth + 1, out);
                    }
                    self.ws(out);
                    out.push('}');
                }
                1 => {
                    out.push('[');
                    for i in 0..self.next(4) {
                        if i > 0 {
                            out.push(',');
                        }
                        self.value(depth + 1, out);
                    }
                    out.push(']');
                }
                2 => self.string(out),
                3 => {
                    const NUMBERS: [&str; 10] = [
                        "0",
                        "-0",
                        "1.50",
                        "1E3",
                        "1e-7",
                        "-12",
                        "123456789012345678901234567890",
                        "0.1",
                        "2.5E+10",
                        "18446744073709551616",
                    ];
                    out.push_str(NUMBERS[self.next(10) as usize]);
                }
                _ => out.push_str(["true", "false", "null"][self.next(3) as usize]),
            }
            self.ws(out);
        }
    }

    #[test]
    fn agrees_with_reading_each_level_again() {
        let mut g = Gen(7);
        let mut objects = 0;
        for _ in 0..20_000 {
            let mut text = String::new();
            g.value(0, &mut text);
            // Keys given twice: the oracle keeps both as well, so they agree.
            assert_eq!(canonical_json(&text), reparse(&text), "{text}");
            objects += usize::from(text.trim_start().starts_with('{'));
        }
        assert!(objects > 1000, "{objects} objects generated");
    }

    #[test]
    fn deep_text_is_read_in_one_pass() {
        // 65 levels around a 256 KiB array (the former way read the array
        // again at every level).
        let inner = format!("[{}1]", "1,".repeat(128 << 10));
        let text = format!("{}{inner}{}", "{\"a\":[".repeat(32), "]}".repeat(32));
        let out = canonical_json(&text);
        assert!(out == text, "sorted input without whitespace is its own canonical form");
    }
}
