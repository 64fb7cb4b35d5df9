//! Spawn sequence step 1: validate a request against the executor's own
//! configuration, trusting nothing the caller says beyond "run the skill
//! whose manifest is at P with these args".

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io::{Read, Seek};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use policy::{
    ArgsError, GrantError, GrantedSandbox, Manifest, ManifestDigest, ManifestError, Outcome,
    SkillMd, SkillMdError, ValidateOptions, MAX_MANIFEST_BYTES, SKILL_MD_FILE_NAME,
};

use crate::config::Config;
use crate::run::file_key::FileKey;
use crate::run::resolve::{self, Open, Resolved};
use owners::Owners;
use policy::mcp::PackKind;

/// Why a request is refused before anything runs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The manifest cannot be read. The cause is part of the message (not
    /// a source): every report of this error names it.
    #[error("manifest {path}: cannot read: {error}")]
    Read {
        /// The manifest.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The manifest is invalid.
    #[error("manifest {path}: {source}")]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// The cause.
        #[source]
        source: ManifestError,
    },
    /// The `SKILL.md` is invalid, or the tool asked for is not in it.
    #[error("manifest {path}: {source}")]
    SkillMd {
        /// The SKILL.md.
        path: PathBuf,
        /// The cause.
        #[source]
        source: SkillMdError,
    },
    /// The file is neither a `skill.json` nor a `SKILL.md`: no other file
    /// is a manifest, whatever it holds (a pack's `fixtures/case.json`
    /// that parses as one and names a granted skill would get its grants).
    #[error("manifest {path}: not a skill.json or SKILL.md (no other file is a manifest)")]
    NotAManifest {
        /// The file.
        path: PathBuf,
    },
    /// A `tool` was given for a `skill.json`, or none for a `SKILL.md`.
    #[error("manifest {path}: {reason}")]
    Tool {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// The manifest is not under any configured root.
    #[error("manifest {path} is not under an allow-list root")]
    OutsideRoots {
        /// The manifest.
        path: PathBuf,
    },
    /// The entry escapes the allow-list root.
    #[error("skill \"{skill}\": entry {entry} escapes allowlist root {root}")]
    Escapes {
        /// The skill.
        skill: String,
        /// The entry (resolved).
        entry: PathBuf,
        /// The root.
        root: PathBuf,
    },
    /// The entry (or a folder above it) fails a check.
    #[error("skill \"{skill}\": entry {path}: {reason}")]
    Entry {
        /// The skill.
        skill: String,
        /// The entry or folder at fault.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The manifest (or a folder above it) fails the owner check.
    #[error("skill \"{skill}\": manifest {path}: {reason}")]
    ManifestOwner {
        /// The skill.
        skill: String,
        /// The manifest or folder at fault.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The manifest's `sandbox` asks for more than the operator grants.
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The skill's grant is pinned to another manifest
    /// (`[skills.NAME] manifest`): this file declares a name that is not
    /// its own to take.
    #[error(
        "manifest {path}: skill \"{skill}\" is granted to the manifest {pinned} only \
         (executor.toml [skills.{skill}] manifest)"
    )]
    NotPinned {
        /// The skill.
        skill: String,
        /// The manifest asked for.
        path: PathBuf,
        /// The manifest the grant is for.
        pinned: PathBuf,
    },
    /// The args are not one JSON object.
    #[error("skill \"{skill}\": args: {reason}")]
    Args {
        /// The skill.
        skill: String,
        /// What is wrong.
        reason: String,
    },
    /// The run-as user does not exist.
    #[error("run-as user {user:?} does not exist (create it, e.g. `useradd --system --user-group --no-create-home --shell /usr/sbin/nologin {user}`, or set run_as in executor.toml)")]
    UnknownUser {
        /// The user.
        user: String,
    },
}

impl PlanError {
    /// The skill's name, when the manifest was read far enough to know it
    /// (the report then names the skill, not its folder).
    pub fn skill(&self) -> Option<&str> {
        match self {
            PlanError::Escapes { skill, .. }
            | PlanError::Entry { skill, .. }
            | PlanError::ManifestOwner { skill, .. }
            | PlanError::NotPinned { skill, .. }
            | PlanError::Args { skill, .. } => Some(skill),
            PlanError::Grant(g) => Some(&g.skill),
            _ => None,
        }
    }

    /// The run outcome this error stands for.
    pub fn outcome(&self) -> Outcome {
        match self {
            PlanError::Args { .. } => Outcome::InvalidArgs,
            PlanError::UnknownUser { .. } => Outcome::SandboxFailed,
            _ => Outcome::Rejected,
        }
    }
}

/// Who the skill runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// User name.
    pub name: String,
    /// uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// True when the executor switches to this user (it is root).
    pub switch: bool,
    /// The configured `run_as` user, switched to and not root: a user of
    /// its own that owns no file outside its run directory, so it may keep
    /// changing its files' metadata (`seccomp::Variant::lock_metadata`).
    /// Root, a granted user and the executor's own uid own files outside.
    pub dedicated: bool,
}

/// A validated run, ready for the sandbox to be built.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The validated manifest (shared with the cache it may come from).
    pub manifest: Arc<Manifest>,
    /// The manifest file (canonical).
    pub manifest_path: PathBuf,
    /// The skill's folder (canonical).
    pub skill_dir: PathBuf,
    /// The allow-list root it lies under.
    pub root: PathBuf,
    /// The entry (canonical).
    pub entry: PathBuf,
    /// What the sandbox grants.
    pub granted: GrantedSandbox,
    /// The child's environment, exactly the allowed names that are set.
    pub env: Vec<(String, OsString)>,
    /// The args, verbatim.
    pub args: Vec<u8>,
    /// The run-as user.
    pub run_as: RunAs,
    /// The manifest file's and the entry's identity when they were checked
    /// (device, inode, size, mtime, ctime): a warm run made for another
    /// identity is not this plan's (`run::warm`).
    pub identity: (FileKey, FileKey),
}

/// The manifest of a run, from the bytes of the file at `path`: a
/// `skill.json`, or one `tool` of a `SKILL.md` (by file name). Shared by
/// the plan and the server's pre-admission check.
///
/// # Errors
///
/// [`PlanError::NotAManifest`], [`PlanError::Manifest`],
/// [`PlanError::SkillMd`] or [`PlanError::Tool`].
pub fn parse_manifest(
    path: &Path,
    bytes: &[u8],
    tool: Option<&str>,
    opts: &ValidateOptions,
) -> Result<Manifest, PlanError> {
    if !policy::is_manifest_path(path) {
        return Err(PlanError::NotAManifest { path: path.to_owned() });
    }
    let is_skill_md = path.file_name().is_some_and(|n| n == SKILL_MD_FILE_NAME);
    match (is_skill_md, tool) {
        (false, None) => Manifest::from_slice(bytes, opts)
            .map_err(|source| PlanError::Manifest { path: path.to_owned(), source }),
        (true, Some(tool)) => {
            let skill_md_err = |source| PlanError::SkillMd { path: path.to_owned(), source };
            let skill = SkillMd::from_slice(bytes, opts).map_err(skill_md_err)?;
            Ok(skill.tool(tool).map_err(skill_md_err)?.manifest().clone())
        }
        // A tool of an MCP server pack: the pack's manifest (its server
        // checks the tool's name against what it listed).
        (false, Some(_)) => match Manifest::from_slice(bytes, opts) {
            Ok(m) if m.mcp().is_some() => Ok(m),
            Ok(_) => Err(PlanError::Tool {
                path: path.to_owned(),
                reason: "a tool is only meaningful for a SKILL.md or an MCP server pack",
            }),
            Err(source) => Err(PlanError::Manifest { path: path.to_owned(), source }),
        },
        (true, None) => {
            Err(PlanError::Tool { path: path.to_owned(), reason: "a SKILL.md needs a tool" })
        }
    }
}

/// The bytes of an open manifest from its start (whatever was read from
/// it before), up to one past the limit (which the parser refuses).
pub fn read_manifest(mut file: &fs::File) -> std::io::Result<Vec<u8>> {
    let len = file.metadata().map_or(0, |m| m.len()).min(MAX_MANIFEST_BYTES + 1);
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0) + 1);
    file.rewind()?;
    file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A manifest opened for a run and where it lies: its canonical path and
/// folder, and the allow-list root it is under, among the canonical roots
/// that the entry is checked against next. The file stays open, so what
/// was checked is what is read, by the server's pre-admission check and
/// then by the plan ([`Plan::build_located`]).
#[derive(Debug)]
pub struct Located {
    file: fs::File,
    path: PathBuf,
    skill_dir: PathBuf,
    roots: Vec<PathBuf>,
    root: PathBuf,
    /// The manifest as parsed from this file ([`Located::parsed_as`]).
    parsed: Option<Arc<Manifest>>,
}

impl Located {
    /// Opens the manifest at `path` and finds the root it lies under among
    /// `roots`, each resolved now (a root created after start-up counts, a
    /// root turned into a symlink is followed). No roots: its own folder
    /// is its root (a one-shot `ongrid-executor run`).
    ///
    /// # Errors
    ///
    /// [`PlanError::Read`] or [`PlanError::OutsideRoots`].
    pub fn open(roots: &[PathBuf], path: &Path) -> Result<Located, PlanError> {
        let Resolved { file, path: canonical } = Resolved::open(path, Open::Read)
            .map_err(|error| PlanError::Read { path: path.to_owned(), error })?;
        let skill_dir = canonical.parent().map(Path::to_path_buf).unwrap_or_else(|| "/".into());
        let roots: Vec<PathBuf> = if roots.is_empty() {
            vec![skill_dir.clone()]
        } else {
            roots.iter().filter_map(|r| resolve::canonicalize(r).ok()).collect()
        };
        let Some(root) = roots.iter().find(|r| policy::path::is_within(&canonical, r)).cloned()
        else {
            return Err(PlanError::OutsideRoots { path: canonical });
        };
        Ok(Located { file, path: canonical, skill_dir, roots, root, parsed: None })
    }

    /// Hands the plan the manifest already parsed from this open file (by
    /// a caller that identified the file's content by its device, inode,
    /// size, mtime and ctime, with the plan's tool and options): the plan
    /// then neither reads nor parses it again.
    #[must_use]
    pub fn parsed_as(mut self, manifest: Arc<Manifest>) -> Self {
        self.parsed = Some(manifest);
        self
    }

    /// The manifest's canonical path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open manifest.
    pub fn file(&self) -> &fs::File {
        &self.file
    }

    /// Reads the open file (not the path again) and parses it: one `tool`
    /// of a `SKILL.md`, or with `None` a `skill.json` ([`parse_manifest`]);
    /// also returns the digest of the bytes read.
    ///
    /// # Errors
    ///
    /// [`PlanError::Read`] naming the canonical path, else what
    /// [`parse_manifest`] says.
    pub fn parse(
        &self,
        tool: Option<&str>,
        opts: &ValidateOptions,
    ) -> Result<(Manifest, ManifestDigest), PlanError> {
        let bytes = read_manifest(&self.file)
            .map_err(|error| PlanError::Read { path: self.path.clone(), error })?;
        let manifest = parse_manifest(&self.path, &bytes, tool, opts)?;
        Ok((manifest, ManifestDigest::of(&bytes)))
    }
}

/// The executor's effective uid, read once (it never changes).
pub fn euid() -> u32 {
    static EUID: OnceLock<u32> = OnceLock::new();
    *EUID.get_or_init(|| nix::unistd::geteuid().as_raw())
}

/// Whether `args` is one JSON object with unique keys ([`policy::Args`]):
/// the skill reads these bytes, so they are checked by the same rules as
/// the loader's copy, whoever sent them.
fn args_object(args: &[u8]) -> Result<(), String> {
    match policy::Args::from_slice(args) {
        Ok(_) => Ok(()),
        Err(ArgsError::NotJson(e)) => Err(format!("not JSON: {e}")),
        Err(ArgsError::NotObject) => Err("not a JSON object".into()),
        Err(ArgsError::DuplicateKey(k)) => {
            Err(format!("the key {k:?} is given twice in one object"))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// `(uid, primary gid)` of the user `name`, through NSS.
///
/// Looked up once and kept while `/etc/passwd` stays the same file with the
/// same mtime and size, for at most [`USER_CACHE_TTL`] (other NSS sources),
/// instead of a `getpwnam` (open, read and parse `/etc/passwd`) or two per
/// run. A missing user is looked up again every time. `stamp` is
/// [`passwd_stamp`], taken once per plan for all its lookups.
fn user(name: &str, stamp: Option<PasswdStamp>) -> Option<(u32, u32)> {
    type Entry = (Instant, Option<PasswdStamp>, (u32, u32));
    static CACHE: Mutex<BTreeMap<String, Entry>> = Mutex::new(BTreeMap::new());
    let now = Instant::now();
    let lock = || CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((at, s, ids)) = lock().get(name) {
        if stamp.is_some() && *s == stamp && now.duration_since(*at) < USER_CACHE_TTL {
            return Some(*ids);
        }
    }
    let found =
        nix::unistd::User::from_name(name).ok().flatten().map(|u| (u.uid.as_raw(), u.gid.as_raw()));
    match found {
        Some(ids) => lock().insert(name.to_owned(), (now, stamp, ids)),
        None => lock().remove(name),
    };
    found
}

/// How long a user lookup is reused at most.
pub const USER_CACHE_TTL: Duration = Duration::from_secs(10);

type PasswdStamp = (u64, u64, i64, i64, u64);

fn passwd_stamp() -> Option<PasswdStamp> {
    fs::metadata("/etc/passwd")
        .ok()
        .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
}

fn uid_of(name: &str, stamp: Option<PasswdStamp>) -> Option<u32> {
    user(name, stamp).map(|(uid, _)| uid)
}

impl Plan {
    /// Validates the request for the `skill.json` at `manifest_path`,
    /// read and parsed now (a served or engine run goes through
    /// `run::parsed::ParsedManifests::locate` and
    /// [`Plan::build_located`] instead, parsing once per file content).
    ///
    /// # Errors
    ///
    /// [`PlanError`]; see [`PlanError::outcome`].
    pub fn build(
        config: &Config,
        manifest_path: &Path,
        args: Vec<u8>,
        env: &[(OsString, OsString)],
    ) -> Result<Plan, PlanError> {
        let located = Located::open(&config.roots, manifest_path)?;
        Self::build_located(config, located, None, args, env)
    }

    /// Validates the request for one `tool` of a `SKILL.md` (or, with
    /// `None`, a `skill.json`: [`parse_manifest`]) already opened and placed
    /// under its root ([`Located::open`] with `config.roots`), parsed then
    /// unless the parse is attached ([`Located::parsed_as`]).
    ///
    /// # Errors
    ///
    /// [`PlanError`]; see [`PlanError::outcome`].
    pub fn build_located(
        config: &Config,
        located: Located,
        tool: Option<&str>,
        args: Vec<u8>,
        env: &[(OsString, OsString)],
    ) -> Result<Plan, PlanError> {
        Self::build_kind(config, located, tool, args, env, PackKind::Skill)
    }

    /// Validates the start of the MCP server of a `"kind": "mcp"` pack
    /// already opened and placed under its root, as [`Plan::build_located`]
    /// validates a run (entry, owners, grant, run-as user); the plan's
    /// args are empty, its environment the allowed names set in `env`.
    ///
    /// # Errors
    ///
    /// [`PlanError`]; a pack that is not an MCP pack is
    /// [`PlanError::Tool`].
    pub fn build_server(
        config: &Config,
        located: Located,
        env: &[(OsString, OsString)],
    ) -> Result<Plan, PlanError> {
        Self::build_kind(config, located, None, b"{}".to_vec(), env, PackKind::Mcp)
    }

    fn build_kind(
        config: &Config,
        mut located: Located,
        tool: Option<&str>,
        args: Vec<u8>,
        env: &[(OsString, OsString)],
        kind: PackKind,
    ) -> Result<Plan, PlanError> {
        let manifest = match located.parsed.take() {
            // Parsed from this very file (same inode, size, mtime, ctime),
            // for this tool and these options (`run::parsed`).
            Some(parsed) => parsed,
            None => {
                let opts = ValidateOptions { max_timeout: config.max_timeout() };
                Arc::new(located.parse(tool, &opts)?.0)
            }
        };
        // The executor decides what a pack is run as: an MCP pack's entry
        // is a server, never run with a skill's args on its stdin.
        let is_mcp = manifest.mcp().is_some();
        if is_mcp != (kind == PackKind::Mcp) {
            let reason = if is_mcp {
                "an MCP server pack is not a one-shot skill: call one of its tools"
            } else {
                "not an MCP server pack (\"kind\": \"mcp\")"
            };
            return Err(PlanError::Tool { path: located.path, reason });
        }
        let Located { file, path: canonical, skill_dir, roots, root, parsed: _ } = located;
        let manifest_meta =
            file.metadata().map_err(|error| PlanError::Read { path: canonical.clone(), error })?;
        let manifest_key = FileKey::of(&manifest_meta);
        drop(file);
        let skill = manifest.name().to_string();
        let entry_err = |path: &Path, reason: String| PlanError::Entry {
            skill: skill.clone(),
            path: path.to_owned(),
            reason,
        };

        // The entry: canonical, under a root, a regular executable file.
        let written = Path::new(manifest.entry());
        let joined =
            if written.is_absolute() { written.to_owned() } else { skill_dir.join(written) };
        let Resolved { file: entry_file, path: entry } =
            Resolved::open(&joined, Open::Path).map_err(|e| entry_err(&joined, e.to_string()))?;
        let Some(entry_root) = roots.iter().find(|r| policy::path::is_within(&entry, r)) else {
            return Err(PlanError::Escapes { skill, entry, root });
        };
        let meta = entry_file.metadata().map_err(|e| entry_err(&entry, e.to_string()))?;
        let entry_key = FileKey::of(&meta);
        drop(entry_file);
        if !meta.is_file() {
            return Err(entry_err(&entry, "not a regular file".into()));
        }
        if meta.mode() & 0o111 == 0 {
            return Err(entry_err(&entry, "not executable".into()));
        }

        // Ownership of the entry, the manifest and every folder up to their
        // roots, and of every folder the entry's path is resolved through
        // where it reaches the entry through a symlink.
        let stamp = passwd_stamp();
        let owners = Self::owners(config, stamp);
        owners.chain(&entry, &meta, entry_root, |_| false).map_err(|(p, r)| entry_err(&p, r))?;
        if joined != entry {
            owners.walked(&joined, &roots).map_err(|(p, r)| entry_err(&p, r))?;
        }
        let entry_chain = |p: &Path| entry.starts_with(p) && p.starts_with(entry_root);
        owners.chain(&canonical, &manifest_meta, &root, entry_chain).map_err(
            |(path, reason)| PlanError::ManifestOwner { skill: skill.clone(), path, reason },
        )?;

        let grant = config.skills.get(manifest.name().as_str());
        if let Some(pinned) = grant.and_then(|g| g.manifest.as_deref()) {
            if !same_file_path(pinned, &canonical) {
                return Err(PlanError::NotPinned {
                    skill,
                    path: canonical,
                    pinned: pinned.to_owned(),
                });
            }
        }
        let granted = manifest.sandbox().authorize(manifest.name(), grant, &config.limits)?;
        if let Err(reason) = args_object(&args) {
            return Err(PlanError::Args { skill, reason });
        }

        let env = policy::env::filter(
            manifest.env_allow(),
            env.iter().map(|(k, v)| (k.as_os_str(), v.as_os_str())),
        );

        let run_as = Self::run_as(config, &granted, stamp)?;
        Ok(Plan {
            manifest,
            manifest_path: canonical,
            skill_dir,
            root: entry_root.clone(),
            entry,
            granted,
            env,
            args,
            run_as,
            identity: (manifest_key, entry_key),
        })
    }

    /// Who may own the files a run is read from: `entry_owners` and the
    /// executor's own user.
    fn owners(config: &Config, stamp: Option<PasswdStamp>) -> Owners<'_> {
        let mut uids: Vec<u32> =
            config.entry_owners.iter().filter_map(|n| uid_of(n, stamp)).collect();
        uids.push(euid());
        Owners::new(uids, &config.entry_owners)
    }

    fn run_as(
        config: &Config,
        granted: &GrantedSandbox,
        stamp: Option<PasswdStamp>,
    ) -> Result<RunAs, PlanError> {
        let euid = nix::unistd::Uid::from_raw(euid());
        if !euid.is_root() {
            let gid = nix::unistd::getegid().as_raw();
            let name = nix::unistd::User::from_uid(euid)
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| euid.to_string());
            return Ok(RunAs { name, uid: euid.as_raw(), gid, switch: false, dedicated: false });
        }
        let name = granted.run_as.clone().unwrap_or_else(|| config.run_as.clone());
        let (uid, gid) =
            user(&name, stamp).ok_or_else(|| PlanError::UnknownUser { user: name.clone() })?;
        let dedicated = name == config.run_as && uid != 0;
        Ok(RunAs { name, uid, gid, switch: true, dedicated })
    }
}

/// Whether the pinned manifest path `pinned` names the file at the
/// canonical path `canonical`: the same path, or one whose symlinks
/// resolve to it (resolved only when the two differ).
fn same_file_path(pinned: &Path, canonical: &Path) -> bool {
    pinned == canonical || fs::canonicalize(pinned).is_ok_and(|p| p == canonical)
}

mod owners;
#[cfg(test)]
mod tests;
