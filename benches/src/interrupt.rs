//! What an interrupted bench leaves behind: nothing.
//!
//! `loadbench` starts root daemons (an executor with its runs' tmpfs
//! mounted under a temporary folder, a skilld) as its children. Killed by
//! Ctrl-C, `timeout` or `pkill`, it used to die at once and leave them
//! running, serving a folder nobody would remove. [`watch`] catches
//! `SIGINT`, `SIGTERM` and `SIGHUP` (tokio's handlers, on a thread of its
//! own; no signal is blocked, so the children start with the mask and
//! default dispositions they would have had). On the first, that thread
//! marks the run interrupted, stops every process registered with
//! [`Started::pid`] (`SIGTERM`, then `SIGKILL` after [`GRACE`]), removes
//! every folder registered with [`Started::dir`] and exits with 128 + the
//! signal's number, as the shell reports a process killed by it.
//!
//! Meanwhile the other threads must neither finish the run nor stop those
//! processes themselves (a reaped daemon's pid could be another process's
//! by the time the interrupt thread signals it): once interrupted, a
//! thread that panics (its daemon gone, its request failed) and a caller
//! of [`Started::gone`] wait for the exit instead ([`wait_for_exit`]).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long a registered process has to stop after `SIGTERM` (the
/// executor's drain) before it is sent `SIGKILL`.
pub const GRACE: Duration = Duration::from_secs(10);

/// The processes and folders an interrupted run stops and removes.
#[derive(Debug, Default)]
pub struct Started {
    pids: Vec<i32>,
    dirs: Vec<PathBuf>,
    interrupted: bool,
}

static STARTED: Mutex<Started> =
    Mutex::new(Started { pids: Vec::new(), dirs: Vec::new(), interrupted: false });

fn started() -> std::sync::MutexGuard<'static, Started> {
    STARTED.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Started {
    /// Registers a child process to stop if the run is interrupted.
    pub fn pid(pid: u32) {
        if let Ok(pid) = i32::try_from(pid) {
            started().pids.push(pid);
        }
    }

    /// Forgets a child process before the caller stops and reaps it (its
    /// pid may then be another process's). Once the run is interrupted it
    /// is the interrupt thread's to stop: this then waits for the exit and
    /// never returns.
    pub fn gone(pid: u32) {
        let mut s = started();
        if s.interrupted {
            drop(s);
            wait_for_exit();
        }
        if let Ok(pid) = i32::try_from(pid) {
            s.pids.retain(|p| *p != pid);
        }
    }

    /// Registers a folder to remove if the run is interrupted (after the
    /// processes stopped: the executor unmounts its runs' tmpfs on its way
    /// out).
    pub fn dir(path: &Path) {
        started().dirs.push(path.to_path_buf());
    }

    /// Whether the run was interrupted.
    pub fn interrupted() -> bool {
        started().interrupted
    }
}

/// Parks the calling thread until the interrupt thread exits the process.
pub fn wait_for_exit() -> ! {
    loop {
        std::thread::park();
    }
}

/// Catches `SIGINT`, `SIGTERM` and `SIGHUP` from now on and starts the
/// thread that acts on them; installs the panic hook that keeps a thread
/// panicking after an interrupt from ending the process first. Call it
/// first in `main`.
///
/// # Errors
///
/// The runtime, a handler or the thread cannot be made.
pub fn watch() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    // Registered here, before returning: no window in which a signal
    // still has its default action.
    let (mut int, mut term, mut hup) = {
        let _entered = rt.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        )
    };
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if Started::interrupted() {
            wait_for_exit();
        }
        default_hook(info);
    }));
    std::thread::Builder::new().name("interrupt".into()).spawn(move || {
        let sig = rt.block_on(async {
            tokio::select! {
                _ = int.recv() => Signal::SIGINT,
                _ = term.recv() => Signal::SIGTERM,
                _ = hup.recv() => Signal::SIGHUP,
            }
        });
        let (pids, dirs) = {
            let mut s = started();
            s.interrupted = true;
            (std::mem::take(&mut s.pids), std::mem::take(&mut s.dirs))
        };
        let stopped = stop_all(&pids);
        for dir in dirs {
            let _ = std::fs::remove_dir_all(&dir);
        }
        eprintln!(
            "interrupted by {sig}: stopped {stopped} started processes, removed their folders"
        );
        std::process::exit(128 + sig as i32);
    })?;
    Ok(())
}

/// Sends `SIGTERM` to every pid, waits up to [`GRACE`] for each to be gone
/// or a zombie, `SIGKILL`s the rest. Returns how many were signalled.
fn stop_all(pids: &[i32]) -> usize {
    let mut signalled = 0;
    for &pid in pids {
        if kill(Pid::from_raw(pid), Signal::SIGTERM).is_ok() {
            signalled += 1;
        }
    }
    let deadline = Instant::now() + GRACE;
    for &pid in pids {
        while running(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if running(pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    // The killed ones' teardown (the executor's mounts) before the folders go.
    while pids.iter().any(|&p| running(p)) && Instant::now() < deadline + GRACE {
        std::thread::sleep(Duration::from_millis(20));
    }
    signalled
}

/// True while `pid` exists and is not a zombie (our children are not
/// reaped by this thread: a zombie has stopped).
pub fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command's closing parenthesis.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_or_a_missing_pid_is_not_running_and_a_live_one_is() {
        assert!(running(std::process::id() as i32));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        while running(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!running(pid), "an exited, unreaped child is a zombie");
        child.wait().unwrap();
        assert!(!running(pid));
    }

    #[test]
    fn a_stopped_process_is_forgotten() {
        Started::pid(4_000_000);
        Started::gone(4_000_000);
        assert!(!started().pids.contains(&4_000_000));
        assert!(!Started::interrupted());
    }
}
