//! What boxes a child: the rules the child applies between clone and exec.
//!
//! - [`landlock`]: which paths get which Landlock rights, per ABI, and the
//!   ruleset cache.
//! - [`seccomp`]: the syscall deny-list, compiled to classic BPF (the
//!   instructions and their test interpreter in `seccomp::bpf`).
//! - [`cgroup`]: the run's cgroups (tree kill, pids and memory bounds).
//! - [`egress`]: a run's egress allowlist as cgroup-BPF programs on its
//!   cgroup v2 leaf, and what they refused.
//!
//! # Trust model
//!
//! The executor runs as root and trusts nothing its caller says beyond
//! "run the skill whose manifest is at P with these args". It re-reads and
//! re-validates the manifest under its own root-owned configuration, checks
//! that the entry lies under an allow-list root and that the entry and every
//! folder up to that root are owned by an `entry_owners` user and not
//! group/world writable, and grants a manifest's `sandbox` object only what
//! `executor.toml` grants that skill by name. The skill is hostile: it runs
//! as an unprivileged user with no capabilities, `no_new_privs`, Landlock,
//! seccomp, rlimits and its own cgroup, and everything it writes back is
//! bounded: its files too (its directory is on a tmpfs whose pages are
//! charged to its memory cgroup). The skill's processes never outlive the
//! executor: a watchdog that holds nothing but a pipe from the executor
//! kills the instance's whole cgroup when that pipe closes. Nothing the
//! skill wrote steers a cleanup (the sweep trusts only files owned by the
//! executor's user, in directories the skill cannot write).

pub mod audit;
pub mod cgroup;
pub mod egress;
pub mod landlock;
pub mod seccomp;
