//! Spawn sequence steps 2 to 5: prepare everything in the parent, then
//! create the child through `sys::child`, which applies it and execs.

use std::collections::BTreeMap;
use std::ffi::{c_char, CString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::resource::{getrlimit, Resource};
use policy::report::{NetworkReport, SandboxReport};
use policy::sandbox::CAPABILITY_NAMES;
use policy::Outcome;

use crate::config::{Config, EgressMode, LandlockMode};
use crate::host::procview::{ProcSetup, RunsNamespace};
use crate::run::egress::{self, EgressCache, RunEgress, RunEgressError};
use crate::run::plan::Plan;
use crate::run::proc_view::ProcPlace;
use crate::run::rundir::{RunDir, RunDirError};
use crate::run::spawner::Spawner;
use crate::sandbox::cgroup::{CgroupError, Hierarchies, RunCgroup};
use crate::sandbox::landlock::{self, FsPolicy, LandlockError};
use crate::sandbox::seccomp;
use crate::sys;
use crate::sys::spec::{ChildSpec, Identity, SpawnFailure, Step};

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

/// A running child and the parent's ends of its pipes.
#[derive(Debug)]
pub struct Child {
    /// Its pid.
    pub pid: i32,
    /// Its pidfd.
    pub pidfd: OwnedFd,
    /// Write end of its stdin (non-blocking) and how many bytes of the
    /// args are already in the pipe; `None` once all of them are there and
    /// the pipe is closed behind them.
    pub stdin: Option<(OwnedFd, usize)>,
    /// Read end of its stdout (non-blocking).
    pub stdout: OwnedFd,
    /// Read end of its stderr (non-blocking).
    pub stderr: OwnedFd,
    /// When it called `execve`, as it timed it (step 5): the end of the
    /// run's setup, however late the run's thread got to run after it.
    pub exec_at: Instant,
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

/// A run's fresh directory and cgroup leaves, named after one random id.
/// Made for the run on the spot, or ahead of it by the engine's janitor.
/// The directory is always fresh; the janitor may give a new slot the
/// emptied and reset cgroup leaves of a finished run ([`Slot::reuse`]).
#[derive(Debug)]
pub struct Slot {
    /// The id naming the directory and the leaves.
    pub id: String,
    /// The per-run directory.
    pub run_dir: RunDir,
    /// The leaves; `None` without cgroups.
    pub cgroup: Option<RunCgroup>,
    /// The run's stdio pipes, made with the slot (ahead of the run when
    /// the janitor makes it: six system calls off the run's path); `None`
    /// when they could not be made then ([`spawn`] makes them).
    pub stdio: Option<Stdio>,
}

/// A run's three stdio pipes: the child's ends and the executor's.
#[derive(Debug)]
pub struct Stdio {
    stdin: (OwnedFd, OwnedFd),
    stdout: (OwnedFd, OwnedFd),
    stderr: (OwnedFd, OwnedFd),
}

impl Stdio {
    /// Three fresh pipes: close-on-exec, numbered >= 3, the executor's
    /// ends non-blocking.
    ///
    /// # Errors
    ///
    /// [`SpawnError::Prepare`] naming `skill`.
    pub fn new(skill: &str) -> Result<Self, SpawnError> {
        Ok(Stdio {
            stdin: pipe(skill, Ours::Write)?,
            stdout: pipe(skill, Ours::Read)?,
            stderr: pipe(skill, Ours::Read)?,
        })
    }

    /// [`Stdio::new`] for a slot made ahead: `None` on an error (logged),
    /// which the run then meets itself.
    fn ahead() -> Option<Self> {
        Self::new("").map_err(|e| tracing::debug!("a slot's pipes are left to its run: {e}")).ok()
    }
}

impl Slot {
    /// Makes a slot: the directory first, then the leaves (the order the
    /// start-up sweep relies on), with these bounds and owner.
    ///
    /// # Errors
    ///
    /// [`SpawnError`]; what was made is removed.
    pub fn create(
        config: &Config,
        host: &Host,
        memory_bytes: u64,
        max_pids: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<Slot, SpawnError> {
        let (id, run_dir) = Self::fresh_dir(config, host, owner)?;
        let cgroup = if host.cgroups == Hierarchies::default() {
            None
        } else {
            Some(RunCgroup::create(&host.cgroups, &id, memory_bytes, max_pids)?)
        };
        Ok(Slot { id, run_dir, cgroup, stdio: Stdio::ahead() })
    }

    /// A slot made of the leaves of a finished run that
    /// [`RunCgroup::recycle`] found empty and reset and of its directory's
    /// home with a new run directory in it ([`RunDir::renew`]; a home that
    /// was changed is removed and a new one made), which keeps the
    /// Landlock rulesets built for it (the engine's janitor; the leaves
    /// keep their own name). On error the leaves are dropped, i.e.
    /// removed.
    ///
    /// # Errors
    ///
    /// [`SpawnError`] of making the directory.
    pub fn reuse(
        config: &Config,
        host: &Host,
        cgroup: RunCgroup,
        mut run_dir: RunDir,
    ) -> Result<Slot, SpawnError> {
        let owner = run_dir.owner();
        if let Err(e) = run_dir.renew() {
            tracing::debug!("janitor: a slot's directory is made anew: {e}");
            run_dir.remove();
            let (id, run_dir) = Self::fresh_dir(config, host, owner)?;
            return Ok(Slot { id, run_dir, cgroup: Some(cgroup), stdio: Stdio::ahead() });
        }
        let id = run_dir.home().file_name().map(|n| n.to_string_lossy().into_owned());
        let id = id.unwrap_or_default();
        Ok(Slot { id, run_dir, cgroup: Some(cgroup), stdio: Stdio::ahead() })
    }

    fn fresh_dir(
        config: &Config,
        host: &Host,
        owner: Option<(u32, u32)>,
    ) -> Result<(String, RunDir), SpawnError> {
        let id = crate::run::rundir::random_id().map_err(|e| SpawnError::Prepare {
            skill: String::new(),
            reason: format!("run id: {e}"),
        })?;
        let runs = if host.runs_dir.as_os_str().is_empty() {
            config.runtime_dir().join("runs")
        } else {
            host.runs_dir.clone()
        };
        let run_dir = RunDir::create(&runs, &id, owner)?;
        Ok((id, run_dir))
    }
}

/// Spawn sequence step 2: prepare the sandbox in the parent, in `slot`
/// (made with [`Slot::create`]; its owner and bounds are set to the plan's).
///
/// # Errors
///
/// [`SpawnError`]: a required restriction that cannot be put in place.
pub fn prepare(
    config: &Config,
    host: &Host,
    plan: &Plan,
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

    let (network, run_egress) = attach_egress(config, host, plan, cgroup.as_ref(), &mut degraded)?;
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
    plan: &Plan,
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
        egress::rules_for(granted, &config.resolv_conf, &egress::host_addrs()).map_err(fail)?;
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

/// The engine's spawner threads ([`crate::run::spawner`]): one pool per seccomp
/// program ([`seccomp::Variant`]: the network grant, metadata locked),
/// started on first use.
/// A child created by one inherits the pool's filter instead of compiling
/// it (~90 µs per spawn on the dev machine).
#[derive(Debug, Default)]
pub struct Spawners {
    pools: [OnceLock<Option<Spawner>>; 4],
    /// No spawner threads: every child installs the filter itself.
    inline: bool,
    /// The threads' filters log their refusals to the audit (the runs'
    /// refusals are read back: `run::denials`).
    log: bool,
    /// The runs' mount namespace, which the threads join when they start
    /// (`host::procview`).
    ns: Option<Arc<RunsNamespace>>,
}

impl Spawners {
    /// No spawner threads: each child installs the seccomp filter itself.
    /// For a one-shot `ongrid-executor run`: its one child has nothing to
    /// share the filter with, and threads made while the cgroup attach
    /// lock's warm-up ([`crate::host::attach_lock`]) waits for its RCU grace
    /// period wait with it (2-3 ms more per one-shot run, measured).
    pub fn inline() -> Self {
        Spawners { inline: true, ..Spawners::default() }
    }

    /// The threads' filters log their refusals (set before the first run:
    /// a pool's filter is installed when the pool starts).
    pub fn log_denials(&mut self, log: bool) {
        self.log = log;
    }

    /// The threads join the runs' mount namespace `ns` (set before the
    /// first run, as [`Spawners::log_denials`]).
    pub fn runs_namespace(&mut self, ns: Option<Arc<RunsNamespace>>) {
        self.ns = ns;
    }

    /// The pool for `seccomp::program(variant)`, `None` when inline or
    /// when its threads could not start (logged once; the children then
    /// install the filter).
    fn get(&self, variant: seccomp::Variant) -> Option<&Spawner> {
        if self.inline {
            return None;
        }
        self.pools[variant.index()]
            .get_or_init(|| {
                // Two per CPU, 4 to 8: a thread whose parked child a run
                // took is busy until it has parked another, and a run that
                // finds none parked waits for a thread to make its child
                // (two more hand-offs). With 8 clients on 2 CPUs, 4 threads
                // against 2: runs/s higher or equal in 8 of 8 rounds, p50
                // lower in 6.
                let threads = std::thread::available_parallelism()
                    .map_or(4, |n| n.get().saturating_mul(2).clamp(4, 8));
                let flags = if self.log { sys::call::SECCOMP_FILTER_FLAG_LOG } else { 0 };
                let program = seccomp::program(variant);
                let ns = self.ns.clone();
                match Spawner::start_in(ns, program, flags, threads, "ongrid-spawner") {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::warn!(
                            "cannot start the spawner threads ({e}); each child installs \
                             the seccomp filter itself"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }
}

/// Which end of a pipe the executor keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ours {
    Read,
    Write,
}

/// A pipe whose ends are close-on-exec and numbered >= 3 (so `dup3` onto
/// 0..2 in the child never meets its own source), the executor's end
/// non-blocking (set here with one `fcntl`, so the supervisor can take it
/// as it is), the child's end blocking.
fn pipe(skill: &str, ours: Ours) -> Result<(OwnedFd, OwnedFd), SpawnError> {
    let err = |e: nix::Error| SpawnError::Prepare {
        skill: skill.to_owned(),
        reason: format!("pipe: {e}"),
    };
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(err)?;
    let mine = if ours == Ours::Read { &r } else { &w };
    nix::fcntl::fcntl(mine, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(err)?;
    // OwnedFd::try_clone duplicates with F_DUPFD_CLOEXEC starting at 3.
    let high = |fd: OwnedFd| -> Result<OwnedFd, SpawnError> {
        if fd.as_raw_fd() >= 3 {
            return Ok(fd);
        }
        fd.try_clone().map_err(|e| SpawnError::Prepare {
            skill: skill.to_owned(),
            reason: format!("dup: {e}"),
        })
    };
    Ok((high(r)?, high(w)?))
}

/// This process's pid, read once.
fn own_pid() -> i32 {
    static PID: OnceLock<i32> = OnceLock::new();
    *PID.get_or_init(|| nix::unistd::getpid().as_raw())
}

/// Puts what fits of `args` into the stdin pipe before the child exists,
/// and closes the pipe behind them when all of them fit (64 KiB, nearly
/// always): the child then reads its args and EOF without waiting on the
/// executor, which saves the skill a sleep and a wake-up per run on a busy
/// host. Returns the write end and how much was written when some is left.
fn prefill_stdin(fd: OwnedFd, args: &[u8]) -> Option<(OwnedFd, usize)> {
    let mut done = 0;
    while done < args.len() {
        match nix::unistd::write(&fd, &args[done..]) {
            Ok(n) => done += n,
            Err(nix::errno::Errno::EINTR) => {}
            // Full (EAGAIN) or anything else: the supervisor carries on
            // from here and meets the error itself.
            Err(_) => break,
        }
    }
    (done < args.len()).then_some((fd, done))
}

/// Spawn sequence steps 3 to 5: create the child, which applies the
/// sandbox and execs the entry, on the slot's pipes (made here when it
/// has none). `args` go into its stdin first (`prefill_stdin`). `spin`:
/// how long a child made ahead may be watched for its `exec` without
/// sleeping (`spawner`'s `spawn_spinning`; zero: sleep at once).
/// `meanwhile` runs once the child has its spec (else once it exists),
/// off the path to its `exec`.
///
/// # Errors
///
/// [`SpawnError::Sandbox`] or [`SpawnError::Exec`] naming the step,
/// [`SpawnError::Prepare`] when pipes cannot be made.
pub fn spawn(
    prep: &mut Prepared,
    entry: &Path,
    args: &[u8],
    spawners: &Spawners,
    spin: Duration,
    meanwhile: impl FnOnce(),
) -> Result<Child, SpawnError> {
    spawn_with(prep, entry, Input::Args(args), spawners, spin, meanwhile)
}

/// [`spawn`] for a warm run (`run::warm`): the child gets an empty stdin
/// kept open (the returned [`Child::stdin`] is its write end, nothing
/// written), so it execs and blocks reading its args until a request
/// writes them. Never watched for without sleeping (nobody waits on it).
///
/// # Errors
///
/// As [`spawn`].
pub fn spawn_waiting(
    prep: &mut Prepared,
    entry: &Path,
    spawners: &Spawners,
    start_idle: bool,
    meanwhile: impl FnOnce(),
) -> Result<Child, SpawnError> {
    let input = Input::Waiting { start_idle };
    spawn_with(prep, entry, input, spawners, Duration::ZERO, meanwhile)
}

/// What a child's stdin gets at its spawn.
enum Input<'a> {
    /// The args, prefilled.
    Args(&'a [u8]),
    /// Nothing yet: kept open and empty (a warm run, its args later);
    /// `start_idle`: the child runs at `SCHED_IDLE` once its cgroups are joined.
    Waiting { start_idle: bool },
}

/// [`spawn`] with its child's stdin as `input` says.
fn spawn_with(
    prep: &mut Prepared,
    entry: &Path,
    input: Input<'_>,
    spawners: &Spawners,
    spin: Duration,
    meanwhile: impl FnOnce(),
) -> Result<Child, SpawnError> {
    let stdio = match prep.stdio.take() {
        Some(stdio) => stdio,
        None => Stdio::new(&prep.skill)?,
    };
    let prep = &*prep;
    let skill = prep.skill.as_str();
    let Stdio { stdin: (stdin_r, stdin_w), stdout: (stdout_r, stdout_w), stderr } = stdio;
    let (stderr_r, stderr_w) = stderr;
    // Kept open and empty: a warm run (args later) or an MCP pack's server.
    let (stdin, start_idle) = match input {
        Input::Args(args) if !prep.keep_stdin => (prefill_stdin(stdin_w, args), false),
        Input::Args(_) => (Some((stdin_w, 0)), false),
        Input::Waiting { start_idle } => (Some((stdin_w, 0)), start_idle),
    };
    let argv: Vec<*const c_char> =
        prep.argv.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let envp: Vec<*const c_char> =
        prep.envp.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let procs: Vec<RawFd> = prep.cgroup.as_ref().map(RunCgroup::procs_fds).unwrap_or_default();
    let exec_ns = AtomicU64::new(0);
    // Step 3: a spawner thread carrying the run's seccomp program creates
    // the child, which inherits the filter; without one (it could not
    // start) the child installs the program itself in step 4i.
    // Its bounding set is empty: a run granted capabilities (they must stay
    // in the bounding set) goes without one.
    // A run granted the host's /proc goes without one too: the threads
    // live in the runs' mount namespace, whose /proc hides the host.
    let spawner =
        if prep.capabilities == 0 && !prep.host_proc { spawners.get(prep.variant) } else { None };
    let mut spec = ChildSpec {
        path: &prep.path,
        argv: &argv,
        envp: &envp,
        stdio: [stdin_r.as_raw_fd(), stdout_w.as_raw_fd(), stderr_w.as_raw_fd()],
        cwd: &prep.cwd,
        cgroup_procs: &procs,
        rlimits: &prep.rlimits,
        identity: prep.identity,
        capabilities: prep.capabilities,
        cap_last: prep.cap_last,
        landlock: prep.landlock.as_ref().map(AsRawFd::as_raw_fd),
        share_below: None,
        seccomp: prep.seccomp,
        log_denials: prep.log_denials,
        parent: own_pid(),
        bounding_cleared: false,
        exec_at: Some(&exec_ns),
        mount_ns: prep.mount_ns.as_deref().map(|ns| ns.mount_ns().as_raw_fd()),
        start_idle,
    };
    // The child shares the table until its cgroups are joined, then keeps
    // only what is below its floor (host::fdtable): the top of the band its
    // descriptors are placed on, else the table's floor when they are below
    // it; else it copies the table. `placed` lives until the child exec'd.
    let placed = crate::host::fdtable::bands().and_then(|bands| {
        let [i, o, e] = spec.stdio;
        bands.place([Some(i), Some(o), Some(e), spec.landlock])
    });
    match placed.as_ref().map(|p| (p.fds(), p.top())) {
        Some(([Some(i), Some(o), Some(e), landlock], top)) => {
            spec.stdio = [i, o, e];
            spec.landlock = landlock;
            spec.share_below = Some(top);
        }
        _ => {
            let kept = spec.stdio.into_iter().chain(spec.landlock);
            spec.share_below = crate::host::fdtable::floor()
                .filter(|floor| crate::sys::spec::all_below(*floor, kept.clone()));
        }
    }
    // Steps 3-5 (in the child): see sys::child.
    let spawned = match spawner {
        Some(spawner) => {
            // The thread carries the filter and lives in the namespace.
            spec.seccomp = &[];
            spec.mount_ns = None;
            spawner.spawn_spinning(&spec, spin, meanwhile)
        }
        None => {
            let spawned = sys::child::spawn(&spec);
            meanwhile();
            spawned
        }
    };
    let spawned = spawned.map_err(|SpawnFailure { step, errno }| {
        if step == Step::Exec {
            SpawnError::Exec { skill: skill.to_owned(), entry: entry.to_owned(), errno }
        } else {
            SpawnError::Sandbox { skill: skill.to_owned(), step, errno }
        }
    })?;
    let exec_at = exec_instant(exec_ns.load(Ordering::Acquire));
    drop((placed, stdin_r, stdout_w, stderr_w));
    Ok(Child {
        pid: spawned.pid,
        pidfd: spawned.pidfd,
        stdin,
        stdout: stdout_r,
        stderr: stderr_r,
        exec_at,
    })
}

/// The [`Instant`] of a `CLOCK_MONOTONIC` reading `ns` the child took
/// (the clock `Instant` reads on Linux): now, less the time since. Now
/// when it took none (0) or the clock cannot be read.
fn exec_instant(ns: u64) -> Instant {
    let now = Instant::now();
    match sys::call::monotonic_now_ns() {
        Some(t) if ns != 0 => {
            now.checked_sub(Duration::from_nanos(t.saturating_sub(ns))).unwrap_or(now)
        }
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    fn read_all(fd: &OwnedFd) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match nix::unistd::read(fd.as_fd(), &mut buf) {
                Ok(0) => return (out, true),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EAGAIN) => return (out, false),
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    #[test]
    fn args_that_fit_are_in_the_pipe_and_closed_behind_before_any_child() {
        let (r, w) = pipe("t", Ours::Write).unwrap();
        nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        let args = br#"{"a":1}"#;
        assert!(prefill_stdin(w, args).is_none(), "the write end is kept");
        // The reader finds the args and then EOF, with no writer left.
        assert_eq!(read_all(&r), (args.to_vec(), true));
    }

    #[test]
    fn args_larger_than_the_pipe_leave_the_rest_to_the_supervisor() {
        let (r, w) = pipe("t", Ours::Write).unwrap();
        nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        let args: Vec<u8> = (0..300 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
        let (w, done) = prefill_stdin(w, &args).expect("the write end is kept");
        assert!(done > 0 && done < args.len(), "{done}");
        let (got, eof) = read_all(&r);
        assert_eq!((got.as_slice(), eof), (&args[..done], false));
        drop(w);
        assert_eq!(read_all(&r), (Vec::new(), true));
    }
}
