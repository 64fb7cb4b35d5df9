//! Skill names: `[a-z0-9_]+`, at most [`SkillName::MAX_LEN`] bytes.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A validated skill name. Only `[a-z0-9_]`, non-empty, at most 64 bytes
/// (the limit LLM tool APIs put on function names).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SkillName(String);

/// Why a string is not a valid skill name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is the empty string.
    #[error("must not be empty")]
    Empty,
    /// The name is longer than [`SkillName::MAX_LEN`].
    #[error("must be at most {max} bytes, got {len}", max = SkillName::MAX_LEN)]
    TooLong {
        /// Length of the rejected name in bytes.
        len: usize,
    },
    /// The name holds a character outside `[a-z0-9_]`.
    #[error("must match [a-z0-9_]+, found {found:?} at byte {at}")]
    BadChar {
        /// The offending character.
        found: char,
        /// Its byte offset.
        at: usize,
    },
}

impl SkillName {
    /// Longest accepted name, in bytes.
    pub const MAX_LEN: usize = 64;

    /// Validates `s` as a skill name.
    ///
    /// # Errors
    ///
    /// [`NameError`] when `s` is empty, too long or holds a character
    /// outside `[a-z0-9_]` (uppercase, space, dash, non-ASCII, newline...).
    pub fn new(s: &str) -> Result<Self, NameError> {
        if s.is_empty() {
            return Err(NameError::Empty);
        }
        if let Some((at, found)) =
            s.char_indices().find(|(_, c)| !matches!(c, 'a'..='z' | '0'..='9' | '_'))
        {
            return Err(NameError::BadChar { found, at });
        }
        if s.len() > Self::MAX_LEN {
            return Err(NameError::TooLong { len: s.len() });
        }
        Ok(Self(s.to_owned()))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SkillName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SkillName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for SkillName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        SkillName::new(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        struct Case {
            input: &'static str,
            ok: bool,
        }
        let cases = [
            Case { input: "disk_usage", ok: true },
            Case { input: "a", ok: true },
            Case { input: "0_9", ok: true },
            Case { input: "_", ok: true },
            Case { input: "", ok: false },
            Case { input: "Disk", ok: false },
            Case { input: "disk usage", ok: false },
            Case { input: "disk-usage", ok: false },
            Case { input: "dïsk", ok: false },
            Case { input: "disk\n", ok: false },
            Case { input: "disk.usage", ok: false },
            Case { input: "disk/usage", ok: false },
            Case { input: "disk\0", ok: false },
            Case { input: "\u{0430}bc", ok: false },
        ];
        for c in cases {
            assert_eq!(SkillName::new(c.input).is_ok(), c.ok, "{:?}", c.input);
        }
    }

    #[test]
    fn length_bound() {
        assert!(SkillName::new(&"a".repeat(64)).is_ok());
        assert_eq!(SkillName::new(&"a".repeat(65)), Err(NameError::TooLong { len: 65 }));
    }

    #[test]
    fn error_names_the_character() {
        let e = SkillName::new("ab-c").unwrap_err();
        assert_eq!(e.to_string(), "must match [a-z0-9_]+, found '-' at byte 2");
    }
}
