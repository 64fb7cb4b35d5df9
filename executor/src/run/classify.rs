//! Step 8: what supervision saw, turned into the report's outcome, limit,
//! result and error.

use std::time::Duration;

use policy::{LimitKind, Outcome, RunReport};

use crate::run::supervise::{Stop, Supervised};

/// Longest excerpt of an invalid stdout quoted in the error.
const EXCERPT_BYTES: usize = 256;

/// Turns what supervision saw into the report's outcome (step 8).
pub fn classify(
    skill: &str,
    sup: Supervised,
    oom: bool,
    timeout: Duration,
    cpu_limit_us: u64,
    stdout_cap: u64,
) -> RunReport {
    let Supervised { exit, stop, stdout, stderr, stderr_dropped, .. } = sup;
    let mut r = RunReport::not_run(skill, Outcome::Ok, String::new());
    r.error = None;
    r.exit_code = exit.code;
    r.signal = exit.signal;
    r.stderr = stderr;
    r.stderr_truncated_bytes = stderr_dropped;
    let fail = |r: &mut RunReport, outcome, limit, error: String| {
        r.outcome = outcome;
        r.limit = limit;
        r.error = Some(error);
    };
    let cpu_hit = exit.signal == Some(libc::SIGXCPU)
        || (exit.signal == Some(libc::SIGKILL) && exit.cpu_us >= cpu_limit_us);
    match stop {
        Stop::OutputLimit => fail(
            &mut r,
            Outcome::OutputLimit,
            Some(LimitKind::Output),
            format!("stdout exceeded {stdout_cap} bytes; the run was killed"),
        ),
        Stop::WallTime => fail(
            &mut r,
            Outcome::Timeout,
            Some(LimitKind::WallTime),
            format!(
                "wall-clock timeout: still running after its timeout_seconds ({} s); the run \
                 was terminated",
                timeout.as_secs()
            ),
        ),
        Stop::Cancelled => fail(
            &mut r,
            Outcome::Signaled,
            None,
            "cancelled by the caller; the run was killed".into(),
        ),
        Stop::None if cpu_hit => fail(
            &mut r,
            Outcome::Timeout,
            Some(LimitKind::CpuTime),
            format!("CPU time limit of {} s reached", cpu_limit_us / 1_000_000),
        ),
        Stop::None if oom && exit.code != Some(0) => {
            let outcome =
                if exit.signal.is_some() { Outcome::Signaled } else { Outcome::ExitNonzero };
            fail(
                &mut r,
                outcome,
                Some(LimitKind::Memory),
                "memory limit reached (OOM kill)".into(),
            );
        }
        Stop::None => match (exit.code, exit.signal) {
            (_, Some(sig)) => {
                let limit = (sig == libc::SIGXFSZ).then_some(LimitKind::FileSize);
                let name = nix::sys::signal::Signal::try_from(sig)
                    .map(|s| s.as_str().to_owned())
                    .unwrap_or_else(|_| sig.to_string());
                fail(&mut r, Outcome::Signaled, limit, format!("killed by signal {name}"));
            }
            (Some(0), None) => match policy::RawJson::from_slice(&stdout) {
                Ok(v) => r.result = Some(v),
                Err(e) => {
                    let cut = stdout.len().min(EXCERPT_BYTES);
                    let excerpt =
                        String::from_utf8_lossy(stdout.get(..cut).unwrap_or_default()).into_owned();
                    let more = if stdout.len() > cut { "..." } else { "" };
                    fail(
                        &mut r,
                        Outcome::InvalidResult,
                        None,
                        format!(
                            "stdout is not one JSON value ({e}); {} bytes: {excerpt:?}{more}",
                            stdout.len()
                        ),
                    );
                }
            },
            (Some(code), None) => {
                fail(&mut r, Outcome::ExitNonzero, None, format!("exited with status {code}"))
            }
            (None, None) => fail(&mut r, Outcome::Signaled, None, "the process vanished".into()),
        },
    }
    r
}
