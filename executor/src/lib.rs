//! `ongrid-executor`: the privileged process that runs subprocess skills in
//! a sandbox and reports how each run ended.
//!
//! # Layout
//!
//! - [`run`]: the run path, one request in, one [`policy::RunReport`] out
//!   ([`Engine`]): validate, prepare, spawn, supervise, reap, report, and
//!   the run slots kept ready between runs.
//! - [`sandbox`]: what boxes a child: Landlock rights, the seccomp
//!   deny-list, the run's cgroups.
//! - [`host`]: host set-up: the engine's instance (cgroup parent, runs
//!   tmpfs, watchdog), cgroup delegation, the sweep of a dead executor's
//!   leftovers, `favordynmods`, the attach lock.
//! - [`server`]: `ongrid-executor serve`, the executor wire on a Unix
//!   socket (peer check, admission and queue, cancellation, shutdown).
//! - [`config`]: `executor.toml` ([`Config`]), the operator's rules.
//! - [`metrics`]: the executor's Prometheus metrics on an injected registry.
//! - [`cli`]: the binary's command line.
//! - `sys`: the only unsafe code, thin wrappers of one kernel call each
//!   (and the child's sequence between clone and exec, and the berth whose
//!   memory a spawner thread's parked child shares).
//!
//! Pure decisions are unit-tested where they live; `executor/tests/`
//! drives the real run path end to end; the workspace `tests/` crate holds
//! the adversarial suite against the `ongrid-executor` binary.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod cli;
pub mod config;
pub mod host;
pub mod mcp;
pub mod metrics;
pub mod run;
pub mod sandbox;
pub mod server;
pub(crate) mod sys;

/// Serves large allocations (a flooding skill's stdout buffers) from their
/// own mappings, given back to the kernel when freed, instead of glibc's
/// heap, which keeps them (`sys::memory`). The binary calls it first,
/// before any thread. Returns whether glibc took the setting.
pub fn map_large_allocations() -> bool {
    sys::memory::map_large_allocations(sys::memory::LARGE_ALLOCATION)
}

/// Raises the soft `RLIMIT_NOFILE` towards the hard one
/// (`host::fdtable::raise_nofile`): systemd starts services at 1024. The
/// binary calls it first, before the descriptor floor is decided. Returns
/// the soft limit before and after.
///
/// # Errors
///
/// The error of `getrlimit` or `setrlimit`.
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    host::fdtable::raise_nofile()
}

/// Sets the calling thread's signal mask to `SIGCHLD` alone, and so every
/// thread's made after it (`sys::process::mask_only_sigchld`): an inherited
/// mask blocking the stop signals is cleared. The binary calls it first,
/// before any thread.
///
/// # Errors
///
/// The error of `pthread_sigmask`.
pub fn mask_only_sigchld() -> std::io::Result<()> {
    sys::process::mask_only_sigchld()
}

pub use config::{Config, ConfigError, EgressMode, LandlockMode};
pub use metrics::Metrics;
pub use run::engine::{Engine, EngineError, RunRequest};
pub use run::janitor::SlotCounts;
