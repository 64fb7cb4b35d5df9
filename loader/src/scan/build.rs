//! Building a registered skill out of a valid manifest: every check the
//! scan makes after parsing and before the skill's name counts as taken.
//!
//! A manifest that fails one of them is skipped with
//! `skill loader: build "NAME": REASON` and leaves its name
//! free for the next manifest that names it. The checks, cheapest first:
//!
//! 1. the manifest's path is UTF-8: the executor wire names the manifest
//!    as a JSON string, so a skill at any other path could be listed but
//!    never run (the entry needs no such check: the executor resolves it
//!    itself, from the manifest);
//! 2. the entry resolves under its allow-list root ([`crate::scan::entry`]);
//! 3. the schema compiles ([`crate::scan::validators::compile`]); the compiled
//!    validator is handed on with the skill, so that the registry does not
//!    compile it again.
//!
//! `ongrid-skill scan`, `ongrid-skill validate` and `ongrid-skilld` all
//! register through here, so they agree on what is registered.

use std::path::PathBuf;

use policy::{Manifest, ManifestDigest};

use crate::scan::entry::{self, EntryError, EntryScope};
use crate::scan::skill::RegisteredSkill;
use crate::scan::validators::{self, Compiled};

/// Why a valid manifest is not registered. Its `Display` is the `REASON`
/// of `skill loader: build "NAME": REASON`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The manifest's path is not UTF-8, so the executor cannot be asked
    /// to run it. Named lossily (`\u{fffd}` for each byte that is not
    /// UTF-8); log lines and the CLI escape its control characters.
    #[error("manifest path {} is not UTF-8", path.display())]
    ManifestPathNotUtf8 {
        /// The manifest's path.
        path: PathBuf,
    },
    /// The entry is refused.
    #[error(transparent)]
    Entry(#[from] EntryError),
    /// The schema does not compile (an unknown `$ref`, a bad regex, a
    /// keyword of the wrong type).
    #[error("schema in {} does not compile: {message}", manifest.display())]
    Schema {
        /// The manifest holding the schema.
        manifest: PathBuf,
        /// The compiler's message.
        message: String,
    },
}

/// A skill that passed every check, with its compiled args validator.
#[derive(Debug)]
pub struct Built {
    /// The skill.
    pub skill: RegisteredSkill,
    /// Its schema, compiled.
    pub validator: Compiled,
}

/// Checks `manifest`, found at `manifest_path` under `scope.root`, and
/// builds its skill (as the tool `tool` of a SKILL.md when given), read
/// from bytes whose digest is `digest`.
///
/// # Errors
///
/// The first check that fails, as a [`BuildError`].
pub fn build(
    (manifest, digest): (Manifest, ManifestDigest),
    manifest_path: PathBuf,
    scope: EntryScope<'_>,
    tool: Option<&str>,
) -> Result<Built, BuildError> {
    if manifest_path.to_str().is_none() {
        return Err(BuildError::ManifestPathNotUtf8 { path: manifest_path });
    }
    // `manifest_path` came from walking the root (or joining a file name
    // to it), so it has a parent.
    let dir = manifest_path.parent().unwrap_or(scope.root);
    let entry = entry::resolve(manifest.entry(), dir, scope)?;
    let validator = validators::compile(manifest.schema())
        .map_err(|message| BuildError::Schema { manifest: manifest_path.clone(), message })?;
    let skill = RegisteredSkill::new(manifest, entry, manifest_path, scope.root.to_path_buf())
        .with_digest(digest);
    let skill = match tool {
        Some(t) => skill.with_tool(t),
        None => skill,
    };
    Ok(Built { skill, validator })
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::fs;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use policy::ValidateOptions;

    use super::*;

    fn manifest(schema: &str) -> Manifest {
        let text = format!(r#"{{"name":"x","description":"d","entry":"run","schema":{schema}}}"#);
        Manifest::from_slice(text.as_bytes(), &ValidateOptions::default()).unwrap()
    }

    /// A canonical root holding an executable `dir/run`; the manifest path.
    fn pack(root: &Path, dir: &OsStr) -> PathBuf {
        let dir = root.join(dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("run"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(dir.join("run"), fs::Permissions::from_mode(0o755)).unwrap();
        dir.join("skill.json")
    }

    #[test]
    fn a_valid_manifest_is_built_with_its_validator() {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let path = pack(&root, OsStr::new("p"));
        let scope = EntryScope { root: &root, all_roots: &[] };
        let schema = r#"{"type":"object","required":["a"]}"#;
        let built =
            build((manifest(schema), ManifestDigest::of(b"m")), path.clone(), scope, Some("t"))
                .unwrap();
        assert_eq!(built.skill.manifest_path(), path);
        assert_eq!(built.skill.entry(), root.join("p/run"));
        assert_eq!(built.skill.tool(), Some("t"));
        assert!(built.validator.is_valid(&serde_json::json!({"a": 1})));
        assert!(!built.validator.is_valid(&serde_json::json!({})));
    }

    #[test]
    fn a_schema_that_does_not_compile_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let path = pack(&root, OsStr::new("p"));
        let scope = EntryScope { root: &root, all_roots: &[] };
        for schema in [
            r#"{"properties":{"a":{"pattern":"("}}}"#,
            r##"{"$ref":"https://example.invalid/s.json"}"##,
            r#"{"type":"object","minLength":"three"}"#,
        ] {
            let e = build((manifest(schema), ManifestDigest::of(b"m")), path.clone(), scope, None)
                .unwrap_err();
            assert!(matches!(e, BuildError::Schema { .. }), "{schema}: {e:?}");
            let want = format!("schema in {} does not compile: ", path.display());
            assert!(e.to_string().starts_with(&want), "{e}");
        }
    }

    #[test]
    fn a_manifest_path_that_is_not_utf8_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let path = pack(&root, OsStr::from_bytes(b"n\xffu"));
        let scope = EntryScope { root: &root, all_roots: &[] };
        let e =
            build((manifest(r#"{"type":"object"}"#), ManifestDigest::of(b"m")), path, scope, None)
                .unwrap_err();
        assert!(matches!(e, BuildError::ManifestPathNotUtf8 { .. }), "{e:?}");
        let want = format!("manifest path {}/n\u{fffd}u/skill.json is not UTF-8", root.display());
        assert_eq!(e.to_string(), want);
    }
}
