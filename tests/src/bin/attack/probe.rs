//! What the skill can see of its own sandbox.

use serde_json::{json, Map, Value};

fn rlimit(resource: libc::__rlimit_resource_t) -> Value {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(resource, &mut r) } != 0 {
        return Value::Null;
    }
    json!([r.rlim_cur, r.rlim_max])
}

/// Ids, `/proc/self/status` privilege lines, open fds, controlling tty,
/// session, rlimits, environment (both views) and cwd.
pub(crate) fn probe() -> Value {
    // SAFETY: the get*id calls cannot fail and touch no memory.
    let (uid, euid, gid, egid, pid) = unsafe {
        (libc::getuid(), libc::geteuid(), libc::getgid(), libc::getegid(), libc::getpid())
    };

    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut st = Map::new();
    for key in [
        "NoNewPrivs",
        "CapInh",
        "CapPrm",
        "CapEff",
        "CapBnd",
        "CapAmb",
        "Seccomp",
        "Seccomp_filters",
        "Groups",
    ] {
        if let Some(v) = status.lines().find_map(|l| l.strip_prefix(&format!("{key}:"))) {
            st.insert(key.to_owned(), json!(v.trim()));
        }
    }

    let own_fd_dir = format!("/proc/{pid}/fd");
    let mut fds = Map::new();
    if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
        for e in entries.flatten() {
            let target = std::fs::read_link(e.path())
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default();
            if target != own_fd_dir {
                fds.insert(e.file_name().to_string_lossy().into_owned(), json!(target));
            }
        }
    }

    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, s)| s).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|s| s.parse::<i64>().ok());

    let env: Vec<String> = std::env::vars_os()
        .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
        .collect();
    let environ: Vec<String> = std::fs::read("/proc/self/environ")
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_else(|e| vec![format!("<unreadable: {e}>")]);
    let cwd = std::env::current_dir().map(|p| p.to_string_lossy().into_owned()).ok();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();

    json!({
        "attempt": "probe",
        "uid": uid, "euid": euid, "gid": gid, "egid": egid, "pid": pid,
        "status": st,
        "fds": fds,
        "ppid": field(1), "pgrp": field(2), "session": field(3), "tty_nr": field(4),
        // stat's fields 19 and 41: nice value and scheduling policy.
        "nice": field(16), "policy": field(38),
        "rlimits": {
            "core": rlimit(libc::RLIMIT_CORE),
            "nofile": rlimit(libc::RLIMIT_NOFILE),
            "fsize": rlimit(libc::RLIMIT_FSIZE),
            "as": rlimit(libc::RLIMIT_AS),
            "cpu": rlimit(libc::RLIMIT_CPU),
            "nproc": rlimit(libc::RLIMIT_NPROC),
        },
        "env": env,
        "environ": environ,
        "cwd": cwd,
        "cwd_entries": cwd_entries(),
        "cgroup": cgroup,
        "tmp_write": tmp_write(),
    })
}

/// The names in the working directory (the run directory), sorted.
fn cwd_entries() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(".")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// 0 when a new file in `/tmp` (world-writable: only Landlock refuses it)
/// can be made (and it is removed again), else the errno.
fn tmp_write() -> i32 {
    let path = format!("/tmp/ongrid-probe-{}", std::process::id());
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
        Ok(_) => {
            let _ = std::fs::remove_file(&path);
            0
        }
        Err(e) => crate::io_errno(&e),
    }
}

/// What a process sees of itself before it reads a byte of stdin: the
/// clock, its pid, its argv and environment, its run directory's names
/// and its cgroup. Taken at the start of every run, and again for the
/// `early` case after the args, so a warm run (made before the request)
/// can be compared with what the request brought.
pub(crate) fn early() -> Value {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let ns = i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec);
    let read = |p: &str| {
        std::fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    };
    json!({
        "time_ms": u64::try_from(ns / 1_000_000).unwrap_or(0),
        "pid": std::process::id(),
        "cmdline": read("/proc/self/cmdline"),
        "environ": read("/proc/self/environ"),
        "cwd_entries": cwd_entries(),
        "cgroup": read("/proc/self/cgroup"),
    })
}
