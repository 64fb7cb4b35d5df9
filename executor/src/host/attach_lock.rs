//! Warming the kernel's cgroup attach lock for a one-shot run.
//!
//! Every run's child joins its cgroups by writing `cgroup.procs`. The
//! kernel serialises migrations with one global percpu rwsem
//! (`cgroup_threadgroup_rwsem`); a writer that finds it idle waits for a
//! full RCU grace period before it may take it (`rcu_sync_enter`), and the
//! lock stays cheap only while writers keep coming (within about one grace
//! period of each other). `ongrid-executor serve` migrates a child every
//! run, so the lock stays warm; each `ongrid-executor run` is a fresh
//! process, usually the only writer around, and its child paid the grace
//! period (4-16 ms on the 2-vCPU test VM, more under load) on the critical
//! path, between `clone` and `exec`.
//!
//! [`warm_up`] starts that wait at start-up instead, on a throwaway thread,
//! by writing the process's own pid to the `cgroup.procs` of the cgroup it
//! is already in (v1 `pids`, else v1 `memory`): a migration that moves
//! nothing and changes nothing, but takes the lock. The grace period then
//! runs while the executor reads its configuration, the manifest and
//! builds the sandbox; the child's own write finds the lock warm (or waits
//! only for what is left of the same grace period). Any failure is
//! ignored: this only moves a wait, it guards nothing.

use std::fs;
use std::path::PathBuf;

/// The v1 hierarchies tried, in order.
const CONTROLLERS: [&str; 2] = ["pids", "memory"];

/// `cgroup.procs` of this process's own cgroup in the first v1 hierarchy
/// of [`CONTROLLERS`] mounted under `/sys/fs/cgroup/<controller>`.
fn own_procs_file() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    CONTROLLERS.iter().find_map(|want| {
        text.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if !controllers.split(',').any(|c| c == *want) {
                return None;
            }
            let rel = path.trim_start_matches('/');
            if rel.split('/').any(|c| c == "..") {
                return None;
            }
            let file = PathBuf::from("/sys/fs/cgroup").join(want).join(rel).join("cgroup.procs");
            file.exists().then_some(file)
        })
    })
}

/// Starts the attach lock's grace period on a detached thread (see the
/// module docs); returns at once. Does nothing when not root or when no
/// v1 `pids`/`memory` hierarchy holds this process.
pub fn warm_up() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let _ = std::thread::Builder::new().name("attach-warm".into()).spawn(|| {
        if let Some(file) = own_procs_file() {
            // Our own pid into the cgroup we are in: nothing moves.
            let _ = fs::write(file, std::process::id().to_string());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_our_own_cgroup_and_writing_it_moves_nothing() {
        let test = "the_file_is_our_own_cgroup_and_writing_it_moves_nothing";
        let Some(file) = own_procs_file() else {
            println!("SKIP: {test}: no cgroup v1 hierarchy lists this process");
            return;
        };
        let procs = fs::read_to_string(&file).unwrap_or_default();
        assert!(
            procs.lines().any(|p| p == std::process::id().to_string()),
            "{} does not list us",
            file.display()
        );
        if !nix::unistd::geteuid().is_root() {
            println!("SKIP: {test}: writing the file needs root");
            return;
        }
        let before = fs::read_to_string("/proc/self/cgroup").unwrap();
        fs::write(&file, std::process::id().to_string()).unwrap();
        assert_eq!(fs::read_to_string("/proc/self/cgroup").unwrap(), before);
    }
}
