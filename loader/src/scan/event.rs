//! What a scan did, one typed event per decision.
//!
//! The `Display` of a [`ScanEvent`] is its exact log line (operators and
//! tests match these lines, so they change only on purpose);
//! the CLI prints it verbatim on stderr and the daemon logs it through
//! `tracing` at [`ScanEvent::level`].

use std::fmt;
use std::path::{Path, PathBuf};

use policy::SkillName;

use crate::scan::build::BuildError;
use crate::scan::manifest_file::ParseError;
use crate::scan::roots::RootError;

/// How loud an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Only interesting when debugging a pack (ignored manifest fields).
    Debug,
    /// Normal operation (a skill registered).
    Info,
    /// Something was skipped or changed.
    Warn,
}

/// Why the walk could not read part of a root.
#[derive(Debug)]
pub struct WalkError(pub walkdir::Error);

impl fmt::Display for WalkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(io) = self.0.io_error() {
            write!(f, "{io}")
        } else if let Some(ancestor) = self.0.loop_ancestor() {
            write!(f, "filesystem loop back to {}", ancestor.display())
        } else {
            write!(f, "{}", self.0)
        }
    }
}

/// One decision of a scan.
#[derive(Debug)]
#[non_exhaustive]
pub enum ScanEvent {
    /// A skill was registered.
    Registered {
        /// The skill's name (`PACK.TOOL` for an MCP server's tool).
        name: String,
        /// Its manifest.
        manifest: PathBuf,
    },
    /// A valid manifest whose name was registered earlier: the first wins.
    Duplicate {
        /// The name in both manifests (for an MCP server's tool: the
        /// tool's `PACK.TOOL`, whose alias `PACK_TOOL` is taken).
        name: String,
        /// The manifest skipped.
        manifest: PathBuf,
        /// The manifest registered first.
        first: PathBuf,
    },
    /// The manifest could not be read or is not valid.
    Parse {
        /// The manifest.
        manifest: PathBuf,
        /// What went wrong.
        error: ParseError,
    },
    /// The manifest is valid but its skill cannot be built: its entry is
    /// refused, or its schema does not compile.
    Build {
        /// The skill's name.
        name: SkillName,
        /// The manifest.
        manifest: PathBuf,
        /// What is wrong.
        error: BuildError,
    },
    /// Something named `skill.json` that is not a regular file.
    NotRegular {
        /// Its path.
        path: PathBuf,
        /// What it is instead (`symlink`, `directory`, `fifo`...).
        kind: &'static str,
    },
    /// A symbolic link to a directory inside a root: not followed
    /// (a symlink loop must not make the walk recurse), so nothing beneath
    /// it is loaded. Said at warn level
    /// for the operator who linked a pack into a root, but not a skip: it
    /// is not a manifest, and packs may hold such links (`lib64 -> lib`).
    SymlinkedDir {
        /// The link.
        path: PathBuf,
    },
    /// A root that is not walked.
    Root {
        /// The root as given.
        root: PathBuf,
        /// Why it is skipped.
        error: RootError,
    },
    /// A root that resolves to a directory an earlier root already covered.
    RootRepeated {
        /// The root as given.
        root: PathBuf,
        /// The canonical directory both resolve to.
        canonical: PathBuf,
    },
    /// Part of a root could not be walked (an unreadable directory); the
    /// walk goes on with the rest.
    Walk {
        /// The path the walk failed on.
        path: PathBuf,
        /// The error.
        error: WalkError,
    },
    /// A registered manifest had top-level fields outside the contract.
    IgnoredFields {
        /// The skill's name.
        name: SkillName,
        /// The manifest.
        manifest: PathBuf,
        /// The ignored field names.
        fields: Vec<String>,
    },
    /// A SKILL.md whose requirement is not met on this host: not registered.
    RequirementNotMet {
        /// The skill's name as the SKILL.md writes it.
        name: String,
        /// The SKILL.md.
        manifest: PathBuf,
        /// The first unmet requirement (`bin "jq" not found on PATH`).
        reason: String,
    },
    /// A `"kind": "mcp"` pack: its server is the executor's to run, and
    /// the pack is not a one-shot skill, so the scan does not register it
    /// as one.
    McpPack {
        /// The pack's name.
        name: SkillName,
        /// The manifest.
        manifest: PathBuf,
    },
    /// An MCP server pack whose tools could not be listed, or one tool of
    /// it that could not be registered: left out.
    McpTools {
        /// The pack's name.
        name: SkillName,
        /// The manifest.
        manifest: PathBuf,
        /// Why (never a secret: the executor's answer names no value).
        reason: String,
    },
    /// A SKILL.md without tools (instructions only): nothing to run.
    NoTools {
        /// The skill's name as the SKILL.md writes it.
        name: String,
        /// The SKILL.md.
        manifest: PathBuf,
    },
    /// A registered manifest asked for a timeout over the operator maximum.
    TimeoutClamped {
        /// The skill's name.
        name: SkillName,
        /// The manifest.
        manifest: PathBuf,
        /// The timeout asked for, in seconds.
        requested: u64,
        /// The timeout granted, in seconds.
        granted: u64,
    },
}

impl ScanEvent {
    /// The level the event is logged at.
    pub fn level(&self) -> Level {
        match self {
            ScanEvent::Registered { .. } => Level::Info,
            ScanEvent::IgnoredFields { .. } => Level::Debug,
            ScanEvent::NoTools { .. } | ScanEvent::McpPack { .. } => Level::Info,
            _ => Level::Warn,
        }
    }

    /// Returns true if and only if something was not loaded because of
    /// this event (a manifest, a file named `skill.json`, a root or part of
    /// one).
    pub fn is_skip(&self) -> bool {
        !matches!(
            self,
            ScanEvent::Registered { .. }
                | ScanEvent::IgnoredFields { .. }
                | ScanEvent::TimeoutClamped { .. }
                | ScanEvent::NoTools { .. }
                | ScanEvent::McpPack { .. }
                | ScanEvent::SymlinkedDir { .. }
        )
    }

    /// A short stable name of the event's kind, used as a metric label:
    /// `registered`, `duplicate`, `parse`, `build`, `not_regular`,
    /// `symlinked_dir`, `root`, `root_repeated`, `walk`, `ignored_fields`,
    /// `timeout_clamped`, `requirement`, `no_tools`, `mcp_pack`, `mcp_tools`.
    pub fn kind(&self) -> &'static str {
        match self {
            ScanEvent::Registered { .. } => "registered",
            ScanEvent::Duplicate { .. } => "duplicate",
            ScanEvent::Parse { .. } => "parse",
            ScanEvent::Build { .. } => "build",
            ScanEvent::NotRegular { .. } => "not_regular",
            ScanEvent::SymlinkedDir { .. } => "symlinked_dir",
            ScanEvent::Root { .. } => "root",
            ScanEvent::RootRepeated { .. } => "root_repeated",
            ScanEvent::Walk { .. } => "walk",
            ScanEvent::IgnoredFields { .. } => "ignored_fields",
            ScanEvent::TimeoutClamped { .. } => "timeout_clamped",
            ScanEvent::RequirementNotMet { .. } => "requirement",
            ScanEvent::NoTools { .. } => "no_tools",
            ScanEvent::McpPack { .. } => "mcp_pack",
            ScanEvent::McpTools { .. } => "mcp_tools",
        }
    }

    /// The path the event is about: a manifest, a root or a walked path.
    pub fn path(&self) -> &Path {
        match self {
            ScanEvent::Registered { manifest, .. }
            | ScanEvent::Duplicate { manifest, .. }
            | ScanEvent::Parse { manifest, .. }
            | ScanEvent::Build { manifest, .. }
            | ScanEvent::IgnoredFields { manifest, .. }
            | ScanEvent::TimeoutClamped { manifest, .. }
            | ScanEvent::RequirementNotMet { manifest, .. }
            | ScanEvent::NoTools { manifest, .. }
            | ScanEvent::McpPack { manifest, .. }
            | ScanEvent::McpTools { manifest, .. } => manifest,
            ScanEvent::NotRegular { path, .. }
            | ScanEvent::SymlinkedDir { path }
            | ScanEvent::Walk { path, .. } => path,
            ScanEvent::Root { root, .. } | ScanEvent::RootRepeated { root, .. } => root,
        }
    }

    /// What happened, without the `skill loader: ` prefix and without
    /// [`ScanEvent::path`]: for reports that print the path themselves.
    pub fn reason(&self) -> String {
        match self {
            ScanEvent::Registered { name, .. } => format!("registered subprocess skill \"{name}\""),
            ScanEvent::Duplicate { name, first, .. } => {
                format!("skill \"{name}\" already registered from {}", first.display())
            }
            ScanEvent::Parse { error, .. } => error.to_string(),
            ScanEvent::Build { name, error, .. } => format!("build \"{name}\": {error}"),
            ScanEvent::NotRegular { kind, .. } => format!("not a regular file ({kind})"),
            ScanEvent::SymlinkedDir { .. } => SYMLINKED_DIR.to_owned(),
            ScanEvent::Root { error, .. } => format!("root {error}"),
            ScanEvent::RootRepeated { canonical, .. } => {
                format!("root resolves to {}, already scanned", canonical.display())
            }
            ScanEvent::Walk { error, .. } => error.to_string(),
            ScanEvent::IgnoredFields { name, fields, .. } => {
                format!("skill \"{name}\": ignoring unknown fields {}", quoted_list(fields))
            }
            ScanEvent::TimeoutClamped { name, requested, granted, .. } => {
                format!("skill \"{name}\": timeout_seconds {requested} clamped to {granted}")
            }
            ScanEvent::RequirementNotMet { name, reason, .. } => {
                format!("skill \"{name}\": requirement not met: {reason}")
            }
            ScanEvent::NoTools { name, .. } => {
                format!("skill \"{name}\": no tools, nothing to register")
            }
            ScanEvent::McpPack { name, .. } => {
                format!("pack \"{name}\": an MCP server, not registered as a one-shot skill")
            }
            ScanEvent::McpTools { name, reason, .. } => format!("pack \"{name}\": {reason}"),
        }
    }
}

/// The reason of [`ScanEvent::SymlinkedDir`].
const SYMLINKED_DIR: &str = "symlinked directory, not followed";

fn quoted_list(items: &[String]) -> String {
    items.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for ScanEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("skill loader: ")?;
        match self {
            ScanEvent::Registered { name, manifest } => {
                write!(f, "registered subprocess skill \"{name}\" from {}", manifest.display())
            }
            ScanEvent::Duplicate { name, manifest, .. } => {
                write!(f, "skill \"{name}\" already registered, skipping {}", manifest.display())
            }
            ScanEvent::Parse { manifest, error } => {
                write!(f, "parse {}: {error}", manifest.display())
            }
            ScanEvent::Build { name, error, .. } => write!(f, "build \"{name}\": {error}"),
            ScanEvent::NotRegular { path, kind } => {
                write!(f, "skipping {}: not a regular file ({kind})", path.display())
            }
            ScanEvent::SymlinkedDir { path } => {
                write!(f, "skipping {}: {SYMLINKED_DIR}", path.display())
            }
            ScanEvent::Root { root, error } => {
                write!(f, "root {} {error}, skipping", root.display())
            }
            ScanEvent::RootRepeated { root, canonical } => write!(
                f,
                "root {} resolves to {}, already scanned, skipping",
                root.display(),
                canonical.display()
            ),
            ScanEvent::Walk { path, error } => write!(f, "walk {}: {error}", path.display()),
            ScanEvent::IgnoredFields { name, manifest, fields } => write!(
                f,
                "skill \"{name}\" from {}: ignoring unknown fields {}",
                manifest.display(),
                quoted_list(fields)
            ),
            ScanEvent::TimeoutClamped { name, manifest, requested, granted } => write!(
                f,
                "skill \"{name}\" from {}: timeout_seconds {requested} clamped to {granted}",
                manifest.display()
            ),
            ScanEvent::RequirementNotMet { name, manifest, reason } => write!(
                f,
                "skill \"{name}\" from {}: requirement not met: {reason}",
                manifest.display()
            ),
            ScanEvent::NoTools { name, manifest } => write!(
                f,
                "skill \"{name}\" from {}: no tools, nothing to register",
                manifest.display()
            ),
            ScanEvent::McpPack { name, manifest } => write!(
                f,
                "pack \"{name}\" from {}: an MCP server, not registered as a one-shot skill",
                manifest.display()
            ),
            ScanEvent::McpTools { name, manifest, reason } => {
                write!(f, "pack \"{name}\" from {}: {reason}", manifest.display())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::entry::EntryError;

    fn name(s: &str) -> SkillName {
        SkillName::new(s).unwrap()
    }

    #[test]
    fn design_lines_byte_for_byte() {
        let m = PathBuf::from("/skills/disk/skill.json");
        let mut cases: Vec<(ScanEvent, &str)> = vec![
            (
                ScanEvent::Registered { name: "disk_usage".into(), manifest: m.clone() },
                "skill loader: registered subprocess skill \"disk_usage\" from /skills/disk/skill.json",
            ),
            (
                ScanEvent::Duplicate {
                    name: "disk_usage".into(),
                    manifest: m.clone(),
                    first: PathBuf::from("/a/skill.json"),
                },
                "skill loader: skill \"disk_usage\" already registered, skipping /skills/disk/skill.json",
            ),
            (
                ScanEvent::Parse {
                    manifest: m.clone(),
                    error: ParseError::Manifest(policy::ManifestError::Missing("name")),
                },
                "skill loader: parse /skills/disk/skill.json: missing required field \"name\"",
            ),
            (
                ScanEvent::Build {
                    name: name("disk_usage"),
                    manifest: m.clone(),
                    error: BuildError::Entry(EntryError::Escapes {
                        entry: PathBuf::from("/etc/passwd"),
                        root: PathBuf::from("/skills"),
                    }),
                },
                "skill loader: build \"disk_usage\": entry /etc/passwd escapes allowlist root /skills",
            ),
            (
                ScanEvent::Build {
                    name: name("disk_usage"),
                    manifest: m.clone(),
                    error: BuildError::Entry(EntryError::Missing {
                        entry: PathBuf::from("/skills/disk/run"),
                    }),
                },
                "skill loader: build \"disk_usage\": entry /skills/disk/run does not exist",
            ),
            (
                ScanEvent::Build {
                    name: name("disk_usage"),
                    manifest: m.clone(),
                    error: BuildError::Schema {
                        manifest: m.clone(),
                        message: "\"(\" is not a valid regular expression".into(),
                    },
                },
                "skill loader: build \"disk_usage\": schema in /skills/disk/skill.json does not compile: \"(\" is not a valid regular expression",
            ),
            (
                ScanEvent::Root { root: PathBuf::from("rel"), error: RootError::Relative },
                "skill loader: root rel is not an absolute path, skipping",
            ),
            (
                ScanEvent::NotRegular { path: m.clone(), kind: "fifo" },
                "skill loader: skipping /skills/disk/skill.json: not a regular file (fifo)",
            ),
            (
                ScanEvent::SymlinkedDir { path: PathBuf::from("/skills/linked") },
                "skill loader: skipping /skills/linked: symlinked directory, not followed",
            ),
            (
                ScanEvent::IgnoredFields {
                    name: name("disk_usage"),
                    manifest: m.clone(),
                    fields: vec!["author".into(), "version".into()],
                },
                "skill loader: skill \"disk_usage\" from /skills/disk/skill.json: ignoring unknown fields \"author\", \"version\"",
            ),
            (
                ScanEvent::TimeoutClamped {
                    name: name("disk_usage"),
                    manifest: m,
                    requested: 9999,
                    granted: 600,
                },
                "skill loader: skill \"disk_usage\" from /skills/disk/skill.json: timeout_seconds 9999 clamped to 600",
            ),
        ];
        cases.push((
            ScanEvent::RequirementNotMet {
                name: "jq-tools".into(),
                manifest: PathBuf::from("/skills/jq/SKILL.md"),
                reason: "bin \"jq\" not found on PATH".into(),
            },
            "skill loader: skill \"jq-tools\" from /skills/jq/SKILL.md: requirement not met: bin \"jq\" not found on PATH",
        ));
        for (event, want) in cases {
            assert_eq!(event.to_string(), want);
        }
    }

    #[test]
    fn levels_and_skips() {
        let m = PathBuf::from("/s/skill.json");
        let reg = ScanEvent::Registered { name: "a".into(), manifest: m.clone() };
        assert_eq!(reg.level(), Level::Info);
        assert!(!reg.is_skip());
        assert_eq!(reg.path(), m);
        let ignored =
            ScanEvent::IgnoredFields { name: name("a"), manifest: m.clone(), fields: vec![] };
        assert_eq!(ignored.level(), Level::Debug);
        assert!(!ignored.is_skip());
        let dup = ScanEvent::Duplicate { name: "a".into(), manifest: m.clone(), first: m.clone() };
        assert_eq!(dup.level(), Level::Warn);
        assert!(dup.is_skip());
        assert_eq!(dup.reason(), "skill \"a\" already registered from /s/skill.json");
    }
}
