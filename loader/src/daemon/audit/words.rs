//! The words an audit row's `decision` and `outcome` can hold: what
//! `GET /v1/audit` and `ongrid-skill audit` accept as filters.

/// A row's `decision`: an allowed run, a denied one (permission), a
/// rejected one (its args do not match the schema, or its body is no
/// request).
pub const DECISIONS: [&str; 3] = ["allow", "deny", "reject"];

/// The outcome of an allowed request's row when its client went away, or
/// a stopping skilld cut it, before its run's report (also its
/// `ongrid_executions_total` label, counted by the execute handler).
pub const CANCELLED: &str = "cancelled";

/// The outcome of an allowed request's row when the executor could not be
/// reached or failed before its report.
pub const EXECUTOR_UNAVAILABLE: &str = "executor_unavailable";

/// The outcome a skilld gives, as it opens the database, to an allowed
/// run's row an earlier skilld left open (it stopped or crashed before
/// the run's report).
pub const INTERRUPTED: &str = "interrupted";

/// A row's `outcome`: a run report's ([`policy::Outcome`], in its
/// documentation order), then skilld's own.
pub const OUTCOMES: [&str; 15] = [
    "ok",
    "exit_nonzero",
    "signaled",
    "timeout",
    "output_limit",
    "invalid_result",
    "spawn_failed",
    "sandbox_failed",
    "rejected",
    "invalid_args",
    "denied",
    "busy",
    CANCELLED,
    EXECUTOR_UNAVAILABLE,
    INTERRUPTED,
];

#[cfg(test)]
mod tests {
    use policy::Outcome;

    use super::*;

    #[test]
    fn the_outcomes_are_the_reports_then_skillds_own() {
        let reports: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(OUTCOMES[..reports.len()], reports[..]);
        assert_eq!(OUTCOMES[reports.len()..], [CANCELLED, EXECUTOR_UNAVAILABLE, INTERRUPTED]);
    }
}
