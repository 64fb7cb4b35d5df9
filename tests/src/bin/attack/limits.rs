//! Resource exhaustion: fork bombs, memory hogs, floods and rlimit probes.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{emit, errno, io_errno, num};

/// Points fds 0-2 at /dev/null, so a helper process holds none of the
/// run's pipes (the run's end is then decided by the main process).
pub(crate) fn detach_stdio() {
    // SAFETY: open/dup2/close on fds we own; the path is a valid C string.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
}

/// Sleeps until killed.
pub(crate) fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Maps and touches `mb` MiB; Err(errno) when the mapping fails.
fn touch_mib(mb: u64) -> Result<(), i32> {
    let len = usize::try_from(mb << 20).unwrap_or(usize::MAX);
    // SAFETY: anonymous private mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(errno());
    }
    // SAFETY: `p` is a fresh writable mapping of `len` bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0xa5, len) };
    Ok(())
}

fn fork() -> libc::pid_t {
    // SAFETY: the process is single-threaded; children only call
    // async-signal-safe functions or exit.
    unsafe { libc::fork() }
}

/// Runs one exhaustion case.
pub(crate) fn attempt(case: &str, args: &Value) -> Value {
    match case {
        "forkbomb" => {
            let cap = num(args, "cap", 1000);
            let mut forks = 0;
            let mut err = Value::Null;
            while forks < cap {
                match fork() {
                    0 => {
                        detach_stdio();
                        sleep_forever();
                    }
                    p if p < 0 => {
                        err = json!(errno());
                        break;
                    }
                    _ => forks += 1,
                }
            }
            json!({"attempt": case, "succeeded": forks >= cap, "forks": forks, "errno": err})
        }
        "memhog" => {
            let cap = num(args, "cap_mb", 512);
            let chunk = num(args, "chunk_mb", 8);
            let mut total = 0;
            while total < cap {
                if let Err(e) = touch_mib(chunk) {
                    return json!({"attempt": case, "succeeded": false, "errno": e, "mib": total});
                }
                total += chunk;
            }
            json!({"attempt": case, "succeeded": true, "mib": total})
        }
        "memsplit" => {
            let n = num(args, "children", 4);
            let each = num(args, "mb_each", 32);
            let mut kids = Vec::new();
            for _ in 0..n {
                match fork() {
                    0 => {
                        detach_stdio();
                        let _ = touch_mib(each);
                        sleep_forever();
                    }
                    p if p > 0 => kids.push(p),
                    _ => {}
                }
            }
            let deadline = Instant::now() + Duration::from_millis(num(args, "wait_ms", 2000));
            let mut killed = 0;
            let mut alive = kids.clone();
            while Instant::now() < deadline && !alive.is_empty() {
                alive.retain(|&pid| {
                    let mut status = 0;
                    // SAFETY: waiting for our own child with a valid status pointer.
                    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                    if r == pid {
                        killed += 1;
                        false
                    } else {
                        true
                    }
                });
                std::thread::sleep(Duration::from_millis(50));
            }
            json!({"attempt": case, "succeeded": killed == 0 && kids.len() as u64 == n,
                   "killed": killed, "alive": alive.len(), "forked": kids.len()})
        }
        "cpu_spin" => {
            let mut x: u64 = 0;
            loop {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        "flood_stdout" => {
            let buf = vec![b'x'; 1 << 16];
            let mut out = std::io::stdout().lock();
            let mut sent: u64 = 0;
            loop {
                if out.write_all(&buf).is_err() {
                    let _ = writeln!(std::io::stderr(), "flood stopped after {sent} bytes");
                    std::process::exit(0);
                }
                sent += buf.len() as u64;
            }
        }
        "flood_stderr" => {
            let total = num(args, "bytes", 1 << 20);
            let line = usize::try_from(num(args, "line", 100)).unwrap_or(100).max(1);
            let mut text = vec![b'e'; line];
            text[line - 1] = b'\n';
            let mut err = std::io::stderr().lock();
            let mut sent = 0;
            while sent < total {
                if err.write_all(&text).is_err() {
                    break;
                }
                sent += line as u64;
            }
            let _ = writeln!(err, "TAIL-MARKER");
            json!({"attempt": case, "sent": sent})
        }
        "fsize" => {
            if args["ignore_sigxfsz"].as_bool().unwrap_or(false) {
                // SAFETY: ignoring a signal installs no handler code.
                unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
            }
            let total = num(args, "bytes", 8 << 20);
            let buf = vec![b'f'; 1 << 16];
            let mut written: u64 = 0;
            let mut err = Value::Null;
            match std::fs::File::create("big") {
                Err(e) => err = json!(io_errno(&e)),
                Ok(mut f) => {
                    while written < total {
                        match f.write(&buf) {
                            Ok(n) => written += n as u64,
                            Err(e) => {
                                err = json!(io_errno(&e));
                                break;
                            }
                        }
                    }
                }
            }
            json!({"attempt": case, "succeeded": written >= total, "written": written, "errno": err})
        }
        "disk_fill" => {
            let file_mb = num(args, "file_mb", 1);
            let cap_mb = num(args, "cap_mb", 1024);
            let buf = vec![b'd'; 1 << 20];
            let mut total = 0;
            let mut err = Value::Null;
            'files: for i in 0.. {
                let mut f = match std::fs::File::create(format!("fill-{i}")) {
                    Ok(f) => f,
                    Err(e) => {
                        err = json!(io_errno(&e));
                        break;
                    }
                };
                for _ in 0..file_mb {
                    if total >= cap_mb {
                        break 'files;
                    }
                    if let Err(e) = f.write_all(&buf) {
                        err = json!(io_errno(&e));
                        break 'files;
                    }
                    total += 1;
                }
            }
            // Files kept for a while, to fill the runs tmpfs alongside other runs.
            std::thread::sleep(std::time::Duration::from_millis(num(args, "hold_ms", 0)));
            json!({"attempt": case, "succeeded": total >= cap_mb, "mib": total, "errno": err})
        }
        "nofile" => {
            let max = num(args, "max", 100_000);
            let mut opened = 0;
            let mut err = Value::Null;
            let mut keep = Vec::new();
            while opened < max {
                match std::fs::File::open("/dev/null") {
                    Ok(f) => {
                        keep.push(f);
                        opened += 1;
                    }
                    Err(e) => {
                        err = json!(io_errno(&e));
                        break;
                    }
                }
            }
            json!({"attempt": case, "succeeded": opened >= max, "opened": opened, "errno": err})
        }
        "address_space" => {
            let len = usize::try_from(num(args, "bytes", 1 << 30)).unwrap_or(usize::MAX);
            // SAFETY: anonymous private reservation; never touched, unmapped at exit.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                json!({"attempt": case, "succeeded": false, "errno": errno()})
            } else {
                json!({"attempt": case, "succeeded": true, "errno": null})
            }
        }
        _ => {
            emit(&json!({"attempt": case, "error": "unknown"}));
            std::process::exit(2)
        }
    }
}
