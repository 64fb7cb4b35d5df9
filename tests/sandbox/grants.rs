//! Manifest and grant attacks: a manifest gets at most what
//! `executor.toml` grants its skill; asking for more is `rejected` naming
//! the field, and the skill never runs.

use ongrid_tests::Config;
use policy::Outcome;
use serde_json::{json, Value};

use crate::{args, attack, no_leftovers, shared};

fn rejected(case: &str, field: &str, sandbox: Value, config: impl Fn(&str) -> Config) {
    let Some(g) = shared(case) else { return };
    let skill = attack(case).with("sandbox", sandbox);
    let run = skill.run(&config(skill.name()), &args("probe", json!({})));
    run.expect(Outcome::Rejected);
    let err = run.report.error.clone().unwrap_or_default();
    assert!(err.contains(field), "error does not name {field}: {err:?}\n{}", run.dump());
    assert!(run.report.result.is_none() && run.report.sandbox.is_none(), "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// Network without a grant.
#[test]
fn network_without_grant_is_rejected() {
    rejected("grant_network", "sandbox.network", json!({"network": true}), |_| Config::new());
}

/// A network grant for another skill does not count.
#[test]
fn another_skills_grant_does_not_count() {
    rejected("grant_other", "sandbox.network", json!({"network": true}), |_| {
        Config::new().grant("some_other_skill", "network = true")
    });
}

/// A read path outside the granted ones (a sibling with a common prefix).
#[test]
fn fs_read_beyond_grant_is_rejected() {
    rejected("grant_fs_read", "sandbox.fs_read", json!({"fs_read": ["/var/log-evil"]}), |n| {
        Config::new().grant(n, "fs_read = [\"/var/log\"]")
    });
}

/// A write path without a grant.
#[test]
fn fs_write_without_grant_is_rejected() {
    rejected("grant_fs_write", "sandbox.fs_write", json!({"fs_write": ["/var/tmp"]}), |_| {
        Config::new()
    });
}

/// run_as root without a grant.
#[test]
fn run_as_root_without_grant_is_rejected() {
    rejected("grant_run_as", "sandbox.run_as", json!({"run_as": "root"}), |_| Config::new());
}

/// A capability without a grant.
#[test]
fn capability_without_grant_is_rejected() {
    rejected(
        "grant_caps",
        "sandbox.capabilities",
        json!({"capabilities": ["CAP_NET_RAW"]}),
        |_| Config::new(),
    );
}

/// More memory or processes than the default without a grant.
#[test]
fn more_memory_or_pids_without_grant_is_rejected() {
    rejected("grant_memory", "sandbox.memory_bytes", json!({"memory_bytes": 1u64 << 40}), |_| {
        Config::new()
    });
    rejected("grant_pids", "sandbox.max_pids", json!({"max_pids": 100_000}), |_| Config::new());
}

/// `env_allow` naming a loader variable is rejected, naming it.
#[test]
fn env_allow_ld_preload_is_rejected() {
    let Some(g) = shared("env_allow_ld_preload") else { return };
    for name in ["LD_PRELOAD", "LD_LIBRARY_PATH", "GCONV_PATH"] {
        let skill = attack("env_ld").with("env_allow", json!(["FOO", name]));
        let run = skill.run(&Config::new(), &args("probe", json!({})));
        run.expect(Outcome::Rejected);
        let err = run.report.error.clone().unwrap_or_default();
        assert!(err.contains(name), "error does not name {name}: {err:?}");
        no_leftovers(&skill, &g);
    }
}

/// A huge timeout is clamped (the run still starts; RLIMIT_CPU follows the
/// clamped timeout, at most the 600 s maximum plus one second).
#[test]
fn huge_timeout_is_clamped() {
    let Some(g) = shared("huge_timeout_is_clamped") else { return };
    let skill = attack("huge_timeout").with("timeout_seconds", json!(10_000_000));
    let run = skill.run(&Config::new(), &args("probe", json!({})));
    let cpu = run.result()["rlimits"]["cpu"][0].as_u64().unwrap_or(u64::MAX);
    assert!(cpu <= 601, "RLIMIT_CPU {cpu}: the timeout was not clamped\n{}", run.dump());
    no_leftovers(&skill, &g);
}
