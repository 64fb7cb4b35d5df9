//! Pure path rules, compared by components, never by string prefix.

use std::path::{Component, Path, PathBuf};

/// Returns true if and only if `child` equals `root` or lies below it,
/// compared component by component: `/skills-evil` is not under `/skills`,
/// `/skills/..foo` is. Both paths must already be canonical (the caller
/// resolved symlinks); `..` components make the answer false.
pub fn is_within(child: &Path, root: &Path) -> bool {
    if child.components().any(|c| matches!(c, Component::ParentDir)) {
        return false;
    }
    child.starts_with(root)
}

/// The name of a manifest file: the loader registers no other file, and
/// the executor reads no other file as a `skill.json`.
pub const MANIFEST_FILE_NAME: &str = "skill.json";

/// The file name of a SKILL.md skill, the other file a skill can be read
/// from.
pub const SKILL_MD_FILE_NAME: &str = "SKILL.md";

/// Whether `path` names a manifest: a `skill.json` or a `SKILL.md` (by its
/// file name alone; nothing is read).
pub fn is_manifest_path(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == MANIFEST_FILE_NAME || n == SKILL_MD_FILE_NAME)
}

/// Why a path is not an absolute normal path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRuleError {
    /// The path is relative.
    #[error("{0:?} is not absolute")]
    Relative(String),
    /// The path has `.` or `..` components, or a NUL byte.
    #[error("{0:?} is not in normal form (no `.`, `..` or NUL allowed)")]
    NotNormal(String),
}

/// Validates an operator- or manifest-supplied absolute path: absolute, no
/// `.`/`..` components, no NUL. Repeated or trailing slashes are folded.
///
/// # Errors
///
/// [`PathRuleError`] naming the path.
pub fn absolute_normal(s: &str) -> Result<PathBuf, PathRuleError> {
    if s.contains('\0') {
        return Err(PathRuleError::NotNormal(s.to_owned()));
    }
    let p = Path::new(s);
    if !p.is_absolute() {
        return Err(PathRuleError::Relative(s.to_owned()));
    }
    // Path::components folds `//` and drops interior `.`; catch `.` by text.
    if s.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(PathRuleError::NotNormal(s.to_owned()));
    }
    Ok(p.components().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_by_components() {
        let root = Path::new("/skills");
        assert!(is_within(Path::new("/skills"), root));
        assert!(is_within(Path::new("/skills/a/b"), root));
        assert!(is_within(Path::new("/skills/..foo"), root));
        assert!(!is_within(Path::new("/skills-evil/x"), root));
        assert!(!is_within(Path::new("/skillsx"), root));
        assert!(!is_within(Path::new("/"), root));
        assert!(!is_within(Path::new("/skills/../etc"), root));
    }

    #[test]
    fn absolute_normal_rules() {
        assert_eq!(absolute_normal("/var//log/").unwrap(), PathBuf::from("/var/log"));
        assert!(matches!(absolute_normal("var/log"), Err(PathRuleError::Relative(_))));
        assert!(matches!(absolute_normal("/var/../etc"), Err(PathRuleError::NotNormal(_))));
        assert!(matches!(absolute_normal("/var/./log"), Err(PathRuleError::NotNormal(_))));
        assert!(matches!(absolute_normal("/var\0"), Err(PathRuleError::NotNormal(_))));
    }
}
