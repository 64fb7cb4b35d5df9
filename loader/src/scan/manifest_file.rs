//! Reading one `skill.json` from disk, bounded and without blocking.
//!
//! The file is opened with `O_NONBLOCK | O_NOFOLLOW` and checked with
//! `fstat` after opening, so a FIFO, a device or a symlink swapped in after
//! the walk saw a regular file can neither block the scan nor redirect it.
//! At most [`MAX_MANIFEST_BYTES`] + 1 bytes are read: a larger file is
//! rejected without being read whole.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use policy::{Manifest, ManifestDigest, ManifestError, ValidateOptions, MAX_MANIFEST_BYTES};

/// Why a manifest file could not be turned into a [`Manifest`]. Its
/// `Display` is the `ERROR` of `skill loader: parse PATH: ERROR`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// Opening or reading the file failed.
    #[error(transparent)]
    Read(#[from] io::Error),
    /// The path is not a regular file (it changed after the walk saw it).
    #[error("not a regular file")]
    NotRegular,
    /// The content is not a valid manifest (including one that is too large).
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The content is not a valid `SKILL.md`.
    #[error(transparent)]
    SkillMd(#[from] policy::SkillMdError),
}

/// Reads at most [`MAX_MANIFEST_BYTES`] + 1 bytes of the regular file at
/// `path`, without following a final symlink and without blocking.
///
/// # Errors
///
/// [`ParseError::Read`] for I/O errors, [`ParseError::NotRegular`] if the
/// opened file is not a regular file, and [`ManifestError::TooLarge`] (as
/// [`ParseError::Manifest`]) for a file over the limit.
pub fn read_bounded(path: &Path) -> Result<Vec<u8>, ParseError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(ParseError::NotRegular);
    }
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge { size: meta.len() }.into());
    }
    read_capped(file, meta.len())
}

/// Reads up to the limit plus one byte, so a file that grew after `fstat`
/// is still caught.
fn read_capped(file: File, hint: u64) -> Result<Vec<u8>, ParseError> {
    // `hint` is at most MAX_MANIFEST_BYTES (1 MiB), so it fits in usize.
    let mut bytes = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
    file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes)?;
    let len = bytes.len() as u64;
    if len > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge { size: len }.into());
    }
    Ok(bytes)
}

/// Reads and validates the `SKILL.md` at `path` (bounded as a manifest),
/// with the digest of the bytes read.
///
/// # Errors
///
/// [`ParseError`] from [`read_bounded`] or from validation.
pub fn load_skill_md(
    path: &Path,
    opts: &ValidateOptions,
) -> Result<(policy::SkillMd, ManifestDigest), ParseError> {
    let bytes = read_bounded(path)?;
    Ok((policy::SkillMd::from_slice(&bytes, opts)?, ManifestDigest::of(&bytes)))
}

/// Reads and validates the manifest at `path`, with the digest of the
/// bytes read (which the executor checks its own reading against).
///
/// # Errors
///
/// [`ParseError`] from [`read_bounded`] or from validation.
pub fn load(path: &Path, opts: &ValidateOptions) -> Result<(Manifest, ManifestDigest), ParseError> {
    let bytes = read_bounded(path)?;
    Ok((Manifest::from_slice(&bytes, opts)?, ManifestDigest::of(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = r#"{"name":"disk_usage","description":"Disk usage","entry":"run.sh"}"#;

    #[test]
    fn loads_a_valid_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("skill.json");
        std::fs::write(&path, VALID).unwrap();
        let (m, digest) = load(&path, &ValidateOptions::default()).unwrap();
        assert_eq!(m.name().as_str(), "disk_usage");
        assert_eq!(m.entry(), "run.sh");
        assert_eq!(digest, ManifestDigest::of(VALID.as_bytes()));
    }

    #[test]
    fn rejects_over_one_mib_and_accepts_exactly_one_mib() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("skill.json");
        let limit = usize::try_from(MAX_MANIFEST_BYTES).unwrap();

        std::fs::write(&path, vec![b' '; limit + 1]).unwrap();
        let err = read_bounded(&path).unwrap_err();
        assert!(
            matches!(err, ParseError::Manifest(ManifestError::TooLarge { size }) if size == MAX_MANIFEST_BYTES + 1),
            "{err:?}"
        );

        // Exactly at the limit is read (and then fails as JSON, not as size).
        std::fs::write(&path, vec![b' '; limit]).unwrap();
        assert_eq!(read_bounded(&path).unwrap().len(), limit);
    }

    #[test]
    fn does_not_follow_a_final_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.json");
        std::fs::write(&target, VALID).unwrap();
        let link = dir.path().join("skill.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = read_bounded(&link).unwrap_err();
        assert!(matches!(err, ParseError::Read(_)), "{err:?}");
    }

    #[test]
    fn a_directory_is_not_a_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_bounded(dir.path()).unwrap_err();
        assert!(matches!(err, ParseError::NotRegular), "{err:?}");
    }

    #[test]
    fn a_fifo_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("skill.json");
        let status = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(status.success());
        let err = read_bounded(&fifo).unwrap_err();
        assert!(matches!(err, ParseError::NotRegular), "{err:?}");
    }

    #[test]
    fn invalid_content_carries_the_policy_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("skill.json");
        std::fs::write(&path, r#"{"description":"x","entry":"e"}"#).unwrap();
        let err = load(&path, &ValidateOptions::default()).unwrap_err();
        assert_eq!(err.to_string(), "missing required field \"name\"");
    }
}
