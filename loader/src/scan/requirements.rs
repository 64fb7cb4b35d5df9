//! Checking a SKILL.md's requirements against this host: `metadata.os`,
//! `metadata.requires.bins` (on the loader's `PATH`), `.config` (files
//! that exist) and `.env` (variables set in the loader's environment).
//!
//! A skill with an unmet requirement is not registered; the scan logs
//! `skill loader: skill "NAME" from PATH: requirement not met: REASON`
//! with the first unmet one, and `ongrid-skill check` prints them all.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use policy::skillmd::Requirements;
use serde::Serialize;

/// The operating system this loader runs on, as `metadata.os` names it.
pub const HOST_OS: &str = std::env::consts::OS;

/// One requirement and whether this host meets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `os`, `bin`, `config` or `env`.
    pub kind: &'static str,
    /// What is required: the OS list, the program, the file or the name.
    pub value: String,
    /// Where it was found (a bin's path), when met.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found: Option<String>,
    /// Met or not.
    pub met: bool,
    /// Why an unmet one could not be checked (a config file whose status
    /// cannot be read: `permission denied`), rather than found missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl fmt::Display for Check {
    /// The reason of an unmet requirement, as logged (`bin "jq" not found
    /// on PATH`), or the met one (`bin "jq" found at /usr/bin/jq`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.met) {
            ("os", true) => write!(f, "os {HOST_OS:?} is one of {}", self.value),
            ("os", false) => write!(f, "os {HOST_OS:?} is not one of {}", self.value),
            ("bin", true) => {
                write!(f, "bin {:?} found at {}", self.value, self.found.as_deref().unwrap_or("?"))
            }
            ("bin", false) => write!(f, "bin {:?} not found on PATH", self.value),
            ("config", true) => write!(f, "config {:?} present", self.value),
            ("config", false) => match &self.error {
                Some(e) => write!(f, "config {:?} cannot be checked: {e}", self.value),
                None => write!(f, "config {:?} not found", self.value),
            },
            (_, true) => write!(f, "env {:?} set", self.value),
            (_, false) => write!(f, "env {:?} not set", self.value),
        }
    }
}

/// Where the checks look: the environment (for `PATH` and `env`), from
/// the process by default.
pub trait Environment {
    /// The value of the variable `name`.
    fn var(&self, name: &str) -> Option<OsString>;
}

/// The loader process's own environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Environment for ProcessEnv {
    fn var(&self, name: &str) -> Option<OsString> {
        std::env::var_os(name)
    }
}

/// Checks every requirement of a skill whose folder is `dir`, in the
/// order `os`, `bins`, `config`, `env`.
pub fn check(req: &Requirements, dir: &Path, env: &dyn Environment) -> Vec<Check> {
    let mut checks = Vec::new();
    if !req.os.is_empty() {
        let met = req.os.iter().any(|o| o.eq_ignore_ascii_case(HOST_OS));
        let value = format!("{:?}", req.os);
        checks.push(Check { kind: "os", value, found: None, met, error: None });
    }
    let path = env.var("PATH");
    for bin in &req.bins {
        let found = find_bin(bin, path.as_deref());
        let met = found.is_some();
        let found = found.map(|p| p.display().to_string());
        checks.push(Check { kind: "bin", value: bin.clone(), found, met, error: None });
    }
    for config in &req.config {
        let p = Path::new(config);
        let full = if p.is_absolute() { p.to_path_buf() } else { dir.join(p) };
        // Only a file that is not there is "not found": one behind a
        // folder the loader may not search may well be there.
        let (met, error) = match full.metadata() {
            Ok(_) => (true, None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => (false, None),
            Err(e) => (false, Some(e.kind().to_string())),
        };
        checks.push(Check { kind: "config", value: config.clone(), found: None, met, error });
    }
    for name in &req.env {
        let met = env.var(name.as_str()).is_some();
        let value = name.as_str().to_owned();
        checks.push(Check { kind: "env", value, found: None, met, error: None });
    }
    checks
}

fn is_executable_file(p: &Path) -> bool {
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `bin` as an absolute path, or the first executable `DIR/bin` for the
/// absolute directories of `path` (relative ones are ignored).
pub fn find_bin(bin: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    if bin.starts_with('/') {
        return is_executable_file(Path::new(bin)).then(|| PathBuf::from(bin));
    }
    if bin.is_empty() || bin.contains('/') {
        return None;
    }
    std::env::split_paths(path?)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(bin))
        .find(|c| is_executable_file(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Fake(HashMap<&'static str, OsString>);
    impl Environment for Fake {
        fn var(&self, name: &str) -> Option<OsString> {
            self.0.get(name).cloned()
        }
    }

    #[test]
    fn each_kind_met_and_unmet() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("local.conf"), "").unwrap();
        let env = Fake(HashMap::from([
            ("PATH", OsString::from("relative:/nonexistent:/bin:/usr/bin")),
            ("TOKEN", OsString::from("x")),
        ]));
        let req = Requirements {
            os: vec!["Linux".into(), "darwin".into()],
            bins: vec!["sh".into(), "jq-not-here".into(), "/bin/sh".into()],
            config: vec!["local.conf".into(), "/nonexistent/x.conf".into()],
            env: vec![
                policy::EnvName::new("TOKEN").unwrap(),
                policy::EnvName::new("NOPE").unwrap(),
            ],
        };
        let checks = check(&req, dir.path(), &env);
        let met: Vec<bool> = checks.iter().map(|c| c.met).collect();
        assert_eq!(met, [true, true, false, true, true, false, true, false]);
        assert_eq!(checks[2].to_string(), "bin \"jq-not-here\" not found on PATH");
        assert_eq!(checks[5].to_string(), "config \"/nonexistent/x.conf\" not found");
        assert_eq!(checks[7].to_string(), "env \"NOPE\" not set");
        let other = Requirements { os: vec!["windows".into()], ..Requirements::default() };
        let c = &check(&other, dir.path(), &env)[0];
        assert!(!c.met);
        assert_eq!(c.to_string(), "os \"linux\" is not one of [\"windows\"]");
        // No PATH at all: nothing is found.
        assert_eq!(find_bin("sh", None), None);
    }

    /// A config file whose status cannot be read is not said to be
    /// missing: a symlink loop (ELOOP, as root too) and, when not root, a
    /// file in a folder the loader may not search (EACCES).
    #[test]
    fn a_config_that_cannot_be_checked_is_not_reported_missing() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("loop.conf", dir.path().join("loop.conf")).unwrap();
        let closed = dir.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        std::fs::write(closed.join("app.conf"), "").unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o000)).unwrap();
        let req = Requirements {
            config: vec!["loop.conf".into(), "closed/app.conf".into(), "absent.conf".into()],
            ..Requirements::default()
        };
        let checks = check(&req, dir.path(), &Fake(HashMap::new()));
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(checks.iter().all(|c| !c.met || c.value == "closed/app.conf"), "{checks:?}");
        assert_eq!(
            checks[0].to_string(),
            "config \"loop.conf\" cannot be checked: filesystem loop or indirection limit (e.g. \
             symlink loop)"
        );
        assert_eq!(checks[2].to_string(), "config \"absent.conf\" not found");
        assert_eq!(checks[2].error, None);
        if nix::unistd::geteuid().is_root() {
            // Root searches any folder: the file is there.
            assert!(checks[1].met, "{checks:?}");
        } else {
            assert_eq!(
                checks[1].to_string(),
                "config \"closed/app.conf\" cannot be checked: permission denied"
            );
        }
        let json = serde_json::to_value(&checks[0]).unwrap();
        assert_eq!(json["error"], "filesystem loop or indirection limit (e.g. symlink loop)");
        assert!(serde_json::to_value(&checks[2]).unwrap().get("error").is_none());
    }
}
