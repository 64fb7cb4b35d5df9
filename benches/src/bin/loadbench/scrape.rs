//! What a scrape of skilld's `/metrics` says: the executor's sandbox setup
//! histogram ([`Hist`]), its run slots and the audit waits.

/// The value of an unlabelled sample in a Prometheus text exposition.
pub(crate) fn gauge(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .next()
        .unwrap_or(f64::NAN)
}

/// The sum of a labelled counter's or gauge's samples (0 without one).
pub(crate) fn labelled_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum()
}

/// The executor's sandbox setup histogram, compared with the reports.
pub(crate) const SETUP_HIST: &str = "ongrid_sandbox_setup_seconds";

/// `ongrid_sandbox_setup_seconds` as scraped: cumulative buckets, sum, count.
#[derive(Debug, Default, Clone)]
pub(crate) struct Hist {
    buckets: Vec<(f64, f64)>,
    pub(crate) sum: f64,
    pub(crate) count: f64,
}

/// `ongrid_executor_run_slots_total` by `how`: ready, recycled, made.
pub(crate) fn parse_slots(text: &str) -> [f64; 3] {
    ["ready", "recycled", "made"].map(|how| {
        let key = format!("ongrid_executor_run_slots_total{{how=\"{how}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(f64::NAN)
    })
}

/// The rows of `ongrid_audit_wait_seconds` a run waits for.
pub(crate) const AUDIT_ROWS: [&str; 2] = ["decision", "completion"];

/// `ongrid_audit_wait_seconds` of each of [`AUDIT_ROWS`]: (sum, count).
pub(crate) fn parse_audit_waits(text: &str) -> [(f64, f64); 2] {
    AUDIT_ROWS.map(|row| {
        let value = |part: &str| {
            let key = format!("ongrid_audit_wait_seconds_{part}{{row=\"{row}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(key.as_str()))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(f64::NAN)
        };
        (value("sum"), value("count"))
    })
}

pub(crate) fn parse_hist(text: &str, name: &str) -> Hist {
    let mut h = Hist::default();
    for line in text.lines() {
        let Some((key, val)) = line.rsplit_once(' ') else { continue };
        let Ok(val) = val.parse::<f64>() else { continue };
        if let Some(rest) = key.strip_prefix(&format!("{name}_bucket{{")) {
            let le = rest.split("le=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or("");
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
            h.buckets.push((le, val));
        } else if key == format!("{name}_sum") {
            h.sum = val;
        } else if key == format!("{name}_count") {
            h.count = val;
        }
    }
    h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    h
}

pub(crate) fn hist_delta(after: &Hist, before: &Hist) -> Hist {
    let buckets = after
        .buckets
        .iter()
        .map(|&(le, c)| {
            let b = before.buckets.iter().find(|x| x.0 == le).map_or(0.0, |x| x.1);
            (le, c - b)
        })
        .collect();
    Hist { buckets, sum: after.sum - before.sum, count: after.count - before.count }
}

/// `histogram_quantile`: linear interpolation inside the bucket.
pub(crate) fn hist_quantile(h: &Hist, q: f64) -> f64 {
    let rank = q * h.count;
    let mut prev = (0.0, 0.0);
    for &(le, c) in &h.buckets {
        if c >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            let inside = c - prev.1;
            let frac = if inside > 0.0 { (rank - prev.1) / inside } else { 1.0 };
            return prev.0 + (le - prev.0) * frac;
        }
        prev = (le, c);
    }
    f64::NAN
}
