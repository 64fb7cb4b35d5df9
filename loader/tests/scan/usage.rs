//! Usage errors and help.

use crate::support::Cli;

#[test]
fn unknown_flags_and_missing_arguments_are_usage_errors() {
    for args in [&["scan", "--bogus"][..], &["validate"], &["frobnicate"], &[]] {
        let run = Cli::new(args).run();
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains("Usage:"), "{args:?}: {}", run.stderr);
    }
}

#[test]
fn every_command_has_help() {
    // keygen without --out prints the private key on stdout: its help says so.
    for (cmd, needle) in
        [("scan", "--json"), ("validate", "PATH"), ("keygen", "the key is printed on stdout")]
    {
        let run = Cli::new(&[cmd, "--help"]).run();
        assert_eq!(run.code, 0, "{cmd}");
        assert!(run.stdout.contains(needle), "{cmd}: {}", run.stdout);
    }
}

#[test]
fn each_binary_says_what_it_is() {
    // Not the crate's description ("ongrid-skilld (registry daemon) and
    // ongrid-skill (CLI)"), which fits neither binary alone.
    let run = Cli::new(&["--help"]).run();
    assert!(run.stdout.starts_with("Runs, lists and checks subprocess skills"), "{}", run.stdout);
    let skilld = std::process::Command::new(env!("CARGO_BIN_EXE_ongrid-skilld"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&skilld.stdout);
    assert!(text.starts_with("The ongrid-skills registry daemon"), "{text}");
}

/// A socket nobody listens on: the daemon commands fail with exit 3 and name it.
const NO_SOCKET: &str = "/nonexistent/ongrid-cli-test.sock";

#[test]
fn socket_and_json_are_accepted_before_or_after_the_subcommand() {
    for args in [&["--socket", NO_SOCKET, "list"][..], &["list", "--socket", NO_SOCKET]] {
        let run = Cli::new(args).run();
        assert_eq!(run.code, 3, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(NO_SOCKET), "{args:?}: {}", run.stderr);
    }
    for args in [
        &["--json", "--socket", NO_SOCKET, "show", "x"][..],
        &["show", "x", "--socket", NO_SOCKET, "--json"],
        &["--socket", NO_SOCKET, "show", "--json", "x"],
    ] {
        let run = Cli::new(args).run();
        assert_eq!(run.code, 3, "{args:?}: {}", run.stderr);
        let error: serde_json::Value = serde_json::from_str(run.stderr.trim()).unwrap();
        assert_eq!(error["error"]["code"], "unreachable", "{args:?}");
    }
}

#[test]
fn json_before_scan_prints_json() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    for args in [&["--json", "scan", root][..], &["scan", root, "--json"]] {
        let run = Cli::new(args).run();
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        let skills: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(skills, serde_json::json!([]), "{args:?}");
    }
}

#[test]
fn scanning_a_missing_directory_names_it_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-root");
    let run = Cli::new(&["scan", missing.to_str().unwrap()]).run();
    assert_eq!(run.code, 1, "{}", run.stderr);
    let line = format!("skill loader: root {} does not exist, skipping", missing.display());
    assert!(run.stderr.lines().any(|l| l == line), "{}", run.stderr);
    assert_eq!(run.stdout, "");
}

#[test]
fn both_binaries_answer_their_version() {
    let version = env!("CARGO_PKG_VERSION");
    for bin in [crate::support::BIN, env!("CARGO_BIN_EXE_ongrid-skilld")] {
        for flag in ["-V", "--version"] {
            let out = std::process::Command::new(bin).arg(flag).output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(0), "{bin} {flag}");
            let name = std::path::Path::new(bin).file_name().unwrap().to_str().unwrap();
            assert_eq!(text.trim(), format!("{name} {version}"), "{bin} {flag}");
        }
    }
}

#[test]
fn each_help_lists_only_its_own_exit_codes() {
    let help = |cmd: &str| Cli::new(&[cmd, "--help"]).run().stdout;
    // 4 (no such skill) and 6 (executor unavailable) are run's, not list's.
    let list = help("list");
    assert!(list.contains("3  ongrid-skilld unreachable"), "{list}");
    assert!(!list.contains("4  no such skill"), "{list}");
    assert!(!list.contains("6  executor"), "{list}");
    let run = help("run");
    assert!(run.contains("4  no such skill") && run.contains("6  executor"), "{run}");
    assert!(help("show").contains("4  no such skill"));
    assert!(!help("reload").contains("6  "));
}
