//! Who may run what: callers, permission modes,
//! the class gate and dual-sign approvals.
//!
//! # Who is calling
//!
//! The kernel says (`SO_PEERCRED` at `connect()`, [`Caller`]), never the
//! request. The socket is the first gate: its mode (`socket_mode`, 0660)
//! and group (`socket_group`) decide who may connect at all. Then
//! [`Authz::identify`] maps the caller to an [`Identity`] (role, mode, may
//! read the audit) with the `[[callers]]` of `skilld.toml`:
//!
//! 1. the first `uid`/`user` entry equal to the peer's uid;
//! 2. else the first `gid`/`group` entry equal to the peer's primary gid;
//! 3. else the first `gid`/`group` entry equal to one of its supplementary
//!    groups, read from the `Groups:` line of `/proc/<pid>/status`;
//! 4. else role `unmapped`, mode `read-only`.
//!
//! Step 3 races: the kernel gives the peer's pid at `connect()` time, and
//! by the time `/proc` is read the process may have exited and its pid
//! been reused. The `Uid:` line (real and effective) of the process read
//! must equal the peer's uid or the supplementary groups are ignored, so a
//! recycled pid can only lend the groups of another process of the same
//! user (not of anyone else). Prefer uid and primary-gid entries where it
//! matters; supplementary groups can also change after `connect()`
//! (`newgrp`), which this sees, unlike the credentials of the socket.
//!
//! # The gate
//!
//! [`Authz::decide`]: `safe` for everyone; `mutating` needs
//! `mutating-with-confirm` or `dual-sign-required` and `"confirm": true`;
//! `dangerous` needs `dual-sign-required` and two approvals from two
//! distinct configured approver keys ([`policy::approval::verify`]),
//! each used once ([`crate::daemon::replay`]). A refusal is a [`Denied`] with a
//! [`DenyReason`] code (the 403's `reason`); every decision, either way, is
//! written to the audit trail by the handler.
//!
//! Listings ([`Authz::may_list`]) show only what the caller may run: the
//! classes its mode permits, and `dangerous` only when at least two
//! approvers are configured (else nothing could run it).

use std::sync::Arc;

use policy::approval::{self, Approval, Approver, Subject, Verified, REQUIRED_APPROVALS};
use policy::permission::{gate, Gate};
use policy::{DenyReason, PermissionMode, SkillClass};
use serde_json::Value;

use crate::daemon::config::{CallerRule, Principal, Settings};
use crate::daemon::connection::Caller;
use crate::daemon::replay::{ReplayStore, Reservation};

/// The role of callers no `[[callers]]` entry matches.
pub const UNMAPPED_ROLE: &str = "unmapped";

/// A caller as the permission rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The peer's uid.
    pub uid: u32,
    /// The peer's primary gid.
    pub gid: u32,
    /// The peer's pid (for logs and the audit; it can be recycled).
    pub pid: Option<i32>,
    /// The role of the matching entry, or [`UNMAPPED_ROLE`].
    pub role: String,
    /// The permission mode.
    pub mode: PermissionMode,
    /// May read the audit trail.
    pub audit: bool,
}

/// What the caller asks for, as far as permission is concerned.
#[derive(Debug, Clone, Copy)]
pub struct RunRequest<'a> {
    /// The skill's name.
    pub skill: &'a str,
    /// The skill's class.
    pub class: SkillClass,
    /// The args (approvals are signed over their text).
    pub args: &'a policy::Args,
    /// The request's session id.
    pub session_id: Option<&'a str>,
    /// `"confirm": true` in the request.
    pub confirm: bool,
    /// The approvals, as sent.
    pub approvals: &'a [Value],
}

/// Why a run is refused (403 `denied`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("uid {uid} ({mode}) may not run skill \"{skill}\": {reason}: {message}")]
pub struct Denied {
    /// The caller's uid.
    pub uid: u32,
    /// The caller's mode.
    pub mode: PermissionMode,
    /// The skill.
    pub skill: String,
    /// The reason code.
    pub reason: DenyReason,
    /// What is wrong.
    pub message: String,
}

/// A run allowed: why, and the approvals it uses (reserved until the
/// handler records the run and calls [`Grant::keep`]).
#[derive(Debug)]
pub struct Grant {
    /// `safe`, `confirmed` or `dual_signed`.
    pub reason: &'static str,
    /// The approvals checked (empty unless `dangerous`).
    pub approvals: Vec<Verified>,
    reservation: Option<Reservation>,
}

impl Grant {
    /// The approvals stay used (the run was recorded or goes ahead
    /// unaudited). Dropping a grant instead releases them.
    pub fn keep(mut self) {
        if let Some(r) = self.reservation.take() {
            r.keep();
        }
    }
}

/// The permission rules of the daemon.
#[derive(Debug)]
pub struct Authz {
    callers: Vec<CallerRule>,
    approvers: Vec<Approver>,
    max_ttl: u64,
    replay: Arc<ReplayStore>,
}

impl Authz {
    /// The rules of `settings`, with an empty replay store.
    pub fn new(settings: &Settings) -> Self {
        Self {
            callers: settings.callers.clone(),
            approvers: settings.approvers.clone(),
            max_ttl: settings.approval_max_ttl,
            replay: Arc::new(ReplayStore::default()),
        }
    }

    /// The replay store.
    pub fn replay(&self) -> &ReplayStore {
        &self.replay
    }

    /// The configured approvers.
    pub fn approvers(&self) -> &[Approver] {
        &self.approvers
    }

    /// Maps `caller` to its identity (see the module docs).
    pub fn identify(&self, caller: &Caller) -> Identity {
        let by = |who: Principal| self.callers.iter().find(|r| r.who == who);
        let rule = by(Principal::Uid(caller.uid)).or_else(|| by(Principal::Gid(caller.gid)));
        let rule = rule.or_else(|| {
            if !self.callers.iter().any(|r| matches!(r.who, Principal::Gid(_))) {
                return None;
            }
            let groups = caller.pid.map(|pid| supplementary_groups(pid, caller.uid))?;
            self.callers.iter().find(|r| match r.who {
                Principal::Gid(g) => groups.contains(&g),
                Principal::Uid(_) => false,
            })
        });
        let (role, mode, audit) = match rule {
            Some(r) => (r.role.clone(), r.mode, r.audit),
            None => (UNMAPPED_ROLE.to_owned(), PermissionMode::ReadOnly, false),
        };
        Identity { uid: caller.uid, gid: caller.gid, pid: caller.pid, role, mode, audit }
    }

    /// Returns true if and only if `who` may see a skill of `class` in
    /// listings.
    pub fn may_list(&self, who: &Identity, class: SkillClass) -> bool {
        who.mode.permits(class)
            && (class != SkillClass::Dangerous || self.approvers.len() >= REQUIRED_APPROVALS)
    }

    /// Returns true if and only if `who` may read the audit trail: root,
    /// or a `[[callers]]` entry with `audit = true`.
    pub fn may_read_audit(&self, who: &Identity) -> bool {
        who.uid == 0 || who.audit
    }

    /// Returns true if and only if `who` may make the daemon rescan its
    /// roots (`POST /v1/reload`): root, the daemon's own user, or a caller
    /// whose mode goes beyond `read-only`. Read-only and unmapped callers
    /// may not make the daemon do a full scan on demand.
    pub fn may_reload(&self, who: &Identity, daemon_uid: u32) -> bool {
        who.uid == 0 || who.uid == daemon_uid || who.mode != PermissionMode::ReadOnly
    }

    /// Decides whether `who` may run `request` at `now` (unix seconds).
    /// Approvals of an allowed `dangerous` run are reserved in the replay
    /// store (see [`Grant`]).
    ///
    /// # Errors
    ///
    /// [`Denied`] with the reason.
    pub fn decide(
        &self,
        who: &Identity,
        request: &RunRequest<'_>,
        now: u64,
    ) -> Result<Grant, Denied> {
        let deny = |reason: DenyReason, message: String| Denied {
            uid: who.uid,
            mode: who.mode,
            skill: request.skill.to_owned(),
            reason,
            message,
        };
        let opened = gate(who.mode, request.class, request.confirm).map_err(|reason| {
            let message = match reason {
                DenyReason::ConfirmRequired => {
                    "skill is mutating: send \"confirm\": true to run it (ongrid-skill run --confirm)".to_owned()
                }
                _ => format!("mode {} does not permit {} skills", who.mode, request.class),
            };
            deny(reason, message)
        })?;
        if opened == Gate::Open {
            let reason = if request.class == SkillClass::Safe { "safe" } else { "confirmed" };
            return Ok(Grant { reason, approvals: Vec::new(), reservation: None });
        }
        let mut approvals = Vec::with_capacity(request.approvals.len());
        for (i, v) in request.approvals.iter().enumerate() {
            let a: Approval = serde_json::from_value(v.clone()).map_err(|e| {
                deny(
                    DenyReason::ApprovalMalformed,
                    format!("approval {i}: {e} (want {{\"key_id\",\"expires_at\",\"signature\"}})"),
                )
            })?;
            approvals.push(a);
        }
        let subject =
            Subject { skill: request.skill, args: request.args, session_id: request.session_id };
        let verified = approval::verify(&approvals, &self.approvers, &subject, now, self.max_ttl)
            .map_err(|r| deny(r.reason, r.message))?;
        let reservation = self.replay.reserve(&verified, now).map_err(|key_id| {
            deny(
                DenyReason::ApprovalReplayed,
                format!("the approval of key {key_id} was already used; approvals count once"),
            )
        })?;
        Ok(Grant { reason: "dual_signed", approvals: verified, reservation: Some(reservation) })
    }
}

/// The supplementary groups of `pid`, if its `Uid:` line (real and
/// effective) is still `uid`; empty otherwise.
fn supplementary_groups(pid: i32, uid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    parse_status_groups(&status, uid)
}

/// The `Groups:` of a `/proc/<pid>/status` text whose real and effective
/// uids are `uid`.
fn parse_status_groups(status: &str, uid: u32) -> Vec<u32> {
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).map(|rest| {
            rest.split_whitespace().filter_map(|n| n.parse::<u32>().ok()).collect::<Vec<u32>>()
        })
    };
    let same_user =
        field("Uid:").is_some_and(|ids| ids.len() >= 2 && ids[0] == uid && ids[1] == uid);
    if !same_user {
        return Vec::new();
    }
    field("Groups:").unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use policy::approval::SecretKey;
    use serde_json::json;

    use super::*;
    use crate::daemon::config::{FileConfig, Overrides};

    fn authz(extra: &str) -> Authz {
        let a = SecretKey::from_seed([1; 32]).public_key();
        let b = SecretKey::from_seed([2; 32]).public_key();
        let text = format!(
            "[[callers]]\nuid = 1000\nrole = \"ops\"\nmode = \"dual-sign-required\"\naudit = true\n\
             [[callers]]\ngid = 2000\nrole = \"devs\"\nmode = \"mutating-with-confirm\"\n\
             [[callers]]\ngid = 3000\nrole = \"others\"\nmode = \"read-only\"\n\
             [[approvers]]\nname = \"alice\"\npublic_key = \"{a}\"\n\
             [[approvers]]\nname = \"bob\"\npublic_key = \"{b}\"\n{extra}"
        );
        let s = FileConfig::parse(&text, std::path::Path::new("t"))
            .unwrap()
            .resolve(Overrides::default(), vec![])
            .unwrap();
        Authz::new(&s)
    }

    fn caller(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, pid: None }
    }

    #[test]
    fn uid_then_primary_gid_then_unmapped() {
        let z = authz("");
        let ops = z.identify(&caller(1000, 2000));
        assert_eq!(
            (ops.role.as_str(), ops.mode, ops.audit),
            ("ops", PermissionMode::DualSignRequired, true)
        );
        let dev = z.identify(&caller(1001, 2000));
        assert_eq!((dev.role.as_str(), dev.mode), ("devs", PermissionMode::MutatingWithConfirm));
        let nobody = z.identify(&caller(65534, 65534));
        assert_eq!((nobody.role.as_str(), nobody.mode), (UNMAPPED_ROLE, PermissionMode::ReadOnly));
        assert!(!z.may_read_audit(&nobody));
        assert!(z.may_read_audit(&z.identify(&caller(0, 0))));
        assert!(z.may_list(&ops, SkillClass::Dangerous));
        assert!(!z.may_list(&dev, SkillClass::Dangerous));
        assert!(z.may_list(&dev, SkillClass::Mutating));
        assert!(!z.may_list(&nobody, SkillClass::Mutating));
    }

    #[test]
    fn supplementary_groups_need_the_same_user() {
        let status =
            "Name:\tbash\nUid:\t1001\t1001\t1001\t1001\nGid:\t1\t1\t1\t1\nGroups:\t4 3000 2000 \n";
        assert_eq!(parse_status_groups(status, 1001), [4, 3000, 2000]);
        assert!(parse_status_groups(status, 1002).is_empty());
        assert!(parse_status_groups("Groups:\t1\n", 0).is_empty());
        // This test process: its own groups, by its own pid.
        let me = nix::unistd::getuid().as_raw();
        let pid = i32::try_from(std::process::id()).unwrap();
        let mine = supplementary_groups(pid, me);
        let groups: Vec<u32> =
            nix::unistd::getgroups().unwrap().iter().map(|g| g.as_raw()).collect();
        assert_eq!(mine, groups);
    }

    #[test]
    fn gates_and_approvals() {
        let z = authz("");
        let ops = z.identify(&caller(1000, 1));
        let dev = z.identify(&caller(1001, 2000));
        let args = policy::Args::from_slice(br#"{"n": 1}"#).unwrap();
        let req = |class, confirm, approvals: &'static [Value]| RunRequest {
            skill: "s",
            class,
            args: &args,
            session_id: Some("x"),
            confirm,
            approvals,
        };
        let reason = |who: &Identity, r: RunRequest<'_>| {
            z.decide(who, &r, 1000).map(|g| g.reason).map_err(|d| d.reason)
        };
        assert_eq!(reason(&dev, req(SkillClass::Safe, false, &[])), Ok("safe"));
        assert_eq!(
            reason(&dev, req(SkillClass::Mutating, false, &[])),
            Err(DenyReason::ConfirmRequired)
        );
        assert_eq!(reason(&dev, req(SkillClass::Mutating, true, &[])), Ok("confirmed"));
        assert_eq!(
            reason(&dev, req(SkillClass::Dangerous, true, &[])),
            Err(DenyReason::ClassNotPermitted)
        );
        assert_eq!(
            reason(&ops, req(SkillClass::Dangerous, false, &[])),
            Err(DenyReason::ApprovalsRequired)
        );

        let subject = Subject { skill: "s", args: &args, session_id: Some("x") };
        let sign = |seed: u8| {
            serde_json::to_value(SecretKey::from_seed([seed; 32]).approve(&subject, 1500)).unwrap()
        };
        let approvals = vec![sign(1), sign(2)];
        let r = RunRequest { approvals: &approvals, ..req(SkillClass::Dangerous, false, &[]) };
        let grant = z.decide(&ops, &r, 1000).unwrap();
        assert_eq!(grant.reason, "dual_signed");
        assert_eq!(grant.approvals.len(), 2);
        // Reserved while the grant lives: a concurrent replay is refused.
        assert_eq!(z.decide(&ops, &r, 1000).unwrap_err().reason, DenyReason::ApprovalReplayed);
        drop(grant);
        z.decide(&ops, &r, 1000).unwrap().keep();
        let e = z.decide(&ops, &r, 1001).unwrap_err();
        assert_eq!(e.reason, DenyReason::ApprovalReplayed);
        assert!(e.to_string().contains("approval_replayed"), "{e}");
        let bad = vec![json!({"key_id": 1}), sign(2)];
        let r = RunRequest { approvals: &bad, ..r };
        assert_eq!(z.decide(&ops, &r, 1000).unwrap_err().reason, DenyReason::ApprovalMalformed);
    }
}
