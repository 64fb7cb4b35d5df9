//! Skill packs written where a suite serves them from: a folder
//! `root/NAME/` with `skill.json` and an executable entry (a `/bin/sh`
//! script, or any bytes), and
//! the temp folders they go in, traversable by the run-as user.
//!
//! Every suite that serves skills (the executor's and the loader's tests,
//! the end-to-end suite, the benches) writes its packs here, so a change of
//! the manifest's shape is made once.

use std::fs;
use std::path::{Path, PathBuf};

use crate::skill::set_mode;

/// Writes `root/name/` (mode 0755) with `skill.json` (`name`, description
/// `"<name> test skill"`, `entry`, plus `extra`: JSON members starting with
/// `,`, or empty) and the executable entry `/bin/sh` script `script`.
/// Skills run with no environment: tools by absolute path. Returns the
/// pack's folder.
///
/// # Panics
///
/// On I/O errors.
pub fn write_pack(root: &Path, name: &str, entry: &str, extra: &str, script: &str) -> PathBuf {
    write_pack_entry(root, name, entry, extra, format!("#!/bin/sh\n{script}\n").as_bytes())
}

/// [`write_pack`] with the entry's bytes as given: a copied binary, or a
/// script with its own `#!` line.
///
/// # Panics
///
/// On I/O errors.
pub fn write_pack_entry(
    root: &Path,
    name: &str,
    entry: &str,
    extra: &str,
    bytes: &[u8],
) -> PathBuf {
    let dir = root.join(name);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    set_mode(&dir, 0o755);
    let run = dir.join(entry);
    fs::write(&run, bytes).unwrap();
    set_mode(&run, 0o755);
    let manifest = dir.join("skill.json");
    fs::write(
        &manifest,
        format!(
            r#"{{"name":"{name}","description":"{name} test skill","entry":"{entry}"{extra}}}"#
        ),
    )
    .unwrap();
    set_mode(&manifest, 0o644);
    dir
}

/// A temp folder the run-as user can traverse (0755), and its canonical
/// path; removed when the first is dropped.
///
/// # Panics
///
/// On I/O errors.
pub fn temp_dir(prefix: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let base = fs::canonicalize(tmp.path()).unwrap();
    set_mode(&base, 0o755);
    (tmp, base)
}

/// A temp folder the run-as user can traverse (0755).
///
/// # Panics
///
/// On I/O errors.
pub fn dir_0755() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    set_mode(d.path(), 0o755);
    d
}
