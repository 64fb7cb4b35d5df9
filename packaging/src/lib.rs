//! Package metadata carrier for `ongrid-skills` (.deb and .rpm).
//!
//! This crate holds no code. Its `Cargo.toml` carries the
//! `[package.metadata.deb]` (cargo-deb) and `[package.metadata.generate-rpm]`
//! (cargo-generate-rpm) tables that package the binaries of the `loader` and
//! `executor` crates together with the systemd units, sysusers and tmpfiles
//! entries, default configuration and example skill packs kept in this
//! folder. Build both packages with `packaging/build.sh`; see
//! `packaging/README.md`.
