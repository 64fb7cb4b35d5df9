//! `SKILL.md` bytes → `SkillMd::from_slice` (frontmatter cut, bounded YAML
//! → JSON, validation), under three operator maxima. Checked: no panic and
//! no hang on any text (the YAML reader must stay linear; libFuzzer's
//! -timeout catches a slow input); a valid file's name, tools and their
//! manifests obey the rules (each tool's manifest as strictly as a
//! `skill.json`'s); the result is a function of the frontmatter's JSON.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use policy::limits::DEFAULT_MAX_TIMEOUT;
use policy::skillmd::{frontmatter, tool_skill_name, MAX_TOOLS};
use policy::{yaml, SkillMd, ValidateOptions};

fn check(data: &[u8], max: Duration) {
    let opts = ValidateOptions { max_timeout: max };
    let md = match SkillMd::from_slice(data, &opts) {
        Ok(md) => md,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let name = md.name();
    assert!(!name.is_empty() && name.len() <= 64, "name length {}", name.len());
    assert!(
        name.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-')),
        "name {name:?} outside [a-z0-9_-]+"
    );
    assert!(!md.description().trim().is_empty());
    assert!(md.tools().len() <= MAX_TOOLS);
    for (i, t) in md.tools().iter().enumerate() {
        let m = t.manifest();
        ongrid_fuzz::check_manifest(m, max);
        let want = tool_skill_name(name, t.name()).expect("a registered tool name");
        assert_eq!(m.name(), &want, "tool {:?}", t.name());
        assert!(
            md.tools()[..i].iter().all(|o| o.manifest().name() != m.name()),
            "two tools register as {}",
            m.name()
        );
        let found = md.tool(m.name().as_str()).expect("lookup by registered name");
        assert_eq!(found.manifest().name(), m.name());
    }
    for e in &md.requirements().env {
        assert!(!e.as_str().is_empty());
    }
    // The same frontmatter, converted first, validates the same way.
    let text = std::str::from_utf8(data).expect("valid SKILL.md is UTF-8");
    let v = yaml::to_json(frontmatter(text).expect("frontmatter")).expect("yaml");
    assert_eq!(SkillMd::from_value(&v, &opts).expect("from_value refused it"), md);
}

fuzz_target!(|data: &[u8]| {
    check(data, DEFAULT_MAX_TIMEOUT);
    check(data, Duration::from_secs(1));
    check(data, Duration::from_secs(29));
});
