//! Environment variable names a manifest may forward to its skill.
//!
//! The child's environment is built from scratch: exactly the names in
//! `env_allow` that are set in the executor's own environment. Values are the
//! operator's; names that change how the dynamic loader or libc behave are
//! refused, because forwarding them would let the operator's environment
//! (or a compromised unit file) inject code into every run.

use std::fmt;

use serde::Serialize;

/// A validated environment variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most
/// 128 bytes, and not one of [`DENIED_NAMES`] or prefixed by `LD_`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct EnvName(String);

/// Names refused in `env_allow`: glibc's list of variables that are unsafe
/// across a privilege boundary (`UNSECURE_ENVVARS`), minus the `LD_` ones,
/// which are refused by prefix.
pub const DENIED_NAMES: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TMPDIR",
    "TZDIR",
];

/// Why a string cannot be an allowed environment name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvNameError {
    /// Empty, too long, or a character outside `[A-Za-z0-9_]` (or a leading digit).
    #[error("{0:?} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*, at most 128 bytes)")]
    Malformed(String),
    /// A name that changes how the loader or libc behave.
    #[error("{0:?} may not be forwarded: it changes how the dynamic loader or libc behave")]
    Denied(String),
}

impl EnvName {
    /// Validates `s`.
    ///
    /// # Errors
    ///
    /// [`EnvNameError`] for a malformed or denied name.
    pub fn new(s: &str) -> Result<Self, EnvNameError> {
        let mut chars = s.chars();
        let first_ok = matches!(chars.next(), Some('A'..='Z' | 'a'..='z' | '_'));
        if !first_ok || s.len() > 128 || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(EnvNameError::Malformed(s.to_owned()));
        }
        if s.starts_with("LD_") || DENIED_NAMES.contains(&s) {
            return Err(EnvNameError::Denied(s.to_owned()));
        }
        Ok(Self(s.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EnvName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Builds a child environment: the `(name, value)` pairs of `parent` whose
/// name is in `allow`, in `allow` order, set-but-empty values included.
/// Everything else is dropped. Pure: the caller passes its own environment.
pub fn filter<'a, I>(allow: &[EnvName], parent: I) -> Vec<(String, std::ffi::OsString)>
where
    I: IntoIterator<Item = (&'a std::ffi::OsStr, &'a std::ffi::OsStr)>,
{
    let parent: Vec<_> = parent.into_iter().collect();
    allow
        .iter()
        .filter_map(|name| {
            parent
                .iter()
                .rev() // the last definition wins, as getenv(3) sees it
                .find(|(k, _)| *k == std::ffi::OsStr::new(name.as_str()))
                .map(|(_, v)| (name.as_str().to_owned(), v.to_os_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    #[test]
    fn names() {
        for ok in ["PATH", "HOME", "_X", "a1", "LANG", "http_proxy", "X_LD_Y"] {
            assert!(EnvName::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A B", "A=B", "É", "A\n", &"A".repeat(129)] {
            assert!(matches!(EnvName::new(bad), Err(EnvNameError::Malformed(_))), "{bad:?}");
        }
        for denied in ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "TMPDIR"] {
            assert!(matches!(EnvName::new(denied), Err(EnvNameError::Denied(_))), "{denied}");
        }
    }

    #[test]
    fn filter_keeps_only_allowed_and_set() {
        let allow = vec![
            EnvName::new("A").unwrap(),
            EnvName::new("EMPTY").unwrap(),
            EnvName::new("UNSET").unwrap(),
        ];
        let parent = [
            (OsStr::new("A"), OsStr::new("1")),
            (OsStr::new("SECRET"), OsStr::new("s3cr3t")),
            (OsStr::new("EMPTY"), OsStr::new("")),
        ];
        let out = filter(&allow, parent);
        assert_eq!(out, vec![("A".to_owned(), "1".into()), ("EMPTY".to_owned(), "".into())]);
    }

    #[test]
    fn filter_empty_allow_is_empty_env() {
        let parent = [(OsStr::new("PATH"), OsStr::new("/bin"))];
        assert!(filter(&[], parent).is_empty());
    }
}
