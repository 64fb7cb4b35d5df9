//! The `"kind": "mcp"` part of a `skill.json`: a pack whose entry is an MCP
//! server, run long-lived in the box and spoken to over its stdio; each
//! tool it lists becomes the skill `NAME.TOOL` ([`tool_name`]; skilld also
//! accepts `NAME_TOOL`, [`tool_function_name`], as an alias: the spelling
//! the function formats of LLM tool APIs, which refuse a dot, list).
//!
//! Fields beyond a skill's (docs/skills.md): `args` (argv after the entry,
//! at most [`MAX_ARGS`] strings without NUL bytes), `start` (`"lazy"`, the
//! default: on the first call; `"eager"`: from the first listing of its tools),
//! `idle_seconds` (the server is stopped after this long without a call;
//! 0 or absent = [`DEFAULT_IDLE_SECONDS`]), `tool_classes` (a class per tool
//! name, overriding the pack's `class`), `env_required` (names that must be
//! set, from the executor's environment or the operator's `env_file`, for
//! the pack to be served; each must also be in `env_allow`). The pack's
//! `timeout_seconds` bounds each tool call, not the server's life.
//!
//! Secrets never come from here: the operator's `env_file` holds them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::class::SkillClass;
use crate::env::EnvName;

/// Most strings in `args`.
pub const MAX_ARGS: usize = 64;
/// Longest string in `args`, bytes.
pub const MAX_ARG_BYTES: usize = 4096;
/// Idle time after which a server is stopped, when the pack sets none.
pub const DEFAULT_IDLE_SECONDS: u64 = 600;
/// Longest tool name accepted from a server or in `tool_classes`: it
/// becomes part of a skill name (`NAME.TOOL`).
pub const MAX_TOOL_NAME_BYTES: usize = 64;

/// What kind of pack a `skill.json` describes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PackKind {
    /// A one-shot skill: args on stdin, result on stdout.
    #[default]
    Skill,
    /// A long-lived MCP server whose tools are skills.
    Mcp,
}

/// When the executor starts a server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Start {
    /// On the first call; a server started only to list its tools is
    /// stopped again.
    #[default]
    Lazy,
    /// From the first listing of its tools (skilld lists every pack when it
    /// starts) on.
    Eager,
}

/// The validated MCP fields of a `"kind": "mcp"` pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpSpec {
    /// Arguments after the entry.
    pub args: Vec<String>,
    /// When the server starts.
    pub start: Start,
    /// Stopped after this long without a call.
    pub idle: Duration,
    /// Class of a tool by name, overriding the pack's.
    pub tool_classes: BTreeMap<String, SkillClass>,
    /// Names that must be set for the pack to be served.
    pub env_required: Vec<EnvName>,
}

impl McpSpec {
    /// The class of `tool`: its override, else the pack's `class`.
    pub fn class_of(&self, tool: &str, pack: SkillClass) -> SkillClass {
        self.tool_classes.get(tool).copied().unwrap_or(pack)
    }
}

/// The top-level fields only a `"kind": "mcp"` pack has.
pub const MCP_FIELDS: &[&str] =
    &["kind", "args", "start", "idle_seconds", "tool_classes", "env_required"];

/// Why a tool name cannot be used.
pub fn check_tool_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > MAX_TOOL_NAME_BYTES {
        return Err(format!("must be 1 to {MAX_TOOL_NAME_BYTES} bytes"));
    }
    if !name.chars().all(ok_char) {
        return Err("must be ASCII letters, digits, '_' or '-'".to_owned());
    }
    Ok(())
}

/// The name the tool `tool` of the pack `pack` is registered as:
/// `<pack>.<tool>`, the tool's name as the server lists it (MCP's usual
/// spelling, which MCP tool names allow). Valid when its
/// [`tool_function_name`] is: that spelling is the tool's alias, and two
/// tools whose aliases are the same are never both registered.
///
/// # Errors
///
/// The function spelling is not a valid [`crate::SkillName`] (too long, or
/// the tool's name holds a character outside `[A-Za-z0-9_-]`).
pub fn tool_name(pack: &str, tool: &str) -> Result<String, crate::name::NameError> {
    tool_function_name(pack, tool)?;
    Ok(format!("{pack}.{tool}"))
}

/// The spelling of the tool `tool` of the pack `pack` in the formats whose
/// consumers refuse a dot in a name (the OpenAI and Anthropic function
/// formats: `^[a-zA-Z0-9_-]{1,64}$`): `<pack>_<tool>`, lowercased, `-`
/// mapped to `_`, a valid skill name. skilld accepts it back as an alias of
/// [`tool_name`] wherever a client names a skill.
///
/// # Errors
///
/// The result is not a valid [`crate::SkillName`] (too long).
pub fn tool_function_name(
    pack: &str,
    tool: &str,
) -> Result<crate::SkillName, crate::name::NameError> {
    crate::SkillName::new(&format!("{pack}_{tool}").to_ascii_lowercase().replace('-', "_"))
}

/// A field error: the field path and what is wrong.
pub type FieldError = (String, String);

fn bad(field: &str, reason: impl Into<String>) -> FieldError {
    (field.to_owned(), reason.into())
}

/// The pack's kind from its `kind` field (absent or null = a skill).
///
/// # Errors
///
/// `kind` is not `"skill"` or `"mcp"`.
pub fn kind(obj: &Map<String, Value>) -> Result<PackKind, FieldError> {
    match obj.get("kind") {
        None | Some(Value::Null) => Ok(PackKind::Skill),
        Some(Value::String(s)) if s == "skill" => Ok(PackKind::Skill),
        Some(Value::String(s)) if s == "mcp" => Ok(PackKind::Mcp),
        Some(_) => Err(bad("kind", "must be \"skill\" or \"mcp\"")),
    }
}

fn strings(v: &Value, field: &str) -> Result<Vec<String>, FieldError> {
    let Value::Array(items) = v else { return Err(bad(field, "must be an array of strings")) };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            _ => Err(bad(&format!("{field}[{i}]"), "must be a string")),
        })
        .collect()
}

/// The MCP fields of `obj`; `env_allow` is the pack's validated list.
///
/// # Errors
///
/// The first field at fault and why.
pub fn parse(obj: &Map<String, Value>, env_allow: &[EnvName]) -> Result<McpSpec, FieldError> {
    let field = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let args = match field("args") {
        None => Vec::new(),
        Some(v) => strings(v, "args")?,
    };
    if args.len() > MAX_ARGS {
        return Err(bad("args", format!("at most {MAX_ARGS} arguments")));
    }
    for (i, a) in args.iter().enumerate() {
        if a.len() > MAX_ARG_BYTES || a.contains('\0') {
            return Err(bad(
                &format!("args[{i}]"),
                format!("at most {MAX_ARG_BYTES} bytes, no NUL"),
            ));
        }
    }
    let start = match field("start") {
        None => Start::Lazy,
        Some(Value::String(s)) if s == "lazy" => Start::Lazy,
        Some(Value::String(s)) if s == "eager" => Start::Eager,
        Some(_) => return Err(bad("start", "must be \"lazy\" or \"eager\"")),
    };
    let idle = match field("idle_seconds") {
        None => DEFAULT_IDLE_SECONDS,
        Some(v) => match v.as_u64() {
            Some(0) => DEFAULT_IDLE_SECONDS,
            Some(s) => s.min(u64::from(u32::MAX)),
            None => return Err(bad("idle_seconds", "must be a non-negative integer")),
        },
    };
    let mut tool_classes = BTreeMap::new();
    if let Some(v) = field("tool_classes") {
        let Value::Object(m) = v else { return Err(bad("tool_classes", "must be an object")) };
        for (tool, class) in m {
            let f = format!("tool_classes.{tool}");
            check_tool_name(tool).map_err(|r| bad(&f, r))?;
            let c = class.as_str().ok_or_else(|| bad(&f, "must be a string"))?;
            let c: SkillClass =
                c.parse().map_err(|e: crate::class::UnknownClass| bad(&f, e.to_string()))?;
            tool_classes.insert(tool.clone(), c);
        }
    }
    let mut env_required = Vec::new();
    if let Some(v) = field("env_required") {
        for (i, n) in strings(v, "env_required")?.iter().enumerate() {
            let f = format!("env_required[{i}]");
            let n = EnvName::new(n).map_err(|e| bad(&f, e.to_string()))?;
            if !env_allow.contains(&n) {
                return Err(bad(&f, format!("{n} must also be in env_allow")));
            }
            if !env_required.contains(&n) {
                env_required.push(n);
            }
        }
    }
    Ok(McpSpec { args, start, idle: Duration::from_secs(idle), tool_classes, env_required })
}

/// The names of `required` that `is_set` says are missing, in order.
pub fn missing(required: &[EnvName], is_set: impl Fn(&str) -> bool) -> Vec<&EnvName> {
    required.iter().filter(|n| !is_set(n.as_str())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_is_named_with_a_dot_and_aliased_in_the_function_spelling() {
        assert_eq!(tool_name("srv", "get-Time").unwrap(), "srv.get-Time");
        assert_eq!(tool_function_name("srv", "get-Time").unwrap().as_str(), "srv_get_time");
        assert!(tool_name("srv", "a.b").is_err(), "a dot in the tool's own name");
        assert!(tool_name("srv", &"x".repeat(64)).is_err(), "its alias is over 64 bytes");
    }
}
