//! Who may own the files a run is read from: the manifest, the entry,
//! every folder between each and its root, and every folder a symlinked
//! entry path is resolved through. Whoever may write one of them may change
//! what runs under the skill's name and grant.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use policy::path::is_within;

/// The owners allowed: `entry_owners` and the executor's own user. A file
/// or folder must be owned by one of them and be neither group- nor
/// world-writable.
pub(super) struct Owners<'a> {
    uids: Vec<u32>,
    names: &'a [String],
}

/// The path at fault and why.
pub(super) type Refusal = (PathBuf, String);

impl<'a> Owners<'a> {
    pub(super) fn new(uids: Vec<u32>, names: &'a [String]) -> Self {
        Self { uids, names }
    }

    fn check(&self, path: &Path, meta: &fs::Metadata) -> Result<(), Refusal> {
        if !self.uids.contains(&meta.uid()) {
            let reason =
                format!("owned by uid {}, not by one of entry_owners {:?}", meta.uid(), self.names);
            return Err((path.to_owned(), reason));
        }
        if meta.mode() & 0o022 != 0 {
            let reason = format!("group or world writable (mode {:o})", meta.mode() & 0o7777);
            return Err((path.to_owned(), reason));
        }
        Ok(())
    }

    /// `path` (canonical, its metadata `meta`) and every folder up to
    /// `root`, stopping early at a folder `done` says was checked already.
    pub(super) fn chain(
        &self,
        path: &Path,
        meta: &fs::Metadata,
        root: &Path,
        done: impl Fn(&Path) -> bool,
    ) -> Result<(), Refusal> {
        self.check(path, meta)?;
        let mut at = path;
        while at != root {
            let Some(parent) = at.parent() else { break };
            if done(parent) {
                break;
            }
            let m = fs::metadata(parent).map_err(|e| (parent.to_owned(), e.to_string()))?;
            self.check(parent, &m)?;
            at = parent;
        }
        Ok(())
    }

    /// Every folder under one of `roots` whose entries the kernel consults
    /// to resolve `written` (absolute): walked as the kernel walks it, one
    /// name at a time, each symlink's target walked in turn (a link to a
    /// link included). Whoever may write such a folder may point a link in
    /// it at another file without the manifest changing. Folders outside
    /// every root are the operator's.
    pub(super) fn walked(&self, written: &Path, roots: &[PathBuf]) -> Result<(), Refusal> {
        let mut todo: VecDeque<OsString> = names(written);
        let mut at = PathBuf::from("/");
        let mut checked: Vec<PathBuf> = Vec::new();
        let mut links = 0;
        while let Some(name) = todo.pop_front() {
            if name == ".." {
                at.pop();
                continue;
            }
            if !checked.contains(&at) && roots.iter().any(|r| is_within(&at, r)) {
                let m = fs::metadata(&at).map_err(|e| (at.clone(), e.to_string()))?;
                self.check(&at, &m)?;
                checked.push(at.clone());
            }
            let next = at.join(&name);
            let m = fs::symlink_metadata(&next).map_err(|e| (next.clone(), e.to_string()))?;
            if !m.file_type().is_symlink() {
                at = next;
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                return Err((written.to_owned(), "too many levels of symbolic links".into()));
            }
            let target = fs::read_link(&next).map_err(|e| (next.clone(), e.to_string()))?;
            if target.is_absolute() {
                at = PathBuf::from("/");
            }
            for n in names(&target).into_iter().rev() {
                todo.push_front(n);
            }
        }
        Ok(())
    }
}

/// The kernel's bound on symlinks followed in one lookup.
const MAX_LINKS: usize = 40;

/// The names of `path`, `.` dropped (`..` kept: it is walked).
fn names(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}
