//! The manifest's `sandbox` request, the operator's grant, and their meet.
//!
//! A manifest may ask for more than the default box (a read path, network,
//! another user, a capability, more memory or processes). It gets at most
//! what `executor.toml` grants that skill by name; asking for more is an
//! error naming the field, never a silently weaker or stronger run.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::limits::Limits;
use crate::name::SkillName;
use crate::path::is_within;

/// Linux capability names, in kernel number order (`CAP_CHOWN` = 0).
pub const CAPABILITY_NAMES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// Returns the kernel number of a capability name (`CAP_NET_RAW` → 13),
/// accepting the name with or without the `CAP_` prefix, any case.
pub fn capability_number(name: &str) -> Option<u8> {
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("CAP_") { upper } else { format!("CAP_{upper}") };
    CAPABILITY_NAMES.iter().position(|c| *c == full).and_then(|i| u8::try_from(i).ok())
}

/// Which processes a run sees in `/proc`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcView {
    /// Its own processes only (the default): a `/proc` that lists only
    /// what the run may `ptrace`, which its Landlock domain limits to its
    /// own tree.
    #[default]
    Own,
    /// The host's process table (an operator's `proc = "host"`, for
    /// process-listing skills; also what an executor that cannot hide it
    /// gives, said in the report's `degraded`).
    Host,
}

impl ProcView {
    /// The host's view (what an executor before per-run views reported).
    #[must_use]
    pub fn host() -> Self {
        ProcView::Host
    }

    /// The run's own view.
    #[must_use]
    pub fn is_own(&self) -> bool {
        *self == ProcView::Own
    }
}

/// What a manifest's `sandbox` object asks for. Empty = the default box.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SandboxRequest {
    /// Extra absolute paths to read (and execute) below.
    pub fs_read: Vec<PathBuf>,
    /// Extra absolute paths to write below.
    pub fs_write: Vec<PathBuf>,
    /// TCP/UDP networking.
    pub network: bool,
    /// Where the skill says it connects (`sandbox.network.connect`): what
    /// `validate` checks against the grant; the run gets the grant's list.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connect: Vec<crate::egress::Entry>,
    /// Run as this user instead of the executor's default.
    pub run_as: Option<String>,
    /// Capability numbers to keep (see [`CAPABILITY_NAMES`]).
    pub capabilities: Vec<u8>,
    /// Memory of the run in bytes, when it differs from the default.
    pub memory_bytes: Option<u64>,
    /// Process count of the run, when it differs from the default.
    pub max_pids: Option<u32>,
}

/// The executor's default `max_warm_total`: half its default
/// `max_concurrent_runs` (16), so warm runs never take most of the slots.
/// A grant's `warm` is at most the executor's `max_warm_total`.
pub const DEFAULT_MAX_WARM_TOTAL: usize = 8;

/// What `executor.toml` grants one skill (`[skills.NAME]`). Every field is
/// an upper bound on what the manifest may ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SkillGrant {
    /// The one manifest this grant is for: the absolute path of its
    /// `skill.json` or `SKILL.md`. A manifest anywhere else that declares
    /// this skill's name is refused, so a second file under the roots
    /// cannot take the name and its grants. Absent: any manifest that
    /// declares the name.
    pub manifest: Option<PathBuf>,
    /// Paths below which the manifest may ask to read.
    pub fs_read: Vec<PathBuf>,
    /// Paths below which the manifest may ask to write.
    pub fs_write: Vec<PathBuf>,
    /// Whether the manifest may ask for the network.
    pub network: bool,
    /// Where a networked run may connect; empty = every destination but
    /// the default refusals (loopback, link-local, the host's addresses).
    pub connect: Vec<crate::egress::Entry>,
    /// Whether a networked run may reach the resolvers of the host's
    /// `/etc/resolv.conf` on port 53 (nothing else on 53 unless listed).
    pub dns: bool,
    /// Users the manifest may ask to run as.
    pub run_as: Vec<String>,
    /// Capability names the manifest may ask to keep.
    pub capabilities: Vec<String>,
    /// Most memory the manifest may ask for, bytes.
    pub memory_bytes: Option<u64>,
    /// Most processes the manifest may ask for.
    pub max_pids: Option<u32>,
    /// An MCP pack's secrets: a root-owned file of mode 0600 with
    /// `NAME=VALUE` lines, read by the executor when it starts the server;
    /// only names in the pack's `env_allow` are passed. Never read from the
    /// manifest, never logged.
    pub env_file: Option<PathBuf>,
    /// Runs of this skill the executor keeps spawned ahead, boxed and
    /// blocked reading stdin (`serve` only; 0: none), at most the
    /// executor's `max_warm_total`.
    pub warm: u32,
    /// `"host"`: the skill's runs see the host's process table; default
    /// `"own"`, only their own processes.
    #[serde(skip_serializing_if = "ProcView::is_own")]
    pub proc: ProcView,
}

impl SkillGrant {
    /// Whether the grant holds together as the executor reads it: limits
    /// in range, the network fields ([`SkillGrant::check_network`]), a
    /// pinned manifest an absolute normal path to a `skill.json` or
    /// `SKILL.md`, capability names it knows. One check for both the
    /// executor's configuration and the grants `ongrid-skill up` is given.
    ///
    /// # Errors
    ///
    /// The reason, naming the field (to follow `[skills.NAME] `).
    pub fn check(&self) -> Result<(), String> {
        let limits = [
            self.memory_bytes.map(crate::limits::check_memory),
            self.max_pids.map(crate::limits::check_pids),
        ];
        if let Some(Err(e)) = limits.into_iter().flatten().find(Result::is_err) {
            return Err(e.to_string());
        }
        self.check_network()?;
        if let Some(pin) = &self.manifest {
            let bad = |why: String| format!("manifest: {why}");
            crate::path::absolute_normal(&pin.to_string_lossy()).map_err(|e| bad(e.to_string()))?;
            if !crate::path::is_manifest_path(pin) {
                return Err(bad(format!("{} is not a skill.json or SKILL.md", pin.display())));
            }
        }
        match self.capabilities.iter().find(|cap| capability_number(cap).is_none()) {
            Some(cap) => Err(format!("capabilities: unknown capability {cap:?}")),
            None => Ok(()),
        }
    }

    /// Whether its network fields stand together: `connect` and `dns`
    /// only narrow a grant of the network, so either without `network =
    /// true` would grant nothing while reading as a grant. Returns the
    /// reason when they do not.
    ///
    /// # Errors
    ///
    /// The reason, naming the field and the fix.
    pub fn check_network(&self) -> Result<(), String> {
        let without = |field: &str| {
            Err(format!(
                "{field} needs network = true: without it the skill gets no network at all"
            ))
        };
        match (self.network, self.connect.is_empty(), self.dns) {
            (false, false, _) => without("connect"),
            (false, true, true) => without("dns"),
            _ => Ok(()),
        }
    }
}

/// A path a run may read or write beyond the default box, as the manifest
/// wrote it, and the operator's paths it must still lie beneath once its
/// symlinks are followed: the grant covers the path as written, while a
/// Landlock rule follows links (a link an earlier run planted in a granted
/// directory would otherwise carry the rule outside it). Empty for a path
/// the grant names itself: where its links lead is the operator's choice.
/// Serialized as the path alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedPath {
    /// The path, as the manifest wrote it.
    pub path: PathBuf,
    /// The grant's paths that cover it (empty: the path is one of them).
    pub beneath: Vec<PathBuf>,
}

impl GrantedPath {
    /// A path the grant names itself.
    pub fn granted(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), beneath: Vec::new() }
    }

    /// `path` as covered by `grants` (each a list of the operator's paths).
    fn within(path: &Path, grants: &[&[PathBuf]]) -> Self {
        let all = || grants.iter().flat_map(|g| g.iter());
        let beneath = if all().any(|g| g == path) {
            Vec::new()
        } else {
            all().filter(|g| is_within(path, g)).cloned().collect()
        };
        Self { path: path.to_owned(), beneath }
    }
}

impl Serialize for GrantedPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.path.serialize(s)
    }
}

/// The sandbox a run actually gets: the request, checked against the grant,
/// with the operator's default limits filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantedSandbox {
    /// Extra read paths.
    pub fs_read: Vec<GrantedPath>,
    /// Extra write paths.
    pub fs_write: Vec<GrantedPath>,
    /// Networking allowed.
    pub network: bool,
    /// The grant's `connect` list (with `network`; empty = any destination
    /// but the default refusals).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connect: Vec<crate::egress::Entry>,
    /// The grant's `dns`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dns: bool,
    /// User to run as; `None` = the executor's configured default.
    pub run_as: Option<String>,
    /// Capability numbers kept.
    pub capabilities: Vec<u8>,
    /// Effective limits.
    pub limits: Limits,
    /// The grant's `proc`: the process table the run sees.
    #[serde(skip_serializing_if = "ProcView::is_own")]
    pub proc: ProcView,
}

/// A `sandbox` field asks for more than the operator grants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("skill \"{skill}\": sandbox.{field}: {reason}")]
pub struct GrantError {
    /// The skill.
    pub skill: String,
    /// The `sandbox` field at fault.
    pub field: &'static str,
    /// What was asked and what is granted.
    pub reason: String,
}

fn covered(p: &Path, granted: &[PathBuf]) -> bool {
    granted.iter().any(|g| is_within(p, g))
}

impl SandboxRequest {
    /// Checks this request against `grant` (absent = nothing beyond the
    /// default box) and fills in `defaults`.
    ///
    /// Asking for less than the defaults (a smaller memory or pid bound) is
    /// always allowed; asking for more needs the grant.
    ///
    /// # Errors
    ///
    /// [`GrantError`] naming the first field that asks for more than granted.
    pub fn authorize(
        &self,
        skill: &SkillName,
        grant: Option<&SkillGrant>,
        defaults: &Limits,
    ) -> Result<GrantedSandbox, GrantError> {
        let empty = SkillGrant::default();
        let grant = grant.unwrap_or(&empty);
        let deny = |field: &'static str, reason: String| GrantError {
            skill: skill.to_string(),
            field,
            reason: format!("{reason} (executor.toml [skills.{skill}] does not grant it)"),
        };
        for p in &self.fs_read {
            if !covered(p, &grant.fs_read) && !covered(p, &grant.fs_write) {
                return Err(deny("fs_read", format!("read access to {} asked", p.display())));
            }
        }
        for p in &self.fs_write {
            if !covered(p, &grant.fs_write) {
                return Err(deny("fs_write", format!("write access to {} asked", p.display())));
            }
        }
        if self.network && !grant.network {
            return Err(deny("network", "network access asked".to_owned()));
        }
        if let Some(user) = &self.run_as {
            if !grant.run_as.iter().any(|u| u == user) {
                return Err(deny("run_as", format!("running as {user:?} asked")));
            }
        }
        for &cap in &self.capabilities {
            let allowed = grant.capabilities.iter().any(|g| capability_number(g) == Some(cap));
            if !allowed {
                let name = CAPABILITY_NAMES.get(usize::from(cap)).copied().unwrap_or("CAP_?");
                return Err(deny("capabilities", format!("{name} asked")));
            }
        }
        let mut limits = defaults.clone();
        if let Some(m) = self.memory_bytes {
            if m > defaults.memory_bytes && grant.memory_bytes.is_none_or(|g| m > g) {
                return Err(deny(
                    "memory_bytes",
                    format!("{m} bytes asked, default {}", defaults.memory_bytes),
                ));
            }
            limits.memory_bytes = m;
        }
        if let Some(p) = self.max_pids {
            if p > defaults.max_pids && grant.max_pids.is_none_or(|g| p > g) {
                return Err(deny(
                    "max_pids",
                    format!("{p} processes asked, default {}", defaults.max_pids),
                ));
            }
            limits.max_pids = p;
        }
        Ok(GrantedSandbox {
            fs_read: (self.fs_read.iter())
                .map(|p| GrantedPath::within(p, &[&grant.fs_read, &grant.fs_write]))
                .collect(),
            fs_write: (self.fs_write.iter())
                .map(|p| GrantedPath::within(p, &[&grant.fs_write]))
                .collect(),
            network: self.network,
            connect: if self.network { grant.connect.clone() } else { Vec::new() },
            dns: self.network && grant.dns,
            run_as: self.run_as.clone(),
            capabilities: self.capabilities.clone(),
            limits,
            proc: grant.proc,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill() -> SkillName {
        SkillName::new("probe").unwrap()
    }

    #[test]
    fn capability_numbers() {
        assert_eq!(capability_number("CAP_CHOWN"), Some(0));
        assert_eq!(capability_number("net_raw"), Some(13));
        assert_eq!(capability_number("CAP_CHECKPOINT_RESTORE"), Some(40));
        assert_eq!(capability_number("CAP_NOPE"), None);
    }

    #[test]
    fn connect_or_dns_without_network_is_refused() {
        let connect = vec!["127.0.0.1:80".parse().unwrap()];
        let g = SkillGrant { connect: connect.clone(), ..Default::default() };
        assert!(g.check_network().unwrap_err().starts_with("connect needs network = true"));
        let g = SkillGrant { dns: true, ..Default::default() };
        assert!(g.check_network().unwrap_err().starts_with("dns needs network = true"));
        let g = SkillGrant { network: true, connect, dns: true, ..Default::default() };
        assert_eq!(g.check_network(), Ok(()));
        assert_eq!(SkillGrant::default().check_network(), Ok(()));
    }

    #[test]
    fn empty_request_needs_no_grant() {
        let g = SandboxRequest::default().authorize(&skill(), None, &Limits::default()).unwrap();
        assert!(!g.network && g.fs_read.is_empty() && g.capabilities.is_empty());
        assert_eq!(g.proc, ProcView::Own, "by default a run sees only its own processes");
        assert_eq!(g.limits, Limits::default());
    }

    #[test]
    fn each_field_needs_its_grant() {
        let d = Limits::default();
        let cases: Vec<(SandboxRequest, &str)> = vec![
            (SandboxRequest { fs_read: vec!["/var/log".into()], ..Default::default() }, "fs_read"),
            (
                SandboxRequest { fs_write: vec!["/var/tmp".into()], ..Default::default() },
                "fs_write",
            ),
            (SandboxRequest { network: true, ..Default::default() }, "network"),
            (SandboxRequest { run_as: Some("root".into()), ..Default::default() }, "run_as"),
            (SandboxRequest { capabilities: vec![13], ..Default::default() }, "capabilities"),
            (
                SandboxRequest { memory_bytes: Some(d.memory_bytes + 1), ..Default::default() },
                "memory_bytes",
            ),
            (SandboxRequest { max_pids: Some(d.max_pids + 1), ..Default::default() }, "max_pids"),
        ];
        for (req, field) in cases {
            let e = req.authorize(&skill(), None, &d).unwrap_err();
            assert_eq!(e.field, field);
            assert!(
                e.to_string().starts_with(&format!("skill \"probe\": sandbox.{field}: ")),
                "{e}"
            );
        }
    }

    #[test]
    fn grant_allows_up_to_its_bound() {
        let d = Limits::default();
        let grant = SkillGrant {
            manifest: None,
            fs_read: vec!["/var/log".into()],
            fs_write: vec!["/srv/out".into()],
            network: true,
            connect: vec!["127.0.0.1:8080".parse().unwrap()],
            dns: true,
            run_as: vec!["root".into()],
            capabilities: vec!["net_raw".into()],
            memory_bytes: Some(1 << 30),
            max_pids: Some(128),
            env_file: None,
            warm: 0,
            proc: ProcView::Host,
        };
        let req = SandboxRequest {
            fs_read: vec!["/var/log/syslog".into(), "/srv/out/x".into()],
            fs_write: vec!["/srv/out".into()],
            network: true,
            connect: vec!["10.0.0.1:443".parse().unwrap()],
            run_as: Some("root".into()),
            capabilities: vec![13],
            memory_bytes: Some(1 << 30),
            max_pids: Some(128),
        };
        let g = req.authorize(&skill(), Some(&grant), &d).unwrap();
        assert_eq!(g.connect, grant.connect, "the run gets the grant's list, never the manifest's");
        // A path below a grant must stay below it once its links are
        // followed; a path the grant names is the operator's own.
        let beneath = |p: &GrantedPath| (p.path.clone(), p.beneath.clone());
        assert_eq!(
            g.fs_read.iter().map(beneath).collect::<Vec<_>>(),
            [
                ("/var/log/syslog".into(), vec![PathBuf::from("/var/log")]),
                ("/srv/out/x".into(), vec![PathBuf::from("/srv/out")]),
            ]
        );
        assert_eq!(g.fs_write, [GrantedPath::granted("/srv/out")]);
        assert_eq!(
            serde_json::to_value(&g.fs_read).unwrap(),
            serde_json::json!(["/var/log/syslog", "/srv/out/x"])
        );
        assert!(g.dns);
        assert_eq!(g.proc, ProcView::Host, "the grant's process table view");
        let quiet = SandboxRequest::default().authorize(&skill(), Some(&grant), &d).unwrap();
        assert!(quiet.connect.is_empty() && !quiet.dns, "no network asked: no list");
        assert_eq!(g.limits.memory_bytes, 1 << 30);
        assert_eq!(g.limits.max_pids, 128);
        let over = SandboxRequest { memory_bytes: Some((1 << 30) + 1), ..Default::default() };
        assert_eq!(over.authorize(&skill(), Some(&grant), &d).unwrap_err().field, "memory_bytes");
        let sibling =
            SandboxRequest { fs_read: vec!["/var/log-evil".into()], ..Default::default() };
        assert_eq!(sibling.authorize(&skill(), Some(&grant), &d).unwrap_err().field, "fs_read");
    }

    #[test]
    fn tightening_is_always_allowed() {
        let req =
            SandboxRequest { memory_bytes: Some(1 << 20), max_pids: Some(2), ..Default::default() };
        let g = req.authorize(&skill(), None, &Limits::default()).unwrap();
        assert_eq!((g.limits.memory_bytes, g.limits.max_pids), (1 << 20, 2));
    }
}
