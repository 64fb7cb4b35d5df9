//! End-to-end tests of `ongrid-skilld` and the daemon commands of
//! `ongrid-skill`: the real daemon binary on temp sockets, a fake executor
//! speaking the real wire (`tests/support/fake_executor.rs`; point
//! `executor_socket` at `ongrid-executor serve` to run them against the
//! real one), real skill processes.

#[path = "../support/fake_executor.rs"]
mod fake_executor;
#[path = "../support/skilld.rs"]
mod skilld;

mod api;
mod audit;
mod cancel;
mod cli;
mod executor;
mod load;
mod logs;
mod malformed;
mod metrics;
mod permissions;
mod reload;
mod run;
mod startup;
mod systemd;

use fake_executor::FakeExecutor;
use skilld::{Env, Skilld};

/// The standard skills, a fake executor and a daemon.
fn setup() -> (Env, FakeExecutor, Skilld) {
    setup_with("")
}

fn setup_with(config: &str) -> (Env, FakeExecutor, Skilld) {
    let env = Env::new();
    let skills = env.standard_skills();
    let executor = FakeExecutor::start(&env.executor_socket());
    let daemon = Skilld::start(&env, &[&skills], config);
    (env, executor, daemon)
}
