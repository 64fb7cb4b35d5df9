//! Outcome taxonomy and hostile bytes.

use std::os::unix::fs::PermissionsExt;

use ongrid_tests::run::RunOptions;
use ongrid_tests::served::{self, Via};
use ongrid_tests::{Config, SkillDir};
use policy::Outcome;
use serde_json::json;

use crate::{args, attack, no_leftovers, shared};

fn exit_case(case: &str, code: u64, stdout: &str, outcome: Outcome) -> Option<ongrid_tests::Run> {
    let g = shared(case)?;
    let skill = attack(case);
    let run = skill.run(&Config::new(), &args("exit", json!({"code": code, "stdout": stdout})));
    run.expect(outcome);
    no_leftovers(&skill, &g);
    Some(run)
}

/// Exit 0 with one JSON object = ok, result verbatim.
#[test]
fn exit_0_with_json_is_ok() {
    let Some(run) = exit_case("exit_0", 0, r#"{"answer":42,"nested":{"a":[1,2]}}"#, Outcome::Ok)
    else {
        return;
    };
    assert_eq!(&run.result(), &json!({"answer": 42, "nested": {"a": [1, 2]}}));
    assert_eq!(run.report.exit_code, Some(0));
}

/// The result is the skill's stdout verbatim: key order, number
/// spelling and escapes as printed, whitespace around the value dropped.
#[test]
fn result_is_stdout_verbatim() {
    let printed =
        r#"{"zeta": 1.50, "alpha": "\u00e9\/", "n": [1E3, -0.0, 123456789012345678901234567890]}"#;
    let Some(run) = exit_case("verbatim", 0, &format!("  {printed}\n\n"), Outcome::Ok) else {
        return;
    };
    assert_eq!(run.result_text().get(), printed, "{}", run.dump());

    // Without --json, `ongrid-executor run` prints the result itself.
    let skill = attack("verbatim_cli");
    skill.write_manifest();
    let cfg = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(cfg.path(), Config::new().to_toml()).expect("write config");
    let args = args("exit", json!({"code": 0, "stdout": format!("{printed}\n")}));
    let out = std::process::Command::new(ongrid_tests::run::executor_bin())
        .args(["run", "--manifest"])
        .arg(skill.manifest_path())
        .args(["--args", &args.to_string(), "--config"])
        .arg(cfg.path())
        .output()
        .expect("run ongrid-executor");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{printed}\n"));
}

/// A result printed across lines comes back on one line (the executor wire
/// and NDJSON carry one document per line); strings are untouched.
#[test]
fn multi_line_result_is_compacted_not_reordered() {
    let printed = "{\n  \"b\": \"x  y\",\n  \"a\": [1,\n 2.0]\n}\n";
    let Some(run) = exit_case("multi_line", 0, printed, Outcome::Ok) else { return };
    assert_eq!(run.result_text().get(), r#"{"b":"x  y","a":[1,2.0]}"#, "{}", run.dump());
}

/// A non-zero exit fails the run even with valid JSON on stdout.
#[test]
fn exit_1_is_exit_nonzero_even_with_json() {
    let Some(run) = exit_case("exit_1", 1, "{}", Outcome::ExitNonzero) else { return };
    assert_eq!(run.report.exit_code, Some(1), "{}", run.dump());
    assert!(run.report.result.is_none(), "{}", run.dump());
}

/// Exit 255 is reported as 255.
#[test]
fn exit_255_is_exit_nonzero() {
    let Some(run) = exit_case("exit_255", 255, "", Outcome::ExitNonzero) else { return };
    assert_eq!(run.report.exit_code, Some(255), "{}", run.dump());
}

/// SIGSEGV is `signaled` with signal 11.
#[test]
fn sigsegv_is_signaled_11() {
    let Some(g) = shared("sigsegv") else { return };
    let skill = attack("segv");
    let run = skill.run(&Config::new(), &args("segv", json!({})));
    run.expect(Outcome::Signaled);
    assert_eq!(run.report.signal, Some(libc::SIGSEGV), "{}", run.dump());
    assert_eq!(run.report.exit_code, None, "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// A skill printing nothing, text, two JSON values, or invalid
/// UTF-8 gives `invalid_result`.
#[test]
fn bad_stdout_is_invalid_result() {
    for (case, stdout) in [
        ("empty_stdout", ""),
        ("text_stdout", "hello world"),
        ("two_values", "{} {}"),
        ("truncated_json", "{\"a\": [1, 2"),
        ("bad_utf8", "{\"a\": \"\u{fffd}\"}"),
    ] {
        let Some(g) = shared(case) else { return };
        let skill = if case == "bad_utf8" {
            // Raw invalid UTF-8 bytes inside a JSON string.
            SkillDir::script(case, "printf '{\"a\": \"\\377\\376\"}'")
        } else {
            attack(case)
        };
        let run = skill.run(&Config::new(), &args("exit", json!({"code": 0, "stdout": stdout})));
        assert_eq!(run.outcome(), Outcome::InvalidResult, "{case}:\n{}", run.dump());
        no_leftovers(&skill, &g);
    }
}

/// An entry without the execute bit never runs.
#[test]
fn non_executable_entry_does_not_run() {
    let Some(g) = shared("non_executable_entry") else { return };
    let skill = SkillDir::script("not_exec", "echo '{}'");
    std::fs::set_permissions(skill.path().join("run.sh"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let run = skill.run(&Config::new(), &json!({}));
    assert!(matches!(run.outcome(), Outcome::Rejected | Outcome::SpawnFailed), "{}", run.dump());
    assert!(run.report.error.is_some(), "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// A missing entry never runs.
#[test]
fn missing_entry_does_not_run() {
    let Some(g) = shared("missing_entry") else { return };
    let skill = SkillDir::new("missing", "nope.sh");
    let run = skill.run(&Config::new(), &json!({}));
    assert!(matches!(run.outcome(), Outcome::Rejected | Outcome::SpawnFailed), "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// The entry must be root-owned and not group/world writable.
#[test]
fn writable_or_foreign_entry_is_rejected() {
    let Some(g) = shared("writable_or_foreign_entry") else { return };
    let skill = SkillDir::script("entry_writable", "echo '{}'");
    std::fs::set_permissions(skill.path().join("run.sh"), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    skill.run(&Config::new(), &json!({})).expect(Outcome::Rejected);
    let skill = SkillDir::script("entry_foreign", "echo '{}'");
    let (uid, gid) = ongrid_tests::host::skill_user();
    std::os::unix::fs::chown(skill.path().join("run.sh"), Some(uid), Some(gid)).expect("chown");
    skill.run(&Config::new(), &json!({})).expect(Outcome::Rejected);
    no_leftovers(&skill, &g);
}

/// A NUL inside a JSON string arrives intact.
#[test]
fn escaped_nul_in_args_arrives_intact() {
    let Some(g) = shared("escaped_nul_in_args") else { return };
    let skill = SkillDir::script("echo_nul", "exec /bin/cat");
    let a = json!({"s": "a\u{0}b", "t": "é\u{1}"});
    let run = skill.run(&Config::new(), &a);
    assert_eq!(&run.result(), &a, "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// Raw NUL bytes or non-JSON as args are `invalid_args`, and the
/// skill never runs.
#[test]
fn hostile_args_bytes_are_invalid_args() {
    let Some(g) = shared("hostile_args_bytes") else { return };
    let skill = SkillDir::script("hostile_args", "exec /bin/cat");
    // The wire carries JSON, so a served executor meets hostile args as
    // JSON values that are not one object; `run` reads raw bytes.
    let cases: Vec<RunOptions> = match served::via() {
        Via::Oneshot => [&b"{\"a\":\"x\0y\"}"[..], b"\0", b"{not json", b"\xff\xfe{}"]
            .into_iter()
            .map(RunOptions::raw)
            .collect(),
        Via::Serve => {
            [json!("{}"), json!([{}]), json!(null), json!(7)].iter().map(RunOptions::args).collect()
        }
    };
    for opts in cases {
        let raw = String::from_utf8_lossy(&opts.args).into_owned();
        let run = skill.run_with(&Config::new(), opts);
        assert_eq!(run.outcome(), Outcome::InvalidArgs, "args {raw:?}:\n{}", run.dump());
    }
    no_leftovers(&skill, &g);
}

/// 4 MiB of args streamed through a skill that writes while it
/// reads (`cat`) do not deadlock stdin against stdout.
#[test]
fn large_args_echo_does_not_deadlock() {
    let Some(g) = shared("large_args_echo") else { return };
    let skill = SkillDir::script("echo_big", "exec /bin/cat").with("timeout_seconds", json!(10));
    let a = json!({"blob": "z".repeat(4 << 20)});
    let run = skill.run(&Config::new(), &a);
    assert_eq!(&run.result(), &a, "echo differs");
    no_leftovers(&skill, &g);
}

/// A Python skill runs under the default sandbox.
#[test]
fn python_skill_runs() {
    let Some(g) = shared("python_skill_runs") else { return };
    let skill = SkillDir::new("python_ok", "run.py");
    skill.write_file(
        "run.py",
        "#!/usr/bin/python3\nimport json, sys\nprint(json.dumps({'got': json.load(sys.stdin)}))\n",
        0o755,
    );
    let run = skill.run(&Config::new(), &json!({"x": 1}));
    assert_eq!(&run.result(), &json!({"got": {"x": 1}}), "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// Parallel runs all succeed and leave nothing behind.
#[test]
fn parallel_runs_are_independent() {
    let Some(g) = crate::exclusive("parallel_runs") else { return };
    let before = ongrid_tests::procs::cgroup_dirs();
    let skills: Vec<SkillDir> = (0..6).map(|i| attack(&format!("parallel_{i}"))).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = skills
            .iter()
            .map(|sk| s.spawn(move || sk.run(&Config::new(), &args("sleep", json!({"ms": 300})))))
            .collect();
        for h in handles {
            let run = h.join().expect("run thread");
            assert_eq!(run.result()["slept_ms"], json!(300), "{}", run.dump());
        }
    });
    for sk in &skills {
        no_leftovers(sk, &g);
    }
    let leaked: Vec<_> = ongrid_tests::procs::cgroup_dirs().difference(&before).cloned().collect();
    assert!(leaked.is_empty(), "cgroups leaked: {leaked:?}");
}

/// The entry is judged by what it resolves to: a root-owned symlink to a
/// file the skill user owns, or to a file outside the skill folder, is
/// rejected.
#[test]
fn entry_symlink_to_foreign_or_outside_file_is_rejected() {
    let Some(g) = shared("entry_symlink") else { return };
    let (uid, gid) = ongrid_tests::host::skill_user();
    let foreign_dir =
        tempfile::Builder::new().prefix("ongrid-sbx-foreign-").tempdir().expect("dir");
    ongrid_tests::skill::set_mode(foreign_dir.path(), 0o755);
    let foreign = foreign_dir.path().join("run.sh");
    std::fs::write(&foreign, "#!/bin/sh\necho '{}'\n").expect("write");
    ongrid_tests::skill::set_mode(&foreign, 0o755);
    std::os::unix::fs::chown(&foreign, Some(uid), Some(gid)).expect("chown");
    let skill = SkillDir::new("entry_link_foreign", "run.sh");
    std::os::unix::fs::symlink(&foreign, skill.path().join("run.sh")).expect("symlink");
    skill.run(&Config::new(), &json!({})).expect(Outcome::Rejected);
    let skill = SkillDir::new("entry_link_outside", "run.sh");
    std::os::unix::fs::symlink("/usr/bin/true", skill.path().join("run.sh")).expect("symlink");
    skill.run(&Config::new(), &json!({})).expect(Outcome::Rejected);
    no_leftovers(&skill, &g);
}
