//! Manifest content: parse errors, size bound, ignored fields, timeouts.

use policy::{Manifest, ValidateOptions};

use crate::support::{registered, summary, Cli, Tree};

/// The `ERROR` part of a parse line, from the policy crate itself.
fn policy_error(json: &str) -> String {
    Manifest::from_slice(json.as_bytes(), &ValidateOptions::default()).unwrap_err().to_string()
}

#[test]
fn parse_errors_are_logged_with_the_policy_message() {
    let cases = [
        "{not json",
        "[]",
        r#"{"description":"d","entry":"run"}"#,
        r#"{"name":"Bad-Name","description":"d","entry":"run"}"#,
        r#"{"name":"x","description":"d","entry":"run","class":"Safe"}"#,
        r#"{"name":"x","description":"d","entry":"run","sandbox":{"netwrk":true}}"#,
        r#"{"name":"x","description":"d","entry":"run","env_allow":["LD_PRELOAD"]}"#,
        "",
    ];
    for json in cases {
        let t = Tree::new();
        t.exe("root/p/run");
        let m = t.manifest("root/p", json);
        let run = Cli::scan_json(&[&t.base.join("root")]).run();
        assert_eq!(run.code, 0, "{json}");
        assert_eq!(
            run.stderr_lines(),
            [format!("skill loader: parse {}: {}", m.display(), policy_error(json)), summary(0)],
            "{json}"
        );
    }
}

#[test]
fn a_manifest_over_one_mib_is_skipped() {
    let t = Tree::new();
    t.exe("root/big/run");
    let mut json = String::from(r#"{"name":"big","description":"d","entry":"run","pad":""#);
    json.push_str(&"x".repeat(1 << 20));
    json.push_str("\"}");
    let big = t.manifest("root/big", &json);
    let ok = t.pack("root/ok", "ok");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(
        run.stderr_lines(),
        [
            format!(
                "skill loader: parse {}: manifest is {} bytes, larger than the 1048576 byte limit",
                big.display(),
                json.len()
            ),
            registered("ok", &ok),
            summary(1),
        ]
    );
}

#[test]
fn one_broken_pack_does_not_block_the_others() {
    let t = Tree::new();
    let a = t.pack("root/a", "first");
    let broken = t.manifest("root/b", "{");
    let c = t.pack("root/c", "third");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(run.code, 0);
    assert_eq!(run.names(), ["first", "third"]);
    assert_eq!(
        run.stderr_lines(),
        [
            registered("first", &a),
            format!("skill loader: parse {}: {}", broken.display(), policy_error("{")),
            registered("third", &c),
            summary(2),
        ]
    );
}

#[test]
fn unknown_fields_are_ignored_with_a_debug_line() {
    let t = Tree::new();
    t.exe("root/p/run");
    let m = t.manifest(
        "root/p",
        r#"{"name":"extra","description":"d","entry":"run","version":"1.2","author":"me"}"#,
    );
    let root = t.base.join("root");
    let quiet = Cli::scan_json(&[&root]).run();
    assert_eq!(quiet.names(), ["extra"]);
    assert_eq!(quiet.stderr_lines(), [registered("extra", &m), summary(1)]);

    let verbose = Cli::new(&["scan", "--json", "--verbose"]).arg(&root).run();
    assert_eq!(
        verbose.stderr_lines(),
        [
            registered("extra", &m),
            format!(
                "skill loader: skill \"extra\" from {}: ignoring unknown fields \"author\", \"version\"",
                m.display()
            ),
            summary(1),
        ]
    );
}

#[test]
fn a_long_timeout_is_clamped_with_a_line() {
    let t = Tree::new();
    t.exe("root/p/run");
    let m = t.manifest(
        "root/p",
        r#"{"name":"slow","description":"d","entry":"run","timeout_seconds":86400}"#,
    );
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    assert_eq!(run.json()[0]["timeout_seconds"], 600);
    assert_eq!(
        run.stderr_lines(),
        [
            registered("slow", &m),
            format!(
                "skill loader: skill \"slow\" from {}: timeout_seconds 86400 clamped to 600",
                m.display()
            ),
            summary(1),
        ]
    );
}
