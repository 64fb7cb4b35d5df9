//! The recursive walk: order, symlinks, special files, unreadable paths.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::support::{registered, summary, Cli, Tree};

#[test]
fn walk_is_recursive_and_lexical() {
    let t = Tree::new();
    // Created out of order on purpose.
    let z = t.pack("root/z", "zulu");
    let deep = t.pack("root/b/d/e/f", "deep");
    let a = t.pack("root/a", "alpha");
    let c = t.pack("root/b/c", "charlie");
    let top = t.pack("root", "top");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(run.names(), ["alpha", "charlie", "deep", "top", "zulu"]);
    assert_eq!(
        run.stderr_lines(),
        [
            registered("alpha", &a),
            registered("charlie", &c),
            registered("deep", &deep),
            registered("top", &top),
            registered("zulu", &z),
            summary(5),
        ]
    );
}

#[test]
fn only_files_named_exactly_skill_json_are_manifests() {
    let t = Tree::new();
    t.exe("root/p/run");
    let valid = r#"{"name":"x","description":"d","entry":"run"}"#;
    t.write("root/p/Skill.json", valid);
    t.write("root/p/skill.json.bak", valid);
    t.write("root/p/skill.JSON", valid);
    t.write("root/p/my-skill.json", valid);
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(run.stderr_lines(), [summary(0)]);
}

/// Each link to a directory is said, once, and not followed; links to
/// files and dangling links are not directories.
#[test]
fn symlinked_directories_are_not_followed() {
    let t = Tree::new();
    t.pack("outside/p", "outside");
    let inside = t.pack("root/in", "inside");
    let out = t.symlink(t.base.join("outside"), "root/link_out");
    // A link back to the root: following it would loop. Inside a pack, to
    // a folder holding no manifest, it is not said (a venv's `lib64 ->
    // lib` would be at every rescan); a link there to a pack is.
    t.symlink(t.base.join("root"), "root/in/loop");
    let nested = t.symlink(t.base.join("outside/p"), "root/in/vendored");
    let up = t.symlink("..", "root/up");
    t.symlink(t.base.join("outside/p/run"), "root/in/tool");
    t.symlink(t.base.join("nothing"), "root/in/dangling");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(run.code, 0);
    assert_eq!(run.names(), ["inside"]);
    let skipped = |p: &std::path::Path| {
        format!("skill loader: skipping {}: symlinked directory, not followed", p.display())
    };
    assert_eq!(
        run.stderr_lines(),
        [registered("inside", &inside), skipped(&nested), skipped(&out), skipped(&up), summary(1)]
    );
}

#[test]
fn a_symlink_named_skill_json_is_skipped_even_dangling() {
    let t = Tree::new();
    let real = t.pack("elsewhere", "real");
    let link = t.symlink(&real, "root/a/skill.json");
    let dangling = t.symlink(t.base.join("nothing"), "root/b/skill.json");
    let self_loop = t.symlink("skill.json", "root/c/skill.json");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(
        run.stderr_lines(),
        [
            format!("skill loader: skipping {}: not a regular file (symlink)", link.display()),
            format!("skill loader: skipping {}: not a regular file (symlink)", dangling.display()),
            format!("skill loader: skipping {}: not a regular file (symlink)", self_loop.display()),
            summary(0),
        ]
    );
}

#[test]
fn a_fifo_named_skill_json_does_not_block_the_scan() {
    let t = Tree::new();
    let fifo = t.path("root/a/skill.json");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let m = t.pack("root/b", "after_fifo");
    // `run` fails the test if the scan takes over 20 s.
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(
        run.stderr_lines(),
        [
            format!("skill loader: skipping {}: not a regular file (fifo)", fifo.display()),
            registered("after_fifo", &m),
            summary(1),
        ]
    );
}

#[test]
fn a_directory_named_skill_json_is_skipped_and_walked_into() {
    let t = Tree::new();
    let dir = t.dir("root/p/skill.json");
    let inner = t.pack("root/p/skill.json/inner", "inner");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(
        run.stderr_lines(),
        [
            format!("skill loader: skipping {}: not a regular file (directory)", dir.display()),
            registered("inner", &inner),
            summary(1),
        ]
    );
}

#[test]
fn an_unreadable_manifest_is_skipped() {
    let t = Tree::new();
    let locked = t.pack("root/a", "locked");
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
    let open = t.pack("root/b", "open");
    let Some(cli) = Cli::scan_json(&[&t.base.join("root")]).unprivileged() else { return };
    let run = cli.run();
    assert_eq!(run.code, 0);
    assert_eq!(
        run.stderr_lines(),
        [
            format!("skill loader: parse {}: Permission denied (os error 13)", locked.display()),
            registered("open", &open),
            summary(1),
        ]
    );
}

#[test]
fn an_unreadable_directory_is_skipped_and_the_walk_goes_on() {
    let t = Tree::new();
    t.pack("root/a/hidden", "hidden");
    let dir = t.base.join("root/a");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o000)).unwrap();
    let visible = t.pack("root/b", "visible");
    let Some(cli) = Cli::scan_json(&[&t.base.join("root")]).unprivileged() else { return };
    let run = cli.run();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(run.code, 0);
    assert_eq!(
        run.stderr_lines(),
        [
            format!("skill loader: walk {}: Permission denied (os error 13)", dir.display()),
            registered("visible", &visible),
            summary(1),
        ]
    );
}

#[test]
fn an_unreadable_root_is_reported() {
    let t = Tree::new();
    t.pack("root/p", "p");
    let root = t.base.join("root");
    fs::set_permissions(&root, fs::Permissions::from_mode(0o000)).unwrap();
    let Some(cli) = Cli::scan_json(&[&root]).unprivileged() else { return };
    let run = cli.run();
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(run.code, 0);
    assert_eq!(
        run.stderr_lines(),
        [
            format!("skill loader: walk {}: Permission denied (os error 13)", root.display()),
            summary(0),
        ]
    );
}

#[test]
fn a_pack_whose_path_is_not_utf8_is_skipped_and_leaves_its_name() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let t = Tree::new();
    // `root/n\xffu/`: the executor wire names a manifest as a JSON string,
    // so this pack could be listed but never run.
    let dir = t.base.join("root").join(OsStr::from_bytes(b"n\xffu"));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("run"), "#!/bin/sh\necho '{}'\n").unwrap();
    fs::set_permissions(dir.join("run"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(dir.join("skill.json"), r#"{"name":"nu","description":"d","entry":"run"}"#).unwrap();
    let good = t.pack("root/z", "nu");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(
        run.stderr_lines(),
        [
            format!(
                "skill loader: build \"nu\": manifest path {}/n\u{fffd}u/skill.json is not UTF-8",
                t.base.join("root").display()
            ),
            registered("nu", &good),
            summary(1)
        ]
    );
    assert_eq!(run.names(), ["nu"]);
    assert_eq!(run.json()[0]["manifest"], good.to_str().unwrap());

    let bad = Cli::new(&["validate"]).arg(dir.join("skill.json")).run();
    assert_eq!(bad.code, 1, "{}", bad.stdout);
    let why = format!(
        ": build \"nu\": manifest path {}/n\u{fffd}u/skill.json is not UTF-8\n",
        dir.parent().unwrap().display()
    );
    assert!(bad.stdout.contains(&why), "{}", bad.stdout);
}
