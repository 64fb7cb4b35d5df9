//! The run engine: one validated, sandboxed, supervised run per request,
//! ending in a [`RunReport`]. Used by `ongrid-executor run` and, next, by
//! the daemon.

use std::ffi::OsString;
use std::future::Future;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use policy::limits::KILL_GRACE;
use policy::{Denial, DenialKind, Enforcement, LimitKind, Outcome, RunReport, MAX_DENIALS};
use tokio::sync::Semaphore;

use crate::config::Config;
use crate::host::instance::{Instance, InstanceError, PgidRecord};
use crate::run::denials::{Denials, Watch};
use crate::run::janitor::{Janitor, SlotCounts, Wake};
use crate::run::parsed::ParsedManifests;
use crate::run::plan::{Located, Plan};
use crate::run::reaper::Reaper;
use crate::run::spawn::{self, Host, Spawners};
use crate::run::spin::{spin_for, Active, EXEC_SPIN};
use crate::run::supervise::{self, Bounds, ExitSpin, Leftovers, Stop, Supervised};
use crate::run::warm::{Maker, Refill, Warm, WarmPools, WarmStats};
use crate::sandbox::cgroup::RunCgroup;
use crate::sys;

/// Longest excerpt of an invalid stdout quoted in the error.
const EXCERPT_BYTES: usize = 256;

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
            Some(warm) => self.launch_warm(warm, start, held).await,
            None => self.launch_cold(&plan, background, start, held, started).await,
        };
        let mut run = match launched {
            Ok(run) => run,
            Err(report) => return *report,
        };
        if run.warm {
            run.setup_us = u64::try_from(started.elapsed().saturating_sub(*held).as_micros())
                .unwrap_or(u64::MAX);
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
        // Step 2: prepare everything in the parent, in a fresh slot (run
        // directory and cgroup leaves) made ahead of time when one is ready.
        let l = &plan.granted.limits;
        let owner = plan.run_as.switch.then_some((plan.run_as.uid, plan.run_as.gid));
        let bounds = (l.memory_bytes, l.max_pids);
        // The pool's refill is asked for once the child has its spec.
        let taken = self.janitor.take(background, &self.config, &self.host, bounds, owner);
        let (mut prep, refill) = match taken.and_then(|(slot, refill)| {
            spawn::prepare(&self.config, &self.host, plan, slot).map(|p| (p, refill))
        }) {
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
        Ok(Launched { prep, child, pgid, setup_us, warm: false, watch })
    }

    /// A warm run taken for this request: a held run's `start` awaited
    /// (a run not started is killed unused, never given args).
    async fn launch_warm(
        &self,
        warm: Warm,
        start: impl Future<Output = bool>,
        held: &mut Duration,
    ) -> Result<Launched, Box<RunReport>> {
        let waiting = Instant::now();
        let go = start.await;
        *held = waiting.elapsed();
        if !go {
            let skill = warm.plan.manifest.name().to_string();
            let report = not_started(skill, &warm.prep);
            self.warm.discard(warm, "its held run was not started");
            return Err(report);
        }
        // Watched since it was made, as a cold run is from its spawn.
        let Warm { prep, child, pgid, watch, .. } = warm;
        Ok(Launched { prep, child, pgid, setup_us: 0, warm: true, watch })
    }

    /// Steps 6 to 8: supervise the launched run with `plan`'s bounds (its
    /// args written to stdin, its deadline from now), kill its tree, hand
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
        let Launched { mut prep, child, pgid: _pgid, setup_us, warm, watch } = run;
        let limits = &plan.granted.limits;
        let bounds = Bounds {
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

    /// Warm pools' counts by skill (`run::warm`).
    pub fn warm_stats(&self) -> Vec<(String, WarmStats)> {
        self.warm.stats()
    }

    /// Runs the warm pools' thread on the calling thread until
    /// [`Engine::stop_warm`]: it makes the granted skills' warm runs, each
    /// holding a permit of `slots` (the server's run slots) while idle, and
    /// discards the spoiled, stale and expired ones. Returns at once when
    /// no skill is granted warm runs. Call it from a thread that lives as
    /// long as the runs it makes (a run created without a spawner thread
    /// has its parent-death signal tied to it).
    pub fn serve_warm(&self, slots: &Arc<Semaphore>) {
        self.warm.serve(self, slots);
    }

    /// Stops [`Engine::serve_warm`], which kills every idle warm run.
    pub fn stop_warm(&self) {
        self.warm.stop();
    }

    /// Discards every idle warm run, and one being made now (`warm_discard`,
    /// sent by skilld's reload): the pools are made again from the skill
    /// files as they are now. Returns how many idle runs were discarded.
    pub fn discard_warm(&self) -> u64 {
        self.warm.discard_all()
    }

    /// Kills one idle warm run to free its run slot; false when none is
    /// idle.
    pub fn evict_warm(&self) -> bool {
        self.warm.evict()
    }

    /// Kills a warm run never used (its tree, then its reaping), and hands
    /// its slot back to the janitor.
    fn kill_warm(&self, warm: Warm) {
        self.warm.wake_to_die(&warm);
        let Warm { mut prep, child, pgid, .. } = warm;
        let _ = sys::process::pidfd_signal(child.pidfd.as_fd(), libc::SIGKILL);
        if let Some(cg) = prep.cgroup.as_mut() {
            cg.kill();
            settle(cg);
        }
        let until = Instant::now() + Duration::from_secs(2);
        while self.reaper.collect(child.pid).is_none() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop((child, pgid));
        self.reaper.reap_orphans();
        prep.end_egress();
        self.janitor.discard(prep.cgroup.take(), &mut prep.run_dir, true);
    }
}

impl Maker for Engine {
    fn make(&self, path: &std::path::Path, tool: Option<&str>) -> Result<Warm, String> {
        let at = self.parsed.locate(&self.config.roots, path, tool).map_err(|e| e.to_string())?;
        let args = b"{}".to_vec();
        let plan = Plan::build_located(&self.config, at, tool, args, &self.env)
            .map_err(|e| e.to_string())?;
        let l = &plan.granted.limits;
        let owner = plan.run_as.switch.then_some((plan.run_as.uid, plan.run_as.gid));
        let bounds = (l.memory_bytes, l.max_pids);
        let (slot, refill) = self
            .janitor
            .take(true, &self.config, &self.host, bounds, owner)
            .map_err(|e| e.to_string())?;
        let mut prep =
            spawn::prepare(&self.config, &self.host, &plan, slot).map_err(|e| e.to_string())?;
        // Its refusals are watched from its spawn, as a cold run's: the
        // report of the request that takes it lists those of its start-up
        // too, as a cold run's report would.
        prep.report.denials_off = self.denials.off().map(str::to_owned);
        let leaves = prep.cgroup.as_ref().map(RunCgroup::leaves).unwrap_or_default();
        let watch = self.denials.watch(leaves);
        prep.log_denials = watch.is_some();
        let idle = self.warm.starts_idle(&prep);
        let child = match spawn::spawn_waiting(&mut prep, &plan.entry, &self.spawners, idle, || {
            drop(refill);
        }) {
            Ok(child) => child,
            Err(e) => {
                prep.end_egress();
                self.janitor.discard(prep.cgroup.take(), &mut prep.run_dir, true);
                return Err(e.to_string());
            }
        };
        self.reaper.track(child.pid);
        if let Some(w) = &watch {
            w.pid(child.pid);
        }
        let pgid = prep.cgroup.is_none().then(|| self.instance.record_pgid(child.pid)).flatten();
        Ok(Warm::new(plan, tool.map(str::to_owned), prep, (child, pgid), watch))
    }

    fn kill(&self, warm: Warm) {
        self.kill_warm(warm);
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A skill folder (0755) holding `skill.json` (`name`, `timeout`) and
    /// an executable `run.sh` of `script`; returns it and the manifest.
    fn skill(name: &str, timeout: u32, script: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let manifest = dir.path().join("skill.json");
        std::fs::write(
            &manifest,
            format!(
                r#"{{"name":"{name}","description":"t","entry":"run.sh","timeout_seconds":{timeout}}}"#
            ),
        )
        .unwrap();
        let entry = dir.path().join("run.sh");
        std::fs::write(&entry, script).unwrap();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, manifest)
    }

    /// An engine with its own runtime directory and a skill `name` that
    /// runs `cat`; `None` (after a visible SKIP) when root lacks the
    /// run-as user.
    fn cat_engine(name: &str) -> Option<(tempfile::TempDir, tempfile::TempDir, PathBuf, Engine)> {
        let root = nix::unistd::geteuid().is_root();
        if root
            && nix::unistd::User::from_name(crate::config::DEFAULT_RUN_AS).ok().flatten().is_none()
        {
            eprintln!("SKIP: run-as user missing (scripts/test creates it)");
            return None;
        }
        let runtime = tempfile::tempdir().unwrap();
        let (skill, manifest) = skill(name, 5, "#!/bin/sh\nexec cat\n");
        let config = Config { runtime_dir: Some(runtime.path().to_owned()), ..Config::default() };
        let engine = Engine::new(config).unwrap();
        Some((runtime, skill, manifest, engine))
    }

    /// A new engine (runtime directory `dir`) and a runtime on the calling
    /// thread, as a function running one manifest with `{}`. The engine
    /// starts its spawner threads at its first run, from this thread, so
    /// they (and their children) take this thread's policy and CPUs.
    fn engine_on_this_thread(dir: PathBuf) -> impl Fn(PathBuf) -> RunReport {
        let engine = Engine::new(Config { runtime_dir: Some(dir), ..Config::default() }).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        move |manifest| {
            let (report, _, _) = rt.block_on(engine.run_source_then(
                ManifestSource::Path(manifest),
                b"{}".to_vec(),
                None,
                &mut |_| {},
                std::future::ready(true),
                std::future::pending(),
            ));
            report
        }
    }

    /// `setup_us` ends when the child calls `execve`, not when the run's
    /// thread gets to run after it. Made to happen every time: the run's
    /// thread and the skill share one CPU, and the skill (a child of a
    /// spawner thread, which carries `SCHED_FIFO` here) keeps it busy for a
    /// while after its exec, so the run's thread (`SCHED_OTHER`) runs only
    /// when the skill is done. Root only (`SCHED_FIFO`).
    #[test]
    fn setup_ends_at_the_childs_exec_however_late_the_run_gets_a_cpu() {
        // For the run-as user's SKIP; this engine is not used.
        let Some((runtime, _cat, cat, _)) = cat_engine("late") else { return };
        let busy = "#!/bin/sh\ni=0\nwhile [ $i -lt 400000 ]; do i=$((i+1)); done\necho '{}'\n";
        let (_busy, manifest) = skill("late", 10, busy);
        let runtime_dir = runtime.path().to_owned();
        let report = std::thread::spawn(move || {
            crate::sys::process::pin_thread_to_first_cpu();
            if crate::sys::process::set_thread_policy(libc::SCHED_FIFO, 10).is_err() {
                return None;
            }
            let run = engine_on_this_thread(runtime_dir);
            // The first run starts the spawner threads, which (and so the
            // children) inherit the policy and the CPU; the run's thread
            // then goes back to the default.
            assert_eq!(run(cat).outcome, Outcome::Ok);
            crate::sys::process::set_thread_policy(libc::SCHED_OTHER, 0).expect("SCHED_OTHER");
            Some(run(manifest))
        })
        .join()
        .unwrap();
        let Some(report) = report else {
            println!("SKIP: SCHED_FIFO refused (it needs root)");
            return;
        };
        assert_eq!(report.outcome, Outcome::Ok, "{report:?}");
        assert!(report.duration_ms >= 300, "the CPU was not held after the exec: {report:?}");
        assert!(
            report.setup_us < 150_000,
            "setup counted time after the exec: {} us of {} ms",
            report.setup_us,
            report.duration_ms
        );
    }

    /// A skill never runs with the executor's real-time policy or
    /// negative nice value, which children inherit, and cannot take them
    /// back: from inside the sandbox it reads its own policy, nice value
    /// and limits, with an executor in `SCHED_FIFO` at nice -5 whose
    /// limits allow both. Root only.
    #[test]
    fn a_skill_gets_neither_the_executors_real_time_policy_nor_its_priority() {
        let Some((runtime, _cat, cat, _)) = cat_engine("sched") else { return };
        let probe = "#!/bin/sh\nread -r stat < /proc/self/stat\nset -- $stat\n\
                     rt=$(grep 'Max realtime priority' /proc/self/limits | tr -s ' ' | cut -d' ' -f4)\n\
                     ni=$(grep 'Max nice priority' /proc/self/limits | tr -s ' ' | cut -d' ' -f4)\n\
                     echo \"{\\\"nice\\\":${19},\\\"policy\\\":${41},\\\"rtprio\\\":$rt,\\\"nicelim\\\":$ni}\"\n";
        let (_probe, manifest) = skill("sched", 10, probe);
        let runtime_dir = runtime.path().to_owned();
        let report = std::thread::spawn(move || {
            if crate::sys::process::set_thread_policy(libc::SCHED_FIFO, 10).is_err()
                || crate::sys::process::set_thread_nice(-5).is_err()
            {
                return None;
            }
            // Limits that would let it take them back (per process: nothing
            // else here depends on them), where raising them is allowed.
            use nix::sys::resource::{setrlimit, Resource};
            let raised = setrlimit(Resource::RLIMIT_RTPRIO, 10, 10).is_ok()
                && setrlimit(Resource::RLIMIT_NICE, 25, 25).is_ok();
            let run = engine_on_this_thread(runtime_dir);
            // The spawner threads start with the first run, in this policy.
            assert_eq!(run(cat).outcome, Outcome::Ok);
            Some((run(manifest), raised))
        })
        .join()
        .unwrap();
        let Some((report, raised)) = report else {
            println!("SKIP: SCHED_FIFO or nice -5 refused (it needs root)");
            return;
        };
        assert_eq!(report.outcome, Outcome::Ok, "{report:?}");
        let seen = report.result.as_ref().expect("the probe's JSON").to_value();
        assert_eq!(seen["policy"], 0, "SCHED_OTHER: {seen}");
        assert_eq!(seen["nice"], 0, "{seen}");
        assert_eq!((&seen["rtprio"], &seen["nicelim"]), (&0.into(), &0.into()), "{seen}");
        if !raised {
            println!(
                "SKIP (part): RLIMIT_RTPRIO and RLIMIT_NICE could not be raised here (no \
                 CAP_SYS_RESOURCE), so the skill's limits of 0 are the executor's own"
            );
        }
    }

    /// A finished run's pipes and pidfd stay open until its `AfterReport`
    /// is dropped (after the report is written), and close then.
    #[test]
    fn a_runs_pipes_and_pidfd_close_when_its_after_report_is_dropped() {
        let Some((_runtime, _skill, manifest, engine)) = cat_engine("after") else { return };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let link = |fd: i32| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
        let open_links = || -> Vec<PathBuf> {
            let fds = std::fs::read_dir("/proc/self/fd").unwrap();
            fds.filter_map(|e| std::fs::read_link(e.unwrap().path()).ok()).collect()
        };
        for _ in 0..2 {
            let (report, _, after) = rt.block_on(engine.run_source_then(
                ManifestSource::Path(manifest.clone()),
                br#"{"a":1}"#.to_vec(),
                None,
                &mut |_| {},
                std::future::ready(true),
                std::future::pending(),
            ));
            assert_eq!(report.outcome, Outcome::Ok, "{report:?}");
            let held = after.leftovers.as_ref().expect("leftovers").fds();
            assert_eq!(held.len(), 3, "stdout, stderr and the pidfd: {held:?}");
            let pipes: Vec<PathBuf> = held
                .iter()
                .filter_map(|fd| link(*fd))
                .filter(|l| l.to_string_lossy().starts_with("pipe:"))
                .collect();
            assert_eq!(pipes.len(), 2, "both pipes open until the drop: {pipes:?}");
            drop(after);
            let still: Vec<PathBuf> =
                open_links().into_iter().filter(|l| pipes.contains(l)).collect();
            assert!(still.is_empty(), "closed with the drop: {still:?}");
        }
    }

    /// Runs made from the janitor's ready slots work, and dropping the
    /// engine removes every run directory and cgroup leaf it made.
    #[test]
    fn pooled_slots_serve_runs_and_nothing_outlives_the_engine() {
        let Some((runtime, _skill, manifest, engine)) = cat_engine("pool") else { return };
        let leaves = engine.host().cgroups.clone();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let runs = engine.host().runs_dir.clone();
        assert!(runs.starts_with(runtime.path().join("runs")), "{}", runs.display());
        let mut seen = BTreeSet::new();
        let mut leaves_seen = BTreeSet::new();
        for i in 0..12 {
            let args = format!(r#"{{"i":{i}}}"#).into_bytes();
            let req = RunRequest { manifest_path: manifest.clone(), args };
            let r = rt.block_on(engine.run(req, &mut |_| {}, std::future::pending()));
            assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
            assert_eq!(r.result.map(|v| v.to_value()), Some(serde_json::json!({ "i": i })));
            for e in std::fs::read_dir(&runs).unwrap() {
                seen.insert(e.unwrap().file_name());
            }
            if let Some(base) = &leaves.v2 {
                for e in std::fs::read_dir(base).unwrap() {
                    let e = e.unwrap();
                    if e.file_type().unwrap().is_dir() {
                        leaves_seen.insert(e.file_name());
                    }
                }
            }
            // The janitor catches up between runs (its pool back at depth)
            // however busy the host.
            let ready = || std::fs::read_dir(&runs).unwrap().count() - 1;
            let until = std::time::Instant::now() + Duration::from_secs(5);
            std::thread::sleep(Duration::from_millis(20));
            while ready() < crate::run::janitor::POOL_DEPTH && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        seen.remove(std::ffi::OsStr::new(crate::host::sweep::GUARD));
        assert!(seen.len() > 1, "{seen:?}");
        // Runs named by path share one parse of their unchanged manifest.
        assert_eq!(engine.parsed.len(), 1);
        // A reused slot's ruleset serves the next run of this policy there.
        let (built, reused) = engine.landlock_rulesets();
        if crate::sys::landlock::abi() > 0 {
            assert_eq!(built + reused, 12, "built {built}, reused {reused}");
            if leaves.v2.is_some() {
                assert!(reused > 0, "no ruleset reused in 12 runs (built {built})");
            }
        } else {
            println!("SKIP: no Landlock here: no ruleset to reuse");
        }
        // Finished runs' leaves serve again (fresh ones would be 12 + the
        // pool).
        if leaves.v2.is_some() {
            assert!(leaves_seen.len() < 12, "{} leaves for 12 runs", leaves_seen.len());
        }
        // Ready slots carry their run's pipes, made off the runs' path.
        let (ready, with_pipes) = engine.janitor.ready_with_pipes();
        assert!(ready > 0 && with_pipes == ready, "{with_pipes} of {ready} ready slots have pipes");
        // Idle, the pool goes back to its depth.
        std::thread::sleep(crate::run::janitor::TRIM_AFTER);
        let idle = || std::fs::read_dir(&runs).unwrap().count() - 1;
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while idle() > crate::run::janitor::POOL_DEPTH && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(idle() <= crate::run::janitor::POOL_DEPTH, "{} ready slots when idle", idle());
        drop(engine);
        assert!(!runs.exists(), "instance directory left: {}", runs.display());
        let left: Vec<_> = std::fs::read_dir(runtime.path().join("runs")).unwrap().collect();
        assert!(left.is_empty(), "run directories left: {left:?}");
        for base in [&leaves.v2, &leaves.v1_pids, &leaves.v1_memory].into_iter().flatten() {
            assert!(!base.exists(), "instance cgroup {} left", base.display());
        }
    }

    /// An engine of its own (as root, with the run-as user) and one skill,
    /// run one request at a time with a pause after each for the janitor
    /// to recycle the run's leaves into the pool: the next run gets them.
    struct Recycling {
        engine: Engine,
        rt: tokio::runtime::Runtime,
        manifest: PathBuf,
        _skill: tempfile::TempDir,
        _runtime: tempfile::TempDir,
    }

    impl Recycling {
        /// `None` after a visible SKIP naming `test` when not root or
        /// without the run-as user.
        fn new(
            test: &str,
            name: &str,
            script: &str,
            tune: impl FnOnce(&mut Config),
        ) -> Option<Self> {
            if !nix::unistd::geteuid().is_root() {
                eprintln!("SKIP: {test} needs root (cgroups)");
                return None;
            }
            let user = nix::unistd::User::from_name(crate::config::DEFAULT_RUN_AS);
            if user.ok().flatten().is_none() {
                eprintln!("SKIP: run-as user missing (scripts/test creates it)");
                return None;
            }
            let runtime = tempfile::tempdir().unwrap();
            let (skill, manifest) = skill(name, 10, script);
            let mut config =
                Config { runtime_dir: Some(runtime.path().to_owned()), ..Config::default() };
            tune(&mut config);
            Some(Recycling {
                engine: Engine::new(config).unwrap(),
                rt: tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap(),
                manifest,
                _skill: skill,
                _runtime: runtime,
            })
        }

        fn run(&self, args: &str) -> RunReport {
            let req = RunRequest { manifest_path: self.manifest.clone(), args: args.into() };
            let r = self.rt.block_on(self.engine.run(req, &mut |_| {}, std::future::pending()));
            // Time for the janitor to recycle the leaves into the pool.
            std::thread::sleep(Duration::from_millis(30));
            r
        }
    }

    /// Leaves seen empty at one run's end are read afresh for the next run
    /// they serve: the background process of a run on recycled leaves is
    /// killed when its main process exits, as on new leaves.
    #[test]
    fn recycled_leaves_still_kill_what_a_run_leaves_behind() {
        let test = "recycled_leaves_still_kill_what_a_run_leaves_behind";
        let script = concat!(
            "#!/bin/sh\n",
            "args=$(cat)\n",
            "case $args in\n",
            "*bg*) sleep 30 </dev/null >/dev/null 2>&1 & echo \"{\\\"pid\\\":$!}\" ;;\n",
            "*) echo '{}' ;;\n",
            "esac\n",
        );
        let Some(t) = Recycling::new(test, "bg", script, |_| {}) else { return };
        if t.engine.host().cgroups.v2.is_none() {
            eprintln!("SKIP: {test}: no cgroup v2");
            return;
        }
        let run = |args: &str| t.run(args);
        for i in 0..6 {
            let r = run(&format!(r#"{{"i":{i}}}"#));
            assert_eq!(r.exit_code, Some(0), "run {i}: {r:?}");
        }
        for round in 0..3 {
            let r = run(r#"{"bg":true}"#);
            assert_eq!(r.exit_code, Some(0), "{r:?}");
            let pid = r.result.as_ref().and_then(|v| v.to_value()["pid"].as_i64());
            let pid = i32::try_from(pid.expect("the pid")).unwrap();
            let gone = (0..200).any(|_| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
                let alive = stat.is_ok_and(|s| {
                    s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
                });
                if alive {
                    std::thread::sleep(Duration::from_millis(10));
                }
                !alive
            });
            assert!(gone, "round {round}: the background sleep {pid} outlived its run");
        }
        let counts = t.engine.run_slots();
        assert!(counts.ready >= 6, "the runs took recycled slots: {counts:?}");
    }

    /// The OOM verdict is this run's own on reused leaves: a run that blows
    /// its memory bound is reported so, and the runs after it, which get
    /// its recycled leaves (their files kept open and read again), are not.
    #[test]
    fn reused_leaves_report_only_their_own_oom() {
        let test = "reused_leaves_report_only_their_own_oom";
        // {"hog":true}: hold 96 MB in the shell (a command substitution)
        // under a 32 MiB bound; otherwise echo the args and exit 3 (an OOM
        // kill is the verdict only for a run that did not exit 0).
        let script = concat!(
            "#!/bin/sh\n",
            "args=$(cat)\n",
            "case $args in\n",
            "*hog*) x=$(head -c 96000000 /dev/zero | tr '\\0' a); echo '{}' ;;\n",
            "*) printf '%s' \"$args\"; exit 3 ;;\n",
            "esac\n",
        );
        let tune = |c: &mut Config| c.limits.memory_bytes = 32 << 20;
        let Some(t) = Recycling::new(test, "oom", script, tune) else { return };
        let c = &t.engine.host().cgroups;
        if c.v1_memory.is_none() && !c.v2_limits {
            eprintln!("SKIP: {test}: no memory cgroup here");
            return;
        }
        let run = |args: &str| t.run(args);
        for round in 0..2 {
            for i in 0..5 {
                let r = run(&format!(r#"{{"i":{i}}}"#));
                assert_eq!((r.exit_code, r.limit), (Some(3), None), "round {round} run {i}: {r:?}");
            }
            let r = run(r#"{"hog":true}"#);
            assert_eq!(r.limit, Some(policy::LimitKind::Memory), "round {round} hog: {r:?}");
        }
        let r = run(r#"{"i":9}"#);
        assert_eq!((r.exit_code, r.limit), (Some(3), None), "{r:?}");
    }
}
