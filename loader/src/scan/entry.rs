//! Resolving a manifest's `entry` to the canonical executable it names.
//!
//! Rules: a relative entry is relative to the manifest's
//! folder; the entry is canonicalised (symlinks resolved) and must lie under
//! the canonical allow-list root, compared by path components
//! ([`policy::path::is_within`]); it must exist, be a regular file and have
//! an execute bit. A relative entry must stay under the manifest's own root;
//! an absolute entry may name any root of the scan. Ownership and write
//! bits are the executor's business, not the loader's.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use policy::path::is_within;

/// Why an entry is refused. Its `Display` is the `REASON` of
/// `skill loader: build "NAME": REASON`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EntryError {
    /// The resolved entry lies outside the allow-list root.
    #[error("entry {} escapes allowlist root {}", entry.display(), root.display())]
    Escapes {
        /// The resolved (or, when it does not exist, lexically normalised) entry.
        entry: PathBuf,
        /// The canonical root of the manifest.
        root: PathBuf,
    },
    /// Nothing exists at the entry path.
    #[error("entry {} does not exist", entry.display())]
    Missing {
        /// The entry joined to the manifest's folder.
        entry: PathBuf,
    },
    /// Canonicalising the entry failed for another reason (a symlink loop,
    /// a permission error).
    #[error("entry {} cannot be resolved: {source}", entry.display())]
    Resolve {
        /// The entry joined to the manifest's folder.
        entry: PathBuf,
        /// The error of `realpath`.
        source: io::Error,
    },
    /// The entry is a directory, a FIFO, a device...
    #[error("entry {} is not a regular file", entry.display())]
    NotRegular {
        /// The canonical entry.
        entry: PathBuf,
    },
    /// No execute bit is set.
    #[error("entry {} is not executable (mode {mode:04o})", entry.display())]
    NotExecutable {
        /// The canonical entry.
        entry: PathBuf,
        /// Permission bits of the entry.
        mode: u32,
    },
}

/// Where an entry may point: the manifest's own canonical root, plus every
/// canonical root of the scan for absolute entries.
#[derive(Debug, Clone, Copy)]
pub struct EntryScope<'a> {
    /// Canonical root the manifest was found under.
    pub root: &'a Path,
    /// Canonical roots of the whole scan (may include `root`).
    pub all_roots: &'a [PathBuf],
}

impl EntryScope<'_> {
    fn allows(&self, path: &Path, absolute: bool) -> bool {
        is_within(path, self.root)
            || (absolute && self.all_roots.iter().any(|r| is_within(path, r)))
    }
}

/// Resolves `entry` (as written in the manifest found in `manifest_dir`)
/// to its canonical path, checking every rule above.
///
/// # Errors
///
/// [`EntryError`] naming the entry and what is wrong with it.
pub fn resolve(
    entry: &str,
    manifest_dir: &Path,
    scope: EntryScope<'_>,
) -> Result<PathBuf, EntryError> {
    let written = Path::new(entry);
    let absolute = written.is_absolute();
    let joined = if absolute { written.to_path_buf() } else { manifest_dir.join(written) };

    let canonical = match std::fs::canonicalize(&joined) {
        Ok(c) => c,
        Err(source) => {
            // An entry that does not resolve but clearly points outside is
            // reported as an escape: that is the more useful message.
            let lexical = lexical_normal(&joined);
            if !scope.allows(&lexical, absolute) {
                return Err(EntryError::Escapes { entry: lexical, root: scope.root.to_path_buf() });
            }
            return Err(match source.kind() {
                io::ErrorKind::NotFound => EntryError::Missing { entry: joined },
                _ => EntryError::Resolve { entry: joined, source },
            });
        }
    };
    if !scope.allows(&canonical, absolute) {
        return Err(EntryError::Escapes { entry: canonical, root: scope.root.to_path_buf() });
    }
    let meta = std::fs::metadata(&canonical)
        .map_err(|source| EntryError::Resolve { entry: canonical.clone(), source })?;
    if !meta.is_file() {
        return Err(EntryError::NotRegular { entry: canonical });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o111 == 0 {
        return Err(EntryError::NotExecutable { entry: canonical, mode });
    }
    Ok(canonical)
}

/// Folds `.` and `..` without touching the file system (`..` at `/` stays
/// at `/`). Only used to word the error of an entry that does not resolve.
fn lexical_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    struct Tree {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        outside: PathBuf,
    }

    /// `TMP/root/pack/` and `TMP/outside/`, canonical.
    fn tree() -> Tree {
        let tmp = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        let root = base.join("root");
        let outside = base.join("outside");
        fs::create_dir_all(root.join("pack")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        Tree { _tmp: tmp, root, outside }
    }

    fn exe(path: &Path) {
        fs::write(path, "#!/bin/sh\necho '{}'\n").unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn check(t: &Tree, entry: &str) -> Result<PathBuf, EntryError> {
        let roots = [t.root.clone()];
        resolve(entry, &t.root.join("pack"), EntryScope { root: &t.root, all_roots: &roots })
    }

    #[test]
    fn relative_entry_resolves_to_canonical() {
        let t = tree();
        exe(&t.root.join("pack/run.sh"));
        assert_eq!(check(&t, "run.sh").unwrap(), t.root.join("pack/run.sh"));
        assert_eq!(check(&t, "./run.sh").unwrap(), t.root.join("pack/run.sh"));
        assert_eq!(check(&t, "../pack/run.sh").unwrap(), t.root.join("pack/run.sh"));
    }

    #[test]
    fn dotdot_prefixed_child_is_inside() {
        let t = tree();
        fs::create_dir(t.root.join("pack/..foo")).unwrap();
        exe(&t.root.join("pack/..foo/run"));
        assert_eq!(check(&t, "..foo/run").unwrap(), t.root.join("pack/..foo/run"));
    }

    #[test]
    fn sibling_with_root_prefix_is_outside() {
        let t = tree();
        let evil = t.root.with_file_name("root-evil");
        fs::create_dir(&evil).unwrap();
        exe(&evil.join("run"));
        let err = check(&t, "../../root-evil/run").unwrap_err();
        assert!(matches!(&err, EntryError::Escapes { entry, .. } if *entry == evil.join("run")));
        let abs = evil.join("run");
        let err = check(&t, abs.to_str().unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("entry {} escapes allowlist root {}", abs.display(), t.root.display())
        );
    }

    #[test]
    fn symlink_inside_pointing_outside_escapes() {
        let t = tree();
        exe(&t.outside.join("tool"));
        symlink(t.outside.join("tool"), t.root.join("pack/run")).unwrap();
        let err = check(&t, "run").unwrap_err();
        assert!(
            matches!(&err, EntryError::Escapes { entry, root } if *entry == t.outside.join("tool") && *root == t.root)
        );
    }

    #[test]
    fn symlink_inside_pointing_inside_is_followed() {
        let t = tree();
        fs::create_dir(t.root.join("bin")).unwrap();
        exe(&t.root.join("bin/tool"));
        symlink("../bin/tool", t.root.join("pack/run")).unwrap();
        assert_eq!(check(&t, "run").unwrap(), t.root.join("bin/tool"));
    }

    #[test]
    fn absolute_entry_outside_every_root_escapes_even_if_missing() {
        let t = tree();
        let err = check(&t, "/nonexistent/ongrid/tool").unwrap_err();
        assert!(
            matches!(&err, EntryError::Escapes { entry, .. } if *entry == Path::new("/nonexistent/ongrid/tool"))
        );
        let err = check(&t, "../../../../../../../../nonexistent").unwrap_err();
        assert!(matches!(err, EntryError::Escapes { .. }), "{err:?}");
    }

    #[test]
    fn absolute_entry_under_another_root_is_allowed() {
        let t = tree();
        exe(&t.outside.join("tool"));
        let roots = [t.root.clone(), t.outside.clone()];
        let scope = EntryScope { root: &t.root, all_roots: &roots };
        let abs = t.outside.join("tool");
        assert_eq!(resolve(abs.to_str().unwrap(), &t.root.join("pack"), scope).unwrap(), abs);
        // ...but a relative path may not leave its own root.
        let err = resolve("../../outside/tool", &t.root.join("pack"), scope).unwrap_err();
        assert!(matches!(err, EntryError::Escapes { .. }), "{err:?}");
    }

    #[test]
    fn missing_directory_and_non_executable_entries() {
        let t = tree();
        let err = check(&t, "nope").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("entry {} does not exist", t.root.join("pack/nope").display())
        );

        fs::create_dir(t.root.join("pack/dir")).unwrap();
        assert!(matches!(check(&t, "dir").unwrap_err(), EntryError::NotRegular { .. }));

        fs::write(t.root.join("pack/plain"), "x").unwrap();
        fs::set_permissions(t.root.join("pack/plain"), fs::Permissions::from_mode(0o644)).unwrap();
        let err = check(&t, "plain").unwrap_err();
        assert!(err.to_string().ends_with("is not executable (mode 0644)"), "{err}");

        // Any one execute bit is enough.
        fs::set_permissions(t.root.join("pack/plain"), fs::Permissions::from_mode(0o610)).unwrap();
        assert!(check(&t, "plain").is_ok());
    }

    #[test]
    fn entry_symlink_loop_is_a_resolve_error() {
        let t = tree();
        symlink("loop", t.root.join("pack/loop")).unwrap();
        let err = check(&t, "loop").unwrap_err();
        assert!(matches!(err, EntryError::Resolve { .. }), "{err:?}");
    }

    #[test]
    fn lexical_normal_table() {
        let cases =
            [("/a/b/../c", "/a/c"), ("/a/./b", "/a/b"), ("/../..", "/"), ("/a/..foo", "/a/..foo")];
        for (input, want) in cases {
            assert_eq!(lexical_normal(Path::new(input)), Path::new(want), "{input}");
        }
    }
}
