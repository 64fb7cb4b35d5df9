//! Process-tree shapes that try to outlive the run or dodge its kill.

use std::time::Duration;

use serde_json::{json, Value};

use crate::limits::{detach_stdio, sleep_forever};
use crate::{emit, num};

/// What sandboxed skills try to read from the victim.
static SECRET: [u8; 16] = *b"ONGRID-SECRET-01";

/// `attack victim`: announce pid and secret address, then sleep.
pub(crate) fn victim() -> ! {
    let addr = std::hint::black_box(SECRET.as_ptr()) as usize;
    emit(&json!({"pid": std::process::id(), "addr": addr}));
    sleep_forever()
}

fn ignore(sig: libc::c_int) {
    // SAFETY: ignoring a signal installs no handler code.
    unsafe { libc::signal(sig, libc::SIG_IGN) };
}

fn fork() -> libc::pid_t {
    // SAFETY: the process is single-threaded; children only sleep, signal
    // themselves or exit.
    unsafe { libc::fork() }
}

/// Double fork with `setsid` in between; the grandchild sleeps forever,
/// holding the run's pipes unless `detach`.
fn daemonize(detach: bool, stop: bool) {
    match fork() {
        0 => {
            // SAFETY: setsid takes no arguments; we are not a group leader.
            unsafe { libc::setsid() };
            if fork() == 0 {
                ignore(libc::SIGTERM);
                ignore(libc::SIGHUP);
                if detach {
                    detach_stdio();
                }
                if stop {
                    // SAFETY: raising a signal at ourselves.
                    unsafe { libc::raise(libc::SIGSTOP) };
                }
                sleep_forever();
            }
            // SAFETY: leave the intermediate child without running Rust exit code.
            unsafe { libc::_exit(0) };
        }
        pid if pid > 0 => {
            // SAFETY: reaping our own child; a null status pointer is allowed.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        }
        _ => {}
    }
}

/// Runs one process-tree case.
pub(crate) fn attempt(case: &str, args: &Value) -> Value {
    match case {
        "sleep" => {
            let ms = num(args, "ms", 1000);
            std::thread::sleep(Duration::from_millis(ms));
            json!({"attempt": case, "slept_ms": ms})
        }
        "sleep_forever" => sleep_forever(),
        "ignore_term" => {
            ignore(libc::SIGTERM);
            sleep_forever()
        }
        "sigstop" => {
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGSTOP) };
            sleep_forever()
        }
        "stopped_tree" => {
            ignore(libc::SIGTERM);
            if fork() == 0 {
                // SAFETY: raising a signal at ourselves.
                unsafe { libc::raise(libc::SIGSTOP) };
                sleep_forever();
            }
            sleep_forever()
        }
        "bg_child" => {
            if fork() == 0 {
                detach_stdio();
                sleep_forever();
            }
            json!({"attempt": case})
        }
        "daemon" => {
            daemonize(true, false);
            json!({"attempt": case})
        }
        "hold_stdout" => {
            daemonize(false, false);
            json!({"attempt": case})
        }
        "hold_stdout_stopped" => {
            daemonize(false, true);
            json!({"attempt": case})
        }
        "close_stdio_sleep" => {
            detach_stdio();
            sleep_forever()
        }
        "close_stdio_exit" => {
            detach_stdio();
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: ending the process with a status; nothing to unwind.
            unsafe { libc::_exit(7) }
        }
        _ => json!({"attempt": case, "error": "unknown"}),
    }
}
