//! SKILL.md skills: tools registered with `source: "skill.md"`,
//! requirements checked (unmet = skipped with a line naming it), `check`,
//! and malformed or hostile frontmatter rejected with a log line, fast.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{registered, Cli, Tree, BIN};

const PROBE: &str = "---
name: net-probe
description: Network probes
when_to_use: a service seems down
metadata:
  os: [linux]
  requires:
    bins: [sh]
tools:
  - name: tcp
    impl: tcp.sh
    description: Connect to a port
    schema: {type: object, properties: {port: {type: integer}}}
  - name: ping
    impl: bin/ping.sh
    class: mutating
---
# Net probe

Use `tcp` to ...
";

fn probe_pack(tree: &Tree) -> std::path::PathBuf {
    tree.exe("skills/net/tcp.sh");
    tree.exe("skills/net/bin/ping.sh");
    tree.write("skills/net/SKILL.md", PROBE)
}

#[test]
fn each_tool_is_a_skill_with_source_skill_md() {
    let tree = Tree::new();
    let md = probe_pack(&tree);
    tree.pack("skills/plain", "plain");
    let run = Cli::scan_json(&[&tree.base.join("skills")]).run();
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines = run.stderr_lines();
    assert!(lines.contains(&registered("net_probe_tcp", &md).as_str()), "{lines:?}");
    assert!(lines.contains(&registered("net_probe_ping", &md).as_str()), "{lines:?}");
    let skills = run.json();
    let by_name = |n: &str| skills.as_array().unwrap().iter().find(|s| s["name"] == n).cloned();
    let tcp = by_name("net_probe_tcp").expect("tcp registered");
    assert_eq!(tcp["source"], "skill.md");
    assert_eq!(tcp["tool"], "tcp");
    assert_eq!(tcp["description"], "Connect to a port");
    assert_eq!(tcp["entry"], tree.base.join("skills/net/tcp.sh").to_str().unwrap());
    assert_eq!(tcp["schema"]["properties"]["port"]["type"], "integer");
    let ping = by_name("net_probe_ping").unwrap();
    assert_eq!(
        (ping["class"].as_str(), ping["description"].as_str()),
        (Some("mutating"), Some("Network probes"))
    );
    assert_eq!(by_name("plain").unwrap()["source"], "skill.json");

    // validate accepts the SKILL.md itself.
    let run = Cli::new(&["validate"]).arg(&md).run();
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
}

#[test]
fn an_impl_outside_the_root_or_missing_is_a_build_error() {
    let tree = Tree::new();
    tree.write(
        "skills/bad/SKILL.md",
        "---\nname: bad\ndescription: d\ntools:\n  - {name: up, impl: ../../outside.sh}\n  - {name: gone, impl: nope.sh}\n---\n",
    );
    tree.exe("outside.sh");
    let run = Cli::scan_json(&[&tree.base.join("skills")]).run();
    let err = &run.stderr;
    assert!(
        err.contains("skill loader: build \"bad_up\": entry ")
            && err.contains("escapes allowlist root"),
        "{err}"
    );
    assert!(err.contains("skill loader: build \"bad_gone\": entry "), "{err}");
    assert_eq!(run.json(), Value::Array(vec![]));
}

fn scan_with_path(dir: &Path, path: &str) -> (String, Value) {
    let out = Command::new(BIN)
        .args(["scan", "--json"])
        .arg(dir)
        .env("PATH", path)
        .env_remove("ONGRID_SKILLS_EXTERNAL_DIRS")
        .env_remove("ONGRID_TEST_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    (String::from_utf8(out.stderr).unwrap(), serde_json::from_str(&stdout).unwrap())
}

#[test]
fn an_unmet_requirement_skips_the_skill_naming_it() {
    let tree = Tree::new();
    tree.exe("skills/jq/run.sh");
    let md = tree.write(
        "skills/jq/SKILL.md",
        "---\nname: jq-tools\ndescription: JSON queries\nmetadata:\n  requires:\n    bins: [jq-ongrid-test]\ntools:\n  - {name: query, impl: run.sh}\n---\n",
    );
    let skills = tree.base.join("skills");
    let (err, json) = scan_with_path(&skills, "/usr/bin:/bin");
    let want = format!(
        "skill loader: skill \"jq-tools\" from {}: requirement not met: bin \"jq-ongrid-test\" not found on PATH",
        md.display()
    );
    assert!(err.lines().any(|l| l == want), "{err}");
    assert_eq!(json, Value::Array(vec![]));

    // The loader's PATH is what counts: put the program on it.
    let bin = tree.dir("bin");
    fs::write(bin.join("jq-ongrid-test"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(bin.join("jq-ongrid-test"), fs::Permissions::from_mode(0o755)).unwrap();
    let (err, json) = scan_with_path(&skills, &format!("/usr/bin:{}", bin.display()));
    assert!(err.contains(&registered("jq_tools_query", &md)), "{err}");
    assert_eq!(json[0]["name"], "jq_tools_query");

    // os, config and env the same way, each in its own pack.
    for (pack, metadata, reason) in [
        ("os", "os: [windows, darwin]", "os \"linux\" is not one of [\"windows\", \"darwin\"]"),
        (
            "conf",
            "requires: {config: [/nonexistent/ongrid.conf]}",
            "config \"/nonexistent/ongrid.conf\" not found",
        ),
        ("env", "requires: {env: [ONGRID_TEST_TOKEN]}", "env \"ONGRID_TEST_TOKEN\" not set"),
    ] {
        tree.exe(&format!("more/{pack}/run.sh"));
        let md = tree.write(
            &format!("more/{pack}/SKILL.md"),
            &format!("---\nname: {pack}\ndescription: d\nmetadata:\n  {metadata}\ntools: [{{name: t, impl: run.sh}}]\n---\n"),
        );
        let (err, _) = scan_with_path(&tree.base.join("more"), "/usr/bin:/bin");
        let want = format!(
            "skill loader: skill \"{pack}\" from {}: requirement not met: {reason}",
            md.display()
        );
        assert!(err.lines().any(|l| l == want), "{want}\n{err}");
    }
}

#[test]
fn check_prints_every_skills_requirement_status() {
    let tree = Tree::new();
    probe_pack(&tree);
    tree.pack("skills/plain", "plain");
    tree.exe("skills/needs/run.sh");
    tree.write(
        "skills/needs/SKILL.md",
        "---\nname: needs\ndescription: d\nmetadata:\n  requires: {bins: [sh, jq-ongrid-test], env: [PATH]}\ntools: [{name: t, impl: run.sh}]\n---\n",
    );
    let dir = tree.base.join("skills");
    let out = Command::new(BIN)
        .args(["check", "--json"])
        .arg(&dir)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "an unmet requirement exits 1");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["unmet"], 1);
    let skills = v["skills"].as_array().unwrap();
    let find = |n: &str| skills.iter().find(|s| s["name"] == n).unwrap();
    assert_eq!(find("plain")["source"], "skill.json");
    assert_eq!(find("net-probe")["met"], true);
    assert_eq!(find("net-probe")["tools"], serde_json::json!(["net_probe_tcp", "net_probe_ping"]));
    let needs = find("needs");
    assert_eq!(needs["met"], false);
    assert_eq!(needs["tools"], serde_json::json!([]));
    let checks: Vec<(&str, bool)> = needs["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["message"].as_str().unwrap(), c["met"].as_bool().unwrap()))
        .collect();
    assert_eq!(checks[1], ("bin \"jq-ongrid-test\" not found on PATH", false));
    assert_eq!(checks[2], ("env \"PATH\" set", true));
    assert!(checks[0].0.starts_with("bin \"sh\" found at /"), "{checks:?}");

    let out =
        Command::new(BIN).arg("check").arg(&dir).env("PATH", "/usr/bin:/bin").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("MISSING bin \"jq-ongrid-test\" not found on PATH"), "{text}");
    assert!(text.contains("tools: net_probe_tcp, net_probe_ping"), "{text}");
}

#[test]
fn check_of_a_dir_that_does_not_exist_says_so_and_fails() {
    let tree = Tree::new();
    tree.pack("skills/plain", "plain");
    let typo = tree.base.join("skils");
    let out =
        Command::new(BIN).arg("check").arg(&typo).arg(tree.base.join("skills")).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "a DIR that does not exist exits 1");
    let err = String::from_utf8(out.stderr).unwrap();
    let want = format!("skill loader: root {} does not exist, skipping", typo.display());
    assert!(err.lines().any(|l| l == want), "{want}\n{err}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("ok    plain (skill.json"), "{text}");
}

/// A billion-laughs frontmatter.
fn alias_bomb() -> String {
    let mut s = String::from("---\nname: bomb\ndescription: d\na0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
    for i in 1..10 {
        let p = i - 1;
        s.push_str(&format!(
            "a{i}: &a{i} [*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p}]\n"
        ));
    }
    s.push_str("---\n");
    s
}

#[test]
fn hostile_and_malformed_frontmatter_is_rejected_with_a_line_and_fast() {
    let tree = Tree::new();
    let deep_flow = format!(
        "---\nname: deep\ndescription: {}{}\n---\n",
        "[".repeat(20_000),
        "]".repeat(20_000)
    );
    let mut deep_block = String::from("---\nname: deepb\ndescription: d\n");
    for i in 0..300 {
        deep_block.push_str(&format!("{}k{i}:\n", " ".repeat(i)));
    }
    deep_block.push_str("---\n");
    let many_nodes = format!(
        "---\nname: many\ndescription: d\nactivation: [{}]\n---\n",
        vec!["x"; 20_000].join(",")
    );
    let huge = format!("---\nname: huge\ndescription: d\n---\n{}", "x".repeat((1 << 20) + 10));
    let long_frontmatter =
        format!("---\nname: long\ndescription: d\n{}", "# padding\n".repeat(10_000));
    let cases: Vec<(&str, String, &str)> = vec![
        ("bomb", alias_bomb(), "anchors and aliases are not accepted"),
        ("deep", deep_flow, "frontmatter: "),
        ("deepb", deep_block, "nested deeper than 32 levels"),
        ("many", many_nodes, "more than 10000 nodes"),
        ("huge", huge, "larger than the 1048576 byte limit"),
        ("long", long_frontmatter, "not closed by a `---` line"),
        (
            "unknown",
            "---\nname: u\ndescription: d\nrun_as_root: true\n---\n".into(),
            "unknown key \"run_as_root\"",
        ),
        ("malformed", "---\nname: m\ndescription: \"unterminated\n---\n".into(), "invalid YAML"),
        ("notyaml", "# Just markdown\n".into(), "must start with a `---` line"),
        (
            "tagged",
            "---\nname: t\ndescription: !!binary aGVsbG8=\n---\n".into(),
            "tags are not accepted",
        ),
        ("binary", "---\nname: b\ndescription: \u{0}\u{1}\n---\n".into(), ""),
    ];
    let mut paths = Vec::new();
    for (dir, text, _) in &cases {
        paths.push(tree.write(&format!("skills/{dir}/SKILL.md"), text));
    }
    let good = probe_pack(&tree);
    let started = Instant::now();
    let run = Cli::scan_json(&[&tree.base.join("skills")]).run();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "the scan took {took:?}");
    assert_eq!(run.code, 0);
    for ((_, _, want), path) in cases.iter().zip(&paths) {
        let prefix = format!("skill loader: parse {}: ", path.display());
        let line = run.stderr_lines().into_iter().find(|l| l.starts_with(&prefix));
        let line =
            line.unwrap_or_else(|| panic!("no parse line for {}:\n{}", path.display(), run.stderr));
        assert!(line.contains(want), "{line}");
    }
    assert!(run.stderr.contains(&registered("net_probe_tcp", &good)), "the good pack still loads");
    assert_eq!(run.json().as_array().unwrap().len(), 2);
}

#[test]
fn the_parser_is_bounded_in_time_on_worst_cases() {
    let opts = policy::ValidateOptions::default();
    let inputs = [
        format!("---\n{}\n---\n", "[".repeat(60_000)),
        format!("---\n{}\n---\n", "{a: ".repeat(12_000)),
        format!("---\na: \"{}\"\n---\n", "\\u0041".repeat(10_000)),
        format!("---\n{}---\n", "- ".repeat(30_000)),
        format!("---\n{}\n---\n", "? ".repeat(30_000)),
        alias_bomb(),
    ];
    for text in &inputs {
        let t = Instant::now();
        let r = policy::SkillMd::from_slice(text.as_bytes(), &opts);
        assert!(r.is_err());
        assert!(t.elapsed() < Duration::from_secs(1), "{:?} on {:?}", t.elapsed(), &text[..40]);
    }
}
