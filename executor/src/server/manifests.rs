//! The executor's own reading of the manifest named in an `execute`: under
//! one of its roots, valid, and of which class. Used before admission so
//! that a refused request never takes a run slot, and so that the class
//! check and the metrics' `skill` label come from what the executor read,
//! not from what the caller said.
//!
//! Parsed manifests are kept by the opened file's device, inode, size,
//! mtime and ctime ([`crate::run::parsed`]): a manifest that changes is read
//! again. The check hands the opened manifest, its root and the manifest
//! parsed from it on to the run ([`crate::run::plan::Located`]), whose plan
//! re-validates everything else (entry, ownership, grants, args) for the
//! run itself.

use std::path::{Path, PathBuf};

use policy::{ManifestDigest, Outcome, RunReport, SkillClass};

use crate::config::Config;
use crate::run::parsed::ParsedManifests;
use crate::run::plan::{Located, PlanError};

/// A manifest that passed the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The manifest's canonical path (what the engine is asked to run).
    pub path: PathBuf,
    /// The skill's name.
    pub name: String,
    /// The skill's class as the manifest declares it (for a tool of an
    /// MCP server pack: the pack's `tool_classes` entry, else its class).
    pub class: SkillClass,
    /// A tool of an MCP server pack: the call goes to the pack's server.
    pub mcp: bool,
}

/// See the module docs.
#[derive(Debug)]
pub struct ManifestCache {
    roots: Vec<PathBuf>,
    parsed: ParsedManifests,
}

impl ManifestCache {
    /// A cache checking against `config.roots` (an empty list refuses
    /// everything: `serve` runs with [`Config::for_serve`]).
    pub fn new(config: &Config) -> Self {
        ManifestCache { roots: config.roots.clone(), parsed: ParsedManifests::new(config) }
    }

    /// Checks the manifest at `path`.
    ///
    /// # Errors
    ///
    /// A `rejected` report (skill name empty) saying why.
    pub fn check(&self, path: &str) -> Result<(Checked, Located), Box<RunReport>> {
        self.check_tool(path, None, None)
    }

    /// Checks one `tool` of the `SKILL.md` at `path` (`None`: a
    /// `skill.json`), as [`crate::run::plan::parse_manifest`] reads it, and
    /// when the caller sent one, that the file's bytes have its `digest`
    /// (the caller's reading of the manifest is this one). Also returns the
    /// manifest opened and placed under its root, for the run
    /// (`Engine::run_source_then`): the file checked is the file run.
    ///
    /// # Errors
    ///
    /// A `rejected` report (skill name empty) saying why.
    pub fn check_tool(
        &self,
        path: &str,
        tool: Option<&str>,
        digest: Option<&ManifestDigest>,
    ) -> Result<(Checked, Located), Box<RunReport>> {
        let reject = |why: String| Box::new(RunReport::not_run("", Outcome::Rejected, why));
        // Bounded before anything keeps or repeats them: the cache keys on
        // the tool, and refusals quote the path.
        if path.len() > MAX_PATH_BYTES {
            return Err(reject(format!("manifest path over {MAX_PATH_BYTES} bytes")));
        }
        if tool.is_some_and(|t| t.len() > MAX_TOOL_BYTES) {
            return Err(reject(format!("tool name over {MAX_TOOL_BYTES} bytes")));
        }
        if !Path::new(path).is_absolute() {
            return Err(reject(format!("manifest {path:?}: not an absolute path")));
        }
        if self.roots.is_empty() {
            return Err(reject(format!("manifest {path}: no allow-list root is configured")));
        }
        // Both the open and the read name the path they failed on.
        let refused = |e: PlanError| reject(e.to_string());
        let located = Located::open(&self.roots, Path::new(path)).map_err(refused)?;
        let parsed = self.parsed.get(&located, tool).map_err(refused)?;
        if digest.is_some_and(|d| *d != parsed.digest) {
            return Err(reject(format!(
                "manifest {}: changed since the loader read it (its SHA-256 differs): \
                 the loader's registry is stale; reload it",
                located.path().display()
            )));
        }
        let manifest = parsed.manifest;
        let mut checked = Checked {
            path: located.path().to_owned(),
            name: manifest.name().to_string(),
            class: manifest.class(),
            mcp: false,
        };
        if let (Some(spec), Some(tool)) = (manifest.mcp(), tool) {
            let name = policy::mcp::tool_name(manifest.name().as_str(), tool)
                .map_err(|e| reject(format!("manifest {path}: tool {tool:?}: {e}")))?;
            checked = Checked {
                name,
                class: spec.class_of(tool, manifest.class()),
                mcp: true,
                ..checked
            };
        }
        Ok((checked, located.parsed_as(manifest)))
    }

    /// Manifests cached now.
    pub fn len(&self) -> usize {
        self.parsed.len()
    }

    /// Returns true if and only if nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.parsed.is_empty()
    }
}

/// The longest manifest path a request may name (the kernel's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

/// The longest tool name a request may name: an MCP tool's or a SKILL.md
/// tool's name is at most 64 bytes, its registered name twice that and a
/// separator.
pub const MAX_TOOL_BYTES: usize = 256;

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn write(dir: &Path, class: &str) -> PathBuf {
        let m = dir.join("skill.json");
        fs::write(&m, format!(r#"{{"name":"c","description":"d","entry":"x","class":"{class}"}}"#))
            .unwrap();
        m
    }

    #[test]
    fn roots_class_and_cache_by_file_identity() {
        let root = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let config = Config { roots: vec![root.path().to_owned()], ..Config::default() };
        let cache = ManifestCache::new(&config);
        fs::create_dir(root.path().join("a")).unwrap();
        let m = write(&root.path().join("a"), "mutating");
        let (c, located) = cache.check(m.to_str().unwrap()).unwrap();
        assert_eq!(located.path(), c.path);
        assert_eq!((c.name.as_str(), c.class), ("c", SkillClass::Mutating));
        assert_eq!(cache.len(), 1);
        // Rewritten (size or mtime or ctime change): read again.
        std::thread::sleep(std::time::Duration::from_millis(5));
        write(&root.path().join("a"), "safe");
        assert_eq!(cache.check(m.to_str().unwrap()).unwrap().0.class, SkillClass::Safe);

        for (path, needle) in [
            (write(other.path(), "safe"), "not under an allow-list root"),
            (root.path().join("missing/skill.json"), "cannot read"),
            (PathBuf::from("rel/skill.json"), "not an absolute path"),
        ] {
            let r = cache.check(path.to_str().unwrap()).unwrap_err();
            assert_eq!(r.outcome, Outcome::Rejected);
            assert!(r.error.as_deref().unwrap().contains(needle), "{r:?}");
        }
        fs::write(root.path().join("a/skill.json"), "{").unwrap();
        let r = cache.check(m.to_str().unwrap()).unwrap_err();
        assert_eq!(r.outcome, Outcome::Rejected);

        // The caller's digest: the same bytes pass, other bytes are refused.
        write(&root.path().join("a"), "safe");
        let path = m.to_str().unwrap();
        let read = ManifestDigest::of(&fs::read(&m).unwrap());
        assert_eq!(cache.check_tool(path, None, Some(&read)).unwrap().0.name, "c");
        let stale = ManifestDigest::of(b"what the loader read before");
        let r = cache.check_tool(path, None, Some(&stale)).unwrap_err();
        assert_eq!(r.outcome, Outcome::Rejected);
        assert!(r.error.as_deref().unwrap().contains("changed since the loader read it"), "{r:?}");

        let none = ManifestCache::new(&Config::default());
        assert!(none.check(m.to_str().unwrap()).is_err(), "no roots: nothing passes");
    }

    /// A peer's tool name or path past its bound is refused before the
    /// cache keeps it or a refusal repeats it.
    #[test]
    fn long_tool_names_and_paths_are_refused_unkept() {
        let root = tempfile::tempdir().unwrap();
        let config = Config { roots: vec![root.path().to_owned()], ..Config::default() };
        let cache = ManifestCache::new(&config);
        fs::create_dir(root.path().join("a")).unwrap();
        let m = write(&root.path().join("a"), "safe");
        let path = m.to_str().unwrap();
        for i in 0..4 {
            let tool = format!("{i}{}", "x".repeat(1 << 20));
            let r = cache.check_tool(path, Some(&tool), None).unwrap_err();
            assert_eq!(r.error.as_deref(), Some("tool name over 256 bytes"));
        }
        assert_eq!(cache.len(), 0, "nothing kept");
        let long = format!("/{}", "a".repeat(1 << 20));
        let r = cache.check_tool(&long, None, None).unwrap_err();
        assert_eq!(r.error.as_deref(), Some("manifest path over 4096 bytes"));
    }
}
