//! The unprivileged side of ongrid-skills: the skill loader (and later the
//! registry daemon `ongrid-skilld`) and the `ongrid-skill` CLI.
//!
//! # Layout
//!
//! - [`roots`]: `ONGRID_SKILLS_EXTERNAL_DIRS` parsing and root resolution.
//! - [`scan`]: [`Scanner`] walks the roots and returns a [`ScanReport`].
//! - [`manifest_file`]: bounded, non-blocking reading of one `skill.json`.
//! - [`entry`]: resolving a manifest's `entry` under its allow-list root.
//! - [`event`]: [`ScanEvent`], one per decision; `Display` is the log line.
//! - [`skill`]: [`RegisteredSkill`], a manifest plus its canonical paths.
//! - [`cli`]: the `ongrid-skill` commands, one file each (`scan`, `validate`).
//!
//! # Loader rules
//!
//! DESIGN.md §2, implemented by [`scan`] and [`entry`]: absolute roots only,
//! missing roots skipped, a symlinked root resolved once, symlinked
//! directories never followed, only regular files named `skill.json`, at
//! most 1 MiB each, entries canonicalised and kept under their root by path
//! components, first name wins. Nothing stops a scan: every problem is a
//! [`ScanEvent`] and the scan goes on.
//!
//! # Logging
//!
//! The library does not log. Callers print [`ScanEvent`]s (the CLI, on
//! stderr, byte for byte as DESIGN.md §2 spells them) or trace them at
//! [`ScanEvent::level`] (the daemon).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cli;
pub mod entry;
pub mod event;
pub mod manifest_file;
pub mod roots;
pub mod scan;
pub mod skill;

pub use event::{Level, ScanEvent};
pub use scan::{ScanReport, ScanTarget, Scanner};
pub use skill::RegisteredSkill;
