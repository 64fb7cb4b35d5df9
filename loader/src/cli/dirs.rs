//! The skill directories a command works on: the command line's, made
//! absolute, or the roots the daemon would scan.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::scan::ScanReport;

/// Makes a command-line path absolute against the current directory
/// (without resolving symlinks: the scan does that).
pub(super) fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Scans the command-line `dirs` (made absolute), or the roots of
/// `ONGRID_SKILLS_EXTERNAL_DIRS` when none are given, as the daemon would
/// (`scan` and `check`). Says on `err` when there is no root at all.
///
/// # Errors
///
/// I/O errors writing to `err`.
pub(super) fn scan_roots(dirs: &[PathBuf], err: &mut dyn Write) -> io::Result<ScanReport> {
    let dirs: Vec<PathBuf> = if dirs.is_empty() {
        crate::scan::roots::from_env()
    } else {
        dirs.iter().map(|d| absolute(d)).collect()
    };
    if dirs.is_empty() {
        writeln!(
            err,
            "skill loader: no roots given and {} is empty or unset",
            crate::scan::roots::ENV_VAR
        )?;
    }
    Ok(crate::scan::Scanner::new(policy::ValidateOptions::default()).scan(&dirs))
}
