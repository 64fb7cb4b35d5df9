//! Spawn sequence steps 6 and 7: feed stdin what the prefill left (at the
//! spawn, or a warm run's at its take), collect stdout and stderr within
//! their bounds, enforce the deadline, and kill the whole tree on any end.

use std::collections::VecDeque;
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::pin;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::time::{sleep_until, Instant};

use crate::run::reaper::Reaper;
use crate::run::spawn::Child;
use crate::sandbox::cgroup::RunCgroup;
use crate::sys::process::{self, Exit};

/// How long pipes may stay open after the main process ended and the tree
/// was killed (a process we could not kill still holding them).
const DRAIN: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 64 << 10;
const READ_MIN: usize = 4 << 10;
const STDERR_CHUNK: usize = 16 << 10;
/// When the main process's exit is waited for even though its pipes are
/// still open (see [`PidFd`]).
const WATCH_AFTER: Duration = Duration::from_millis(10);

/// Why supervision stopped the run, if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The main process ended by itself.
    None,
    /// Stdout went over its cap.
    OutputLimit,
    /// The wall-clock deadline passed.
    WallTime,
    /// The caller cancelled.
    Cancelled,
}

/// Bounds of one supervision.
#[derive(Debug, Clone, Copy)]
pub struct Bounds<'a> {
    /// When the run's clock started: its deadline is this plus `timeout`
    /// (a warm run's is its take, before its args are written).
    pub start: std::time::Instant,
    /// Wall-clock timeout.
    pub timeout: Duration,
    /// Grace between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Stdout cap, bytes.
    pub stdout_bytes: u64,
    /// Stderr kept (tail) and streamed, bytes.
    pub stderr_bytes: u64,
    /// Longest stderr line streamed.
    pub stderr_line_bytes: u64,
    /// How long to watch for the main process's exit without sleeping
    /// once its pipes are done, before waiting through its pidfd.
    pub exit_spin: ExitSpin<'a>,
}

/// The exit's watch without sleeping ([`Bounds::exit_spin`]): `budget`
/// (`engine`'s [`EXEC_SPIN`](crate::run::spin::EXEC_SPIN)) when, at that
/// moment, `in_flight` says this run is the only one; else none.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExitSpin<'a> {
    /// The longest watch.
    pub budget: Duration,
    /// The engine's count of runs in flight, this one included.
    pub in_flight: Option<&'a std::sync::atomic::AtomicUsize>,
}

impl ExitSpin<'_> {
    /// The watch for now: the budget for the only run in flight.
    fn now(&self) -> Duration {
        self.in_flight.map_or(Duration::ZERO, |n| {
            crate::run::spin::spin_for(n.load(std::sync::atomic::Ordering::Relaxed), self.budget)
        })
    }
}

/// What supervision saw.
#[derive(Debug)]
pub struct Supervised {
    /// How the main process ended.
    pub exit: Exit,
    /// Why we stopped it, if we did.
    pub stop: Stop,
    /// Stdout (at most the cap).
    pub stdout: Vec<u8>,
    /// Tail of stderr.
    pub stderr: String,
    /// Stderr bytes not kept.
    pub stderr_dropped: u64,
    /// What is left open of the run (`None` once taken).
    pub leftovers: Option<Leftovers>,
}

/// What is left open of a finished run: the read ends of its pipes and
/// its pidfd. The run's tree is gone; dropping these closes them (and
/// takes the pipes off the reactor), which costs ~30 µs (the pipes'
/// inodes and the pidfd's dentry freed), so the executor drops them after
/// the report is written rather than before.
pub struct Leftovers {
    pipes: Vec<pipe::Receiver>,
    pidfd: Option<PidFd>,
}

impl Leftovers {
    /// The descriptors held (tests).
    #[cfg(test)]
    pub(crate) fn fds(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        let pipes = self.pipes.iter().map(AsRawFd::as_raw_fd);
        pipes.chain(self.pidfd.as_ref().map(|p| p.fd().as_raw_fd())).collect()
    }
}

impl std::fmt::Debug for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leftovers")
            .field("pipes", &self.pipes.len())
            .field("pidfd", &self.pidfd.is_some())
            .finish()
    }
}

/// The run's process tree: the cgroup when there is one, else the session's
/// process group (the child called `setsid`, so its pgid is its pid). The
/// main process is signalled through its pidfd, passed to each call (it is
/// registered with the reactor part-way, [`PidFd`]).
struct Tree<'a> {
    cgroup: Option<&'a RunCgroup>,
    pid: i32,
}

impl Tree<'_> {
    fn terminate(&self, pidfd: &Option<PidFd>) {
        if let Some(fd) = pidfd {
            let _ = process::pidfd_signal(fd.fd(), libc::SIGTERM);
            let _ = process::pidfd_signal(fd.fd(), libc::SIGCONT);
        }
        match self.cgroup.filter(|c| c.can_kill()) {
            Some(cg) => cg.terminate(),
            None => {
                let _ = killpg(Pid::from_raw(self.pid), Signal::SIGTERM);
                let _ = killpg(Pid::from_raw(self.pid), Signal::SIGCONT);
            }
        }
    }

    fn kill(&self, pidfd: &Option<PidFd>) {
        if let Some(fd) = pidfd {
            let _ = process::pidfd_signal(fd.fd(), libc::SIGKILL);
        }
        self.kill_rest();
    }

    /// True when the run's cgroup says no process is left in it (nothing
    /// can join an empty cgroup but what the executor puts there), so no
    /// kill is needed; false without a cgroup, or when unsure.
    /// Step 7: the main process is gone; its leftovers go now
    /// (`cgroup.kill` takes forks in flight too, `killpg` the session's
    /// group; nothing is left to kill after it). A cgroup that is already
    /// empty (most runs) needs none: its `cgroup.events` is read instead of
    /// a write to `cgroup.kill`, which takes the cgroup mutex the other
    /// runs' joins wait on. Returns until when the pipes are still drained.
    fn after_exit(&self, hard_deadline: Instant) -> Instant {
        if !self.seen_empty() {
            self.kill_rest();
        }
        let now = Instant::now();
        (now + DRAIN).min(hard_deadline.max(now))
    }

    fn is_empty(&self) -> bool {
        self.cgroup.is_some_and(|c| c.can_kill() && c.wait_empty(Duration::ZERO))
    }

    /// True when the run's v2 leaf was read as unpopulated (a failed read
    /// is not empty): nothing is left to kill.
    fn seen_empty(&self) -> bool {
        self.cgroup.is_some_and(RunCgroup::seen_empty)
    }

    /// Kills what is left once the main process is gone (its pidfd no
    /// longer names a process to signal).
    fn kill_rest(&self) {
        match self.cgroup.filter(|c| c.can_kill()) {
            Some(cg) => cg.kill(),
            None => {
                let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
            }
        }
    }
}

/// The main process's pidfd, registered with the reactor only when its
/// exit is waited for.
///
/// Most runs end the same way: the skill writes its answer and exits, and
/// its pipes' end of file and its exit come together. Their reads end
/// first; the exit is then collected with one `wait4(WNOHANG)` and the
/// pidfd is never registered (an `epoll_ctl` to add it and one to remove
/// it per run, and the separate wake-up its readiness often was). The
/// exit is waited for through the pidfd once both pipes are done but the
/// process has not ended yet, or [`WATCH_AFTER`] after the start, so a
/// main process that ends while something it started keeps the pipes open
/// is seen (and the rest of its tree killed) at most that late.
enum PidFd {
    Plain(OwnedFd),
    Polled(AsyncFd<OwnedFd>),
    /// The registration failed: polled by a short sleep loop.
    Unpollable(OwnedFd),
}

impl PidFd {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            PidFd::Plain(fd) | PidFd::Unpollable(fd) => fd.as_fd(),
            PidFd::Polled(fd) => fd.get_ref().as_fd(),
        }
    }

    /// Registers a plain pidfd with the reactor (once).
    fn poll(self) -> Self {
        match self {
            PidFd::Plain(fd) => match process::async_pidfd(fd) {
                Ok(fd) => PidFd::Polled(fd),
                Err((fd, e)) => {
                    tracing::warn!("pidfd not pollable: {e}");
                    PidFd::Unpollable(fd)
                }
            },
            other => other,
        }
    }
}

/// Writes what the prefill (`spawn::prefill_stdin`, at the spawn or at a
/// warm run's take, which already wrote until the pipe was full) left of
/// the args, as the skill reads, then closes stdin; nothing to do when the
/// prefill wrote them all. EPIPE (the skill does not read stdin) is not an
/// error of the run.
async fn write_stdin(stdin: Option<(OwnedFd, usize)>, args: &[u8]) {
    let Some((fd, done)) = stdin else { return };
    // The executor's end is non-blocking (`spawn::slot::pipe`).
    let Ok(mut tx) = pipe::Sender::from_owned_fd_unchecked(fd) else { return };
    let _ = tx.write_all(args.get(done..).unwrap_or_default()).await;
}

/// Reads stdout into `out` up to `cap`, to its end (`Ok`) or until it goes
/// over (`Err`). Reads straight into the growing output (no zeroed bounce
/// buffer), which the caller owns: what was read stays when the read is
/// given up on (a process the run left holds the pipe open). The pipe
/// comes back, to be closed after the report ([`Leftovers`]).
async fn read_stdout(
    fd: OwnedFd,
    cap: u64,
    out: &mut Vec<u8>,
) -> (Result<(), ()>, Option<pipe::Receiver>) {
    // The executor's end is non-blocking (`spawn::slot::pipe`).
    let Ok(mut rx) = pipe::Receiver::from_owned_fd_unchecked(fd) else { return (Ok(()), None) };
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    loop {
        if out.capacity() - out.len() < READ_MIN {
            out.reserve(READ_MIN.max(out.len()).min(READ_CHUNK));
        }
        let before = out.len();
        match rx.read_buf(out).await {
            Ok(0) | Err(_) => return (Ok(()), Some(rx)),
            Ok(_) => {
                if out.len() > cap {
                    out.truncate(before);
                    return (Err(()), Some(rx));
                }
            }
        }
    }
}

/// Stderr as lines: each streamed to the sink (cut at the line bound) until
/// the total bound, the tail kept in a ring.
struct StderrLines<'s> {
    sink: &'s mut (dyn FnMut(&str) + Send),
    line: Vec<u8>,
    line_cut: bool,
    line_max: usize,
    streamed: u64,
    total_max: u64,
    tail: VecDeque<u8>,
    dropped: u64,
}

impl<'s> StderrLines<'s> {
    /// Streams lines to `sink` within `bounds`' stderr caps.
    fn new(sink: &'s mut (dyn FnMut(&str) + Send), bounds: &Bounds<'_>) -> Self {
        StderrLines {
            sink,
            line: Vec::new(),
            line_cut: false,
            line_max: usize::try_from(bounds.stderr_line_bytes).unwrap_or(usize::MAX),
            streamed: 0,
            total_max: bounds.stderr_bytes,
            tail: VecDeque::new(),
            dropped: 0,
        }
    }

    /// The kept tail of stderr, as text.
    fn tail_text(&mut self) -> String {
        String::from_utf8_lossy(self.tail.make_contiguous()).into_owned()
    }

    fn push(&mut self, bytes: &[u8]) {
        for chunk in bytes.split_inclusive(|b| *b == b'\n') {
            let (body, ends) = match chunk.strip_suffix(b"\n") {
                Some(body) => (body, true),
                None => (chunk, false),
            };
            let room = self.line_max.saturating_sub(self.line.len());
            if body.len() > room {
                self.line_cut = true;
                // Cut from the line: never kept, so counted as dropped.
                self.dropped += (body.len() - room) as u64;
            }
            self.line.extend_from_slice(body.get(..room.min(body.len())).unwrap_or_default());
            if ends {
                self.finish_line();
            }
        }
    }

    fn finish_line(&mut self) {
        let mut text = String::from_utf8_lossy(&self.line).into_owned();
        if self.line_cut {
            text.push_str(" [line truncated]");
        }
        self.line.clear();
        self.line_cut = false;
        let len = text.len() as u64 + 1;
        if self.streamed < self.total_max {
            self.streamed += len;
            (self.sink)(&text);
            if self.streamed >= self.total_max {
                (self.sink)("[stderr: further lines not streamed]");
            }
        }
        self.tail.extend(text.as_bytes());
        self.tail.push_back(b'\n');
        let max = usize::try_from(self.total_max).unwrap_or(usize::MAX);
        if self.tail.len() > max {
            let cut = self.tail.len() - max;
            self.tail.drain(..cut);
            self.dropped += cut as u64;
        }
    }
}

/// The pipe comes back at its end, to be closed after the report
/// ([`Leftovers`]).
async fn read_stderr(fd: OwnedFd, lines: &mut StderrLines<'_>) -> Option<pipe::Receiver> {
    // The executor's end is non-blocking (`spawn::slot::pipe`).
    let Ok(mut rx) = pipe::Receiver::from_owned_fd_unchecked(fd) else { return None };
    // Most runs write no stderr: the first read goes to a small buffer on
    // the stack and the chunk is allocated only when there is more (read
    // into spare capacity: zeroing one per run was ~1 % of the executor's
    // CPU under load).
    let mut first = [0u8; 512];
    let Ok(n @ 1..) = rx.read(&mut first).await else { return Some(rx) };
    lines.push(&first[..n]);
    let mut buf = Vec::with_capacity(STDERR_CHUNK);
    loop {
        buf.clear();
        match rx.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => lines.push(&buf),
        }
    }
    if !lines.line.is_empty() {
        lines.finish_line();
    }
    Some(rx)
}

/// The main process's exit: collected at once if it has already ended,
/// else watched for up to `spin` without sleeping (yielding the CPU
/// between looks), else waited for through its pidfd (registered here,
/// the first time).
///
/// Its pipes' end of file comes while it exits (its files are closed
/// before it becomes a zombie), so the first look misses about half the
/// time (144 of 320 traced sequential runs); the pidfd's registration and
/// readiness then cost the run an `epoll_ctl` and a wake-up: 21-31 µs
/// from the zombie to its reaping, against 9 for a parent blocked in
/// `wait4`.
async fn wait_exit(pidfd: &mut Option<PidFd>, reaper: &Reaper, pid: i32, spin: Duration) -> Exit {
    if let Some(exit) = reaper.collect(pid) {
        return exit;
    }
    if !spin.is_zero() {
        let since = Instant::now();
        while since.elapsed() < spin {
            std::thread::yield_now();
            if let Some(exit) = reaper.collect(pid) {
                return exit;
            }
        }
    }
    if let Some(fd) = pidfd.take() {
        *pidfd = Some(fd.poll());
    }
    loop {
        if let Some(PidFd::Polled(fd)) = pidfd.as_ref() {
            if let Ok(mut guard) = fd.readable().await {
                if let Some(exit) = reaper.collect(pid) {
                    return exit;
                }
                guard.clear_ready();
                continue;
            }
        }
        // Cannot poll the pidfd: a short poll loop.
        if let Some(exit) = reaper.collect(pid) {
            return exit;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How long the next look at the exit may watch without sleeping: the
/// whole spin once, at the first look `due` (the pipes are done and the
/// tree is not being stopped), decided then since other runs may have
/// started since this one; zero otherwise.
fn spin_now(exit_spin: &mut Option<ExitSpin<'_>>, due: bool) -> Duration {
    if due {
        exit_spin.take().map_or(Duration::ZERO, |s| s.now())
    } else {
        Duration::ZERO
    }
}

/// Supervises `child` until it and its whole tree are gone.
pub async fn supervise(
    child: Child,
    args: &[u8],
    cgroup: Option<&RunCgroup>,
    reaper: &Reaper,
    bounds: Bounds<'_>,
    sink: &mut (dyn FnMut(&str) + Send),
    cancel: impl Future<Output = ()>,
) -> Supervised {
    let Child { pid, pidfd, stdin, stdout, stderr, exec_at: _ } = child;
    reaper.track(pid);
    let start = Instant::from_std(bounds.start);
    let deadline = start + bounds.timeout;
    let hard_deadline = deadline + bounds.grace;
    let watch_at = start + WATCH_AFTER;
    // Spent once ([`spin_now`]).
    let mut exit_spin = Some(bounds.exit_spin);
    // Always `Some` outside `wait_exit` (which takes it to register it).
    let mut pidfd = Some(PidFd::Plain(pidfd));
    let tree = Tree { cgroup, pid };

    let mut lines = StderrLines::new(sink, &bounds);
    let mut stdout_read = Vec::new();
    let (stop, exit, killed, pipes) = {
        let mut stdin_fut = pin!(write_stdin(stdin, args));
        let mut stdout_fut = pin!(read_stdout(stdout, bounds.stdout_bytes, &mut stdout_read));
        let mut stderr_fut = pin!(read_stderr(stderr, &mut lines));
        let mut cancel = pin!(cancel);

        let mut stop = Stop::None;
        let mut exit: Option<Exit> = None;
        let mut stdout_done = false;
        let mut pipes = Vec::with_capacity(2);
        let (mut stdin_done, mut stderr_done, mut cancelled) = (false, false, false);
        let mut kill_at: Option<Instant> = None;
        let mut killed = false;
        let mut drain_until = hard_deadline;
        // Whether the exit is waited for yet (see `PidFd`).
        let mut watching = false;

        while exit.is_none() || !stdout_done || !stderr_done {
            // The pipes are done, or the tree is being stopped: the exit
            // comes next (see `PidFd`).
            let pipes_done = stdout_done && stderr_done;
            watching |= pipes_done || killed || kill_at.is_some();
            let spin = spin_now(&mut exit_spin, pipes_done && !killed && kill_at.is_none());
            tokio::select! {
                () = &mut stdin_fut, if !stdin_done => stdin_done = true,
                (r, rx) = &mut stdout_fut, if !stdout_done => {
                    pipes.extend(rx);
                    stdout_done = true;
                    if r.is_err() {
                        if stop == Stop::None {
                            stop = Stop::OutputLimit;
                        }
                        tree.kill(&pidfd);
                        killed = true;
                    }
                }
                rx = &mut stderr_fut, if !stderr_done => {
                    pipes.extend(rx);
                    stderr_done = true;
                }
                e = wait_exit(&mut pidfd, reaper, pid, spin), if exit.is_none() && watching => {
                    exit = Some(e);
                    drain_until = tree.after_exit(hard_deadline);
                    killed = true;
                }
                () = sleep_until(deadline), if stop == Stop::None && kill_at.is_none() && exit.is_none() => {
                    stop = Stop::WallTime;
                    tree.terminate(&pidfd);
                    kill_at = Some(Instant::now() + bounds.grace);
                }
                () = sleep_until(kill_at.unwrap_or(hard_deadline)), if kill_at.is_some() && !killed => {
                    tree.kill(&pidfd);
                    killed = true;
                }
                () = sleep_until(watch_at), if !watching => watching = true,
                () = &mut cancel, if !cancelled => {
                    cancelled = true;
                    if stop == Stop::None {
                        stop = Stop::Cancelled;
                    }
                    tree.kill(&pidfd);
                    killed = true;
                }
                () = sleep_until(drain_until), if exit.is_some() => break,
            }
        }
        (stop, exit, killed, pipes)
    };
    if !killed && !tree.is_empty() {
        tree.kill(&pidfd);
    }
    Supervised {
        exit: exit.unwrap_or(Exit { code: None, signal: None, cpu_us: 0 }),
        stop,
        stdout: stdout_read,
        stderr: lines.tail_text(),
        stderr_dropped: lines.dropped,
        leftovers: Some(Leftovers { pipes, pidfd }),
    }
}

#[cfg(test)]
mod tests;
