//! `skill.json`: parsed as JSON, then validated field by field into a
//! [`Manifest`] that can only hold valid values.
//!
//! The text is read with unique keys ([`crate::unique_json`]): a key
//! given twice in any object is refused (`duplicate key "class" (line
//! 3)`), as in SKILL.md frontmatter and in a run's args, rather than read
//! as the last one.
//!
//! Fields (docs/skills.md): `name` (required, `[a-z0-9_]+`), `description`
//! (required), `schema` (JSON Schema of the args object; absent =
//! `{"type":"object","properties":{}}`), `entry` (required), `env_allow`
//! (absent or empty = no environment at all), `timeout_seconds` (0 or
//! absent = 30 s; either way at most the operator maximum; any whole
//! number, `10`, `10.0` or `1e2`, a larger one clamped to the maximum
//! however large), `class` (`safe` default, `mutating`, `dangerous`;
//! case-sensitive), `category` (default `external`, also for an empty or
//! blank one), and our optional `sandbox` object. Unknown top-level fields
//! are ignored and listed in [`Manifest::ignored_fields`] so the caller can
//! log them; unknown fields inside `sandbox` are errors, because a mistyped
//! grant request must not pass unnoticed.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::class::SkillClass;
use crate::env::EnvName;
use crate::limits::{DEFAULT_MAX_TIMEOUT, DEFAULT_TIMEOUT};
use crate::mcp::{McpSpec, PackKind, MCP_FIELDS};
use crate::name::SkillName;
use crate::path::absolute_normal;
use crate::sandbox::{capability_number, SandboxRequest};
use crate::schema::Schema;
use crate::unique_json::{self, UniqueError};

/// Largest `skill.json` accepted, in bytes.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

pub use crate::path::{is_manifest_path, MANIFEST_FILE_NAME, SKILL_MD_FILE_NAME};

/// Longest description accepted, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 16 << 10;
/// The UTF-8 byte order mark, ignored at the start of a `skill.json`.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";
/// Category when the manifest gives none.
pub const DEFAULT_CATEGORY: &str = "external";

/// Operator settings that validation depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidateOptions {
    /// Longest timeout a manifest may ask for; longer ones are clamped.
    pub max_timeout: Duration,
}

impl Default for ValidateOptions {
    fn default() -> Self {
        Self { max_timeout: DEFAULT_MAX_TIMEOUT }
    }
}

/// Why a manifest is invalid. Its `Display` is the `ERROR` of the
/// `skill loader: parse PATH: ERROR` log line.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// More than [`MAX_MANIFEST_BYTES`].
    #[error("manifest is {size} bytes, larger than the {max} byte limit", max = MAX_MANIFEST_BYTES)]
    TooLarge {
        /// Size in bytes.
        size: u64,
    },
    /// Not JSON at all.
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A key given twice in one object (at any depth): refused rather
    /// than read as the last one, which another reader of the file may
    /// not do.
    #[error("duplicate key {key:?} (line {line})")]
    DuplicateKey {
        /// The key.
        key: String,
        /// The line of its second occurrence, from 1.
        line: usize,
    },
    /// JSON, but not an object.
    #[error("manifest must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    /// A required field is absent (or null).
    #[error("missing required field \"{0}\"")]
    Missing(&'static str),
    /// A field has the wrong JSON type.
    #[error("field \"{field}\": expected {expected}, got {found}")]
    WrongType {
        /// Field path, e.g. `sandbox.network`.
        field: String,
        /// The JSON type wanted.
        expected: &'static str,
        /// The JSON type found.
        found: &'static str,
    },
    /// A field has the right type but a bad value.
    #[error("field \"{field}\": {reason}")]
    Invalid {
        /// Field path.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

/// A validated skill manifest. Every value it holds obeys the rules above;
/// the entry is still the manifest's text (resolving it is I/O and belongs
/// to the loader and the executor).
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    name: SkillName,
    description: String,
    schema: Schema,
    output_schema: Option<Schema>,
    entry: String,
    env_allow: Vec<EnvName>,
    timeout: Duration,
    timeout_clamped_from: Option<u64>,
    class: SkillClass,
    category: String,
    sandbox: SandboxRequest,
    mcp: Option<McpSpec>,
    ignored_fields: Vec<String>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn wrong(field: &str, expected: &'static str, v: &Value) -> ManifestError {
    ManifestError::WrongType { field: field.to_owned(), expected, found: type_name(v) }
}

fn invalid(field: &str, reason: impl Into<String>) -> ManifestError {
    ManifestError::Invalid { field: field.to_owned(), reason: reason.into() }
}

/// Present and not null.
fn get<'a>(obj: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    obj.get(field).filter(|v| !v.is_null())
}

fn string<'a>(
    obj: &'a Map<String, Value>,
    field: &'static str,
) -> Result<Option<&'a str>, ManifestError> {
    match get(obj, field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(wrong(field, "a string", v)),
    }
}

fn string_list(v: &Value, field: &str) -> Result<Vec<String>, ManifestError> {
    let Value::Array(items) = v else { return Err(wrong(field, "an array of strings", v)) };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            other => Err(wrong(&format!("{field}[{i}]"), "a string", other)),
        })
        .collect()
}

/// A whole, non-negative JSON number, however it is written (`10`,
/// `10.0` as Python's `json.dumps` writes a float, `1e2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whole {
    /// At most `u64::MAX`.
    Fits(u64),
    /// Larger still (`18446744073709551616`, `1e30`).
    Beyond,
}

/// 2^64, the first whole `f64` past `u64::MAX`.
const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

/// `v` as a [`Whole`]. A fraction, a negative number or another type is
/// refused, quoting the number as `written` in the file when known.
fn whole(v: &Value, field: &str, written: Option<&str>) -> Result<Whole, ManifestError> {
    let Value::Number(n) = v else { return Err(wrong(field, "a non-negative integer", v)) };
    if let Some(u) = n.as_u64() {
        return Ok(Whole::Fits(u));
    }
    // A negative integer, or a number written with a fraction or an
    // exponent, which serde_json reads as an `f64`: whole when it has no
    // fraction left (`10.0`, `1e2`, `1.5e1`); under 2^64 it converts
    // exactly.
    match n.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f < TWO_POW_64 => Ok(Whole::Fits(f as u64)),
        Some(f) if f >= 0.0 && f.fract() == 0.0 => Ok(Whole::Beyond),
        _ => {
            let shown = written.map_or_else(|| n.to_string(), str::to_owned);
            // At most 64 characters of it: a number may be a megabyte long,
            // and the error goes to logs, reports and the audit.
            let cut: String = shown.chars().take(64).collect();
            let more = if cut.len() < shown.len() { "..." } else { "" };
            Err(invalid(field, format!("must be a non-negative integer, got {cut}{more}")))
        }
    }
}

/// `v` as a `u64` (a sandbox bound): whole, and at most `u64::MAX`.
fn unsigned(v: &Value, field: &str) -> Result<u64, ManifestError> {
    match whole(v, field, None)? {
        Whole::Fits(u) => Ok(u),
        Whole::Beyond => Err(invalid(field, format!("must be at most {}, got {v}", u64::MAX))),
    }
}

/// The text of the fields whose errors quote the number as written (a
/// `Value` keeps `1.50` as `1.5`).
#[derive(Debug, Default, serde::Deserialize)]
struct Written<'a> {
    #[serde(borrow, default)]
    timeout_seconds: Option<&'a serde_json::value::RawValue>,
}

impl Manifest {
    /// Parses and validates `bytes` as a `skill.json` (after a UTF-8 byte
    /// order mark, if it starts with one).
    ///
    /// # Errors
    ///
    /// [`ManifestError`] naming the first field at fault.
    pub fn from_slice(bytes: &[u8], opts: &ValidateOptions) -> Result<Self, ManifestError> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge { size: bytes.len() as u64 });
        }
        // A UTF-8 byte order mark, as some editors write it: RFC 8259 lets
        // a parser ignore it, serde_json does not.
        let bytes = bytes.strip_prefix(UTF8_BOM).unwrap_or(bytes);
        // Nesting is bounded by serde_json's own limit (128 levels).
        let value = unique_json::from_slice(bytes, usize::MAX).map_err(|e| match e {
            UniqueError::Json(e) => ManifestError::Json(e),
            UniqueError::DuplicateKey { key, line } => ManifestError::DuplicateKey { key, line },
            UniqueError::ReservedKey => {
                invalid(unique_json::RESERVED_KEY, "is a key serde_json reserves")
            }
            UniqueError::TooDeep => {
                ManifestError::Json(serde::de::Error::custom("nested too deep"))
            }
        })?;
        Self::validate(value, opts, Some(bytes))
    }

    /// Validates an already-parsed JSON value as a manifest.
    ///
    /// # Errors
    ///
    /// [`ManifestError`] naming the first field at fault.
    pub fn from_value(value: Value, opts: &ValidateOptions) -> Result<Self, ManifestError> {
        Self::validate(value, opts, None)
    }

    /// `bytes`: the file the value was read from, when there is one, read
    /// again for the text of a number an error quotes.
    fn validate(
        value: Value,
        opts: &ValidateOptions,
        bytes: Option<&[u8]>,
    ) -> Result<Self, ManifestError> {
        let Value::Object(obj) = value else {
            return Err(ManifestError::NotAnObject(type_name(&value)));
        };

        let name = string(&obj, "name")?.ok_or(ManifestError::Missing("name"))?;
        let name = SkillName::new(name).map_err(|e| invalid("name", e.to_string()))?;

        let description = parse_description(&obj)?;

        let entry = parse_entry(&obj)?;

        let schema = parse_schema(get(&obj, "schema"))?;
        let output_schema = parse_output_schema(get(&obj, "output_schema"))?;

        let env_allow = parse_env_allow(get(&obj, "env_allow"))?;

        let (timeout, timeout_clamped_from) =
            parse_timeout(get(&obj, "timeout_seconds"), opts, bytes)?;

        let class = match string(&obj, "class")? {
            None => SkillClass::default(),
            Some(c) => c
                .parse()
                .map_err(|e: crate::class::UnknownClass| invalid("class", e.to_string()))?,
        };

        let category = parse_category(&obj)?;

        let sandbox = match get(&obj, "sandbox") {
            None => SandboxRequest::default(),
            Some(Value::Object(s)) => parse_sandbox(s)?,
            Some(v) => return Err(wrong("sandbox", "an object", v)),
        };

        let mcp = match crate::mcp::kind(&obj).map_err(|(f, r)| invalid(&f, r))? {
            PackKind::Skill => None,
            PackKind::Mcp => {
                Some(crate::mcp::parse(&obj, &env_allow).map_err(|(f, r)| invalid(&f, r))?)
            }
        };

        let known = [
            "name",
            "description",
            "schema",
            "output_schema",
            "entry",
            "env_allow",
            "timeout_seconds",
            "class",
            "category",
            "sandbox",
        ];
        // `kind` is known in every pack; the other MCP fields in MCP packs.
        let is_known = |k: &str| {
            known.contains(&k) || k == "kind" || (mcp.is_some() && MCP_FIELDS.contains(&k))
        };
        let ignored_fields = obj.keys().filter(|k| !is_known(k)).cloned().collect();

        Ok(Self {
            name,
            description: description.to_owned(),
            schema,
            output_schema,
            entry: entry.to_owned(),
            env_allow,
            timeout,
            timeout_clamped_from,
            class,
            category,
            sandbox,
            mcp,
            ignored_fields,
        })
    }

    /// The skill's name.
    pub fn name(&self) -> &SkillName {
        &self.name
    }
    /// Human and LLM-facing description.
    pub fn description(&self) -> &str {
        &self.description
    }
    /// JSON Schema of the args object (always a JSON object), as text.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }
    /// JSON Schema of the result object, when the manifest declares one
    /// (`output_schema`): MCP clients get it as the tool's `outputSchema`.
    pub fn output_schema(&self) -> Option<&Schema> {
        self.output_schema.as_ref()
    }
    /// The entry as written: relative to the manifest's folder, or absolute.
    pub fn entry(&self) -> &str {
        &self.entry
    }
    /// Environment names forwarded to the child (empty = no environment).
    pub fn env_allow(&self) -> &[EnvName] {
        &self.env_allow
    }
    /// Wall-clock timeout of a run.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    /// The timeout the manifest asked for, when it was over the operator
    /// maximum and was clamped (`u64::MAX` when it asked for more still).
    pub fn timeout_clamped_from(&self) -> Option<u64> {
        self.timeout_clamped_from
    }
    /// The skill's class.
    pub fn class(&self) -> SkillClass {
        self.class
    }
    /// The skill's category.
    pub fn category(&self) -> &str {
        &self.category
    }
    /// What the manifest's `sandbox` object asks for.
    pub fn sandbox(&self) -> &SandboxRequest {
        &self.sandbox
    }
    /// The MCP server fields of a `"kind": "mcp"` pack; `None` for a
    /// one-shot skill.
    pub fn mcp(&self) -> Option<&McpSpec> {
        self.mcp.as_ref()
    }
    /// Top-level fields that were present but are not part of the contract.
    pub fn ignored_fields(&self) -> &[String] {
        &self.ignored_fields
    }
}

fn parse_paths(v: &Value, field: &str) -> Result<Vec<std::path::PathBuf>, ManifestError> {
    string_list(v, field)?
        .iter()
        .enumerate()
        .map(|(i, p)| {
            absolute_normal(p).map_err(|e| invalid(&format!("{field}[{i}]"), e.to_string()))
        })
        .collect()
}

/// `sandbox.network`: `true`/`false`, or `{"connect": [...]}` (network
/// needed, toward those entries; what the run gets is the grant's list).
fn parse_network(v: &Value, field: &str, req: &mut SandboxRequest) -> Result<(), ManifestError> {
    if let Some(b) = v.as_bool() {
        req.network = b;
        return Ok(());
    }
    let obj = v.as_object().ok_or_else(|| wrong(field, "a boolean or an object", v))?;
    req.network = true;
    for (key, v) in obj {
        let sub = format!("{field}.{key}");
        if key != "connect" {
            return Err(invalid(&sub, "unknown network field (known: connect)"));
        }
        for (i, e) in string_list(v, &sub)?.iter().enumerate() {
            let entry = e
                .parse::<crate::egress::Entry>()
                .map_err(|err| invalid(&format!("{sub}[{i}]"), err.to_string()))?;
            req.connect.push(entry);
        }
    }
    Ok(())
}

fn parse_sandbox(s: &Map<String, Value>) -> Result<SandboxRequest, ManifestError> {
    let mut req = SandboxRequest::default();
    for (key, v) in s {
        if v.is_null() {
            continue;
        }
        let field = format!("sandbox.{key}");
        match key.as_str() {
            "fs_read" => req.fs_read = parse_paths(v, &field)?,
            "fs_write" => req.fs_write = parse_paths(v, &field)?,
            "network" => parse_network(v, &field, &mut req)?,
            "run_as" => {
                let u = v.as_str().ok_or_else(|| wrong(&field, "a string", v))?;
                let ok = !u.is_empty() && u.len() <= 32 && u.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
                if !ok {
                    return Err(invalid(&field, format!("{u:?} is not a valid user name")));
                }
                req.run_as = Some(u.to_owned());
            }
            "capabilities" => {
                for (i, c) in string_list(v, &field)?.iter().enumerate() {
                    let n = capability_number(c)
                        .ok_or_else(|| invalid(&format!("{field}[{i}]"), format!("unknown capability {c:?}")))?;
                    if !req.capabilities.contains(&n) {
                        req.capabilities.push(n);
                    }
                }
            }
            "memory_bytes" => {
                let m = unsigned(v, &field)?;
                if let Err(e) = crate::limits::check_memory(m) {
                    return Err(invalid(&field, format!("must be at least {} (1 MiB)", e.min)));
                }
                req.memory_bytes = Some(m);
            }
            "max_pids" => {
                let p = unsigned(v, &field)?;
                let p = u32::try_from(p).ok().filter(|p| *p >= 1).ok_or_else(|| invalid(&field, "must be from 1 to 4294967295"))?;
                req.max_pids = Some(p);
            }
            _ => return Err(invalid(&field, "unknown sandbox field (known: fs_read, fs_write, network, run_as, capabilities, memory_bytes, max_pids)")),
        }
    }
    Ok(req)
}

/// `description`: required, not blank, at most [`MAX_DESCRIPTION_BYTES`].
fn parse_description(obj: &Map<String, Value>) -> Result<&str, ManifestError> {
    let description = string(obj, "description")?.ok_or(ManifestError::Missing("description"))?;
    if description.trim().is_empty() {
        return Err(invalid("description", "must not be empty"));
    }
    if description.len() > MAX_DESCRIPTION_BYTES {
        return Err(invalid(
            "description",
            format!("must be at most {MAX_DESCRIPTION_BYTES} bytes"),
        ));
    }
    Ok(description)
}

/// `entry`: required, not empty, without a NUL byte.
fn parse_entry(obj: &Map<String, Value>) -> Result<&str, ManifestError> {
    let entry = string(obj, "entry")?.ok_or(ManifestError::Missing("entry"))?;
    if entry.is_empty() {
        return Err(invalid("entry", "must not be empty"));
    }
    if entry.contains('\0') {
        return Err(invalid("entry", "must not contain a NUL byte"));
    }
    Ok(entry)
}

/// `schema`: absent (no args), or a JSON Schema of an object.
fn parse_schema(value: Option<&Value>) -> Result<Schema, ManifestError> {
    match value {
        None => Schema::from_value(&serde_json::json!({"type": "object", "properties": {}})),
        Some(Value::Object(s)) => {
            if let Some(t) = s.get("type") {
                if t != "object" {
                    return Err(invalid(
                        "schema",
                        format!(
                            "must describe an object (\"type\": \"object\"), got \"type\": {t}"
                        ),
                    ));
                }
            }
            // Args are always an object; saying so makes the schema a
            // valid tool definition (MCP, OpenAI and Anthropic require
            // `"type": "object"`; `{}` made an agent's tools request
            // fail). It validates the same args.
            let mut s = s.clone();
            s.entry("type").or_insert_with(|| Value::from("object"));
            Schema::from_value(&Value::Object(s))
        }
        Some(v) => return Err(wrong("schema", "an object (a JSON Schema)", v)),
    }
    .map_err(|e| invalid("schema", e.to_string()))
}

/// `env_allow`: variable names, each kept once.
fn parse_env_allow(value: Option<&Value>) -> Result<Vec<EnvName>, ManifestError> {
    let mut env_allow: Vec<EnvName> = Vec::new();
    if let Some(v) = value {
        for (i, n) in string_list(v, "env_allow")?.iter().enumerate() {
            let n =
                EnvName::new(n).map_err(|e| invalid(&format!("env_allow[{i}]"), e.to_string()))?;
            if !env_allow.contains(&n) {
                env_allow.push(n);
            }
        }
    }
    Ok(env_allow)
}

/// `timeout_seconds` and, when it was over the operator maximum and
/// clamped, the number written. `bytes`: the manifest file, read again
/// for the text of a number an error quotes.
fn parse_timeout(
    value: Option<&Value>,
    opts: &ValidateOptions,
    bytes: Option<&[u8]>,
) -> Result<(Duration, Option<u64>), ManifestError> {
    // The default obeys the operator maximum too (an executor with
    // `max_timeout_seconds` under 30 must not run a skill for 30 s).
    let default_timeout = DEFAULT_TIMEOUT.min(opts.max_timeout);
    // A whole number over the maximum is clamped however large it is.
    Ok(match value {
        None => (default_timeout, None),
        Some(v) => {
            let w = whole(v, "timeout_seconds", None).map_err(|e| {
                // Quoted as written (a `Value` keeps `1.50` as `1.5`):
                // the file is read again, on this error only; every key
                // is unique, so this sees the same members.
                let written = bytes.and_then(|b| serde_json::from_slice::<Written>(b).ok());
                match written.as_ref().and_then(|w| w.timeout_seconds) {
                    Some(text) => whole(v, "timeout_seconds", Some(text.get())).err().unwrap_or(e),
                    None => e,
                }
            })?;
            match w {
                Whole::Fits(0) => (default_timeout, None),
                Whole::Fits(s) if Duration::from_secs(s) > opts.max_timeout => {
                    (opts.max_timeout, Some(s))
                }
                Whole::Fits(s) => (Duration::from_secs(s), None),
                Whole::Beyond => (opts.max_timeout, Some(u64::MAX)),
            }
        }
    })
}

/// `category`: absent or blank is [`DEFAULT_CATEGORY`]; at most 64 bytes
/// without control characters.
fn parse_category(obj: &Map<String, Value>) -> Result<String, ManifestError> {
    Ok(match string(obj, "category")? {
        // Blank is no category, as empty is.
        None => DEFAULT_CATEGORY.to_owned(),
        Some(c) if c.trim().is_empty() => DEFAULT_CATEGORY.to_owned(),
        Some(c) if c.len() > 64 || c.chars().any(char::is_control) => {
            return Err(invalid("category", "must be at most 64 bytes without control characters"));
        }
        Some(c) => c.to_owned(),
    })
}

/// `output_schema`: absent, or a JSON Schema of an object (MCP's
/// `outputSchema` describes a tool's structured result, always an object).
fn parse_output_schema(value: Option<&Value>) -> Result<Option<Schema>, ManifestError> {
    let schema = match value {
        None => return Ok(None),
        Some(Value::Object(s)) => s,
        Some(v) => return Err(wrong("output_schema", "an object (a JSON Schema)", v)),
    };
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(invalid(
            "output_schema",
            "must describe an object (\"type\": \"object\"): a structured result is an object",
        ));
    }
    Schema::from_value(&Value::Object(schema.clone()))
        .map(Some)
        .map_err(|e| invalid("output_schema", e.to_string()))
}
