//! Test support for the cross-process suites of ongrid-skills.
//!
//! # Layout
//!
//! - [`host`]: what the host offers (root, the run-as user, sysctls) and the
//!   `SKIP:` convention for cases this host cannot check.
//! - [`skill`]: [`SkillDir`], a throw-away skill folder (manifest + entry)
//!   that the run-as user can traverse.
//! - [`config`]: [`Config`], the `executor.toml` a run is given.
//! - [`run`]: [`Run`], one `ongrid-executor run --json` invocation, with its
//!   report, wall time and the executor's peak memory.
//! - [`served`]: the same run over the wire of a long-lived
//!   `ongrid-executor serve` (`ONGRID_SANDBOX_VIA=serve`), the path
//!   ongrid-skilld's runs take.
//! - [`procs`]: `/proc` and cgroup scans proving nothing of a run survives it.
//! - [`victim`]: [`Victim`], a process outside the sandbox, owned by the
//!   run-as user, that sandboxed skills try to signal, trace or read.
//! - [`lock`]: serialises the resource-heavy cases.
//! - [`pack`]: skill packs under a served root, and 0755 temp folders.
//! - [`wait`]: waiting with a deadline, a free loopback port.
//! - [`wire`]: a blocking line client of the executor's wire.
//! - [`http`]: blocking requests to `ongrid-skilld` through the loader's
//!   own client, and the raw answer parser for checks of exact bytes.
//! - [`shipped`]: the packaged configuration files, uncommented.
//!
//! This crate is also the test kit of every suite (the executor's and the
//! loader's integration tests, the benches): the helpers they share are
//! re-exported at its root.
//!
//! # Test strategy
//!
//! Every sandbox case runs a real skill (usually the `attack` binary of this
//! crate, which makes one escape attempt and prints what happened as JSON)
//! under the real executor binary, then asserts the run's outcome, the
//! attempt's result, and that no process of the run is left. An attempt
//! reports `"succeeded": true` when the escape worked, so a missing sandbox
//! layer fails the case instead of passing it vacuously.

pub mod config;
pub mod host;
pub mod http;
pub mod lock;
pub mod pack;
pub mod procs;
pub mod run;
pub mod served;
pub mod shipped;
pub mod skill;
pub mod victim;
pub mod wait;
pub mod wire;

pub use config::Config;
pub use host::{can_run, root_or_skip};
pub use pack::{dir_0755, temp_dir, write_pack, write_pack_entry};
pub use run::Run;
pub use skill::SkillDir;
pub use victim::Victim;
pub use wait::{free_port, poll, wait_for};
