//! The tools of an MCP server pack as skills: the executor lists them
//! (`mcp_tools` on its wire, which starts the pack's server), and each is
//! registered as the skill `PACK.TOOL` ([`policy::mcp::tool_name`]; its
//! manifest is named `PACK_TOOL`, [`policy::mcp::tool_function_name`], the
//! alias the function formats of `/v1/tools` list)
//! with the tool's description and input schema (args are validated
//! against it as any skill's), its class (the pack's `tool_classes` entry,
//! else the pack's class, as the executor says), and the pack's category
//! and timeout. The executor is asked to run it as `tool` of the pack's
//! manifest, and refuses a tool its server did not list.
//!
//! A tool whose name is taken in either spelling (its alias is another
//! skill's name or another tool's alias), or that cannot be a skill (a name
//! too long, a schema that is not an object's or does not compile), is left
//! out with a log line, as a manifest would be: so each spelling names one
//! skill at most.

use std::path::PathBuf;

use policy::wire::McpToolInfo;
use policy::{Manifest, ValidateOptions};
use serde_json::{json, Value};

use crate::scan::event::ScanEvent;
use crate::scan::skill::RegisteredSkill;
use crate::scan::validators::{self, Compiled};
use crate::scan::ScanReport;

/// The skill of `tool` of the pack `pack`, with its compiled validator.
///
/// # Errors
///
/// Why the tool cannot be a skill.
pub fn tool_skill(
    pack: &RegisteredSkill,
    tool: &McpToolInfo,
    opts: &ValidateOptions,
) -> Result<(RegisteredSkill, Compiled), String> {
    let m = pack.manifest();
    let pack_name = m.name().as_str();
    let name = policy::mcp::tool_name(pack_name, &tool.name)
        .map_err(|e| format!("tool {:?}: skill name {e}", tool.name))?;
    let alias = policy::mcp::tool_function_name(pack_name, &tool.name)
        .map_err(|e| format!("tool {:?}: skill name {e}", tool.name))?;
    let description = if tool.description.trim().is_empty() {
        format!("Tool {} of the MCP server {}", tool.name, m.name())
    } else {
        tool.description.clone()
    };
    let mut schema = tool.input_schema.clone();
    if let Value::Object(s) = &mut schema {
        // A JSON Schema's own `$schema` is kept; nothing else is added.
        s.entry("type").or_insert_with(|| json!("object"));
    }
    let text = json!({
        "name": alias,
        "description": description,
        "entry": m.entry(),
        "schema": schema,
        "class": tool.class,
        "category": m.category(),
        "timeout_seconds": m.timeout().as_secs(),
    });
    let manifest =
        Manifest::from_value(text, opts).map_err(|e| format!("tool {:?}: {e}", tool.name))?;
    let validator = validators::compile(manifest.schema())
        .map_err(|e| format!("tool {:?}: schema does not compile: {e}", tool.name))?;
    let mut skill = RegisteredSkill::new(
        manifest,
        pack.entry().to_owned(),
        pack.manifest_path().to_owned(),
        pack.root().to_owned(),
    )
    .with_mcp_tool(tool.name.clone(), name);
    // A call runs the pack's manifest: its digest is the pack's.
    if let Some(digest) = pack.digest() {
        skill = skill.with_digest(*digest);
    }
    Ok((skill, validator))
}

/// The skills of the `tools` the pack `pack` lists, with their compiled
/// validators, and the events of the tools left out: a tool that cannot
/// be a skill, or whose alias `PACK_TOOL` is `taken` (the function answers
/// the manifest of the skill whose name or alias it is) or is the alias of
/// a tool of this pack listed before it. Two tools whose `PACK.TOOL` names
/// are the same have the same alias, and no skill name holds a dot: so
/// neither spelling ever names two skills.
pub fn pack_skills(
    pack: &RegisteredSkill,
    tools: &[McpToolInfo],
    opts: &ValidateOptions,
    taken: impl Fn(&str) -> Option<PathBuf>,
) -> (Vec<(RegisteredSkill, Compiled)>, Vec<ScanEvent>) {
    let mut skills: Vec<(RegisteredSkill, Compiled)> = Vec::new();
    let mut events = Vec::new();
    let manifest = pack.manifest_path();
    for tool in tools {
        let (skill, validator) = match tool_skill(pack, tool, opts) {
            Ok(s) => s,
            Err(reason) => {
                let name = pack.function_name().clone();
                events.push(ScanEvent::McpTools { name, manifest: manifest.to_owned(), reason });
                continue;
            }
        };
        let name = skill.name().to_owned();
        let alias = skill.function_name();
        let first = taken(alias.as_str()).or_else(|| {
            let listed = skills.iter().any(|(s, _)| s.function_name() == alias);
            listed.then(|| manifest.to_owned())
        });
        if let Some(first) = first {
            events.push(ScanEvent::Duplicate { name, manifest: manifest.to_owned(), first });
            continue;
        }
        events.push(ScanEvent::Registered { name, manifest: manifest.to_owned() });
        skills.push((skill, validator));
    }
    (skills, events)
}

/// Registers the `tools` of `report.mcp_packs[pack]` into `report`, or logs
/// why the pack has none (`error`, the executor's reason).
pub fn add_tools(
    report: &mut ScanReport,
    pack: usize,
    listed: Result<Vec<McpToolInfo>, String>,
    opts: &ValidateOptions,
) {
    let Some(p) = report.mcp_packs.get(pack).cloned() else { return };
    let tools = match listed {
        Ok(t) => t,
        Err(why) => {
            report.events.push(not_listed(&p, &why));
            return;
        }
    };
    let taken = |alias: &str| report.get_function(alias).map(|s| s.manifest_path().to_owned());
    let (skills, events) = pack_skills(&p, &tools, opts, taken);
    report.events.extend(events);
    for (skill, validator) in skills {
        report.validators.insert(report.skills.len(), validator);
        report.skills.push(skill);
    }
}

/// The event of a pack whose tools the executor could not list, and why.
pub fn not_listed(pack: &RegisteredSkill, why: &str) -> ScanEvent {
    ScanEvent::McpTools {
        name: pack.function_name().clone(),
        manifest: pack.manifest_path().to_owned(),
        reason: format!("tools not listed: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use policy::SkillClass;

    use super::*;

    fn report_with_pack() -> ScanReport {
        let m = Manifest::from_slice(
            br#"{"kind":"mcp","name":"srv","description":"d","entry":"server","category":"ops","timeout_seconds":7}"#,
            &ValidateOptions::default(),
        )
        .unwrap();
        let pack = RegisteredSkill::new(
            m,
            PathBuf::from("/s/srv/server"),
            PathBuf::from("/s/srv/skill.json"),
            PathBuf::from("/s"),
        );
        let mut report = ScanReport::default();
        report.mcp_packs.push(pack);
        report
    }

    fn tool(name: &str, schema: Value) -> McpToolInfo {
        McpToolInfo {
            name: name.to_owned(),
            skill: String::new(),
            description: String::new(),
            input_schema: schema,
            class: SkillClass::Mutating,
        }
    }

    #[test]
    fn listed_tools_become_skills_and_bad_ones_are_left_out_with_a_line() {
        let mut report = report_with_pack();
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let tools = vec![
            tool("get-Time", schema),
            tool("bad", json!({"type": "string"})),
            tool("get_time", json!({})),
            tool(&"x".repeat(64), json!({})),
        ];
        add_tools(&mut report, 0, Ok(tools), &ValidateOptions::default());
        assert_eq!(report.registered(), 1, "{:?}", report.events);
        let s = report.get("srv.get-Time").expect("registered");
        assert_eq!(s.function_name().as_str(), "srv_get_time");
        assert_eq!((s.tool(), s.source()), (Some("get-Time"), "mcp"));
        let m = s.manifest();
        assert_eq!(m.class(), SkillClass::Mutating);
        assert_eq!((m.category(), m.timeout().as_secs()), ("ops", 7));
        assert!(m.description().contains("get-Time"), "a description is made up");
        assert_eq!(s.manifest_path(), PathBuf::from("/s/srv/skill.json"));
        let kinds: Vec<&str> = report.events.iter().map(ScanEvent::kind).collect();
        assert_eq!(kinds, ["registered", "mcp_tools", "duplicate", "mcp_tools"]);
    }

    #[test]
    fn a_pack_whose_tools_cannot_be_listed_registers_nothing_and_says_why() {
        let mut report = report_with_pack();
        let why = "pack \"srv\": required variable TOKEN is not set".to_owned();
        add_tools(&mut report, 0, Err(why), &ValidateOptions::default());
        assert_eq!(report.registered(), 0);
        let line = report.events[0].to_string();
        assert!(line.contains("tools not listed") && line.contains("TOKEN is not set"), "{line}");
        assert!(report.events[0].is_skip());
    }
}
