//! Resource limits of one run, with the defaults an operator can tighten.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Timeout when a manifest gives none (or 0).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest timeout a manifest may ask for unless the operator sets another.
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// Grace between SIGTERM and SIGKILL at the deadline.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// Resource limits of one run. Every field is a hard bound; the executor
/// reports which mechanism enforced each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Memory of the whole run (cgroup), bytes.
    pub memory_bytes: u64,
    /// Processes and threads of the whole run (cgroup).
    pub max_pids: u32,
    /// RLIMIT_NOFILE.
    pub nofile: u64,
    /// RLIMIT_FSIZE, bytes.
    pub fsize_bytes: u64,
    /// RLIMIT_AS per process, bytes.
    pub address_space_bytes: u64,
    /// RLIMIT_CPU per process, seconds. 0 = the run's timeout plus one second.
    pub cpu_seconds: u64,
    /// Stdout bytes before the run is killed with `output_limit`.
    pub stdout_bytes: u64,
    /// Stderr bytes kept in the report (the tail); the rest is counted and dropped.
    pub stderr_bytes: u64,
    /// Longest stderr line streamed; longer lines are cut and marked.
    pub stderr_line_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 512 << 20,
            max_pids: 64,
            nofile: 256,
            fsize_bytes: 64 << 20,
            address_space_bytes: 4 << 30,
            cpu_seconds: 0,
            stdout_bytes: 16 << 20,
            stderr_bytes: 64 << 10,
            stderr_line_bytes: 4096,
        }
    }
}

impl Limits {
    /// The CPU-seconds limit for a run with `timeout`: the configured value,
    /// or the timeout rounded up plus one second when it is 0.
    pub fn cpu_seconds_for(&self, timeout: Duration) -> u64 {
        if self.cpu_seconds > 0 {
            self.cpu_seconds
        } else {
            timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0) + 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_follows_timeout() {
        let l = Limits::default();
        assert_eq!(l.cpu_seconds_for(Duration::from_secs(30)), 31);
        assert_eq!(l.cpu_seconds_for(Duration::from_millis(1500)), 3);
        let l = Limits { cpu_seconds: 5, ..Limits::default() };
        assert_eq!(l.cpu_seconds_for(Duration::from_secs(30)), 5);
    }
}
