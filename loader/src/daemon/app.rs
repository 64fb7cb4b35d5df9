//! [`App`]: the state every request shares: the registry, the executor
//! client, the run slots, the permission rules, the audit trail and the
//! metrics.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use policy::ValidateOptions;
use serde::Serialize;
use tokio::sync::{Mutex, Semaphore};

use crate::daemon::audit::Audit;
use crate::daemon::authz::Authz;
use crate::daemon::config::Settings;
use crate::daemon::executor_client::ExecutorClient;
use crate::daemon::metrics::Metrics;
use crate::daemon::registry::{Registry, Snapshot};
use crate::scan::event::Level;
use crate::scan::Scanner;

/// How long a reload waits for the executor's `ping` (its longest timeout).
const PONG_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest wait for the tools of one MCP server pack: its server may
/// have to start (Node.js or Python, then `initialize`).
const MCP_LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one `mcp_watch` waits at the executor for a tool list to move.
const MCP_WATCH_WAIT: Duration = Duration::from_secs(30);
/// The shortest time between two `mcp_watch` answered with nothing new.
const MCP_WATCH_MIN: Duration = Duration::from_secs(1);
/// The first wait before asking again after an `mcp_watch` failed.
const MCP_WATCH_RETRY: Duration = Duration::from_millis(500);
/// The longest wait before asking again after failures.
const MCP_WATCH_RETRY_MAX: Duration = Duration::from_secs(10);
/// Limits applied to client requests.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body in bytes (413 above).
    pub max_body_bytes: usize,
    /// How long a client may take to send its body (408 after).
    pub body_timeout: Duration,
    /// How long a run may wait for a slot (503 `busy` after).
    pub queue_timeout: Duration,
    /// The longest drain on SIGTERM.
    pub drain_timeout: Duration,
}

/// What a reload did (`POST /v1/reload` answers this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReloadSummary {
    /// Skills in the new registry.
    pub registered: usize,
    /// Manifests, files or roots skipped.
    pub skipped: usize,
}

/// The shared state of the daemon.
#[derive(Debug)]
pub struct App {
    roots: Vec<PathBuf>,
    /// The executor's longest run timeout, seconds, as its `ping` last said
    /// (policy's default until it does): manifests asking for more are
    /// clamped to it, so listings advertise what runs will get.
    max_timeout: AtomicU64,
    /// The longest timeout of any skill a run was asked of since start,
    /// milliseconds: what the drain waits for even after a reload
    /// shortened it.
    longest_allowed_ms: AtomicU64,
    registry: Registry,
    executor: ExecutorClient,
    metrics: Metrics,
    /// Caps runs forwarded to the executor; runs beyond wait, then `busy`.
    run_slots: Arc<Semaphore>,
    /// One scan at a time: a SIGHUP during a `POST /v1/reload` waits.
    reload_lock: Mutex<()>,
    /// The MCP server packs whose tools are being listed again
    /// ([`App::tools_generation_seen`]), with the last generation seen of
    /// each: one listing per pack at a time.
    relisting: std::sync::Mutex<std::collections::HashMap<PathBuf, u64>>,
    /// Tell the service manager about each rescan (see
    /// [`App::notify_reloads`]).
    notify_reloads: AtomicBool,
    limits: Limits,
    prometheus: prometheus::Registry,
    authz: Authz,
    audit: Audit,
    /// Cancelled when the daemon stops serving: long polls answer, and the
    /// watch of the MCP servers ends.
    stopping: tokio_util::sync::CancellationToken,
}

impl App {
    /// An app with an empty registry; call [`App::reload`] to scan, and
    /// [`App::preload_approvals`]. `prometheus` must be the registry
    /// `metrics` were registered in. Starts the audit thread.
    ///
    /// # Errors
    ///
    /// The audit thread could not be spawned.
    pub fn new(
        settings: &Settings,
        metrics: Metrics,
        prometheus: prometheus::Registry,
    ) -> std::io::Result<Self> {
        let audit = Audit::start(
            &settings.audit,
            metrics.audit_write_errors_total.clone(),
            &metrics.audit_syncs_total,
        )?
        .observe_waits(&metrics.audit_wait_seconds);
        Ok(Self {
            authz: Authz::new(settings),
            audit,
            roots: settings.skills_dirs.clone(),
            max_timeout: AtomicU64::new(ValidateOptions::default().max_timeout.as_secs()),
            registry: Registry::default(),
            executor: ExecutorClient::new(&settings.executor_socket),
            metrics,
            run_slots: Arc::new(Semaphore::new(settings.max_concurrent_runs)),
            reload_lock: Mutex::new(()),
            relisting: std::sync::Mutex::default(),
            notify_reloads: AtomicBool::new(false),
            limits: Limits {
                max_body_bytes: settings.max_body_bytes,
                body_timeout: settings.request_timeout,
                queue_timeout: settings.queue_timeout,
                drain_timeout: settings.drain_timeout,
            },
            longest_allowed_ms: AtomicU64::new(0),
            prometheus,
            stopping: tokio_util::sync::CancellationToken::new(),
        })
    }

    /// Loads the approvals already used (and not expired) from the audit
    /// database into the replay store, so that a restart does not re-open
    /// their window. If the database is unavailable now, its unique key
    /// still refuses a replay once it is back.
    pub async fn preload_approvals(&self) {
        match self.audit.used_approvals().await {
            Ok(used) => {
                let n = used.len();
                self.authz.replay().preload(used);
                tracing::debug!(approvals = n, "audit: used approvals loaded");
            }
            Err(e) => tracing::error!(error = %e, "audit: cannot load the used approvals"),
        }
    }

    /// The permission rules.
    pub fn authz(&self) -> &Authz {
        &self.authz
    }

    /// The audit trail.
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// From now on every [`App::reload`] tells the service manager
    /// (`NOTIFY_SOCKET`, `plumbing::notify`): `RELOADING=1` with
    /// `MONOTONIC_USEC=` before the scan, `READY=1` with the new `STATUS=`
    /// after it, whatever asked for it (SIGHUP, `POST /v1/reload`). The
    /// daemon turns it on once it has sent its first `READY=1`.
    pub fn notify_reloads(&self) {
        self.notify_reloads.store(true, Ordering::Relaxed);
    }

    /// Scans the roots and swaps the registry. Runs in flight keep the
    /// skill they started with; the executor's idle warm runs are
    /// discarded. Every scan event is logged at its level.
    /// The executor is asked first for its longest run timeout (`ping`),
    /// to which longer manifest timeouts are clamped (a `TimeoutClamped`
    /// event), so that listings say what runs get. Told to the service
    /// manager once [`App::notify_reloads`] was called.
    pub async fn reload(self: &Arc<Self>) -> ReloadSummary {
        let _one_at_a_time = self.reload_lock.lock().await;
        let notify = self.notify_reloads.load(Ordering::Relaxed);
        if notify {
            plumbing::notify::reloading();
        }
        let summary = self.rescan().await;
        if notify {
            plumbing::notify::ready(&self.status_line());
        }
        summary
    }

    /// The scan and the swap of [`App::reload`], under its lock.
    async fn rescan(self: &Arc<Self>) -> ReloadSummary {
        if let Some(max) =
            self.executor.pong(PONG_TIMEOUT).await.and_then(|p| p.max_timeout_seconds)
        {
            self.max_timeout.store(max, Ordering::Relaxed);
        }
        let max_timeout = Duration::from_secs(self.max_timeout.load(Ordering::Relaxed));
        let opts = ValidateOptions { max_timeout };
        let scanner = Scanner::new(opts.clone());
        let this = Arc::clone(self);
        let scanned = tokio::task::spawn_blocking(move || {
            let report = scanner.scan(&this.roots);
            this.log_events(&report.events);
            report
        })
        .await;
        let snapshot = match scanned {
            Ok(mut report) => {
                self.add_mcp_tools(&mut report, &opts).await;
                Snapshot::build(report)
            }
            Err(e) => {
                // The scan does not panic on any input; if it ever does,
                // keep serving the previous registry.
                tracing::error!(error = %e, "scan task failed; registry unchanged");
                let cur = self.registry.current();
                return ReloadSummary { registered: cur.registered(), skipped: cur.skipped() };
            }
        };
        let summary =
            ReloadSummary { registered: snapshot.registered(), skipped: snapshot.skipped() };
        self.registry.replace(snapshot);
        self.discard_warm().await;
        self.metrics.reloads_total.inc();
        self.metrics.skills_registered.set(i64::try_from(summary.registered).unwrap_or(i64::MAX));
        tracing::info!(
            registered = summary.registered,
            skipped = summary.skipped,
            "skill loader: {} skill{} registered",
            summary.registered,
            if summary.registered == 1 { "" } else { "s" }
        );
        summary
    }

    /// Tells the executor to discard its idle warm runs (`warm_discard`):
    /// a scan is when skill files may have changed, some of them (a module
    /// the entry loads at start) unseen by the check of manifest and entry
    /// that the executor makes before handing out a warm run. Its pools are
    /// made again from the files as they are now.
    async fn discard_warm(&self) {
        match self.executor.warm_discard(PONG_TIMEOUT).await {
            Ok(0) => {}
            Ok(n) => tracing::info!("skill loader: the executor discarded {n} idle warm runs"),
            Err(e) => tracing::warn!(
                error = %e,
                "skill loader: the executor was not told to discard its warm runs; \
                 they may run the files as they were before the reload"
            ),
        }
    }

    /// Logs scan events at their level and counts the skips.
    fn log_events(&self, events: &[crate::scan::event::ScanEvent]) {
        for event in events {
            match event.level() {
                Level::Debug => tracing::debug!("{event}"),
                Level::Info => tracing::info!("{event}"),
                Level::Warn => tracing::warn!("{event}"),
            }
            if event.is_skip() {
                self.metrics.manifest_errors_total.with_label_values(&[event.kind()]).inc();
            }
        }
    }

    /// Asks the executor for the tools of each MCP server pack the scan
    /// found (which starts their servers), all at once: a scan waits for
    /// the slowest list, not for the sum of them. Registers them
    /// ([`crate::scan::mcp`]), noting the generation of each list.
    async fn add_mcp_tools(&self, report: &mut crate::scan::ScanReport, opts: &ValidateOptions) {
        let paths: Vec<String> = report
            .mcp_packs
            .iter()
            .map(|p| p.manifest_path().to_string_lossy().into_owned())
            .collect();
        let lists = futures_util::future::join_all(
            paths.iter().map(|path| self.executor.mcp_tools(path, MCP_LIST_TIMEOUT)),
        )
        .await;
        for (pack, listed) in lists.into_iter().enumerate() {
            let manifest = report.mcp_packs[pack].manifest_path().to_owned();
            let before = report.events.len();
            let listed = listed.map(|(tools, generation)| {
                report.mcp_generations.insert(manifest, generation);
                tools
            });
            crate::scan::mcp::add_tools(report, pack, listed, opts);
            self.log_events(&report.events[before..]);
        }
    }

    /// Told the generation of the tool list of the MCP server pack at
    /// `manifest`, after a call to one of its tools (the executor's
    /// `tools_generation`) or by the executor's `mcp_watch` answer: when it
    /// is not the one the registry holds the pack's tools at (the server
    /// said its tools changed, or a restarted server lists others), lists
    /// them again in the background ([`App::refresh_mcp_pack`]).
    ///
    /// One listing per pack at a time: a generation seen while one is under
    /// way is noted, and the pack is listed once more after it when the
    /// last one noted is not the one it listed for.
    pub fn tools_generation_seen(self: &Arc<Self>, manifest: &Path, generation: u64) {
        let cur = self.registry.current();
        let Some(pack) = cur.mcp_pack(manifest) else { return };
        if pack.generation == Some(generation) {
            return;
        }
        {
            let mut relisting = self.relisting();
            if let Some(last) = relisting.get_mut(manifest) {
                *last = generation;
                return;
            }
            relisting.insert(manifest.to_owned(), generation);
        }
        let (this, manifest) = (Arc::clone(self), manifest.to_owned());
        tokio::spawn(async move {
            let mut seen = generation;
            loop {
                this.refresh_mcp_pack(&manifest, seen).await;
                let mut relisting = this.relisting();
                match relisting.get(&manifest).copied() {
                    Some(last) if last != seen => seen = last,
                    _ => {
                        relisting.remove(&manifest);
                        return;
                    }
                }
            }
        });
    }

    fn relisting(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<PathBuf, u64>> {
        // Every update is one insert or remove: a poisoned set is whole.
        self.relisting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Follows the executor's MCP servers' tool lists for ever, while the
    /// registry holds MCP server packs: one `mcp_watch` in flight at a
    /// time, whose answer names the packs whose list moved (each listed
    /// again, [`App::tools_generation_seen`]), then the next. So a change a
    /// server says while nobody calls it reaches the registry within a
    /// moment, and no server is polled. Without packs it waits for a
    /// reload; when the executor cannot be asked, it tries again after a
    /// backoff (0.5 s doubling to 10 s). The packs whose tools were never
    /// listed (a scan while the executor was down: a fresh executor names
    /// no pack it has not started, and its first answer may be a long wait
    /// away) are listed again once the executor answers a ping: looked
    /// for at the start, after each reload and after each failure.
    pub async fn watch_mcp(self: Arc<Self>) {
        let mut since = 0;
        let mut failures: u32 = 0;
        let mut relist = true;
        let mut reloads = self.registry.subscribe();
        loop {
            if !self.registry.current().has_mcp_packs() {
                if reloads.changed().await.is_err() {
                    return;
                }
                continue;
            }
            if relist {
                relist = !self.relist_unlisted().await;
            }
            let asked = std::time::Instant::now();
            let watched = tokio::select! {
                r = self.executor.mcp_watch(since, MCP_WATCH_WAIT) => r,
                changed = reloads.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    relist = true;
                    continue;
                }
            };
            match watched {
                Ok(answer) => {
                    failures = 0;
                    for p in &answer.packs {
                        self.tools_generation_seen(Path::new(&p.manifest), p.generation);
                    }
                    let nothing = answer.changes == since && answer.packs.is_empty();
                    since = answer.changes;
                    // An executor that answers at once with nothing new is
                    // not asked again at once.
                    if nothing && asked.elapsed() < MCP_WATCH_MIN {
                        tokio::time::sleep(MCP_WATCH_MIN.saturating_sub(asked.elapsed())).await;
                    }
                }
                Err(e) => {
                    relist = true;
                    failures = failures.saturating_add(1);
                    let wait = MCP_WATCH_RETRY
                        .saturating_mul(1 << failures.saturating_sub(1).min(5))
                        .min(MCP_WATCH_RETRY_MAX);
                    tracing::debug!("skill loader: mcp_watch: {e}; again in {wait:?}");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Lists the registry's MCP server packs that hold no tool list again,
    /// if the executor answers a ping; returns false when there were some
    /// and it did not answer (to be tried again).
    async fn relist_unlisted(self: &Arc<Self>) -> bool {
        let unlisted = self.registry.current().unlisted_mcp_packs();
        if unlisted.is_empty() {
            return true;
        }
        if !self.executor.ping(PONG_TIMEOUT).await {
            return false;
        }
        for manifest in unlisted {
            // The pack holds no generation: any list is newer.
            self.tools_generation_seen(&manifest, 0);
        }
        true
    }

    /// Lists the tools of the MCP server pack at `manifest` again and
    /// swaps them into the registry, every other skill kept as it is (no
    /// rescan); `seen` is the generation that asked for it (nothing is
    /// done when the registry holds it already). When the
    /// executor cannot list them now, the registry keeps the tools it has
    /// (the next call's generation asks again; a reload drops them). The
    /// listing is awaited outside the reload lock, so a reload never waits
    /// for it; a list older than the registry's by then is dropped.
    pub async fn refresh_mcp_pack(&self, manifest: &Path, seen: u64) {
        let Some(before) = self.registry.current().mcp_pack(manifest).cloned() else { return };
        if before.generation == Some(seen) {
            return;
        }
        let path = manifest.to_string_lossy();
        let listed = self.executor.mcp_tools(&path, MCP_LIST_TIMEOUT).await;
        let _one_at_a_time = self.reload_lock.lock().await;
        let cur = self.registry.current();
        let Some(pack) = cur.mcp_pack(manifest).cloned() else { return };
        let (tools, generation) = match listed {
            Ok(listed) => listed,
            Err(why) => {
                self.log_events(&[crate::scan::mcp::not_listed(&pack.pack, &why)]);
                return;
            }
        };
        if pack.generation.is_some() && generation <= pack.generation {
            return;
        }
        let opts = ValidateOptions {
            max_timeout: Duration::from_secs(self.max_timeout.load(Ordering::Relaxed)),
        };
        let taken = |name: &str| cur.taken_by_other(name, manifest);
        let (skills, events) = crate::scan::mcp::pack_skills(&pack.pack, &tools, &opts, taken);
        self.log_events(&events);
        let n = skills.len();
        let snapshot = cur.with_pack_tools(manifest, skills, generation);
        let registered = snapshot.registered();
        self.registry.replace(snapshot);
        self.metrics.skills_registered.set(i64::try_from(registered).unwrap_or(i64::MAX));
        tracing::info!(
            registered,
            "skill loader: pack {:?}: its server's tools changed: {n} listed again",
            pack.pack.name()
        );
    }

    /// Notes that a request may become a run with this timeout (called
    /// once its skill is looked up, before its body is read): see
    /// [`App::longest_run`].
    pub fn allowing_run(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.longest_allowed_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The longest a request may take from its arrival to its report: the
    /// queue timeout, the longest timeout of a registered skill or of any
    /// skill a run was asked of since start (a reload that shortened a skill's timeout
    /// does not shorten the wait for a run started before it), and the
    /// report's slack. skilld's drain waits that long for the runs in
    /// flight, at most `drain_timeout_seconds` ([`MAX_DRAIN`](crate::daemon::config::MAX_DRAIN) by default).
    pub fn longest_run(&self) -> Duration {
        let registered = self
            .registry()
            .current()
            .iter()
            .map(|s| s.registered().manifest().timeout())
            .max()
            .unwrap_or_default();
        let allowed = Duration::from_millis(self.longest_allowed_ms.load(Ordering::Relaxed));
        let longest = registered.max(allowed);
        (self.limits.queue_timeout + longest + crate::daemon::executor_client::REPORT_SLACK)
            .min(self.limits.drain_timeout)
    }

    /// Cancelled when the daemon stops serving.
    pub fn stopping(&self) -> &tokio_util::sync::CancellationToken {
        &self.stopping
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// A one-line state for the service manager's `STATUS=`:
    /// `serving N skills (M skipped)`.
    pub fn status_line(&self) -> String {
        let cur = self.registry.current();
        format!("serving {} skills ({} skipped)", cur.registered(), cur.skipped())
    }

    /// The executor client.
    pub fn executor(&self) -> &ExecutorClient {
        &self.executor
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The run slots.
    pub fn run_slots(&self) -> &Arc<Semaphore> {
        &self.run_slots
    }

    /// Request limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The Prometheus registry the metrics live in.
    pub fn prometheus(&self) -> &prometheus::Registry {
        &self.prometheus
    }
}
