//! Permission modes and the class gate, as pure rules.
//!
//! The operator maps callers to a [`PermissionMode`]; [`gate`] decides
//! what a request of a given class still needs from that mode. The
//! approvals themselves are checked by [`crate::approval`]; replay and the
//! audit trail are the loader's (they need state).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::SkillClass;

/// What a caller may run.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum PermissionMode {
    /// `safe` skills only. Unknown callers get this.
    #[default]
    ReadOnly,
    /// `safe`, and `mutating` with `"confirm": true`.
    MutatingWithConfirm,
    /// As `mutating-with-confirm`, and `dangerous` with two approvals from
    /// two distinct approver keys.
    DualSignRequired,
}

impl PermissionMode {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionMode::ReadOnly => "read-only",
            PermissionMode::MutatingWithConfirm => "mutating-with-confirm",
            PermissionMode::DualSignRequired => "dual-sign-required",
        }
    }

    /// Returns true if and only if a caller in this mode may run skills of
    /// `class` at all (given confirmation or approvals where needed).
    pub fn permits(self, class: SkillClass) -> bool {
        match class {
            SkillClass::Safe => true,
            SkillClass::Mutating => self >= PermissionMode::MutatingWithConfirm,
            SkillClass::Dangerous => self == PermissionMode::DualSignRequired,
        }
    }
}

impl fmt::Display for PermissionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The string is not a permission mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown permission mode {0:?} (expected \"read-only\", \"mutating-with-confirm\" or \"dual-sign-required\")"
)]
pub struct UnknownMode(pub String);

impl FromStr for PermissionMode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read-only" => Ok(PermissionMode::ReadOnly),
            "mutating-with-confirm" => Ok(PermissionMode::MutatingWithConfirm),
            "dual-sign-required" => Ok(PermissionMode::DualSignRequired),
            other => Err(UnknownMode(other.to_owned())),
        }
    }
}

/// Why a run is refused: the `reason` of a 403 and of the audit row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DenyReason {
    /// The caller's mode does not allow the skill's class.
    ClassNotPermitted,
    /// A `mutating` skill without `"confirm": true`.
    ConfirmRequired,
    /// A `dangerous` skill with fewer than two approvals.
    ApprovalsRequired,
    /// An approval is not well formed (signature not base64 of 64 bytes,
    /// key id or digest not hex).
    ApprovalMalformed,
    /// A signature does not verify (forged, or made with another key).
    ApprovalInvalidSignature,
    /// An approval names a key id no configured approver has.
    ApprovalUnknownKey,
    /// Two approvals from the same key.
    ApprovalDuplicateKey,
    /// An approval's expiry has passed.
    ApprovalExpired,
    /// An approval expires further ahead than the configured maximum.
    ApprovalTtlTooLong,
    /// An approval was already used for an earlier run.
    ApprovalReplayed,
    /// An approval was signed over another request (skill, args, session
    /// or expiry differ).
    ApprovalMismatch,
}

impl DenyReason {
    /// The stable code.
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::ClassNotPermitted => "class_not_permitted",
            DenyReason::ConfirmRequired => "confirm_required",
            DenyReason::ApprovalsRequired => "approvals_required",
            DenyReason::ApprovalMalformed => "approval_malformed",
            DenyReason::ApprovalInvalidSignature => "approval_invalid_signature",
            DenyReason::ApprovalUnknownKey => "approval_unknown_key",
            DenyReason::ApprovalDuplicateKey => "approval_duplicate_key",
            DenyReason::ApprovalExpired => "approval_expired",
            DenyReason::ApprovalTtlTooLong => "approval_ttl_too_long",
            DenyReason::ApprovalReplayed => "approval_replayed",
            DenyReason::ApprovalMismatch => "approval_mismatch",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a request of a permitted class still needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Nothing: run it.
    Open,
    /// Two valid approvals (the caller checks them with
    /// [`crate::approval::verify`]).
    NeedsApprovals,
}

/// The class gate: `safe` for everyone; `mutating` needs a mode that
/// permits it and `confirm`; `dangerous` needs `dual-sign-required` and
/// then approvals.
///
/// # Errors
///
/// [`DenyReason::ClassNotPermitted`] or [`DenyReason::ConfirmRequired`].
pub fn gate(mode: PermissionMode, class: SkillClass, confirm: bool) -> Result<Gate, DenyReason> {
    if !mode.permits(class) {
        return Err(DenyReason::ClassNotPermitted);
    }
    match class {
        SkillClass::Safe => Ok(Gate::Open),
        SkillClass::Mutating if confirm => Ok(Gate::Open),
        SkillClass::Mutating => Err(DenyReason::ConfirmRequired),
        SkillClass::Dangerous => Ok(Gate::NeedsApprovals),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_and_class() {
        use PermissionMode::*;
        use SkillClass::*;
        let cases = [
            (ReadOnly, Safe, false, Ok(Gate::Open)),
            (ReadOnly, Mutating, true, Err(DenyReason::ClassNotPermitted)),
            (ReadOnly, Dangerous, true, Err(DenyReason::ClassNotPermitted)),
            (MutatingWithConfirm, Safe, false, Ok(Gate::Open)),
            (MutatingWithConfirm, Mutating, false, Err(DenyReason::ConfirmRequired)),
            (MutatingWithConfirm, Mutating, true, Ok(Gate::Open)),
            (MutatingWithConfirm, Dangerous, true, Err(DenyReason::ClassNotPermitted)),
            (DualSignRequired, Mutating, false, Err(DenyReason::ConfirmRequired)),
            (DualSignRequired, Mutating, true, Ok(Gate::Open)),
            (DualSignRequired, Dangerous, false, Ok(Gate::NeedsApprovals)),
        ];
        for (mode, class, confirm, want) in cases {
            assert_eq!(gate(mode, class, confirm), want, "{mode} {class} {confirm}");
        }
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [
            PermissionMode::ReadOnly,
            PermissionMode::MutatingWithConfirm,
            PermissionMode::DualSignRequired,
        ] {
            assert_eq!(m.as_str().parse(), Ok(m));
            assert_eq!(serde_json::to_value(m).unwrap(), m.as_str());
        }
        assert!("readonly".parse::<PermissionMode>().is_err());
        assert_eq!(DenyReason::ApprovalTtlTooLong.as_str(), "approval_ttl_too_long");
        assert_eq!(
            serde_json::to_value(DenyReason::ApprovalTtlTooLong).unwrap(),
            "approval_ttl_too_long"
        );
    }
}
