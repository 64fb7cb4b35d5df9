//! Entry rules: canonical, under the root by components, a regular
//! executable file.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::support::{registered, summary, Cli, Tree};

fn manifest_with_entry(t: &Tree, dir: &str, name: &str, entry: &str) -> std::path::PathBuf {
    let json = serde_json::json!({"name": name, "description": "d", "entry": entry});
    t.manifest(dir, &json.to_string())
}

fn build_line(name: &str, reason: &str) -> String {
    format!("skill loader: build \"{name}\": {reason}")
}

fn escape(entry: &Path, root: &Path) -> String {
    format!("entry {} escapes allowlist root {}", entry.display(), root.display())
}

#[test]
fn relative_dotdot_out_of_the_root_escapes() {
    let t = Tree::new();
    let target = t.exe("outside/tool");
    manifest_with_entry(&t, "root/p", "sneaky", "../../outside/tool");
    let root = t.base.join("root");
    let run = Cli::scan_json(&[&root]).run();
    assert_eq!(run.stderr_lines(), [build_line("sneaky", &escape(&target, &root)), summary(0)]);
}

#[test]
fn a_sibling_sharing_the_root_prefix_is_outside() {
    let t = Tree::new();
    let evil = t.exe("root-evil/tool");
    manifest_with_entry(&t, "root/p", "prefix", evil.to_str().unwrap());
    let root = t.base.join("root");
    let run = Cli::scan_json(&[&root]).run();
    assert_eq!(run.stderr_lines(), [build_line("prefix", &escape(&evil, &root)), summary(0)]);
}

#[test]
fn a_child_named_dotdot_foo_is_inside() {
    let t = Tree::new();
    let tool = t.exe("root/p/..foo/tool");
    let m = manifest_with_entry(&t, "root/p", "dots", "..foo/tool");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(run.stderr_lines(), [registered("dots", &m), summary(1)]);
    assert_eq!(run.json()[0]["entry"], tool.to_str().unwrap());
}

#[test]
fn absolute_entries_outside_every_root_are_rejected() {
    let t = Tree::new();
    manifest_with_entry(&t, "root/p", "shell", "/bin/sh");
    let root = t.base.join("root");
    let run = Cli::scan_json(&[&root]).run();
    let sh = fs::canonicalize("/bin/sh").unwrap();
    assert_eq!(run.stderr_lines(), [build_line("shell", &escape(&sh, &root)), summary(0)]);
}

#[test]
fn an_absolute_entry_inside_the_root_is_accepted() {
    let t = Tree::new();
    let tool = t.exe("root/bin/tool");
    let m = manifest_with_entry(&t, "root/p", "abs", tool.to_str().unwrap());
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(run.stderr_lines(), [registered("abs", &m), summary(1)]);
}

#[test]
fn a_symlink_inside_the_root_pointing_outside_escapes() {
    let t = Tree::new();
    let target = t.exe("outside/tool");
    t.symlink(&target, "root/p/run");
    manifest_with_entry(&t, "root/p", "linked", "run");
    let root = t.base.join("root");
    let run = Cli::scan_json(&[&root]).run();
    assert_eq!(run.stderr_lines(), [build_line("linked", &escape(&target, &root)), summary(0)]);
}

#[test]
fn a_symlink_inside_the_root_pointing_inside_is_canonicalised() {
    let t = Tree::new();
    let real = t.exe("root/shared/tool");
    t.symlink("../shared/tool", "root/p/run");
    let m = manifest_with_entry(&t, "root/p", "shared", "run");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(run.stderr_lines(), [registered("shared", &m), summary(1)]);
    assert_eq!(run.json()[0]["entry"], real.to_str().unwrap());
}

#[test]
fn entry_must_exist_be_regular_and_executable() {
    let t = Tree::new();
    manifest_with_entry(&t, "root/a", "missing", "run");
    t.dir("root/b/run");
    manifest_with_entry(&t, "root/b", "directory", "run");
    let plain = t.write("root/c/run", "#!/bin/sh\n");
    fs::set_permissions(&plain, fs::Permissions::from_mode(0o644)).unwrap();
    manifest_with_entry(&t, "root/c", "plain", "run");
    let root = t.base.join("root");
    let run = Cli::scan_json(&[&root]).run();
    assert_eq!(
        run.stderr_lines(),
        [
            build_line(
                "missing",
                &format!("entry {} does not exist", root.join("a/run").display())
            ),
            build_line(
                "directory",
                &format!("entry {} is not a regular file", root.join("b/run").display())
            ),
            build_line(
                "plain",
                &format!("entry {} is not executable (mode 0644)", plain.display())
            ),
            summary(0),
        ]
    );
}
