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
