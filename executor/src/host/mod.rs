//! Host set-up: what the executor arranges on the host once, before and
//! around the runs.
//!
//! - [`instance`]: one engine's share of the host (cgroup parent, runs
//!   directory, the runs tmpfs) and the watchdog that kills and removes its
//!   runs when the executor dies.
//! - [`delegation`]: taking the cgroup subtree systemd delegates to the
//!   service.
//! - [`sweep`]: removing what a dead executor left (by the watchdog, and
//!   by every executor at start).
//! - [`dynmods`]: `favordynmods` on the cgroup hierarchies, so a cgroup
//!   join after an idle gap does not wait an RCU grace period.
//! - [`capabilities`]: the executor's own capabilities, dropped at start
//!   to what it and its skills' grants need.
//! - [`procview`]: the runs' `/proc`, which shows each run only its own
//!   processes.
//! - [`attach_lock`]: warming the kernel's cgroup attach lock for a one-shot
//!   run.
//! - [`stack`]: the main thread's stack, made resident at start.
//! - [`tree`]: removing a directory tree a run made, however deep, with
//!   no recursion and never through a symlink.

pub mod attach_lock;
pub mod capabilities;
pub mod delegation;
pub mod dynmods;
pub mod fdtable;
pub mod instance;
pub mod procview;
pub mod stack;
pub mod sweep;
pub mod tree;
