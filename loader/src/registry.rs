//! The daemon's registry: the skills of the last scan, swapped atomically
//! on reload. Every schema is compiled once at scan time (a skill whose
//! schema does not compile is not registered); the compiled validators are
//! then kept in a bounded cache per snapshot ([`crate::validators`]) and
//! compiled again on a request when they were dropped.
//!
//! A [`Snapshot`] is immutable. [`Registry::current`] hands out an
//! `Arc<Snapshot>`, and a run holds an `Arc<Skill>` from it, so a reload
//! that replaces the snapshot never disturbs a request already in flight:
//! the old snapshot lives until its last reader drops it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use serde::Serialize;
use serde_json::{json, Value};

use crate::scan::ScanReport;
use crate::skill::RegisteredSkill;
use crate::validators::{self, ValidatorCache};

/// At most this many violations are listed in a 400 answer.
pub const MAX_VIOLATIONS: usize = 32;

/// A registered skill ready to serve: the scan's result plus its place in
/// its snapshot's cache of compiled validators.
pub struct Skill {
    registered: RegisteredSkill,
    slot: usize,
    validators: Arc<ValidatorCache>,
}

impl fmt::Debug for Skill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Skill").field("registered", &self.registered).finish_non_exhaustive()
    }
}

/// One way the args do not match the schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// JSON Pointer into the args (`""` = the args object itself).
    pub path: String,
    /// What is wrong, as the validator words it.
    pub message: String,
}

impl Skill {
    /// Compiles the schema of `registered`.
    ///
    /// # Errors
    ///
    /// The validator's message when the schema does not compile (an
    /// unknown `$ref`, a bad regex, a keyword of the wrong type).
    pub fn new(registered: RegisteredSkill) -> Result<Self, String> {
        Self::in_cache(registered, 0, Arc::new(ValidatorCache::new(1)))
    }

    /// Compiles the schema of `registered` into `validators` as `slot`.
    fn in_cache(
        registered: RegisteredSkill,
        slot: usize,
        validators: Arc<ValidatorCache>,
    ) -> Result<Self, String> {
        let compiled = validators::compile(registered.manifest().schema())?;
        validators.insert(slot, compiled);
        Ok(Self { registered, slot, validators })
    }

    /// The scan's view of the skill.
    pub fn registered(&self) -> &RegisteredSkill {
        &self.registered
    }

    /// The skill's name.
    pub fn name(&self) -> &str {
        self.registered.name().as_str()
    }

    /// Checks `args` against the schema; the violations, at most
    /// [`MAX_VIOLATIONS`], when they do not match.
    ///
    /// # Errors
    ///
    /// The list of violations (never empty).
    pub fn check_args(&self, args: &Value) -> Result<(), Vec<Violation>> {
        let schema = self.registered.manifest().schema();
        let validator = self
            .validators
            .get_or_compile(self.slot, || validators::compile(schema))
            // It compiled at scan time, and the text has not changed since.
            .map_err(|e| vec![Violation { path: String::new(), message: e }])?;
        let violations: Vec<Violation> = validator
            .iter_errors(args)
            .take(MAX_VIOLATIONS)
            .map(|e| Violation { path: e.instance_path().to_string(), message: e.to_string() })
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(violations)
        }
    }

    /// The skill as the client API lists it (DESIGN.md §5): `name`,
    /// `description`, `class`, `category`, `schema`, `timeout_seconds`,
    /// `env_allow`, `source`.
    pub fn to_api_json(&self) -> Value {
        let m = self.registered.manifest();
        json!({
            "name": m.name(),
            "description": m.description(),
            "class": m.class(),
            "category": m.category(),
            "schema": m.schema(),
            "timeout_seconds": m.timeout().as_secs(),
            "env_allow": m.env_allow(),
            "source": self.registered.source(),
        })
    }
}

/// A skill the scan accepted whose schema does not compile; it is not
/// registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaRejected {
    /// The skill's name.
    pub name: String,
    /// Its manifest.
    pub manifest: std::path::PathBuf,
    /// The compiler's message.
    pub error: String,
}

impl fmt::Display for SchemaRejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "skill loader: build \"{}\": schema in {} does not compile: {}",
            self.name,
            self.manifest.display(),
            self.error
        )
    }
}

/// The registered skills of one scan, by name.
#[derive(Debug, Default)]
pub struct Snapshot {
    skills: BTreeMap<String, Arc<Skill>>,
    skipped: usize,
}

impl Snapshot {
    /// Builds a snapshot from a scan, compiling every schema. Skills whose
    /// schema does not compile are left out and returned.
    pub fn build(report: ScanReport) -> (Self, Vec<SchemaRejected>) {
        Self::build_with(report, validators::DEFAULT_CAPACITY)
    }

    /// [`Snapshot::build`], keeping at most `cached` compiled validators.
    pub fn build_with(report: ScanReport, cached: usize) -> (Self, Vec<SchemaRejected>) {
        let mut skipped = report.events.iter().filter(|e| e.is_skip()).count();
        let mut skills = BTreeMap::new();
        let mut rejected = Vec::new();
        let cache = Arc::new(ValidatorCache::new(cached));
        for (slot, registered) in report.skills.into_iter().enumerate() {
            let name = registered.name().as_str().to_owned();
            let manifest = registered.manifest_path().to_path_buf();
            match Skill::in_cache(registered, slot, Arc::clone(&cache)) {
                Ok(skill) => {
                    skills.insert(name, Arc::new(skill));
                }
                Err(error) => {
                    skipped += 1;
                    rejected.push(SchemaRejected { name, manifest, error });
                }
            }
        }
        (Self { skills, skipped }, rejected)
    }

    /// The skill named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Skill>> {
        self.skills.get(name)
    }

    /// Every skill, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Skill>> {
        self.skills.values()
    }

    /// How many skills are registered.
    pub fn registered(&self) -> usize {
        self.skills.len()
    }

    /// How many manifests, files or roots the scan skipped.
    pub fn skipped(&self) -> usize {
        self.skipped
    }
}

/// The current snapshot, replaced as a whole on reload.
#[derive(Debug, Default)]
pub struct Registry {
    current: RwLock<Arc<Snapshot>>,
}

impl Registry {
    /// A registry holding `snapshot`.
    pub fn new(snapshot: Snapshot) -> Self {
        Self { current: RwLock::new(Arc::new(snapshot)) }
    }

    /// The current snapshot.
    pub fn current(&self) -> Arc<Snapshot> {
        // The lock only guards an Arc swap; a panic while holding it cannot
        // leave the Arc half-written, so a poisoned lock is still usable.
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replaces the snapshot; readers holding the old one keep it.
    pub fn replace(&self, snapshot: Snapshot) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use policy::{Manifest, ValidateOptions};

    use super::*;

    fn skill(name: &str, schema: &str) -> RegisteredSkill {
        let text = format!(
            r#"{{"name":"{name}","description":"d","entry":"run","schema":{schema},"class":"mutating"}}"#
        );
        let m = Manifest::from_slice(text.as_bytes(), &ValidateOptions::default()).unwrap();
        RegisteredSkill::new(
            m,
            PathBuf::from("/s/run"),
            PathBuf::from(format!("/s/{name}/skill.json")),
            PathBuf::from("/s"),
        )
    }

    #[test]
    fn args_are_checked_against_the_schema() {
        let s = Skill::new(skill(
            "disk",
            r#"{"type":"object","properties":{"path":{"type":"string"},"n":{"type":"integer","maximum":5}},
                "required":["path"],"additionalProperties":false}"#,
        ))
        .unwrap();
        assert_eq!(s.check_args(&json!({"path": "/"})), Ok(()));
        assert_eq!(s.check_args(&json!({"path": "/", "n": 5})), Ok(()));
        let v = s.check_args(&json!({"n": 9, "x": 1})).unwrap_err();
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v.iter().any(|v| v.path == "/n"), "{v:?}");
        assert!(v.iter().any(|v| v.path.is_empty() && v.message.contains("path")), "{v:?}");
        assert!(s.check_args(&json!([])).is_err());
    }

    #[test]
    fn violations_are_bounded() {
        let s =
            Skill::new(skill("many", r#"{"type":"object","additionalProperties":false}"#)).unwrap();
        let args: serde_json::Map<String, Value> =
            (0..100).map(|i| (format!("k{i}"), json!(i))).collect();
        let v = s.check_args(&Value::Object(args)).unwrap_err();
        assert!(!v.is_empty() && v.len() <= MAX_VIOLATIONS);
    }

    #[test]
    fn validators_are_bounded_and_compiled_again_when_dropped() {
        let report = ScanReport {
            skills: (0..5)
                .map(|i| skill(&format!("s{i}"), r#"{"type":"object","required":["a"]}"#))
                .collect(),
            events: vec![],
            ..ScanReport::default()
        };
        let (snap, rejected) = Snapshot::build_with(report, 2);
        assert!(rejected.is_empty());
        assert_eq!(snap.registered(), 5);
        let s0 = snap.get("s0").unwrap();
        assert!(!s0.validators.contains(s0.slot), "dropped: only the last 2 are held");
        assert_eq!(s0.check_args(&json!({"a": 1})), Ok(()));
        assert!(s0.check_args(&json!({})).is_err());
        assert!(s0.validators.contains(s0.slot));
        assert_eq!(s0.validators.len(), 2);
    }

    #[test]
    fn a_schema_that_does_not_compile_is_skipped_not_fatal() {
        let report = ScanReport {
            skills: vec![
                skill("good", r#"{"type":"object"}"#),
                skill("bad_ref", r##"{"$ref":"https://example.invalid/s.json"}"##),
                skill("bad_regex", r#"{"type":"object","properties":{"a":{"pattern":"("}}}"#),
            ],
            events: vec![],
            ..ScanReport::default()
        };
        let (snap, rejected) = Snapshot::build(report);
        assert_eq!(snap.registered(), 1);
        assert_eq!(snap.skipped(), 2);
        assert!(snap.get("good").is_some());
        let names: Vec<&str> = rejected.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["bad_ref", "bad_regex"]);
        assert!(rejected[0].to_string().starts_with("skill loader: build \"bad_ref\": schema in "));
    }

    #[test]
    fn api_json_has_the_documented_fields() {
        let s = Skill::new(skill("disk", r#"{"type":"object"}"#)).unwrap();
        let v = s.to_api_json();
        assert_eq!(v["source"], "skill.json");
        assert_eq!(v["class"], "mutating");
        assert_eq!(v["timeout_seconds"], 30);
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 8, "{keys:?}");
    }

    #[test]
    fn replace_keeps_old_readers_valid() {
        let (snap, _) = Snapshot::build(ScanReport {
            skills: vec![skill("a", r#"{"type":"object"}"#)],
            events: vec![],
            ..ScanReport::default()
        });
        let reg = Registry::new(snap);
        let old = reg.current();
        let held = old.get("a").unwrap().clone();
        reg.replace(Snapshot::default());
        assert_eq!(reg.current().registered(), 0);
        assert_eq!(held.name(), "a");
        assert_eq!(old.registered(), 1);
    }
}
