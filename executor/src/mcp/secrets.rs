//! An MCP pack's secrets: the operator's `env_file`
//! (`[skills.NAME] env_file` in `executor.toml`), read by the executor
//! when it starts the pack's server.
//!
//! The file must be a regular file (not followed through a symlink), owned
//! by root (or by the executor's own user when it is not root), with no
//! group or other permission bit (mode 0600 or stricter), at most
//! [`MAX_ENV_FILE_BYTES`]. Lines are `NAME=VALUE`; blank lines and lines
//! starting with `#` are skipped; a value is taken verbatim to the end of
//! its line (no quoting, no expansion). No error, log line or `Debug`
//! output carries a value: errors name the file and the line number only.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use policy::EnvName;

/// Largest env file read, bytes.
pub const MAX_ENV_FILE_BYTES: u64 = 64 << 10;

/// Why an env file cannot be used. Never holds a value from the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretsError {
    /// It cannot be opened or read (missing, a symlink, unreadable).
    #[error("env file {path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Not a regular file, wrong owner, or readable by others.
    #[error("env file {path}: {reason}")]
    Unsafe {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A line that is not `NAME=VALUE` with a valid name.
    #[error("env file {path}: line {line}: {reason}")]
    Line {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong (never the value).
        reason: &'static str,
    },
}

/// The variables of one env file, in file order (a later line for a name
/// replaces an earlier one). Its `Debug` lists the names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    vars: Vec<(EnvName, String)>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.vars.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Secrets").field("names", &names).finish_non_exhaustive()
    }
}

impl Secrets {
    /// The names and values.
    pub fn vars(&self) -> &[(EnvName, String)] {
        &self.vars
    }

    /// Whether `name` is set here.
    pub fn has(&self, name: &str) -> bool {
        self.vars.iter().any(|(n, _)| n.as_str() == name)
    }

    /// Reads and checks the file at `path`; `owner` is the uid it must
    /// belong to (root, or the executor's own uid when it is not root).
    ///
    /// # Errors
    ///
    /// [`SecretsError`], naming the file and, for a bad line, its number.
    pub fn read(path: &Path, owner: u32) -> Result<Self, SecretsError> {
        let read_err = |source| SecretsError::Read { path: path.to_owned(), source };
        let unsafe_err = |reason: String| SecretsError::Unsafe { path: path.to_owned(), reason };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(read_err)?;
        let meta = file.metadata().map_err(read_err)?;
        if !meta.is_file() {
            return Err(unsafe_err("not a regular file".to_owned()));
        }
        if meta.uid() != owner {
            return Err(unsafe_err(format!("owned by uid {}, not by uid {owner}", meta.uid())));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(unsafe_err(format!(
                "mode {:o} lets others in (want 0600)",
                meta.mode() & 0o7777
            )));
        }
        if meta.len() > MAX_ENV_FILE_BYTES {
            return Err(unsafe_err(format!("larger than {MAX_ENV_FILE_BYTES} bytes")));
        }
        let mut text = String::new();
        file.take(MAX_ENV_FILE_BYTES).read_to_string(&mut text).map_err(read_err)?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Self, SecretsError> {
        let mut vars: Vec<(EnvName, String)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let bad = |reason| SecretsError::Line { path: path.to_owned(), line: i + 1, reason };
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let Some((name, value)) = trimmed.split_once('=') else {
                return Err(bad("not NAME=VALUE"));
            };
            let name = EnvName::new(name.trim_end())
                .map_err(|_| bad("not a valid or allowed variable name"))?;
            let value = value.strip_suffix('\r').unwrap_or(value);
            if value.contains('\0') {
                return Err(bad("the value contains a NUL byte"));
            }
            vars.retain(|(n, _)| n != &name);
            vars.push((name, value.to_owned()));
        }
        Ok(Secrets { vars })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const SECRET: &str = "s3cr3t-value-do-not-log";

    fn write(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let p = dir.join("pack.env");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn me() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    #[test]
    fn names_and_values_are_read_and_debug_shows_names_only() {
        let t = tempfile::tempdir().unwrap();
        let text = format!("# comment\n\nAPI_TOKEN={SECRET}\nURL = x\nAPI_TOKEN={SECRET}2\r\n");
        let p = write(t.path(), &text, 0o600);
        let s = Secrets::read(&p, me()).unwrap();
        let got: Vec<(&str, &str)> =
            s.vars().iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(got, [("URL", " x"), ("API_TOKEN", &*format!("{SECRET}2"))]);
        assert!(s.has("URL") && !s.has("OTHER"));
        let debug = format!("{s:?}");
        assert!(debug.contains("API_TOKEN") && !debug.contains(SECRET), "{debug}");
    }

    #[test]
    fn an_unsafe_file_is_refused_without_its_contents_in_the_error() {
        let t = tempfile::tempdir().unwrap();
        let open = write(t.path(), &format!("A={SECRET}\n"), 0o640);
        let e = Secrets::read(&open, me()).unwrap_err().to_string();
        assert!(e.contains("mode 640") && !e.contains(SECRET), "{e}");
        let owned = write(t.path(), &format!("A={SECRET}\n"), 0o600);
        let e = Secrets::read(&owned, me().wrapping_add(1)).unwrap_err().to_string();
        assert!(e.contains("owned by uid") && !e.contains(SECRET), "{e}");
        let link = t.path().join("link.env");
        std::os::unix::fs::symlink(&owned, &link).unwrap();
        assert!(matches!(Secrets::read(&link, me()), Err(SecretsError::Read { .. })));
        let missing = Secrets::read(&t.path().join("none"), me()).unwrap_err();
        assert!(matches!(missing, SecretsError::Read { .. }));
    }

    #[test]
    fn a_bad_line_is_named_by_number_never_by_value() {
        let t = tempfile::tempdir().unwrap();
        for text in [format!("A=1\n{SECRET}\n"), format!("A=1\nLD_PRELOAD={SECRET}\n")] {
            let p = write(t.path(), &text, 0o600);
            let e = Secrets::read(&p, me()).unwrap_err().to_string();
            assert!(e.contains("line 2") && !e.contains(SECRET), "{e}");
        }
    }
}
