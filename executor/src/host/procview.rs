//! What a run sees in `/proc`: by default only its own processes.
//!
//! The mechanism costs nothing per run. A procfs mounted with
//! `hidepid=invisible` lists only the processes its reader may `ptrace`
//! (`PTRACE_MODE_READ`), and Landlock refuses that for any process outside
//! the reader's own domain or its descendants. Every run enforces a
//! Landlock domain of its own (`landlock_restrict_self` in its child makes
//! a new one each time, even from a cached ruleset), so through such a
//! `/proc` a run finds its own tree and nothing else: not the host's
//! processes, not the executor, not another run of the same run-as user.
//! The global files (`loadavg`, `meminfo`, `stat`, `uptime`, `cpuinfo`,
//! `mounts`...) stay: no `subset=pid`.
//!
//! Where that `/proc` comes from, decided once at start ([`ProcSetup`]):
//! - the executor's own `/proc` is already mounted that way (the packaged
//!   unit's `ProtectProc=invisible`): runs use it as it is;
//! - else, as root with `CAP_SYS_ADMIN`, the executor makes a mount
//!   namespace for the runs, a copy of its own with a `hidepid=invisible`
//!   procfs over `/proc` (private there, so nothing reaches the host).
//!   Spawner threads join it once; a child made elsewhere joins it with
//!   one `setns` (step 4b). The executor itself stays where it was: its
//!   mounts, sweeps and `/proc` reads are unchanged;
//! - else runs see the host's table, and their reports say why.
//!
//! A run granted `proc = "host"` stays in the executor's namespace, whose
//! `/proc` shows the host's table; under `ProtectProc=invisible` there is
//! no such `/proc`, which its report says.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use nix::fcntl::{open, OFlag};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::stat::Mode;

/// The runs' mount namespace and its `/proc` (both above the descriptor
/// floor: no child keeps them).
#[derive(Debug)]
pub struct RunsNamespace {
    mnt: OwnedFd,
    proc_dir: OwnedFd,
}

impl RunsNamespace {
    /// The namespace, for `setns`.
    pub fn mount_ns(&self) -> BorrowedFd<'_> {
        self.mnt.as_fd()
    }

    /// Its `/proc`, opened `O_PATH`, by number (for a path through
    /// `/proc/self/fd`): the directory the runs' Landlock rule for `/proc`
    /// must name (rules follow inodes, and this procfs is not the
    /// executor's).
    pub fn proc_dir_fd(&self) -> RawFd {
        self.proc_dir.as_raw_fd()
    }
}

/// How runs get their own view of `/proc`, found once at start.
#[derive(Debug, Clone)]
pub enum ProcSetup {
    /// The executor's `/proc` hides what a reader cannot `ptrace` already
    /// (`ProtectProc=invisible`): no run can have the host's view.
    Hidden,
    /// Runs live in a mount namespace of their own ([`RunsNamespace`]).
    Namespace(Arc<RunsNamespace>),
    /// Neither could be had: why, for every report that asks for its own
    /// view.
    Unavailable(String),
}

impl ProcSetup {
    /// The runs' namespace, when the executor made one.
    pub fn namespace(&self) -> Option<&Arc<RunsNamespace>> {
        match self {
            ProcSetup::Namespace(ns) => Some(ns),
            _ => None,
        }
    }
}

/// Finds or makes the runs' `/proc`. `may_mount`: the executor is root
/// with `CAP_SYS_ADMIN` and `CAP_SYS_CHROOT` (to join the namespace).
pub fn set_up(may_mount: bool) -> ProcSetup {
    if proc_hides(&fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()) {
        return ProcSetup::Hidden;
    }
    if !may_mount {
        return ProcSetup::Unavailable(
            "the executor cannot mount a /proc that hides other processes (it needs root with \
             CAP_SYS_ADMIN and CAP_SYS_CHROOT, or ProtectProc=invisible in its unit)"
                .to_owned(),
        );
    }
    // A thread of its own: joining a new mount namespace takes the calling
    // thread alone (with a filesystem context of its own), and it ends
    // right after, so no thread of the executor lives in it.
    match std::thread::spawn(make_namespace).join() {
        Ok(Ok(ns)) => ProcSetup::Namespace(Arc::new(ns)),
        Ok(Err(e)) => ProcSetup::Unavailable(format!(
            "the executor cannot make the runs' /proc (a procfs with hidepid=invisible needs \
             Linux 5.8): {e}"
        )),
        Err(_) => ProcSetup::Unavailable("the runs' /proc: set-up thread failed".to_owned()),
    }
}

/// In the calling thread: a new mount namespace, `/proc` made private in
/// it and a `hidepid=invisible` procfs over it; both opened.
fn make_namespace() -> nix::Result<RunsNamespace> {
    unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&str>,
        "/proc",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), "/proc", Some("proc"), flags, Some("hidepid=invisible"))?;
    let path = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let proc_dir = open("/proc", path, Mode::empty())?;
    let mnt = open("/proc/thread-self/ns/mnt", OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    let lift = crate::host::fdtable::lift;
    Ok(RunsNamespace { mnt: lift(mnt), proc_dir: lift(proc_dir) })
}

/// Whether the last mount on `/proc` in `mountinfo` (the one in effect)
/// has `hidepid` at `invisible` (2) or `ptraceable` (4).
fn proc_hides(mountinfo: &str) -> bool {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (pre.split(' ').nth(4)? == "/proc").then_some(post)
        })
        .next_back()
        .and_then(|post| post.split(' ').nth(2))
        .is_some_and(|opts| {
            opts.split(',').any(|o| {
                matches!(o, "hidepid=invisible" | "hidepid=2" | "hidepid=ptraceable" | "hidepid=4")
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "25 30 0:23 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc ";

    #[test]
    fn hidepid_is_read_from_the_last_proc_mount() {
        assert!(!proc_hides(&format!("{LINE}rw\n")));
        assert!(proc_hides(&format!("{LINE}rw,hidepid=invisible\n")));
        assert!(proc_hides(&format!("{LINE}rw,hidepid=ptraceable\n")));
        assert!(!proc_hides(&format!("{LINE}rw,hidepid=noaccess\n")), "1 lists every pid");
        let stacked = format!("{LINE}rw,hidepid=invisible\n{LINE}rw\n");
        assert!(!proc_hides(&stacked), "the mount on top counts");
        let other = "26 30 0:24 / /proc/sys/fs/binfmt_misc rw - binfmt_misc x rw,hidepid=2";
        assert!(!proc_hides(other), "another mount point");
    }

    #[test]
    fn the_runs_namespace_hides_what_the_executor_sees() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIP: the_runs_namespace_hides_what_the_executor_sees: needs root");
            return;
        }
        let ProcSetup::Namespace(ns) = set_up(true) else {
            // A host whose /proc hides already, or an old kernel.
            println!(
                "SKIP: the_runs_namespace_hides_what_the_executor_sees: no runs' namespace here"
            );
            return;
        };
        let here = fs::read_link("/proc/self/ns/mnt").unwrap();
        let theirs = fs::read_link(format!("/proc/self/fd/{}", ns.mount_ns().as_raw_fd())).unwrap();
        assert_ne!(here, theirs, "the executor stays in its own namespace");
        let opts = fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!proc_hides(&opts), "the executor's /proc is unchanged");
        let proc_dir = format!("/proc/self/fd/{}", ns.proc_dir_fd());
        assert!(fs::metadata(format!("{proc_dir}/loadavg")).is_ok(), "global files stay");
    }
}
