//! `SKILL.md`: a skill described by YAML frontmatter (the agent-ecosystem
//! format), parsed and validated into one [`Manifest`] per tool.
//!
//! ```text
//! ---
//! name: probe                       # [a-z0-9_-]+; '-' becomes '_' in tool names
//! description: Network probes       # required
//! when_to_use: When a service seems down
//! activation: [network, probe]      # string, list of strings or mapping; kept, not interpreted
//! metadata:
//!   os: [linux]                     # string or list; must include "linux"
//!   requires:
//!     bins: [python3]               # names looked up on the loader's PATH (or absolute paths)
//!     config: [/etc/probe.conf]     # files that must exist (absolute, or relative to the folder)
//!     env: [PROBE_TOKEN]            # variables that must be set in the loader's environment
//! tools:
//!   - name: tcp                     # [a-z0-9_-]+
//!     impl: bin/tcp.py              # the executable, like skill.json's `entry`
//!     class: safe                   # safe (default) | mutating | dangerous
//!     description: Connect to host:port   # default: the skill's description
//!     schema: {type: object, properties: {...}}   # as in skill.json (optional)
//!     timeout_seconds: 10           # as in skill.json (optional)
//!     env_allow: []                 # as in skill.json (optional)
//!     category: network             # as in skill.json (optional)
//!     sandbox: {network: true}      # as in skill.json (optional)
//! ---
//! Markdown instructions for the agent (not read here).
//! ```
//!
//! Each tool is registered as its own skill named [`tool_skill_name`]:
//! `<skill>_<tool>`, or just `<skill>` when the tool has the skill's name,
//! with `-` mapped to `_`. Unknown keys are errors at every level (a
//! mistyped requirement must not pass unnoticed), except the top-level keys
//! other SKILL.md producers write that mean nothing here
//! ([`IGNORED_TOP_LEVEL_KEYS`]). The YAML itself is read by [`crate::yaml`]:
//! no anchors, aliases or tags, bounded depth, nodes and size.
//!
//! Pure: the loader reads the file (bounded) and checks the requirements;
//! the executor reads the file again and derives the same manifest.

use serde_json::{json, Map, Value};

use crate::env::EnvName;
use crate::manifest::{Manifest, ManifestError, ValidateOptions, MAX_MANIFEST_BYTES};
use crate::name::SkillName;
use crate::yaml::{self, YamlError};

/// Most tools one SKILL.md may declare.
pub const MAX_TOOLS: usize = 64;

/// Top-level keys other producers write; accepted and ignored.
pub const IGNORED_TOP_LEVEL_KEYS: &[&str] = &["license", "version", "homepage", "allowed-tools"];

const TOP_LEVEL_KEYS: &[&str] =
    &["name", "description", "when_to_use", "activation", "metadata", "tools"];
const METADATA_KEYS: &[&str] = &["os", "requires"];
const REQUIRES_KEYS: &[&str] = &["bins", "config", "env"];
const TOOL_KEYS: &[&str] = &[
    "name",
    "impl",
    "class",
    "description",
    "schema",
    "timeout_seconds",
    "env_allow",
    "category",
    "sandbox",
];

/// Why a SKILL.md is refused. Its `Display` is the `ERROR` of
/// `skill loader: parse PATH: ERROR`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SkillMdError {
    /// More than [`MAX_MANIFEST_BYTES`].
    #[error("SKILL.md is {size} bytes, larger than the {max} byte limit", max = MAX_MANIFEST_BYTES)]
    TooLarge {
        /// Size in bytes.
        size: u64,
    },
    /// Not UTF-8.
    #[error("SKILL.md is not UTF-8")]
    NotUtf8,
    /// The first line is not `---`.
    #[error("SKILL.md must start with a `---` line opening the YAML frontmatter")]
    NoFrontmatter,
    /// No closing `---` line within [`yaml::MAX_YAML_BYTES`].
    #[error("frontmatter is not closed by a `---` line within {max} bytes", max = yaml::MAX_YAML_BYTES)]
    Unterminated,
    /// The YAML is refused.
    #[error("frontmatter: {0}")]
    Yaml(#[from] YamlError),
    /// The frontmatter is not a mapping.
    #[error("frontmatter must be a YAML mapping")]
    NotAMapping,
    /// A key outside the format.
    #[error("unknown key \"{0}\"")]
    UnknownKey(String),
    /// A required key is absent.
    #[error("missing required key \"{0}\"")]
    Missing(String),
    /// A key has the wrong type or a bad value.
    #[error("key \"{field}\": {reason}")]
    Invalid {
        /// Key path, e.g. `metadata.requires.bins[0]`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// Two tools with the same name, or one tool's name as written the
    /// other's registered name (a lookup by either would be ambiguous).
    #[error("tool \"{0}\" declared twice (as written, or as another tool registers it)")]
    DuplicateTool(String),
    /// A tool does not make a valid manifest.
    #[error("tool \"{tool}\": {source}")]
    Tool {
        /// The tool's name.
        tool: String,
        /// Why its manifest is invalid.
        #[source]
        source: ManifestError,
    },
    /// The executor was asked for a tool the file does not declare.
    #[error("no tool named {0:?} in SKILL.md")]
    NoSuchTool(String),
}

fn invalid(field: &str, reason: impl Into<String>) -> SkillMdError {
    SkillMdError::Invalid { field: field.to_owned(), reason: reason.into() }
}

/// What a skill needs from the host before it is registered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements {
    /// Operating systems it runs on (`metadata.os`); empty = any.
    pub os: Vec<String>,
    /// Programs that must be found (`metadata.requires.bins`).
    pub bins: Vec<String>,
    /// Files that must exist (`metadata.requires.config`).
    pub config: Vec<String>,
    /// Environment variables that must be set (`metadata.requires.env`).
    pub env: Vec<EnvName>,
}

/// One tool: its name as written and the manifest it registers as.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillTool {
    name: String,
    manifest: Manifest,
}

impl SkillTool {
    /// The tool's name as written in the SKILL.md.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The manifest the tool registers as (name from [`tool_skill_name`],
    /// entry = `impl`).
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }
}

/// A validated SKILL.md.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillMd {
    name: String,
    description: String,
    when_to_use: Option<String>,
    activation: Option<Value>,
    requirements: Requirements,
    tools: Vec<SkillTool>,
    ignored_keys: Vec<String>,
}

/// The registered skill name of `tool` in the SKILL.md named `skill`:
/// `<skill>_<tool>`, or `<skill>` when both are the same, with `-` mapped
/// to `_`.
///
/// # Errors
///
/// The result is not a valid [`SkillName`] (too long).
pub fn tool_skill_name(skill: &str, tool: &str) -> Result<SkillName, crate::name::NameError> {
    let joined = if skill == tool { skill.to_owned() } else { format!("{skill}_{tool}") };
    SkillName::new(&joined.replace('-', "_"))
}

/// Cuts the YAML frontmatter out of a SKILL.md text.
///
/// # Errors
///
/// [`SkillMdError::NoFrontmatter`] or [`SkillMdError::Unterminated`].
pub fn frontmatter(text: &str) -> Result<&str, SkillMdError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err(SkillMdError::NoFrontmatter);
    }
    let start = first.len();
    let mut at = start;
    for line in lines {
        if line.trim_end() == "---" {
            return Ok(&text[start..at]);
        }
        at += line.len();
        if at - start > yaml::MAX_YAML_BYTES {
            break;
        }
    }
    Err(SkillMdError::Unterminated)
}

fn string(v: &Value, field: &str) -> Result<String, SkillMdError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        _ => Err(invalid(field, "expected a string")),
    }
}

/// A string or a list of strings.
fn strings(v: &Value, field: &str) -> Result<Vec<String>, SkillMdError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| string(item, &format!("{field}[{i}]")))
            .collect(),
        _ => Err(invalid(field, "expected a string or a list of strings")),
    }
}

fn mapping<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, SkillMdError> {
    v.as_object().ok_or_else(|| invalid(field, "expected a mapping"))
}

fn only_keys(map: &Map<String, Value>, known: &[&str], prefix: &str) -> Result<(), SkillMdError> {
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(SkillMdError::UnknownKey(format!("{prefix}{k}"))),
        None => Ok(()),
    }
}

/// `[a-z0-9_-]+`, at most 64 bytes.
fn check_name(s: &str, field: &str) -> Result<(), SkillMdError> {
    let ok = !s.is_empty()
        && s.len() <= SkillName::MAX_LEN
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(invalid(field, format!("{s:?} must match [a-z0-9_-]+ (at most 64 bytes)")))
    }
}

/// A list entry: no NUL, not empty, bounded.
fn check_item(s: &str, field: &str) -> Result<(), SkillMdError> {
    if s.is_empty() || s.len() > 4096 || s.contains('\0') {
        return Err(invalid(field, "must be 1 to 4096 bytes without NUL"));
    }
    Ok(())
}

impl SkillMd {
    /// Parses and validates a whole SKILL.md file.
    ///
    /// # Errors
    ///
    /// [`SkillMdError`] naming the first problem.
    pub fn from_slice(bytes: &[u8], opts: &ValidateOptions) -> Result<Self, SkillMdError> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(SkillMdError::TooLarge { size: bytes.len() as u64 });
        }
        let text = std::str::from_utf8(bytes).map_err(|_| SkillMdError::NotUtf8)?;
        let value = yaml::to_json(frontmatter(text)?)?;
        Self::from_value(&value, opts)
    }

    /// Validates frontmatter already converted to JSON.
    ///
    /// # Errors
    ///
    /// [`SkillMdError`] naming the first problem.
    pub fn from_value(value: &Value, opts: &ValidateOptions) -> Result<Self, SkillMdError> {
        let Value::Object(top) = value else { return Err(SkillMdError::NotAMapping) };
        let mut ignored_keys = Vec::new();
        for k in top.keys() {
            if IGNORED_TOP_LEVEL_KEYS.contains(&k.as_str()) {
                ignored_keys.push(k.clone());
            } else if !TOP_LEVEL_KEYS.contains(&k.as_str()) {
                return Err(SkillMdError::UnknownKey(k.clone()));
            }
        }
        let get = |k: &str| top.get(k).filter(|v| !v.is_null());
        let name =
            string(get("name").ok_or_else(|| SkillMdError::Missing("name".into()))?, "name")?;
        check_name(&name, "name")?;
        let description = string(
            get("description").ok_or_else(|| SkillMdError::Missing("description".into()))?,
            "description",
        )?;
        if description.trim().is_empty() {
            return Err(invalid("description", "must not be empty"));
        }
        let when_to_use = get("when_to_use").map(|v| string(v, "when_to_use")).transpose()?;
        let activation = match get("activation") {
            None => None,
            Some(v @ (Value::String(_) | Value::Object(_))) => Some(v.clone()),
            Some(v @ Value::Array(_)) => {
                strings(v, "activation")?;
                Some(v.clone())
            }
            Some(_) => return Err(invalid("activation", "expected a string, a list or a mapping")),
        };
        let requirements = match get("metadata") {
            None => Requirements::default(),
            Some(m) => requirements(mapping(m, "metadata")?)?,
        };
        let tools = match get("tools") {
            None => Vec::new(),
            Some(Value::Array(items)) => {
                if items.len() > MAX_TOOLS {
                    return Err(invalid("tools", format!("at most {MAX_TOOLS} tools")));
                }
                let mut tools: Vec<SkillTool> = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let t = tool(&name, &description, item, i, opts)?;
                    let registered = |x: &SkillTool| x.manifest.name().as_str().to_owned();
                    let clash = |o: &SkillTool| {
                        registered(o) == registered(&t)
                            || o.name == registered(&t)
                            || t.name == registered(o)
                    };
                    if tools.iter().any(clash) {
                        return Err(SkillMdError::DuplicateTool(t.name));
                    }
                    tools.push(t);
                }
                tools
            }
            Some(_) => return Err(invalid("tools", "expected a list")),
        };
        Ok(Self { name, description, when_to_use, activation, requirements, tools, ignored_keys })
    }

    /// The skill's name as written.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The skill's description.
    pub fn description(&self) -> &str {
        &self.description
    }
    /// `when_to_use`, if given.
    pub fn when_to_use(&self) -> Option<&str> {
        self.when_to_use.as_deref()
    }
    /// `activation`, as written (not interpreted).
    pub fn activation(&self) -> Option<&Value> {
        self.activation.as_ref()
    }
    /// What the host must provide.
    pub fn requirements(&self) -> &Requirements {
        &self.requirements
    }
    /// The tools, in file order.
    pub fn tools(&self) -> &[SkillTool] {
        &self.tools
    }
    /// Top-level keys present from [`IGNORED_TOP_LEVEL_KEYS`].
    pub fn ignored_keys(&self) -> &[String] {
        &self.ignored_keys
    }

    /// The tool registered under the skill name `registered`, or written
    /// as `registered`: what the executor looks up for an `execute` with
    /// a `tool`.
    ///
    /// # Errors
    ///
    /// [`SkillMdError::NoSuchTool`].
    pub fn tool(&self, name: &str) -> Result<&SkillTool, SkillMdError> {
        self.tools
            .iter()
            .find(|t| t.name == name || t.manifest.name().as_str() == name)
            .ok_or_else(|| SkillMdError::NoSuchTool(name.chars().take(64).collect()))
    }
}

fn requirements(meta: &Map<String, Value>) -> Result<Requirements, SkillMdError> {
    only_keys(meta, METADATA_KEYS, "metadata.")?;
    let mut req = Requirements::default();
    if let Some(os) = meta.get("os") {
        req.os = strings(os, "metadata.os")?;
        for (i, o) in req.os.iter().enumerate() {
            check_item(o, &format!("metadata.os[{i}]"))?;
        }
    }
    let Some(requires) = meta.get("requires").filter(|v| !v.is_null()) else { return Ok(req) };
    let requires = mapping(requires, "metadata.requires")?;
    only_keys(requires, REQUIRES_KEYS, "metadata.requires.")?;
    let list = |key: &str| -> Result<Vec<String>, SkillMdError> {
        let field = format!("metadata.requires.{key}");
        let items = requires.get(key).map(|v| strings(v, &field)).transpose()?.unwrap_or_default();
        for (i, item) in items.iter().enumerate() {
            check_item(item, &format!("{field}[{i}]"))?;
        }
        Ok(items)
    };
    req.bins = list("bins")?;
    for (i, b) in req.bins.iter().enumerate() {
        if b.contains('/') && !b.starts_with('/') {
            return Err(invalid(
                &format!("metadata.requires.bins[{i}]"),
                "a program name or an absolute path",
            ));
        }
    }
    req.config = list("config")?;
    for (i, e) in list("env")?.iter().enumerate() {
        let n = EnvName::new(e)
            .map_err(|err| invalid(&format!("metadata.requires.env[{i}]"), err.to_string()))?;
        req.env.push(n);
    }
    Ok(req)
}

fn tool(
    skill: &str,
    skill_description: &str,
    item: &Value,
    i: usize,
    opts: &ValidateOptions,
) -> Result<SkillTool, SkillMdError> {
    let field = format!("tools[{i}]");
    let t = mapping(item, &field)?;
    only_keys(t, TOOL_KEYS, &format!("{field}."))?;
    let name_field = format!("{field}.name");
    let name = string(
        t.get("name").ok_or_else(|| SkillMdError::Missing(name_field.clone()))?,
        &name_field,
    )?;
    check_name(&name, &name_field)?;
    let registered =
        tool_skill_name(skill, &name).map_err(|e| invalid(&name_field, e.to_string()))?;
    if !t.contains_key("impl") {
        return Err(SkillMdError::Missing(format!("{field}.impl")));
    }
    // The manifest a skill.json would hold: same validation, same rules.
    let mut m = Map::new();
    m.insert("name".into(), json!(registered));
    m.insert("description".into(), json!(skill_description));
    for (key, v) in t {
        match key.as_str() {
            "name" => {}
            "impl" => {
                m.insert("entry".into(), v.clone());
            }
            _ => {
                m.insert(key.clone(), v.clone());
            }
        }
    }
    let manifest = Manifest::from_value(Value::Object(m), opts)
        .map_err(|source| SkillMdError::Tool { tool: name.clone(), source })?;
    Ok(SkillTool { name, manifest })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROBE: &str = "---\nname: net-probe\ndescription: Network probes\nwhen_to_use: a service is down\nactivation: [network]\nlicense: MIT\nmetadata:\n  os: linux\n  requires:\n    bins: [python3]\n    config: [/etc/hosts]\n    env: [HOME]\ntools:\n  - name: tcp\n    impl: tcp.py\n    class: safe\n    description: Connect\n    schema:\n      type: object\n      properties:\n        port: {type: integer, minimum: 1, maximum: 65535}\n      required: [port]\n    sandbox: {network: true}\n  - name: net-probe\n    impl: probe.sh\n---\n# Probe\nbody\n";

    #[test]
    fn parses_a_full_skill() {
        let s = SkillMd::from_slice(PROBE.as_bytes(), &ValidateOptions::default()).unwrap();
        assert_eq!(s.name(), "net-probe");
        assert_eq!(s.when_to_use(), Some("a service is down"));
        assert_eq!(s.activation(), Some(&json!(["network"])));
        assert_eq!(s.ignored_keys(), ["license"]);
        let r = s.requirements();
        assert_eq!((r.os.clone(), r.bins.clone()), (vec!["linux".into()], vec!["python3".into()]));
        assert_eq!(r.env[0].as_str(), "HOME");
        let tcp = s.tool("tcp").unwrap();
        assert_eq!(tcp.manifest().name().as_str(), "net_probe_tcp");
        assert_eq!(tcp.manifest().entry(), "tcp.py");
        assert_eq!(tcp.manifest().description(), "Connect");
        assert!(tcp.manifest().sandbox().network);
        assert_eq!(tcp.manifest().schema().to_value()["properties"]["port"]["maximum"], 65535);
        let same = s.tool("net_probe").unwrap();
        assert_eq!(same.manifest().name().as_str(), "net_probe");
        assert_eq!(same.manifest().description(), "Network probes");
        assert!(matches!(s.tool("udp"), Err(SkillMdError::NoSuchTool(_))));
    }

    #[test]
    fn refuses_bad_frontmatter() {
        let opts = ValidateOptions::default();
        let cases: &[(&str, &str)] = &[
            ("no frontmatter\n", "must start with"),
            ("---\nname: a\n", "not closed"),
            ("---\n- a\n---\n", "must be a YAML mapping"),
            ("---\nname: a\ndescription: d\ncolour: red\n---\n", "unknown key \"colour\""),
            ("---\nname: a\ndescription: d\nmetadata: {requires: {pkgs: [x]}}\n---\n", "unknown key \"metadata.requires.pkgs\""),
            ("---\nname: a\ndescription: d\ntools: [{name: t, impl: x, shell: y}]\n---\n", "unknown key \"tools[0].shell\""),
            ("---\nname: a\ndescription: d\ntools: [{name: t}]\n---\n", "missing required key \"tools[0].impl\""),
            ("---\nname: A\ndescription: d\n---\n", "must match"),
            ("---\ndescription: d\n---\n", "missing required key \"name\""),
            ("---\nname: a\ndescription: d\ntools: [{name: t, impl: x, class: root}]\n---\n", "tool \"t\": field \"class\""),
            ("---\nname: a\ndescription: d\ntools: [{name: t, impl: x}, {name: t, impl: y}]\n---\n", "declared twice"),
            // `b` registers as `a_b`, which the second tool is written as.
            ("---\nname: a\ndescription: d\ntools: [{name: b, impl: x}, {name: a_b, impl: y}]\n---\n", "tool \"a_b\" declared twice"),
            ("---\nname: a\ndescription: d\ntools: [{name: a_b, impl: y}, {name: b, impl: x}]\n---\n", "tool \"b\" declared twice"),
            ("---\nname: a\ndescription: &d d\nwhen_to_use: *d\n---\n", "anchors and aliases"),
            ("---\nname: a\ndescription: [unclosed\n---\n", "invalid YAML"),
        ];
        for (text, want) in cases {
            let err = SkillMd::from_slice(text.as_bytes(), &opts).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn names_of_tools() {
        assert_eq!(tool_skill_name("probe", "tcp").unwrap().as_str(), "probe_tcp");
        assert_eq!(tool_skill_name("tail-file", "tail-file").unwrap().as_str(), "tail_file");
        assert!(tool_skill_name(&"a".repeat(40), &"b".repeat(40)).is_err());
    }
}
