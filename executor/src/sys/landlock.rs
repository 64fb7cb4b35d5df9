//! Landlock system calls (`landlock_create_ruleset`, `landlock_add_rule`).
//! `landlock_restrict_self` happens in the child (see `child`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1 << 0;
const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The kernel's Landlock ABI version; 0 when Landlock is unavailable.
pub fn abi() -> u32 {
    // SAFETY: the VERSION query takes no attribute (NULL, 0).
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            0usize,
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(r).unwrap_or(0)
}

/// Creates a ruleset handling the given rights (already masked to the ABI).
///
/// # Errors
///
/// The errno of `landlock_create_ruleset`.
pub fn create_ruleset(fs: u64, net: u64, scoped: u64) -> io::Result<OwnedFd> {
    let attr = RulesetAttr { handled_access_fs: fs, handled_access_net: net, scoped };
    // SAFETY: attr is a valid, initialised struct of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &raw const attr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Allows `access` beneath the file or directory `parent`.
///
/// # Errors
///
/// The errno of `landlock_add_rule` (EINVAL: directory rights on a file).
pub fn add_path_beneath(
    ruleset: BorrowedFd<'_>,
    parent: BorrowedFd<'_>,
    access: u64,
) -> io::Result<()> {
    let attr = PathBeneathAttr { allowed_access: access, parent_fd: parent.as_raw_fd() };
    // SAFETY: attr is a valid packed struct, both fds are open.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &raw const attr,
            0u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
