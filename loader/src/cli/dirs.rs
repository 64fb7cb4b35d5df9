//! The skill directories a command works on: the command line's, made
//! absolute, or the roots the daemon would scan.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::scan::event::Level;
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

/// Whether a DIR given on the command line does not exist: the caller's
/// mistake (a typo would otherwise look like a root without packs), which
/// `scan` and `check` exit 1 for.
pub(super) fn any_missing(dirs: &[PathBuf]) -> bool {
    dirs.iter()
        .any(|d| std::fs::symlink_metadata(d).is_err_and(|e| e.kind() == io::ErrorKind::NotFound))
}

/// Prints the scan's events on `err`, debug ones only when `verbose`.
/// Paths are the packs' names: printed without control characters.
///
/// # Errors
///
/// I/O errors writing to `err`.
pub(super) fn print_events(
    report: &ScanReport,
    verbose: bool,
    err: &mut dyn Write,
) -> io::Result<()> {
    for event in &report.events {
        if verbose || event.level() > Level::Debug {
            writeln!(err, "{}", policy::printable::line(&event.to_string()))?;
        }
    }
    Ok(())
}
