//! Allow-list roots: parsing `ONGRID_SKILLS_EXTERNAL_DIRS` and resolving
//! each root to the canonical directory that is walked.
//!
//! Parsing is pure and keeps every non-empty part, relative ones included:
//! the scan decides what to skip so that every skip gets its log line.

use std::io;
use std::path::{Path, PathBuf};

/// The environment variable that lists the allow-list roots.
pub const ENV_VAR: &str = "ONGRID_SKILLS_EXTERNAL_DIRS";

/// Splits an allow-list value on `:`, `,` and `;`, trims whitespace around
/// each part and drops empty parts. Relative parts are kept (the scan skips
/// them with a log line).
///
/// # Examples
///
/// ```
/// use std::path::PathBuf;
/// let roots = loader::scan::roots::parse_dirs(" /a : /b,, ;rel ");
/// assert_eq!(roots, [PathBuf::from("/a"), PathBuf::from("/b"), PathBuf::from("rel")]);
/// ```
pub fn parse_dirs(value: &str) -> Vec<PathBuf> {
    value
        .split([':', ',', ';'])
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// The roots listed in [`ENV_VAR`], parsed with [`parse_dirs`]; empty when
/// the variable is unset. A value that is not UTF-8 is read lossily (its
/// roots then do not exist and are skipped with a log line).
pub fn from_env() -> Vec<PathBuf> {
    std::env::var_os(ENV_VAR).map(|v| parse_dirs(&v.to_string_lossy())).unwrap_or_default()
}

/// Why a root is not walked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RootError {
    /// The root is a relative path; only absolute roots are allowed.
    #[error("is not an absolute path")]
    Relative,
    /// The root (or the target of the symlink it is) does not exist.
    #[error("does not exist")]
    Missing,
    /// The root resolves to something other than a directory.
    #[error("is not a directory")]
    NotADirectory,
    /// Resolving the root failed (a symlink loop, a permission error).
    #[error("cannot be resolved: {0}")]
    Resolve(#[source] io::Error),
}

/// Resolves `root` to its canonical directory: a root that is a symlink is
/// resolved first, so the walk starts from a real directory.
///
/// # Errors
///
/// [`RootError`] when the root is relative, missing, not a directory, or
/// cannot be resolved.
pub fn resolve(root: &Path) -> Result<PathBuf, RootError> {
    if !root.is_absolute() {
        return Err(RootError::Relative);
    }
    let canonical = std::fs::canonicalize(root).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => RootError::Missing,
        _ => RootError::Resolve(e),
    })?;
    let meta = std::fs::metadata(&canonical).map_err(RootError::Resolve)?;
    if !meta.is_dir() {
        return Err(RootError::NotADirectory);
    }
    Ok(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_dirs_table() {
        let cases: &[(&str, &[&str])] = &[
            ("", &[]),
            ("   ", &[]),
            (":,;", &[]),
            ("/a", &["/a"]),
            ("/a:/b", &["/a", "/b"]),
            ("/a,/b", &["/a", "/b"]),
            ("/a;/b", &["/a", "/b"]),
            ("/a:/b,/c;/d", &["/a", "/b", "/c", "/d"]),
            ("  /a  :\t/b\n", &["/a", "/b"]),
            ("/a::/b", &["/a", "/b"]),
            (",/a,", &["/a"]),
            ("rel:/abs", &["rel", "/abs"]),
            ("/with space/x", &["/with space/x"]),
        ];
        for (input, want) in cases {
            let got = parse_dirs(input);
            let want: Vec<PathBuf> = want.iter().map(PathBuf::from).collect();
            assert_eq!(got, want, "input {input:?}");
        }
    }

    #[test]
    fn resolve_rejects_relative_and_missing() {
        assert!(matches!(resolve(Path::new("skills")), Err(RootError::Relative)));
        assert!(matches!(resolve(Path::new("./skills")), Err(RootError::Relative)));
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(matches!(resolve(&missing), Err(RootError::Missing)));
    }

    #[test]
    fn resolve_follows_root_symlink_and_rejects_files() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let want = std::fs::canonicalize(&real).unwrap();
        assert_eq!(resolve(&link).unwrap(), want);

        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(resolve(&file), Err(RootError::NotADirectory)));

        let looped = dir.path().join("loop");
        std::os::unix::fs::symlink(&looped, &looped).unwrap();
        assert!(matches!(resolve(&looped), Err(RootError::Resolve(_))));
    }
}
