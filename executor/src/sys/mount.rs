//! Mounting and unmounting the runs tmpfs.

use std::io;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};

/// Source name of the runs tmpfs (how the executor recognises its own
/// mount in `/proc/self/mountinfo`).
pub const RUNS_SOURCE: &str = "ongrid-runs";

/// `mount("ongrid-runs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
/// "size=<bytes>,mode=0711")`.
///
/// # Errors
///
/// The errno of `mount(2)`.
pub fn mount_tmpfs(target: &Path, bytes: u64) -> io::Result<()> {
    let data = format!("size={bytes},mode=0711");
    nix::mount::mount(
        Some(RUNS_SOURCE),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(data.as_str()),
    )
    .map_err(io::Error::from)
}

/// `umount2(target, UMOUNT_NOFOLLOW)`: fails with `EBUSY` while anything
/// uses the mount.
///
/// # Errors
///
/// The errno of `umount2(2)`.
pub fn unmount(target: &Path) -> io::Result<()> {
    nix::mount::umount2(target, MntFlags::UMOUNT_NOFOLLOW).map_err(io::Error::from)
}
