//! Reaping: the run's main process by pid, and orphans of any run.
//!
//! The executor is a child subreaper, so a skill's daemonised leftovers are
//! reparented to it (this machine's PID 1 does not reap). Reaping "any
//! child" could take a main process's status from under its run; such a
//! status is parked here and handed to its run. The binary reaps orphans
//! as they exit ([`Reaper::reap_in_background`]): a zombie still counts
//! against its run's `pids` bound, so a skill that starts detached
//! helpers one after another would otherwise run out of processes with
//! only a few alive.
//!
//! A main process is tracked only once `clone` has returned its pid, and a
//! skill that exits at once (`exit 3`) can be gone before that: another
//! run's [`Reaper::reap_orphans`] may reap it first. So the status of every
//! untracked child reaped here is kept for [`UNCLAIMED_TTL`] too, the last
//! [`UNCLAIMED_MAX`] of them at most, and [`Reaper::collect`] takes it from
//! there when its own `waitpid` finds no child (without it a soak test saw
//! 12 runs in 1932 reported `signaled`, "the process vanished").

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sys::process::{self, Exit};

/// How long the status of an untracked child is kept for a run that has
/// not tracked its main process yet.
pub const UNCLAIMED_TTL: Duration = Duration::from_secs(30);

/// At most this many statuses are kept, the newest: a fork bomb's orphans
/// exit by the thousand a second, and a map keeps the room it once took
/// (65,536 slots, 3 MiB, in a soak; with this bound 16,384 at most, 0.8
/// MiB). A run collects its main process's status tens of milliseconds
/// after its exit at most; a bomb's 5,000 exits a second take 0.8 s to
/// crowd it out.
pub const UNCLAIMED_MAX: usize = 4096;

/// How long the background reaper lets exits gather once one is there.
const GATHER: Duration = Duration::from_millis(1);

/// How long the background reaper waits before it looks again when the
/// process has no child at all.
const NO_CHILD_NAP: Duration = Duration::from_millis(50);

/// Parked exit statuses of the main processes being supervised, and of
/// recently reaped untracked children.
#[derive(Debug, Default)]
pub struct Reaper {
    mains: Mutex<HashMap<i32, Option<Exit>>>,
    unclaimed: Mutex<Unclaimed>,
}

/// Statuses of untracked children, by pid and in the order they were
/// reaped (the order may hold pids claimed since: a claim leaves it as is),
/// each numbered: a pid reaped again has a newer number.
#[derive(Debug, Default)]
struct Unclaimed {
    by_pid: HashMap<i32, (Exit, u64)>,
    order: VecDeque<(i32, u64, Instant)>,
    next: u64,
}

impl Unclaimed {
    fn remove(&mut self, pid: i32) -> Option<Exit> {
        self.by_pid.remove(&pid).map(|(exit, _)| exit)
    }

    /// Keeps `pid`'s status, the oldest one dropped past [`UNCLAIMED_MAX`].
    fn keep(&mut self, pid: i32, exit: Exit, now: Instant) {
        self.drop_while(|len, _| len >= UNCLAIMED_MAX);
        self.by_pid.insert(pid, (exit, self.next));
        self.order.push_back((pid, self.next, now));
        self.next += 1;
    }

    /// Drops the statuses kept past [`UNCLAIMED_TTL`].
    fn expire(&mut self, now: Instant) {
        self.drop_while(|_, at| now.duration_since(at) >= UNCLAIMED_TTL);
    }

    /// Drops the oldest statuses while `drop(kept, reaped_at)` holds.
    fn drop_while(&mut self, drop: impl Fn(usize, Instant) -> bool) {
        while let Some(&(pid, n, at)) = self.order.front() {
            if !drop(self.order.len(), at) {
                break;
            }
            self.order.pop_front();
            // Unless its pid was reaped again since (a newer status).
            if self.by_pid.get(&pid).is_some_and(|&(_, kept)| kept == n) {
                self.by_pid.remove(&pid);
            }
        }
    }
}

impl Reaper {
    /// The process-wide reaper: reaping "any child" is process-wide, so
    /// every engine of the process must share one.
    pub fn global() -> &'static Reaper {
        static GLOBAL: std::sync::OnceLock<Reaper> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(Reaper::default)
    }

    /// Tracks `pid` as a run's main process. Tracking it again keeps a
    /// status already parked for it (a warm run, tracked when it was made,
    /// may have been reaped as it was taken).
    pub fn track(&self, pid: i32) {
        self.lock().entry(pid).or_insert(None);
    }

    /// Stops tracking `pid` (a main process given up on, still alive): its
    /// exit, when it comes, is reaped as an orphan's, kept as theirs are,
    /// and never parked for a later process that gets the same pid once the
    /// kernel reuses it.
    pub fn forget(&self, pid: i32) {
        self.lock().remove(&pid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Option<Exit>>> {
        // A poisoned map is still consistent (every update is one insert).
        self.mains.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The exit of `pid` if it has ended (reaping it), else `None`.
    pub fn collect(&self, pid: i32) -> Option<Exit> {
        let mut mains = self.lock();
        if let Some(Some(exit)) = mains.get(&pid) {
            let exit = *exit;
            mains.remove(&pid);
            return Some(exit);
        }
        match process::wait(pid, true) {
            Ok(Some((_, exit))) => {
                mains.remove(&pid);
                self.unclaimed().remove(pid);
                Some(exit)
            }
            Ok(None) => None,
            Err(_) => {
                // Not our child any more: reaped as an orphan before it was
                // tracked, else nothing to wait for.
                mains.remove(&pid);
                let early = self.unclaimed().remove(pid);
                Some(early.unwrap_or(Exit { code: None, signal: None, cpu_us: 0 }))
            }
        }
    }

    /// Reaps every exited child that is not a tracked main process (whose
    /// status is parked instead).
    pub fn reap_orphans(&self) {
        let mut mains = self.lock();
        let now = Instant::now();
        let mut unclaimed = self.unclaimed();
        unclaimed.expire(now);
        while let Ok(Some((pid, exit))) = process::wait(-1, true) {
            if let Some(slot) = mains.get_mut(&pid) {
                *slot = Some(exit);
            } else {
                unclaimed.keep(pid, exit, now);
            }
        }
    }

    /// Reaps children as they exit, on a thread of its own, for the rest of
    /// the process (the first call starts it; later ones do nothing). The
    /// executor's binary calls it: an engine inside another program (a test
    /// harness, a bench) leaves that program's own children to it, and
    /// reaps orphans only as runs end.
    ///
    /// # Errors
    ///
    /// The thread could not be started.
    pub fn reap_in_background(&'static self) -> std::io::Result<()> {
        static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if STARTED.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
        let reap = move || loop {
            match process::until_a_child_exits() {
                Ok(()) => {
                    // Orphans exit in crowds (a shell's pipeline, a bomb):
                    // one pass a little later reaps many for one wake.
                    std::thread::sleep(GATHER);
                    self.reap_orphans();
                }
                // No child yet (or an unexpected errno): look again soon.
                Err(_) => std::thread::sleep(NO_CHILD_NAP),
            }
        };
        std::thread::Builder::new().name("ongrid-reaper".to_owned()).spawn(reap).map(drop)
    }

    fn unclaimed(&self) -> std::sync::MutexGuard<'_, Unclaimed> {
        // Always taken after `mains` (lock order), and consistent when poisoned.
        self.unclaimed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Up to 10 s for `pid` to be a zombie (or reaped by another test).
    fn wait_for_zombie(pid: i32) {
        let zombie = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
        };
        let reaped = || Reaper::global().unclaimed().by_pid.contains_key(&pid);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !zombie() && !reaped() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A main process reaped as an orphan before its run tracked it keeps
    /// its exit status. The process-wide reaper is used because other tests
    /// of this binary reap "any child" through it concurrently: a private
    /// one could lose the child to them.
    #[test]
    fn a_main_reaped_before_it_was_tracked_keeps_its_status() {
        let reaper = Reaper::global();
        let child = std::process::Command::new("/bin/sh").args(["-c", "exit 3"]).spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        // Wait until it is a zombie, then let "another run" reap it.
        wait_for_zombie(pid);
        reaper.reap_orphans();
        reaper.track(pid);
        let exit = reaper.collect(pid).expect("an exit");
        assert_eq!(exit.code, Some(3), "{exit:?}");
        // Claimed once.
        assert!(!reaper.unclaimed().by_pid.contains_key(&pid));
        drop(child);
    }

    /// Kept statuses go once past their time, or once newer ones crowd
    /// them out: the newest [`UNCLAIMED_MAX`] at most, in a map whose room
    /// stays bounded however many come and go. A pid reaped again keeps
    /// its newer status, even within the same instant.
    #[test]
    fn kept_statuses_are_bounded_in_time_and_number() {
        let exit = |code| Exit { code: Some(code), signal: None, cpu_us: 0 };
        let start = Instant::now();
        let mut u = Unclaimed::default();
        u.keep(1, exit(1), start);
        u.keep(2, exit(2), start + Duration::from_secs(1));
        u.expire(start + UNCLAIMED_TTL);
        assert_eq!(u.remove(1), None, "past its time");
        assert_eq!(u.remove(2), Some(exit(2)));

        // A bomb's worth: 100,000 statuses, pid 7 reaped again midway.
        let mut u = Unclaimed::default();
        let max = i32::try_from(UNCLAIMED_MAX).unwrap();
        u.keep(7, exit(1), start);
        for pid in 100..100_100 {
            u.keep(pid, exit(0), start);
            if pid == 100 + max / 2 {
                u.keep(7, exit(2), start);
            }
        }
        assert_eq!(u.by_pid.len(), UNCLAIMED_MAX, "the newest kept, no more");
        assert_eq!(u.order.len(), UNCLAIMED_MAX);
        let room = u.by_pid.capacity();
        assert!(room <= 4 * UNCLAIMED_MAX, "the map's room grew to {room}");
        assert_eq!(u.remove(100_099 - max), None, "crowded out");
        assert_eq!(u.remove(100_100 - max), Some(exit(0)));
        assert_eq!(u.remove(7), None, "crowded out at its newer reap's turn");

        // Reaped twice in one pass (one instant): the older turn leaves the
        // newer status.
        let mut u = Unclaimed::default();
        u.keep(7, exit(1), start);
        u.keep(7, exit(2), start);
        for pid in 100..100 + max - 1 {
            u.keep(pid, exit(0), start);
        }
        assert_eq!(u.order.front().map(|&(pid, ..)| pid), Some(7), "one turn of 7 left");
        assert_eq!(u.remove(7), Some(exit(2)), "the older turn took the newer status");
    }

    /// A main process given up on while alive leaves no status parked for
    /// its pid once it is reaped: a later process with the same pid, once
    /// tracked, would be taken for exited.
    #[test]
    fn a_forgotten_main_parks_no_status() {
        let reaper = Reaper::global();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        reaper.track(pid);
        reaper.forget(pid);
        child.kill().unwrap();
        wait_for_zombie(pid);
        reaper.reap_orphans();
        assert!(reaper.unclaimed().by_pid.contains_key(&pid), "it was not reaped as an orphan");
        assert!(!reaper.lock().contains_key(&pid), "a status is parked for its pid");
        drop(child);
    }
}
