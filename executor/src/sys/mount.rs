//! Mounting and unmounting the runs tmpfs.

use std::io;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};

/// Source name of the runs tmpfs (how the executor recognises its own
/// mount in `/proc/self/mountinfo`).
pub const RUNS_SOURCE: &str = "ongrid-runs";

/// How the runs tmpfs is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmpfsSize {
    /// `size=`: bytes of file data in all (0: no limit).
    pub bytes: u64,
    /// `nr_inodes=0` (no count of its own) instead of the kernel's default
    /// (half the RAM's pages): right only where each run's memory cgroup
    /// bounds the inodes and dentries it makes (accounted kernel memory).
    pub unlimited_inodes: bool,
}

impl TmpfsSize {
    fn data(self) -> String {
        let inodes = if self.unlimited_inodes { ",nr_inodes=0" } else { "" };
        format!("size={}{inodes}", self.bytes)
    }
}

/// `mount("ongrid-runs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
/// "size=<bytes>[,nr_inodes=0],mode=0711")`.
///
/// # Errors
///
/// The errno of `mount(2)`.
pub fn mount_tmpfs(target: &Path, size: TmpfsSize) -> io::Result<()> {
    let data = format!("{},mode=0711", size.data());
    nix::mount::mount(
        Some(RUNS_SOURCE),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(data.as_str()),
    )
    .map_err(io::Error::from)
}

/// Grows the tmpfs on `target` in place (`MS_REMOUNT`, same flags): the
/// kernel refuses to shrink it below what it holds, or to count inodes
/// again once it does not.
///
/// # Errors
///
/// The errno of `mount(2)`.
pub fn remount_tmpfs(target: &Path, size: TmpfsSize) -> io::Result<()> {
    let data = size.data();
    nix::mount::mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
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
