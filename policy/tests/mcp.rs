//! `"kind": "mcp"` packs: their fields, defaults and refusals, with the
//! field named in the error.

use std::time::Duration;

use policy::mcp::{Start, DEFAULT_IDLE_SECONDS};
use policy::{Manifest, SkillClass, ValidateOptions};
use serde_json::{json, Value};

fn parse(v: &Value) -> Result<Manifest, String> {
    Manifest::from_slice(v.to_string().as_bytes(), &ValidateOptions::default())
        .map_err(|e| e.to_string())
}

fn pack() -> Value {
    json!({
        "kind": "mcp",
        "name": "time",
        "description": "Clock tools",
        "entry": "bin/server",
    })
}

#[test]
fn a_pack_without_kind_or_with_kind_skill_is_a_one_shot_skill() {
    let plain = json!({"name": "a", "description": "d", "entry": "run.sh", "args": ["x"]});
    let m = parse(&plain).unwrap();
    assert!(m.mcp().is_none());
    // `args` means nothing to a one-shot skill: ignored and listed, as before.
    assert_eq!(m.ignored_fields(), ["args"]);
    let mut skill = plain.clone();
    skill["kind"] = json!("skill");
    let m = parse(&skill).unwrap();
    assert!(m.mcp().is_none());
    assert_eq!(m.ignored_fields(), ["args"], "kind is a known field");
}

#[test]
fn an_mcp_pack_takes_its_defaults() {
    let m = parse(&pack()).unwrap();
    let spec = m.mcp().expect("an MCP pack");
    assert!(spec.args.is_empty());
    assert_eq!(spec.start, Start::Lazy);
    assert_eq!(spec.idle, Duration::from_secs(DEFAULT_IDLE_SECONDS));
    assert!(spec.tool_classes.is_empty() && spec.env_required.is_empty());
    assert_eq!(spec.class_of("anything", m.class()), SkillClass::Safe);
    assert!(m.ignored_fields().is_empty());
}

#[test]
fn an_mcp_pack_reads_every_field() {
    let mut v = pack();
    v["args"] = json!(["--root", "/srv/data"]);
    v["start"] = json!("eager");
    v["idle_seconds"] = json!(30);
    v["class"] = json!("mutating");
    v["tool_classes"] = json!({"get_time": "safe", "wipe": "dangerous"});
    v["env_allow"] = json!(["API_TOKEN", "TZ"]);
    v["env_required"] = json!(["API_TOKEN", "API_TOKEN"]);
    v["timeout_seconds"] = json!(5);
    let m = parse(&v).unwrap();
    let spec = m.mcp().unwrap();
    assert_eq!(spec.args, ["--root", "/srv/data"]);
    assert_eq!(spec.start, Start::Eager);
    assert_eq!(spec.idle, Duration::from_secs(30));
    assert_eq!(spec.class_of("get_time", m.class()), SkillClass::Safe);
    assert_eq!(spec.class_of("wipe", m.class()), SkillClass::Dangerous);
    assert_eq!(spec.class_of("other", m.class()), SkillClass::Mutating);
    assert_eq!(spec.env_required.len(), 1, "a repeated name counts once");
    assert_eq!(m.timeout(), Duration::from_secs(5), "per call");
}

#[test]
fn bad_mcp_fields_are_refused_with_the_field_named() {
    let cases: &[(&str, Value, &str)] = &[
        ("kind", json!("plugin"), "\"kind\""),
        ("kind", json!(1), "\"kind\""),
        ("args", json!("--x"), "\"args\""),
        ("args", json!(["ok", 2]), "\"args[1]\""),
        ("args", json!(["a\u{0}b"]), "\"args[0]\""),
        ("args", json!(vec!["a"; 65]), "\"args\""),
        ("start", json!("now"), "\"start\""),
        ("idle_seconds", json!(-1), "\"idle_seconds\""),
        ("idle_seconds", json!("10"), "\"idle_seconds\""),
        ("tool_classes", json!(["safe"]), "\"tool_classes\""),
        ("tool_classes", json!({"t": "harmless"}), "\"tool_classes.t\""),
        ("tool_classes", json!({"a.b": "safe"}), "\"tool_classes.a.b\""),
        ("env_required", json!(["NOT_ALLOWED"]), "\"env_required[0]\""),
        ("env_required", json!(["LD_PRELOAD"]), "\"env_required[0]\""),
    ];
    for (field, value, needle) in cases {
        let mut v = pack();
        v[*field] = value.clone();
        let e = parse(&v).expect_err(&format!("{field} = {value}"));
        assert!(e.contains(needle), "{field} = {value}: {e}");
    }
}

#[test]
fn tool_names_are_bounded_to_what_a_skill_name_can_carry() {
    use policy::mcp::check_tool_name;
    for ok in ["get_time", "read-file", "A1"] {
        assert!(check_tool_name(ok).is_ok(), "{ok}");
    }
    for bad in ["", "a.b", "a b", "../x", &"x".repeat(65), "é"] {
        assert!(check_tool_name(bad).is_err(), "{bad:?}");
    }
}
