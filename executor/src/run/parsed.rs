//! Manifests parsed once per file content: the parse of an opened manifest
//! ([`Located`]) is kept by its canonical path and tool, and reused while
//! the open file has the same device, inode, size, mtime and ctime. A
//! manifest that changes (rewritten, renamed over, touched) is read and
//! parsed again; a file replaced by another one is another inode. The
//! digest of the bytes parsed is kept with the parse.
//!
//! Two users: the server's pre-admission check
//! (`server`'s `ManifestCache`), which hands the parse to the run's
//! plan, and [`crate::Engine`] itself for runs named by path (a library
//! caller, a benchmark), so no run parses a manifest it parsed before.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use policy::{Manifest, ManifestDigest, ValidateOptions};

use crate::config::Config;
use crate::run::plan::{Located, PlanError};

/// Entries kept before the cache is cleared (manifests live in the
/// operator's roots, so this bounds only a caller probing many paths).
pub const MAX_ENTRIES: usize = 4096;

pub use super::file_key::FileKey;

type Entries = HashMap<(PathBuf, Option<String>), (FileKey, Parsed)>;

/// A manifest's parse and the digest of the bytes it was parsed from.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The parse.
    pub manifest: Arc<Manifest>,
    /// The digest of the file's bytes.
    pub digest: ManifestDigest,
}

/// See the module docs.
#[derive(Debug)]
pub struct ParsedManifests {
    opts: ValidateOptions,
    entries: Mutex<Entries>,
}

impl ParsedManifests {
    /// A cache validating with `config`'s options (its timeout ceiling).
    pub fn new(config: &Config) -> Self {
        ParsedManifests {
            opts: ValidateOptions { max_timeout: config.max_timeout() },
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Opens the manifest at `path` under one of `roots` ([`Located::open`])
    /// and attaches its parse ([`ParsedManifests::get`]): what a run's
    /// plan ([`crate::run::plan::Plan::build_located`]) takes.
    ///
    /// # Errors
    ///
    /// What [`Located::open`] and [`ParsedManifests::get`] say.
    pub fn locate(
        &self,
        roots: &[PathBuf],
        path: &Path,
        tool: Option<&str>,
    ) -> Result<Located, PlanError> {
        let located = Located::open(roots, path)?;
        let parsed = self.get(&located, tool)?;
        Ok(located.parsed_as(parsed.manifest))
    }

    /// The manifest (one `tool` of a `SKILL.md`, or with `None` a
    /// `skill.json`: [`crate::run::plan::parse_manifest`]) in `located`'s open file: the kept
    /// parse when the file is as it was, else read and parsed now; with
    /// the digest of the bytes parsed.
    ///
    /// # Errors
    ///
    /// [`PlanError::Read`] when the file cannot be read or is not a regular
    /// file, else what [`crate::run::plan::parse_manifest`] says.
    pub fn get(&self, located: &Located, tool: Option<&str>) -> Result<Parsed, PlanError> {
        let path = located.path();
        let read_err = |error| PlanError::Read { path: path.to_owned(), error };
        let meta = located.file().metadata().map_err(read_err)?;
        if !meta.is_file() {
            return Err(read_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let key = FileKey::of(&meta);
        let cache_key = (path.to_owned(), tool.map(str::to_owned));
        if let Some((k, parsed)) = self.lock().get(&cache_key) {
            if *k == key {
                return Ok(parsed.clone());
            }
        }
        let (manifest, digest) = located.parse(tool, &self.opts)?;
        let parsed = Parsed { manifest: Arc::new(manifest), digest };
        let mut entries = self.lock();
        if entries.len() >= MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(cache_key, (key, parsed.clone()));
        Ok(parsed)
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // Every update is one insert or clear: a poisoned map is consistent.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Manifests kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Returns true if and only if nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use super::*;

    fn write(dir: &Path, timeout: u32) -> PathBuf {
        let m = dir.join("skill.json");
        fs::write(
            &m,
            format!(r#"{{"name":"p","description":"d","entry":"x","timeout_seconds":{timeout}}}"#),
        )
        .unwrap();
        m
    }

    #[test]
    fn kept_while_the_file_is_the_same_and_read_again_when_it_changes() {
        let root = tempfile::tempdir().unwrap();
        let config = Config { roots: vec![root.path().to_owned()], ..Config::default() };
        let cache = ParsedManifests::new(&config);
        let m = write(root.path(), 5);
        let open = || Located::open(&config.roots, &m).unwrap();
        let first = cache.get(&open(), None).unwrap();
        assert_eq!(first.manifest.timeout().as_secs(), 5);
        assert_eq!(first.digest, ManifestDigest::of(&fs::read(&m).unwrap()));
        let again = cache.get(&open(), None).unwrap();
        assert!(Arc::ptr_eq(&first.manifest, &again.manifest), "the same file is not parsed again");
        assert_eq!(first.digest, again.digest);
        assert_eq!(cache.len(), 1);

        // Rewritten in place (size, mtime, ctime): read again.
        std::thread::sleep(std::time::Duration::from_millis(5));
        write(root.path(), 7);
        let seven = cache.get(&open(), None).unwrap();
        assert_eq!(seven.manifest.timeout().as_secs(), 7);
        assert_ne!(seven.digest, first.digest);
        // Another file renamed over it, same size: another inode.
        let other = root.path().join("other.json");
        fs::copy(&m, &other).unwrap();
        fs::write(&other, fs::read_to_string(&m).unwrap().replace(":7", ":9")).unwrap();
        fs::rename(&other, &m).unwrap();
        assert_eq!(cache.get(&open(), None).unwrap().manifest.timeout().as_secs(), 9);

        // Broken, a directory: errors, nothing kept for them.
        fs::write(&m, "{").unwrap();
        assert!(matches!(cache.get(&open(), None), Err(PlanError::Manifest { .. })));
        let dir = Located::open(&config.roots, root.path()).unwrap();
        let e = cache.get(&dir, None).unwrap_err();
        assert!(
            matches!(&e, PlanError::Read { error, .. } if error.to_string() == "not a regular file"),
            "{e:?}"
        );
        // A tool for a skill.json is refused by the parse, not served.
        write(root.path(), 5);
        assert!(matches!(cache.get(&open(), Some("t")), Err(PlanError::Tool { .. })));
    }
}
