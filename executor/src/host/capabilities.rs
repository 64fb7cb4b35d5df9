//! The executor's own capabilities: at start, as root, every capability it
//! does not need leaves the bounding, permitted, effective, inheritable and
//! ambient sets, whether or not systemd dropped it already.
//!
//! Capabilities are per thread and a thread inherits its creator's, so the
//! drop happens before the executor starts any thread or child (the
//! watchdog, the runtime's workers, the spawners). A skill can only ever
//! receive what the executor keeps, so every capability `executor.toml`
//! grants to a skill is kept too; a grant added by a later reload cannot be
//! given back (restart the executor).

use std::collections::HashSet;

use caps::{CapSet, Capability, CapsHashSet};

use crate::config::Config;

/// What the executor itself uses, each with the reason.
pub const NEEDED: &[Capability] = &[
    // setresuid to the run-as user in each child.
    Capability::CAP_SETUID,
    // setresgid and setgroups (clearing supplementary groups) in each child.
    Capability::CAP_SETGID,
    // chown of each per-run directory and of the socket.
    Capability::CAP_CHOWN,
    // Removing a finished run's files owned by the run-as user, whatever
    // modes the skill left on them.
    Capability::CAP_DAC_OVERRIDE,
    // The same through sticky directories and for chmod of the run-as
    // user's files before removal.
    Capability::CAP_FOWNER,
    // Killing runs (and a dead executor's leftovers) of the run-as user.
    Capability::CAP_KILL,
    // PR_CAPBSET_DROP of each skill's bounding set (and of this process's,
    // below); without it every run fails with sandbox_failed.
    Capability::CAP_SETPCAP,
    // Mounting and resizing the runs tmpfs when systemd did not mount one,
    // remounting cgroup hierarchies with favordynmods, making the runs'
    // mount namespace and its /proc, and joining it (`setns`).
    Capability::CAP_SYS_ADMIN,
    // Joining the runs' mount namespace: `setns` asks for it too.
    Capability::CAP_SYS_CHROOT,
    // Each child sets its run's rlimits as root before it switches user: a
    // limit above the executor's own hard limit needs it.
    Capability::CAP_SYS_RESOURCE,
    // Loading the egress filters (cgroup BPF programs).
    Capability::CAP_BPF,
    // Attaching the egress filters to each run's cgroup.
    Capability::CAP_NET_ADMIN,
    // Reading the audit records of the runs' refusals (the multicast
    // group of every record), for their reports' `sandbox.denials`.
    Capability::CAP_AUDIT_READ,
    // Matching an audit record to its run by the process's
    // /proc/<pid>/cgroup, which a /proc mounted hidepid=invisible (the
    // unit's ProtectProc=invisible) shows root only with it. Kept only
    // where the unit's bounding set has it (the denials drop-in).
    Capability::CAP_SYS_PTRACE,
    // Setting a cold run's policy back on a warm run's threads (the run-as
    // user's), made and waiting at SCHED_IDLE, when a request takes it (or
    // before it is killed unused). Without it warm runs are made and wait
    // at a cold run's policy.
    Capability::CAP_SYS_NICE,
    // Reading the audit status, and enabling it with
    // `report_denials = "on"` (restored at exit).
    Capability::CAP_AUDIT_CONTROL,
];

/// Why the drop failed.
#[derive(Debug, thiserror::Error)]
pub enum CapabilitiesError {
    /// A capability name in `executor.toml` the `caps` crate does not know.
    #[error("capability {0:?} is unknown")]
    Unknown(String),
    /// A `capget`/`capset`/`prctl` call failed.
    #[error("dropping capabilities ({set}): {source}")]
    Drop {
        /// The set being changed.
        set: &'static str,
        /// The error of the call.
        source: caps::errors::CapsError,
    },
}

/// [`NEEDED`] plus every capability `config` grants to any skill.
///
/// # Errors
///
/// [`CapabilitiesError::Unknown`] for a name the `caps` crate cannot parse
/// (the configuration's own check accepts only known names).
pub fn kept(config: &Config) -> Result<CapsHashSet, CapabilitiesError> {
    let mut keep: CapsHashSet = NEEDED.iter().copied().collect();
    for grant in config.skills.values() {
        for name in &grant.capabilities {
            let canonical = caps::to_canonical(name);
            let cap = canonical.parse().map_err(|_| CapabilitiesError::Unknown(name.clone()))?;
            keep.insert(cap);
        }
    }
    Ok(keep)
}

/// Drops every capability outside [`kept`] from the calling thread's five
/// sets. Call it before any thread exists. Does nothing unless running as
/// root (an unprivileged executor has nothing to drop).
///
/// # Errors
///
/// [`CapabilitiesError`] when a set cannot be changed.
pub fn drop_unneeded(config: &Config) -> Result<(), CapabilitiesError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let keep = kept(config)?;
    let fail = |set| move |source| CapabilitiesError::Drop { set, source };
    // The bounding set first: dropping from it needs CAP_SETPCAP, which
    // is still effective here.
    for cap in caps::runtime::thread_all_supported() {
        if !keep.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap).map_err(fail("bounding"))?;
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(fail("ambient"))?;
    caps::clear(None, CapSet::Inheritable).map_err(fail("inheritable"))?;
    let permitted = caps::read(None, CapSet::Permitted).map_err(fail("permitted"))?;
    let left: HashSet<Capability> = permitted.intersection(&keep).copied().collect();
    // Effective before permitted: effective may never exceed permitted.
    caps::set(None, CapSet::Effective, &left).map_err(fail("effective"))?;
    caps::set(None, CapSet::Permitted, &left).map_err(fail("permitted"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_set_is_the_needed_list_plus_every_grant() {
        let mut config = Config::default();
        assert_eq!(kept(&config).unwrap(), NEEDED.iter().copied().collect::<CapsHashSet>());
        let toml = "[skills.ping]\ncapabilities = [\"CAP_NET_RAW\", \"net_bind_service\"]\n";
        config = Config::parse(toml, std::path::Path::new("executor.toml")).unwrap();
        let keep = kept(&config).unwrap();
        assert!(keep.contains(&Capability::CAP_NET_RAW), "{keep:?}");
        assert!(keep.contains(&Capability::CAP_NET_BIND_SERVICE), "{keep:?}");
        assert_eq!(keep.len(), NEEDED.len() + 2, "{keep:?}");
    }
}
