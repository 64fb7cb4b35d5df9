//! The private per-run directory: the skill's cwd, removed after the run,
//! and the slot's directory it is made in.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::host;

/// A per-run directory could not be made.
#[derive(Debug, thiserror::Error)]
#[error("run directory {path}: cannot {what}")]
pub struct RunDirError {
    /// The directory.
    pub path: PathBuf,
    /// What was being done.
    pub what: &'static str,
    /// The cause.
    #[source]
    pub source: io::Error,
}

/// The per-run directory `<home>/<run id>` (mode 0700, owned by the run-as
/// user) and the slot's directory it is in, `<home>` =
/// `<runtime_dir>/runs/<instance>/<slot id>` (mode 0711, the executor's,
/// holding nothing else). The Landlock ruleset grants beneath the home,
/// whose inode outlives the run directories made in it while the engine's
/// janitor reuses the slot ([`RunDir::renew`]): so a ruleset built for one
/// run serves the next run of the same policy in the slot ([`Self::rulesets`]).
#[derive(Debug)]
pub struct RunDir {
    home: PathBuf,
    path: PathBuf,
    /// Who it was handed to (`None`: the executor's own user).
    owner: Option<(u32, u32)>,
    /// Rulesets granting beneath the home, for later runs in it.
    pub rulesets: crate::sandbox::landlock::Cache,
}

/// A random run id: 16 hex digits from the kernel's CSPRNG.
///
/// # Errors
///
/// The I/O error of reading `/dev/urandom`.
pub fn random_id() -> io::Result<String> {
    // Opened once and kept (one `read` per id, not an open and a close).
    static URANDOM: std::sync::OnceLock<fs::File> = std::sync::OnceLock::new();
    let file = match URANDOM.get() {
        Some(f) => f,
        None => {
            let f = fs::File::open("/dev/urandom")?;
            URANDOM.get_or_init(|| f)
        }
    };
    let mut b = [0u8; 8];
    (&*file).read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn err<'p>(path: &'p Path, what: &'static str) -> impl FnOnce(io::Error) -> RunDirError + 'p {
    move |source| RunDirError { path: path.to_owned(), what, source }
}

/// `mkdir` with `mode` exactly (the umask does not apply to the chmod).
fn make_dir(path: &Path, mode: u32) -> Result<(), RunDirError> {
    fs::DirBuilder::new().mode(mode).create(path).map_err(err(path, "create"))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(err(path, "chmod"))
}

/// Mode of a slot's home.
const HOME_MODE: u32 = 0o711;

impl RunDir {
    /// Creates the home `<runs>/<id>` (and `runs`, mode 0711, if missing)
    /// and a run directory in it; `owner` = `(uid, gid)` to chown the run
    /// directory to.
    ///
    /// # Errors
    ///
    /// [`RunDirError`] naming the path; what was made is removed.
    pub fn create(runs: &Path, id: &str, owner: Option<(u32, u32)>) -> Result<Self, RunDirError> {
        let home = runs.join(id);
        match make_dir(&home, HOME_MODE) {
            Err(RunDirError { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o711)
                    .create(runs)
                    .map_err(err(runs, "create"))?;
                make_dir(&home, HOME_MODE)?;
            }
            made => made?,
        }
        let mut dir = RunDir {
            home,
            path: PathBuf::new(),
            owner: None,
            rulesets: crate::sandbox::landlock::Cache::default(),
        };
        let home = dir.open_home()?;
        dir.fresh(&home, owner)?;
        Ok(dir)
    }

    /// The home, opened for the `*at` calls of [`Self::fresh`] and
    /// [`Self::renew`] (one walk of the long path, not one per step).
    fn open_home(&self) -> Result<nix::dir::Dir, RunDirError> {
        use nix::fcntl::OFlag;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        nix::dir::Dir::open(&self.home, flags, nix::sys::stat::Mode::empty())
            .map_err(|e| err(&self.home, "open")(io::Error::from(e)))
    }

    /// A new run directory in the home (open as `home`), mode exactly 0700
    /// (the umask does not apply to the chmod), handed to `owner`.
    fn fresh(
        &mut self,
        home: &nix::dir::Dir,
        owner: Option<(u32, u32)>,
    ) -> Result<(), RunDirError> {
        use nix::sys::stat::{FchmodatFlags, Mode};
        let id = random_id().map_err(err(&self.home, "name a run directory in"))?;
        let mode = Mode::from_bits_truncate(0o700);
        nix::sys::stat::mkdirat(home, id.as_str(), mode)
            .map_err(|e| err(&self.home.join(&id), "create")(io::Error::from(e)))?;
        self.path = self.home.join(&id);
        self.owner = None;
        nix::sys::stat::fchmodat(home, id.as_str(), mode, FchmodatFlags::FollowSymlink)
            .map_err(|e| err(&self.path, "chmod")(io::Error::from(e)))?;
        self.chown(owner)
    }

    /// Makes the home ready for another run: removes the run directory
    /// (without following symlinks) and makes a new one, handed to the
    /// same owner as the last (most runs have the owner of the run before
    /// them, so their `chown` is done here, off their path), when the home is
    /// as it was made: a directory of mode 0711 owned by the executor's
    /// user, with no other entry and no user or ACL extended attribute (a
    /// skill running as uid 0 owns it too and could have changed any of
    /// that). Otherwise, an error: the caller removes the home instead.
    ///
    /// # Errors
    ///
    /// [`RunDirError`] naming the path.
    pub fn renew(&mut self) -> Result<(), RunDirError> {
        use std::os::fd::AsFd;

        use nix::errno::Errno;
        use nix::unistd::UnlinkatFlags;

        let reuse = |what: &str| err(&self.home, "reuse")(io::Error::other(what.to_owned()));
        let sys = |what, e: Errno| err(&self.home, what)(io::Error::from(e));
        if self.home.as_os_str().is_empty() {
            return Err(reuse("it was removed"));
        }
        let mut home = self.open_home()?;
        // The run directory: one `rmdir` when the run left it empty, else
        // the walk that does not follow symlinks.
        if let Some(name) = self.path.file_name() {
            match nix::unistd::unlinkat(&home, name, UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(Errno::ENOTEMPTY | Errno::EEXIST) => {
                    host::tree::remove_all(&self.path).map_err(err(&self.path, "remove"))?;
                }
                Err(e) => return Err(err(&self.path, "remove")(io::Error::from(e))),
            }
        }
        let st = nix::sys::stat::fstat(home.as_fd()).map_err(|e| sys("stat", e))?;
        let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if !is_dir || st.st_mode & 0o7777 != HOME_MODE || (st.st_uid, st.st_gid) != (uid, gid) {
            return Err(reuse("its mode or owner changed"));
        }
        for entry in home.iter() {
            let entry = entry.map_err(|e| sys("list", e))?;
            if ![&b"."[..], &b".."[..]].contains(&entry.file_name().to_bytes()) {
                return Err(reuse("an entry was left in it"));
            }
        }
        let names = match crate::sys::xattr::names_fd(home.as_fd()) {
            Ok(names) => names,
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => Vec::new(),
            Err(e) => return Err(err(&self.home, "list the attributes of")(e)),
        };
        if names.iter().any(|n| n.starts_with(b"user.") || n.starts_with(b"system.posix_acl")) {
            return Err(reuse("an extended attribute was set on it"));
        }
        let owner = self.owner;
        self.fresh(&home, owner)
    }

    /// Removes the run directory and what the run left in it, without
    /// following symlinks, leaving the home; [`RunDir::renew`] then only
    /// makes the next one.
    ///
    /// # Errors
    ///
    /// [`RunDirError`] naming the path.
    pub fn clear(&mut self) -> Result<(), RunDirError> {
        if self.path.as_os_str().is_empty() {
            return Ok(());
        }
        match fs::remove_dir(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(_) => host::tree::remove_all(&self.path).map_err(err(&self.path, "remove")),
        }
    }

    /// Hands the run directory to `owner` = `(uid, gid)`; `None` gives it
    /// back to the executor's user. Nothing is done when it already belongs
    /// to `owner`.
    ///
    /// # Errors
    ///
    /// [`RunDirError`] naming the path.
    pub fn chown(&mut self, owner: Option<(u32, u32)>) -> Result<(), RunDirError> {
        if owner == self.owner {
            return Ok(());
        }
        let (uid, gid) = match owner {
            Some(ids) => ids,
            None => (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw()),
        };
        std::os::unix::fs::chown(&self.path, Some(uid), Some(gid))
            .map_err(|source| RunDirError { path: self.path.clone(), what: "chown", source })?;
        self.owner = owner;
        Ok(())
    }

    /// A `RunDir` that owns nothing (what is left behind once the
    /// directory was handed over for removal).
    pub fn detached() -> Self {
        RunDir {
            home: PathBuf::new(),
            path: PathBuf::new(),
            owner: None,
            rulesets: crate::sandbox::landlock::Cache::default(),
        }
    }

    /// Who the run directory was handed to (`None`: the executor's user).
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.owner
    }

    /// The run directory (the skill's cwd).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The slot's directory the run directory is in (what the Landlock
    /// ruleset grants).
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// Removes the home and everything in it without following symlinks,
    /// however deep the run nested its directories (`host::tree`).
    pub fn remove(&mut self) {
        if self.home.as_os_str().is_empty() {
            return;
        }
        if let Err(e) = host::tree::remove_all(&self.home) {
            tracing::warn!("run directory {}: cannot remove: {e}", self.home.display());
        }
        self.home = PathBuf::new();
        self.path = PathBuf::new();
        self.rulesets = crate::sandbox::landlock::Cache::default();
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_and_remove_without_following_symlinks() {
        let rt = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "x").unwrap();
        let id = random_id().unwrap();
        assert_eq!(id.len(), 16);
        let mut d = RunDir::create(&rt.path().join("runs"), &id, None).unwrap();
        let mode = std::fs::metadata(d.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::os::unix::fs::symlink(outside.path(), d.path().join("link")).unwrap();
        let p = d.path().to_owned();
        assert_eq!(p.parent(), Some(d.home()));
        let home_mode = std::fs::metadata(d.home()).unwrap().permissions().mode() & 0o777;
        assert_eq!(home_mode, 0o711);
        d.remove();
        assert!(!p.exists());
        assert!(!p.parent().unwrap().exists(), "the home is left");
        assert!(outside.path().join("keep").exists());
    }

    /// A renewed home gets a new, empty run directory and the old one is
    /// gone; a home that was changed (an entry beside the run directory, its
    /// mode, a user attribute) is refused for reuse.
    #[test]
    fn a_home_is_renewed_only_as_it_was_made() {
        let rt = tempfile::tempdir().unwrap();
        let runs = rt.path().join("runs");
        let mut d = RunDir::create(&runs, &random_id().unwrap(), None).unwrap();
        std::fs::write(d.path().join("left"), "x").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        let first = d.path().to_owned();
        d.renew().expect("renew");
        assert!(!first.exists(), "the old run directory is left");
        assert_ne!(d.path(), first);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(d.home()).unwrap().count(), 1);

        std::fs::write(d.home().join("beside"), "x").unwrap();
        assert!(d.renew().is_err(), "an entry beside the run directory");
        std::fs::remove_file(d.home().join("beside")).unwrap();
        d.renew().expect("renew once clean again");

        std::fs::set_permissions(d.home(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(d.renew().is_err(), "a changed mode");
        std::fs::set_permissions(d.home(), std::fs::Permissions::from_mode(0o711)).unwrap();
        d.renew().expect("renew once the mode is back");

        // The owner of the last run's directory gets the new one (made as
        // root here; unprivileged, a chown to another user fails).
        if nix::unistd::geteuid().is_root() {
            use std::os::unix::fs::MetadataExt;
            d.chown(Some((65534, 65534))).unwrap();
            let before = d.path().to_owned();
            d.renew().expect("renew a handed-over directory");
            assert_ne!(d.path(), before);
            let st = std::fs::metadata(d.path()).unwrap();
            assert_eq!((st.uid(), st.gid(), st.mode() & 0o7777), (65534, 65534, 0o700));
            assert_eq!(d.owner(), Some((65534, 65534)));
            d.chown(None).unwrap();
            d.renew().unwrap();
            assert_eq!(std::fs::metadata(d.path()).unwrap().uid(), 0);
        } else {
            println!("SKIP: handing the run directory over needs root");
        }

        match crate::sys::xattr::set(d.home(), c"user.note", b"x") {
            Ok(()) => assert!(d.renew().is_err(), "a user attribute"),
            Err(e) => println!("SKIP: user attributes unsupported here: {e}"),
        }
        d.remove();
    }
}
