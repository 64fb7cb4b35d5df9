//! The README's "Clients in code": its Python and Go clients, run as
//! written against both real daemons.

use std::path::Path;
use std::process::Command;

use crate::harness::Stack;

/// The fenced block of `lang` in README.md's "Clients in code".
fn readme_block(lang: &str) -> String {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(readme).unwrap();
    let section = text.split("\n## Clients in code").nth(1).expect("README has the section");
    let section = section.split("\n## ").next().unwrap();
    let fence = format!("```{lang}\n");
    let start = section.find(&fence).unwrap_or_else(|| panic!("a {lang} block")) + fence.len();
    let len = section[start..].find("```").expect("the block ends");
    section[start..start + len].to_owned()
}

/// Runs `program` with `ONGRID_SOCKET` set to the stack's socket; its
/// stdout, trimmed.
fn run(s: &Stack, program: &mut Command) -> String {
    let out = program.env("ONGRID_SOCKET", &s.socket).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{program:?}: {stderr}\n{}", s.logs());
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn the_readme_python_client_runs_as_written() {
    let s = Stack::start();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("client.py");
    std::fs::write(&script, readme_block("python")).unwrap();
    let printed = run(&s, Command::new("python3").arg(&script));
    assert_eq!(printed, r#"200 ok {"message": "hello"}"#);
}

#[test]
fn the_readme_go_client_runs_as_written() {
    if Command::new("go").arg("version").output().is_err() {
        println!("SKIP: no Go toolchain (Debian's golang-go; .ci/run installs it)");
        return;
    }
    let s = Stack::start();
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("main.go");
    std::fs::write(&program, readme_block("go")).unwrap();
    let mut go = Command::new("go");
    go.arg("run").arg(&program).current_dir(dir.path()).env("GOFLAGS", "-mod=mod");
    let printed = run(&s, &mut go);
    assert_eq!(printed, r#"200 ok {"message":"hello"}"#);
}
