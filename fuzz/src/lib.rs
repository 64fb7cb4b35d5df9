//! Checks shared by the fuzz targets.

use std::path::Component;
use std::time::Duration;

use policy::Manifest;
use serde_json::Value;

/// The top-level fields of `skill.json`.
pub const KNOWN: [&str; 9] = [
    "name",
    "description",
    "schema",
    "entry",
    "env_allow",
    "timeout_seconds",
    "class",
    "category",
    "sandbox",
];

/// Panics unless `m` obeys every rule a validated manifest promises, with
/// `max` the operator maximum it was validated under.
pub fn check_manifest(m: &Manifest, max: Duration) {
    let name = m.name().as_str();
    assert!(!name.is_empty() && name.len() <= 64, "name length {}", name.len());
    assert!(
        name.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_')),
        "name {name:?} outside [a-z0-9_]+"
    );

    assert!(!m.description().trim().is_empty());
    assert!(m.description().len() <= policy::manifest::MAX_DESCRIPTION_BYTES);

    assert!(!m.entry().is_empty() && !m.entry().contains('\0'));

    let schema = m.schema().to_value();
    let Value::Object(schema) = &schema else { panic!("schema {:?} is not an object", m.schema()) };
    if let Some(t) = schema.get("type") {
        assert_eq!(t, "object", "schema type");
    }

    let t = m.timeout();
    assert!(t > Duration::ZERO, "timeout is zero");
    assert!(t <= max, "timeout {t:?} over the operator maximum {max:?}");
    if let Some(asked) = m.timeout_clamped_from() {
        assert!(Duration::from_secs(asked) > max, "clamped from {asked} s, not over {max:?}");
        assert_eq!(t, max);
    }

    for (i, a) in m.env_allow().iter().enumerate() {
        assert!(!a.as_str().is_empty());
        assert!(!m.env_allow()[..i].contains(a), "env_allow duplicate {a:?}");
    }

    let c = m.category();
    assert!(!c.is_empty() && c.len() <= 64 && !c.chars().any(char::is_control));

    for f in m.ignored_fields() {
        assert!(!KNOWN.contains(&f.as_str()), "known field {f:?} listed as ignored");
    }

    let s = m.sandbox();
    for p in s.fs_read.iter().chain(&s.fs_write) {
        assert!(p.is_absolute(), "sandbox path {p:?} not absolute");
        assert!(
            p.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
            "sandbox path {p:?} not normal"
        );
    }
    for (i, c) in s.capabilities.iter().enumerate() {
        assert!(!s.capabilities[..i].contains(c), "capability duplicate {c}");
    }
    if let Some(mem) = s.memory_bytes {
        assert!(mem >= 1 << 20);
    }
    if let Some(p) = s.max_pids {
        assert!(p >= 1);
    }
}
