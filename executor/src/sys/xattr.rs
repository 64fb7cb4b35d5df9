//! Listing a file's extended attribute names.

use std::io;

/// The names of the extended attributes of the file open as `fd`.
///
/// # Errors
///
/// The errno of `flistxattr` (`ENOTSUP` where the filesystem has none).
pub fn names_fd(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: `fd` is open for the call and `buf` a writable buffer of
        // the length given.
        let n = unsafe { libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            buf.truncate(usize::try_from(n).unwrap_or(0));
            return Ok(buf
                .split(|b| *b == 0)
                .filter(|n| !n.is_empty())
                .map(<[u8]>::to_vec)
                .collect());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) || buf.len() >= 1 << 16 {
            return Err(e);
        }
        buf.resize(buf.len() * 4, 0);
    }
}

/// Sets the extended attribute `name` of `path` (not following a symlink).
///
/// # Errors
///
/// The errno of `lsetxattr`.
#[cfg(test)]
pub fn set(path: &std::path::Path, name: &std::ffi::CStr, value: &[u8]) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid C strings and a value buffer of the length given.
    let r = unsafe {
        libc::lsetxattr(c.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
