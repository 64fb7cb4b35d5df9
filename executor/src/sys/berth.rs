//! A berth: the memory a spawner thread shares with the child it made
//! ahead of a run, and the calls that create, give, wake and release it.
//!
//! Why this is more than one kernel call: the parked child is a `CLONE_VM`
//! child on the spawner thread's stack that reads this berth, the run's
//! spec and the run's [`Handoff`] through raw pointers, so those must stay
//! valid until it has exec'd or exited, and only the type that creates the
//! child and hands it the spec can promise that. Why parked children, and
//! the run's side (the exec spin, the joins it makes for the child): see
//! `run::lend`.
//!
//! What a parked child holds: nothing of a run. It shares the executor's
//! memory (`CLONE_VM`, its stack is the spawner thread's) and descriptor
//! table (`CLONE_FILES`, so it holds no copy of a descriptor that the
//! executor closes meanwhile, such as another run's pipe), carries the
//! spawner thread's seccomp filter and empty bounding set, runs as the
//! executor's user in the executor's cgroups, with default signal
//! dispositions, in a session of its own. It dies with the executor: its
//! parent-death signal (`SIGKILL`) is set before it parks and fires when
//! the spawner thread that created it ends, as the executor's threads do
//! when it dies; a run sets it again after the uid change (step 4h).
//!
//! The lifetime rule, word by word. The spawner thread sleeps in `futex`
//! on the berth's `alive` word while its child may run on its stack. The
//! kernel zeroes `alive` when the child exits or execs before it took a
//! spec (it is the child's clear-child-tid word until then). A child that
//! takes a spec first makes the handoff's `done` word its clear-child-tid
//! address (`set_tid_address`), and the run zeroes `alive` once the kernel
//! zeroed `done` ([`Berth::child_gone`]): the run is woken by the child's
//! `exec` itself, not second-hand by the spawner thread. The spec lives on
//! the run's stack while it waits in [`lend`]: for `done`, or for the
//! job's answer, which the spawner thread sends (or drops with the job)
//! once it no longer reads the spec. The job stays in the berth until the
//! spawner thread takes it back after `park` returned ([`Berth::take`]).
//! A child told to leave ([`Berth::leave`], when the spawner closes) exits
//! without running anything; one killed while parked is reaped and
//! replaced.

use std::ffi::{c_int, c_void};
use std::os::fd::RawFd;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};

use super::call;
use super::child;
use super::futex::{futex_wait, futex_wake};
use super::spec::{ChildSpec, SpawnFailure, Spawned, Step};
use crate::run::join::Joining;

/// The parked child waits for a spec.
const WAITING: u32 = 0;
/// A spec is in the berth: run it.
const GO: u32 = 1;
/// Exit without running anything.
const LEAVE: u32 = 2;

/// One spawner thread's place for its parked child. Lives as long as the
/// spawner, so a late wake-up never touches freed memory.
#[derive(Debug, Default)]
pub struct Berth {
    /// The futex word: [`WAITING`], [`GO`] or [`LEAVE`].
    state: AtomicU32,
    /// The `&ChildSpec` of [`GO`].
    spec: AtomicPtr<c_void>,
    /// The `&Handoff` of [`GO`].
    handoff: AtomicPtr<Handoff>,
    /// The parked child's pidfd, stored by the kernel at `clone`.
    pidfd: AtomicI32,
    /// The executor's pid, checked after the parent-death signal is set.
    parent: AtomicI32,
    /// The spawner thread's bounding set is empty (`ChildSpec::bounding_cleared`).
    cleared: AtomicBool,
    /// The failed step (0: none) and its errno, as in `child::spawn`.
    step: AtomicU32,
    errno: AtomicI32,
    /// 1 while the parked child may still run on the spawner thread's child
    /// stack: zeroed by the kernel when it exits or execs before taking a
    /// spec (its clear-child-tid word until then), else by the run it took
    /// ([`Berth::child_gone`]). The spawner thread waits on it.
    alive: AtomicU32,
    /// The job given ([`Berth::give`]), held here until the spawner thread
    /// takes it back after `park` returned ([`Berth::take`]): while it is
    /// held, its run waits, so the spec the child reads stays alive.
    job: Mutex<Option<Job>>,
}

/// Where a run and the parked child that takes its spec meet: the child's
/// pid and pidfd, whether it took the spec, and whether a step failed; the
/// `done` word is zeroed when the child has exec'd or exited (or, when no
/// child took the spec, by the spawner thread: [`Handoff::release`]).
#[derive(Debug)]
pub struct Handoff {
    /// 1 until the child exec'd or exited: its clear-child-tid word.
    done: AtomicU32,
    took: AtomicBool,
    pid: AtomicI32,
    pidfd: AtomicI32,
    /// The failed step (0: none) and its errno, after `took`.
    step: AtomicU32,
    errno: AtomicI32,
    /// The spawner thread zeroed `done` ([`Handoff::release`]), not the
    /// kernel at the child's exec or exit.
    released: AtomicBool,
    /// Whether the run makes the child's cgroup joins ([`crate::run::join`]).
    pub joining: Joining,
}

impl Default for Handoff {
    fn default() -> Self {
        Handoff {
            done: AtomicU32::new(1),
            took: AtomicBool::new(false),
            pid: AtomicI32::new(0),
            pidfd: AtomicI32::new(-1),
            step: AtomicU32::new(0),
            errno: AtomicI32::new(0),
            released: AtomicBool::new(false),
            joining: Joining::default(),
        }
    }
}

impl Handoff {
    /// Whether `done` is zero: the child that took the spec exec'd or
    /// exited, or the spawner thread released the handoff.
    pub fn ended(&self) -> bool {
        self.done.load(Ordering::Acquire) == 0
    }

    /// Blocks, asleep in `futex`, until [`Handoff::ended`].
    pub fn sleep_until_ended(&self) {
        sleep_while_set(&self.done);
    }

    /// The pid and pidfd of the child that took the spec, as it stored
    /// them before it set `took` (and before it took up a joins offer).
    pub fn taken_by(&self) -> (libc::pid_t, RawFd) {
        (self.pid.load(Ordering::Acquire), self.pidfd.load(Ordering::Acquire))
    }

    /// Whether the spawner thread, not the child's exec or exit, ended the
    /// wait: then the thread is done with its berth (it answers the run
    /// another way); else the run tells it ([`Berth::child_gone`]). Final
    /// once `done` is zero.
    pub fn released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// `(pid, pidfd)` when the child took the spec and no step failed: it
    /// exec'd the entry (or was killed on the way; its exit then says so),
    /// and the pidfd is the run's to own. Else `None`: the spawner thread
    /// answers the run (a failed step, or a child made for it). Final once
    /// `done` is zero and the child is gone; both sides read it then.
    pub fn spawned(&self) -> Option<(libc::pid_t, RawFd)> {
        (self.took.load(Ordering::Acquire) && self.step.load(Ordering::Acquire) == 0)
            .then(|| (self.pid.load(Ordering::Acquire), self.pidfd.load(Ordering::Acquire)))
    }

    /// The step that failed after the child took the spec, if one did
    /// (final once it is gone). With [`Handoff::spawned`] also `None`, no
    /// child took the spec.
    pub fn failure(&self) -> Option<SpawnFailure> {
        recorded(&self.step, &self.errno)
    }

    /// Zeroes `done` and wakes the run if nothing did yet: no child took
    /// the spec and the answer was sent the other way, or the job is
    /// dropped (a panicking spawner thread must not leave its run waiting).
    /// The caller keeps the handoff alive for the call. Private, as
    /// [`Berth::child_gone`] is: called early, it would end [`lend`]'s wait
    /// while a child still reads the spec.
    fn release(&self) {
        // Before `done`: a run that sees it zero sees this too.
        self.released.store(true, Ordering::Release);
        if self.done.swap(0, Ordering::AcqRel) != 0 {
            wake_one(&self.done);
        }
    }
}

/// Tests: a handoff that no job holds, released after `after` on a
/// thread of its own (joined when the returned handle is).
#[cfg(test)]
pub fn released_later(after: std::time::Duration) -> (Arc<Handoff>, std::thread::JoinHandle<()>) {
    let handoff = Arc::new(Handoff::default());
    let releaser = {
        let handoff = Arc::clone(&handoff);
        std::thread::spawn(move || {
            std::thread::sleep(after);
            handoff.release();
        })
    };
    (handoff, releaser)
}

/// How a parked child left its berth.
#[derive(Debug)]
pub enum Unparked {
    /// It exec'd or exited; `failure` if a step failed before it took a
    /// spec (recorded by the child; one after is in the handoff). Not
    /// reaped: [`Berth::take`] gives its pidfd unless the run owns it.
    Ended { failure: Option<SpawnFailure> },
    /// `clone` failed.
    NotCreated(SpawnFailure),
}

impl Berth {
    /// Empties the berth for the next child: call before it can be given a
    /// spec, and before [`Berth::park`].
    pub fn ready(&self) {
        self.spec.store(std::ptr::null_mut(), Ordering::Relaxed);
        self.step.store(0, Ordering::Relaxed);
        self.errno.store(0, Ordering::Relaxed);
        self.state.store(WAITING, Ordering::Release);
    }

    /// Creates a child into the berth and blocks the calling thread, asleep
    /// in `futex`, until it has exec'd a spec given meanwhile, failed or
    /// left.
    /// `parent`: the executor's pid; `cleared`: the calling thread's
    /// bounding set is empty.
    pub fn park(&self, parent: libc::pid_t, cleared: bool) -> Unparked {
        self.parent.store(parent, Ordering::Relaxed);
        self.cleared.store(cleared, Ordering::Relaxed);
        self.pidfd.store(-1, Ordering::Relaxed);
        self.alive.store(1, Ordering::Relaxed);
        let arg = std::ptr::from_ref(self).cast_mut().cast::<c_void>();
        // SAFETY: `parked_main` ends with `execve` or `_exit`, uses only raw
        // system calls, and reads the berth, which outlives the call (it
        // lives as long as the spawner). `wait_gone` returns once `alive`
        // is zero: the kernel zeroes it when the child exits or execs
        // before it took a spec; after, the child's clear-child-tid word is
        // the run's handoff, and the run zeroes `alive` once the kernel
        // zeroed that (`child_gone`), or the spawner thread's own release
        // of the handoff came first (the child died before it took the
        // spec: the kernel zeroed `alive`). The pidfd goes into the berth's
        // word, which the kernel writes before the child runs.
        let created = unsafe {
            child::clone_parked(
                parked_main,
                arg,
                libc::CLONE_FILES,
                self.pidfd.as_ptr(),
                self.alive.as_ptr(),
                || self.wait_gone(),
            )
        };
        if let Err(errno) = created {
            return Unparked::NotCreated(SpawnFailure { step: Step::Clone, errno });
        }
        Unparked::Ended { failure: recorded(&self.step, &self.errno) }
    }

    /// Gives the parked (or parking) child `job`'s spec and handoff
    /// (the spec checked with `child::check_spec` by [`lend`]); the berth
    /// holds the job until [`Berth::take`]. [`Berth::wake`] the child after.
    /// Gives the job back if the berth holds one already.
    ///
    /// # Errors
    ///
    /// The job, when the berth holds another one.
    pub fn give(&self, job: Job) -> Result<(), Job> {
        let mut held = self.job.lock().unwrap_or_else(PoisonError::into_inner);
        if held.is_some() {
            return Err(job);
        }
        self.spec.store(job.spec.0.cast_mut(), Ordering::Relaxed);
        self.handoff.store(Arc::as_ptr(&job.handoff).cast_mut(), Ordering::Relaxed);
        *held = Some(job);
        self.state.store(GO, Ordering::Release);
        Ok(())
    }

    /// Whether the berth holds a job given and not taken back.
    #[cfg(test)]
    pub fn holds_job(&self) -> bool {
        self.job.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    /// After [`Berth::park`] returned, once no spawn can give this berth a
    /// job any more (the caller's lock): the job given, if any, and the
    /// parked child's pidfd unless its run owns it ([`Handoff::spawned`]).
    pub fn take(&self) -> (Option<Job>, Option<OwnedFd>) {
        let job = self.job.lock().unwrap_or_else(PoisonError::into_inner).take();
        let pidfd = self.pidfd.swap(-1, Ordering::AcqRel);
        let runs = job.as_ref().is_some_and(|j| j.handoff.spawned().is_some());
        // SAFETY: the kernel made this pidfd for the parked child at
        // `clone`; the swap above hands it out once, and not when the run
        // took it from the handoff.
        let pidfd = (pidfd >= 0 && !runs).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
        (job, pidfd)
    }

    /// Blocks until `alive` is zero, asleep in `futex` (interruptibly: it
    /// does not count in the load average, as a thread suspended in
    /// `clone(CLONE_VFORK)` would). Shared, not private: the kernel's
    /// clear-child-tid wake-up is a shared one. With every signal blocked
    /// (`clone_parked`) the only failure is EAGAIN, once the word is zero
    /// and the child gone; spurious wake-ups loop.
    fn wait_gone(&self) {
        sleep_while_set(&self.alive);
    }

    /// Tells the spawner thread that the child given a spec from this berth
    /// has exec'd or exited: called by the run once the kernel zeroed its
    /// handoff's `done` word (not [`Handoff::released`]), which the child
    /// made its clear-child-tid word in place of `alive`. Private: called
    /// early, it would let the spawner thread reuse a stack the child is on.
    fn child_gone(&self) {
        self.alive.store(0, Ordering::Release);
        wake_one(&self.alive);
    }

    /// Tells the parked child to exit; [`Berth::wake`] it after.
    pub fn leave(&self) {
        self.state.store(LEAVE, Ordering::Release);
    }

    /// Wakes the child waiting in the berth, if any.
    pub fn wake(&self) {
        futex_wake(&self.state, true);
    }
}

/// One spawn lent to a spawner thread: the run's spec, its handoff, and
/// the channel of its answer. The run that made it ([`lend`]) waits until
/// the answer is sent or the job dropped, or until the handoff says the
/// child that took the spec is gone: while a job lives, its spec does.
#[derive(Debug)]
pub struct Job {
    spec: SpecPtr,
    /// Where a parked child given the job tells the run it exec'd.
    handoff: Arc<Handoff>,
    reply: mpsc::SyncSender<Result<Spawned, SpawnFailure>>,
}

/// A `&ChildSpec` crossing to the spawner thread.
#[derive(Debug)]
struct SpecPtr(*const c_void);

// SAFETY: the pointer is only dereferenced by the spawner thread (or the
// child it parked) while the thread that sent it waits in `lend`, for the
// reply that the spawner sends once it no longer uses the spec (or drops
// with the job), or for the handoff's word that the kernel zeroes when the
// child that read it exec'd or exited (the spawner thread does not read
// the spec then); the spec is only read (it holds plain values, raw
// pointers into `CString`s the caller keeps alive, and fds).
unsafe impl Send for SpecPtr {}

impl Job {
    /// Where the parked child given the job, if one took it, left its
    /// outcome.
    pub fn handoff(&self) -> &Handoff {
        &self.handoff
    }

    /// Answers the run.
    pub fn answer(self, result: Result<Spawned, SpawnFailure>) {
        let _ = self.reply.send(result);
    }

    /// Serves the job with a child made for it ([`child::spawn`]), whose
    /// bounding set is inherited empty when `cleared`. A job whose spec a
    /// parked child took is dropped instead: its run has its answer.
    pub fn spawn_child(self, cleared: bool) {
        if self.handoff.took.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: see `SpecPtr`: no child took the spec, so the sender
        // waits for this job's reply and the spec is alive until it is
        // sent (or dropped) below.
        let spec = unsafe { &*self.spec.0.cast::<ChildSpec<'_>>() };
        let spec = ChildSpec { bounding_cleared: cleared, ..*spec };
        let spawned = child::spawn(&spec);
        self.answer(spawned);
    }
}

impl Drop for Job {
    /// A run given to a parked child waits on the handoff: once the job is
    /// answered (the reply sent before this), or dropped on any path, it is
    /// woken if the child's exec or exit has not woken it already.
    fn drop(&mut self) {
        self.handoff.release();
    }
}

/// Lends `spec` to a spawner thread as a [`Job`] with `handoff`, which
/// `give` hands to a parked child (returning its berth) or queues
/// (`None`), and blocks until nothing reads the spec any more: the child
/// that took it exec'd or exited (the handoff says so), else the job is
/// answered or dropped. `given` runs once the job is given, before that
/// wait: the run's own work meanwhile (`run::lend`).
///
/// A panic in `give` or `given` aborts the process: unwinding would free
/// the spec while a child may still read it.
///
/// # Errors
///
/// As [`child::spawn`]; a job `give` gives back, or dropped unanswered, is
/// a `clone` failure (`EAGAIN`).
pub fn lend<'b>(
    spec: &ChildSpec<'_>,
    handoff: &Arc<Handoff>,
    give: impl FnOnce(Job) -> Result<Option<&'b Berth>, Job>,
    given: impl FnOnce(Option<&'b Berth>),
) -> Result<Spawned, SpawnFailure> {
    // A parked child cannot report a malformed spec before using it.
    child::check_spec(spec)?;
    let gone = SpawnFailure { step: Step::Clone, errno: libc::EAGAIN };
    let (reply, answer) = mpsc::sync_channel(1);
    let job =
        Job { spec: SpecPtr(std::ptr::from_ref(spec).cast()), handoff: Arc::clone(handoff), reply };
    let bomb = AbortOnUnwind;
    let berth = give(job).map_err(|_| gone);
    if let Ok(berth) = berth {
        given(berth);
    }
    std::mem::forget(bomb);
    if let Some(berth) = berth? {
        // Woken by the child's exec (or exit) itself, or by the spawner
        // thread when no child took the spec.
        handoff.sleep_until_ended();
        if !handoff.released() {
            // The kernel woke us: the spawner thread still waits for the
            // child to be gone.
            berth.child_gone();
        }
        if let Some((pid, pidfd)) = handoff.spawned() {
            // SAFETY: the child stored the pidfd the kernel made for it;
            // with `spawned()` true the spawner thread leaves it to us
            // (`Berth::take`).
            return Ok(Spawned { pid, pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) } });
        }
    }
    // The reply is sent, or dropped, only once the spawner thread is done
    // with the spec: this wait is what keeps it alive.
    answer.recv().unwrap_or(Err(gone))
}

/// Aborts the process if dropped: [`lend`] forgets it once the closures
/// that could unwind past a lent spec have returned.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        std::process::abort();
    }
}

/// The failed step a child recorded (0: none) and its errno.
fn recorded(step: &AtomicU32, errno: &AtomicI32) -> Option<SpawnFailure> {
    match step.load(Ordering::Acquire) {
        0 => None,
        step => Some(SpawnFailure {
            step: Step::from_u32(step).unwrap_or(Step::Exec),
            errno: errno.load(Ordering::Acquire),
        }),
    }
}

/// Sleeps in `futex` while `word` (a clear-child-tid word: 1 until the
/// kernel or its other owner zeroes it) is not zero. Shared, not
/// `FUTEX_PRIVATE_FLAG`: the kernel's clear-child-tid wake-up is a shared
/// one. Returns at once if the word changed; EINTR and spurious wake-ups
/// loop.
fn sleep_while_set(word: &AtomicU32) {
    while word.load(Ordering::Acquire) != 0 {
        futex_wait(word, 1, false);
    }
}

/// Wakes one [`sleep_while_set`] waiter on `word`, just zeroed.
fn wake_one(word: &AtomicU32) {
    futex_wake(word, false);
}

/// The parked child: steps 4a and 4b, the parent-death signal, then wait
/// in the berth; given a spec, steps 4c to 5.
extern "C" fn parked_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the berth `park` hands over, alive for the spawner's
    // life, which outlasts this child (whose parent-death signal is set).
    let berth = unsafe { &*arg.cast::<Berth>() };
    let mut handoff: Option<&Handoff> = None;
    let failed = match park_here(berth) {
        Ok(Some((spec, given))) => {
            handoff = Some(given);
            // The spec was checked by the giver; the spawner thread's empty
            // bounding set is ours too.
            let spec =
                ChildSpec { bounding_cleared: berth.cleared.load(Ordering::Relaxed), ..*spec };
            let fprog = libc::sock_fprog {
                len: u16::try_from(spec.seccomp.len()).unwrap_or(0),
                filter: spec.seccomp.as_ptr().cast_mut(),
            };
            child::sandbox_and_exec(&spec, &fprog, true, Some(&given.joining))
        }
        // Told to leave, or the parent is gone.
        Ok(None) => call::exit(0),
        Err(e) => e,
    };
    match handoff {
        // After taking the spec the failure is the run's: both the run and
        // the spawner thread read it from the handoff.
        Some(handoff) => child::record(&handoff.step, &handoff.errno, failed),
        None => child::record(&berth.step, &berth.errno, failed),
    }
    call::exit(127)
}

/// The parked part: the fresh process, the parent-death signal, the wait,
/// and, given a spec, the handoff filled in. `Ok(None)`: told to leave.
fn park_here(berth: &Berth) -> Result<Option<(&ChildSpec<'_>, &Handoff)>, (Step, i32)> {
    child::fresh_process()?;
    child::die_with_parent(berth.parent.load(Ordering::Relaxed))?;
    loop {
        match berth.state.load(Ordering::Acquire) {
            WAITING => futex_wait(&berth.state, WAITING, true),
            GO => break,
            _ => return Ok(None),
        }
    }
    // SAFETY: `give` stored a live handoff before GO (Release/Acquire
    // above), kept alive by the job until `park` returns.
    let handoff = unsafe { &*berth.handoff.load(Ordering::Relaxed) };
    // The kernel zeroes `done` and wakes the run at our exec or exit from
    // here on: set before `took`, so a run that sees `took` is always
    // woken. It returns the caller's tid: in its own thread group, its pid.
    let pid = call::set_tid_address(&handoff.done);
    handoff.pid.store(pid, Ordering::Relaxed);
    handoff.pidfd.store(berth.pidfd.load(Ordering::Relaxed), Ordering::Relaxed);
    handoff.took.store(true, Ordering::Release);
    let spec = berth.spec.load(Ordering::Relaxed).cast::<ChildSpec<'_>>();
    // SAFETY: `give` stored a live spec before GO, kept alive by its giver
    // until `park` returns or the handoff says we exec'd.
    Ok(Some((unsafe { &*spec }, handoff)))
}
