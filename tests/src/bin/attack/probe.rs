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

    json!({
        "attempt": "probe",
        "uid": uid, "euid": euid, "gid": gid, "egid": egid, "pid": pid,
        "status": st,
        "fds": fds,
        "ppid": field(1), "pgrp": field(2), "session": field(3), "tty_nr": field(4),
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
    })
}
