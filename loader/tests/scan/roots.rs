//! `ONGRID_SKILLS_EXTERNAL_DIRS` and root resolution.

use crate::support::{registered, summary, Cli, Tree};

#[test]
fn env_var_splits_on_every_separator_and_trims() {
    let t = Tree::new();
    let a = t.pack("a/p", "skill_a");
    let b = t.pack("b/p", "skill_b");
    let c = t.pack("c/p", "skill_c");
    let d = t.pack("d/p", "skill_d");
    let value = format!(
        " {} :, {} ;;\t{} ,{}\n",
        t.base.join("a").display(),
        t.base.join("b").display(),
        t.base.join("c").display(),
        t.base.join("d").display()
    );
    let run = Cli::new(&["scan", "--json"]).env(&value).run();
    assert_eq!(run.code, 0);
    assert_eq!(run.names(), ["skill_a", "skill_b", "skill_c", "skill_d"]);
    assert_eq!(
        run.stderr_lines(),
        [
            registered("skill_a", &a),
            registered("skill_b", &b),
            registered("skill_c", &c),
            registered("skill_d", &d),
            summary(4)
        ]
    );
}

#[test]
fn relative_and_missing_roots_are_skipped_with_a_line() {
    let t = Tree::new();
    let m = t.pack("good/p", "good");
    let missing = t.base.join("missing");
    let value = format!("relative/skills:{}:{}", missing.display(), t.base.join("good").display());
    let run = Cli::new(&["scan", "--json"]).env(&value).cwd(&t.base).run();
    assert_eq!(run.code, 0);
    assert_eq!(
        run.stderr_lines(),
        [
            "skill loader: root relative/skills is not an absolute path, skipping".to_owned(),
            format!("skill loader: root {} does not exist, skipping", missing.display()),
            registered("good", &m),
            summary(1),
        ]
    );
}

#[test]
fn a_root_that_is_a_symlink_is_resolved_and_walked() {
    let t = Tree::new();
    let m = t.pack("real/p", "linked");
    let link = t.symlink(t.base.join("real"), "link");
    let run = Cli::scan_json(&[&link]).run();
    assert_eq!(run.code, 0);
    assert_eq!(run.stderr_lines(), [registered("linked", &m), summary(1)]);
    let json = run.json();
    assert_eq!(json[0]["root"], t.base.join("real").to_str().unwrap());
    assert_eq!(json[0]["manifest"], m.to_str().unwrap());
}

#[test]
fn a_root_symlink_loop_is_skipped() {
    let t = Tree::new();
    let looped = t.symlink(t.base.join("loop"), "loop");
    let run = Cli::scan_json(&[&looped]).run();
    assert_eq!(run.code, 0);
    assert_eq!(
        run.stderr_lines(),
        [
            format!(
                "skill loader: root {} cannot be resolved: Too many levels of symbolic links (os error 40), skipping",
                looped.display()
            ),
            summary(0),
        ]
    );
    assert_eq!(run.stdout.trim(), "[]");
}

#[test]
fn a_root_that_is_a_file_is_skipped() {
    let t = Tree::new();
    let file = t.write("file", "x");
    let run = Cli::scan_json(&[&file]).run();
    assert_eq!(
        run.stderr_lines(),
        [format!("skill loader: root {} is not a directory, skipping", file.display()), summary(0)]
    );
}

#[test]
fn the_same_root_twice_is_walked_once() {
    let t = Tree::new();
    let m = t.pack("r/p", "once");
    let root = t.base.join("r");
    let alias = t.symlink(&root, "alias");
    let run = Cli::scan_json(&[&root, &alias]).run();
    assert_eq!(run.names(), ["once"]);
    assert_eq!(
        run.stderr_lines(),
        [
            format!(
                "skill loader: root {} resolves to {}, already scanned, skipping",
                alias.display(),
                root.display()
            ),
            registered("once", &m),
            summary(1),
        ]
    );
}

#[test]
fn no_roots_at_all_is_not_an_error() {
    let run = Cli::new(&["scan", "--json"]).run();
    assert_eq!(run.code, 0);
    assert_eq!(run.stdout.trim(), "[]");
    assert_eq!(
        run.stderr_lines(),
        [
            "skill loader: no roots given and ONGRID_SKILLS_EXTERNAL_DIRS is empty or unset",
            &summary(0)
        ]
    );
}

#[test]
fn dirs_on_the_command_line_override_the_env_var_and_may_be_relative() {
    let t = Tree::new();
    t.pack("env/p", "from_env");
    let m = t.pack("cli/p", "from_cli");
    let run = Cli::new(&["scan", "--json", "cli"])
        .env(t.base.join("env").to_str().unwrap())
        .cwd(&t.base)
        .run();
    assert_eq!(run.names(), ["from_cli"]);
    assert_eq!(run.stderr_lines(), [registered("from_cli", &m), summary(1)]);
}
