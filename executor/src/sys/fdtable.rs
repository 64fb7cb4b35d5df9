//! The executor's descriptor table, split at a floor so that a child copies
//! only the part below it.
//!
//! Every `clone` without `CLONE_FILES` copies the creating thread's table
//! and every `execve` closes the copies again (they are close-on-exec):
//! during runs the executor holds ~230 descriptors, 176 of them the kernfs
//! files of its 16 pooled cgroup slots and ~40 the `O_PATH` system paths of
//! the Landlock rulesets. Copying and closing them cost ~3 % of the host's
//! CPU per run with 8 clients (BENCHMARKS.md, tenth pass): each copy takes a
//! reference and each close flushes, with a cache miss on each file.
//!
//! So the long-lived descriptors that a child never needs after joining its
//! cgroups are [`lift`]ed to numbers at or above a [`floor`], and a child is
//! created with `CLONE_FILES` (sharing the table, nothing copied) and, once
//! it has written to its `cgroup.procs` files (themselves above the floor),
//! calls `close_range(floor, ~0, CLOSE_RANGE_UNSHARE)` (Linux 5.9): the
//! kernel then gives it a table of its own holding only the descriptors
//! below the floor. Whatever lands where is never a question of safety: a
//! descriptor that could not be lifted is copied and closed at `exec` as
//! before, and the caller shares the table only when the child's stdio and
//! Landlock descriptors are below the floor ([`super::child::ChildSpec`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

/// The highest floor: the part below it holds the connections, pipes and
/// per-run descriptors of up to ~100 runs at once.
const MAX_FLOOR: u32 = 1024;
/// The lowest useful floor (a soft `RLIMIT_NOFILE` under 2x this disables
/// the split).
const MIN_FLOOR: u32 = 256;

/// The floor of this process's table, or `None` when the kernel lacks
/// `CLOSE_RANGE_UNSHARE` or the soft `RLIMIT_NOFILE` leaves no room above
/// a useful floor. Decided once per process.
pub fn floor() -> Option<u32> {
    static FLOOR: OnceLock<Option<u32>> = OnceLock::new();
    *FLOOR.get_or_init(|| {
        let soft = nofile_soft()?;
        let floor = u32::try_from(soft / 2).unwrap_or(u32::MAX).min(MAX_FLOOR);
        (floor >= MIN_FLOOR && close_range_unshares()).then_some(floor)
    })
}

fn nofile_soft() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the valid local `lim`.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) };
    (r == 0).then_some(lim.rlim_cur)
}

/// True if `close_range` takes `CLOSE_RANGE_UNSHARE` here: both came in
/// Linux 5.9. Read off the kernel's release rather than tried: trying it on
/// a thread of this process would give that thread a table of its own, and
/// a throwaway thread made for the test would wait out the cgroup attach
/// lock's warm-up of a one-shot `run` (`crate::attach_lock`).
fn close_range_unshares() -> bool {
    // SAFETY: uname fills the valid local `u`.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::uname(&raw mut u) } != 0 {
        return false;
    }
    // SAFETY: the kernel NUL-terminates `release` within the array.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    release_at_least(&release.to_string_lossy(), (5, 9))
}

/// `release` ("6.18.44-fc-v1045") is `want` (major, minor) or later.
fn release_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse::<u32>().ok());
    match (next(), next()) {
        (Some(major), Some(minor)) => (major, minor) >= want,
        _ => false,
    }
}

/// True if every one of `fds` is below `floor`: what a child that shares
/// the table keeps (`close_range(floor, ~0, CLOSE_RANGE_UNSHARE)`).
pub fn all_below(floor: u32, fds: impl IntoIterator<Item = RawFd>) -> bool {
    fds.into_iter().all(|fd| u32::try_from(fd).is_ok_and(|fd| fd < floor))
}

/// `fd` renumbered to the lowest free number at or above the [`floor`]
/// (close-on-exec), or `fd` itself when there is no floor or no free number
/// above it.
#[must_use]
pub fn lift(fd: OwnedFd) -> OwnedFd {
    let Some(floor) = floor() else { return fd };
    let Ok(floor) = libc::c_int::try_from(floor) else { return fd };
    if fd.as_raw_fd() >= floor {
        return fd;
    }
    // SAFETY: fcntl on a valid descriptor we own, integer arguments only.
    let high: RawFd = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) };
    if high < 0 {
        return fd;
    }
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor nothing else owns;
    // the old one is closed when `fd` drops.
    unsafe { OwnedFd::from_raw_fd(high) }
}

/// [`lift`] for an inotify instance.
#[must_use]
pub fn lift_inotify(inotify: nix::sys::inotify::Inotify) -> nix::sys::inotify::Inotify {
    let fd = lift(OwnedFd::from(inotify));
    // SAFETY: `fd` is the inotify instance's descriptor, or a duplicate of
    // it (the same open inotify instance), owned by nothing else.
    unsafe { nix::sys::inotify::Inotify::from_owned_fd(fd) }
}

/// [`lift`] for a `File`.
#[must_use]
pub fn lift_file(file: std::fs::File) -> std::fs::File {
    std::fs::File::from(lift(OwnedFd::from(file)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(release_at_least("6.18.44-fc-v1045", (5, 9)));
        assert!(release_at_least("5.9.0", (5, 9)));
        assert!(release_at_least("5.10.0-28-amd64", (5, 9)));
        assert!(!release_at_least("5.4.0-150-generic", (5, 9)));
        assert!(!release_at_least("4.18.0-553.el8_10.x86_64", (5, 9)));
        assert!(!release_at_least("garbage", (5, 9)));
    }

    /// This kernel (Linux 5.9 or later) and a soft limit of 512 or more
    /// give a floor; a lifted descriptor is above it and still the same
    /// open file.
    #[test]
    fn lifted_descriptors_sit_above_the_floor() {
        let Some(floor) = floor() else {
            println!(
                "SKIP: no descriptor floor here (soft RLIMIT_NOFILE {:?}, or no \
                 CLOSE_RANGE_UNSHARE)",
                nofile_soft()
            );
            return;
        };
        assert!((MIN_FLOOR..=MAX_FLOOR).contains(&floor), "floor {floor}");
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let ino = file.metadata().unwrap();
        let low = file.as_raw_fd();
        let lifted = lift_file(file);
        let fd = u32::try_from(lifted.as_raw_fd()).unwrap();
        assert!(fd >= floor, "lifted to {fd}, floor {floor} (was {low})");
        let again = lifted.metadata().unwrap();
        assert_eq!(
            (std::os::unix::fs::MetadataExt::ino(&again), again.len()),
            (std::os::unix::fs::MetadataExt::ino(&ino), ino.len())
        );
        // SAFETY: F_GETFD on a descriptor this test owns.
        let flags = unsafe { libc::fcntl(lifted.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC, "close-on-exec");
    }
}
