//! The configuration files the packages ship, every key commented out:
//! uncommented, to check that each key still parses where it stands.

/// `text` with every `#key = value` line (a lower-case key) and every
/// `#` line starting with `table` (`[` or `[[`) uncommented; other comment
/// lines stay as they are.
#[must_use]
pub fn uncomment(text: &str, table: &str) -> String {
    let line = |l: &str| -> String {
        let Some(rest) = l.strip_prefix('#') else { return l.to_owned() };
        let name = rest.split(" = ").next().unwrap_or_default();
        let is_key =
            rest.contains(" = ") && name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
        if rest.starts_with(table) || is_key {
            rest.to_owned()
        } else {
            l.to_owned()
        }
    };
    text.lines().map(|l| format!("{}\n", line(l))).collect()
}
