//! A skill the scan registered: its validated manifest plus where it lives.

use std::path::{Path, PathBuf};

use policy::{Manifest, ManifestDigest, SkillName};
use serde_json::{json, Value};

/// A registered subprocess skill. Every path is canonical.
#[derive(Debug, Clone, PartialEq)]
pub struct RegisteredSkill {
    manifest: Manifest,
    entry: PathBuf,
    manifest_path: PathBuf,
    root: PathBuf,
    tool: Option<String>,
    /// For an MCP server's tool: its name, `PACK.TOOL`
    /// ([`policy::mcp::tool_name`]); its manifest carries the alias
    /// `PACK_TOOL` as a skill name.
    mcp: Option<String>,
    /// The digest of the manifest file's bytes the scan read, which runs
    /// carry to the executor (`None`: a skill made by hand, not checked).
    digest: Option<ManifestDigest>,
}

impl RegisteredSkill {
    /// Bundles a manifest with its resolved entry, its file and its root.
    pub fn new(
        manifest: Manifest,
        mut entry: PathBuf,
        mut manifest_path: PathBuf,
        mut root: PathBuf,
    ) -> Self {
        // A registry holds 10,000 of these: no spare capacity from the walk.
        entry.shrink_to_fit();
        manifest_path.shrink_to_fit();
        root.shrink_to_fit();
        Self { manifest, entry, manifest_path, root, tool: None, mcp: None, digest: None }
    }

    /// The same skill, read from a manifest file whose bytes have `digest`.
    #[must_use]
    pub fn with_digest(mut self, digest: ManifestDigest) -> Self {
        self.digest = Some(digest);
        self
    }

    /// The digest of the manifest file's bytes the scan read (for an MCP
    /// server's tool: its pack's).
    pub fn digest(&self) -> Option<&ManifestDigest> {
        self.digest.as_ref()
    }

    /// The same skill, as the tool `tool` (its name as written) of the
    /// `SKILL.md` at [`RegisteredSkill::manifest_path`].
    #[must_use]
    pub fn with_tool(mut self, tool: impl Into<String>) -> Self {
        self.tool = Some(tool.into());
        self
    }

    /// The same skill, as the tool `tool` (its name as the server lists it)
    /// of the MCP server pack at [`RegisteredSkill::manifest_path`],
    /// registered as `name` (`PACK.TOOL`).
    #[must_use]
    pub fn with_mcp_tool(mut self, tool: impl Into<String>, name: impl Into<String>) -> Self {
        self.tool = Some(tool.into());
        self.mcp = Some(name.into());
        self
    }

    /// For a SKILL.md skill or an MCP server's tool: the tool's name as
    /// written (what the executor is asked to run); `None` for a
    /// `skill.json`.
    pub fn tool(&self) -> Option<&str> {
        self.tool.as_deref()
    }

    /// Where the skill was declared: `"skill.json"`, `"skill.md"` or
    /// `"mcp"` (a tool an MCP server pack's server listed).
    pub fn source(&self) -> &'static str {
        if self.mcp.is_some() {
            "mcp"
        } else if self.tool.is_some() {
            "skill.md"
        } else {
            "skill.json"
        }
    }

    /// The skill's name: its manifest's, or for an MCP server's tool
    /// `PACK.TOOL`.
    pub fn name(&self) -> &str {
        self.mcp.as_deref().unwrap_or(self.manifest.name().as_str())
    }

    /// The skill's name in the function formats of LLM tool APIs, which
    /// refuse a dot: its manifest's name (for an MCP server's tool
    /// `PACK_TOOL`, [`policy::mcp::tool_function_name`], which skilld also
    /// accepts as the tool's name).
    pub fn function_name(&self) -> &SkillName {
        self.manifest.name()
    }
    /// The validated manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }
    /// The canonical executable.
    pub fn entry(&self) -> &Path {
        &self.entry
    }
    /// The `skill.json` the skill was loaded from.
    pub fn manifest_path(&self) -> &Path {
        &self.manifest_path
    }
    /// The canonical allow-list root the manifest was found under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The skill as `ongrid-skill scan --json` prints it: `name`,
    /// `description`, `class`, `category`, `schema`, `timeout_seconds`,
    /// `env_allow`, `entry`, `manifest`, `root` and `source` (plus `tool`
    /// for a SKILL.md skill).
    pub fn to_json(&self) -> Value {
        let mut v = self.manifest_json();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("entry".into(), json!(self.entry.to_string_lossy()));
            obj.insert("manifest".into(), json!(self.manifest_path.to_string_lossy()));
            obj.insert("root".into(), json!(self.root.to_string_lossy()));
            obj.insert("source".into(), json!(self.source()));
            if let Some(tool) = &self.tool {
                obj.insert("tool".into(), json!(tool));
            }
        }
        v
    }

    /// The skill as the daemon's client API lists it: `name`,
    /// `description`, `class`, `category`, `schema`, `timeout_seconds`,
    /// `env_allow` and `source`.
    pub fn to_api_json(&self) -> Value {
        let mut v = self.manifest_json();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("source".into(), json!(self.source()));
        }
        v
    }

    /// What both listings take from the manifest.
    fn manifest_json(&self) -> Value {
        let m = &self.manifest;
        json!({
            "name": self.name(),
            "description": m.description(),
            "class": m.class(),
            "category": m.category(),
            "schema": m.schema(),
            "timeout_seconds": m.timeout().as_secs(),
            "env_allow": m.env_allow(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::ValidateOptions;

    #[test]
    fn json_has_every_documented_field() {
        let m = Manifest::from_slice(
            br#"{"name":"disk_usage","description":"Disk usage","entry":"run",
                 "class":"mutating","env_allow":["PATH"],"timeout_seconds":5}"#,
            &ValidateOptions::default(),
        )
        .unwrap();
        let skill = RegisteredSkill::new(
            m,
            PathBuf::from("/s/d/run"),
            PathBuf::from("/s/d/skill.json"),
            PathBuf::from("/s"),
        );
        let want = json!({
            "name": "disk_usage",
            "description": "Disk usage",
            "class": "mutating",
            "category": "external",
            "schema": {"type": "object", "properties": {}},
            "timeout_seconds": 5,
            "env_allow": ["PATH"],
            "entry": "/s/d/run",
            "manifest": "/s/d/skill.json",
            "root": "/s",
            "source": "skill.json",
        });
        assert_eq!(skill.to_json(), want);
        assert_eq!(skill.name(), "disk_usage");
    }
}
