//! Shared support of the benchmark tools (`spawnbench`, `loadbench`).
//!
//! # Layout
//!
//! - [`sorted`], [`pct`]: the percentile arithmetic both tools report with.

/// A sorted copy of `v` (total order, NaN last).
pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

/// The `p` quantile (0.0 to 1.0, nearest rank) of an already sorted slice;
/// NaN when it is empty.
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
