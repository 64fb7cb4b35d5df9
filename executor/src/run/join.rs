//! Step 4c made by the run for its parked child: the run's thread writes
//! the child's pid into the leaves' `cgroup.procs` while the child takes
//! its other steps, and the child waits for that before `execve`.
//!
//! A child joining its cgroups itself writes "0" to each `cgroup.procs`:
//! three writes (the v2 leaf, the v1 `pids` and `memory` leaves), each
//! making the kernel a new `css_set`, ~35 µs of the child's ~110 µs
//! between its wake-up and its `exec` on the dev machine. The only run in flight has nothing else to do
//! meanwhile: it watches for the exec without sleeping
//! (`engine`'s [`EXEC_SPIN`](crate::run::spin::EXEC_SPIN)). So when it spins,
//! the run offers to make the joins itself, on its own CPU, while the
//! child sets up its descriptors, limits, user and Landlock domain on the
//! other ([`Joining`] says who settles the offer); a child that took the
//! offer up waits for the run as its last step before the exec, and fails
//! with [`Step::Cgroup`] (the run's errno) if a write failed. With other
//! runs in flight (no spin) the CPU is theirs and the child joins itself,
//! as a child made for its run always does.
//!
//! The pid is the run's to write, never another process's: the run takes
//! it from the handoff only once the child took the offer up (after it
//! took the spec and stored its pid and pidfd there);
//! from then on the spawner thread reaps the child only after the run let
//! its berth go, and the run writes while holding the lock of every wait
//! for "any child" (the orphan reaper's), having checked through the
//! child's pidfd that it is not reaped yet (`process::while_unreaped`). A
//! child that exited meanwhile is not moved (the kernel skips an exiting
//! task); its own failure is the run's.
//!
//! A child the run moves joins its memory cgroup later on its way than
//! one that moves itself: the few kernel objects of its steps 4d-4i (its
//! own descriptor table, Landlock domain, new credentials) are charged to
//! the executor's memory cgroup, a small fixed amount per run that the
//! run's bound does not count. Everything the skill allocates from its
//! `exec` on is the run's.

use std::io::Write;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use crate::sys::call;
use crate::sys::futex::{futex_wait, futex_wake};
use crate::sys::spec::Step;

/// The child writes "0" itself: nothing was offered, or the run withdrew
/// its offer before the child took it up.
const BY_CHILD: u32 = 0;
/// The run offers to make the joins ([`Joining::offer`]).
const OFFERED: u32 = 1;
/// The child took the offer up at step 4c ([`Joining::accept`]): it waits
/// before `execve`, and the run must make the joins.
const WAITING: u32 = 2;
/// The run wrote the pid into every `cgroup.procs`.
const JOINED: u32 = 3;
/// A write failed, or the child was gone: `errno` says why.
const FAILED: u32 = 4;

/// Who makes the child's cgroup joins, and how they went; the futex word
/// the child waits on. Lives in the run's handoff.
///
/// The run offers before the child can see the spec; the child takes the
/// offer up at step 4c, and the run, which watches for that (yielding its
/// CPU, so a child queued behind it there runs) for as long as it would
/// watch for the exec, then writes. A child gone before step 4c, or not
/// there by then, leaves the offer open: the run withdraws it (the child,
/// or one made for the run in its place, joins itself). Withdrawing at once
/// instead, when the child had not answered yet, was tried: the run
/// nearly always came first, and the joins stayed on the child's path.
#[derive(Debug, Default)]
pub struct Joining {
    state: AtomicU32,
    errno: AtomicI32,
}

impl Joining {
    /// The run offers to make the joins: set before the child can see the
    /// spec.
    pub fn offer(&self) {
        self.state.store(OFFERED, Ordering::Release);
    }

    /// The child at step 4c: whether the run makes the joins (the offer
    /// taken up now, or earlier); `false`: the child writes "0" itself.
    pub(crate) fn accept(&self) -> bool {
        match self.state.compare_exchange(OFFERED, WAITING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(now) => now != BY_CHILD,
        }
    }

    /// Whether the offer is still open (neither side settled it).
    pub fn open(&self) -> bool {
        self.state.load(Ordering::Acquire) == OFFERED
    }

    /// The run, once the child has the spec: `true` if the child took the
    /// offer up, and the run must now make the joins ([`Joining::join`] or
    /// [`Joining::gone`]); `false` if it was withdrawn in time (or never
    /// made), and the child joins itself.
    pub fn withdraw(&self) -> bool {
        match self.state.compare_exchange(OFFERED, BY_CHILD, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => false,
            Err(now) => now == WAITING,
        }
    }

    /// Writes `pid` into each of `procs` (in order, stopping at the first
    /// failure), then tells the child, waking it if it waits already.
    /// The caller guarantees `pid` is the unreaped child that took the
    /// spec, and that `procs` are its run's open `cgroup.procs` files.
    pub fn join(&self, pid: libc::pid_t, procs: &[RawFd]) {
        let mut digits = [0u8; 12];
        let text = decimal(pid, &mut digits);
        // Never "0" (or less): that would move the executor itself.
        let mut failed = (pid <= 0).then_some(libc::ESRCH);
        if failed.is_none() {
            // In order, stopping at the first failure.
            failed = procs.iter().find_map(|fd| match call::write(*fd, text) {
                Ok(n) if usize::try_from(n).ok() == Some(text.len()) => None,
                Ok(_) => Some(libc::EIO),
                Err(errno) => Some(errno),
            });
        }
        match failed {
            Some(errno) => {
                self.errno.store(errno, Ordering::Relaxed);
                self.state.store(FAILED, Ordering::Release);
            }
            None => self.state.store(JOINED, Ordering::Release),
        }
        self.wake();
    }

    /// The child was reaped before the run could write its pid: it is
    /// gone (its own exit is its run's outcome), nothing is written.
    pub fn gone(&self) {
        self.errno.store(libc::ESRCH, Ordering::Relaxed);
        self.state.store(FAILED, Ordering::Release);
        self.wake();
    }

    /// Wakes the child if it waits on the word already.
    fn wake(&self) {
        futex_wake(&self.state, true);
    }

    /// The child, before `execve`: waits until the run is done with the
    /// joins; its failure is the child's at [`Step::Cgroup`]. Raw system
    /// calls only.
    pub(crate) fn wait(&self) -> Result<(), (Step, i32)> {
        loop {
            match self.state.load(Ordering::Acquire) {
                // The run keeps the handoff until our exec or exit.
                WAITING => futex_wait(&self.state, WAITING, true),
                FAILED => return Err((Step::Cgroup, self.errno.load(Ordering::Relaxed))),
                _ => return Ok(()),
            }
        }
    }
}

/// `n` in decimal, in `buf`, without allocating.
fn decimal(n: libc::pid_t, buf: &mut [u8; 12]) -> &[u8] {
    let mut rest = &mut buf[..];
    // 12 bytes hold any i32 ("-2147483648" is 11).
    let _ = write!(rest, "{n}");
    let len = 12 - rest.len();
    &buf[..len]
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn pids_are_written_in_decimal() {
        let mut buf = [0u8; 12];
        assert_eq!(decimal(0, &mut buf), b"0");
        assert_eq!(decimal(7, &mut buf), b"7");
        assert_eq!(decimal(4_194_304, &mut buf), b"4194304");
        assert_eq!(decimal(i32::MAX, &mut buf), b"2147483647");
    }

    /// Whoever settles the offer first decides: a child that took it up
    /// waits for the run, which must join; an offer withdrawn first is
    /// the child's to join; no offer, no wait.
    #[test]
    fn the_first_to_settle_the_offer_decides() {
        let none = Joining::default();
        assert!(!none.accept(), "no offer: the child joins itself");
        assert!(!none.withdraw(), "no offer: nothing for the run to join");
        assert_eq!(none.wait(), Ok(()));

        let withdrawn = Joining::default();
        withdrawn.offer();
        assert!(!withdrawn.withdraw());
        assert!(!withdrawn.accept(), "withdrawn first: the child joins itself");

        let taken = Joining::default();
        taken.offer();
        assert!(taken.accept());
        assert!(taken.accept(), "asked again, the answer stands");
        assert!(taken.withdraw(), "taken up first: the run must join");
    }

    /// The child goes on once the run is done, and fails with the run's
    /// errno when a write failed (here: a descriptor open read-only) or
    /// when the child was gone; a pid of 0 is never written.
    #[test]
    fn the_wait_ends_with_the_runs_outcome() {
        let dir = std::env::temp_dir().join(format!("ongrid-join-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("procs");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let accepted = || {
            let joining = Joining::default();
            joining.offer();
            assert!(joining.accept());
            assert!(joining.withdraw());
            joining
        };
        let joining = accepted();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| joining.wait());
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!waiter.is_finished(), "the child went on before the run wrote");
            joining.join(4321, &[file.as_raw_fd()]);
            assert_eq!(waiter.join().unwrap(), Ok(()));
        });
        let mut written = String::new();
        file.rewind().unwrap();
        file.read_to_string(&mut written).unwrap();
        assert_eq!(written, "4321");

        let read_only = std::fs::File::open(&path).unwrap();
        let joining = accepted();
        joining.join(4321, &[file.as_raw_fd(), read_only.as_raw_fd()]);
        assert_eq!(joining.wait(), Err((Step::Cgroup, libc::EBADF)));

        let joining = accepted();
        joining.gone();
        assert_eq!(joining.wait(), Err((Step::Cgroup, libc::ESRCH)));

        // No pid is never "0", which would move the writer itself.
        let before = std::fs::metadata(&path).unwrap().len();
        let joining = accepted();
        joining.join(0, &[file.as_raw_fd()]);
        assert_eq!(joining.wait(), Err((Step::Cgroup, libc::ESRCH)));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), before);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
