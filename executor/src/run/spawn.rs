//! Spawn sequence steps 2 to 5: prepare everything in the parent (here),
//! then create the child through `sys::child`, which applies it and execs
//! (`create`), in a run slot made on the spot or ahead (`slot`).

mod create;
mod slot;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

use nix::sys::resource::{getrlimit, Resource};
use policy::report::{NetworkReport, SandboxReport};
use policy::sandbox::CAPABILITY_NAMES;
use policy::Outcome;

pub(crate) use self::create::prefill_stdin;
pub use self::create::{spawn, spawn_waiting, Child, Spawners};
pub use self::slot::{Slot, Stdio};
use crate::config::{Config, EgressMode, LandlockMode};
use crate::host::procview::{ProcSetup, RunsNamespace};
use crate::run::egress::{self, EgressCache, RunEgress, RunEgressError};
use crate::run::plan::Plan;
use crate::run::proc_view::ProcPlace;
use crate::run::rundir::{RunDir, RunDirError};
use crate::sandbox::cgroup::{CgroupError, Hierarchies, RunCgroup};
use crate::sandbox::landlock::{self, FsPolicy, LandlockError};
use crate::sandbox::seccomp;
use crate::sys;
use crate::sys::spec::{Identity, Step};

/// Why a run could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The per-run directory.
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    /// The run's cgroups.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The Landlock ruleset.
    #[error(transparent)]
    Landlock(#[from] LandlockError),
    /// The egress allowlist of a networked run.
    #[error("skill \"{skill}\": {source}")]
    Egress {
        /// The skill.
        skill: String,
        /// What failed.
        source: RunEgressError,
    },
    /// A pipe, or a string with a NUL byte.
    #[error("skill \"{skill}\": cannot prepare the child: {reason}")]
    Prepare {
        /// The skill.
        skill: String,
        /// What failed.
        reason: String,
    },
    /// A sandbox step in the child failed; nothing ran.
    #[error("skill \"{skill}\": sandbox step \"{}\" failed: {}", .step.describe(), std::io::Error::from_raw_os_error(*.errno))]
    Sandbox {
        /// The skill.
        skill: String,
        /// The step.
        step: Step,
        /// Its errno.
        errno: i32,
    },
    /// `execve` of the entry failed.
    #[error("skill \"{skill}\": cannot execute {}: {}", .entry.display(), std::io::Error::from_raw_os_error(*.errno))]
    Exec {
        /// The skill.
        skill: String,
        /// The entry.
        entry: std::path::PathBuf,
        /// Its errno.
        errno: i32,
    },
}

impl SpawnError {
    /// The run outcome this error stands for.
    pub fn outcome(&self) -> Outcome {
        match self {
            SpawnError::Exec { .. } => Outcome::SpawnFailed,
            _ => Outcome::SandboxFailed,
        }
    }
}

/// Host facts the executor learns once.
#[derive(Debug, Clone)]
pub struct Host {
    /// Landlock ABI of the kernel.
    pub landlock_abi: u32,
    /// Highest capability number.
    pub cap_last: u32,
    /// cgroup hierarchies (once the engine started: with its instance's
    /// parents as bases).
    pub cgroups: Hierarchies,
    /// Where run directories are made (once the engine started: its
    /// instance's directory); empty = `<runtime_dir>/runs`.
    pub runs_dir: PathBuf,
    /// Shortfalls found at start-up, repeated in every report.
    pub notes: Vec<String>,
    /// Egress programs loaded for networked runs, by rule set.
    pub egress: std::sync::Arc<EgressCache>,
    /// Where runs get a `/proc` that shows only their own processes (set
    /// when the engine starts, after its runs tmpfs: the runs' mount
    /// namespace is a copy of the executor's then).
    pub proc: ProcSetup,
}

impl Host {
    /// Probes this host.
    pub fn detect() -> Self {
        let (cgroups, notes) = Hierarchies::detect();
        Host {
            landlock_abi: sys::landlock::abi(),
            cap_last: sys::process::cap_last_cap(),
            cgroups,
            runs_dir: PathBuf::new(),
            notes,
            egress: std::sync::Arc::default(),
            proc: ProcSetup::Unavailable("the executor has not started".to_owned()),
        }
    }
}

/// Step 2 done: everything the child needs, owned by the parent.
#[derive(Debug)]
pub struct Prepared {
    /// The per-run directory (removed on drop).
    pub run_dir: RunDir,
    /// The run's cgroups (killed and removed on drop).
    pub cgroup: Option<RunCgroup>,
    /// The slot's stdio pipes, taken by [`spawn`].
    stdio: Option<Stdio>,
    /// What the sandbox enforces, for the report.
    pub report: SandboxReport,
    /// The networked run's allowlist, attached to its cgroup v2 leaf
    /// before the child joins it ([`Prepared::end_egress`] at the end).
    pub egress: Option<RunEgress>,
    /// The Landlock ruleset was one built for an earlier run in the slot
    /// (`landlock::Cache`).
    pub landlock_reused: bool,
    landlock: Option<OwnedFd>,
    seccomp: &'static [seccomp::Insn],
    /// The child logs its refusals to the audit (`run::denials`).
    pub log_denials: bool,
    /// Which of the four seccomp programs (`seccomp::program`).
    variant: seccomp::Variant,
    rlimits: Vec<(u32, u64, u64)>,
    identity: Option<Identity>,
    capabilities: u64,
    cap_last: u32,
    /// The child joins this mount namespace in step 4b (when no spawner
    /// thread living in it creates the child).
    mount_ns: Option<Arc<RunsNamespace>>,
    /// The run must not be created by a spawner thread: those live in the
    /// runs' mount namespace, and it is granted the host's `/proc`.
    host_proc: bool,
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
    skill: String,
    /// A long-lived server's stdin stays open for the executor to write
    /// requests on ([`Prepared::serve_with`]).
    keep_stdin: bool,
}

fn cstring(skill: &str, what: &str, bytes: &[u8]) -> Result<CString, SpawnError> {
    CString::new(bytes).map_err(|_| SpawnError::Prepare {
        skill: skill.to_owned(),
        reason: format!("{what} contains a NUL byte"),
    })
}

fn rlimit_table(plan: &Plan, root: bool) -> Vec<(&'static str, Resource, u64, u64)> {
    let l = &plan.granted.limits;
    // An MCP server lives across calls: its CPU time is not bounded by one
    // call's timeout (each call is, by its deadline) unless the operator
    // sets `cpu_seconds`.
    let cpu = match plan.manifest.mcp() {
        Some(_) if l.cpu_seconds == 0 => libc::RLIM_INFINITY,
        _ => l.cpu_seconds_for(plan.manifest.timeout()),
    };
    let table = [
        ("RLIMIT_CORE", Resource::RLIMIT_CORE, 0, 0),
        ("RLIMIT_NOFILE", Resource::RLIMIT_NOFILE, l.nofile, l.nofile),
        ("RLIMIT_FSIZE", Resource::RLIMIT_FSIZE, l.fsize_bytes, l.fsize_bytes),
        ("RLIMIT_CPU", Resource::RLIMIT_CPU, cpu, cpu.saturating_add(1)),
        ("RLIMIT_AS", Resource::RLIMIT_AS, l.address_space_bytes, l.address_space_bytes),
        // No real-time policy, no nice value below 0 (step 5 resets both).
        ("RLIMIT_RTPRIO", Resource::RLIMIT_RTPRIO, 0, 0),
        ("RLIMIT_NICE", Resource::RLIMIT_NICE, 0, 0),
    ];
    table
        .into_iter()
        .map(|(name, res, soft, hard)| {
            if root {
                return (name, res, soft, hard);
            }
            // Without privilege a hard limit can only go down.
            let cur_hard = getrlimit(res).map(|(_, h)| h).unwrap_or(u64::MAX);
            (name, res, soft.min(cur_hard), hard.min(cur_hard))
        })
        .collect()
}

/// Spawn sequence step 2: prepare the sandbox in the parent, in `slot`
/// (made with [`Slot::create`]; its owner and bounds are set to the plan's),
/// with the grant's names looked up ahead (`resolved`: see
/// [`egress::resolve_grant`]).
///
/// # Errors
///
/// [`SpawnError`]: a required restriction that cannot be put in place.
pub fn prepare(
    config: &Config,
    host: &Host,
    plan: &Plan,
    resolved: &egress::Resolved,
    slot: Slot,
) -> Result<Prepared, SpawnError> {
    let skill = plan.manifest.name().to_string();
    let root = crate::run::plan::euid() == 0;
    let mut degraded = host.notes.clone();
    let owner = plan.run_as.switch.then_some((plan.run_as.uid, plan.run_as.gid));
    let Slot { id: _, mut run_dir, mut cgroup, stdio } = slot;
    run_dir.chown(owner)?;
    if let Some(cg) = cgroup.as_mut() {
        let l = &plan.granted.limits;
        cg.set_limits(l.memory_bytes, l.max_pids)?;
    }

    let place = ProcPlace::choose(plan.granted.proc, &host.proc);
    let ll = ruleset(config, host, plan, &place, &mut run_dir)?;
    degraded.extend(ll.degraded);

    let table = rlimit_table(plan, root);
    let rlimits = table.iter().map(|(_, res, s, h)| (*res as u32, *s, *h)).collect();
    let rlimit_report: BTreeMap<String, u64> =
        table.iter().map(|(name, _, soft, _)| ((*name).to_owned(), *soft)).collect();

    let capabilities = plan.granted.capabilities.iter().fold(0u64, |m, c| m | (1u64 << (c & 63)));
    if !plan.run_as.switch && plan.granted.run_as.is_some() {
        degraded.push(format!(
            "identity: executor is not root; running as {} instead of {:?}",
            plan.run_as.name, plan.granted.run_as
        ));
    }

    let (path, envp) = exec_strings(&skill, plan)?;
    let cwd = cstring(&skill, "run directory", run_dir.path().as_os_str().as_bytes())?;

    let (network, run_egress) =
        attach_egress(config, host, (plan, resolved), cgroup.as_ref(), &mut degraded)?;
    let variant = seccomp::Variant::for_run(
        plan.granted.network,
        plan.run_as.dedicated,
        &plan.granted.capabilities,
    );
    let ll_fd = ll.fd;
    let proc = place.view(plan.granted.proc, ll_fd.is_some(), &host.proc, &mut degraded);
    let report = SandboxReport {
        uid: plan.run_as.uid,
        gid: plan.run_as.gid,
        no_new_privs: true,
        capabilities: capability_names(&plan.granted.capabilities),
        landlock: ll.report,
        seccomp: true,
        network,
        cgroup: cgroup.as_ref().map(|c| c.report.clone()).unwrap_or_default(),
        rlimits: rlimit_report,
        degraded,
        proc,
        denials: Vec::new(),
        denials_total: 0,
        denials_off: None,
    };
    Ok(Prepared {
        run_dir,
        cgroup,
        stdio,
        report,
        egress: run_egress,
        landlock_reused: ll.reused,
        landlock: ll_fd,
        seccomp: seccomp::program(variant),
        log_denials: false,
        variant,
        rlimits,
        identity: plan
            .run_as
            .switch
            .then_some(Identity { uid: plan.run_as.uid, gid: plan.run_as.gid }),
        capabilities,
        cap_last: host.cap_last,
        mount_ns: place.namespace.clone(),
        host_proc: place.host_proc,
        argv: vec![path.clone()],
        path,
        envp,
        cwd,
        skill,
        keep_stdin: false,
    })
}

/// The run's Landlock ruleset: read-write beneath the slot's home, whose
/// only entry is the run directory (rundir), so a ruleset built for an
/// earlier run of the same policy in this slot serves this one
/// (landlock::Cache); `/proc` as `place` has the child see it.
fn ruleset(
    config: &Config,
    host: &Host,
    plan: &Plan,
    place: &ProcPlace,
    run_dir: &mut RunDir,
) -> Result<landlock::Prepared, SpawnError> {
    let mut fs = FsPolicy::new(
        &plan.skill_dir,
        &plan.entry,
        run_dir.home(),
        &plan.granted.fs_read,
        &plan.granted.fs_write,
        plan.granted.network,
    );
    place.adjust(&mut fs);
    let ll =
        landlock::prepare(host.landlock_abi, config.landlock, &fs, Some(&mut run_dir.rulesets))?;
    if config.landlock == LandlockMode::BestEffort && ll.fd.is_none() {
        let skill = plan.manifest.name();
        tracing::warn!("skill \"{skill}\": running without Landlock (best effort)");
    }
    Ok(ll)
}

/// The entry's path and the environment as `NAME=VALUE`, for `execve`.
fn exec_strings(skill: &str, plan: &Plan) -> Result<(CString, Vec<CString>), SpawnError> {
    let path = cstring(skill, "entry", plan.entry.as_os_str().as_bytes())?;
    let envp = plan
        .env
        .iter()
        .map(|(k, v)| {
            let mut kv = Vec::with_capacity(k.len() + v.len() + 1);
            kv.extend_from_slice(k.as_bytes());
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            cstring(skill, "environment", &kv)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((path, envp))
}

/// The report's names of the granted capability numbers.
fn capability_names(granted: &[u8]) -> Vec<String> {
    granted
        .iter()
        .filter_map(|c| CAPABILITY_NAMES.get(usize::from(*c)).map(|s| (*s).to_owned()))
        .collect()
}

/// The networked run's allowlist, put on its cgroup v2 leaf (before the
/// child joins it), and the report's `network` object. Where the kernel
/// cannot hold it, the run is refused unless `egress = "best-effort"`,
/// which runs it unrestricted and says so in `degraded`.
fn attach_egress(
    config: &Config,
    host: &Host,
    (plan, resolved): (&Plan, &egress::Resolved),
    cgroup: Option<&RunCgroup>,
    degraded: &mut Vec<String>,
) -> Result<(NetworkReport, Option<RunEgress>), SpawnError> {
    let granted = &plan.granted;
    let mut report = NetworkReport { enabled: granted.network, ..NetworkReport::default() };
    if !granted.network {
        return Ok((report, None));
    }
    let skill = plan.manifest.name().to_string();
    let fail = |source| SpawnError::Egress { skill: skill.clone(), source };
    let (rules, enforced) =
        egress::rules_for(granted, resolved, &config.resolv_conf, &egress::host_addrs())
            .map_err(fail)?;
    report.dns = granted.dns;
    let attached =
        cgroup.and_then(RunCgroup::v2_leaf).ok_or(RunEgressError::NoCgroupV2).and_then(|leaf| {
            let loaded = host.egress.get(&rules)?;
            RunEgress::attach(loaded, leaf)
        });
    match attached {
        Ok(a) => {
            report.enforced = enforced;
            Ok((report, Some(a)))
        }
        Err(e) if config.egress == EgressMode::BestEffort => {
            tracing::warn!("skill \"{skill}\": network unrestricted (best effort): {e}");
            degraded.push(format!("network: allowlist not enforced: {e}"));
            Ok((report, None))
        }
        Err(e) => Err(fail(e)),
    }
}

impl Prepared {
    /// Makes this the start of a long-lived server: argv is the entry and
    /// then `args`, and [`spawn`] keeps the child's stdin open.
    ///
    /// # Errors
    ///
    /// [`SpawnError::Prepare`] for an argument with a NUL byte.
    pub fn serve_with(&mut self, args: &[String]) -> Result<(), SpawnError> {
        for a in args {
            let a = cstring(&self.skill, "argument", a.as_bytes())?;
            self.argv.push(a);
        }
        self.keep_stdin = true;
        Ok(())
    }

    /// Detaches the run's allowlist (its processes are gone, or none ran)
    /// and puts what it refused in the report; before its cgroup leaf
    /// serves another run.
    pub fn end_egress(&mut self) {
        if let Some(e) = self.egress.take() {
            e.finish(&mut self.report.network);
        }
    }
}
