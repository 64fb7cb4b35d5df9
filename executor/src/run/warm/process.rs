//! One warm run: its process, boxed and blocked reading its args, and
//! what it was made from; whether it may still serve a request, and how
//! its tree is killed (the pools are the parent module's).

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::host::instance::PgidRecord;
use crate::run::denials::Watch;
use crate::run::parsed::FileKey;
use crate::run::plan::Plan;
use crate::run::spawn::{Child, Prepared};
use crate::sandbox::cgroup::RunCgroup;
use crate::sys;

/// A warm run: its plan, its prepared sandbox and its exec'd child, whose
/// stdin is open and empty ([`crate::run::spawn::spawn_waiting`]).
#[derive(Debug)]
pub struct Warm {
    /// The plan it was made from (with the args `{}`, never written).
    pub(crate) plan: Plan,
    /// The `SKILL.md` tool it runs, if any.
    pub(crate) tool: Option<String>,
    /// Its slot and sandbox.
    pub(crate) prep: Prepared,
    /// Its process and the parent's pipe ends.
    pub(crate) child: Child,
    /// Without a cgroup, its process group recorded for the watchdog.
    pub(crate) pgid: Option<PgidRecord>,
    /// Its refusals, watched since its spawn (when they are watched).
    pub(crate) watch: Option<Watch>,
    pub(super) made: Instant,
    /// The run slot it holds while idle; `None` once lent to a request of
    /// its skill (`WarmPools::lend_slot`).
    pub(super) permit: Option<OwnedSemaphorePermit>,
    /// When its slot was lent, if it was.
    pub(super) lent_at: Option<Instant>,
    /// The pools' generation it was made in: a discard of them all (a
    /// reload) since then also discards it when a held request has it.
    pub(super) generation: u64,
    /// Its tree was killed ([`Warm::kill_tree`]).
    killed: bool,
}

impl Warm {
    /// A warm run made now from these parts.
    pub(crate) fn new(
        plan: Plan,
        tool: Option<String>,
        prep: Prepared,
        (child, pgid): (Child, Option<PgidRecord>),
        watch: Option<Watch>,
    ) -> Self {
        let made = Instant::now();
        let (permit, lent_at, generation, killed) = (None, None, 0, false);
        Warm { plan, tool, prep, child, pgid, watch, made, permit, lent_at, generation, killed }
    }

    /// Why it must not serve a request, if it must not: it wrote to stdout
    /// or stderr, or exited (its pidfd readable), or closed its stdin (the
    /// pipe's write end reports an error: no reader is left), while nobody
    /// had written its args.
    pub(super) fn spoiled(&self) -> Option<&'static str> {
        let c = &self.child;
        let Some((stdin, _)) = &c.stdin else { return Some("its stdin is closed") };
        let mut polled = [
            PollFd::new(c.stdout.as_fd(), PollFlags::POLLIN),
            PollFd::new(c.stderr.as_fd(), PollFlags::POLLIN),
            PollFd::new(c.pidfd.as_fd(), PollFlags::POLLIN),
            // Only POLLERR and POLLHUP, which poll always reports.
            PollFd::new(stdin.as_fd(), PollFlags::empty()),
        ];
        match nix::poll::poll(&mut polled, PollTimeout::ZERO) {
            Ok(0) => None,
            Ok(_) => {
                let ready = |p: &PollFd<'_>| p.revents().is_some_and(|r| !r.is_empty());
                if ready(&polled[2]) {
                    Some(EXITED)
                } else if ready(&polled[3]) {
                    Some(CLOSED_STDIN)
                } else {
                    Some(WROTE)
                }
            }
            Err(nix::errno::Errno::EINTR) => None,
            Err(_) => Some("its pipes cannot be polled"),
        }
    }

    /// Kills its whole tree now, once (`SIGKILL` to its cgroup leaf or,
    /// without one that lists it, to its process group: the warm run leads
    /// its own session, and the main process); it is reaped and its slot
    /// cleaned up by `Maker::kill`. The group is signalled before the main
    /// process, while that is provably not reaped, so its number is still
    /// the group's; a main process that exited unused is reaped at once by
    /// the reaper thread, and then the group is signalled all the same, as
    /// a cold run's rest is: while any process of it lives, its number is
    /// not given to another process.
    pub(crate) fn kill_tree(&mut self) {
        if std::mem::replace(&mut self.killed, true) {
            return;
        }
        let pidfd = self.child.pidfd.as_fd();
        match thread_listing(&self.prep) {
            Some(cg) => {
                let _ = sys::process::pidfd_signal(pidfd, libc::SIGKILL);
                cg.kill();
            }
            None => {
                let group = nix::unistd::Pid::from_raw(self.child.pid);
                let kill = || nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                if sys::process::while_unreaped(pidfd.as_raw_fd(), kill).is_none() {
                    let _ = kill();
                }
                let _ = sys::process::pidfd_signal(pidfd, libc::SIGKILL);
            }
        }
    }

    /// Whether its tree was killed ([`Warm::kill_tree`]).
    pub(super) fn killed(&self) -> bool {
        self.killed
    }

    /// Whether its manifest and entry files are still the ones it was made
    /// from, as `files` found them by path (a path not in `files` counts as
    /// current).
    pub(super) fn current(&self, files: &HashMap<PathBuf, Option<FileKey>>) -> bool {
        let (manifest, entry) = self.plan.identity;
        let is = |p: &PathBuf, key: FileKey| files.get(p).is_none_or(|now| *now == Some(key));
        is(&self.plan.manifest_path, manifest) && is(&self.plan.entry, entry)
    }

    /// Sets `policy` (a cold run's) back on every thread of the run, made
    /// at `SCHED_IDLE`: its main thread first (known without a listing),
    /// then each thread its cgroup leaf lists, listed again until a pass
    /// finds no thread it had not set, so one started meanwhile by a
    /// thread still idle is not missed. A thread started after the main
    /// thread was set inherits the cold policy, so a single-threaded run
    /// (most skills) takes one listing. (Left open: a thread whose
    /// creation a still-idle thread began before that thread was set, and
    /// which enters the listing only after the last pass. Its own
    /// process's start-up, still running at the take, is the only one
    /// that can do it, and only to itself.) A run without a leaf was never
    /// made idle.
    pub(super) fn schedule_cold(&self, policy: libc::c_int) -> Result<(), String> {
        let Some(cg) = thread_listing(&self.prep) else { return Ok(()) };
        let set = |tid: libc::pid_t| match sys::call::sched_set_of(tid, policy) {
            // Gone: nothing of it is left to run at SCHED_IDLE.
            Ok(_) | Err(libc::ESRCH) => Ok(()),
            Err(errno) => {
                let e = nix::errno::Errno::from_raw(errno);
                Err(format!("setting thread {tid}'s scheduling: {e}"))
            }
        };
        let main = self.child.pid;
        // By pid only while it is provably not reaped: once reaped (it
        // exited while idle), its pid may be another process's.
        if let Some(r) = sys::process::while_unreaped(self.child.pidfd.as_raw_fd(), || set(main)) {
            r?;
        }
        let mut done = HashSet::from([main]);
        for _ in 0..8 {
            let fresh: Vec<i32> = cg
                .threads()
                .ok_or("its threads cannot be listed")?
                .into_iter()
                .filter(|t| !done.contains(t))
                .collect();
            if fresh.is_empty() {
                return Ok(());
            }
            for tid in fresh {
                set(tid)?;
                done.insert(tid);
            }
        }
        Err("its threads kept changing".to_owned())
    }

    /// Whether it holds a run slot, or may still go without one: its slot
    /// was lent (`WarmPools::lend_slot`) less than [`LENT_FOR`] ago, or
    /// one of `slots` was free for it since.
    pub(super) fn holds_slot(&mut self, slots: &Arc<Semaphore>) -> bool {
        if self.permit.is_some() || self.lent_at.is_some_and(|at| at.elapsed() < LENT_FOR) {
            return true;
        }
        self.permit = slots.clone().try_acquire_owned().ok();
        self.lent_at = None;
        self.permit.is_some()
    }

    /// Whether it was made for a request with this plan and tool.
    pub(super) fn serves(&self, plan: &Plan, tool: Option<&str>) -> bool {
        self.plan.identity == plan.identity
            && self.plan.manifest_path == plan.manifest_path
            && self.tool.as_deref() == tool
    }
}

/// The run's cgroup, when a leaf of it lists every thread of the run: the
/// one condition for making a warm run idle and for setting it back.
pub(super) fn thread_listing(prep: &Prepared) -> Option<&RunCgroup> {
    prep.cgroup.as_ref().filter(|cg| cg.can_kill())
}

/// Why a warm run is spoiled ([`Warm::spoiled`]) by what the skill did.
const EXITED: &str = "it exited before it was taken";
const CLOSED_STDIN: &str = "it closed its stdin before it was taken";
const WROTE: &str = "it wrote output before it was taken";

/// Whether `why` a warm run is discarded is the skill's doing (it did not
/// wait for its args): its grant is of no use as the skill is written.
pub(super) fn the_skills_doing(why: &str) -> bool {
    [EXITED, CLOSED_STDIN, WROTE].contains(&why)
}

/// How long a warm run whose slot was lent (`WarmPools::lend_slot`) is
/// left idle without one for the request to take it.
pub(super) const LENT_FOR: Duration = Duration::from_secs(1);
