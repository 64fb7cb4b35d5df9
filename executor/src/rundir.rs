//! The private per-run directory: the skill's cwd, removed after the run.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

/// `<runtime_dir>/runs/<instance>/<id>`, mode 0700, owned by the run-as
/// user.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    /// Who it was handed to (`None`: the executor's own user).
    owner: Option<(u32, u32)>,
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

impl RunDir {
    /// Creates `<runs>/<id>` (and `runs`, mode 0711, if missing); `owner` =
    /// `(uid, gid)` to chown it to.
    ///
    /// # Errors
    ///
    /// [`RunDirError`] naming the path.
    pub fn create(runs: &Path, id: &str, owner: Option<(u32, u32)>) -> Result<Self, RunDirError> {
        fn err<'p>(
            path: &'p Path,
            what: &'static str,
        ) -> impl FnOnce(io::Error) -> RunDirError + 'p {
            move |source| RunDirError { path: path.to_owned(), what, source }
        }
        let path = runs.join(id);
        let mkdir = || fs::DirBuilder::new().mode(0o700).create(&path);
        match mkdir() {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o711)
                    .create(runs)
                    .map_err(err(runs, "create"))?;
                mkdir().map_err(err(&path, "create"))?;
            }
            Err(e) => return Err(err(&path, "create")(e)),
        }
        let mut dir = RunDir { path, owner: None };
        fs::set_permissions(&dir.path, fs::Permissions::from_mode(0o700))
            .map_err(err(&dir.path, "chmod"))?;
        dir.chown(owner)?;
        Ok(dir)
    }

    /// Hands the directory to `owner` = `(uid, gid)`; `None` gives it back
    /// to the executor's user. Nothing is done when it already belongs to
    /// `owner`.
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
        RunDir { path: PathBuf::new(), owner: None }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory and everything in it without following
    /// symlinks (std's `remove_dir_all` works on directory fds with
    /// `O_NOFOLLOW`).
    pub fn remove(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        if let Err(e) = fs::remove_dir_all(&self.path) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!("run directory {}: cannot remove: {e}", self.path.display());
            }
        }
        self.path = PathBuf::new();
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
        d.remove();
        assert!(!p.exists());
        assert!(outside.path().join("keep").exists());
    }
}
