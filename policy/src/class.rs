//! Skill classes: how much a run may change on the host.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a skill may do to the host. Case-sensitive on the wire.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SkillClass {
    /// Read-only. Every caller may run it.
    #[default]
    Safe,
    /// A reversible change. Needs a permission mode that allows it and `confirm`.
    Mutating,
    /// An irreversible change. Needs two approvals.
    Dangerous,
}

impl SkillClass {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SkillClass::Safe => "safe",
            SkillClass::Mutating => "mutating",
            SkillClass::Dangerous => "dangerous",
        }
    }
}

impl fmt::Display for SkillClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The string is not one of `safe`, `mutating`, `dangerous`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown class {0:?} (expected \"safe\", \"mutating\" or \"dangerous\")")]
pub struct UnknownClass(pub String);

impl FromStr for SkillClass {
    type Err = UnknownClass;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "safe" => Ok(SkillClass::Safe),
            "mutating" => Ok(SkillClass::Mutating),
            "dangerous" => Ok(SkillClass::Dangerous),
            other => Err(UnknownClass(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_is_case_sensitive() {
        assert_eq!("safe".parse(), Ok(SkillClass::Safe));
        assert_eq!("mutating".parse(), Ok(SkillClass::Mutating));
        assert_eq!("dangerous".parse(), Ok(SkillClass::Dangerous));
        for bad in ["Safe", "SAFE", "", " safe", "readonly", "destructive"] {
            assert!(bad.parse::<SkillClass>().is_err(), "{bad:?}");
        }
    }
}
