//! Who may run what: the hook permission modes plug into (issue 5).
//!
//! Today every caller that can open the socket (its mode is the first gate)
//! may run every registered skill. The decision is still made here, once
//! per request, from the kernel's view of the caller ([`Caller`]) and the
//! request, so that `read-only`, `mutating-with-confirm` and
//! `dual-sign-required` can be added without touching the handlers.

use policy::SkillClass;

use crate::server::Caller;

/// What the caller asks for, as far as permission is concerned.
#[derive(Debug, Clone, Copy)]
pub struct RunRequest<'a> {
    /// The skill's name.
    pub skill: &'a str,
    /// The skill's class.
    pub class: SkillClass,
    /// `"confirm": true` in the request.
    pub confirm: bool,
    /// How many approvals the request carries.
    pub approvals: usize,
}

/// Why a run is refused (403 `denied`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("uid {uid} may not run skill \"{skill}\": {reason}")]
pub struct Denied {
    /// The caller's uid.
    pub uid: u32,
    /// The skill.
    pub skill: String,
    /// Why.
    pub reason: String,
}

/// Decides whether `caller` may run `request`.
///
/// # Errors
///
/// [`Denied`] when the caller may not (never, until permission modes land).
pub fn authorize(caller: &Caller, request: &RunRequest<'_>) -> Result<(), Denied> {
    tracing::debug!(
        uid = caller.uid,
        skill = request.skill,
        class = %request.class,
        confirm = request.confirm,
        approvals = request.approvals,
        "run allowed (no permission modes configured)"
    );
    Ok(())
}

/// Returns true if and only if `caller` may see `skill` in tool listings.
pub fn may_list(_caller: &Caller, _skill: &str, _class: SkillClass) -> bool {
    true
}
