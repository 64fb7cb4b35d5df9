//! `ongrid-skill validate`.

use crate::support::{Cli, Tree};

#[test]
fn a_valid_pack_passes() {
    let t = Tree::new();
    let m = t.pack("pack", "good");
    let run = Cli::new(&["validate"]).arg(t.base.join("pack")).run();
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(
        run.stdout,
        format!("ok    {}: registered subprocess skill \"good\"\n1 valid, 0 failed\n", m.display())
    );
}

#[test]
fn a_single_manifest_passes_with_its_folder_as_root() {
    let t = Tree::new();
    let m = t.pack("pack", "single");
    let run = Cli::new(&["validate"]).arg(&m).run();
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(run.stdout.starts_with(&format!("ok    {}:", m.display())), "{}", run.stdout);
}

#[test]
fn the_same_path_twice_is_checked_once() {
    let t = Tree::new();
    let m = t.pack("pack", "twice");
    let run = Cli::new(&["validate"]).arg(&m).arg(&m).run();
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(run.stdout.lines().count(), 2, "{}", run.stdout);
}

#[test]
fn a_manifest_given_as_its_folder_and_as_its_file_is_checked_once() {
    let t = Tree::new();
    let m = t.pack("pack", "both");
    let dir = t.base.join("pack");
    let ok = format!("ok    {}: registered subprocess skill \"both\"", m.display());
    for args in [[dir.as_path(), m.as_path()], [m.as_path(), dir.as_path()]] {
        let run = Cli::new(&["validate"]).arg(args[0]).arg(args[1]).run();
        assert_eq!(run.code, 0, "{args:?}: {}", run.stdout);
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(lines[0], ok, "{args:?}: {lines:?}");
        assert_eq!(lines.last().copied(), Some("1 valid, 0 failed"), "{args:?}: {lines:?}");
    }
    // Through another spelling of the folder: `pack/./skill.json`.
    let run = Cli::new(&["validate"]).arg(&dir).arg(dir.join(".").join("skill.json")).run();
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(run.stdout, format!("{ok}\n1 valid, 0 failed\n"));
}

#[test]
fn a_manifest_file_does_not_keep_its_folder_from_being_walked() {
    let t = Tree::new();
    let top = t.pack("root", "top");
    let sub = t.pack("root/sub", "sub");
    let run = Cli::new(&["validate"]).arg(&top).arg(t.base.join("root")).run();
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(run.stdout.contains(&format!("ok    {}:", top.display())), "{}", run.stdout);
    assert!(run.stdout.contains(&format!("ok    {}:", sub.display())), "{}", run.stdout);
    assert!(run.stdout.ends_with("2 valid, 0 failed\n"), "{}", run.stdout);
}

#[test]
fn nested_folders_and_a_folder_through_a_symlink_are_checked_once() {
    let t = Tree::new();
    let m = t.pack("root/pack", "nested");
    let root = t.base.join("root");
    let link = t.symlink(&root, "link");
    let run = Cli::new(&["validate"]).arg(&root).arg(root.join("pack")).arg(&link).run();
    assert_eq!(run.code, 0, "{}", run.stdout);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!(
                "note  {}: a symlink to a directory: checked through it here, but the daemon \
                 does not follow it inside an allow-list root (an allow-list root may be one)",
                link.display()
            ),
            format!(
                "note  {}: root resolves to {}, already scanned",
                link.display(),
                root.display()
            ),
            format!("ok    {}: registered subprocess skill \"nested\"", m.display()),
            "1 valid, 0 failed".to_owned(),
        ]
    );
}

/// A pack linked into a root is not loaded by the daemon: `validate`
/// says so, of the link inside a root and of a link given as PATH.
#[test]
fn a_symlinked_pack_folder_is_noted() {
    let t = Tree::new();
    let m = t.pack("packs/p", "linked");
    let link = t.symlink(t.base.join("packs/p"), "root/p");
    let run = Cli::new(&["validate"]).arg(t.base.join("root")).arg(&link).run();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!(
                "note  {}: a symlink to a directory: checked through it here, but the daemon \
                 does not follow it inside an allow-list root (an allow-list root may be one)",
                link.display()
            ),
            format!("note  {}: symlinked directory, not followed", link.display()),
            format!("ok    {}: registered subprocess skill \"linked\"", m.display()),
            format!("error {}: no skill.json found", t.base.join("root").display()),
            "1 valid, 1 failed".to_owned(),
        ]
    );
    assert_eq!(run.code, 1);
}

/// A manifest file by any other name is refused: the daemons (the
/// executor included) read no other file as one.
#[test]
fn a_file_not_named_skill_json_is_not_a_manifest() {
    let t = Tree::new();
    let m = t.pack("p", "real");
    let other = m.with_file_name("fixture.json");
    std::fs::copy(&m, &other).unwrap();
    let run = Cli::new(&["validate"]).arg(&other).run();
    assert_eq!(
        run.stdout.lines().next().unwrap(),
        format!(
            "error {}: not a manifest: the daemons read only files named skill.json or SKILL.md",
            other.display()
        )
    );
    assert_eq!(run.code, 1);
}

#[test]
fn a_relative_manifest_path_works() {
    let t = Tree::new();
    t.pack("pack", "rel");
    let run = Cli::new(&["validate", "pack/skill.json"]).cwd(&t.base).run();
    assert_eq!(run.code, 0, "{}", run.stdout);
}

#[test]
fn every_problem_is_listed_with_path_and_reason() {
    let t = Tree::new();
    let good = t.pack("root/a", "good");
    let bad = t.manifest("root/b", r#"{"name":"bad","entry":"run"}"#);
    t.manifest("root/c", r#"{"name":"noentry","description":"d","entry":"nope"}"#);
    let dup = t.pack("root/d", "good");
    let root = t.base.join("root");
    let run = Cli::new(&["validate"]).arg(&root).run();
    assert_eq!(run.code, 1);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!("ok    {}: registered subprocess skill \"good\"", good.display()),
            format!("error {}: missing required field \"description\"", bad.display()),
            format!(
                "error {}: build \"noentry\": entry {} does not exist",
                root.join("c/skill.json").display(),
                root.join("c/nope").display()
            ),
            format!(
                "error {}: skill \"good\" already registered from {}",
                dup.display(),
                good.display()
            ),
            "1 valid, 3 failed".to_owned(),
        ]
    );
}

#[test]
fn a_schema_that_does_not_compile_fails() {
    let t = Tree::new();
    t.exe("pack/run");
    let m = t.manifest(
        "pack",
        r#"{"name":"bad_schema","description":"d","entry":"run","schema":{"properties":{"a":{"pattern":"("}}}}"#,
    );
    let run = Cli::new(&["validate"]).arg(&m).run();
    assert_eq!(run.code, 1, "{}", run.stdout);
    let lines: Vec<&str> = run.stdout.lines().collect();
    let want = format!(
        "error {}: build \"bad_schema\": schema in {} does not compile: ",
        m.display(),
        m.display()
    );
    assert!(lines[0].starts_with(&want), "{lines:?}");
    assert_eq!(lines[1..], ["0 valid, 1 failed"]);
}

#[test]
fn missing_paths_and_empty_folders_fail() {
    let t = Tree::new();
    let missing = t.base.join("missing");
    let empty = t.dir("empty");
    let run = Cli::new(&["validate"]).arg(&missing).arg(&empty).run();
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stdout,
        format!(
            "error {}: No such file or directory (os error 2)\nerror {}: no skill.json found\n0 valid, 2 failed\n",
            missing.display(),
            empty.display()
        )
    );
}

#[test]
fn notes_do_not_fail() {
    let t = Tree::new();
    t.exe("p/run");
    t.manifest("p", r#"{"name":"n","description":"d","entry":"run","x-vendor":1}"#);
    let run = Cli::new(&["validate"]).arg(t.base.join("p")).run();
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(run.stdout.contains("note  "), "{}", run.stdout);
    assert!(run.stdout.contains("ignoring unknown fields \"x-vendor\""), "{}", run.stdout);
}

#[test]
fn json_output_summarises() {
    let t = Tree::new();
    t.pack("root/a", "good");
    t.manifest("root/b", "{");
    let run = Cli::new(&["validate", "--json"]).arg(t.base.join("root")).run();
    assert_eq!(run.code, 1);
    let doc = run.json();
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["valid"], 1);
    assert_eq!(doc["errors"], 1);
    let statuses: Vec<&str> =
        doc["findings"].as_array().unwrap().iter().map(|f| f["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["ok", "error"]);
}

#[test]
fn a_writable_entry_or_folder_gets_a_note_naming_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let set = |p: &std::path::Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let t = Tree::new();
    let m = t.pack("root/pack", "writable");
    let root = t.base.join("root");
    let dir = root.join("pack");
    let entry = dir.join("run");
    for p in [&root, &dir] {
        set(p, 0o755);
    }
    set(&entry, 0o755);
    set(&m, 0o644);
    let run = Cli::new(&["validate"]).arg(&root).run();
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(!run.stdout.contains("note"), "{}", run.stdout);
    // The executor refuses to run any: the author hears it now, not at
    // the first run (`rejected`), and the pack still registers.
    for (at, mode) in [(&entry, 0o775), (&dir, 0o777), (&m, 0o664)] {
        set(at, mode);
        let run = Cli::new(&["validate"]).arg(&root).run();
        assert_eq!(run.code, 0, "{}", run.stdout);
        let note = format!(
            "note  {}: {} is group or world writable (mode {mode:o}): ongrid-executor \
             refuses to run the skill; chmod go-w {}",
            m.display(),
            at.display(),
            at.display()
        );
        assert!(run.stdout.lines().any(|l| l == note), "{}\nwanted: {note}", run.stdout);
        set(at, 0o755);
    }
}

/// An entry that is neither an ELF binary nor a script with `#!` cannot be
/// executed (`execve` says `ENOEXEC`; no shell runs it for us): `validate`
/// says so in a note, before every run ends `spawn_failed`.
#[test]
fn an_entry_without_an_interpreter_line_gets_a_note() {
    let t = Tree::new();
    let m = t.pack("pack", "noshebang");
    let entry = t.base.join("pack").join("run");
    let run = Cli::new(&["validate"]).arg(t.base.join("pack")).run();
    assert!(!run.stdout.contains("note"), "{}", run.stdout);
    std::fs::write(&entry, "echo '{}'\n").unwrap();
    let run = Cli::new(&["validate"]).arg(t.base.join("pack")).run();
    assert_eq!(run.code, 0, "the pack still registers: {}", run.stdout);
    let note = format!(
        "note  {}: {} is neither an ELF binary nor a script starting with #!",
        m.display(),
        entry.display()
    );
    assert!(run.stdout.lines().any(|l| l.starts_with(&note)), "{}\nwanted: {note}", run.stdout);
    assert!(run.stdout.contains("spawn_failed (Exec format error)"), "{}", run.stdout);
    // A binary is fine.
    std::fs::copy("/bin/true", &entry).unwrap();
    let run = Cli::new(&["validate"]).arg(t.base.join("pack")).run();
    assert!(!run.stdout.contains("note"), "{}", run.stdout);
}

/// `--grants`: a manifest's `connect` entry the grant would not let a run
/// reach gets a note (loopback under a grant of every destination: the
/// default refusals stand), and a grant whose `connect` stands without
/// `network = true` is an error, as the executor refuses it.
#[test]
fn grants_are_judged_as_the_executor_judges_them() {
    let t = Tree::new();
    t.exe("pack/run");
    let m = t.manifest(
        "pack",
        r#"{"name":"net","description":"d","entry":"run",
            "sandbox":{"network":{"connect":["127.0.0.1:8080","10.0.0.1:80"]}}}"#,
    );
    let grants = t.write("any.toml", "[skills.net]\nnetwork = true\n");
    let run = Cli::new(&["validate", "--grants"]).arg(&grants).arg(&m).run();
    assert_eq!(run.code, 0, "a note does not fail: {}", run.stdout);
    let note = run.stdout.lines().find(|l| l.starts_with("note")).unwrap_or_default();
    assert!(note.contains("no grant of [skills.net] covers 127.0.0.1:8080 ("), "{}", run.stdout);
    let named = t.write(
        "named.toml",
        "[skills.net]\nnetwork = true\nconnect = [\"127.0.0.1:*\", \"10.0.0.0/8:80\"]\n",
    );
    let run = Cli::new(&["validate", "--grants"]).arg(&named).arg(&m).run();
    assert!(!run.stdout.contains("note"), "an entry within loopback opens it: {}", run.stdout);
    let bare = t.write("bare.toml", "[skills.net]\nconnect = [\"127.0.0.1:8080\"]\n");
    let run = Cli::new(&["validate", "--grants"]).arg(&bare).arg(&m).run();
    assert_eq!(run.code, 1, "{}", run.stdout);
    let want = "grants: [skills.net] connect needs network = true";
    assert!(run.stdout.contains(want), "{}", run.stdout);
    // Checked as the executor checks it: a relative manifest pin.
    let pinned = t.write("pinned.toml", "[skills.net]\nmanifest = \"net/skill.json\"\n");
    let run = Cli::new(&["validate", "--grants"]).arg(&pinned).arg(&m).run();
    assert_eq!(run.code, 1, "{}", run.stdout);
    let want = "grants: [skills.net] manifest: \"net/skill.json\" is not absolute";
    assert!(run.stdout.contains(want), "{}", run.stdout);
}
