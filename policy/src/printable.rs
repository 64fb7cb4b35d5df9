//! Text from packs and skills made safe to print on a terminal or in a
//! log: the human output of the CLI (never its `--json`) and the daemons'
//! log lines.
//!
//! A description, a path, a schema or a skill's stderr line is written by
//! whoever wrote the pack or the skill. Printed raw, its control
//! characters would be the terminal's commands: `\x1b[2J` clears the
//! screen, OSC sequences set the window title or a clipboard, `\r` and
//! line breaks make one line pass for another. So, as `journalctl` and
//! `systemctl` do, every control character (C0, DEL and C1) except tab is
//! shown as an escape: `\n` and `\r`, `\x1b` for the other C0 characters
//! and DEL, `\u{9b}` for C1. So are the bidirectional controls (U+061C,
//! U+200E-F, U+202A-E, U+2066-9: "Trojan Source"), which make a text
//! display as another.

use std::borrow::Cow;
use std::fmt::Write as _;

fn is_escaped(c: char) -> bool {
    (c.is_control() && c != '\t') || is_bidi(c)
}

/// A bidirectional formatting character: it reorders what follows on
/// the screen.
fn is_bidi(c: char) -> bool {
    matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` as one line: every control character but tab escaped, line
/// breaks included (a table cell, a field, one stderr line).
pub fn line(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if is_escaped(c) && u32::from(c) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if is_escaped(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `text` as lines: each line of it through [`line`], so the line
/// structure stays and the control characters inside a line are escaped
/// (a skill's stderr).
pub fn lines(text: &str) -> impl Iterator<Item = Cow<'_, str>> {
    text.lines().map(line)
}

/// A JSON document (a skill's result, a schema) made safe to print while
/// it stays the same JSON value: DEL and C1 characters, which JSON lets
/// strings hold raw, become `\u00XX` escapes, and `\r`, which it allows
/// only as whitespace between tokens, becomes a space. Line breaks and
/// tabs stay (pretty-printed JSON). Valid JSON holds no other control
/// character; any would be escaped the same way.
pub fn json(text: &str) -> Cow<'_, str> {
    let escaped = |c: char| is_escaped(c) && c != '\n';
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\r' => out.push(' '),
            c if escaped(c) => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn plain_text_is_borrowed_as_it_is() {
        let text = "Disk usage of a path\tby mount, ünïcode: 日本";
        assert!(matches!(line(text), Cow::Borrowed(t) if t == text));
        assert!(matches!(json(r#"{"a": "b"}"#), Cow::Borrowed(_)));
    }

    #[test]
    fn control_characters_are_escaped_but_tab() {
        let text = "a\nb\r\x1b[31mred\x07\x00\x7f\u{9b}2J\u{85}\tend";
        assert_eq!(line(text), "a\\nb\\r\\x1b[31mred\\x07\\x00\\x7f\\u{9b}2J\\u{85}\tend");
        // An OSC 52 clipboard write.
        assert_eq!(line("\x1b]52;c;aGk=\x07"), "\\x1b]52;c;aGk=\\x07");
        // A right-to-left override, then an isolate.
        assert_eq!(line("ab\u{202e}cd\u{2066}e"), "ab\\u{202e}cd\\u{2066}e");
        let safe = json("\"x\u{202e}y\"");
        assert_eq!(safe, "\"x\\u202ey\"");
        assert_eq!(serde_json::from_str::<String>(&safe).unwrap(), "x\u{202e}y");
    }

    #[test]
    fn lines_keep_their_structure() {
        let got: Vec<Cow<'_, str>> = lines("one\x1b[2J\ntwo\rthree\r\n\nfour").collect();
        assert_eq!(got, ["one\\x1b[2J", "two\\rthree", "", "four"]);
    }

    #[test]
    fn json_stays_the_same_value() {
        let text = "{\"a\":\r\"x\u{9b}2J\u{7f}y\",\n  \"b\": [1,\t2]}";
        let safe = json(text);
        assert_eq!(safe, "{\"a\": \"x\\u009b2J\\u007fy\",\n  \"b\": [1,\t2]}");
        let before: Value = serde_json::from_str(text).unwrap();
        let after: Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(before, after);
        assert!(!safe.chars().any(|c| c.is_control() && c != '\n' && c != '\t'));
    }
}
