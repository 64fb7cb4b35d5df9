//! The run engine: one validated, sandboxed, supervised run per request,
//! ending in a [`RunReport`]. Used by `ongrid-executor run` and, next, by
//! the daemon.

use std::ffi::OsString;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use policy::limits::KILL_GRACE;
use policy::{Denial, DenialKind, Enforcement, Outcome, RunReport, MAX_DENIALS};

use crate::config::Config;
use crate::host::instance::{Instance, InstanceError, PgidRecord};
use crate::run::classify::classify;
use crate::run::denials::{Denials, Watch};
use crate::run::egress;
use crate::run::janitor::{Janitor, SlotCounts, Wake};
use crate::run::parsed::ParsedManifests;
use crate::run::plan::{Located, Plan};
use crate::run::reaper::Reaper;
use crate::run::spawn::{self, Host, Spawners};
use crate::run::spin::{spin_for, Active, EXEC_SPIN};
use crate::run::supervise::{self, Bounds, ExitSpin, Leftovers};
use crate::run::warm::{Refill, Warm, WarmPools};
use crate::sandbox::cgroup::RunCgroup;
use crate::sys;

/// One run request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRequest {
    /// The skill's `skill.json`.
    pub manifest_path: PathBuf,
    /// The args JSON, passed to stdin verbatim.
    pub args: Vec<u8>,
}

/// The manifest of a run: a path to resolve, or a file already opened and
/// placed under one of the engine's roots ([`Located::open`] with
/// `config().roots`), whose plan reads that file, not the path again.
#[derive(Debug)]
pub enum ManifestSource {
    /// A path, resolved by the run's plan.
    Path(PathBuf),
    /// A manifest the caller already opened and placed.
    Located(Located),
}

impl ManifestSource {
    fn path(&self) -> &std::path::Path {
        match self {
            ManifestSource::Path(p) => p,
            ManifestSource::Located(at) => at.path(),
        }
    }
}

/// The engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// `PR_SET_CHILD_SUBREAPER` failed.
    #[error("cannot become the reaper of skill processes")]
    Subreaper(#[source] std::io::Error),
    /// The instance (runtime directory, cgroup parents) could not be set up.
    #[error(transparent)]
    Instance(#[from] InstanceError),
}

/// Runs skills under the configured sandbox.
///
/// The engine makes its process a child subreaper (orphans of skills are
/// reaped here). It reads the process's environment once, when it is made:
/// a run's allowed variables (`env_allow`) come from that copy. Children
/// are created by the engine's spawner threads
/// ([`spawn::Spawners`]), which live as long as the engine; a child's
/// parent-death signal is tied to its creating thread. Without them
/// ([`Spawners::inline`], or when they cannot start) a child is created
/// from the thread that polls [`Engine::run`], so poll runs from threads
/// that live as long as the runs (a current-thread runtime, or the worker
/// threads of a multi-thread runtime, never `spawn_blocking`).
#[derive(Debug)]
pub struct Engine {
    config: Config,
    host: Host,
    reaper: &'static Reaper,
    /// Warm runs of the skills granted them (`serve` only); dropped
    /// (their cgroups killed) before the janitor and the spawner threads.
    warm: WarmPools,
    janitor: Janitor,
    /// Creates the children (dropped after the runs, before the instance).
    spawners: Spawners,
    runs: AtomicU64,
    /// Runs between their plan and their report now.
    active: AtomicUsize,
    /// [`EXEC_SPIN`] with more than one CPU, else zero (the child needs
    /// the only one).
    exec_spin: Duration,
    /// Landlock rulesets built, and taken from a slot's cache.
    rulesets: [AtomicU64; 2],
    /// Manifests of runs named by path, parsed once per file content.
    parsed: ParsedManifests,
    /// This process's environment, read once: the source of every run's
    /// allowed variables (`env_allow`).
    env: Vec<(OsString, OsString)>,
    /// The runs' refusals read back from the kernel's audit.
    denials: Denials,
    /// Dropped after the janitor (its slots are removed first).
    instance: Instance,
}

impl Engine {
    /// Builds an engine from a validated configuration, probing the host
    /// (Landlock ABI, cgroup hierarchies) once, and starts its instance
    /// ([`crate::host::instance`]): sweeps what dead executors left in the
    /// runtime directory, mounts the runs tmpfs when needed, starts the
    /// watchdog that takes the runs with it if this process dies.
    ///
    /// # Errors
    ///
    /// [`EngineError`].
    pub fn new(config: Config) -> Result<Self, EngineError> {
        // The bands first, while the table is short (host::fdtable).
        let _ = crate::host::fdtable::bands();
        Self::with_spawners(config, Spawners::default())
    }

    /// [`Engine::new`] with the spawner threads given (see
    /// [`Spawners::inline`]).
    ///
    /// # Errors
    ///
    /// As [`Engine::new`].
    pub fn with_spawners(config: Config, mut spawners: Spawners) -> Result<Self, EngineError> {
        let _ = crate::host::fdtable::bands();
        sys::process::set_child_subreaper().map_err(EngineError::Subreaper)?;
        let mut host = Host::detect();
        let instance = Instance::start(&config, &host.cgroups)?;
        host.cgroups = instance.cgroups().clone();
        host.runs_dir = instance.dir().to_owned();
        host.notes.extend(instance.notes().iter().cloned());
        // After the runs tmpfs: the runs' mount namespace is a copy of this
        // one, and on a host without shared mounts it sees none made later.
        host.proc = crate::host::procview::set_up(may_mount());
        spawners.runs_namespace(host.proc.namespace().cloned());
        let denials = Denials::start(config.report_denials, host.landlock_abi);
        spawners.log_denials(denials.off().is_none());
        Ok(Engine {
            denials,
            parsed: ParsedManifests::new(&config),
            warm: WarmPools::new(&config, may_renice().then(sys::process::cold_run_policy)),
            env: std::env::vars_os().collect(),
            config,
            host,
            reaper: Reaper::global(),
            janitor: Janitor::default(),
            spawners,
            runs: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            exec_spin: if std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)
                && !sys::process::real_time()
            {
                EXEC_SPIN
            } else {
                Duration::ZERO
            },
            rulesets: [AtomicU64::new(0), AtomicU64::new(0)],
            instance,
        })
    }

    /// Landlock rulesets so far: `(built, reused)`, the latter taken from
    /// a slot's cache (`landlock::Cache`) instead of built.
    pub fn landlock_rulesets(&self) -> (u64, u64) {
        (self.rulesets[0].load(Ordering::Relaxed), self.rulesets[1].load(Ordering::Relaxed))
    }

    /// How runs got their slots so far: ready from the pool, recycled or
    /// made on the run's path ([`SlotCounts`]).
    pub fn run_slots(&self) -> SlotCounts {
        self.janitor.counts()
    }

    /// Why the runs' refusals are not reported (`None`: they are), and
    /// the records lost to a full socket and come after their run's
    /// report so far.
    pub fn denials(&self) -> (Option<&str>, (u64, u64)) {
        (self.denials.off(), self.denials.lost_and_late())
    }

    /// The instance this engine runs as.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Host facts found at start-up.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// What an MCP server's start needs of the engine: its spawner
    /// threads, its copy of the environment and the process's reaper.
    pub(crate) fn server_parts(&self) -> (&Spawners, &[(OsString, OsString)], &'static Reaper) {
        (&self.spawners, &self.env, self.reaper)
    }

    /// Runs one skill to its end. Each stderr line goes to `stderr_sink` as
    /// it arrives; `cancel` completing (client gone) kills the run's tree.
    /// Never fails: every problem is a report outcome.
    pub async fn run(
        &self,
        req: RunRequest,
        stderr_sink: &mut (dyn FnMut(&str) + Send),
        cancel: impl Future<Output = ()>,
    ) -> RunReport {
        self.run_tool(req, None, stderr_sink, cancel).await
    }

    /// [`Engine::run`] for one `tool` of a `SKILL.md` manifest (`None`:
    /// a `skill.json`).
    pub async fn run_tool(
        &self,
        req: RunRequest,
        tool: Option<&str>,
        stderr_sink: &mut (dyn FnMut(&str) + Send),
        cancel: impl Future<Output = ()>,
    ) -> RunReport {
        let (report, _) =
            self.run_held(req, tool, stderr_sink, std::future::ready(true), cancel).await;
        report
    }

    /// [`Engine::run_tool`] for a held run (the wire's `execute` with
    /// `hold`): everything is checked and prepared, then nothing is spawned
    /// before `start` resolves; `false` (the caller gave up) ends the run
    /// as `rejected`, never started. Also returns how long the run waited
    /// for `start`, which neither `setup_us` nor `duration_ms` counts.
    pub async fn run_held(
        &self,
        req: RunRequest,
        tool: Option<&str>,
        stderr_sink: &mut (dyn FnMut(&str) + Send),
        start: impl Future<Output = bool>,
        cancel: impl Future<Output = ()>,
    ) -> (RunReport, Duration) {
        let source = ManifestSource::Path(req.manifest_path);
        let (report, held, _wake) =
            self.run_source_then(source, req.args, tool, stderr_sink, start, cancel).await;
        (report, held)
    }

    /// [`Engine::run_held`] for a manifest given as a [`ManifestSource`]
    /// (the server's, opened once when it was checked), also returning
    /// what of the run is better done after its report is written, for the
    /// caller to drop then.
    pub(crate) async fn run_source_then(
        &self,
        source: ManifestSource,
        args: Vec<u8>,
        tool: Option<&str>,
        stderr_sink: &mut (dyn FnMut(&str) + Send),
        start: impl Future<Output = bool>,
        cancel: impl Future<Output = ()>,
    ) -> (RunReport, Duration, AfterReport) {
        let started = Instant::now();
        let mut held = Duration::ZERO;
        let mut after = AfterReport::default();
        let mut report = self
            .run_inner(
                source,
                args,
                tool,
                stderr_sink,
                start,
                &mut held,
                cancel,
                started,
                &mut after,
            )
            .await;
        let ran = started.elapsed().saturating_sub(held);
        report.duration_ms = u64::try_from(ran.as_millis()).unwrap_or(u64::MAX);
        (report, held, after)
    }

    /// Step 1: the run's plan, or the report of a run refused.
    fn plan(
        &self,
        source: ManifestSource,
        tool: Option<&str>,
        args: Vec<u8>,
    ) -> Result<Plan, Box<RunReport>> {
        let fallback_name = source
            .path()
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let env = &self.env;
        let planned = match source {
            ManifestSource::Path(path) => self
                .parsed
                .locate(&self.config.roots, &path, tool)
                .and_then(|at| Plan::build_located(&self.config, at, tool, args, env)),
            ManifestSource::Located(at) => Plan::build_located(&self.config, at, tool, args, env),
        };
        planned.map_err(|e| {
            let name = e.skill().map_or(fallback_name, str::to_owned);
            Box::new(RunReport::not_run(name, e.outcome(), e.to_string()))
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_inner(
        &self,
        source: ManifestSource,
        args: Vec<u8>,
        tool: Option<&str>,
        sink: &mut (dyn FnMut(&str) + Send),
        start: impl Future<Output = bool>,
        held: &mut Duration,
        cancel: impl Future<Output = ()>,
        started: Instant,
        after: &mut AfterReport,
    ) -> RunReport {
        // Step 1: validate against our own configuration.
        let plan = match self.plan(source, tool, args) {
            Ok(plan) => plan,
            Err(refused) => return *refused,
        };
        let skill = plan.manifest.name().to_string();
        let _active = Active::enter(&self.active);
        let background = self.runs.fetch_add(1, Ordering::Relaxed) > 0;
        // A warm run made from the same files, already boxed and waiting
        // for its args (`run::warm`), else steps 2 to 5 now.
        let taken = if self.warm.granted(&skill) {
            after.refill = Some(self.warm.refill_later());
            self.warm.take(&plan, tool)
        } else {
            None
        };
        let launched = match taken {
            Some(warm) => match self.launch_warm(warm, &plan.args, start, held).await {
                Ok(Some(run)) => Ok(run),
                // Spoiled while the run was held: a cold run, started now.
                Ok(None) => {
                    let (mut more, go) = (Duration::ZERO, std::future::ready(true));
                    // Its set-up counts from now: the hold is not set-up.
                    let since = started + *held;
                    let cold = self.launch_cold(&plan, background, go, &mut more, since).await;
                    *held += more;
                    cold
                }
                Err(report) => Err(report),
            },
            None => self.launch_cold(&plan, background, start, held, started).await,
        };
        let mut run = match launched {
            Ok(run) => run,
            Err(report) => return *report,
        };
        if run.warm {
            // As a cold run's ends at its exec: here, where its clock starts.
            let setup = run.start.saturating_duration_since(started).saturating_sub(*held);
            run.setup_us = u64::try_from(setup.as_micros()).unwrap_or(u64::MAX);
        }
        self.supervise_and_report(&plan, run, background, sink, cancel, after).await
    }

    /// Steps 2 to 5 of a cold run: a slot (directory and cgroup leaves,
    /// made ahead of time when one is ready), the sandbox prepared, a held
    /// run's `start` awaited, the child spawned.
    async fn launch_cold(
        &self,
        plan: &Plan,
        background: bool,
        start: impl Future<Output = bool>,
        held: &mut Duration,
        started: Instant,
    ) -> Result<Launched, Box<RunReport>> {
        let skill = plan.manifest.name().to_string();
        // The grant's names, looked up without holding this worker.
        let resolved = egress::resolve_grant(&plan.granted).await.map_err(|source| {
            let e = spawn::SpawnError::Egress { skill: skill.clone(), source };
            Box::new(RunReport::not_run(skill.clone(), e.outcome(), e.to_string()))
        })?;
        // Step 2: prepare everything in the parent, in a fresh slot (run
        // directory and cgroup leaves) made ahead of time when one is ready.
        let l = &plan.granted.limits;
        let owner = plan.run_as.switch.then_some((plan.run_as.uid, plan.run_as.gid));
        let bounds = (l.memory_bytes, l.max_pids);
        // The pool's refill is asked for once the child has its spec.
        let taken = self.janitor.take(background, &self.config, &self.host, bounds, owner);
        let prepared = taken.and_then(|(slot, refill)| {
            spawn::prepare(&self.config, &self.host, plan, &resolved, slot).map(|p| (p, refill))
        });
        let (mut prep, refill) = match prepared {
            Ok(p) => p,
            Err(e) => return Err(Box::new(RunReport::not_run(skill, e.outcome(), e.to_string()))),
        };
        if prep.report.landlock.status != Enforcement::None {
            self.rulesets[usize::from(prep.landlock_reused)].fetch_add(1, Ordering::Relaxed);
        }
        prep.report.denials_off = self.denials.off().map(str::to_owned);
        let leaves = prep.cgroup.as_ref().map(RunCgroup::leaves).unwrap_or_default();
        let watch = self.denials.watch(leaves);
        prep.log_denials = watch.is_some();
        // A held run waits here, prepared, for its caller's start.
        let waiting = Instant::now();
        let go = start.await;
        *held = waiting.elapsed();
        if !go {
            prep.end_egress();
            self.janitor.discard(prep.cgroup.take(), &mut prep.run_dir, background);
            return Err(not_started(skill, &prep));
        }
        // Steps 3-5: spawn (the child applies the sandbox and execs). The
        // only run in flight watches for its child's exec without sleeping
        // for a while ([`EXEC_SPIN`]); with others, its CPU is theirs.
        let spin = spin_for(self.active.load(Ordering::Relaxed), self.exec_spin);
        let spawned =
            spawn::spawn(&mut prep, &plan.entry, &plan.args, &self.spawners, spin, || drop(refill));
        let child = match spawned {
            Ok(c) => c,
            Err(e) => {
                prep.end_egress();
                let mut r = RunReport::not_run(skill, e.outcome(), e.to_string());
                r.sandbox = Some(prep.report.clone());
                return Err(Box::new(r));
            }
        };
        // Setup ends at the child's exec as the child timed it: the run's
        // thread may get a CPU only later (under the default scheduling
        // policy it can wait behind the skill it just started).
        let setup = child.exec_at.saturating_duration_since(started).saturating_sub(*held);
        let setup_us = u64::try_from(setup.as_micros()).unwrap_or(u64::MAX);
        if let Some(w) = &watch {
            w.pid(child.pid);
        }
        // Without a cgroup the watchdog kills the run's process group.
        let pgid = prep.cgroup.is_none().then(|| self.instance.record_pgid(child.pid)).flatten();
        Ok(Launched { prep, child, pgid, setup_us, warm: false, watch, start: Instant::now() })
    }

    /// A warm run taken for this request: a held run's `start` awaited
    /// (a run not started is killed unused, never given args), then the
    /// run checked again (`None`: it wrote, exited or expired while held,
    /// and was discarded), then `args` written into its stdin, as a cold
    /// run's are at its spawn (the supervisor writes what did not fit).
    async fn launch_warm(
        &self,
        warm: Warm,
        args: &[u8],
        start: impl Future<Output = bool>,
        held: &mut Duration,
    ) -> Result<Option<Launched>, Box<RunReport>> {
        let waiting = Instant::now();
        let go = start.await;
        *held = waiting.elapsed();
        if !go {
            let skill = warm.plan.manifest.name().to_string();
            let report = not_started(skill, &warm.prep);
            self.warm.discard(warm, "its held run was not started");
            return Err(report);
        }
        let Some(warm) = self.warm.use_taken(warm) else { return Ok(None) };
        // Its clock starts before it can read a byte of its args.
        let start = Instant::now();
        // Watched since it was made, as a cold run is from its spawn.
        let Warm { prep, mut child, pgid, watch, .. } = warm;
        child.stdin = child.stdin.take().and_then(|(fd, _)| spawn::prefill_stdin(fd, args));
        Ok(Some(Launched { prep, child, pgid, setup_us: 0, warm: true, watch, start }))
    }

    /// Steps 6 to 8: supervise the launched run with `plan`'s bounds (its
    /// args written to stdin, its deadline from its start), kill its tree, hand
    /// its slot to the janitor, report.
    async fn supervise_and_report(
        &self,
        plan: &Plan,
        run: Launched,
        background: bool,
        sink: &mut (dyn FnMut(&str) + Send),
        cancel: impl Future<Output = ()>,
        after: &mut AfterReport,
    ) -> RunReport {
        let Launched { mut prep, child, pgid: _pgid, setup_us, warm, watch, start } = run;
        let limits = &plan.granted.limits;
        let bounds = Bounds {
            start,
            timeout: plan.manifest.timeout(),
            grace: KILL_GRACE,
            stdout_bytes: limits.stdout_bytes,
            stderr_bytes: limits.stderr_bytes,
            stderr_line_bytes: limits.stderr_line_bytes,
            exit_spin: ExitSpin { budget: self.exec_spin, in_flight: Some(&self.active) },
        };
        // Steps 6-7: supervise; kill the whole tree on any end.
        let mut sup = supervise::supervise(
            child,
            &plan.args,
            prep.cgroup.as_ref(),
            self.reaper,
            bounds,
            sink,
            cancel,
        )
        .await;
        after.leftovers = sup.leftovers.take();
        let oom = prep.cgroup.as_mut().is_some_and(settle);
        self.reaper.reap_orphans();
        // Its processes are gone: nothing more can be refused.
        prep.end_egress();
        add_denials(&mut prep.report, watch.map(Watch::finish));
        // The run is over (its tree is gone): its cgroups and directory are
        // removed after the report, by the janitor, woken once the report
        // is out (when the caller drops `wake`).
        after.wake =
            Some(self.janitor.discard_later(prep.cgroup.take(), &mut prep.run_dir, background));
        // Step 8: report.
        let skill = plan.manifest.name().as_str();
        let cpu_limit_us = limits.cpu_seconds_for(bounds.timeout).saturating_mul(1_000_000);
        let mut report =
            classify(skill, sup, oom, bounds.timeout, cpu_limit_us, bounds.stdout_bytes);
        report.setup_us = setup_us;
        report.warm = warm;
        report.sandbox = Some(prep.report.clone());
        report
    }
}

/// A run launched (spawned, or taken warm), ready for supervision.
struct Launched {
    prep: spawn::Prepared,
    child: spawn::Child,
    pgid: Option<PgidRecord>,
    setup_us: u64,
    warm: bool,
    /// The run's refusals as the kernel's audit reports them, when watched.
    watch: Option<Watch>,
    /// When its clock started (its deadline is this plus its timeout).
    start: Instant,
}

/// Whether this executor may make and join the runs' mount namespace
/// (`host::procview`): root with `CAP_SYS_ADMIN` and `CAP_SYS_CHROOT`.
fn may_mount() -> bool {
    let has = |c| caps::has_cap(None, caps::CapSet::Effective, c).unwrap_or(false);
    crate::run::plan::euid() == 0
        && has(caps::Capability::CAP_SYS_ADMIN)
        && has(caps::Capability::CAP_SYS_CHROOT)
}

/// Whether this executor may set the run-as user's scheduling, which a
/// warm run made at `SCHED_IDLE` needs back when taken: root with
/// `CAP_SYS_NICE`.
fn may_renice() -> bool {
    crate::run::plan::euid() == 0
        && caps::has_cap(None, caps::CapSet::Effective, caps::Capability::CAP_SYS_NICE)
            .unwrap_or(false)
}

/// The report of a held run its caller never started.
fn not_started(skill: String, prep: &spawn::Prepared) -> Box<RunReport> {
    let why = "the held run was not started by its caller";
    let mut r = RunReport::not_run(skill, Outcome::Rejected, why);
    r.sandbox = Some(prep.report.clone());
    Box::new(r)
}

/// The report's `denials`: what the audit gave (`None` when not
/// watched), then the egress allowlist's refusals (always known).
fn add_denials(report: &mut policy::SandboxReport, audit: Option<(Vec<Denial>, u64)>) {
    let (mut listed, mut total) = audit.unwrap_or_default();
    for d in &report.network.denied {
        if listed.len() < MAX_DENIALS {
            listed.push(Denial {
                kind: DenialKind::Network,
                access: d.protocol.clone(),
                path: None,
                syscall: None,
                destination: Some(d.destination.clone()),
                count: d.count,
            });
        }
    }
    total += report.network.denied_total;
    report.denials = listed;
    report.denials_total = total;
}

/// Waits for the run's cgroup to empty (killing what is left after 2 s);
/// returns whether the kernel's OOM killer acted in it.
fn settle(cg: &mut RunCgroup) -> bool {
    if !cg.wait_empty(Duration::from_secs(2)) {
        cg.kill();
        cg.wait_empty(Duration::from_secs(1));
    }
    cg.oom_killed()
}

/// What of a finished run is left to do once its report is written
/// ([`Engine::run_source_then`]): dropping it closes the run's pipes and
/// pidfd, then wakes the janitor for its slot and, for a warm-granted
/// skill, the warm pools' thread for a refill. These cost tens of
/// microseconds (the refill far more) the report need not wait for.
#[derive(Debug, Default)]
pub(crate) struct AfterReport {
    leftovers: Option<Leftovers>,
    wake: Option<Wake>,
    /// A warm-granted skill's pool is made again after the report.
    refill: Option<Refill>,
}

mod warm_pools;

#[cfg(test)]
mod tests;
