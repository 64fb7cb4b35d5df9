//! MCP servers as skills: the executor owns each `"kind": "mcp"` pack's
//! server, boxed as a run is, and calls its tools over its stdio.
//!
//! - [`secrets`]: the operator's `env_file` of a pack.
//! - [`client`]: the bounded JSON-RPC client over a server's stdio.
//! - [`reader`]: the task per running server reading its output all the
//!   time, so that a tool list change said while it is idle is seen at once.
//! - [`server`]: one pack's server: start in the box, calls, cut-off,
//!   restart with backoff, idle stop, drain.
//!
//! [`Servers`] holds one [`server::Server`] per pack manifest; calls to one
//! server take turns (one request in flight per server), calls to
//! different servers do not wait for each other. The executor is the trust
//! anchor: it plans the pack from the manifest itself (entry, owners,
//! grant) at each start and refuses a tool the server did not list.
//!
//! A server's tool list changes: its `notifications/tools/list_changed`
//! wakes [`Servers::watch_changes`], which lists its tools again at once
//! (after the call in flight, if any); every move of a server's generation
//! is counted ([`Servers::watch`]), so that skilld, waiting on the wire's
//! `mcp_watch`, lists that pack again without polling any server.

pub mod client;
pub mod error;
pub mod reader;
pub mod secrets;
pub mod server;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use policy::RunReport;
use serde_json::Value;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard};

use crate::Engine;
pub use client::Tool;
pub use server::Server;

/// Every pack's server, by the manifest path it was asked by.
#[derive(Debug)]
pub struct Servers {
    by_manifest: std::sync::Mutex<HashMap<PathBuf, Arc<Mutex<Server>>>>,
    /// Told after each use of a server (which may have started it or moved
    /// its idle deadline): what [`Servers::watch_idle`] waits on when no
    /// deadline is nearer.
    used: Notify,
    /// Woken by a server's reader when it says its tools changed: what
    /// [`Servers::watch_changes`] waits on.
    changed: Arc<Notify>,
    /// How many times a server's generation moved, for [`Servers::watch`],
    /// counted from the executor's start time in nanoseconds.
    changes: tokio::sync::watch::Sender<u64>,
    /// When (the count of [`Servers::changes`]) each server's generation
    /// last moved, and to what.
    moved: std::sync::Mutex<HashMap<PathBuf, (u64, u64)>>,
}

impl Default for Servers {
    fn default() -> Self {
        Servers {
            by_manifest: std::sync::Mutex::default(),
            used: Notify::new(),
            changed: Arc::new(Notify::new()),
            // Above any count an earlier executor reached.
            changes: tokio::sync::watch::Sender::new(server::first_generation()),
            moved: std::sync::Mutex::default(),
        }
    }
}

/// What [`Servers::watch`] answers: the count of generation moves, and the
/// packs whose generation moved since the count asked about, each with its
/// generation now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moves {
    /// The count of moves now.
    pub changes: u64,
    /// `(manifest, generation)` of each pack that moved.
    pub packs: Vec<(PathBuf, u64)>,
}

impl Servers {
    /// The server of the pack at `manifest` (not started by this).
    pub fn get(&self, manifest: &Path) -> Arc<Mutex<Server>> {
        let mut map = self.by_manifest.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed = &self.changed;
        map.entry(manifest.to_owned())
            .or_insert_with(|| Arc::new(Mutex::new(Server::new(manifest, Arc::clone(changed)))))
            .clone()
    }

    /// After a use of the server of `manifest` whose generation was
    /// `before`: counts a move of its generation, and wakes
    /// [`Servers::watch_changes`] again when the server said its tools
    /// changed after its last listing (while this use held it, so the
    /// watcher skipped it).
    fn after_use(&self, manifest: &Path, before: u64, server: &Server) {
        self.record_move(manifest, before, server.generation());
        if server.wants_refresh() {
            self.changed.notify_one();
        }
        self.used.notify_one();
    }

    /// Counts a move of the generation of the server of `manifest` from
    /// `before` to `now`, if it moved.
    fn record_move(&self, manifest: &Path, before: u64, now: u64) {
        if now == before {
            return;
        }
        let mut moved = self.moved.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.changes.send_modify(|c| {
            *c = c.wrapping_add(1);
            moved.insert(manifest.to_owned(), (*c, now));
        });
    }

    /// Waits until a server's generation moved after the count `since`
    /// (at once when the count is not `since`), at most `timeout`, or
    /// until `stop` resolves: the count then, and the packs that moved.
    pub async fn watch(
        &self,
        since: u64,
        timeout: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> Moves {
        let mut rx = self.changes.subscribe();
        tokio::select! {
            _ = rx.wait_for(|c| *c != since) => {}
            () = tokio::time::sleep(timeout) => {}
            () = stop => {}
        }
        let changes = *rx.borrow();
        let moved = self.moved.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A count below `since` is another executor's: every move is new.
        let new = |at: u64| changes < since || at > since;
        let mut packs: Vec<(PathBuf, u64)> = moved
            .iter()
            .filter(|(_, (at, _))| new(*at))
            .map(|(m, (_, g))| (m.clone(), *g))
            .collect();
        packs.sort();
        Moves { changes, packs }
    }

    /// Lists again, as servers say their tools changed, the tools of every
    /// server that said so, and cuts off a server whose connection ended
    /// while it was idle (it starts again on its next use), for ever:
    /// asleep until a server's reader wakes it. A server in a call is
    /// skipped (the call lists its tools again after its answer, and the
    /// end of its use wakes this again if the change came later).
    pub async fn watch_changes(&self, engine: &Engine) {
        loop {
            self.changed.notified().await;
            for (manifest, s) in self.all_by_manifest() {
                let Ok(mut s) = s.try_lock() else { continue };
                if !s.wants_refresh() {
                    continue;
                }
                let before = s.generation();
                s.refresh(engine).await;
                self.record_move(&manifest, before, s.generation());
            }
            // A server cut off or listed again has another idle deadline.
            self.used.notify_one();
        }
    }

    /// After a holder of a server's lock let go of it: a list change or an
    /// end its reader reported meanwhile (the watcher skips a locked
    /// server) is handled now.
    fn released(&self, s: &Server) {
        if s.wants_refresh() {
            self.changed.notify_one();
        }
    }

    /// The tools of the pack at `manifest`, starting its server when needed.
    ///
    /// # Errors
    ///
    /// The report of the failed start (never carries a secret).
    pub async fn tools(
        &self,
        engine: &Engine,
        manifest: &Path,
    ) -> Result<Vec<Tool>, Box<RunReport>> {
        let server = self.get(manifest);
        let mut s = server.lock().await;
        let before = s.generation();
        let tools = s.tools(engine).await;
        self.after_use(manifest, before, &s);
        tools
    }

    /// The tools of the pack at `manifest` as the wire lists them, and
    /// their generation, read under the same lock (no later use's turn
    /// comes between); `None`, the server untouched, when `give_up`
    /// resolves while another use holds it (the caller gone, the executor
    /// stopping).
    ///
    /// # Errors
    ///
    /// The report of the failed start (never carries a secret).
    pub async fn tool_infos(
        &self,
        engine: &Engine,
        manifest: &Path,
        give_up: impl Future<Output = ()>,
    ) -> Option<Result<(Vec<policy::wire::McpToolInfo>, u64), Box<RunReport>>> {
        let mut s = self.lock_or(manifest, give_up).await?;
        let before = s.generation();
        let tools = s.tool_infos(engine).await;
        self.after_use(manifest, before, &s);
        Some(tools.map(|tools| (tools, s.generation())))
    }

    /// Calls `tool` of the pack at `manifest` with `args`.
    pub async fn call(
        &self,
        engine: &Engine,
        manifest: &Path,
        tool: &str,
        args: Value,
    ) -> RunReport {
        let mut progress = |_: &str| {};
        let call = self.call_with_progress(
            engine,
            manifest,
            tool,
            args,
            &mut progress,
            std::future::pending(),
        );
        // Never given up: a pending `give_up` never resolves.
        call.await.map_or_else(
            || RunReport::not_run(tool, policy::Outcome::Busy, "not called"),
            |(report, _)| report,
        )
    }

    /// [`Servers::call`], handing each progress notification of the call
    /// to `progress` as a line, with the tool list's generation after the
    /// call (read under the same lock); `None`, the call not made, when
    /// `give_up` resolves while another use holds the server. A call begun
    /// is never given up: the server is mid-request.
    pub async fn call_with_progress(
        &self,
        engine: &Engine,
        manifest: &Path,
        tool: &str,
        args: Value,
        progress: &mut (dyn FnMut(&str) + Send),
        give_up: impl Future<Output = ()>,
    ) -> Option<(RunReport, u64)> {
        let mut s = self.lock_or(manifest, give_up).await?;
        let before = s.generation();
        let report = s.call_with_progress(engine, tool, args, progress).await;
        self.after_use(manifest, before, &s);
        Some((report, s.generation()))
    }

    /// The lock of the server of `manifest`, or `None` if `give_up`
    /// resolves first.
    async fn lock_or(
        &self,
        manifest: &Path,
        give_up: impl Future<Output = ()>,
    ) -> Option<OwnedMutexGuard<Server>> {
        let server = self.get(manifest);
        tokio::select! {
            biased;
            s = server.lock_owned() => Some(s),
            () = give_up => None,
        }
    }

    /// The generation of the tool list of the pack at `manifest`
    /// ([`Server::generation`]; the server is not started by this).
    pub async fn generation(&self, manifest: &Path) -> u64 {
        let server = self.get(manifest);
        let s = server.lock().await;
        self.released(&s);
        s.generation()
    }

    fn all(&self) -> Vec<Arc<Mutex<Server>>> {
        let map = self.by_manifest.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.values().cloned().collect()
    }

    fn all_by_manifest(&self) -> Vec<(PathBuf, Arc<Mutex<Server>>)> {
        let map = self.by_manifest.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.iter().map(|(m, s)| (m.clone(), Arc::clone(s))).collect()
    }

    /// Stops the servers idle past their pack's `idle_seconds`; returns how
    /// many it stopped ([`Servers::watch_idle`] calls it as deadlines pass).
    pub async fn stop_idle(&self, engine: &Engine) -> usize {
        let mut stopped = 0;
        for s in self.all() {
            // A server in a call is not idle: skip it rather than wait.
            if let Ok(mut s) = s.try_lock() {
                stopped += usize::from(s.stop_if_idle(engine).await);
                self.released(&s);
            }
        }
        stopped
    }

    /// The nearest idle deadline of a running server not in a call (one in
    /// a call notifies `used` when it is done).
    fn next_idle_deadline(&self) -> Option<std::time::Instant> {
        let deadline = |s: &Arc<Mutex<Server>>| {
            let s = s.try_lock().ok()?;
            self.released(&s);
            s.idle_deadline()
        };
        self.all().iter().filter_map(deadline).min()
    }

    /// Stops idle servers as their deadlines pass, for ever: asleep until
    /// the nearest deadline or the next use of a server, so an executor
    /// without running servers is not woken.
    pub async fn watch_idle(&self, engine: &Engine) {
        loop {
            match self.next_idle_deadline() {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at.into()) => {}
                        () = self.used.notified() => {}
                    }
                }
                None => self.used.notified().await,
            }
            self.stop_idle(engine).await;
        }
    }

    /// Stops every server (drain): stdin closed and SIGTERM, then killed.
    pub async fn stop_all(&self, engine: &Engine) {
        for s in self.all() {
            s.lock().await.stop(engine).await;
        }
    }
}
