//! The Landlock ruleset of a run: which paths get which rights, per ABI.
//!
//! Built in the parent with the `landlock` crate (paths opened `O_PATH`,
//! a `PathBeneath` rule over each, the created ruleset turned into an
//! `OwnedFd`); the child only calls `landlock_restrict_self` on that fd.
//! ABI 1 filesystem rights are required (`CompatLevel::HardRequirement`)
//! unless the operator chose `landlock = "best-effort"`; rights of later
//! ABIs (REFER 2, TRUNCATE 3, TCP 4, IOCTL_DEV 5, scopes 6) are handled
//! whenever the kernel knows them, and none past ABI 6. Nothing is granted that is not
//! listed here: `/etc` is a list of harmless entries, never the whole
//! directory, so `/etc/shadow` stays unreadable even to a skill running as
//! root.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{Access, AccessFs, AccessNet, BitFlags, RulesetError, Scope, ABI};
use policy::report::LandlockReport;
use policy::GrantedPath;

pub use self::build::prepare;
pub use self::cache::Cache;

mod build;
mod cache;
mod paths;

/// The sets of filesystem rights the rules grant.
pub mod fs {
    use landlock::{make_bitflags, AccessFs, BitFlags};

    /// Rights that apply to a file (not a directory).
    pub const FILE: BitFlags<AccessFs> =
        make_bitflags!(AccessFs::{Execute | WriteFile | ReadFile | Truncate | IoctlDev});
    /// Read and execute below a path.
    pub const READ_EXEC: BitFlags<AccessFs> =
        make_bitflags!(AccessFs::{Execute | ReadFile | ReadDir});
    /// Read without execute.
    pub const READ: BitFlags<AccessFs> = make_bitflags!(AccessFs::{ReadFile | ReadDir});
    /// Reading a device file.
    pub const READ_FILE: BitFlags<AccessFs> = make_bitflags!(AccessFs::{ReadFile});
    /// `/dev/null`: read, write, truncate and its ioctls.
    pub const DEV_NULL: BitFlags<AccessFs> =
        make_bitflags!(AccessFs::{ReadFile | WriteFile | Truncate | IoctlDev});
    /// Read and write, create and remove; never REFER, devices or execute.
    pub const READ_WRITE: BitFlags<AccessFs> = make_bitflags!(AccessFs::{
        WriteFile | ReadFile | ReadDir | RemoveDir | RemoveFile | MakeDir | MakeReg | MakeSock
            | MakeFifo | MakeSym | Truncate
    });
}

/// The kernel's `abi` as the `landlock` crate names it, at most
/// [`FULL_ABI`]: rights of later ABIs are not handled, so no rule here
/// leaves them denied by accident.
fn handled_abi(abi: u32) -> ABI {
    ABI::from(i32::try_from(abi.min(FULL_ABI)).unwrap_or(0))
}

/// Every filesystem right the kernel's `abi` knows (up to [`FULL_ABI`]).
pub fn fs_handled(abi: u32) -> BitFlags<AccessFs> {
    AccessFs::from_all(handled_abi(abi))
}

/// TCP bind + connect, when the ABI knows them (4).
pub fn net_handled(abi: u32) -> BitFlags<AccessNet> {
    AccessNet::from_all(handled_abi(abi))
}

/// Abstract Unix socket + signal scoping, when the ABI knows them (6).
pub fn scopes(abi: u32) -> BitFlags<Scope> {
    Scope::from_all(handled_abi(abi))
}

/// The newest ABI whose rights this module handles (7 adds none over 6).
pub const FULL_ABI: u32 = 6;

/// System directories skills may read and execute below.
pub const SYSTEM_READ_EXEC: &[&str] =
    &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// `/etc` entries skills may read (never the whole of `/etc`).
pub const ETC_READ: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/pki",
    "/etc/crypto-policies",
    "/etc/alternatives",
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/protocols",
    "/etc/services",
    "/etc/networks",
    "/etc/mime.types",
    "/etc/magic",
    "/etc/locale.alias",
    "/etc/locale.conf",
    "/etc/hostname",
    "/etc/python3",
];

/// Devices skills may read.
pub const DEV_READ: &[&str] = &["/dev/zero", "/dev/urandom", "/dev/random", "/dev/full"];

/// One path and the rights below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The path (a missing system path is skipped).
    pub path: PathBuf,
    /// Rights asked for (masked to the ABI and to file rights on files).
    pub access: BitFlags<AccessFs>,
    /// True when the path came from the manifest or the run (a missing one
    /// is reported as degraded rather than skipped silently).
    pub explicit: bool,
    /// The path names a descriptor the executor holds for as long as the
    /// rule is used (`/proc/self/fd/N`): it cannot come to name another
    /// file, so a cached ruleset is taken without looking at it again.
    pub pinned: bool,
    /// Paths this one must lie beneath once its symlinks are followed (the
    /// grant's, for a path below them; empty: no such bound). A path
    /// resolving elsewhere gets no rule, and a `degraded` line says so.
    pub beneath: Vec<PathBuf>,
}

/// What a run may touch, before it is turned into a ruleset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsPolicy {
    /// Every rule.
    pub rules: Vec<Rule>,
    /// TCP allowed (no net rights handled).
    pub network: bool,
}

impl FsPolicy {
    /// The default box: system read, the skill's folder and entry read +
    /// exec, the per-run directory and `/dev/null` read-write, plus the
    /// granted extra paths.
    pub fn new(
        skill_dir: &Path,
        entry: &Path,
        run_dir: &Path,
        fs_read: &[GrantedPath],
        fs_write: &[GrantedPath],
        network: bool,
    ) -> Self {
        let system = |p: &str, access| Rule {
            path: PathBuf::from(p),
            access,
            explicit: false,
            pinned: false,
            beneath: Vec::new(),
        };
        let explicit = |p: &Path, access| Rule {
            path: p.to_owned(),
            access,
            explicit: true,
            pinned: false,
            beneath: Vec::new(),
        };
        let granted = |g: &GrantedPath, access| Rule {
            path: g.path.clone(),
            access,
            explicit: true,
            pinned: false,
            beneath: g.beneath.clone(),
        };
        let mut rules: Vec<Rule> =
            SYSTEM_READ_EXEC.iter().map(|p| system(p, fs::READ_EXEC)).collect();
        rules.extend(ETC_READ.iter().map(|p| system(p, fs::READ)));
        rules.extend(DEV_READ.iter().map(|p| system(p, fs::READ_FILE)));
        rules.push(system("/proc", fs::READ));
        rules.push(system("/dev/null", fs::DEV_NULL));
        rules.push(explicit(skill_dir, fs::READ_EXEC));
        rules.push(explicit(entry, fs::READ_EXEC));
        rules.push(explicit(run_dir, fs::READ_WRITE));
        rules.extend(fs_read.iter().map(|p| granted(p, fs::READ_EXEC)));
        rules.extend(fs_write.iter().map(|p| granted(p, fs::READ_WRITE)));
        Self { rules, network }
    }
}

/// A Landlock restriction that is required and cannot be put in place.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LandlockError {
    /// The kernel has no Landlock and the config requires it.
    #[error("landlock is required (executor.toml landlock = \"required\") but the kernel does not support it")]
    Unsupported,
    /// Creating the ruleset failed.
    #[error("landlock: cannot create the ruleset")]
    Create(#[source] RulesetError),
    /// A rule could not be added.
    #[error("landlock: cannot add a rule for {path}")]
    AddRule {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: RulesetError,
    },
}

/// A ruleset ready for the child, and what it will enforce.
#[derive(Debug)]
pub struct Prepared {
    /// The ruleset fd; `None` when nothing is enforced (best effort only).
    pub fd: Option<OwnedFd>,
    /// For the run report.
    pub report: LandlockReport,
    /// Lines for `sandbox.degraded`.
    pub degraded: Vec<String>,
    /// The ruleset came from the [`Cache`].
    pub reused: bool,
}

#[cfg(test)]
mod tests;
