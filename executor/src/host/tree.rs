//! Removing a directory tree a run made, however deep.
//!
//! A skill may nest directories deeper than any thread's stack: std's
//! `remove_dir_all` recurses once per level (about 160 bytes of stack
//! each), so a 2 MiB thread aborts the whole executor near 13,000 levels.
//! This removal has no recursion and holds three directory descriptors at
//! most: a directory that is not empty has its entries renamed up into the
//! top directory (never followed), so each pass shortens every chain by
//! one level, and the passes go on until the top is empty.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{openat, renameat2, OFlag, RenameFlags};
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};

/// A directory opened for listing, never through a symlink.
const DIR_FLAGS: OFlag =
    OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_NOFOLLOW).union(OFlag::O_CLOEXEC);

/// Removes `path` and everything below it without following symlinks. A
/// path that is not there is no error; one that is not a directory (a
/// symlink included) is unlinked.
///
/// # Errors
///
/// The first failure to list, unlink or rename an entry.
pub fn remove_all(path: &Path) -> io::Result<()> {
    remove_within(path, GIVE_UP_AFTER)
}

fn remove_within(path: &Path, limit: Duration) -> io::Result<()> {
    let top = match nix::fcntl::open(path, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::ENOTDIR | Errno::ELOOP) => return gone(std::fs::remove_file(path)),
        Err(e) => return Err(e.into()),
    };
    empty(top.as_fd(), limit)?;
    gone(std::fs::remove_dir(path))
}

/// How long a removal goes on: a process that escaped its run's kill (no
/// cgroup to kill it by) could write in the tree for ever.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// Empties the directory `top`: passes over its entries, each a fresh
/// listing, until one finds none (or `limit` passed).
fn empty(top: BorrowedFd<'_>, limit: Duration) -> io::Result<()> {
    let mut lifted = 0u64;
    let started = Instant::now();
    loop {
        if started.elapsed() > limit {
            let why = format!("still not empty after {} s", limit.as_secs_f64());
            return Err(io::Error::other(why));
        }
        let mut listing = Dir::openat(top, c".", DIR_FLAGS, Mode::empty())?;
        let mut any = false;
        for entry in listing.iter() {
            let entry = entry?;
            let name = entry.file_name();
            if is_dot(name) {
                continue;
            }
            any = true;
            remove_or_lift(top, name, entry.file_type(), &mut lifted)?;
        }
        if !any {
            return Ok(());
        }
    }
}

/// Removes `name` from `top`; a directory that is not empty gets its
/// entries renamed up into `top` instead (the next pass removes it).
fn remove_or_lift(
    top: BorrowedFd<'_>,
    name: &CStr,
    kind: Option<Type>,
    lifted: &mut u64,
) -> io::Result<()> {
    if kind != Some(Type::Directory) {
        match unlinkat(top, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => return Ok(()),
            Err(Errno::EISDIR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match unlinkat(top, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::ENOTEMPTY | Errno::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let sub: OwnedFd = openat(top, name, DIR_FLAGS, Mode::empty())?;
    let mut listing = Dir::openat(sub.as_fd(), c".", DIR_FLAGS, Mode::empty())?;
    for entry in listing.iter() {
        let entry = entry?;
        if !is_dot(entry.file_name()) {
            lift(sub.as_fd(), entry.file_name(), top, lifted)?;
        }
    }
    Ok(())
}

/// Renames `name` from `from` into `top` under a name not taken there.
fn lift(
    from: BorrowedFd<'_>,
    name: &CStr,
    top: BorrowedFd<'_>,
    lifted: &mut u64,
) -> io::Result<()> {
    loop {
        *lifted += 1;
        let to = format!(".lifted-{lifted}");
        match renameat2(from, name, top, to.as_str(), RenameFlags::RENAME_NOREPLACE) {
            Ok(()) | Err(Errno::ENOENT) => return Ok(()),
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// A removal that found nothing to remove is done.
fn gone(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A chain deeper than a 2 MiB stack could recurse through goes, on
    /// such a thread, and a symlink in it is removed, not followed.
    #[test]
    fn a_chain_deeper_than_any_stack_is_removed_without_following_links() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let top = t.path().join("top");
        std::fs::create_dir(&top).unwrap();
        let mut dir = nix::fcntl::open(&top, DIR_FLAGS, Mode::empty()).unwrap();
        for i in 0..30_000 {
            if i % 1000 == 0 {
                std::fs::write(format!("/proc/self/fd/{}/f", fd_of(&dir)), "x").unwrap();
                symlink(&outside, format!("/proc/self/fd/{}/link", fd_of(&dir))).unwrap();
            }
            nix::sys::stat::mkdirat(dir.as_fd(), "d", Mode::from_bits_truncate(0o700)).unwrap();
            dir = openat(dir.as_fd(), "d", DIR_FLAGS, Mode::empty()).unwrap();
        }
        // Names the lifting would take, already taken.
        std::fs::write(top.join(".lifted-1"), "x").unwrap();
        std::fs::create_dir(top.join(".lifted-2")).unwrap();
        let removing = top.clone();
        let removed = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || remove_all(&removing))
            .unwrap()
            .join()
            .unwrap();
        removed.unwrap();
        assert!(!top.exists());
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "x");
    }

    /// A tree something keeps writing to is given up on once its time is
    /// out, not removed for ever: it ends (removed, or given up) while a
    /// writer goes on, and a tree still there when the time is out is left
    /// with an error.
    #[test]
    fn a_tree_still_written_to_is_given_up() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("top");
        std::fs::create_dir(&top).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (top, stop) = (top.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let _ = std::fs::create_dir(top.join(format!("w{n}")));
                }
            })
        };
        let started = Instant::now();
        let r = remove_within(&top, Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "{r:?} after {:?}", started.elapsed());
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        let e = remove_within(&top, Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("still not empty"), "{e}");
        assert!(top.join("a/b").exists());
        remove_all(&top).unwrap();
        assert!(!top.exists());
    }

    #[test]
    fn a_missing_path_a_file_or_a_link_is_not_listed() {
        let t = tempfile::tempdir().unwrap();
        remove_all(&t.path().join("missing")).unwrap();
        let target = t.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), "x").unwrap();
        let link = t.path().join("link");
        symlink(&target, &link).unwrap();
        remove_all(&link).unwrap();
        assert!(link.symlink_metadata().is_err() && target.join("keep").exists());
        let file = t.path().join("file");
        std::fs::write(&file, "x").unwrap();
        remove_all(&file).unwrap();
        assert!(!file.exists());
    }

    fn fd_of(fd: &OwnedFd) -> i32 {
        use std::os::fd::AsRawFd;
        fd.as_raw_fd()
    }
}
