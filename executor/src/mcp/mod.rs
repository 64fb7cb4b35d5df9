//! MCP servers as skills: the executor owns each `"kind": "mcp"` pack's
//! server, boxed as a run is, and calls its tools over its stdio.
//!
//! - [`secrets`]: the operator's `env_file` of a pack.
//! - [`client`]: the bounded JSON-RPC client over a server's stdio.
//! - [`server`]: one pack's server: start in the box, calls, cut-off,
//!   restart with backoff, idle stop, drain.
//!
//! [`Servers`] holds one [`server::Server`] per pack manifest; calls to one
//! server take turns (one request in flight per server), calls to
//! different servers do not wait for each other. The executor is the trust
//! anchor: it plans the pack from the manifest itself (entry, owners,
//! grant) at each start and refuses a tool the server did not list.

pub mod client;
pub mod secrets;
pub mod server;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use policy::RunReport;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::Engine;
pub use client::Tool;
pub use server::Server;

/// Every pack's server, by the manifest path it was asked by.
#[derive(Debug, Default)]
pub struct Servers {
    by_manifest: std::sync::Mutex<HashMap<PathBuf, Arc<Mutex<Server>>>>,
    /// Told after each use of a server (which may have started it or moved
    /// its idle deadline): what [`Servers::watch_idle`] waits on when no
    /// deadline is nearer.
    used: tokio::sync::Notify,
}

impl Servers {
    /// The server of the pack at `manifest` (not started by this).
    pub fn get(&self, manifest: &Path) -> Arc<Mutex<Server>> {
        let mut map = self.by_manifest.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(manifest.to_owned())
            .or_insert_with(|| Arc::new(Mutex::new(Server::new(manifest))))
            .clone()
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
        let tools = self.get(manifest).lock().await.tools(engine).await;
        self.used.notify_one();
        tools
    }

    /// The tools of the pack at `manifest` as the wire lists them.
    ///
    /// # Errors
    ///
    /// The report of the failed start (never carries a secret).
    pub async fn tool_infos(
        &self,
        engine: &Engine,
        manifest: &Path,
    ) -> Result<Vec<policy::wire::McpToolInfo>, Box<RunReport>> {
        let tools = self.get(manifest).lock().await.tool_infos(engine).await;
        self.used.notify_one();
        tools
    }

    /// Calls `tool` of the pack at `manifest` with `args`.
    pub async fn call(
        &self,
        engine: &Engine,
        manifest: &Path,
        tool: &str,
        args: Value,
    ) -> RunReport {
        self.call_with_progress(engine, manifest, tool, args, &mut |_| {}).await
    }

    /// [`Servers::call`], handing each progress notification of the call
    /// to `progress` as a line.
    pub async fn call_with_progress(
        &self,
        engine: &Engine,
        manifest: &Path,
        tool: &str,
        args: Value,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> RunReport {
        let server = self.get(manifest);
        let report = server.lock().await.call_with_progress(engine, tool, args, progress).await;
        self.used.notify_one();
        report
    }

    /// The generation of the tool list of the pack at `manifest`
    /// ([`Server::generation`]; the server is not started by this).
    pub async fn generation(&self, manifest: &Path) -> u64 {
        self.get(manifest).lock().await.generation()
    }

    fn all(&self) -> Vec<Arc<Mutex<Server>>> {
        let map = self.by_manifest.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.values().cloned().collect()
    }

    /// Stops the servers idle past their pack's `idle_seconds`; returns how
    /// many it stopped ([`Servers::watch_idle`] calls it as deadlines pass).
    pub async fn stop_idle(&self, engine: &Engine) -> usize {
        let mut stopped = 0;
        for s in self.all() {
            // A server in a call is not idle: skip it rather than wait.
            if let Ok(mut s) = s.try_lock() {
                stopped += usize::from(s.stop_if_idle(engine).await);
            }
        }
        stopped
    }

    /// The nearest idle deadline of a running server not in a call (one in
    /// a call notifies `used` when it is done).
    fn next_idle_deadline(&self) -> Option<std::time::Instant> {
        self.all().iter().filter_map(|s| s.try_lock().ok()?.idle_deadline()).min()
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
