//! Bounded YAML → JSON for SKILL.md frontmatter.
//!
//! The frontmatter comes from packs anyone with write access to a skill
//! directory may have written, and both daemons read it, so the
//! conversion is deliberately small and bounded:
//!
//! - the text is at most [`MAX_YAML_BYTES`] (callers cut it out of a file of
//!   at most 1 MiB);
//! - anchors, aliases and tags are refused outright (no alias bomb can
//!   expand, nothing is resolved by type tag);
//! - nesting is at most [`MAX_YAML_DEPTH`] collections and a document at
//!   most [`MAX_YAML_NODES`] nodes;
//! - one document, keys are scalars, duplicate keys are an error.
//!
//! The parser is `yaml-rust2`'s pull parser (pure Rust, iterative, no
//! recursion on nesting); the tree is built here, with the limits above
//! checked per event, so work is linear in the input. Plain scalars
//! resolve as in the YAML 1.2 core schema (null, booleans, integers,
//! floats, else strings); quoted and block scalars are strings.

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::TScalarStyle;

/// Longest YAML text accepted, in bytes.
pub const MAX_YAML_BYTES: usize = 64 << 10;
/// Deepest nesting of mappings and sequences accepted.
pub const MAX_YAML_DEPTH: usize = 32;
/// Most nodes (scalars and collections) in one document.
pub const MAX_YAML_NODES: usize = 10_000;

/// Why a YAML text is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    /// Longer than [`MAX_YAML_BYTES`].
    #[error("YAML is {size} bytes, larger than the {max} byte limit", max = MAX_YAML_BYTES)]
    TooLarge {
        /// Size in bytes.
        size: usize,
    },
    /// Not well-formed YAML.
    #[error("invalid YAML: {0}")]
    Syntax(String),
    /// An anchor (`&a`) or an alias (`*a`).
    #[error("YAML anchors and aliases are not accepted (line {line})")]
    Alias {
        /// 1-based line.
        line: usize,
    },
    /// A tag (`!foo`, `!!str`).
    #[error("YAML tags are not accepted (line {line})")]
    Tag {
        /// 1-based line.
        line: usize,
    },
    /// Nested deeper than [`MAX_YAML_DEPTH`].
    #[error("YAML nested deeper than {max} levels (line {line})", max = MAX_YAML_DEPTH)]
    TooDeep {
        /// 1-based line.
        line: usize,
    },
    /// More than [`MAX_YAML_NODES`] nodes.
    #[error("YAML has more than {max} nodes", max = MAX_YAML_NODES)]
    TooManyNodes,
    /// A mapping or a sequence used as a key.
    #[error("YAML mapping keys must be scalars (line {line})")]
    ComplexKey {
        /// 1-based line.
        line: usize,
    },
    /// The same key twice in one mapping.
    #[error("duplicate key {key:?} (line {line})")]
    DuplicateKey {
        /// The key.
        key: String,
        /// 1-based line.
        line: usize,
    },
    /// More than one document.
    #[error("more than one YAML document")]
    MultipleDocuments,
}

enum Frame {
    Seq(Vec<Value>),
    Map(Map<String, Value>, Option<String>),
}

/// Parses `text` (one YAML document) into JSON. An empty document is
/// `null`.
///
/// # Errors
///
/// [`YamlError`]; never panics and never allocates more than a small
/// multiple of the input.
pub fn to_json(text: &str) -> Result<Value, YamlError> {
    if text.len() > MAX_YAML_BYTES {
        return Err(YamlError::TooLarge { size: text.len() });
    }
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Value> = None;
    let mut documents = 0usize;
    let mut nodes = 0usize;
    loop {
        let (event, mark) = parser.next_token().map_err(|e| YamlError::Syntax(e.to_string()))?;
        let line = mark.line();
        let value = match event {
            Event::StreamEnd => break,
            Event::Nothing | Event::StreamStart | Event::DocumentEnd => continue,
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    return Err(YamlError::MultipleDocuments);
                }
                continue;
            }
            Event::Alias(_) => return Err(YamlError::Alias { line }),
            Event::Scalar(text, style, anchor, tag) => {
                check_node(anchor, tag.is_some(), line, &mut nodes)?;
                scalar(text, style)
            }
            Event::SequenceStart(anchor, tag) => {
                open(&stack, anchor, tag.is_some(), line, &mut nodes)?;
                stack.push(Frame::Seq(Vec::new()));
                continue;
            }
            Event::MappingStart(anchor, tag) => {
                open(&stack, anchor, tag.is_some(), line, &mut nodes)?;
                stack.push(Frame::Map(Map::new(), None));
                continue;
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Frame::Seq(items)) => Value::Array(items),
                _ => return Err(YamlError::Syntax("unbalanced sequence".into())),
            },
            Event::MappingEnd => match stack.pop() {
                Some(Frame::Map(map, None)) => Value::Object(map),
                _ => return Err(YamlError::Syntax("unbalanced mapping".into())),
            },
        };
        attach(&mut stack, &mut root, value, line)?;
    }
    Ok(root.unwrap_or(Value::Null))
}

/// Counts a node and refuses anchors and tags on it.
fn check_node(
    anchor: usize,
    tagged: bool,
    line: usize,
    nodes: &mut usize,
) -> Result<(), YamlError> {
    if anchor != 0 {
        return Err(YamlError::Alias { line });
    }
    if tagged {
        return Err(YamlError::Tag { line });
    }
    *nodes += 1;
    if *nodes > MAX_YAML_NODES {
        return Err(YamlError::TooManyNodes);
    }
    Ok(())
}

/// Checks a collection about to be opened: not a key, not too deep.
fn open(
    stack: &[Frame],
    anchor: usize,
    tagged: bool,
    line: usize,
    nodes: &mut usize,
) -> Result<(), YamlError> {
    check_node(anchor, tagged, line, nodes)?;
    if let Some(Frame::Map(_, None)) = stack.last() {
        return Err(YamlError::ComplexKey { line });
    }
    if stack.len() >= MAX_YAML_DEPTH {
        return Err(YamlError::TooDeep { line });
    }
    Ok(())
}

/// Puts a finished value into its parent (or makes it the root).
fn attach(
    stack: &mut [Frame],
    root: &mut Option<Value>,
    value: Value,
    line: usize,
) -> Result<(), YamlError> {
    match stack.last_mut() {
        None => *root = Some(value),
        Some(Frame::Seq(items)) => items.push(value),
        Some(Frame::Map(map, pending)) => match pending.take() {
            None => {
                let key = match value {
                    Value::String(s) => s,
                    Value::Null => String::new(),
                    Value::Bool(b) => b.to_string(),
                    Value::Number(n) => n.to_string(),
                    Value::Array(_) | Value::Object(_) => {
                        return Err(YamlError::ComplexKey { line })
                    }
                };
                if map.contains_key(&key) {
                    return Err(YamlError::DuplicateKey { key, line });
                }
                *pending = Some(key);
            }
            Some(key) => {
                map.insert(key, value);
            }
        },
    }
    Ok(())
}

/// A scalar's JSON value: plain scalars by the YAML 1.2 core schema,
/// every other style a string.
fn scalar(text: String, style: TScalarStyle) -> Value {
    if style != TScalarStyle::Plain {
        return Value::String(text);
    }
    match text.as_str() {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    if is_int(&text) {
        if let Ok(i) = text.parse::<i64>() {
            return Value::Number(i.into());
        }
    }
    if is_float(&text) {
        if let Some(n) = text.parse::<f64>().ok().and_then(Number::from_f64) {
            return Value::Number(n);
        }
    }
    Value::String(text)
}

fn is_int(s: &str) -> bool {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn is_float(s: &str) -> bool {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let mut parts = mantissa.splitn(2, '.');
    let int = parts.next().unwrap_or("");
    let frac = parts.next();
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match frac {
        None => !int.is_empty() && digits(int),
        Some(f) => (!int.is_empty() || !f.is_empty()) && digits(int) && digits(f),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn converts_the_usual_shapes() {
        let v = to_json(
            "name: probe\nn: 3\nf: 1.5\nt: true\nz: ~\nq: \"3\"\nlist: [a, b]\nblock:\n  - x: 1\n    y: [1, {k: v}]\ntext: |\n  two\n  lines\n",
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"name": "probe", "n": 3, "f": 1.5, "t": true, "z": null, "q": "3",
                   "list": ["a", "b"], "block": [{"x": 1, "y": [1, {"k": "v"}]}],
                   "text": "two\nlines\n"})
        );
        assert_eq!(to_json("").unwrap(), Value::Null);
        assert_eq!(to_json("1e3").unwrap(), json!(1000.0));
        assert_eq!(to_json("1.2.3").unwrap(), json!("1.2.3"));
        assert!(matches!(to_json("a: [1"), Err(YamlError::Syntax(_))));
    }

    #[test]
    fn refuses_anchors_aliases_tags_and_duplicates() {
        assert!(matches!(to_json("a: &x 1\nb: *x\n"), Err(YamlError::Alias { line: 1 })));
        assert!(matches!(to_json("a: !!str 1\n"), Err(YamlError::Tag { .. })));
        assert!(matches!(to_json("a: 1\na: 2\n"), Err(YamlError::DuplicateKey { .. })));
        assert!(matches!(to_json("? [a]\n: 1\n"), Err(YamlError::ComplexKey { .. })));
        assert!(matches!(to_json("a: 1\n---\nb: 2\n"), Err(YamlError::MultipleDocuments)));
    }

    #[test]
    fn bounds_depth_nodes_and_size() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(matches!(
            to_json(&deep),
            Err(YamlError::TooDeep { .. }) | Err(YamlError::Syntax(_))
        ));
        let ok = format!("{}{}", "[".repeat(MAX_YAML_DEPTH), "]".repeat(MAX_YAML_DEPTH));
        assert!(to_json(&ok).is_ok());
        let many = format!("[{}]", vec!["1"; MAX_YAML_NODES + 1].join(","));
        assert!(matches!(
            to_json(&many),
            Err(YamlError::TooLarge { .. }) | Err(YamlError::TooManyNodes)
        ));
        let many = format!("[{}]", vec!["1"; MAX_YAML_NODES].join(","));
        assert!(matches!(to_json(&many), Err(YamlError::TooManyNodes)));
        assert!(matches!(
            to_json(&"a".repeat(MAX_YAML_BYTES + 1)),
            Err(YamlError::TooLarge { .. })
        ));
    }
}
