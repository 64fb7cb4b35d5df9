//! The ruleset built for a run's [`FsPolicy`], or taken from its slot's
//! cache when built from the same inputs before.

use std::os::fd::{AsFd, OwnedFd};

use landlock::{
    AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};
use policy::report::LandlockReport;
use policy::Enforcement;

use super::cache::{Cache, Cached};
use super::paths::{open_path, outside, Ident, SystemPaths};
use super::{fs, fs_handled, net_handled, scopes, FsPolicy, LandlockError, Prepared, FULL_ABI};
use crate::config::LandlockMode;
use crate::host;

/// Builds the ruleset for `policy` on a kernel with Landlock `abi`.
///
/// # Errors
///
/// [`LandlockError`] when `mode` is required and the ABI 1 rights cannot be
/// enforced; in best-effort mode every shortfall is a `degraded` line.
pub fn prepare(
    abi: u32,
    mode: LandlockMode,
    policy: &FsPolicy,
    mut cache: Option<&mut Cache>,
) -> Result<Prepared, LandlockError> {
    let mut degraded = Vec::new();
    let none = |degraded: Vec<String>| Prepared {
        fd: None,
        report: LandlockReport { abi, status: Enforcement::None, net: false, scoped: false },
        degraded,
        reused: false,
    };
    if abi == 0 {
        if mode == LandlockMode::Required {
            return Err(LandlockError::Unsupported);
        }
        degraded.push("landlock: not supported by the kernel; no filesystem restriction".into());
        return Ok(none(degraded));
    }
    let system = SystemPaths::current();
    if let Some(hit) = cache.as_mut().and_then(|c| c.take(abi, mode, policy, &system)) {
        return Ok(hit);
    }
    let handled = fs_handled(abi);
    let net = if policy.network { BitFlags::EMPTY } else { net_handled(abi) };
    let scoped = scopes(abi);
    let mut idents = vec![None; policy.rules.len()];
    let built = build(mode, (handled, net, scoped), policy, &system, &mut idents, &mut degraded);
    let fd = match built {
        Ok(fd) => fd,
        Err(e) if mode == LandlockMode::Required => return Err(e),
        Err(e) => {
            degraded.push(format!("{e}; no filesystem restriction"));
            return Ok(none(degraded));
        }
    };
    let status = if abi >= FULL_ABI { Enforcement::Full } else { Enforcement::Partial };
    if abi < FULL_ABI {
        degraded.push(format!(
            "landlock: kernel ABI {abi} < {FULL_ABI}: {}",
            missing_rights(abi).join(", ")
        ));
    }
    let report = LandlockReport { abi, status, net: !net.is_empty(), scoped: !scoped.is_empty() };
    if let Some(cache) = cache {
        if let Ok(kept) = fd.try_clone() {
            cache.keep(Cached {
                abi,
                mode,
                policy: policy.clone(),
                system,
                idents,
                fd: host::fdtable::lift(kept),
                report: report.clone(),
                degraded: degraded.clone(),
            });
        }
    }
    Ok(Prepared { fd: Some(fd), report, degraded, reused: false })
}

/// Creates the ruleset (hard requirement or best effort, as `mode` says)
/// and adds a `PathBeneath` rule per path of `policy` that exists, over
/// the `O_PATH` descriptor the snapshot holds or one opened now. Records
/// the file each explicit rule was added for in `idents`.
fn build(
    mode: LandlockMode,
    (handled, net, scoped): (BitFlags<AccessFs>, BitFlags<AccessNet>, BitFlags<Scope>),
    policy: &FsPolicy,
    system: &SystemPaths,
    idents: &mut [Option<Ident>],
    degraded: &mut Vec<String>,
) -> Result<OwnedFd, LandlockError> {
    let level = match mode {
        LandlockMode::Required => CompatLevel::HardRequirement,
        LandlockMode::BestEffort => CompatLevel::BestEffort,
    };
    let create = || {
        let mut ruleset = Ruleset::default().set_compatibility(level).handle_access(handled)?;
        if !net.is_empty() {
            ruleset = ruleset.handle_access(net)?;
        }
        if !scoped.is_empty() {
            ruleset = ruleset.scope(scoped)?;
        }
        ruleset.create()
    };
    let mut ruleset = create().map_err(LandlockError::Create)?;
    for (rule, ident) in policy.rules.iter().zip(idents.iter_mut()) {
        let opened;
        let (fd, is_dir) = match system.get(rule) {
            Some(Some(cached)) => (cached.fd.as_fd(), cached.is_dir),
            Some(None) => continue, // a system path this host lacks
            None => match open_path(&rule.path) {
                Ok(o) => {
                    opened = o;
                    if !rule.pinned {
                        *ident = opened.ident;
                    }
                    let escape = (!rule.beneath.is_empty())
                        .then(|| outside(&opened, &rule.beneath))
                        .flatten();
                    if let Some(why) = escape {
                        degraded
                            .push(format!("landlock: {} not granted: {why}", rule.path.display()));
                        continue;
                    }
                    (opened.fd.as_fd(), opened.is_dir)
                }
                Err(e) => {
                    if rule.explicit {
                        degraded
                            .push(format!("landlock: {} not granted: {e}", rule.path.display()));
                    }
                    continue;
                }
            },
        };
        let mut access = rule.access & handled;
        if !is_dir {
            access &= fs::FILE;
        }
        if access.is_empty() {
            continue;
        }
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|source| LandlockError::AddRule { path: rule.path.clone(), source })?;
    }
    // The kernel knows every handled right (they are masked to its ABI),
    // so the crate always creates a ruleset here.
    Option::<OwnedFd>::from(ruleset).ok_or(LandlockError::Unsupported)
}

/// Names of the rights an older ABI cannot enforce.
pub(super) fn missing_rights(abi: u32) -> Vec<&'static str> {
    [
        (2, "no cross-directory link/rename restriction (REFER)"),
        (3, "no truncate restriction"),
        (4, "no TCP bind/connect restriction (seccomp still denies non-Unix sockets)"),
        (5, "no device ioctl restriction"),
        (6, "no signal or abstract Unix socket scoping"),
    ]
    .into_iter()
    .filter(|(needed, _)| abi < *needed)
    .map(|(_, what)| what)
    .collect()
}
