//! Pure data and rules shared by every ongrid-skills component.
//!
//! # Layout
//!
//! - [`name`]: [`SkillName`], the validated `[a-z0-9_]+` skill identifier.
//! - [`class`]: [`SkillClass`] (`safe`, `mutating`, `dangerous`).
//! - [`egress`]: `connect` entries of a network grant and the resolved
//!   egress rules (allow list behind the default refusals) a run gets.
//! - [`env`]: [`EnvName`], environment variable names a manifest may forward.
//! - [`manifest`]: `skill.json` parsed into a [`Manifest`] that only holds valid values.
//! - [`digest`]: [`ManifestDigest`], the SHA-256 of a manifest's bytes, which a
//!   run carries from the loader's scan to the executor.
//! - [`sandbox`]: the manifest's `sandbox` request, the operator's per-skill
//!   [`SkillGrant`], and the [`GrantedSandbox`] a run gets.
//! - [`limits`]: default resource limits and their bounds.
//! - [`report`]: the [`RunReport`] every run ends with, and what the sandbox enforced.
//! - [`args`]: [`Args`], a run's args object kept as the text the caller
//!   sent (unique keys; the skill reads it exactly).
//! - [`canonical`]: canonical JSON of a text (sorted keys, numbers as
//!   written) for the approvals' digest, in one pass.
//! - [`raw_json`]: [`RawJson`], a JSON value kept as the text it arrived as
//!   (a skill's result is returned verbatim).
//! - [`path`]: pure, component-wise path rules (lexical containment, normal form).
//! - [`permission`]: [`PermissionMode`] (`read-only`, `mutating-with-confirm`,
//!   `dual-sign-required`), the class [`permission::gate`] and the
//!   [`DenyReason`] codes.
//! - [`approval`]: dual-sign approvals: the canonical digest of a request,
//!   Ed25519 signing and verification, key ids.
//! - [`skillmd`]: `SKILL.md` frontmatter ([`SkillMd`]): requirements and one
//!   [`Manifest`] per tool, shared by the loader and the executor.
//! - [`yaml`]: bounded YAML → JSON (no anchors, aliases or tags; depth,
//!   node and size limits) for that frontmatter.
//! - [`printable`]: text from packs and skills made safe to print: control
//!   characters escaped, one line stays one line.
//! - [`wire`]: the executor wire (newline-delimited JSON-RPC 2.0, capped lines):
//!   `execute`, `ping` and `metrics` requests, and the replies the loader reads.
//!
//! # Trust model
//!
//! Nothing here does I/O. The loader (unprivileged) and the executor (root)
//! run the same validation code; the executor trusts only its own result.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod approval;
pub mod args;
pub mod canonical;
pub mod class;
pub mod digest;
pub mod egress;
pub mod env;
pub mod limits;
pub mod manifest;
pub mod mcp;
pub mod name;
pub mod path;
pub mod permission;
pub mod printable;
pub mod raw_json;
pub mod report;
pub mod sandbox;
pub mod schema;
pub mod skillmd;
mod unique_json;
pub mod wire;
pub mod yaml;

pub use args::{Args, ArgsError};
pub use class::SkillClass;
pub use digest::ManifestDigest;
pub use env::EnvName;
pub use limits::Limits;
pub use manifest::{
    is_manifest_path, Manifest, ManifestError, ValidateOptions, MANIFEST_FILE_NAME,
    MAX_MANIFEST_BYTES, SKILL_MD_FILE_NAME,
};
pub use name::SkillName;
pub use permission::{DenyReason, PermissionMode};
pub use raw_json::RawJson;
pub use report::{
    Denial, DenialKind, DeniedReport, Enforcement, LimitKind, NetworkReport, Outcome, RunReport,
    SandboxReport, MAX_DENIALS,
};
pub use sandbox::{
    GrantError, GrantedPath, GrantedSandbox, SandboxRequest, SkillGrant, DEFAULT_MAX_WARM_TOTAL,
};
pub use schema::Schema;
pub use skillmd::{SkillMd, SkillMdError};
