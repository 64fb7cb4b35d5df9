//! Resolving a path by opening it: the canonical name of the open file,
//! read back from `/proc/self/fd/N`.
//!
//! `realpath(3)` (`std::fs::canonicalize`) calls `readlink` on every
//! component of the path, 5 to 8 system calls for a manifest or an entry
//! under a skills root, and every run resolves the manifest, each root and
//! the entry (the manifest and roots once, by the server's check, whose
//! open file the plan then reads: `plan::Located`).
//! Opening the path and reading the link of its descriptor takes two (the
//! link read relative to this process's `/proc/<pid>/fd`, opened once),
//! and leaves the file open for what comes next: its metadata (`fstat`)
//! and, for a manifest, its bytes, so what was checked is what is read.
//!
//! The link names the file as the kernel resolved it: every symbolic link
//! followed, `.` and `..` gone, i.e. the same path as `realpath`. Two
//! cases where it is not a plain absolute path fall back to `realpath`,
//! checked against the open file's device and inode: a file unlinked since
//! it was opened (the kernel appends " (deleted)", which a real name may
//! also end with) and one outside this process's root ("(unreachable)").
//! Without `/proc` the fallback is `realpath` alone.
//!
//! Most paths need no link read at all: the manifests, roots and entries
//! the loader sends are already canonical. A path with nothing for the
//! kernel to rewrite (absolute, no `.` or `..` component, no repeated or
//! trailing `/`) that opens with `openat2(RESOLVE_NO_SYMLINKS)` crossed no
//! symbolic link, so it is its own canonical name: one system call, and no
//! walk through `/proc` (the three link reads of a run were ~18 sampled µs
//! of the executor's CPU with 8 clients). Any error of that open (a link on the way, an old
//! kernel, a filter) leaves the answer to the way above. (On a
//! case-insensitive directory the name is kept as written, where the link
//! would give the stored spelling: a root and a path spelt differently
//! then fail the comparison, which refuses the run rather than allow it.)

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// What the file is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// `O_PATH`: its name and metadata only (needs no read permission).
    Path,
    /// Reading, without blocking on a FIFO or taking a terminal.
    Read,
}

/// An open file and its canonical path.
#[derive(Debug)]
pub struct Resolved {
    /// The file, open as asked.
    pub file: File,
    /// Its canonical path.
    pub path: PathBuf,
}

impl Resolved {
    /// Opens `path` and resolves its canonical name.
    ///
    /// # Errors
    ///
    /// The error of opening it (as `realpath` would fail: a missing
    /// component, a loop, no search permission), or `NotFound` when it was
    /// removed before its name could be read.
    pub fn open(path: &Path, how: Open) -> io::Result<Resolved> {
        let flags = match how {
            Open::Path => libc::O_PATH,
            Open::Read => libc::O_NONBLOCK | libc::O_NOCTTY,
        };
        if let Some(file) = open_plain(path, flags) {
            return Ok(Resolved { file, path: path.to_path_buf() });
        }
        let file = OpenOptions::new().read(true).custom_flags(flags).open(path)?;
        let path = match fd_link(&file) {
            Ok(link) if is_plain(&link) => link,
            Ok(_) => same_file(&file, path)?,
            // No /proc: what realpath says.
            Err(_) => fs::canonicalize(path)?,
        };
        Ok(Resolved { file, path })
    }
}

/// `path` opened for reading with `flags` when it is plain (see
/// [`is_lexically_plain`]) and the kernel crossed no symbolic link opening
/// it; `None` otherwise, whatever the reason.
fn open_plain(path: &Path, flags: libc::c_int) -> Option<File> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    if !is_lexically_plain(path) {
        return None;
    }
    let how = OpenHow::new()
        .flags(OFlag::from_bits_truncate(flags) | OFlag::O_RDONLY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    nix::fcntl::openat2(nix::fcntl::AT_FDCWD, path, how).ok().map(File::from)
}

/// Absolute, without `.` or `..` components and without `/` repeated or
/// at the end: nothing but symbolic links could make its canonical name
/// differ from it.
fn is_lexically_plain(path: &Path) -> bool {
    let b = path.as_os_str().as_bytes();
    b == b"/"
        || (b.first() == Some(&b'/')
            && b.last() != Some(&b'/')
            && b[1..].split(|&c| c == b'/').all(|c| !matches!(c, b"" | b"." | b"..")))
}

/// The link `/proc/self/fd/N` of `file`, read relative to this process's
/// `/proc/<pid>/fd` opened once (one path component to walk per read, not
/// four through `/proc` and its `self` link). The directory names the
/// process that opened it: a forked child of a library user reads its own
/// table by the full path instead.
fn fd_link(file: &File) -> io::Result<PathBuf> {
    static FD_DIR: OnceLock<Option<(u32, File)>> = OnceLock::new();
    let dir = FD_DIR.get_or_init(|| {
        let pid = std::process::id();
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(format!("/proc/{pid}/fd"))
            .ok()
            .map(|dir| (pid, crate::host::fdtable::lift_file(dir)))
    });
    let name = file.as_raw_fd().to_string();
    match dir {
        Some((pid, dir)) if *pid == std::process::id() => {
            nix::fcntl::readlinkat(dir, name.as_str()).map(PathBuf::from).map_err(io::Error::from)
        }
        _ => fs::read_link(format!("/proc/self/fd/{name}")),
    }
}

/// `realpath` of `path`, through one open (see the module docs).
///
/// # Errors
///
/// See [`Resolved::open`].
pub fn canonicalize(path: &Path) -> io::Result<PathBuf> {
    Resolved::open(path, Open::Path).map(|r| r.path)
}

/// An absolute path the kernel did not mark as deleted or unreachable.
fn is_plain(link: &Path) -> bool {
    let b = link.as_os_str().as_bytes();
    b.first() == Some(&b'/') && !b.ends_with(b" (deleted)")
}

/// `realpath(path)` when it still names `file`, else `NotFound`.
fn same_file(file: &File, path: &Path) -> io::Result<PathBuf> {
    let canonical = fs::canonicalize(path)?;
    let (a, b) = (file.metadata()?, fs::metadata(&canonical)?);
    if (a.dev(), a.ino()) == (b.dev(), b.ino()) {
        Ok(canonical)
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} was replaced while being opened", path.display()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_as_realpath_through_links_and_dots() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        fs::create_dir_all(real.join("sub")).unwrap();
        fs::write(real.join("sub/f"), b"x").unwrap();
        std::os::unix::fs::symlink(&real, t.path().join("link")).unwrap();
        std::os::unix::fs::symlink("sub/f", real.join("flink")).unwrap();
        for p in [
            t.path().join("link/sub/f"),
            t.path().join("link/./sub/../sub/f"),
            t.path().join("link/flink"),
            t.path().join("link"),
            t.path().join("real/sub/"),
        ] {
            let want = fs::canonicalize(&p).unwrap();
            assert_eq!(canonicalize(&p).unwrap(), want, "{}", p.display());
            let r = Resolved::open(&p, Open::Path).unwrap();
            assert_eq!(r.path, want);
            assert_eq!(r.file.metadata().unwrap().ino(), fs::metadata(&want).unwrap().ino());
        }
        let r = Resolved::open(&t.path().join("link/flink"), Open::Read).unwrap();
        assert_eq!(
            fs::read_to_string(format!("/proc/self/fd/{}", r.file.as_raw_fd())).unwrap(),
            "x"
        );
    }

    /// The fast path opens only what names itself: a plain path with no
    /// link on the way; a link anywhere (a folder, the last component) or
    /// a name the kernel would rewrite goes the way that reads the link,
    /// and both ways give `realpath`'s answer.
    #[test]
    fn only_a_path_that_names_itself_skips_the_link_read() {
        let t = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(base.join("real/sub")).unwrap();
        fs::write(base.join("real/sub/f"), b"x").unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("link")).unwrap();
        std::os::unix::fs::symlink("sub/f", base.join("real/flink")).unwrap();
        let plain = base.join("real/sub/f");
        for how in [libc::O_PATH, libc::O_NONBLOCK | libc::O_NOCTTY] {
            let file = open_plain(&plain, how).expect("a plain path opens directly");
            assert_eq!(file.metadata().unwrap().ino(), fs::metadata(&plain).unwrap().ino());
            assert!(open_plain(&base.join("real/sub"), how).is_some());
            for p in [
                base.join("link/sub/f"),
                base.join("real/flink"),
                base.join("real/./sub/f"),
                base.join("real/sub/../sub/f"),
                base.join("real//sub/f"),
                base.join("real/sub/"),
                PathBuf::from("real/sub/f"),
            ] {
                assert!(open_plain(&p, how).is_none(), "{}", p.display());
            }
        }
        assert!(open_plain(&base.join("real/missing"), libc::O_PATH).is_none());
        assert_eq!(Resolved::open(&plain, Open::Read).unwrap().path, plain);
        assert_eq!(canonicalize(&base.join("link/sub/f")).unwrap(), plain);
        assert_eq!(canonicalize(&base.join("real/flink")).unwrap(), plain);
        assert!(is_lexically_plain(Path::new("/")));
        assert!(is_lexically_plain(Path::new("/a/..b/c.")));
        assert!(!is_lexically_plain(Path::new("")));
    }

    #[test]
    fn errors_as_realpath() {
        let t = tempfile::tempdir().unwrap();
        let missing = t.path().join("missing/f");
        assert_eq!(canonicalize(&missing).unwrap_err().kind(), io::ErrorKind::NotFound);
        std::os::unix::fs::symlink("loop", t.path().join("loop")).unwrap();
        assert_eq!(
            canonicalize(&t.path().join("loop")).unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
        std::os::unix::fs::symlink("nowhere", t.path().join("dangling")).unwrap();
        assert_eq!(
            canonicalize(&t.path().join("dangling")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn a_name_ending_like_a_deleted_file_still_resolves() {
        let t = tempfile::tempdir().unwrap();
        let odd = t.path().join("x (deleted)");
        fs::write(&odd, b"").unwrap();
        assert_eq!(canonicalize(&odd).unwrap(), fs::canonicalize(&odd).unwrap());
    }

    #[test]
    fn a_fifo_opened_for_reading_does_not_block() {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let r = Resolved::open(&fifo, Open::Read).unwrap();
        assert!(!r.file.metadata().unwrap().is_file());
    }
}
