//! Duplicate names: the first registered wins.

use crate::support::{registered, summary, Cli, Tree};

fn duplicate(name: &str, manifest: &std::path::Path) -> String {
    format!("skill loader: skill \"{name}\" already registered, skipping {}", manifest.display())
}

#[test]
fn an_earlier_root_wins_over_lexical_order() {
    let t = Tree::new();
    // `z` sorts after `a`, but it is listed first.
    let first = t.pack("z/p", "same");
    let second = t.pack("a/p", "same");
    let run = Cli::new(&["scan", "--json"])
        .env(&format!("{}:{}", t.base.join("z").display(), t.base.join("a").display()))
        .run();
    assert_eq!(
        run.stderr_lines(),
        [registered("same", &first), duplicate("same", &second), summary(1)]
    );
    assert_eq!(run.json()[0]["manifest"], first.to_str().unwrap());
}

#[test]
fn within_a_root_lexical_order_wins() {
    let t = Tree::new();
    let later = t.pack("root/b", "same");
    let first = t.pack("root/a", "same");
    let third = t.pack("root/c/d", "same");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(
        run.stderr_lines(),
        [
            registered("same", &first),
            duplicate("same", &later),
            duplicate("same", &third),
            summary(1)
        ]
    );
}

#[test]
fn a_broken_first_manifest_does_not_claim_the_name() {
    let t = Tree::new();
    t.manifest("root/a", r#"{"name":"same","description":"d","entry":"missing"}"#);
    let good = t.pack("root/b", "same");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    let lines = run.stderr_lines();
    assert!(lines[0].starts_with("skill loader: build \"same\": entry "), "{lines:?}");
    assert_eq!(lines[1..], [registered("same", &good), summary(1)]);
    assert_eq!(run.json()[0]["manifest"], good.to_str().unwrap());
}

#[test]
fn a_schema_that_does_not_compile_does_not_claim_the_name() {
    let t = Tree::new();
    let bad = t.manifest(
        "root/a",
        r#"{"name":"same","description":"d","entry":"run","schema":{"properties":{"a":{"pattern":"("}}}}"#,
    );
    t.exe("root/a/run");
    let good = t.pack("root/b", "same");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    let lines = run.stderr_lines();
    let want =
        format!("skill loader: build \"same\": schema in {} does not compile: ", bad.display());
    assert!(lines[0].starts_with(&want), "{lines:?}");
    assert_eq!(lines[1..], [registered("same", &good), summary(1)]);
    assert_eq!(run.json()[0]["manifest"], good.to_str().unwrap());
}

#[test]
fn nested_roots_register_each_skill_once() {
    let t = Tree::new();
    let m = t.pack("outer/inner/p", "nested");
    let outer = t.base.join("outer");
    let inner = t.base.join("outer/inner");
    let run = Cli::scan_json(&[&outer, &inner]).run();
    assert_eq!(run.names(), ["nested"]);
    assert_eq!(run.stderr_lines(), [registered("nested", &m), duplicate("nested", &m), summary(1)]);
}

#[test]
fn the_count_matches_the_skills_printed() {
    let t = Tree::new();
    for i in 0..25 {
        t.pack(&format!("root/p{i:02}"), &format!("skill_{i:02}"));
    }
    t.pack("root/p99", "skill_00");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(run.names().len(), 25);
    assert_eq!(run.stderr_lines().last().copied(), Some(summary(25).as_str()));
}
