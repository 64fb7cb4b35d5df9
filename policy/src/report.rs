//! The run report: how a run ended and what the sandbox enforced.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a run ended. The wire spelling is snake_case (`exit_nonzero`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Exit 0 and one JSON value on stdout.
    Ok,
    /// Exited with a non-zero status.
    ExitNonzero,
    /// Killed by a signal it did not ask for from us.
    Signaled,
    /// The wall-clock deadline or the CPU-time limit ended it (see [`LimitKind`]).
    Timeout,
    /// Wrote more than the stdout cap; killed.
    OutputLimit,
    /// Exit 0 but stdout is not one JSON value.
    InvalidResult,
    /// The entry could not be executed (not found, not executable, bad format).
    SpawnFailed,
    /// A required sandbox restriction could not be put in place; nothing ran.
    SandboxFailed,
    /// The request or the manifest failed the executor's own validation.
    Rejected,
    /// The args do not match the manifest schema.
    InvalidArgs,
    /// The caller may not run this skill.
    Denied,
    /// No capacity to run it now.
    Busy,
}

impl Outcome {
    /// Every outcome, in documentation order.
    pub const ALL: [Outcome; 12] = [
        Outcome::Ok,
        Outcome::ExitNonzero,
        Outcome::Signaled,
        Outcome::Timeout,
        Outcome::OutputLimit,
        Outcome::InvalidResult,
        Outcome::SpawnFailed,
        Outcome::SandboxFailed,
        Outcome::Rejected,
        Outcome::InvalidArgs,
        Outcome::Denied,
        Outcome::Busy,
    ];

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ExitNonzero => "exit_nonzero",
            Outcome::Signaled => "signaled",
            Outcome::Timeout => "timeout",
            Outcome::OutputLimit => "output_limit",
            Outcome::InvalidResult => "invalid_result",
            Outcome::SpawnFailed => "spawn_failed",
            Outcome::SandboxFailed => "sandbox_failed",
            Outcome::Rejected => "rejected",
            Outcome::InvalidArgs => "invalid_args",
            Outcome::Denied => "denied",
            Outcome::Busy => "busy",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which limit ended a run, when one did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// The wall-clock deadline.
    WallTime,
    /// RLIMIT_CPU (SIGXCPU or SIGKILL at the hard limit).
    CpuTime,
    /// The run's memory bound (cgroup OOM kill).
    Memory,
    /// The stdout cap.
    Output,
    /// RLIMIT_FSIZE (SIGXFSZ).
    FileSize,
}

/// How fully a mechanism was enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// Every right asked for is enforced.
    Full,
    /// Some rights are enforced; the kernel lacks the others.
    Partial,
    /// Nothing is enforced.
    None,
}

/// Landlock as it was applied to one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockReport {
    /// The kernel's Landlock ABI (0 = none).
    pub abi: u32,
    /// Full, partial or none.
    pub status: Enforcement,
    /// TCP bind/connect restricted (ABI >= 4).
    pub net: bool,
    /// Signals and abstract Unix sockets scoped (ABI >= 6).
    pub scoped: bool,
}

/// Which cgroup mechanisms held the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupReport {
    /// Whole-tree kill: `"v2"` (cgroup.kill), `"v1-freezer"`, or null.
    pub kill: Option<String>,
    /// Memory bound: `"v2"`, `"v1"` or null.
    pub memory: Option<String>,
    /// Process bound: `"v2"`, `"v1"` or null.
    pub pids: Option<String>,
}

/// One destination the run's egress rules refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeniedReport {
    /// `"127.0.0.3:8080"`, `"[::1]:80"`; `"*"` for a socket refused when
    /// made (ICMP), before it named a destination.
    pub destination: String,
    /// `tcp`, `udp`, `icmp`, or `ip:N`.
    pub protocol: String,
    /// Times refused.
    pub count: u64,
}

/// Which wall refused a run: Landlock's filesystem rules, the seccomp
/// filter, or the egress allowlist (or Landlock's network rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenialKind {
    /// Landlock refused a file access; `path` names the file.
    Fs,
    /// The seccomp filter refused a call; `syscall` names it.
    Syscall,
    /// A destination was refused; `destination` names it.
    Network,
}

impl DenialKind {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DenialKind::Fs => "fs",
            DenialKind::Syscall => "syscall",
            DenialKind::Network => "network",
        }
    }
}

/// One thing the sandbox refused a run, with how many times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// Which wall refused it.
    pub kind: DenialKind,
    /// What was refused: Landlock's access right (`read_file`,
    /// `write_file`, `make_reg`..., several joined with `,`), the filter's
    /// action for a syscall (`errno`, `kill`), the protocol of a
    /// destination (`tcp`, `udp`...).
    pub access: String,
    /// The file, for `fs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The call's name (`unshare`; `syscall:N` for one without a name
    /// here), for `syscall`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    /// `addr:port` (`*` for a socket refused when made), for `network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// Times refused.
    pub count: u64,
}

/// The run's network as enforced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "NetworkWire")]
pub struct NetworkReport {
    /// The run had network.
    pub enabled: bool,
    /// The allow rules held for the run, names resolved (`"10.0.0.0/8:443"`,
    /// `"192.0.2.1:443"`), resolvers included; empty with no network, or
    /// with every destination but the default refusals allowed.
    #[serde(default)]
    pub enforced: Vec<String>,
    /// The resolvers of the host were reachable on port 53.
    #[serde(default)]
    pub dns: bool,
    /// The most refused destinations, at most 16, most refused first.
    #[serde(default)]
    pub denied: Vec<DeniedReport>,
    /// Every refusal, listed or not.
    #[serde(default)]
    pub denied_total: u64,
}

/// `network` as sent: an object, or the boolean of an executor before
/// allowlists (so reports parse in both directions between versions).
#[derive(Deserialize)]
#[serde(untagged)]
enum NetworkWire {
    Enabled(bool),
    Report {
        enabled: bool,
        #[serde(default)]
        enforced: Vec<String>,
        #[serde(default)]
        dns: bool,
        #[serde(default)]
        denied: Vec<DeniedReport>,
        #[serde(default)]
        denied_total: u64,
    },
}

impl From<NetworkWire> for NetworkReport {
    fn from(w: NetworkWire) -> Self {
        match w {
            NetworkWire::Enabled(enabled) => Self { enabled, ..Self::default() },
            NetworkWire::Report { enabled, enforced, dns, denied, denied_total } => {
                Self { enabled, enforced, dns, denied, denied_total }
            }
        }
    }
}

/// What the sandbox actually enforced for a run. Nothing degrades silently:
/// anything asked for and not enforced is listed in `degraded`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxReport {
    /// uid the skill ran as.
    pub uid: u32,
    /// gid the skill ran as.
    pub gid: u32,
    /// PR_SET_NO_NEW_PRIVS was set.
    pub no_new_privs: bool,
    /// Capabilities kept (names); empty = none.
    pub capabilities: Vec<String>,
    /// Landlock.
    pub landlock: LandlockReport,
    /// A seccomp filter was attached.
    pub seccomp: bool,
    /// The run's network: granted or not, where it could connect, what
    /// was refused (a boolean from an executor before allowlists).
    pub network: NetworkReport,
    /// cgroup mechanisms.
    pub cgroup: CgroupReport,
    /// Resource limits that were set (name → value), e.g. `RLIMIT_NOFILE`.
    pub rlimits: std::collections::BTreeMap<String, u64>,
    /// What could not be enforced, one human-readable line each.
    pub degraded: Vec<String>,
    /// The processes the run saw in `/proc`: `own` (its own tree only) or
    /// `host` (granted, or not hidden: `degraded` says why). Absent from an
    /// executor older than the per-run view, which showed the host's.
    #[serde(default = "crate::sandbox::ProcView::host")]
    pub proc: crate::sandbox::ProcView,
    /// What the sandbox refused the run, first seen first, at most
    /// [`MAX_DENIALS`] entries (the rest counted in `denials_total`);
    /// empty when nothing was refused or when `denials_off` says why it
    /// was not watched.
    #[serde(default)]
    pub denials: Vec<Denial>,
    /// Every refusal seen, listed or not.
    #[serde(default)]
    pub denials_total: u64,
    /// Null when the run's refusals were watched; else why not (the
    /// executor's `report_denials`, the kernel's audit or Landlock ABI).
    #[serde(default)]
    pub denials_off: Option<String>,
}

/// Most entries of [`SandboxReport::denials`].
pub const MAX_DENIALS: usize = 32;

/// The report every run ends with (its fields: docs/skills.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The skill's name.
    pub skill: String,
    /// How the run ended.
    pub outcome: Outcome,
    /// The result JSON on `ok`, else null: the skill's stdout verbatim.
    pub result: Option<crate::RawJson>,
    /// What went wrong, or null on `ok`.
    pub error: Option<String>,
    /// Exit status when the process exited.
    pub exit_code: Option<i32>,
    /// Signal number when the process was killed by one.
    pub signal: Option<i32>,
    /// Which limit ended the run, if one did.
    #[serde(default)]
    pub limit: Option<LimitKind>,
    /// Wall time from request to report, milliseconds.
    pub duration_ms: u64,
    /// Sandbox setup time, microseconds: from validation to the child's
    /// `execve` call, as the child timed it (a hold for `start` excluded).
    #[serde(default)]
    pub setup_us: u64,
    /// The run was taken from the skill's warm pool: a process already
    /// boxed and waiting for its args (`[skills.NAME] warm`), so
    /// `setup_us` is only the take.
    #[serde(default)]
    pub warm: bool,
    /// Bounded tail of stderr.
    pub stderr: String,
    /// Stderr bytes not in `stderr`: dropped from the tail, or cut from
    /// lines over the line bound.
    #[serde(default)]
    pub stderr_truncated_bytes: u64,
    /// What the sandbox enforced; null when nothing ran.
    pub sandbox: Option<SandboxReport>,
}

impl RunReport {
    /// A report for a run that never started (`rejected`, `denied`, `busy`...).
    pub fn not_run(skill: impl Into<String>, outcome: Outcome, error: impl Into<String>) -> Self {
        Self {
            skill: skill.into(),
            outcome,
            result: None,
            error: Some(error.into()),
            exit_code: None,
            signal: None,
            limit: None,
            duration_ms: 0,
            setup_us: 0,
            warm: false,
            stderr: String::new(),
            stderr_truncated_bytes: 0,
            sandbox: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_spellings_round_trip() {
        for o in Outcome::ALL {
            let s = serde_json::to_string(&o).unwrap();
            assert_eq!(s, format!("\"{}\"", o.as_str()));
            assert_eq!(serde_json::from_str::<Outcome>(&s).unwrap(), o);
        }
    }

    #[test]
    fn network_reads_the_object_and_the_old_boolean() {
        let old: NetworkReport = serde_json::from_str("true").unwrap();
        assert_eq!(old, NetworkReport { enabled: true, ..NetworkReport::default() });
        let r = NetworkReport {
            enabled: true,
            enforced: vec!["127.0.0.1:8080".into()],
            dns: true,
            denied: vec![DeniedReport {
                destination: "127.0.0.3:8080".into(),
                protocol: "tcp".into(),
                count: 2,
            }],
            denied_total: 3,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.starts_with(r#"{"enabled":true,"enforced":["127.0.0.1:8080"]"#), "{text}");
        assert_eq!(serde_json::from_str::<NetworkReport>(&text).unwrap(), r);
        assert!(serde_json::from_str::<NetworkReport>(r#"{"dns":true}"#).is_err());
    }

    #[test]
    fn not_run_has_null_result() {
        let r = RunReport::not_run("x", Outcome::Busy, "full");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["result"], serde_json::Value::Null);
        assert_eq!(v["outcome"], "busy");
        assert_eq!(v["sandbox"], serde_json::Value::Null);
    }
}
