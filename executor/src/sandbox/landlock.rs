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

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetError, Scope, ABI,
};
use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use policy::report::LandlockReport;
use policy::Enforcement;

use crate::config::LandlockMode;
use crate::host;

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
        fs_read: &[PathBuf],
        fs_write: &[PathBuf],
        network: bool,
    ) -> Self {
        let system = |p: &str, access| Rule {
            path: PathBuf::from(p),
            access,
            explicit: false,
            pinned: false,
        };
        let explicit =
            |p: &Path, access| Rule { path: p.to_owned(), access, explicit: true, pinned: false };
        let mut rules: Vec<Rule> =
            SYSTEM_READ_EXEC.iter().map(|p| system(p, fs::READ_EXEC)).collect();
        rules.extend(ETC_READ.iter().map(|p| system(p, fs::READ)));
        rules.extend(DEV_READ.iter().map(|p| system(p, fs::READ_FILE)));
        rules.push(system("/proc", fs::READ));
        rules.push(system("/dev/null", fs::DEV_NULL));
        rules.push(explicit(skill_dir, fs::READ_EXEC));
        rules.push(explicit(entry, fs::READ_EXEC));
        rules.push(explicit(run_dir, fs::READ_WRITE));
        rules.extend(fs_read.iter().map(|p| explicit(p, fs::READ_EXEC)));
        rules.extend(fs_write.iter().map(|p| explicit(p, fs::READ_WRITE)));
        Self { rules, network }
    }
}

/// A path opened `O_PATH` for a rule.
#[derive(Debug)]
struct Opened {
    fd: OwnedFd,
    is_dir: bool,
    ident: Option<Ident>,
}

/// What a rule's path named: device, inode, and whether a directory.
type Ident = (u64, u64, bool);

fn ident(meta: &std::fs::Metadata) -> Ident {
    (meta.dev(), meta.ino(), meta.is_dir())
}

fn open_path(path: &Path) -> std::io::Result<Opened> {
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata().ok();
    let is_dir = meta.as_ref().is_some_and(std::fs::Metadata::is_dir);
    Ok(Opened { fd: file.into(), is_dir, ident: meta.as_ref().map(ident) })
}

/// Rulesets built for earlier runs in one slot (the run directory, `run::rundir`),
/// each with what it was built from; [`prepare`] takes one whose inputs are
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
    entries: Vec<Cached>,
}

/// Rulesets kept per slot (one per policy run there lately).
const CACHE_SIZE: usize = 4;

#[derive(Debug)]
struct Cached {
    abi: u32,
    mode: LandlockMode,
    policy: FsPolicy,
    system: Arc<SystemPaths>,
    /// Per rule: the file an explicit rule's path named (`None`: none, or
    /// a system path).
    idents: Vec<Option<Ident>>,
    /// The ruleset, above the descriptor floor (`host::fdtable`).
    fd: OwnedFd,
    report: LandlockReport,
    degraded: Vec<String>,
}

impl Cache {
    /// A copy (below the floor, for the child) of a ruleset built from
    /// exactly these inputs, if any. The paths are looked at only when a
    /// ruleset of this policy is kept.
    fn take(
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

    fn keep(&mut self, entry: Cached) {
        if self.entries.len() >= CACHE_SIZE {
            self.entries.remove(0);
        }
        self.entries.push(entry);
    }
}

/// What identifies a directory's entries: any entry created, removed,
/// renamed over or replaced changes the directory's mtime (or the
/// directory itself is another inode).
type Stamp = (u64, u64, i64, i64, i64, i64);

fn stamp(dir: &Path) -> Option<Stamp> {
    std::fs::metadata(dir)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()))
}

/// The system paths of every ruleset (`SYSTEM_READ_EXEC`, `ETC_READ`,
/// `DEV_READ`, `/proc`, `/dev/null`), opened `O_PATH` once per process
/// instead of once per run (about 40 opens, stats and closes per spawn).
///
/// Landlock rules follow inodes, so a cached fd must still be the file the
/// path names: the snapshot watches the parent directory of each path (as
/// written and as resolved through symlinks, e.g. `/etc/resolv.conf` into
/// `/run/...`) with inotify, and is reopened from scratch as soon as any of
/// those directories changed (a package upgrade renaming a new
/// `/etc/ld.so.cache` into place, a new `resolv.conf`, a path that
/// appears). A check is one non-blocking `read` of the inotify descriptor
/// per run; a directory that cannot be watched (missing, or no inotify) is
/// compared by its stamp (a `statx`) instead.
#[derive(Debug)]
struct SystemPaths {
    paths: HashMap<PathBuf, Option<Opened>>,
    /// Each parent directory, its stamp when opened, and whether it is
    /// watched.
    stamps: Vec<(PathBuf, Option<Stamp>, bool)>,
    /// The watches (above the descriptor floor); any event means stale.
    /// Closed once stale: a stale snapshot may live on in the slots' cached
    /// rulesets, and inotify instances are few per user (root's are
    /// systemd's too).
    watch: Mutex<Option<Inotify>>,
    /// An event was seen: stale for good (events are read once).
    stale: AtomicBool,
}

/// What changes a directory's entries or the directory itself: the events
/// whose absence the stamp's mtime, ctime and inode used to show.
fn watch_mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
}

fn system_paths() -> impl Iterator<Item = &'static str> + Clone {
    SYSTEM_READ_EXEC.iter().chain(ETC_READ).chain(DEV_READ).copied().chain(["/proc", "/dev/null"])
}

impl SystemPaths {
    fn open() -> Self {
        Self::open_paths(system_paths().map(Path::new))
    }

    fn open_paths<'a>(list: impl Iterator<Item = &'a Path> + Clone) -> Self {
        let mut dirs = BTreeSet::new();
        for path in list.clone() {
            dirs.extend(path.parent().map(Path::to_path_buf));
            if let Ok(real) = std::fs::canonicalize(path) {
                dirs.extend(real.parent().map(Path::to_path_buf));
            }
        }
        // Watched before the opens: a change after this is an event.
        let flags = InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC;
        let watch = Inotify::init(flags).ok().map(host::fdtable::lift_inotify);
        let watched: Vec<bool> = dirs
            .iter()
            .map(|d| watch.as_ref().is_some_and(|w| w.add_watch(d, watch_mask()).is_ok()))
            .collect();
        let mut paths = HashMap::new();
        for path in list {
            // Kept for the process's life: above the descriptor floor, so
            // children do not copy them (host::fdtable).
            let opened =
                open_path(path).ok().map(|o| Opened { fd: host::fdtable::lift(o.fd), ..o });
            paths.insert(path.to_path_buf(), opened);
        }
        // Stamps taken after the opens: a change in between shows next time.
        let stamps =
            dirs.into_iter().zip(watched).map(|(d, w)| (d.clone(), stamp(&d), w)).collect();
        SystemPaths { paths, stamps, watch: Mutex::new(watch), stale: AtomicBool::new(false) }
    }

    fn fresh(&self) -> bool {
        if self.stale.load(Ordering::Relaxed) {
            return false;
        }
        {
            let mut watch = self.watch.lock().unwrap_or_else(PoisonError::into_inner);
            // Anything but "no event" (an event, an overflow, an error).
            let changed =
                watch.as_ref().is_some_and(|w| !matches!(w.read_events(), Err(Errno::EAGAIN)));
            if changed {
                self.stale.store(true, Ordering::Relaxed);
                *watch = None;
                return false;
            }
        }
        self.stamps.iter().all(|(dir, s, watched)| *watched || stamp(dir) == *s)
    }

    /// The process-wide snapshot, reopened when stale.
    fn current() -> Arc<SystemPaths> {
        static CACHE: Mutex<Option<Arc<SystemPaths>>> = Mutex::new(None);
        let cached = CACHE.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(c) = cached.filter(|c| c.fresh()) {
            return c;
        }
        let opened = Arc::new(SystemPaths::open());
        let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
        // Another run may have stored a fresh one meanwhile: that one stays,
        // so runs share one snapshot (and the rulesets cached with it).
        if let Some(c) = cache.as_ref().filter(|c| c.fresh()) {
            return Arc::clone(c);
        }
        *cache = Some(Arc::clone(&opened));
        opened
    }

    /// `Some(None)`: a system path missing on this host; `None`: not a
    /// system path (opened per run).
    fn get(&self, rule: &Rule) -> Option<Option<&Opened>> {
        if rule.explicit {
            return None;
        }
        self.paths.get(&rule.path).map(Option::as_ref)
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
fn missing_rights(abi: u32) -> Vec<&'static str> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_per_abi() {
        assert_eq!(fs_handled(0).bits(), 0);
        assert_eq!(fs_handled(1).bits(), 0x1fff);
        assert_eq!(fs_handled(2).bits(), 0x3fff);
        assert_eq!(fs_handled(4).bits(), 0x7fff);
        assert_eq!(fs_handled(7).bits(), 0xffff);
        assert_eq!((net_handled(3).bits(), net_handled(4).bits()), (0, 3));
        assert_eq!((scopes(5).bits(), scopes(6).bits()), (0, 3));
        assert!(missing_rights(7).is_empty());
        assert_eq!(missing_rights(3).len(), 3);
    }

    #[test]
    fn default_box_never_grants_all_of_etc_or_refer() {
        let p = FsPolicy::new(
            Path::new("/skills/x"),
            Path::new("/skills/x/run"),
            Path::new("/run/ongrid/runs/1"),
            &[],
            &[],
            false,
        );
        assert!(p.rules.iter().all(|r| r.path != Path::new("/etc")));
        assert!(p.rules.iter().all(|r| !r.access.contains(AccessFs::Refer)));
        let writable: Vec<_> = p
            .rules
            .iter()
            .filter(|r| r.access.contains(AccessFs::WriteFile))
            .map(|r| &r.path)
            .collect();
        assert_eq!(writable, [Path::new("/dev/null"), Path::new("/run/ongrid/runs/1")]);
        assert!(!ETC_READ.contains(&"/etc/shadow"));
    }

    /// What `Cache::take` relies on to skip looking rules up: a rule that
    /// is not explicit is always a path the system snapshot holds, and an
    /// explicit one never is.
    #[test]
    fn the_rules_that_are_not_explicit_are_the_system_paths() {
        let p = FsPolicy::new(
            Path::new("/opt/skills/s"),
            Path::new("/opt/skills/s/run"),
            Path::new("/run/ongrid/runs/1"),
            &[PathBuf::from("/srv/in"), PathBuf::from("/etc/hosts")],
            &[PathBuf::from("/srv/out")],
            false,
        );
        let system = SystemPaths::current();
        assert!(p.rules.iter().filter(|r| !r.explicit).count() >= system_paths().count());
        for r in &p.rules {
            assert_eq!(!r.explicit, system.get(r).is_some(), "{}", r.path.display());
        }
    }

    #[test]
    fn system_paths_are_opened_once_and_reopened_when_a_parent_changes() {
        let a = SystemPaths::current();
        let b = SystemPaths::current();
        assert!(Arc::ptr_eq(&a, &b), "reopened although nothing changed");
        let usr =
            Rule { path: "/usr".into(), access: fs::READ_EXEC, explicit: false, pinned: false };
        assert!(a.get(&usr).is_some_and(|o| o.is_some_and(|o| o.is_dir)));
        let mine =
            Rule { path: "/usr".into(), access: fs::READ_EXEC, explicit: true, pinned: false };
        assert!(a.get(&mine).is_none(), "explicit paths are opened per run");
        assert!(a.stamps.iter().any(|(d, _, _)| d == Path::new("/etc")));
        // A directory's stamp changes with any entry made or renamed over.
        let dir = tempfile::tempdir().unwrap();
        let before = stamp(dir.path());
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::write(dir.path().join("new"), "x").unwrap();
        std::fs::rename(dir.path().join("new"), dir.path().join("other")).unwrap();
        assert_ne!(before, stamp(dir.path()));
    }

    /// A watched parent that changes (an entry made or renamed over) makes
    /// the snapshot stale, for good; a parent that could not be watched
    /// (missing) is compared by its stamp.
    #[test]
    fn a_changed_parent_makes_the_snapshot_stale() {
        let t = tempfile::tempdir().unwrap();
        let etc = t.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(etc.join("cache"), "a").unwrap();
        let later = t.path().join("later");
        let list = [etc.join("cache"), later.join("file")];
        let open = || SystemPaths::open_paths(list.iter().map(PathBuf::as_path));
        let snap = open();
        if snap.watch.lock().unwrap().is_none() {
            println!("SKIP: a_changed_parent_makes_the_snapshot_stale: no inotify here");
            return;
        }
        let watched = |d: &Path| snap.stamps.iter().find(|(p, _, _)| p == d).map(|(_, _, w)| *w);
        assert_eq!((watched(&etc), watched(&later)), (Some(true), Some(false)));
        assert!(snap.fresh() && snap.fresh(), "nothing changed");
        std::fs::write(etc.join("new"), "b").unwrap();
        std::fs::rename(etc.join("new"), etc.join("cache")).unwrap();
        assert!(!snap.fresh(), "a file renamed over a system path");
        assert!(!snap.fresh(), "stale for good once an event was read");
        assert!(snap.watch.lock().unwrap().is_none(), "its watch closed");
        let again = open();
        assert!(again.fresh());
        std::fs::create_dir(&later).unwrap();
        assert!(!again.fresh(), "a missing parent that appears");
    }

    #[test]
    fn best_effort_without_landlock_is_reported() {
        let p = FsPolicy::new(Path::new("/"), Path::new("/"), Path::new("/"), &[], &[], false);
        let out = prepare(0, LandlockMode::BestEffort, &p, None).unwrap();
        assert!(out.fd.is_none());
        assert_eq!(out.report.status, Enforcement::None);
        assert!(!out.degraded.is_empty());
        assert!(matches!(
            prepare(0, LandlockMode::Required, &p, None),
            Err(LandlockError::Unsupported)
        ));
    }

    /// A ruleset is taken from the cache only for the very inputs it was
    /// built from: the same policy with every explicit path still naming
    /// the same file. Another file at a path, or another grant, builds anew.
    #[test]
    fn a_cached_ruleset_serves_only_the_same_inputs() {
        let abi = crate::sys::landlock::abi();
        if abi == 0 {
            println!("SKIP: no Landlock in this kernel");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let (skill, home, extra) =
            (t.path().join("skill"), t.path().join("home"), t.path().join("x"));
        for d in [&skill, &home, &extra] {
            std::fs::create_dir(d).unwrap();
        }
        let entry = skill.join("run");
        std::fs::write(&entry, "#!/bin/sh\n").unwrap();
        let policy = |grants: &[PathBuf]| FsPolicy::new(&skill, &entry, &home, grants, &[], false);
        let mut cache = Cache::default();
        // Rulesets taken from the cache so far.
        let taken = std::cell::Cell::new(0u64);
        let run = |p: &FsPolicy, cache: &mut Cache| {
            let out = prepare(abi, LandlockMode::Required, p, Some(cache)).unwrap();
            taken.set(taken.get() + u64::from(out.reused));
            assert!(out.fd.is_some(), "no ruleset");
            assert_eq!(
                out.report.status,
                if abi >= FULL_ABI { Enforcement::Full } else { Enforcement::Partial }
            );
            out
        };
        let first = run(&policy(&[]), &mut cache);
        assert_eq!(taken.get(), 0);
        let second = run(&policy(&[]), &mut cache);
        assert_eq!(taken.get(), 1, "the same inputs: taken from the cache");
        assert_eq!(second.report, first.report);
        // Another grant: built anew (and kept beside the first).
        run(&policy(std::slice::from_ref(&extra)), &mut cache);
        assert_eq!(taken.get(), 1);
        run(&policy(&[]), &mut cache);
        assert_eq!(taken.get(), 2, "the first policy is still kept");
        // The skill folder replaced by another directory at the same path.
        std::fs::rename(&skill, t.path().join("old")).unwrap();
        std::fs::create_dir(&skill).unwrap();
        std::fs::write(&entry, "#!/bin/sh\n").unwrap();
        run(&policy(&[]), &mut cache);
        assert_eq!(taken.get(), 2, "a replaced folder must not hit");
        run(&policy(&[]), &mut cache);
        assert_eq!(taken.get(), 3);
        // A grant whose path is gone and comes back as another directory.
        run(&policy(std::slice::from_ref(&extra)), &mut cache);
        std::fs::remove_dir(&extra).unwrap();
        std::fs::create_dir(&extra).unwrap();
        let hits = taken.get();
        run(&policy(std::slice::from_ref(&extra)), &mut cache);
        assert_eq!(taken.get(), hits, "a recreated grant must not hit");
        assert!(cache.entries.len() <= CACHE_SIZE);
    }
}
