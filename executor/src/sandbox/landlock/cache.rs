//! Rulesets kept per run slot and taken again for a run of the same
//! inputs.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use policy::report::LandlockReport;

use super::paths::{ident, Ident, SystemPaths};
use super::{FsPolicy, Prepared};
use crate::config::LandlockMode;

/// Rulesets built for earlier runs in one slot (the run directory, `run::rundir`),
/// each with what it was built from; [`prepare`](super::prepare) takes one whose inputs are
/// the same instead of building anew. Building costs a `landlock_add_rule`
/// per path (~40), and closing the ruleset frees every rule again: ~3.5 %
/// of the host's CPU per run with 8 clients.
///
/// A ruleset is taken only when everything it was built from is the same:
/// the ABI, the mode, the rules (paths and rights, in order), the
/// snapshot of system paths (the very one: a stale snapshot is reopened
/// and a new one never matches), and, for every other path, the file it
/// names now (device, inode, type: `statx` per path) against the file the
/// ruleset's rule was added for (read off the descriptor the rule was
/// added with, so the key describes the ruleset exactly). Landlock rules
/// follow inodes; a path that names another file since, or none, misses.
/// The per-run directory is not among them: the rule grants beneath the
/// slot's home, which outlives its run directories.
#[derive(Debug, Default)]
pub struct Cache {
    /// Most recently used last.
    pub(super) entries: Vec<Cached>,
}

/// Rulesets kept per slot (one per policy run there lately).
pub(super) const CACHE_SIZE: usize = 4;

#[derive(Debug)]
pub(super) struct Cached {
    pub(super) abi: u32,
    pub(super) mode: LandlockMode,
    pub(super) policy: FsPolicy,
    pub(super) system: Arc<SystemPaths>,
    /// Per rule: the file an explicit rule's path named (`None`: none, or
    /// a system path).
    pub(super) idents: Vec<Option<Ident>>,
    /// The ruleset, above the descriptor floor (`host::fdtable`).
    pub(super) fd: OwnedFd,
    pub(super) report: LandlockReport,
    pub(super) degraded: Vec<String>,
}

impl Cache {
    /// A copy (below the floor, for the child) of a ruleset built from
    /// exactly these inputs, if any. The paths are looked at only when a
    /// ruleset of this policy is kept.
    pub(super) fn take(
        &mut self,
        abi: u32,
        mode: LandlockMode,
        policy: &FsPolicy,
        system: &Arc<SystemPaths>,
    ) -> Option<Prepared> {
        let same_policy = |c: &Cached| {
            c.abi == abi && c.mode == mode && Arc::ptr_eq(&c.system, system) && c.policy == *policy
        };
        if !self.entries.iter().any(same_policy) {
            return None;
        }
        // A rule that is not explicit is a system path ([`FsPolicy::new`]),
        // which the snapshot holds and `prepare` never records an identity
        // for: no lookup of it by path (~40 hashes of a path per run). Were
        // one not in the snapshot, `prepare` would have recorded its
        // identity, and this `None` would only miss.
        let idents: Vec<Option<Ident>> = policy
            .rules
            .iter()
            .map(|r| {
                if !r.explicit || r.pinned {
                    return None;
                }
                std::fs::metadata(&r.path).ok().map(|m| ident(&m))
            })
            .collect();
        let at = self.entries.iter().position(|c| same_policy(c) && c.idents == idents)?;
        let fd = self.entries[at].fd.try_clone().ok()?;
        let entry = self.entries.remove(at);
        let prepared = Prepared {
            fd: Some(fd),
            report: entry.report.clone(),
            degraded: entry.degraded.clone(),
            reused: true,
        };
        self.entries.push(entry);
        Some(prepared)
    }

    pub(super) fn keep(&mut self, entry: Cached) {
        if self.entries.len() >= CACHE_SIZE {
            self.entries.remove(0);
        }
        self.entries.push(entry);
    }
}
