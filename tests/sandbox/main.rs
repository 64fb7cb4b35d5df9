//! The adversarial sandbox suite: every case is a real skill run by the real
//! `ongrid-executor run --json` in the real sandbox, asserting the run's
//! outcome, what the skill could (not) do, and that nothing of the run is
//! left afterwards.
//!
//! Needs root (the executor drops to `ongrid-skill`); as another user every
//! case prints `SKIP: <case>: <reason>` and passes.
//!
//! `ONGRID_SANDBOX_VIA=serve` runs every case over the executor wire of a
//! long-lived `ongrid-executor serve` instead (one per configuration, shared
//! by the cases: [`ongrid_tests::served`]), the path ongrid-skilld's runs
//! take, with spawner threads and reused cgroup leaves; `scripts/test` runs
//! the suite both ways.
//!
//! # Layout
//!
//! - `exhaustion`: fork bombs, memory, CPU, output floods, rlimits.
//! - `time`: deadlines and process trees that try to outlive the run.
//! - `filesystem`: secrets, writes, symlinks, links, truncation, persistence.
//! - `network`: TCP, UDP, ICMP, abstract Unix sockets, with and without grant.
//! - `privilege`: identity, capabilities, fds, tty, seccomp, ptrace, signals.
//! - `env`: the environment is exactly `env_allow`.
//! - `status`: the outcome taxonomy and hostile bytes.
//! - `grants`: manifests asking for more than the operator grants.
//! - `isolation`: two live runs side by side cannot reach each other.
//! - `warm`: warm runs (made before their request) are boxed as cold ones,
//!   see nothing of the request before its args, serve one request each.
//! - `denials`: what the box refused a run is listed in its report.

mod denials;
mod egress;
mod env;
mod exhaustion;
mod filesystem;
mod grants;
mod isolation;
mod network;
mod privilege;
mod procfs;
mod status;
mod time;
mod warm;

use std::path::Path;
use std::sync::{RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use ongrid_tests::procs::{self, Scope};
use ongrid_tests::{host, lock, Run, SkillDir};
use policy::Outcome;
use serde_json::{json, Value};

/// The attack binary built alongside this test.
pub(crate) const ATTACK: &str = env!("CARGO_BIN_EXE_attack");

/// Slack on top of deadline + grace for a run's wall time on a busy 2-core host.
/// (A one-shot executor's start and the run's setup are in it too; CI
/// hosts have taken 0.5 s for a shell skill.)
pub(crate) const SLACK: Duration = Duration::from_millis(3000);

/// Holds the suite lock for a case's duration.
#[allow(dead_code)] // held for its Drop only
pub(crate) enum Guard {
    Shared(RwLockReadGuard<'static, ()>),
    Exclusive(RwLockWriteGuard<'static, ()>),
}

impl Guard {
    /// Which processes count as the run's: under the exclusive lock every
    /// process of the run-as user does too.
    pub(crate) fn scope(&self) -> Scope {
        match self {
            Guard::Shared(_) => Scope::default(),
            Guard::Exclusive(_) => Scope { uid: Some(host::skill_user().0), exclude: vec![] },
        }
    }
}

/// Starts a case that may run next to others; None (after a SKIP line)
/// when the host cannot run it.
pub(crate) fn shared(case: &str) -> Option<Guard> {
    host::prepare(case).then(|| Guard::Shared(lock::shared()))
}

/// Starts a case that must run alone.
pub(crate) fn exclusive(case: &str) -> Option<Guard> {
    host::prepare(case).then(|| Guard::Exclusive(lock::exclusive()))
}

/// A skill whose entry is the attack binary.
pub(crate) fn attack(case: &str) -> SkillDir {
    SkillDir::attack(case, Path::new(ATTACK))
}

/// `{"case": case, ...extra}`.
pub(crate) fn args(case: &str, extra: Value) -> Value {
    let mut v = json!({"case": case});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    v
}

/// Whether `run`'s kernel scopes its signals to its Landlock domain
/// (ABI 6): then a `kill` of anything outside the run fails with `EPERM`.
/// Where it does not, the run's report must say so (`degraded`), and a
/// test can only check that: no such `kill` is tried (it would land).
pub(crate) fn signals_scoped(case: &str, run: &Run) -> bool {
    let sandbox = run.report.sandbox.as_ref().expect("a sandbox report");
    if sandbox.landlock.scoped {
        return true;
    }
    let said = sandbox.degraded.iter().any(|d| d.contains("no signal or abstract Unix socket"));
    assert!(said, "no signal scoping, and the report does not say so:\n{}", run.dump());
    host::skip(
        case,
        "no Landlock signal scoping here (ABI < 6): only the report's note is checked",
    );
    false
}

/// The attempt ran to the end and did not succeed; returns its result.
pub(crate) fn blocked(run: &Run) -> Value {
    let r = run.result().clone();
    assert_eq!(r["succeeded"], json!(false), "the escape worked:\n{}", run.dump());
    r
}

/// As [`blocked`], failing with one of `errnos`.
pub(crate) fn blocked_with(run: &Run, errnos: &[i32]) -> Value {
    let r = blocked(run);
    let e = r["errno"].as_i64().unwrap_or(-1);
    assert!(
        errnos.iter().any(|x| i64::from(*x) == e),
        "blocked with errno {e}, expected one of {errnos:?}:\n{}",
        run.dump()
    );
    r
}

/// The attempt succeeded (a granted capability works).
pub(crate) fn allowed(run: &Run) -> Value {
    let r = run.result().clone();
    assert_eq!(r["succeeded"], json!(true), "the granted access failed:\n{}", run.dump());
    r
}

/// A syscall the seccomp filter must deny: refused with EPERM, EACCES or
/// ENOSYS, or the skill killed by SIGSYS. Any other errno means the call
/// reached the kernel proper.
pub(crate) fn syscall_denied(run: &Run) {
    if run.outcome() == Outcome::Signaled && run.report.signal == Some(libc::SIGSYS) {
        return;
    }
    blocked_with(run, &[libc::EPERM, libc::EACCES, libc::ENOSYS]);
}

/// No process of the run survived it.
pub(crate) fn no_leftovers(skill: &SkillDir, guard: &Guard) {
    procs::assert_no_leftovers(skill, &guard.scope());
}

/// The run took at most `limit` (plus [`SLACK`]) as the caller saw it.
pub(crate) fn ended_within(run: &Run, limit: Duration) {
    assert!(
        run.elapsed <= limit + SLACK,
        "run took {:?}, limit {:?} + {:?} slack:\n{}",
        run.elapsed,
        limit,
        SLACK,
        run.dump()
    );
}

/// `path` is gone, or goes within 2 s: a one-shot executor removes its run
/// directory before it prints the report, a served one's janitor right
/// after it sent the report.
pub(crate) fn removed_soon(path: &Path) -> bool {
    poll(Duration::from_secs(2), || (!path.exists()).then_some(())).is_some()
}

pub(crate) use ongrid_tests::poll;

/// A unique path outside every allowed directory, for the test to plant
/// files the skill must not reach (world-accessible, so only the sandbox
/// stands in the way).
pub(crate) fn outside(skill: &SkillDir, base: &str, suffix: &str) -> std::path::PathBuf {
    Path::new(base).join(format!("{}-{suffix}", skill.marker()))
}
