//! The scan: walks the allow-list roots and registers every valid skill.
//!
//! Every regular file named `SKILL.md` is read too ([`policy::skillmd`]):
//! its requirements are checked ([`crate::scan::requirements`]; an unmet one
//! skips the whole skill with a log line naming it) and each of its tools
//! is registered as its own skill, entry = the tool's `impl`, resolved
//! under the root like a `skill.json` entry. Every checked SKILL.md has a
//! [`RequirementReport`] (for `ongrid-skill check`).
//!
//! Walk rules: each root is resolved to its canonical
//! directory (a root that is a symlink is followed once, here), then walked
//! recursively in lexical order without following symlinks, so a symlink
//! loop under a root cannot make the walk recurse; a symlink to a
//! directory is an event (`skipping PATH: symlinked directory, not
//! followed`). Every regular file named
//! `skill.json` is a manifest; anything else with that name is skipped with
//! an event. Errors never stop the scan: each one becomes a [`ScanEvent`]
//! and the walk goes on. A valid manifest is then built ([`crate::scan::build`]:
//! its entry resolved, its schema compiled); one that fails is skipped and
//! does not take its name. The first manifest of a name that builds wins
//! (earlier root, then lexical order); later ones are skipped.
//!
//! The scan does file-system reads only; it never logs. The caller prints
//! or traces [`ScanReport::events`].

pub mod build;
pub mod entry;
pub mod event;
pub mod manifest_file;
pub mod mcp;
pub mod requirements;
pub mod roots;
pub mod skill;
pub mod validators;

use std::collections::{HashMap, HashSet};
use std::fs::FileType;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use policy::{Manifest, ManifestDigest, SkillName, ValidateOptions};
use walkdir::WalkDir;

use self::entry::EntryScope;
use self::event::{ScanEvent, WalkError};
use self::requirements::{Check, ProcessEnv};
use self::skill::RegisteredSkill;
use self::validators::ValidatorCache;
use build::Built;
use roots::RootError;

/// The file name of a manifest.
pub const MANIFEST_FILE_NAME: &str = "skill.json";
/// The file name of a SKILL.md skill.
pub use policy::SKILL_MD_FILE_NAME;

/// The requirement checks of one SKILL.md (every check, met or not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequirementReport {
    /// The skill's name as written.
    pub name: String,
    /// The SKILL.md.
    pub manifest: PathBuf,
    /// Every requirement in order (`os`, `bins`, `config`, `env`).
    pub checks: Vec<Check>,
}

impl RequirementReport {
    /// All met.
    pub fn met(&self) -> bool {
        self.checks.iter().all(|c| c.met)
    }
}

/// What to scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanTarget {
    /// An allow-list root, walked recursively.
    Root(PathBuf),
    /// A single manifest file; its folder is its root (used by `validate`).
    Manifest(PathBuf),
}

/// The result of a scan: the registered skills in registration order, and
/// every event in the order it happened.
#[derive(Debug, Default)]
pub struct ScanReport {
    /// Registered skills, at most one per name.
    pub skills: Vec<RegisteredSkill>,
    /// The compiled args validators of `skills`, keyed by their index
    /// there: every schema is compiled by the scan (one that does not
    /// compile is not registered), and the most recently compiled ones
    /// are kept for the daemon's registry, which takes this cache over.
    pub validators: Arc<ValidatorCache>,
    /// What happened, in order; each `Display`s as its log line.
    pub events: Vec<ScanEvent>,
    /// The requirement checks of every valid SKILL.md, in scan order.
    pub requirements: Vec<RequirementReport>,
    /// The MCP server packs found (checked as a skill's entry and path
    /// are): not skills themselves; the daemon asks the executor for their
    /// tools ([`mcp::add_tools`]).
    pub mcp_packs: Vec<RegisteredSkill>,
    /// Each MCP server pack whose tools the executor listed, by manifest,
    /// with the generation of that list (`None`: it said none). The daemon
    /// fills it in: it lists them again when a call's answer carries
    /// another generation, and lists a pack missing here once it can.
    pub mcp_generations: HashMap<PathBuf, Option<u64>>,
}

impl ScanReport {
    /// The number of skills registered.
    pub fn registered(&self) -> usize {
        self.skills.len()
    }

    /// The registered skill named `name`.
    pub fn get(&self, name: &str) -> Option<&RegisteredSkill> {
        self.skills.iter().find(|s| s.name() == name)
    }

    /// The registered skill whose function spelling is `name`
    /// ([`RegisteredSkill::function_name`]: a skill's name, an MCP server
    /// tool's `PACK_TOOL` alias).
    pub fn get_function(&self, name: &str) -> Option<&RegisteredSkill> {
        self.skills.iter().find(|s| s.function_name().as_str() == name)
    }
}

/// Scans allow-list roots with the operator's validation settings.
#[derive(Debug, Clone, Default)]
pub struct Scanner {
    opts: ValidateOptions,
}

/// A target after resolution: the canonical root and what to load in it.
struct Resolved {
    root: PathBuf,
    /// `None` = walk the root; `Some(path)` = load just this manifest.
    manifest: Option<PathBuf>,
}

/// The mutable state of one scan.
struct Session<'a> {
    opts: &'a ValidateOptions,
    /// The canonical roots of every target (a manifest target's folder
    /// too): where an absolute entry may point.
    all_roots: Vec<PathBuf>,
    /// The canonical roots walked so far.
    walked: Vec<PathBuf>,
    first_seen: HashMap<SkillName, PathBuf>,
    /// With [`Scanner::scan_targets`]: every manifest loaded so far, to
    /// load each once however many targets reach it.
    loaded: Option<HashSet<PathBuf>>,
    report: ScanReport,
}

impl Scanner {
    /// A scanner validating manifests with `opts`.
    pub fn new(opts: ValidateOptions) -> Self {
        Self { opts }
    }

    /// Scans `roots` in order (typically [`roots::parse_dirs`] of
    /// `ONGRID_SKILLS_EXTERNAL_DIRS`). Never fails: problems are events.
    /// A manifest under two nested roots is loaded under each, so the
    /// second is logged as a duplicate: the operator's roots overlap.
    pub fn scan<P: AsRef<Path>>(&self, roots: &[P]) -> ScanReport {
        let targets: Vec<ScanTarget> =
            roots.iter().map(|r| ScanTarget::Root(r.as_ref().to_path_buf())).collect();
        self.run(&targets, false)
    }

    /// Scans roots and single manifests in order (`ongrid-skill
    /// validate`). Every target is resolved first, so an absolute entry
    /// may name any root of the scan. Each manifest file is loaded once,
    /// however many targets reach it (a folder and a manifest in it, or
    /// nested folders), so that none is reported as a duplicate of itself.
    /// The scan's manifest paths are canonical (a canonical root, then
    /// real directories and a regular file), so the same file is the same
    /// path.
    pub fn scan_targets(&self, targets: &[ScanTarget]) -> ScanReport {
        self.run(targets, true)
    }

    fn run(&self, targets: &[ScanTarget], load_once: bool) -> ScanReport {
        let mut session = Session {
            opts: &self.opts,
            all_roots: Vec::new(),
            walked: Vec::new(),
            first_seen: HashMap::new(),
            loaded: load_once.then(HashSet::new),
            report: ScanReport::default(),
        };
        let resolved: Vec<Resolved> =
            targets.iter().filter_map(|t| session.resolve_target(t)).collect();
        for target in &resolved {
            match &target.manifest {
                None => session.walk(&target.root),
                Some(path) => session.visit(&target.root, path.clone(), None),
            }
        }
        session.report
    }
}

impl Session<'_> {
    fn skip_root(&mut self, root: &Path, error: RootError) -> Option<Resolved> {
        self.report.events.push(ScanEvent::Root { root: root.to_path_buf(), error });
        None
    }

    fn resolve_target(&mut self, target: &ScanTarget) -> Option<Resolved> {
        match target {
            ScanTarget::Root(root) => {
                let canonical = match roots::resolve(root) {
                    Ok(c) => c,
                    Err(e) => return self.skip_root(root, e),
                };
                if self.walked.contains(&canonical) {
                    self.report
                        .events
                        .push(ScanEvent::RootRepeated { root: root.clone(), canonical });
                    return None;
                }
                self.walked.push(canonical.clone());
                // A manifest target in this folder may have named it already.
                if !self.all_roots.contains(&canonical) {
                    self.all_roots.push(canonical.clone());
                }
                Some(Resolved { root: canonical, manifest: None })
            }
            ScanTarget::Manifest(path) => {
                let (Some(dir), Some(file_name)) = (path.parent(), path.file_name()) else {
                    return self.skip_root(path, RootError::NotADirectory);
                };
                let root = match roots::resolve(dir) {
                    Ok(c) => c,
                    Err(e) => return self.skip_root(path, e),
                };
                if !self.all_roots.contains(&root) {
                    self.all_roots.push(root.clone());
                }
                let manifest = root.join(file_name);
                Some(Resolved { root, manifest: Some(manifest) })
            }
        }
    }

    fn walk(&mut self, root: &Path) {
        let walk = WalkDir::new(root).follow_links(false).sort_by_file_name();
        for item in walk {
            match item {
                Err(e) => {
                    let path = e.path().unwrap_or(root).to_path_buf();
                    self.report.events.push(ScanEvent::Walk { path, error: WalkError(e) });
                }
                Ok(de)
                    if de.depth() > 0
                        && (de.file_name() == MANIFEST_FILE_NAME
                            || de.file_name() == SKILL_MD_FILE_NAME) =>
                {
                    let file_type = de.file_type();
                    self.visit(root, de.into_path(), Some(file_type));
                }
                // Not followed; said, so that a pack (or a folder of packs)
                // linked into a root is not dropped without a word: a link
                // right under the root to a folder, or one deeper to a
                // folder that holds a manifest. A pack's own links (a
                // venv's `lib64 -> lib`) are no packs, and would be said at
                // every rescan.
                Ok(de)
                    if de.path_is_symlink()
                        && std::fs::metadata(de.path()).is_ok_and(|m| m.is_dir())
                        && (de.depth() == 1
                            || [MANIFEST_FILE_NAME, SKILL_MD_FILE_NAME]
                                .iter()
                                .any(|m| std::fs::metadata(de.path().join(m)).is_ok())) =>
                {
                    self.report.events.push(ScanEvent::SymlinkedDir { path: de.into_path() });
                }
                Ok(_) => {}
            }
        }
    }

    /// Loads the manifest at `path` (a file type from the walk, or `None`
    /// to stat it here) and registers its skill.
    fn visit(&mut self, root: &Path, path: PathBuf, file_type: Option<FileType>) {
        let file_type = match file_type {
            Some(t) => t,
            None => match std::fs::symlink_metadata(&path) {
                Ok(meta) => meta.file_type(),
                Err(e) => {
                    let error = manifest_file::ParseError::Read(e);
                    self.report.events.push(ScanEvent::Parse { manifest: path, error });
                    return;
                }
            },
        };
        if !file_type.is_file() {
            let kind = kind_of(file_type);
            self.report.events.push(ScanEvent::NotRegular { path, kind });
            return;
        }
        if let Some(loaded) = &mut self.loaded {
            if !loaded.insert(path.clone()) {
                return;
            }
        }
        self.load(root, path);
    }

    fn load(&mut self, root: &Path, path: PathBuf) {
        if path.file_name().is_some_and(|n| n == SKILL_MD_FILE_NAME) {
            return self.load_skill_md(root, path);
        }
        let events = &mut self.report.events;
        let (manifest, digest) = match manifest_file::load(&path, self.opts) {
            Ok(m) => m,
            Err(error) => {
                events.push(ScanEvent::Parse { manifest: path, error });
                return;
            }
        };
        self.register(root, path, (manifest, digest), None);
    }

    /// Reads a SKILL.md, checks its requirements and registers its tools.
    fn load_skill_md(&mut self, root: &Path, path: PathBuf) {
        let (skill, digest) = match manifest_file::load_skill_md(&path, self.opts) {
            Ok(s) => s,
            Err(error) => {
                self.report.events.push(ScanEvent::Parse { manifest: path, error });
                return;
            }
        };
        let dir = path.parent().unwrap_or(root).to_path_buf();
        let checks = requirements::check(skill.requirements(), &dir, &ProcessEnv);
        let unmet = checks.iter().find(|c| !c.met).map(ToString::to_string);
        self.report.requirements.push(RequirementReport {
            name: skill.name().to_owned(),
            manifest: path.clone(),
            checks,
        });
        if let Some(reason) = unmet {
            self.report.events.push(ScanEvent::RequirementNotMet {
                name: skill.name().to_owned(),
                manifest: path,
                reason,
            });
            return;
        }
        if skill.tools().is_empty() {
            let name = skill.name().to_owned();
            self.report.events.push(ScanEvent::NoTools { name, manifest: path });
            return;
        }
        for tool in skill.tools() {
            let manifest = tool.manifest().clone();
            self.register(root, path.clone(), (manifest, digest), Some(tool.name()));
        }
    }

    /// Registers a valid manifest (of a `skill.json`, or of one `tool` of
    /// a SKILL.md) unless its name is taken or it fails to build (its
    /// entry, its schema: [`crate::scan::build`]). A manifest that fails leaves
    /// the name free for the next one.
    fn register(
        &mut self,
        root: &Path,
        path: PathBuf,
        (manifest, digest): (Manifest, ManifestDigest),
        tool: Option<&str>,
    ) {
        let events = &mut self.report.events;
        let name = manifest.name().clone();
        if let Some(first) = self.first_seen.get(&name) {
            events.push(ScanEvent::Duplicate {
                name: name.to_string(),
                manifest: path,
                first: first.clone(),
            });
            return;
        }
        let ignored = manifest.ignored_fields().to_vec();
        let clamped = manifest.timeout_clamped_from().map(|r| (r, manifest.timeout().as_secs()));
        let scope = EntryScope { root, all_roots: &self.all_roots };
        let built = build::build((manifest, digest), path.clone(), scope, tool);
        let Built { skill, validator } = match built {
            Ok(b) => b,
            Err(error) => {
                events.push(ScanEvent::Build { name, manifest: path, error });
                return;
            }
        };
        // An MCP server pack is not run with args on stdin: the executor
        // owns its server and lists its tools.
        let is_mcp = skill.manifest().mcp().is_some();
        if is_mcp {
            events.push(ScanEvent::McpPack { name: name.clone(), manifest: path.clone() });
        } else {
            events.push(ScanEvent::Registered { name: name.to_string(), manifest: path.clone() });
        }
        if !ignored.is_empty() {
            events.push(ScanEvent::IgnoredFields {
                name: name.clone(),
                manifest: path.clone(),
                fields: ignored,
            });
        }
        if let Some((requested, granted)) = clamped {
            events.push(ScanEvent::TimeoutClamped {
                name: name.clone(),
                manifest: path.clone(),
                requested,
                granted,
            });
        }
        self.first_seen.insert(name, path);
        if is_mcp {
            self.report.mcp_packs.push(skill);
            return;
        }
        // The skill's slot in the cache is its place in `skills`.
        self.report.validators.insert(self.report.skills.len(), validator);
        self.report.skills.push(skill);
    }
}

/// A short word for a non-regular file type.
fn kind_of(t: FileType) -> &'static str {
    if t.is_symlink() {
        "symlink"
    } else if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "fifo"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "unknown type"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn exe(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, "#!/bin/sh\n").unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn manifest(dir: &Path, name: &str, entry: &str) -> PathBuf {
        fs::create_dir_all(dir).unwrap();
        let json = serde_json::json!({"name": name, "description": "d", "entry": entry});
        let path = dir.join(MANIFEST_FILE_NAME);
        fs::write(&path, json.to_string()).unwrap();
        path
    }

    fn base() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        (tmp, base)
    }

    #[test]
    fn absolute_entry_may_name_another_root_of_the_scan() {
        let (_tmp, base) = base();
        let (a, b) = (base.join("a"), base.join("b"));
        exe(&b.join("tools/run"));
        let entry = b.join("tools/run");
        manifest(&a.join("p"), "cross", entry.to_str().unwrap());
        let report = Scanner::default().scan(&[&a, &b]);
        let skill = report.get("cross").expect("registered");
        assert_eq!(skill.entry(), entry);
        assert_eq!(skill.root(), a);

        // With only root `a`, the same entry escapes.
        let report = Scanner::default().scan(&[&a]);
        assert_eq!(report.registered(), 0);
        assert!(matches!(
            &report.events[..],
            [ScanEvent::Build {
                error: build::BuildError::Entry(crate::scan::entry::EntryError::Escapes { .. }),
                ..
            }]
        ));
    }

    #[test]
    fn an_mcp_pack_is_not_registered_as_a_one_shot_skill_but_keeps_its_name() {
        let (_tmp, base) = base();
        exe(&base.join("m/server"));
        let json = r#"{"kind":"mcp","name":"srv","description":"d","entry":"server"}"#;
        fs::write(base.join("m").join(MANIFEST_FILE_NAME), json).unwrap();
        // A one-shot skill of the same name further on is a duplicate.
        exe(&base.join("z/run"));
        manifest(&base.join("z"), "srv", "run");
        let report = Scanner::default().scan(&[&base]);
        assert_eq!(report.registered(), 0);
        assert!(
            matches!(&report.events[0], ScanEvent::McpPack { name, .. } if name.as_str() == "srv")
        );
        assert!(!report.events[0].is_skip());
        assert!(matches!(&report.events[1], ScanEvent::Duplicate { .. }), "{:?}", report.events);
    }

    /// An MCP pack's unknown fields are reported as a skill's are: a
    /// misspelt `tool_classes` would otherwise leave every tool the pack's
    /// class without a word.
    #[test]
    fn an_mcp_packs_unknown_fields_are_reported() {
        let (_tmp, base) = base();
        exe(&base.join("m/server"));
        let json = r#"{"kind":"mcp","name":"srv","description":"d","entry":"server","tool_class":{"rm":"dangerous"}}"#;
        fs::write(base.join("m").join(MANIFEST_FILE_NAME), json).unwrap();
        let report = Scanner::default().scan(&[&base]);
        assert_eq!(report.mcp_packs.len(), 1);
        let ignored = report.events.iter().find_map(|e| match e {
            ScanEvent::IgnoredFields { fields, .. } => Some(fields.clone()),
            _ => None,
        });
        assert_eq!(ignored, Some(vec!["tool_class".to_owned()]), "{:?}", report.events);
    }

    #[test]
    fn a_single_manifest_target_uses_its_folder_as_root() {
        let (_tmp, base) = base();
        exe(&base.join("p/run"));
        let path = manifest(&base.join("p"), "one", "run");
        let report = Scanner::default().scan_targets(&[ScanTarget::Manifest(path.clone())]);
        let skill = report.get("one").expect("registered");
        assert_eq!(skill.root(), base.join("p"));
        assert_eq!(skill.manifest_path(), path);
    }

    #[test]
    fn a_relative_manifest_target_is_skipped() {
        let target = ScanTarget::Manifest(PathBuf::from("p/skill.json"));
        let report = Scanner::default().scan_targets(&[target]);
        assert_eq!(report.registered(), 0);
        assert!(matches!(&report.events[..], [ScanEvent::Root { error: RootError::Relative, .. }]));
    }

    #[test]
    fn root_problems_come_before_walk_events() {
        let (_tmp, base) = base();
        exe(&base.join("r/p/run"));
        manifest(&base.join("r/p"), "x", "run");
        let report = Scanner::default().scan(&[base.join("r"), base.join("missing")]);
        let lines: Vec<String> = report.events.iter().map(ToString::to_string).collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].ends_with("does not exist, skipping"), "{lines:?}");
        assert!(lines[1].starts_with("skill loader: registered"), "{lines:?}");
    }

    #[test]
    fn the_validate_options_are_applied() {
        let (_tmp, base) = base();
        exe(&base.join("p/run"));
        fs::write(
            base.join("p/skill.json"),
            r#"{"name":"t","description":"d","entry":"run","timeout_seconds":100}"#,
        )
        .unwrap();
        let opts = ValidateOptions { max_timeout: std::time::Duration::from_secs(60) };
        let report = Scanner::new(opts).scan(&[&base]);
        let skill = report.get("t").expect("registered");
        assert_eq!(skill.manifest().timeout().as_secs(), 60);
        assert!(report
            .events
            .iter()
            .any(|e| matches!(e, ScanEvent::TimeoutClamped { requested: 100, granted: 60, .. })));
    }
}
