//! The `executor.toml` a run is given.

use std::fmt::Write as _;

/// An executor configuration: run-as user, Landlock mode, limits and
/// per-skill grants, rendered to TOML for `--config`.
#[derive(Debug, Clone)]
pub struct Config {
    landlock: &'static str,
    limits: Vec<(&'static str, u64)>,
    grants: Vec<(String, String)>,
    settings: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self { landlock: "required", limits: Vec::new(), grants: Vec::new(), settings: Vec::new() }
    }
}

impl Config {
    /// The default configuration: run as `ongrid-skill`, Landlock required,
    /// default limits, no grants.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets one `[limits]` entry (`memory_bytes`, `max_pids`, `stdout_bytes`...).
    #[must_use]
    pub fn limit(mut self, name: &'static str, value: u64) -> Self {
        self.limits.push((name, value));
        self
    }

    /// Adds a `[skills.NAME]` grant line, e.g. `network = true`.
    #[must_use]
    pub fn grant(mut self, skill: &str, line: &str) -> Self {
        self.grants.push((skill.to_owned(), line.to_owned()));
        self
    }

    /// Adds a top-level line, e.g. `resolv_conf = "/tmp/x/resolv.conf"`.
    #[must_use]
    pub fn setting(mut self, line: &str) -> Self {
        self.settings.push(line.to_owned());
        self
    }

    /// The TOML text.
    pub fn to_toml(&self) -> String {
        let mut s =
            format!("run_as = \"{}\"\nlandlock = \"{}\"\n", crate::host::SKILL_USER, self.landlock);
        for line in &self.settings {
            let _ = writeln!(s, "{line}");
        }
        if !self.limits.is_empty() {
            s.push_str("\n[limits]\n");
            for (k, v) in &self.limits {
                let _ = writeln!(s, "{k} = {v}");
            }
        }
        let mut skills: Vec<&str> = self.grants.iter().map(|(k, _)| k.as_str()).collect();
        skills.dedup();
        for skill in skills {
            let _ = writeln!(s, "\n[skills.{skill}]");
            for (_, line) in self.grants.iter().filter(|(k, _)| k == skill) {
                let _ = writeln!(s, "{line}");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_limits_and_grants() {
        let t = Config::new()
            .limit("max_pids", 8)
            .grant("probe", "network = true")
            .grant("probe", "run_as = [\"root\"]")
            .setting("egress = \"required\"")
            .to_toml();
        assert!(t.contains("landlock = \"required\"\negress = \"required\"\n"), "{t}");
        assert!(t.starts_with("run_as = \"ongrid-skill\"\nlandlock = \"required\"\n"), "{t}");
        assert!(t.contains("[limits]\nmax_pids = 8\n"), "{t}");
        assert!(t.contains("[skills.probe]\nnetwork = true\nrun_as = [\"root\"]\n"), "{t}");
    }
}
