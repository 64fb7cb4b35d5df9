//! The daemon's registry: the skills of the last scan, swapped atomically
//! on reload. Every schema is compiled once by the scan (a skill whose
//! schema does not compile is not registered: [`crate::scan::build`]); the
//! compiled validators the scan hands on are kept in a bounded cache per
//! snapshot ([`crate::scan::validators`]) and compiled again on a request when
//! they were dropped.
//!
//! A [`Snapshot`] is immutable. [`Registry::current`] hands out an
//! `Arc<Snapshot>`, and a run holds an `Arc<Skill>` from it, so a reload
//! that replaces the snapshot never disturbs a request already in flight:
//! the old snapshot lives until its last reader drops it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use serde::Serialize;
use serde_json::Value;

use crate::scan::skill::RegisteredSkill;
use crate::scan::validators::{self, ValidatorCache};
use crate::scan::ScanReport;

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
        let validators = Arc::new(ValidatorCache::new(1));
        validators.insert(0, validators::compile(registered.manifest().schema())?);
        Ok(Self { registered, slot: 0, validators })
    }

    /// The scan's view of the skill.
    pub fn registered(&self) -> &RegisteredSkill {
        &self.registered
    }

    /// The skill's name.
    pub fn name(&self) -> &str {
        self.registered.name()
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

    /// The skill as the client API lists it: `name`,
    /// `description`, `class`, `category`, `schema`, `timeout_seconds`,
    /// `env_allow`, `source`.
    pub fn to_api_json(&self) -> Value {
        self.registered.to_api_json()
    }
}

/// The registered skills of one scan, by name.
#[derive(Debug, Default)]
pub struct Snapshot {
    skills: BTreeMap<String, Arc<Skill>>,
    /// The name of each MCP server's tool (`PACK.TOOL`) by its alias
    /// (`PACK_TOOL`, the spelling the function formats list).
    aliases: BTreeMap<String, String>,
    skipped: usize,
    /// The MCP server packs of the scan, by manifest, with the generation
    /// of the tool list their skills were registered from.
    mcp: BTreeMap<PathBuf, McpPack>,
}

/// An MCP server pack of a snapshot.
#[derive(Debug, Clone)]
pub struct McpPack {
    /// The pack as the scan found it.
    pub pack: RegisteredSkill,
    /// Whether its tools were listed (else it has none in the snapshot:
    /// the executor could not be asked, or its server did not start).
    pub listed: bool,
    /// The generation of the tool list its skills come from (`None`: not
    /// listed, or the executor said no generation).
    pub generation: Option<u64>,
}

impl Snapshot {
    /// Builds a snapshot from a scan, taking over the validators it
    /// compiled (each skill's slot in the cache is its index in
    /// `report.skills`).
    pub fn build(report: ScanReport) -> Self {
        let skipped = report.events.iter().filter(|e| e.is_skip()).count();
        let mut generations = report.mcp_generations;
        let mcp = report
            .mcp_packs
            .into_iter()
            .map(|pack| {
                let path = pack.manifest_path().to_owned();
                let listed = generations.remove(&path);
                let pack = McpPack { pack, listed: listed.is_some(), generation: listed.flatten() };
                (path, pack)
            })
            .collect();
        let cache = report.validators;
        let skills: BTreeMap<String, Arc<Skill>> = report
            .skills
            .into_iter()
            .enumerate()
            .map(|(slot, registered)| {
                let name = registered.name().to_owned();
                let skill = Skill { registered, slot, validators: Arc::clone(&cache) };
                (name, Arc::new(skill))
            })
            .collect();
        let aliases = Self::aliases_of(&skills);
        Self { skills, aliases, skipped, mcp }
    }

    /// The alias of every MCP server's tool among `skills`.
    fn aliases_of(skills: &BTreeMap<String, Arc<Skill>>) -> BTreeMap<String, String> {
        skills
            .iter()
            .filter(|(_, s)| s.registered.source() == "mcp")
            .map(|(name, s)| (s.registered.function_name().as_str().to_owned(), name.clone()))
            .collect()
    }

    /// The MCP server pack at `manifest`.
    pub fn mcp_pack(&self, manifest: &Path) -> Option<&McpPack> {
        self.mcp.get(manifest)
    }

    /// The MCP server packs whose tools were not listed (the executor
    /// could not be asked, or its server did not start).
    pub fn unlisted_mcp_packs(&self) -> Vec<PathBuf> {
        self.mcp.iter().filter(|(_, p)| !p.listed).map(|(m, _)| m.clone()).collect()
    }

    /// Whether the scan found MCP server packs.
    pub fn has_mcp_packs(&self) -> bool {
        !self.mcp.is_empty()
    }

    /// Whether the skill is a tool of the MCP server pack at `manifest`.
    fn is_tool_of(skill: &Skill, manifest: &Path) -> bool {
        skill.registered.source() == "mcp" && skill.registered.manifest_path() == manifest
    }

    /// The manifest of the skill whose name or alias is `alias` (a tool's
    /// `PACK_TOOL`), unless it is a tool of the MCP server pack at
    /// `manifest` (whose tools are being replaced).
    pub fn taken_by_other(&self, alias: &str, manifest: &Path) -> Option<PathBuf> {
        let skill = self.get(alias).filter(|s| !Self::is_tool_of(s, manifest))?;
        Some(skill.registered.manifest_path().to_owned())
    }

    /// This snapshot with the tools of the MCP server pack at `manifest`
    /// replaced by `tools` (listed at `generation`); every other skill is
    /// shared with this one, compiled validators included.
    #[must_use]
    pub fn with_pack_tools(
        &self,
        manifest: &Path,
        tools: Vec<(RegisteredSkill, validators::Compiled)>,
        generation: Option<u64>,
    ) -> Self {
        let mut skills: BTreeMap<String, Arc<Skill>> = self
            .skills
            .iter()
            .filter(|(_, s)| !Self::is_tool_of(s, manifest))
            .map(|(n, s)| (n.clone(), Arc::clone(s)))
            .collect();
        for (registered, validator) in tools {
            let validators = Arc::new(ValidatorCache::new(1));
            validators.insert(0, validator);
            let name = registered.name().to_owned();
            skills.insert(name, Arc::new(Skill { registered, slot: 0, validators }));
        }
        let mut mcp = self.mcp.clone();
        if let Some(p) = mcp.get_mut(manifest) {
            p.listed = true;
            p.generation = generation;
        }
        let aliases = Self::aliases_of(&skills);
        Self { skills, aliases, skipped: self.skipped, mcp }
    }

    /// The skill named `name`; or the MCP server's tool whose alias it is
    /// (`PACK_TOOL` for `PACK.TOOL`, [`policy::mcp::tool_function_name`]):
    /// the spelling the function formats of `/v1/tools` list, since LLM
    /// tool APIs refuse a dot in a name. A tool whose alias is another
    /// skill's name or alias is never registered, so each spelling names one
    /// skill at most.
    pub fn get(&self, name: &str) -> Option<&Arc<Skill>> {
        if let Some(skill) = self.skills.get(name) {
            return Some(skill);
        }
        self.skills.get(self.aliases.get(name)?)
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

/// The current snapshot, replaced as a whole on reload, and its
/// generation.
#[derive(Debug)]
pub struct Registry {
    current: RwLock<Arc<Snapshot>>,
    /// Moves at each [`Registry::replace`]: what `GET /v1/registry` waits
    /// on. It starts from the daemon's start time in milliseconds (a JSON
    /// number any client reads exactly), so that a restarted daemon's
    /// generations differ from those a client saw.
    generation: tokio::sync::watch::Sender<u64>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new(Snapshot::default())
    }
}

impl Registry {
    /// A registry holding `snapshot`.
    pub fn new(snapshot: Snapshot) -> Self {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let first = now.map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            current: RwLock::new(Arc::new(snapshot)),
            generation: tokio::sync::watch::Sender::new(first),
        }
    }

    /// The generation of the current snapshot.
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// A receiver told of each move of the generation.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The current snapshot.
    pub fn current(&self) -> Arc<Snapshot> {
        // The lock only guards an Arc swap; a panic while holding it cannot
        // leave the Arc half-written, so a poisoned lock is still usable.
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replaces the snapshot, moving the generation; readers holding the
    /// old one keep it.
    pub fn replace(&self, snapshot: Snapshot) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use policy::{Manifest, ValidateOptions};
    use serde_json::json;

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
        let skills: Vec<RegisteredSkill> = (0..5)
            .map(|i| skill(&format!("s{i}"), r#"{"type":"object","required":["a"]}"#))
            .collect();
        // As the scan leaves them: every schema compiled in order, the
        // last ones held.
        let validators = Arc::new(ValidatorCache::new(2));
        for (slot, s) in skills.iter().enumerate() {
            validators.insert(slot, validators::compile(s.manifest().schema()).unwrap());
        }
        let snap = Snapshot::build(ScanReport { skills, validators, ..ScanReport::default() });
        assert_eq!(snap.registered(), 5);
        let s0 = snap.get("s0").unwrap();
        assert!(!s0.validators.contains(s0.slot), "dropped: only the last 2 are held");
        assert!(snap.get("s4").unwrap().validators.contains(4));
        assert_eq!(s0.check_args(&json!({"a": 1})), Ok(()));
        assert!(s0.check_args(&json!({})).is_err());
        assert!(s0.validators.contains(s0.slot));
        assert_eq!(s0.validators.len(), 2);
    }

    #[test]
    fn a_schema_that_does_not_compile_leaves_its_name_to_the_next_manifest() {
        use std::fs;
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let pack = |dir: &str, schema: &str| {
            let dir = root.join(dir);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("run"), "#!/bin/sh\n").unwrap();
            fs::set_permissions(dir.join("run"), fs::Permissions::from_mode(0o755)).unwrap();
            let text =
                format!(r#"{{"name":"same","description":"d","entry":"run","schema":{schema}}}"#);
            fs::write(dir.join("skill.json"), text).unwrap();
            dir.join("skill.json")
        };
        pack("a", r#"{"properties":{"a":{"pattern":"("}}}"#);
        let good = pack("b", r#"{"type":"object","required":["n"]}"#);
        let report = crate::scan::Scanner::default().scan(&[&root]);
        let lines: Vec<String> = report.events.iter().map(ToString::to_string).collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("skill loader: build \"same\": schema in "), "{lines:?}");
        assert!(lines[1].starts_with("skill loader: registered subprocess skill \"same\""));
        let snap = Snapshot::build(report);
        assert_eq!((snap.registered(), snap.skipped()), (1, 1));
        let s = snap.get("same").unwrap();
        assert_eq!(s.registered().manifest_path(), good);
        // The scan's compiled validator is the one the registry uses.
        assert!(s.validators.contains(s.slot));
        assert!(s.check_args(&json!({})).is_err());
        assert_eq!(s.check_args(&json!({"n": 1})), Ok(()));
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
        let snap = Snapshot::build(ScanReport {
            skills: vec![skill("a", r#"{"type":"object"}"#)],
            events: vec![],
            ..ScanReport::default()
        });
        let reg = Registry::new(snap);
        let old = reg.current();
        let held = old.get("a").unwrap().clone();
        let (first, told) = (reg.generation(), reg.subscribe());
        reg.replace(Snapshot::default());
        assert_ne!(reg.generation(), first, "a replace moves the generation");
        assert!(told.has_changed().unwrap(), "and tells who waits on it");
        assert_eq!(reg.current().registered(), 0);
        assert_eq!(held.name(), "a");
        assert_eq!(old.registered(), 1);
    }

    /// What a server's `tools/list` gives for `names` (open schemas).
    fn listed(names: &[&str]) -> Vec<policy::wire::McpToolInfo> {
        names
            .iter()
            .map(|t| policy::wire::McpToolInfo {
                name: (*t).to_owned(),
                skill: String::new(),
                description: String::new(),
                input_schema: json!({"type": "object"}),
                class: policy::SkillClass::Safe,
            })
            .collect()
    }

    /// A snapshot with the MCP server pack `srv` listing `tools` (and the
    /// one-shot skill `srv_x`, whose name a pack's tool then cannot take).
    fn with_mcp_pack(tools: &[&str]) -> Snapshot {
        let m = Manifest::from_slice(
            br#"{"kind":"mcp","name":"srv","description":"d","entry":"server"}"#,
            &ValidateOptions::default(),
        )
        .unwrap();
        let pack = RegisteredSkill::new(
            m,
            PathBuf::from("/s/srv/server"),
            PathBuf::from("/s/srv/skill.json"),
            PathBuf::from("/s"),
        );
        let listed = listed(tools);
        let mut report = ScanReport {
            skills: vec![skill("srv_x", r#"{"type":"object"}"#)],
            mcp_packs: vec![pack],
            ..ScanReport::default()
        };
        crate::scan::mcp::add_tools(&mut report, 0, Ok(listed), &ValidateOptions::default());
        report.mcp_generations.insert(PathBuf::from("/s/srv/skill.json"), Some(7));
        Snapshot::build(report)
    }

    #[test]
    fn an_mcp_tool_is_found_by_pack_dot_tool_and_by_its_alias() {
        let snap = with_mcp_pack(&["get-Time", "x", "get_time", "GET-TIME"]);
        assert_eq!(
            snap.registered(),
            2,
            "srv.x's alias is the skill srv_x; srv.get_time and srv.GET-TIME share srv.get-Time's"
        );
        let by_name = snap.get("srv.get-Time").expect("the canonical name");
        assert_eq!(by_name.name(), "srv.get-Time");
        let found = snap.get("srv_get_time").expect("the alias");
        assert!(Arc::ptr_eq(found, by_name));
        assert_eq!(snap.get("srv_x").unwrap().registered().source(), "skill.json");
        // Neither the left-out tools nor other spellings name anything.
        for unknown in ["srv.x", "srv.get_time", "srv.GET-TIME", "srv.", "srv.nope", "srv_nope"] {
            assert!(snap.get(unknown).is_none(), "{unknown}");
        }
        assert_eq!(snap.mcp_pack(Path::new("/s/srv/skill.json")).unwrap().generation, Some(7));
    }

    #[test]
    fn a_relisted_tool_whose_alias_is_another_skills_name_is_left_out() {
        let snap = with_mcp_pack(&["a"]);
        let manifest = Path::new("/s/srv/skill.json");
        let pack = snap.mcp_pack(manifest).unwrap().pack.clone();
        let taken = |n: &str| snap.taken_by_other(n, manifest);
        let listed = listed(&["a", "x", "A"]);
        let (tools, events) =
            crate::scan::mcp::pack_skills(&pack, &listed, &ValidateOptions::default(), taken);
        let names: Vec<&str> = tools.iter().map(|(s, _)| s.name()).collect();
        assert_eq!(names, ["srv.a"], "its own tool srv.a is being replaced: not a collision");
        let lines: Vec<String> = events.iter().map(ToString::to_string).collect();
        assert!(lines[1].contains("skill \"srv.x\" already registered"), "{lines:?}");
        assert!(lines[2].contains("skill \"srv.A\" already registered"), "{lines:?}");
    }

    #[test]
    fn a_packs_tools_are_replaced_and_every_other_skill_is_shared() {
        let snap = with_mcp_pack(&["a", "b"]);
        let manifest = Path::new("/s/srv/skill.json");
        let pack = snap.mcp_pack(manifest).unwrap().pack.clone();
        let listed = listed(&["b", "c"]);
        let taken = |n: &str| snap.taken_by_other(n, manifest);
        let (tools, _) =
            crate::scan::mcp::pack_skills(&pack, &listed, &ValidateOptions::default(), taken);
        let next = snap.with_pack_tools(manifest, tools, Some(8));
        let names: Vec<&str> = next.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["srv.b", "srv.c", "srv_x"]);
        assert!(Arc::ptr_eq(next.get("srv_x").unwrap(), snap.get("srv_x").unwrap()));
        assert_eq!(next.mcp_pack(manifest).unwrap().generation, Some(8));
        assert_eq!(next.get("srv.c").unwrap().check_args(&json!({})), Ok(()));
        assert!(Arc::ptr_eq(next.get("srv_c").unwrap(), next.get("srv.c").unwrap()));
        assert!(
            next.get("srv_a").is_none() && next.get("srv.a").is_none(),
            "gone in both spellings"
        );
    }
}
