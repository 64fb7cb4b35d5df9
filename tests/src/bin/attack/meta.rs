//! File metadata: mode, owner, extended attributes and times changed by
//! path and by descriptor, which Landlock does not cover. Each probe
//! writes back what the file already has (same mode, owner, times), so a
//! probe that works leaves no trace but the extended attribute, which it
//! removes again.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use serde_json::{json, Map, Value};

use crate::{errno, param};

const XATTR: &std::ffi::CStr = c"user.ongrid-probe";
const FS_IOC_GETFLAGS: libc::Ioctl = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::Ioctl = 0x4008_6602;

/// 0 or the errno of a libc call's result.
fn rc(r: libc::c_int) -> i32 {
    if r == 0 {
        0
    } else {
        errno()
    }
}

fn times(m: &std::fs::Metadata) -> [libc::timespec; 2] {
    [
        libc::timespec { tv_sec: m.atime(), tv_nsec: m.atime_nsec() },
        libc::timespec { tv_sec: m.mtime(), tv_nsec: m.mtime_nsec() },
    ]
}

/// Every change by path (`path`) and by a read-only descriptor of
/// `fd_path`; `create` makes both files first (in the run directory).
pub(crate) fn attempt(case: &str, args: &Value) -> Value {
    let path = param(args, "path");
    let fd_path = param(args, "fd_path");
    if args["create"].as_bool() == Some(true) {
        for p in [path, fd_path] {
            let _ = std::fs::write(p, b"mine");
        }
    }
    let mut errnos = Map::new();
    let mut put = |name: &str, e: i32| {
        errnos.insert(name.to_owned(), json!(e));
    };
    let c = CString::new(path).unwrap_or_default();
    match std::fs::symlink_metadata(path) {
        Err(e) => put("stat", e.raw_os_error().unwrap_or(-1)),
        Ok(m) => {
            let t = times(&m);
            // SAFETY: `c` is a NUL-terminated path and `t` two timespecs,
            // both alive for the calls; the values are the file's own.
            unsafe {
                put("chmod", rc(libc::chmod(c.as_ptr(), m.mode() & 0o7777)));
                put("chown", rc(libc::chown(c.as_ptr(), m.uid(), m.gid())));
                put("utimensat", rc(libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), 0)));
                let set =
                    rc(libc::setxattr(c.as_ptr(), XATTR.as_ptr(), c"1".as_ptr().cast(), 1, 0));
                if set == 0 {
                    libc::removexattr(c.as_ptr(), XATTR.as_ptr());
                }
                put("setxattr", set);
            }
        }
    }
    match std::fs::File::open(fd_path) {
        Err(e) => put("open", e.raw_os_error().unwrap_or(-1)),
        Ok(f) => {
            let fd = f.as_raw_fd();
            let m = f.metadata().ok();
            let (mode, uid, gid) =
                m.as_ref().map_or((0o644, 0, 0), |m| (m.mode(), m.uid(), m.gid()));
            let t = m.as_ref().map(times);
            // SAFETY: `fd` is open for the calls; `t` outlives them.
            unsafe {
                put("fchmod", rc(libc::fchmod(fd, mode & 0o7777)));
                put("fchown", rc(libc::fchown(fd, uid, gid)));
                if let Some(t) = t {
                    put("futimens", rc(libc::futimens(fd, t.as_ptr())));
                }
                let set = rc(libc::fsetxattr(fd, XATTR.as_ptr(), c"1".as_ptr().cast(), 1, 0));
                if set == 0 {
                    libc::fremovexattr(fd, XATTR.as_ptr());
                }
                put("fsetxattr", set);
                // chattr's flags, written back as read.
                let mut flags: libc::c_long = 0;
                let get = libc::ioctl(fd, FS_IOC_GETFLAGS, &raw mut flags);
                put(
                    "setflags",
                    if get == 0 {
                        rc(libc::ioctl(fd, FS_IOC_SETFLAGS, &raw const flags))
                    } else {
                        errno()
                    },
                );
                // A lease stalls whoever opens the file next.
                put("lease", rc(libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK)));
                libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK);
            }
        }
    }
    let worked: Vec<&String> =
        errnos.iter().filter(|(_, e)| **e == json!(0)).map(|(k, _)| k).collect();
    json!({"attempt": case, "succeeded": !worked.is_empty(), "worked": worked, "errnos": errnos})
}
