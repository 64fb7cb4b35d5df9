//! `attack`: the skill every adversarial sandbox case runs.
//!
//! It reads `{"case": NAME, ...params}` from stdin (the skill's args), makes
//! one escape attempt, and prints one JSON object:
//! `{"attempt": NAME, "succeeded": BOOL, "errno": N|null, ...details}`.
//! `succeeded` is true when the escape worked, so a case whose sandbox layer
//! is missing fails instead of passing by accident. Some cases never print
//! anything (they spin, sleep, flood or die) and are judged by the report.
//!
//! Two modes are reached through argv instead, from outside a run:
//! `attack victim` (a sleeping target for signal, ptrace and memory-read
//! attempts) and `attack euid` (prints its ids; exec'd as a setuid copy).
//!
//! # Layout
//!
//! - `probe`: identity, capabilities, fds, tty, rlimits, environment, the
//!   run directory, cgroup and Landlock as seen from inside; what the
//!   process saw before its args (`early`).
//! - `fs`: reads, writes, links, symlinks, truncation, special files.
//! - `net`: TCP, UDP, ICMP, Unix sockets.
//! - `egress`: timed connects and sends against an egress allowlist.
//! - `kernel`: denied syscalls, signals, ptrace, cross-process reads.
//! - `limits`: fork bombs, memory hogs, floods, rlimit probes.
//! - `tree`: process-tree shapes that try to outlive the run.
//! - `procfs`: the processes and global files a run sees in `/proc`.
#![allow(unsafe_code)]

mod egress;
mod fs;
mod kernel;
mod limits;
mod meta;
mod net;
mod probe;
mod procfs;
mod tree;

use std::io::{Read, Write};

use serde_json::{json, Value};

/// The JSON line of an attempt: `Ok(details)` = the escape worked.
pub(crate) fn outcome(case: &str, r: Result<Value, i32>) -> Value {
    match r {
        Ok(details) => {
            let mut v = json!({"attempt": case, "succeeded": true, "errno": null});
            if let (Some(o), Some(d)) = (v.as_object_mut(), details.as_object()) {
                o.extend(d.clone());
            }
            v
        }
        Err(errno) => json!({"attempt": case, "succeeded": false, "errno": errno}),
    }
}

/// errno of the last failed libc call.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// errno of an I/O error (-1 when it has none).
pub(crate) fn io_errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Prints one JSON line on stdout and flushes.
pub(crate) fn emit(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// A string parameter.
pub(crate) fn param<'a>(args: &'a Value, key: &str) -> &'a str {
    args[key].as_str().unwrap_or("")
}

/// An integer parameter.
pub(crate) fn num(args: &Value, key: &str, default: u64) -> u64 {
    args[key].as_u64().unwrap_or(default)
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("victim") => tree::victim(),
        Some("euid") => {
            // SAFETY: the get*id calls cannot fail and touch no memory.
            let ids = unsafe { (libc::getuid(), libc::geteuid(), libc::getgid(), libc::getegid()) };
            emit(&json!({"uid": ids.0, "euid": ids.1, "gid": ids.2, "egid": ids.3}));
            return;
        }
        _ => {}
    }
    // Before a byte of the args: what a warm run sees while it waits.
    let early = probe::early();
    let mut input = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut input);
    let args: Value = serde_json::from_slice(&input).unwrap_or_else(|_| json!({}));
    let case = args["case"].as_str().unwrap_or("probe").to_owned();
    let out = match case.as_str() {
        "probe" => probe::probe(),
        "early" => json!({"attempt": "early", "early": early, "late": probe::early()}),
        "proc_view" => procfs::view(),
        "egress" => egress::attempt(&args),
        "exit" => {
            print!("{}", param(&args, "stdout"));
            let _ = std::io::stdout().flush();
            std::process::exit(i32::try_from(num(&args, "code", 0)).unwrap_or(1));
        }
        "segv" => kernel::segv(),
        "read" | "write" | "list" | "mkdir" | "symlink_write" | "link" | "rename" | "truncate"
        | "mknod" | "exec_setuid" | "persist" | "exists" | "messy_run_dir" | "open_flood" => {
            fs::attempt(&case, &args)
        }
        "metadata" => meta::attempt(&case, &args),
        "tcp_connect" | "udp_send" | "icmp" | "raw_socket" | "unix_abstract"
        | "unix_abstract_bind" | "unix_path" | "unix_dgram" => net::attempt(&case, &args),
        "syscall" | "kill" | "kill_all" | "ptrace" | "process_vm_readv" | "cmdline_scan"
        | "cgroup_escape" | "interfere" | "interfere_self" | "sysv_ipc" | "mq_create"
        | "mq_unlink" => kernel::attempt(&case, &args),
        "forkbomb" | "memhog" | "memsplit" | "cpu_spin" | "flood_stdout" | "flood_stderr"
        | "fsize" | "nofile" | "address_space" | "disk_fill" => limits::attempt(&case, &args),
        "sleep"
        | "sleep_forever"
        | "ignore_term"
        | "sigstop"
        | "stopped_tree"
        | "bg_child"
        | "daemon"
        | "hold_stdout"
        | "hold_stdout_stopped"
        | "close_stdio_sleep"
        | "close_stdio_exit" => tree::attempt(&case, &args),
        other => json!({"attempt": other, "error": "unknown case"}),
    };
    emit(&out);
}
