//! Taking over a delegated cgroup v2 subtree at `serve` start-up.
//!
//! Under systemd with `Delegate=yes` the executor's unit cgroup
//! (`/system.slice/ongrid-executor.service`) is ours, and the `pids` and
//! `memory` controllers are available in it (`cgroup.controllers`) but not
//! passed down to its children: `cgroup.subtree_control` is empty. They
//! cannot be passed down while the executor itself lives there (cgroup v2's
//! no-internal-process rule: writing `+memory` to `cgroup.subtree_control`
//! of a cgroup with processes fails with `EBUSY`). So, once, before the
//! engine starts:
//!
//! 1. if this process is alone in its cgroup `<own>` (never the root
//!    cgroup), and `<own>` offers wanted controllers not yet enabled for
//!    its children,
//! 2. make `<own>/supervisor` and move this process there (all its threads
//!    go with it; the watchdog and everything it spawns later start there),
//! 3. write `+pids +memory` (those offered) to `<own>/cgroup.subtree_control`.
//!
//! The run cgroups keep their layout under `<own>/ongrid/...`
//! ([`crate::sandbox::cgroup::Hierarchies::detect`] treats a process in
//! `<own>/supervisor` as living in `<own>`), now with the controllers, so
//! runs get their pids and memory bounds from v2. If step 3 fails the
//! process moves back and nothing changes. Not delegated (a login session,
//! a container's root cgroup, other processes next to us): nothing is done.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub use crate::sandbox::cgroup::{runs_parent, SUPERVISOR};

/// The controllers the run leaves need from v2.
pub const WANTED: [&str; 2] = ["pids", "memory"];

/// What the start-up step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delegation {
    /// The process moved to `<own>/supervisor`; these controllers are now
    /// enabled for `<own>`'s children.
    Taken {
        /// `<mount><own>`.
        root: PathBuf,
        /// Enabled controllers, in [`WANTED`] order.
        enabled: Vec<String>,
    },
    /// The wanted controllers are already enabled for the children.
    AlreadyEnabled,
    /// Nothing to do or not ours; why.
    Skipped(String),
}

/// The step failed half-way (the process was moved back).
#[derive(Debug, thiserror::Error)]
#[error("cgroup delegation: cannot {what} {}", .path.display())]
pub struct DelegationError {
    /// What was being done.
    pub what: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: io::Error,
}

fn words(path: &Path) -> Vec<String> {
    fs::read_to_string(path).unwrap_or_default().split_whitespace().map(str::to_owned).collect()
}

/// The step on the v2 hierarchy mounted at `mount`, for process `pid`
/// whose cgroup is `own` (as in `/proc/<pid>/cgroup`, `0::<own>`), with
/// `wanted` controllers (normally [`WANTED`]; tests pass others).
///
/// # Errors
///
/// [`DelegationError`] when the move or the enabling failed (the process
/// is back in `own` when the enabling failed).
pub fn take(
    mount: &Path,
    own: &str,
    pid: u32,
    wanted: &[&str],
) -> Result<Delegation, DelegationError> {
    let rel = own.trim_start_matches('/');
    if rel.is_empty() {
        return Ok(Delegation::Skipped("in the root cgroup".into()));
    }
    let root = mount.join(rel);
    let offered = words(&root.join("cgroup.controllers"));
    let enabled = words(&root.join("cgroup.subtree_control"));
    let todo: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|c| offered.iter().any(|o| o == c) && !enabled.iter().any(|e| e == c))
        .collect();
    if todo.is_empty() {
        return Ok(if wanted.iter().all(|c| enabled.iter().any(|e| e == c)) {
            Delegation::AlreadyEnabled
        } else {
            Delegation::Skipped(format!("{} offers none of {wanted:?}", root.display()))
        });
    }
    let procs = words(&root.join("cgroup.procs"));
    let me = pid.to_string();
    if procs != [me.clone()] {
        return Ok(Delegation::Skipped(format!(
            "{} holds other processes than {pid}; not a cgroup delegated to this executor",
            root.display()
        )));
    }
    let err = |what, path: PathBuf| move |source| DelegationError { what, path, source };
    let supervisor = root.join(SUPERVISOR);
    match fs::create_dir(&supervisor) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err("create", supervisor)(e)),
    }
    let sup_procs = supervisor.join("cgroup.procs");
    fs::write(&sup_procs, &me).map_err(err("move the executor into", sup_procs))?;
    let control = root.join("cgroup.subtree_control");
    let line = todo.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
    if let Err(e) = fs::write(&control, &line) {
        let _ = fs::write(root.join("cgroup.procs"), &me);
        let _ = fs::remove_dir(&supervisor);
        return Err(err("enable controllers in", control)(e));
    }
    Ok(Delegation::Taken { root, enabled: todo.iter().map(|c| (*c).to_owned()).collect() })
}

/// [`take`] for this process on the host's v2 hierarchy, as root only
/// (`serve` calls it once, before the engine starts).
///
/// # Errors
///
/// [`DelegationError`].
pub fn take_own() -> Result<Delegation, DelegationError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(Delegation::Skipped("not root".into()));
    }
    let Some(mount) = crate::sandbox::cgroup::v2_mount() else {
        return Ok(Delegation::Skipped("no cgroup v2 hierarchy".into()));
    };
    take(&mount, &crate::sandbox::cgroup::raw_own_v2_path(), std::process::id(), &WANTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake cgroup directory: files only, no kernel semantics.
    fn fake(controllers: &str, subtree: &str, procs: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("system.slice/ongrid-executor.service");
        fs::create_dir_all(&own).unwrap();
        fs::write(own.join("cgroup.controllers"), controllers).unwrap();
        fs::write(own.join("cgroup.subtree_control"), subtree).unwrap();
        fs::write(own.join("cgroup.procs"), procs).unwrap();
        (dir, "/system.slice/ongrid-executor.service".to_owned())
    }

    #[test]
    fn runs_go_beside_the_supervisor() {
        assert_eq!(runs_parent("/system.slice/x.service/supervisor"), "/system.slice/x.service");
        assert_eq!(runs_parent("/system.slice/x.service"), "/system.slice/x.service");
        assert_eq!(runs_parent("/a/notsupervisor"), "/a/notsupervisor");
        assert_eq!(runs_parent("/supervisor"), "/supervisor");
        assert_eq!(runs_parent("/"), "/");
    }

    #[test]
    fn alone_with_controllers_offered_moves_and_enables() {
        let (dir, own) = fake("cpu io memory pids\n", "", "42\n");
        let got = take(dir.path(), &own, 42, &WANTED).unwrap();
        let root = dir.path().join(own.trim_start_matches('/'));
        assert_eq!(
            got,
            Delegation::Taken { root: root.clone(), enabled: vec!["pids".into(), "memory".into()] }
        );
        assert_eq!(fs::read_to_string(root.join("supervisor/cgroup.procs")).unwrap(), "42");
        assert_eq!(
            fs::read_to_string(root.join("cgroup.subtree_control")).unwrap(),
            "+pids +memory"
        );
    }

    #[test]
    fn only_offered_controllers_are_enabled() {
        let (dir, own) = fake("cpu pids\n", "", "7\n");
        let got = take(dir.path(), &own, 7, &WANTED).unwrap();
        assert!(matches!(got, Delegation::Taken { ref enabled, .. } if enabled == &["pids"]));
        let root = dir.path().join(own.trim_start_matches('/'));
        assert_eq!(fs::read_to_string(root.join("cgroup.subtree_control")).unwrap(), "+pids");
    }

    #[test]
    fn shared_or_root_or_enabled_or_unoffered_is_left_alone() {
        let (dir, own) = fake("memory pids\n", "", "7\n8\n");
        assert!(matches!(take(dir.path(), &own, 7, &WANTED).unwrap(), Delegation::Skipped(_)));
        assert!(!dir.path().join("system.slice/ongrid-executor.service/supervisor").exists());

        assert!(matches!(take(dir.path(), "/", 7, &WANTED).unwrap(), Delegation::Skipped(_)));

        let (dir, own) = fake("memory pids\n", "memory pids\n", "7\n");
        assert_eq!(take(dir.path(), &own, 7, &WANTED).unwrap(), Delegation::AlreadyEnabled);

        let (dir, own) = fake("cpu io\n", "", "7\n");
        assert!(matches!(take(dir.path(), &own, 7, &WANTED).unwrap(), Delegation::Skipped(_)));
        assert!(!dir.path().join("system.slice/ongrid-executor.service/supervisor").exists());
    }
}
