//! The `Accept` negotiation of the run answer: the report as JSON, or
//! streamed as NDJSON ([`wants_ndjson`]).

use axum::http::{header, HeaderMap};

/// The media type of the streamed answer.
pub const NDJSON: &str = "application/x-ndjson";

/// The media type of the plain answer.
const JSON: &str = "application/json";

/// Returns true if and only if the request's `Accept` asks for the NDJSON
/// stream rather than the JSON report.
///
/// The `Accept` fields (all of them, as one list) are comma-separated
/// media ranges, `type/subtype` then `;`-separated parameters (quoted
/// strings may hold commas and semicolons). Type, subtype and parameter
/// names compare case-insensitively; `q` (0 to 1, three decimals at most,
/// default 1) is the range's weight, and a range whose `q` is not such a
/// number, or that is not `type/subtype`, is ignored; other parameters do
/// not take part. A media type's weight is the `q` of the most specific
/// range that matches it (`type/subtype` over `type/*` over `*/*`, the
/// highest `q` among equals), 0 when none does.
///
/// The answer is NDJSON when `application/x-ndjson` is named itself (a
/// wildcard is not enough: `*/*`, curl's default, gets JSON) with a weight
/// above 0, and that weight is at least `application/json`'s: so
/// `application/x-ndjson` and `application/json, application/x-ndjson`
/// stream, `application/x-ndjson;q=0, application/json` and
/// `application/json, application/x-ndjson;q=0.5` do not.
pub fn wants_ndjson(headers: &HeaderMap) -> bool {
    let ranges: Vec<Range> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| split_quoted(v, ','))
        .filter_map(Range::parse)
        .collect();
    let named = ranges.iter().any(|r| r.specificity(NDJSON) == Some(2));
    let ndjson = weight(&ranges, NDJSON);
    named && ndjson > 0 && ndjson >= weight(&ranges, JSON)
}

/// One media range: `type/subtype` (lower case) and its `q` in
/// thousandths.
#[derive(Debug, PartialEq, Eq)]
struct Range {
    kind: String,
    sub: String,
    q: u16,
}

impl Range {
    /// Parses one element of the list; `None` for an empty or malformed
    /// one.
    fn parse(text: &str) -> Option<Self> {
        let mut parts = split_quoted(text, ';').into_iter();
        let (kind, sub) = parts.next()?.trim().split_once('/')?;
        let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
        if !token(kind) || !token(sub) {
            return None;
        }
        let mut q = 1000;
        for param in parts {
            let Some((name, value)) = param.split_once('=') else { continue };
            if name.trim().eq_ignore_ascii_case("q") {
                q = qvalue(value.trim())?;
                // What follows `q` is accept-ext, not the media type's.
                break;
            }
        }
        Some(Self { kind: kind.to_ascii_lowercase(), sub: sub.to_ascii_lowercase(), q })
    }

    /// How specifically this range matches `media` (lower-case
    /// `type/subtype`): 2 exactly, 1 as `type/*`, 0 as `*/*`; `None` if it
    /// does not.
    fn specificity(&self, media: &str) -> Option<u8> {
        let (kind, sub) = media.split_once('/')?;
        match (self.kind.as_str(), self.sub.as_str()) {
            (k, s) if k == kind && s == sub => Some(2),
            (k, "*") if k == kind => Some(1),
            ("*", "*") => Some(0),
            _ => None,
        }
    }
}

/// The weight of `media` in thousandths: the highest `q` of the most
/// specific ranges matching it, 0 if none does.
fn weight(ranges: &[Range], media: &str) -> u16 {
    ranges.iter().filter_map(|r| r.specificity(media).map(|s| (s, r.q))).max().map_or(0, |(_, q)| q)
}

/// A `qvalue` (RFC 9110 §12.4.2: `0`, `0.5`, `1.000`...) in thousandths.
fn qvalue(text: &str) -> Option<u16> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths = format!("{frac:0<3}").parse::<u16>().ok()?;
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// `text` split at each `sep` outside double quotes (a backslash escapes
/// the next character inside them).
fn split_quoted(text: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn wants(accept: &[&'static str]) -> bool {
        let mut h = HeaderMap::new();
        for a in accept {
            h.append(header::ACCEPT, HeaderValue::from_static(a));
        }
        wants_ndjson(&h)
    }

    #[test]
    fn accept_header_selects_the_stream() {
        assert!(!wants(&[]));
        assert!(wants(&["application/x-ndjson"]));
        assert!(wants(&["application/json, application/x-ndjson"]));
        assert!(wants(&["application/json", "application/x-ndjson"]));
        assert!(!wants(&["application/json"]));
        assert!(!wants(&["*/*"]));
        assert!(!wants(&["application/*"]));
        assert!(wants(&["application/x-ndjson, */*"]));
        assert!(wants(&["*/*;q=0.1, application/x-ndjson"]));
        assert!(wants(&["application/json;q=0.5, application/x-ndjson;q=0.9"]));
    }

    #[test]
    fn weights_and_case_decide_not_prefixes() {
        // The defects a reviewer found: q=0 ignored, case-sensitive types,
        // a prefix matching another type.
        assert!(!wants(&["application/x-ndjson;q=0, application/json"]));
        assert!(!wants(&["application/x-ndjson;q=0"]));
        assert!(!wants(&["application/x-ndjson ; Q=0.000"]));
        assert!(wants(&["Application/X-NDJSON"]));
        assert!(wants(&["APPLICATION/x-ndjson;Q=1.0"]));
        assert!(!wants(&["application/x-ndjsonfoo"]));
        assert!(!wants(&["application/x-ndjson-seq"]));
        // application/json's weight comes from its most specific range.
        assert!(!wants(&["application/json, application/x-ndjson;q=0.5"]));
        assert!(!wants(&["application/*, application/x-ndjson;q=0.5"]));
        assert!(wants(&["application/*;q=0.4, application/x-ndjson;q=0.5"]));
        assert!(wants(&["*/*, application/json;q=0, application/x-ndjson;q=0.2"]));
        // Parameters other than q do not take part; quoted commas stay in
        // their range; what follows q is accept-ext.
        assert!(wants(&["application/x-ndjson;charset=utf-8"]));
        assert!(wants(&[r#"application/json;x="a,b;q=1";q=0.1, application/x-ndjson"#]));
        assert!(wants(&["application/x-ndjson;q=0.8;q=0"]));
    }

    #[test]
    fn malformed_ranges_are_ignored() {
        for bad in ["application/x-ndjson;q=2", "application/x-ndjson;q=0.1234", "x-ndjson", ""] {
            assert!(!wants(&[bad]), "{bad}");
        }
        assert!(wants(&["application/x-ndjson;q=-1, application/x-ndjson;q=0.3"]));
        assert!(wants(&["junk, /, application/x-ndjson,,"]));
    }

    #[test]
    fn qvalues() {
        for (text, q) in
            [("0", 0), ("0.", 0), ("0.5", 500), ("0.123", 123), ("1", 1000), ("1.000", 1000)]
        {
            assert_eq!(qvalue(text), Some(q), "{text}");
        }
        for text in ["1.001", "2", "0.1234", "-0", "", ".5", "0.5x", "1e0"] {
            assert_eq!(qvalue(text), None, "{text}");
        }
    }
}
