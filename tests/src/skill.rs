//! A throw-away skill folder: `skill.json` plus an entry, traversable by the
//! run-as user, removed on drop.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::config::Config;
use crate::run::{Run, RunOptions};

/// A skill folder under the system temp dir (for served runs, under the
/// served executors' root), named `ongrid-sbx-<case>-XXXX`.
/// The folder name is the run's marker: every process the run starts from
/// the folder carries it in its executable path.
#[derive(Debug)]
pub struct SkillDir {
    dir: tempfile::TempDir,
    name: String,
    manifest: Value,
}

impl SkillDir {
    /// An empty skill named after `case` (`[a-z0-9_]` kept, the rest `_`),
    /// with a manifest whose entry is `entry` and whose timeout is 2 s.
    ///
    /// # Panics
    ///
    /// When the folder cannot be created.
    pub fn new(case: &str, entry: &str) -> Self {
        Self::new_in(case, entry, crate::served::via() == crate::served::Via::Serve)
    }

    /// [`SkillDir::new`], under the served executors' root when `served`
    /// whatever `ONGRID_SANDBOX_VIA` says (a one-shot run takes a skill
    /// there too: its root is then its own folder).
    ///
    /// # Panics
    ///
    /// When the folder cannot be created.
    pub fn new_in(case: &str, entry: &str, served: bool) -> Self {
        let name: String = case
            .chars()
            .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() { c } else { '_' })
            .collect();
        let prefix = format!("ongrid-sbx-{name}-");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix);
        // A served executor takes only skills under its allow-list root.
        let dir = if served {
            builder.tempdir_in(crate::served::skills_root())
        } else {
            builder.tempdir()
        }
        .expect("create skill dir");
        set_mode(dir.path(), 0o755);
        let manifest = json!({
            "name": name,
            "description": format!("adversarial sandbox case {case}"),
            "entry": entry,
            "timeout_seconds": 2,
        });
        Self { dir, name, manifest }
    }

    /// A skill whose entry is a copy of the `attack` binary at `attack_bin`.
    pub fn attack(case: &str, attack_bin: &Path) -> Self {
        let s = Self::new(case, "attack");
        s.copy_file(attack_bin, "attack", 0o755);
        s
    }

    /// [`SkillDir::attack`] under the served executors' root.
    pub fn served_attack(case: &str, attack_bin: &Path) -> Self {
        let s = Self::new_in(case, "attack", true);
        s.copy_file(attack_bin, "attack", 0o755);
        s
    }

    /// [`SkillDir::script`] under the served executors' root.
    pub fn served_script(case: &str, body: &str) -> Self {
        let s = Self::new_in(case, "run.sh", true);
        s.write_file("run.sh", &format!("#!/bin/sh\n{body}\n"), 0o755);
        s
    }

    /// A skill whose entry is a `/bin/sh` script.
    pub fn script(case: &str, body: &str) -> Self {
        let s = Self::new(case, "run.sh");
        s.write_file("run.sh", &format!("#!/bin/sh\n{body}\n"), 0o755);
        s
    }

    /// The skill's name (also the `[skills.NAME]` key of its grants).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The folder's unique name, found in every path below it.
    pub fn marker(&self) -> &str {
        self.dir.path().file_name().and_then(|n| n.to_str()).expect("utf-8 temp dir name")
    }

    /// Path of `skill.json`.
    pub fn manifest_path(&self) -> PathBuf {
        self.path().join("skill.json")
    }

    /// Sets a top-level manifest field (`timeout_seconds`, `env_allow`, `sandbox`...).
    #[must_use]
    pub fn with(mut self, field: &str, value: Value) -> Self {
        self.manifest[field] = value;
        self
    }

    /// Removes a manifest field.
    #[must_use]
    pub fn without(mut self, field: &str) -> Self {
        if let Some(o) = self.manifest.as_object_mut() {
            o.remove(field);
        }
        self
    }

    /// Writes a file into the folder with `mode`.
    ///
    /// # Panics
    ///
    /// On I/O errors.
    pub fn write_file(&self, rel: &str, contents: &str, mode: u32) -> PathBuf {
        let p = self.path().join(rel);
        fs::write(&p, contents).expect("write skill file");
        set_mode(&p, mode);
        p
    }

    /// Copies a file into the folder with `mode`.
    ///
    /// # Panics
    ///
    /// On I/O errors.
    pub fn copy_file(&self, from: &Path, rel: &str, mode: u32) -> PathBuf {
        let p = self.path().join(rel);
        fs::copy(from, &p).unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), rel));
        set_mode(&p, mode);
        p
    }

    /// Writes the manifest as it stands.
    ///
    /// # Panics
    ///
    /// On I/O errors.
    pub fn write_manifest(&self) {
        let text = serde_json::to_vec_pretty(&self.manifest).expect("manifest serialises");
        fs::write(self.manifest_path(), text).expect("write skill.json");
        set_mode(&self.manifest_path(), 0o644);
    }

    /// Runs the skill under the executor with `args` on its stdin.
    pub fn run(&self, config: &Config, args: &Value) -> Run {
        self.run_with(config, RunOptions::args(args))
    }

    /// Runs the skill with full control of the invocation.
    pub fn run_with(&self, config: &Config, opts: RunOptions) -> Run {
        self.write_manifest();
        let timeout = self.manifest["timeout_seconds"].as_u64().filter(|t| *t > 0).unwrap_or(30);
        crate::run::run(&self.manifest_path(), config, opts, timeout)
    }
}

/// `chmod`.
///
/// # Panics
///
/// On I/O errors.
pub fn set_mode(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, p.display()));
}
