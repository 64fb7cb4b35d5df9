//! The unprivileged side of ongrid-skills: the skill loader, the registry
//! daemon `ongrid-skilld` and the `ongrid-skill` CLI, one folder each.
//!
//! # Layout
//!
//! - [`scan`]: the scan library. [`Scanner`] walks the skill roots and
//!   returns a [`ScanReport`]: the [`RegisteredSkill`]s and a [`ScanEvent`]
//!   per decision. Pure of the daemon and the CLI: both use it.
//! - [`daemon`]: `ongrid-skilld`, the registry daemon: its configuration,
//!   the Unix-socket server and its HTTP routes ([`daemon::api`]), who may
//!   run what ([`daemon::authz`]), the audit trail ([`daemon::audit`]), the
//!   client of the executor and the metrics. Uses [`scan`], never [`cli`].
//! - [`cli`]: `ongrid-skill`, the command-line front end, one file per
//!   command, with the HTTP client it talks to the daemon with
//!   ([`cli::client`]) and `up`, which runs both daemons in the foreground.
//!   Uses [`scan`] and the daemon's types it starts or reads.
//!
//! # Loader rules
//!
//! Implemented by [`scan`] and [`scan::entry`]: absolute roots only,
//! missing roots skipped, a symlinked root resolved once, symlinked
//! directories never followed, only regular files named `skill.json`, at
//! most 1 MiB each, entries canonicalised and kept under their root by path
//! components, first name wins. Nothing stops a scan: every problem is a
//! [`ScanEvent`] and the scan goes on.
//!
//! # Examples
//!
//! ```
//! # use std::{fs, os::unix::fs::PermissionsExt};
//! # let tmp = tempfile::tempdir().unwrap();
//! # let root = tmp.path().join("skills");
//! # fs::create_dir_all(root.join("disk")).unwrap();
//! # fs::write(root.join("disk/run"), "#!/bin/sh\n").unwrap();
//! # fs::set_permissions(root.join("disk/run"), fs::Permissions::from_mode(0o755)).unwrap();
//! # fs::write(root.join("disk/skill.json"),
//! #     r#"{"name":"disk_usage","description":"Disk usage","entry":"run"}"#).unwrap();
//! # let value = root.to_str().unwrap();
//! // `value` is the content of ONGRID_SKILLS_EXTERNAL_DIRS.
//! let roots = loader::scan::roots::parse_dirs(value);
//! let report = loader::Scanner::default().scan(&roots);
//! for event in &report.events {
//!     eprintln!("{event}"); // skill loader: registered subprocess skill "disk_usage" from ...
//! }
//! assert_eq!(report.registered(), 1);
//! assert!(report.get("disk_usage").is_some());
//! ```
//!
//! # Logging
//!
//! The scan library does not log. Callers print [`ScanEvent`]s (the CLI, on
//! stderr, byte for byte the same lines as the daemon) or trace them at
//! [`ScanEvent::level`] (the daemon).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cli;
pub mod daemon;
pub mod scan;

pub use scan::event::{Level, ScanEvent};
pub use scan::skill::RegisteredSkill;
pub use scan::{ScanReport, ScanTarget, Scanner};
