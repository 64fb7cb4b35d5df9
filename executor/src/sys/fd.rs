//! Descriptor-table calls: duplicating at or above a number, duplicating
//! onto a held number, and the kernel release read for `close_range`'s
//! flags. The table's layout is decided in `host::fdtable`.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `fcntl(fd, F_DUPFD_CLOEXEC, min)`: a close-on-exec duplicate of `fd` at
/// the lowest free number at or above `min`, or `None` when there is none.
#[must_use]
pub fn dup_at_least(fd: BorrowedFd<'_>, min: libc::c_int) -> Option<OwnedFd> {
    // SAFETY: fcntl on a valid borrowed descriptor, integer arguments only.
    let high: RawFd = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor nothing else owns.
    (high >= 0).then(|| unsafe { OwnedFd::from_raw_fd(high) })
}

/// `dup3(fd, number, O_CLOEXEC)`: `number` becomes a close-on-exec copy of
/// `fd`, whatever it held closed by the kernel atomically. `number` must be
/// a number the caller holds (a placeholder it owns), never another
/// owner's descriptor. False when `dup3` failed (nothing changed).
pub fn dup_onto(fd: RawFd, number: RawFd) -> bool {
    // SAFETY: dup3 with integer arguments; `number` is the caller's own
    // (see above), so no other owner's descriptor is replaced.
    unsafe { libc::dup3(fd, number, libc::O_CLOEXEC) >= 0 }
}

/// `close(number)` of a number the caller holds, when it cannot be given
/// back to its placeholder ([`dup_onto`] failed).
pub fn close_held(number: RawFd) {
    // SAFETY: closing a number the caller holds (see `dup_onto`).
    unsafe { libc::close(number) };
}

/// The kernel's release (`uname -r`), or `None` when `uname` fails.
#[must_use]
pub fn kernel_release() -> Option<String> {
    // SAFETY: an all-zero utsname is a valid value of the plain C struct.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname fills the valid local `u`.
    if unsafe { libc::uname(&raw mut u) } != 0 {
        return None;
    }
    // SAFETY: the kernel NUL-terminates `release` within the array.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    Some(release.to_string_lossy().into_owned())
}

/// An inotify instance from its descriptor.
#[must_use]
pub fn inotify_from(fd: OwnedFd) -> nix::sys::inotify::Inotify {
    // SAFETY: callers pass an inotify instance's descriptor or a duplicate
    // of it (the same open inotify instance), owned by nothing else.
    unsafe { nix::sys::inotify::Inotify::from_owned_fd(fd) }
}
