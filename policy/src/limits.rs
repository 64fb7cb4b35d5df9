//! Resource limits of one run, with the defaults an operator can tighten.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Timeout when a manifest gives none (or 0).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest timeout a manifest may ask for unless the operator sets another.
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// Grace between SIGTERM and SIGKILL at the deadline.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// The least memory a run may be given (operator config, grant or
/// manifest). Far below it the run's cgroup can run out while its child is
/// still the executor's (before `exec`), and the kernel's OOM killer then
/// kills every process sharing that memory: the executor with it (seen at
/// 64 KiB; 256 KiB and up were fine).
pub const MIN_MEMORY_BYTES: u64 = 1 << 20;
/// The least `RLIMIT_NOFILE`: `/bin/sh` (dash) moves a script to fd 10,
/// and the dynamic loader opens libraries above the three stdio slots.
pub const MIN_NOFILE: u64 = 16;
/// The least `RLIMIT_AS`: below it not even a static program's stack and
/// a dynamic loader fit, and every run dies at `exec` (`SIGSEGV`).
pub const MIN_ADDRESS_SPACE_BYTES: u64 = 4 << 20;
/// The least stdout cap: `{}`, the smallest result.
pub const MIN_STDOUT_BYTES: u64 = 2;

/// A limit no run could work under.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: must be at least {min}")]
pub struct LimitError {
    /// The limit's field name.
    pub field: &'static str,
    /// Its least value.
    pub min: u64,
}

/// `memory_bytes`, wherever it is given, is at least [`MIN_MEMORY_BYTES`].
///
/// # Errors
///
/// [`LimitError`] when it is smaller.
pub fn check_memory(bytes: u64) -> Result<(), LimitError> {
    at_least("memory_bytes", bytes, MIN_MEMORY_BYTES)
}

/// `max_pids`, wherever it is given, is at least 1.
///
/// # Errors
///
/// [`LimitError`] when it is 0.
pub fn check_pids(pids: u32) -> Result<(), LimitError> {
    at_least("max_pids", u64::from(pids), 1)
}

fn at_least(field: &'static str, v: u64, min: u64) -> Result<(), LimitError> {
    if v < min {
        Err(LimitError { field, min })
    } else {
        Ok(())
    }
}

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
    /// Refuses a limit under which no run could work: a memory bound at
    /// which the OOM killer takes the executor, too few descriptors for a
    /// shell, too little address space to `exec`, no room for a result, no
    /// process at all. The rest (`fsize_bytes` 0, `stderr_bytes` 0, ...)
    /// are strict but workable choices.
    ///
    /// # Errors
    ///
    /// The first [`LimitError`].
    pub fn check(&self) -> Result<(), LimitError> {
        check_memory(self.memory_bytes)?;
        check_pids(self.max_pids)?;
        at_least("nofile", self.nofile, MIN_NOFILE)?;
        at_least("address_space_bytes", self.address_space_bytes, MIN_ADDRESS_SPACE_BYTES)?;
        at_least("stdout_bytes", self.stdout_bytes, MIN_STDOUT_BYTES)
    }

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
    fn limits_no_run_could_work_under_are_refused() {
        assert_eq!(Limits::default().check(), Ok(()));
        type Set = fn(&mut Limits);
        let cases: [(&str, Set); 5] = [
            ("memory_bytes", |l| l.memory_bytes = MIN_MEMORY_BYTES - 1),
            ("max_pids", |l| l.max_pids = 0),
            ("nofile", |l| l.nofile = MIN_NOFILE - 1),
            ("address_space_bytes", |l| l.address_space_bytes = 0),
            ("stdout_bytes", |l| l.stdout_bytes = 1),
        ];
        for (field, set) in cases {
            let mut l = Limits::default();
            set(&mut l);
            assert_eq!(l.check().map_err(|e| e.field), Err(field));
        }
        let least = Limits {
            memory_bytes: MIN_MEMORY_BYTES,
            max_pids: 1,
            nofile: MIN_NOFILE,
            address_space_bytes: MIN_ADDRESS_SPACE_BYTES,
            stdout_bytes: MIN_STDOUT_BYTES,
            fsize_bytes: 0,
            stderr_bytes: 0,
            stderr_line_bytes: 0,
            cpu_seconds: 0,
        };
        assert_eq!(least.check(), Ok(()));
    }

    #[test]
    fn cpu_follows_timeout() {
        let l = Limits::default();
        assert_eq!(l.cpu_seconds_for(Duration::from_secs(30)), 31);
        assert_eq!(l.cpu_seconds_for(Duration::from_millis(1500)), 3);
        let l = Limits { cpu_seconds: 5, ..Limits::default() };
        assert_eq!(l.cpu_seconds_for(Duration::from_secs(30)), 5);
    }
}
