//! Spawner threads: each carries one seccomp filter and creates children
//! from it, so every child inherits the filter instead of compiling its own.
//!
//! `seccomp(SECCOMP_SET_MODE_FILTER)` converts the classic program to eBPF,
//! JIT-compiles it and runs it once per syscall number to build the
//! kernel's cache of always-allowed calls: about 90 µs for the runs'
//! 136-instruction program on the dev machine, the largest single cost of a
//! spawn after the `exec` itself. A filter
//! that a thread already carries is shared with a child it creates by a
//! reference count (`copy_seccomp` in `clone`).
//!
//! The filter is installed without `SECCOMP_FILTER_FLAG_TSYNC`, so it
//! applies to the spawner thread alone (and its children); the executor's
//! other threads stay unfiltered. Before it, the thread sets `no_new_privs`
//! on itself, which `seccomp(2)` requires without `CAP_SYS_ADMIN` (the
//! child sets it in step 4f anyway). Nothing the spawner thread or the
//! child does before `execve` is on the deny-list (`clone` without
//! `CLONE_NEW*` flags, `setsid`, `prctl`, `capset`, `landlock_*`...).
//!
//! Each thread keeps a child made ahead of the next spawn, parked in its
//! berth (`sys::berth`) after the steps that do not depend on the run
//! (`clone`, the signal resets, `setsid`): a spawn hands its spec to a
//! parked child and wakes it, instead of waking a thread that then makes the child
//! (a parked child cut a served run's latency to 0.13-0.17x of a bare
//! run's).
//! See `run::lend` for the run's side, `sys::berth` for what a parked
//! child holds.
//!
//! The threads also fix which thread a child's parent-death signal is tied
//! to (the kernel sends it when the *creating thread* exits): they live as
//! long as their [`Spawner`], which the engine drops only after its runs.
//!
//! When it may (`CAP_SETPCAP`, a root executor), each thread also empties
//! its own capability bounding set (a per-thread attribute), once: a
//! child without granted capabilities inherits it empty and skips its
//! ~40 `PR_CAPBSET_DROP`s, each a new set of credentials (~20 µs per
//! spawn). A child granted capabilities needs them in its bounding set:
//! it is not created here (the run path's `spawn`), and one that were
//! would fail its `capset`, not run with less than asked silently.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsFd;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sched::CloneFlags;

use super::lend;
use crate::host::procview::RunsNamespace;
use crate::sys::berth::{Berth, Job, Unparked};
use crate::sys::process;
use crate::sys::spec::{ChildSpec, SpawnFailure, Spawned};

/// A pool of threads carrying one seccomp filter; see the module docs.
#[derive(Debug)]
pub struct Spawner {
    queue: Arc<Queue>,
    threads: Vec<JoinHandle<()>>,
}

/// The spawns waiting for a spawner thread, and the threads' berths.
///
/// A spawner thread with nothing to do keeps a child parked in its berth
/// (listed in `idle`): a spawn gives its spec to one of them and wakes
/// only that child. With no child parked (every thread busy, or parking
/// failed) the spawn waits in `jobs` for the next thread that is done; a
/// thread whose parking failed waits on `ready` for one job, which it
/// serves with a child made for it, before it parks again.
#[derive(Debug)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
    /// One berth per thread, by thread index.
    berths: Box<[Berth]>,
    /// Tests: set, a thread back from `park` stops there (counted in
    /// `held`) until it is cleared.
    #[cfg(test)]
    hold: std::sync::atomic::AtomicBool,
    #[cfg(test)]
    held: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    /// The threads whose berth holds a child that may be given a spec.
    idle: Vec<usize>,
    closed: bool,
}

impl Queue {
    fn new(threads: usize) -> Self {
        Queue {
            state: Mutex::new(QueueState::default()),
            ready: Condvar::new(),
            berths: std::iter::repeat_with(Berth::default).take(threads).collect(),
            #[cfg(test)]
            hold: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            held: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Tests: waits here while `hold` is set.
    #[cfg(test)]
    fn hold_here(&self) {
        use std::sync::atomic::Ordering;
        if self.hold.load(Ordering::Acquire) {
            self.held.fetch_add(1, Ordering::AcqRel);
            while self.hold.load(Ordering::Acquire) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            self.held.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // Every update is one push, pop or flag: a poisoned state is whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives `job` to a parked child (`Ok(Some(berth))`: its handoff tells
    /// the outcome first), else queues it (`Ok(None)`: the reply tells it);
    /// gives it back when the spawner is closed.
    fn push(&self, job: Job) -> Result<Option<&Berth>, Job> {
        let mut st = self.lock();
        if st.closed {
            return Err(job);
        }
        let mut job = job;
        if let Some(i) = st.idle.pop() {
            let berth = &self.berths[i];
            // The berth holds the job until thread `i` takes it back after
            // its `park` returned (`Berth::take`).
            match berth.give(job) {
                Ok(()) => {
                    drop(st);
                    berth.wake();
                    return Ok(Some(berth));
                }
                Err(back) => job = back,
            }
        }
        st.jobs.push_back(job);
        drop(st);
        self.ready.notify_one();
        Ok(None)
    }

    /// The next job without waiting, or `Err(())` once closed and empty.
    fn try_pop(st: &mut QueueState) -> Result<Option<Job>, ()> {
        match st.jobs.pop_front() {
            Some(job) => Ok(Some(job)),
            None if st.closed => Err(()),
            None => Ok(None),
        }
    }

    /// The next job; `None` once closed and empty.
    fn pop(&self) -> Option<Job> {
        let mut st = self.lock();
        loop {
            match Self::try_pop(&mut st) {
                Ok(Some(job)) => return Some(job),
                Err(()) => return None,
                Ok(None) => st = self.ready.wait(st).unwrap_or_else(PoisonError::into_inner),
            }
        }
    }

    fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        let parked = std::mem::take(&mut st.idle);
        for i in &parked {
            self.berths[*i].leave();
        }
        drop(st);
        for i in parked {
            self.berths[i].wake();
        }
        self.ready.notify_all();
    }
}

impl Spawner {
    /// Starts `threads` threads (at least one), each carrying `program`
    /// and parking a child ahead of the first spawn.
    ///
    /// # Errors
    ///
    /// A thread could not be started, or `no_new_privs` or the filter could
    /// not be installed on it (no thread is left running then).
    pub fn start(
        program: &'static [libc::sock_filter],
        threads: usize,
        name: &str,
    ) -> io::Result<Self> {
        Self::start_with(program, 0, threads, name)
    }

    /// [`Spawner::start`] with the filter installed with `flags`
    /// (`SECCOMP_FILTER_FLAG_LOG` where the runs' refusals are read back).
    ///
    /// # Errors
    ///
    /// As [`Spawner::start`].
    pub fn start_with(
        program: &'static [libc::sock_filter],
        flags: u32,
        threads: usize,
        name: &str,
    ) -> io::Result<Self> {
        Self::start_in(None, program, flags, threads, name)
    }

    /// [`Spawner::start_with`] with each thread first joining the runs'
    /// mount namespace `ns` (`host::procview`), which its children then
    /// inherit: they need no `setns` of their own, which the thread's
    /// filter would deny.
    ///
    /// # Errors
    ///
    /// As [`Spawner::start`], or a thread could not join `ns`.
    pub fn start_in(
        ns: Option<Arc<RunsNamespace>>,
        program: &'static [libc::sock_filter],
        flags: u32,
        threads: usize,
        name: &str,
    ) -> io::Result<Self> {
        let threads = threads.max(1);
        let queue = Arc::new(Queue::new(threads));
        let mut spawner = Spawner { queue: Arc::clone(&queue), threads: Vec::new() };
        let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
        for me in 0..threads {
            let (ready, installed) = mpsc::sync_channel(1);
            let queue = Arc::clone(&queue);
            let ns = ns.clone();
            let handle = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
                let r = ns.as_deref().map_or(Ok(()), enter).and_then(|()| install(program, flags));
                let ok = r.is_ok();
                let _ = ready.send(r);
                if ok {
                    serve(&queue, me, parent, clear_bounding());
                }
            })?;
            spawner.threads.push(handle);
            // Dropping `spawner` on an error stops the threads started.
            installed.recv().map_err(|_| io::Error::other("spawner thread ended"))??;
        }
        Ok(spawner)
    }

    /// [`Spawner::spawn_spinning`] without the spin (the tests').
    #[cfg(test)]
    pub fn spawn(&self, spec: &ChildSpec<'_>) -> Result<Spawned, SpawnFailure> {
        self.spawn_spinning(spec, Duration::ZERO, || {})
    }

    /// Creates the child of `spec` on a spawner thread: a parked child
    /// takes it (`run::lend`), else one made for it (`child::spawn`);
    /// `spec.seccomp` should be empty (the thread's filter applies). Blocks
    /// the calling thread until the child has exec'd or failed, as
    /// `child::spawn` does; for up to `spin` of that without sleeping,
    /// when a parked child took it (`run::lend`); with a nonzero
    /// `spin` the calling thread also offers to make that child's cgroup
    /// joins (step 4c, `run::join`) while it works. `meanwhile` runs once
    /// the spec is handed over (and those joins made), while the child
    /// works towards its `exec`: what the run has to do that its child
    /// need not wait for.
    ///
    /// # Errors
    ///
    /// As `child::spawn`; a spawner that is gone is a `clone` failure
    /// (`EAGAIN`).
    pub fn spawn_spinning(
        &self,
        spec: &ChildSpec<'_>,
        spin: Duration,
        meanwhile: impl FnOnce(),
    ) -> Result<Spawned, SpawnFailure> {
        lend::lend(spec, spin, |job| self.queue.push(job), meanwhile)
    }

    /// How many threads have a child parked now.
    #[cfg(test)]
    fn parked(&self) -> usize {
        self.queue.lock().idle.len()
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // Closing the queue tells the parked children to leave and ends
        // every thread's loop once it is empty.
        self.queue.close();
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

/// `no_new_privs`, then the filter, on the calling thread only.
/// Moves the calling thread, with a filesystem context of its own, into
/// the runs' mount namespace.
fn enter(ns: &RunsNamespace) -> io::Result<()> {
    nix::sched::unshare(CloneFlags::CLONE_FS)?;
    nix::sched::setns(ns.mount_ns(), CloneFlags::CLONE_NEWNS)?;
    Ok(())
}

fn install(program: &[libc::sock_filter], flags: u32) -> io::Result<()> {
    process::set_no_new_privs()?;
    process::install_thread_filter(program, flags)
}

/// Empties the calling thread's capability bounding set; false (and the
/// set as it was, or partly dropped) without `CAP_SETPCAP`.
fn clear_bounding() -> bool {
    (0..=process::cap_last_cap().min(63)).all(process::drop_bounding)
}

/// A spawner thread's loop until the queue closes: a queued job first,
/// else a child parked in berth `me` until a spawn gives it a spec.
/// `parent`: the executor's pid; `cleared`: this thread's bounding set is
/// empty ([`clear_bounding`]).
fn serve(queue: &Queue, me: usize, parent: libc::pid_t, cleared: bool) {
    let berth = &queue.berths[me];
    loop {
        let mut st = queue.lock();
        match Queue::try_pop(&mut st) {
            Err(()) => return,
            Ok(Some(job)) => {
                drop(st);
                job.spawn_child(cleared);
                continue;
            }
            Ok(None) => {}
        }
        berth.ready();
        st.idle.push(me);
        drop(st);
        let unparked = berth.park(parent, cleared);
        #[cfg(test)]
        queue.hold_here();
        let mut st = queue.lock();
        st.idle.retain(|i| *i != me);
        let (job, pidfd) = berth.take();
        drop(st);
        // Reaps a parked child that no run took, by its pidfd (never another
        // process that reused its pid), and closes the pidfd.
        if let Some(pidfd) = pidfd {
            let _ = process::reap_pidfd(pidfd.as_fd());
        }
        let parking_failed = match (unparked, job) {
            (Unparked::Ended { .. }, Some(job)) => {
                if job.handoff().spawned().is_some() {
                    // The run took the child (pid and pidfd) from the
                    // handoff when the kernel woke it at the exec.
                    continue;
                }
                match job.handoff().failure() {
                    // A step failed after the child took the spec: its exit
                    // woke the run, which waits for this reply.
                    Some(failure) => job.answer(Err(failure)),
                    // The child died before it took the spec (killed while
                    // parked, or parking failed): the job is not lost, a
                    // child is made for it (the job's drop then wakes the
                    // run, which reads the reply).
                    None => job.spawn_child(cleared),
                }
                None
            }
            (Unparked::NotCreated(_), Some(job)) => {
                job.spawn_child(cleared);
                None
            }
            (Unparked::Ended { failure }, None) => failure,
            (Unparked::NotCreated(failure), None) => Some(failure),
        };
        if let Some(failure) = parking_failed {
            // Parking failed (`clone` refused: the pids limit?): serve the
            // next job with a child made for it, then try again.
            tracing::debug!(
                "spawner: cannot park a child ({}: errno {}); the next run's child is made \
                 for it",
                failure.step.describe(),
                failure.errno
            );
            match queue.pop() {
                Some(job) => job.spawn_child(cleared),
                None => return,
            }
        }
        // Else: told to leave (the loop then finds the queue closed), or
        // killed while parked, or done: park another.
    }
}

#[cfg(test)]
mod tests;
