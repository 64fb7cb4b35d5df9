//! The environment: exactly the `env_allow` names that are set
//! (empty values included), nothing when `env_allow` is absent, and args
//! never in any argv.

use ongrid_tests::run::RunOptions;
use ongrid_tests::{Config, SkillDir};
use serde_json::json;

use crate::{args, attack, blocked, no_leftovers, shared};

fn sorted(v: &serde_json::Value) -> Vec<String> {
    let mut out: Vec<String> =
        v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect();
    out.sort();
    out
}

fn executor_env(a: &serde_json::Value) -> RunOptions {
    RunOptions::args(a)
        .env("FOO", "bar")
        .env("EMPTY", "")
        .env("SECRET_TOKEN", "s3cret")
        .env("LD_PRELOAD", "/nonexistent/evil.so")
        .env("HOME", "/root")
}

/// Exactly the allowed names that are set, set-but-empty included, seen
/// the same through `environ` and `/proc/self/environ`.
#[test]
fn environment_is_exactly_env_allow() {
    let Some(g) = shared("environment_is_exactly_env_allow") else { return };
    let skill = attack("env_exact").with("env_allow", json!(["FOO", "EMPTY", "UNSET_VAR"]));
    let run = skill.run_with(&Config::new(), executor_env(&args("probe", json!({}))));
    let r = run.result();
    assert_eq!(sorted(&r["env"]), ["EMPTY=", "FOO=bar"], "{}", run.dump());
    assert_eq!(sorted(&r["environ"]), ["EMPTY=", "FOO=bar"], "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// No `env_allow` = no environment at all, not even PATH.
#[test]
fn no_env_allow_means_no_environment() {
    let Some(g) = shared("no_env_allow_means_no_environment") else { return };
    let skill = attack("env_none");
    let run = skill.run_with(&Config::new(), executor_env(&args("probe", json!({}))));
    let r = run.result();
    assert_eq!(sorted(&r["env"]), Vec::<String>::new(), "{}", run.dump());
    assert_eq!(sorted(&r["environ"]), Vec::<String>::new(), "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// The same through `/usr/bin/env` from a shell skill (dash adds only PWD).
#[test]
fn env_command_sees_only_allowed_names() {
    let Some(g) = shared("env_command_sees_only_allowed_names") else { return };
    let skill = SkillDir::script(
        "env_shell",
        "printf '{\"env\":\"%s\"}' \"$(/usr/bin/env | /usr/bin/sort | /usr/bin/tr '\\n' ' ')\"",
    )
    .with("env_allow", json!(["FOO", "EMPTY"]));
    let run = skill.run_with(&Config::new(), executor_env(&json!({})));
    let env = run.result()["env"].as_str().expect("env string").to_owned();
    let names: Vec<&str> = env.split_whitespace().filter(|kv| !kv.starts_with("PWD=")).collect();
    assert_eq!(names, ["EMPTY=", "FOO=bar"], "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// Args reach the skill only on stdin: no readable argv or environment
/// of any process carries them.
#[test]
fn args_never_appear_in_any_argv_or_environment() {
    let Some(g) = shared("args_never_appear_in_any_argv_or_environment") else { return };
    let skill = attack("argv_scan");
    let needle = format!("NEEDLE-{}", skill.marker().to_uppercase());
    let run = skill.run(&Config::new(), &args("cmdline_scan", json!({"needle": needle})));
    let r = blocked(&run);
    // Its own `cmdline` and `environ` at least: the scan could read.
    assert!(r["files_read"].as_u64().is_some_and(|n| n >= 2), "{}", run.dump());
    no_leftovers(&skill, &g);
}
