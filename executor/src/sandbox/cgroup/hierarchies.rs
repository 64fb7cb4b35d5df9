//! Where the host keeps the cgroup hierarchies the runs use, found once
//! at start-up, and one executor instance's parents in them.

use std::fs;
use std::path::{Path, PathBuf};

use super::{write_file, CgroupError};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Where this host keeps the hierarchies we use, found once at start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hierarchies {
    /// Parent of v2 run leaves (`.../ongrid`).
    pub v2: Option<PathBuf>,
    /// v2 offers pids and memory in the leaves.
    pub v2_limits: bool,
    /// Parent of v1 pids leaves.
    pub v1_pids: Option<PathBuf>,
    /// Parent of v1 memory leaves.
    pub v1_memory: Option<PathBuf>,
}

fn is_cgroup2(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
        .unwrap_or(false)
}

/// This process's path in the v2 hierarchy (`0::/path` of /proc/self/cgroup).
pub(crate) fn raw_own_v2_path() -> String {
    fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("0::").map(str::to_owned)))
        .unwrap_or_else(|| "/".to_owned())
}

/// The child cgroup a delegated executor moves itself into (`serve`'s
/// start-up), so its runs can get the controllers.
pub const SUPERVISOR: &str = "supervisor";

/// The cgroup whose `ongrid/` subtree holds the runs of a process in
/// `own`: `own` itself, or `<x>` for `<x>/supervisor`.
pub fn runs_parent(own: &str) -> String {
    match own.strip_suffix(SUPERVISOR).and_then(|p| p.strip_suffix('/')) {
        Some(parent) if !parent.is_empty() => parent.to_owned(),
        _ => own.to_owned(),
    }
}

/// The v2 cgroup this process's runs go under: its own, or, when `serve`
/// moved itself into `<own>/`[`SUPERVISOR`], `<own>`.
fn own_v2_path() -> String {
    runs_parent(&raw_own_v2_path())
}

/// The mounted v2 hierarchy (pure v2 at /sys/fs/cgroup, or hybrid's
/// /sys/fs/cgroup/unified), if any.
pub(crate) fn v2_mount() -> Option<PathBuf> {
    [Path::new(CGROUP_ROOT), &Path::new(CGROUP_ROOT).join("unified")]
        .into_iter()
        .find(|p| is_cgroup2(p))
        .map(Path::to_path_buf)
}

impl Hierarchies {
    /// Finds the hierarchies; `None` fields are reported as degraded. Only
    /// root can use cgroups here (no delegation to other users).
    pub fn detect() -> (Self, Vec<String>) {
        let mut h = Hierarchies::default();
        let mut notes = Vec::new();
        if !nix::unistd::geteuid().is_root() {
            notes.push(
                "cgroup: not root; no cgroup (tree kill by process group, no pids/memory bound)"
                    .to_owned(),
            );
            return (h, notes);
        }
        if let Some(mount) = v2_mount() {
            let own = own_v2_path();
            let base = mount.join(own.trim_start_matches('/')).join("ongrid");
            if fs::create_dir_all(&base).is_ok() {
                let controllers =
                    fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
                let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
                if has("pids") && has("memory") {
                    h.v2_limits =
                        fs::write(base.join("cgroup.subtree_control"), "+pids +memory").is_ok();
                }
                h.v2 = Some(base);
            }
        }
        if !h.v2_limits {
            for (controller, slot) in [("pids", &mut h.v1_pids), ("memory", &mut h.v1_memory)] {
                let mount = Path::new(CGROUP_ROOT).join(controller);
                if mount.join("cgroup.procs").exists() && !is_cgroup2(&mount) {
                    let base = mount.join("ongrid");
                    if fs::create_dir_all(&base).is_ok() {
                        *slot = Some(base);
                    }
                }
            }
        }
        if h.v2.is_none() {
            notes.push("cgroup: no cgroup v2 hierarchy; tree kill by listing processes".into());
        }
        if !h.v2_limits && h.v1_pids.is_none() {
            notes.push("cgroup: no pids controller; process count not bounded".into());
        }
        if !h.v2_limits && h.v1_memory.is_none() {
            notes.push("cgroup: no memory controller; memory bounded by RLIMIT_AS only".into());
        }
        (h, notes)
    }
}

impl Hierarchies {
    /// Makes the instance parent `<base>/<instance>` in each hierarchy
    /// (passing the v2 controllers down) and returns the hierarchies with
    /// those parents as bases: one `cgroup.kill` there ends every run of
    /// the instance.
    ///
    /// # Errors
    ///
    /// [`CgroupError`]; parents already made are removed.
    pub fn scoped(&self, instance: &str) -> Result<Hierarchies, CgroupError> {
        let mut made: Vec<PathBuf> = Vec::new();
        let mut make = |base: &Option<PathBuf>, controllers: bool| -> Result<_, CgroupError> {
            let Some(base) = base else { return Ok(None) };
            let dir = base.join(instance);
            fs::create_dir(&dir).map_err(|source| CgroupError {
                path: dir.clone(),
                what: "create",
                source,
            })?;
            made.push(dir.clone());
            if controllers {
                write_file(&dir.join("cgroup.subtree_control"), "+pids +memory")?;
            }
            Ok(Some(dir))
        };
        let scoped = (|| {
            Ok(Hierarchies {
                v2: make(&self.v2, self.v2_limits)?,
                v2_limits: self.v2_limits,
                v1_pids: make(&self.v1_pids, false)?,
                v1_memory: make(&self.v1_memory, false)?,
            })
        })();
        if scoped.is_err() {
            for dir in made.iter().rev() {
                let _ = fs::remove_dir(dir);
            }
        }
        scoped
    }
}
