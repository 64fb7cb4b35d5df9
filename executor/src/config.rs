//! `executor.toml`: the operator's configuration, owned by root.
//!
//! Every field is optional; an unknown field is an error (a typo in a
//! security configuration must not be ignored). See
//! `packaging/executor.toml` for a commented example.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use policy::{Limits, SkillGrant};
use serde::Deserialize;

/// Default user skills run as when the executor is root.
pub const DEFAULT_RUN_AS: &str = "ongrid-skill";
/// Default runtime directory when the executor is root.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/ongrid";
/// Default system-wide configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ongrid/executor.toml";

/// Whether Landlock's ABI 1 filesystem rights are a hard requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LandlockMode {
    /// A kernel without Landlock fails every run with `sandbox_failed`.
    #[default]
    Required,
    /// Run without (or with partial) Landlock and say so in the report.
    BestEffort,
}

/// The parsed `executor.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// User skills run as when the executor is root.
    pub run_as: String,
    /// Allow-list roots; empty = for `run`, the manifest's folder.
    pub roots: Vec<PathBuf>,
    /// Per-run directories live under `<runtime_dir>/runs/`.
    pub runtime_dir: Option<PathBuf>,
    /// Landlock requirement.
    pub landlock: LandlockMode,
    /// Longest timeout a manifest may ask for (longer ones are clamped).
    pub max_timeout_seconds: u64,
    /// Users that may own an entry and its folders (plus the executor's own user).
    pub entry_owners: Vec<String>,
    /// Default limits of every run.
    pub limits: Limits,
    /// What each skill may ask for beyond the default box, by skill name.
    pub skills: BTreeMap<String, SkillGrant>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            run_as: DEFAULT_RUN_AS.to_owned(),
            roots: Vec::new(),
            runtime_dir: None,
            landlock: LandlockMode::Required,
            max_timeout_seconds: policy::limits::DEFAULT_MAX_TIMEOUT.as_secs(),
            entry_owners: vec!["root".to_owned()],
            limits: Limits::default(),
            skills: BTreeMap::new(),
        }
    }
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("config {path}: cannot read")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for [`Config`].
    #[error("config {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A value is out of range.
    #[error("config {path}: {field}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl Config {
    /// Reads and validates `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the file and field.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text` (`path` is for messages).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the file and field.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: path.to_owned(), source: Box::new(e) })?;
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid =
            |field, reason: String| ConfigError::Invalid { path: path.to_owned(), field, reason };
        if self.run_as.is_empty() {
            return Err(invalid("run_as", "empty user name".to_owned()));
        }
        for root in &self.roots {
            let s = root.to_string_lossy();
            policy::path::absolute_normal(&s).map_err(|e| invalid("roots", e.to_string()))?;
        }
        if let Some(dir) = &self.runtime_dir {
            policy::path::absolute_normal(&dir.to_string_lossy())
                .map_err(|e| invalid("runtime_dir", e.to_string()))?;
        }
        if self.max_timeout_seconds == 0 {
            return Err(invalid("max_timeout_seconds", "must be at least 1".to_owned()));
        }
        for name in self.skills.keys() {
            policy::SkillName::new(name)
                .map_err(|e| invalid("skills", format!("[skills.{name}]: {e}")))?;
        }
        for (name, grant) in &self.skills {
            for cap in &grant.capabilities {
                if policy::sandbox::capability_number(cap).is_none() {
                    return Err(invalid(
                        "skills",
                        format!("[skills.{name}] capabilities: unknown capability {cap:?}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Longest timeout a manifest may ask for.
    pub fn max_timeout(&self) -> Duration {
        Duration::from_secs(self.max_timeout_seconds)
    }

    /// The runtime directory: the configured one, else `/run/ongrid` as
    /// root, else `$XDG_RUNTIME_DIR/ongrid` or `/tmp/ongrid-$UID`.
    pub fn runtime_dir(&self) -> PathBuf {
        if let Some(dir) = &self.runtime_dir {
            return dir.clone();
        }
        let uid = nix::unistd::geteuid();
        if uid.is_root() {
            return PathBuf::from(DEFAULT_RUNTIME_DIR);
        }
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(x) if Path::new(&x).is_absolute() => Path::new(&x).join("ongrid"),
            _ => PathBuf::from(format!("/tmp/ongrid-{uid}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_default() {
        let c = Config::parse("", Path::new("x.toml")).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.landlock, LandlockMode::Required);
    }

    #[test]
    fn full_example_parses() {
        let text = r#"
            run_as = "nobody"
            roots = ["/etc/ongrid/skills"]
            runtime_dir = "/run/ongrid"
            landlock = "best-effort"
            max_timeout_seconds = 60
            entry_owners = ["root", "bin"]
            [limits]
            max_pids = 32
            [skills.netprobe]
            network = true
            capabilities = ["CAP_NET_RAW"]
        "#;
        let c = Config::parse(text, Path::new("x.toml")).unwrap();
        assert_eq!(c.landlock, LandlockMode::BestEffort);
        assert_eq!(c.limits.max_pids, 32);
        assert_eq!(c.limits.nofile, Limits::default().nofile);
        assert!(c.skills["netprobe"].network);
    }

    #[test]
    fn unknown_and_bad_fields_are_errors() {
        for (text, needle) in [
            ("runas = \"x\"", "unknown field"),
            ("[limits]\nmax_pid = 3", "unknown field"),
            ("roots = [\"rel/dir\"]", "roots"),
            ("max_timeout_seconds = 0", "max_timeout_seconds"),
            ("[skills.Bad-Name]", "skills"),
            ("[skills.x]\ncapabilities = [\"CAP_NOPE\"]", "CAP_NOPE"),
            ("landlock = \"maybe\"", "landlock"),
        ] {
            let e = Config::parse(text, Path::new("x.toml")).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
