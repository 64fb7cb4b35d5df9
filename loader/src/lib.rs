//! The unprivileged side of ongrid-skills: the skill loader, the registry
//! daemon `ongrid-skilld` and the `ongrid-skill` CLI.
//!
//! # Layout
//!
//! - [`roots`]: `ONGRID_SKILLS_EXTERNAL_DIRS` parsing and root resolution.
//! - [`scan`]: [`Scanner`] walks the roots and returns a [`ScanReport`].
//! - [`manifest_file`]: bounded, non-blocking reading of one `skill.json`.
//! - [`entry`]: resolving a manifest's `entry` under its allow-list root.
//! - [`build`]: the checks of a valid manifest before its skill is
//!   registered (entry, schema compiled), each failure a `build` line.
//! - [`event`]: [`ScanEvent`], one per decision; `Display` is the log line.
//! - [`skill`]: [`RegisteredSkill`], a manifest plus its canonical paths
//!   (and, for a SKILL.md tool, the tool's name: `source` `skill.md`).
//! - [`requirements`]: a SKILL.md's `metadata.os` and `requires`
//!   (bins on the loader's `PATH`, config files, env) checked on this host.
//! - [`cli`]: the `ongrid-skill` commands, one file each (`scan`,
//!   `validate`, `list`, `show`, `run`, `reload`, `up`, `keygen`, `approve`,
//!   `audit`).
//!
//! The daemon, `ongrid-skilld` (layered like mini-redis):
//!
//! - [`config`]: `skilld.toml` and command-line overrides → [`config::Settings`].
//! - [`daemon_cli`]: the `ongrid-skilld` command line (clap), shared with
//!   the man page and completion generator.
//! - [`daemon`]: start-up (bind, first scan) and the serving loop, with the
//!   shutdown signal passed in.
//! - [`systemd`]: readiness notifications and the socket-activated listener.
//! - [`journald`]: log lines with journald's `<N>` priorities, no timestamp,
//!   when stderr is the journal's stream.
//! - [`server`]: the Unix-socket listener: peer credentials
//!   ([`server::Caller`]), connection cap, a task per connection.
//! - [`connection`]: one connection: HTTP/1.1, its timeouts and bounds.
//! - [`quiet_stream`]: the Unix stream both sockets of the daemon use,
//!   registered for write readiness only while a write is blocked.
//! - [`api`]: the client API routes, one file per resource, and `/metrics`.
//! - [`app`]: [`app::App`], the state requests share; reload.
//! - [`registry`]: the registry snapshot, swapped atomically; each skill's
//!   schema kept as text.
//! - [`validators`]: compiled args validators, the most recently used kept
//!   (LRU), compiled again when dropped.
//! - [`authz`]: who may run what: callers mapped to a role and a
//!   permission mode, the class gate, dual-sign approvals.
//! - [`replay`]: approvals are accepted once.
//! - [`audit`]: the SQLite audit trail, one row per decision and run, on
//!   its own thread.
//! - [`executor_client`]: the loader side of the executor wire, one run
//!   at a time per connection, a finished run's connection kept briefly
//!   for the next.
//! - [`metrics`]: the Prometheus metrics in an injected registry.
//! - [`metrics_listener`]: the TCP listener of `/metrics`, bounded so that
//!   no one outside the socket group can take what the API needs.
//! - [`client`]: the HTTP client the CLI talks to the daemon with.
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
//! let roots = loader::roots::parse_dirs(value);
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
//! The library does not log. Callers print [`ScanEvent`]s (the CLI, on
//! stderr, byte for byte as DESIGN.md §2 spells them) or trace them at
//! [`ScanEvent::level`] (the daemon).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod api;
pub mod app;
pub mod audit;
pub mod authz;
pub mod build;
pub mod cli;
pub mod client;
pub mod config;
pub mod connection;
pub mod daemon;
pub mod daemon_cli;
pub mod entry;
pub mod event;
pub mod executor_client;
pub mod journald;
pub mod manifest_file;
pub mod metrics;
pub mod metrics_listener;
pub mod quiet_stream;
pub mod registry;
pub mod replay;
pub mod requirements;
pub mod roots;
pub mod scan;
pub mod server;
pub mod skill;
pub mod systemd;
pub mod validators;

pub use event::{Level, ScanEvent};
pub use scan::{ScanReport, ScanTarget, Scanner};
pub use skill::RegisteredSkill;
