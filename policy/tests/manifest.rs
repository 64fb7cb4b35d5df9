//! Table-driven tests of `skill.json` validation: every field, its default,
//! its type errors and its bad values, with the field named in the error.

use std::time::Duration;

use policy::{Manifest, ManifestError, SkillClass, ValidateOptions};
use serde_json::{json, Value};

fn base() -> Value {
    json!({"name": "disk_usage", "description": "Disk usage per mount", "entry": "run.sh"})
}

fn with(field: &str, value: Value) -> Value {
    let mut m = base();
    m[field] = value;
    m
}

fn without(field: &str) -> Value {
    let mut m = base();
    m.as_object_mut().unwrap().remove(field);
    m
}

fn parse(v: Value) -> Result<Manifest, ManifestError> {
    Manifest::from_slice(v.to_string().as_bytes(), &ValidateOptions::default())
}

/// One rejected manifest: the error must mention `needle` (the field name).
struct Reject {
    what: &'static str,
    manifest: Value,
    needle: &'static str,
}

#[test]
fn rejects_with_the_field_named() {
    let cases = vec![
        Reject {
            what: "name missing",
            manifest: without("name"),
            needle: "missing required field \"name\"",
        },
        Reject { what: "name null", manifest: with("name", Value::Null), needle: "\"name\"" },
        Reject {
            what: "name empty",
            manifest: with("name", json!("")),
            needle: "field \"name\": must not be empty",
        },
        Reject {
            what: "name uppercase",
            manifest: with("name", json!("Disk")),
            needle: "field \"name\"",
        },
        Reject {
            what: "name space",
            manifest: with("name", json!("disk usage")),
            needle: "field \"name\"",
        },
        Reject {
            what: "name dash",
            manifest: with("name", json!("disk-usage")),
            needle: "field \"name\"",
        },
        Reject {
            what: "name non-ascii",
            manifest: with("name", json!("dïsk")),
            needle: "field \"name\"",
        },
        Reject {
            what: "name newline",
            manifest: with("name", json!("disk\n")),
            needle: "field \"name\"",
        },
        Reject {
            what: "name too long",
            manifest: with("name", json!("a".repeat(65))),
            needle: "field \"name\"",
        },
        Reject {
            what: "name number",
            manifest: with("name", json!(7)),
            needle: "field \"name\": expected a string, got number",
        },
        Reject {
            what: "description missing",
            manifest: without("description"),
            needle: "\"description\"",
        },
        Reject {
            what: "description blank",
            manifest: with("description", json!("  ")),
            needle: "\"description\"",
        },
        Reject {
            what: "description array",
            manifest: with("description", json!(["x"])),
            needle: "field \"description\": expected a string, got array",
        },
        Reject {
            what: "entry missing",
            manifest: without("entry"),
            needle: "missing required field \"entry\"",
        },
        Reject { what: "entry empty", manifest: with("entry", json!("")), needle: "\"entry\"" },
        Reject {
            what: "entry NUL",
            manifest: with("entry", json!("run\u{0}.sh")),
            needle: "\"entry\"",
        },
        Reject {
            what: "entry object",
            manifest: with("entry", json!({})),
            needle: "field \"entry\": expected a string",
        },
        Reject {
            what: "schema string",
            manifest: with("schema", json!("object")),
            needle: "field \"schema\": expected an object",
        },
        Reject {
            what: "schema array",
            manifest: with("schema", json!([])),
            needle: "field \"schema\"",
        },
        Reject {
            what: "schema not object type",
            manifest: with("schema", json!({"type": "string"})),
            needle: "field \"schema\": must describe an object",
        },
        Reject {
            what: "env_allow string",
            manifest: with("env_allow", json!("PATH")),
            needle: "field \"env_allow\": expected an array of strings",
        },
        Reject {
            what: "env_allow number item",
            manifest: with("env_allow", json!(["A", 1])),
            needle: "field \"env_allow[1]\"",
        },
        Reject {
            what: "env_allow bad name",
            manifest: with("env_allow", json!(["A-B"])),
            needle: "field \"env_allow[0]\"",
        },
        Reject {
            what: "env_allow LD_PRELOAD",
            manifest: with("env_allow", json!(["LD_PRELOAD"])),
            needle: "dynamic loader",
        },
        Reject {
            what: "timeout negative",
            manifest: with("timeout_seconds", json!(-1)),
            needle: "field \"timeout_seconds\"",
        },
        Reject {
            what: "timeout float",
            manifest: with("timeout_seconds", json!(1.5)),
            needle: "field \"timeout_seconds\"",
        },
        Reject {
            what: "timeout string",
            manifest: with("timeout_seconds", json!("30")),
            needle: "field \"timeout_seconds\": expected a non-negative integer, got string",
        },
        Reject {
            what: "class unknown",
            manifest: with("class", json!("destructive")),
            needle: "field \"class\": unknown class",
        },
        Reject {
            what: "class case",
            manifest: with("class", json!("Safe")),
            needle: "field \"class\"",
        },
        Reject {
            what: "class bool",
            manifest: with("class", json!(true)),
            needle: "field \"class\": expected a string, got boolean",
        },
        Reject {
            what: "category number",
            manifest: with("category", json!(3)),
            needle: "field \"category\"",
        },
        Reject {
            what: "category control",
            manifest: with("category", json!("a\tb")),
            needle: "field \"category\"",
        },
        Reject {
            what: "sandbox array",
            manifest: with("sandbox", json!([])),
            needle: "field \"sandbox\": expected an object",
        },
        Reject {
            what: "sandbox unknown key",
            manifest: with("sandbox", json!({"netwrk": true})),
            needle: "field \"sandbox.netwrk\"",
        },
        Reject {
            what: "sandbox network string",
            manifest: with("sandbox", json!({"network": "yes"})),
            needle: "field \"sandbox.network\": expected a boolean or an object",
        },
        Reject {
            what: "sandbox network connect entry",
            manifest: with("sandbox", json!({"network": {"connect": ["127.0.0.1"]}})),
            needle: "field \"sandbox.network.connect[0]\": \"127.0.0.1\": expected HOST:PORT",
        },
        Reject {
            what: "sandbox network unknown key",
            manifest: with("sandbox", json!({"network": {"allow": []}})),
            needle: "field \"sandbox.network.allow\"",
        },
        Reject {
            what: "sandbox fs_read relative",
            manifest: with("sandbox", json!({"fs_read": ["var/log"]})),
            needle: "field \"sandbox.fs_read[0]\"",
        },
        Reject {
            what: "sandbox fs_write dotdot",
            manifest: with("sandbox", json!({"fs_write": ["/srv/../etc"]})),
            needle: "field \"sandbox.fs_write[0]\"",
        },
        Reject {
            what: "sandbox run_as bad",
            manifest: with("sandbox", json!({"run_as": "a b"})),
            needle: "field \"sandbox.run_as\"",
        },
        Reject {
            what: "sandbox capability unknown",
            manifest: with("sandbox", json!({"capabilities": ["CAP_NOPE"]})),
            needle: "field \"sandbox.capabilities[0]\"",
        },
        Reject {
            what: "sandbox memory tiny",
            manifest: with("sandbox", json!({"memory_bytes": 10})),
            needle: "field \"sandbox.memory_bytes\"",
        },
        Reject {
            what: "sandbox pids zero",
            manifest: with("sandbox", json!({"max_pids": 0})),
            needle: "field \"sandbox.max_pids\"",
        },
    ];
    let n = cases.len();
    for c in cases {
        match parse(c.manifest) {
            Ok(m) => panic!("{}: accepted {m:?}", c.what),
            Err(e) => assert!(
                e.to_string().contains(c.needle),
                "{}: error {:?} does not contain {:?}",
                c.what,
                e.to_string(),
                c.needle
            ),
        }
    }
    assert!(n >= 40, "the table shrank to {n} cases");
}

#[test]
fn not_json_or_not_object() {
    let opts = ValidateOptions::default();
    for (bytes, needle) in [
        (&b""[..], "invalid JSON"),
        (b"{", "invalid JSON"),
        (b"\xff\xfe", "invalid JSON"),
        (b"[]", "must be a JSON object, got array"),
        (b"null", "must be a JSON object, got null"),
        (b"\"x\"", "must be a JSON object, got string"),
    ] {
        let e = Manifest::from_slice(bytes, &opts).unwrap_err();
        assert!(e.to_string().contains(needle), "{bytes:?}: {e}");
    }
}

/// A key given twice is refused with the key named, at the top level and
/// inside `schema` or `sandbox`, rather than read as the last one.
#[test]
fn duplicate_keys_are_refused_with_the_key_named() {
    let opts = ValidateOptions::default();
    for (text, want) in [
        (
            r#"{"name":"dup","class":"dangerous","description":"d","entry":"run","class":"safe"}"#,
            "duplicate key \"class\" (line 1)",
        ),
        (
            "{\"name\":\"dup\",\"description\":\"d\",\"entry\":\"run\",\n\"schema\":{\"type\":\"object\",\n\"required\":[\"a\"],\"required\":[]}}",
            "duplicate key \"required\" (line 3)",
        ),
        (
            r#"{"name":"dup","description":"d","entry":"run","sandbox":{"network":false,"network":true}}"#,
            "duplicate key \"network\" (line 1)",
        ),
        (r#"{"name":"dup","description":"d","entry":"run","\u0065ntry":"other"}"#, "duplicate key \"entry\""),
    ] {
        let e = Manifest::from_slice(text.as_bytes(), &opts).unwrap_err();
        assert!(matches!(e, ManifestError::DuplicateKey { .. }), "{text}: {e:?}");
        assert!(e.to_string().starts_with(want), "{text}: {e}");
    }
    // The same key in sibling objects is fine.
    let text = r#"{"name":"x","description":"d","entry":"run","schema":{"properties":{"a":{"type":"string"},"b":{"type":"string"}}}}"#;
    Manifest::from_slice(text.as_bytes(), &opts).unwrap();
}

/// A UTF-8 byte order mark at the start is ignored (RFC 8259 §8.1), as
/// editors on some systems write one; anywhere else it is not JSON.
#[test]
fn a_leading_byte_order_mark_is_ignored() {
    let opts = ValidateOptions::default();
    let mut text = b"\xEF\xBB\xBF".to_vec();
    text.extend(base().to_string().as_bytes());
    let m = Manifest::from_slice(&text, &opts).unwrap();
    assert_eq!(m.name().as_str(), "disk_usage");
    for bad in
        [b"\xEF\xBB\xBF\xEF\xBB\xBF{}".to_vec(), b" \xEF\xBB\xBF{}".to_vec(), b"\xEF\xBB".to_vec()]
    {
        let e = Manifest::from_slice(&bad, &opts).unwrap_err();
        assert!(e.to_string().starts_with("invalid JSON"), "{bad:?}: {e}");
    }
}

#[test]
fn too_large_is_rejected_before_parsing() {
    let mut big = base().to_string().into_bytes();
    big.truncate(big.len() - 1);
    big.extend(std::iter::repeat_n(b' ', 1 << 20));
    big.push(b'}');
    let e = Manifest::from_slice(&big, &ValidateOptions::default()).unwrap_err();
    assert!(matches!(e, ManifestError::TooLarge { .. }), "{e}");
}

#[test]
fn defaults() {
    let m = parse(base()).unwrap();
    assert_eq!(m.name().as_str(), "disk_usage");
    assert_eq!(m.description(), "Disk usage per mount");
    assert_eq!(m.entry(), "run.sh");
    assert_eq!(m.schema().to_value(), json!({"type": "object", "properties": {}}));
    assert!(m.env_allow().is_empty(), "absent env_allow must mean no environment");
    assert_eq!(m.timeout(), Duration::from_secs(30));
    assert_eq!(m.class(), SkillClass::Safe);
    assert_eq!(m.category(), "external");
    assert_eq!(m.sandbox(), &policy::SandboxRequest::default());
    assert!(m.ignored_fields().is_empty());
}

#[test]
fn null_fields_take_defaults() {
    let mut m = base();
    for f in ["schema", "env_allow", "timeout_seconds", "class", "category", "sandbox"] {
        m[f] = Value::Null;
    }
    let m = parse(m).unwrap();
    assert_eq!(m.timeout(), Duration::from_secs(30));
    assert_eq!(m.category(), "external");
}

#[test]
fn empty_env_allow_is_no_environment() {
    assert!(parse(with("env_allow", json!([]))).unwrap().env_allow().is_empty());
}

#[test]
fn env_allow_kept_in_order_without_duplicates() {
    let m = parse(with("env_allow", json!(["LANG", "PATH", "LANG"]))).unwrap();
    let names: Vec<_> = m.env_allow().iter().map(|n| n.as_str()).collect();
    assert_eq!(names, ["LANG", "PATH"]);
}

#[test]
fn timeouts() {
    let opts = ValidateOptions { max_timeout: Duration::from_secs(120) };
    let t = |v: Value| {
        Manifest::from_slice(with("timeout_seconds", v).to_string().as_bytes(), &opts).unwrap()
    };
    assert_eq!(t(json!(0)).timeout(), Duration::from_secs(30));
    assert_eq!(t(json!(5)).timeout(), Duration::from_secs(5));
    assert_eq!(t(json!(120)).timeout(), Duration::from_secs(120));
    let clamped = t(json!(100_000));
    assert_eq!(clamped.timeout(), Duration::from_secs(120));
    assert_eq!(clamped.timeout_clamped_from(), Some(100_000));
    assert_eq!(t(json!(5)).timeout_clamped_from(), None);
}

/// `timeout_seconds` as a file writes it: any whole number is that number
/// (`10.0` is what Python's `json.dumps` writes for a float), any whole
/// number over the maximum is clamped however large, and a fraction, a
/// negative number or another type is refused quoting the number as
/// written.
#[test]
fn timeout_numbers_as_written() {
    let opts = ValidateOptions { max_timeout: Duration::from_secs(120) };
    let parse = |text: &str| {
        let m =
            format!(r#"{{"name":"t","description":"d","entry":"run","timeout_seconds":{text}}}"#);
        Manifest::from_slice(m.as_bytes(), &opts)
    };
    for (text, secs, clamped_from) in [
        ("10", 10, None),
        ("10.0", 10, None),
        ("1e2", 100, None),
        ("1E2", 100, None),
        ("1.5e1", 15, None),
        ("0.0", 30, None),
        ("-0", 30, None),
        ("0e5", 30, None),
        ("121.0", 120, Some(121)),
        ("1e3", 120, Some(1000)),
        ("18446744073709551615", 120, Some(u64::MAX)),
        ("18446744073709551616", 120, Some(u64::MAX)),
        ("1e30", 120, Some(u64::MAX)),
    ] {
        let m = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(m.timeout(), Duration::from_secs(secs), "{text}");
        assert_eq!(m.timeout_clamped_from(), clamped_from, "{text}");
    }
    for (text, want) in [
        ("10.5", "field \"timeout_seconds\": must be a non-negative integer, got 10.5"),
        ("10.50", "field \"timeout_seconds\": must be a non-negative integer, got 10.50"),
        ("1.05e1", "field \"timeout_seconds\": must be a non-negative integer, got 1.05e1"),
        ("-1", "field \"timeout_seconds\": must be a non-negative integer, got -1"),
        ("-1.0", "field \"timeout_seconds\": must be a non-negative integer, got -1.0"),
        ("-1e30", "field \"timeout_seconds\": must be a non-negative integer, got -1e30"),
        ("\"30\"", "field \"timeout_seconds\": expected a non-negative integer, got string"),
        ("[30]", "field \"timeout_seconds\": expected a non-negative integer, got array"),
    ] {
        let e = parse(text).unwrap_err();
        assert_eq!(e.to_string(), want, "{text}");
    }
    // A long number is quoted to 64 characters.
    let long = format!("0.5{}", "0".repeat(100_000));
    let e = parse(&long).unwrap_err().to_string();
    assert!(e.ends_with(&format!("got {}...", &long[..64])), "{}", &e[..e.len().min(200)]);
    // Without the file's text (a SKILL.md tool), the number as read.
    let v = with("timeout_seconds", json!(10.5));
    let e = Manifest::from_value(v, &opts).unwrap_err();
    assert_eq!(
        e.to_string(),
        "field \"timeout_seconds\": must be a non-negative integer, got 10.5"
    );
    let m = Manifest::from_value(with("timeout_seconds", json!(10.0)), &opts).unwrap();
    assert_eq!(m.timeout(), Duration::from_secs(10));
}

/// Found by `fuzz/fuzz_targets/manifest.rs` (seed below, verbatim): with an
/// operator maximum under 30 s, the 30 s default was not clamped, so a
/// manifest without `timeout_seconds` ran longer than the executor allows.
#[test]
fn default_timeout_obeys_a_small_maximum() {
    let seed = br#"{"name":"a","description":"d","entry":"run"}"#;
    for max in [1, 29] {
        let opts = ValidateOptions { max_timeout: Duration::from_secs(max) };
        let m = Manifest::from_slice(seed, &opts).unwrap();
        assert_eq!(m.timeout(), Duration::from_secs(max));
        assert_eq!(m.timeout_clamped_from(), None, "the manifest asked for nothing");
        let zero = with("timeout_seconds", json!(0)).to_string();
        assert_eq!(
            Manifest::from_slice(zero.as_bytes(), &opts).unwrap().timeout(),
            Duration::from_secs(max)
        );
    }
}

#[test]
fn classes() {
    for (s, c) in [
        ("safe", SkillClass::Safe),
        ("mutating", SkillClass::Mutating),
        ("dangerous", SkillClass::Dangerous),
    ] {
        assert_eq!(parse(with("class", json!(s))).unwrap().class(), c);
    }
}

#[test]
fn category_given_or_empty() {
    assert_eq!(parse(with("category", json!("network"))).unwrap().category(), "network");
    assert_eq!(parse(with("category", json!(""))).unwrap().category(), "external");
    for blank in ["   ", " ", "\u{3000}", "\t \n"] {
        assert_eq!(
            parse(with("category", json!(blank))).unwrap().category(),
            "external",
            "{blank:?}"
        );
    }
}

#[test]
fn schema_object_kept_verbatim_but_typed() {
    let s =
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
    assert_eq!(parse(with("schema", s.clone())).unwrap().schema().to_value(), s);
    // Args are always an object: a schema that does not say so gets
    // `"type": "object"`, which every tool format requires.
    for (untyped, typed) in [
        (json!({"properties": {}}), json!({"type": "object", "properties": {}})),
        (json!({}), json!({"type": "object"})),
    ] {
        assert_eq!(parse(with("schema", untyped)).unwrap().schema().to_value(), typed);
    }
}

#[test]
fn unknown_fields_are_ignored_and_listed() {
    let mut m = base();
    m["version"] = json!("1.2");
    m["author"] = json!({"x": 1});
    let m = parse(m).unwrap();
    let mut ignored = m.ignored_fields().to_vec();
    ignored.sort();
    assert_eq!(ignored, ["author", "version"]);
}

#[test]
fn sandbox_request_parsed() {
    let m = parse(with(
        "sandbox",
        json!({"fs_read": ["/var/log/"], "fs_write": ["/srv/out"], "network": true, "run_as": "root",
               "capabilities": ["CAP_NET_RAW", "net_raw"], "memory_bytes": 1073741824, "max_pids": 8}),
    ))
    .unwrap();
    let s = m.sandbox();
    assert_eq!(s.fs_read, [std::path::PathBuf::from("/var/log")]);
    assert_eq!(s.fs_write, [std::path::PathBuf::from("/srv/out")]);
    assert!(s.network);
    assert_eq!(s.run_as.as_deref(), Some("root"));
    assert_eq!(s.capabilities, [13]);
    assert_eq!(s.memory_bytes, Some(1 << 30));
    assert_eq!(s.max_pids, Some(8));
}

#[test]
fn sandbox_network_object_lists_where_the_skill_connects() {
    let m = parse(with(
        "sandbox",
        json!({"network": {"connect": ["example.com:443", "[::1]:53", "10.0.0.0/8:*"]}}),
    ))
    .unwrap();
    let s = m.sandbox();
    assert!(s.network, "an object means the skill needs network");
    let listed: Vec<String> = s.connect.iter().map(ToString::to_string).collect();
    assert_eq!(listed, ["example.com:443", "[::1]:53", "10.0.0.0/8:*"]);
    let bare = parse(with("sandbox", json!({"network": true}))).unwrap();
    assert!(bare.sandbox().network && bare.sandbox().connect.is_empty());
}

#[test]
fn output_schema_is_an_object_schema_or_absent() {
    assert!(parse(base()).unwrap().output_schema().is_none());
    let schema = json!({"type": "object", "properties": {"used": {"type": "number"}}});
    let m = parse(with("output_schema", schema.clone())).unwrap();
    assert_eq!(*m.output_schema().unwrap(), schema);
    assert!(m.ignored_fields().is_empty(), "{:?}", m.ignored_fields());
    for (bad, needle) in [
        (json!([]), "field \"output_schema\": expected an object"),
        (json!({"type": "array"}), "field \"output_schema\": must describe an object"),
        (json!({"properties": {}}), "field \"output_schema\": must describe an object"),
    ] {
        let e = parse(with("output_schema", bad.clone())).unwrap_err().to_string();
        assert!(e.contains(needle), "{bad}: {e}");
    }
}
