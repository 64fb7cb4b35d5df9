//! Helpers shared by the executor's integration tests.

use std::fmt;

/// A process found by [`procs_with`].
pub struct Proc {
    pub pid: i32,
    cmd: String,
    state: String,
}

impl fmt::Debug for Proc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}; {})", self.pid, self.cmd, self.state)
    }
}

/// Processes whose command line contains `needle`: not a pattern but a
/// marker unique to the test process, so no other process on the host
/// matches. Each names its command line and state for a failure message.
pub fn procs_with(needle: &str) -> Vec<Proc> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
            let state = status.lines().find(|l| l.starts_with("State:")).unwrap_or("").to_owned();
            out.push(Proc { pid, cmd, state });
        }
    }
    out
}
