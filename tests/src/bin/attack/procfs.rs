//! What a run sees in `/proc`: the process directories listed there (with
//! one child of its own alive meanwhile), its own pid, and which of the
//! global files read.

use serde_json::{json, Value};

/// The files skills read for the host's state, and the run's own.
const GLOBAL: &[&str] =
    &["loadavg", "meminfo", "stat", "uptime", "cpuinfo", "mounts", "self/status", "self/cmdline"];

/// Lists `/proc`'s numeric entries while a `sleep` child lives.
pub(crate) fn view() -> Value {
    let child = std::process::Command::new("/bin/sleep").arg("30").spawn();
    let child_pid = child.as_ref().map(std::process::Child::id).ok();
    let mut pids: Vec<u64> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    let globals: serde_json::Map<String, Value> = GLOBAL
        .iter()
        .map(|f| {
            let read = std::fs::read(format!("/proc/{f}")).is_ok_and(|b| !b.is_empty());
            ((*f).to_owned(), json!(read))
        })
        .collect();
    if let Ok(mut c) = child {
        let _ = c.kill();
        let _ = c.wait();
    }
    json!({"attempt": "proc_view", "pid": std::process::id(), "child": child_pid,
           "pids": pids, "globals": globals})
}
