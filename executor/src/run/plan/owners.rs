//! Who may own the files a run is read from: the manifest, the entry,
//! every folder between each and its root, and the folders a symlinked
//! entry path crosses as written. Whoever may write one of them may change
//! what runs under the skill's name and grant.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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

    /// The folders `written` crosses as written (a symlinked folder on the
    /// way, or a symlink as the entry: the folder holding the link) that
    /// lie under one of `roots` once resolved; each must pass as the
    /// resolved chain does. Folders outside every root are the operator's.
    pub(super) fn crossed(&self, written: &Path, roots: &[PathBuf]) -> Result<(), Refusal> {
        for folder in written.ancestors().skip(1) {
            let Ok(real) = fs::canonicalize(folder) else { continue };
            if !roots.iter().any(|r| is_within(&real, r)) {
                continue;
            }
            let m = fs::metadata(&real).map_err(|e| (folder.to_owned(), e.to_string()))?;
            self.check(folder, &m)?;
        }
        Ok(())
    }
}
