//! `ongrid-skilld` as a library: start-up and the serving loop, with the
//! shutdown signal and the reload trigger handed in by the caller (the
//! binary passes SIGTERM/SIGINT and SIGHUP; tests pass their own).

pub mod api;
pub mod app;
pub mod audit;
pub mod authz;
pub mod cli;
pub mod config;
pub mod connection;
pub mod executor_client;
pub mod metrics;
pub mod metrics_listener;
pub mod quiet_stream;
pub mod registry;
pub mod replay;
pub mod server;

use std::sync::Arc;

use plumbing::socket::{NodeOptions, SocketNode};
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use self::app::App;
use self::config::Settings;
use self::metrics::Metrics;
use self::server::ServeOptions;

/// The soft `RLIMIT_NOFILE` skilld raises itself to, towards its hard
/// limit: the packaged unit's `LimitNOFILE`. skilld holds a descriptor per
/// client connection (`max_connections`), its executor connections and
/// the audit database's files; started by hand or by `ongrid-skill up`
/// from a shell, it would otherwise have the shell's soft 1024.
pub const NOFILE_WANTED: u64 = 16_384;

/// Raises this process's soft `RLIMIT_NOFILE` towards the hard limit, up
/// to [`NOFILE_WANTED`]. Returns the soft limit before and after.
///
/// # Errors
///
/// The error of `getrlimit` or `setrlimit` (the limit is then unchanged).
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let wanted = hard.min(NOFILE_WANTED);
    if soft < wanted {
        setrlimit(Resource::RLIMIT_NOFILE, wanted, hard)?;
        return Ok((soft, wanted));
    }
    Ok((soft, soft))
}

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Registering the metrics failed.
    #[error("cannot register metrics")]
    Metrics(#[source] prometheus::Error),
    /// The client socket could not be bound.
    #[error(transparent)]
    Bind(#[from] plumbing::socket::SocketError),
    /// The audit thread could not be started.
    #[error("cannot start the audit thread")]
    Audit(#[source] std::io::Error),
    /// The client socket passed by socket activation could not be used.
    #[error("cannot serve on the socket passed by systemd")]
    Inherited(#[source] std::io::Error),
    /// The metrics listener could not be bound.
    #[error("cannot listen on {addr} for metrics")]
    MetricsListen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A started daemon: the state, the bound listeners, the serving options.
#[derive(Debug)]
pub struct Daemon {
    /// The shared state (reload it on SIGHUP).
    pub app: Arc<App>,
    api: UnixListener,
    /// The client socket came from socket activation: systemd owns the
    /// node (never unlinked or rebound here).
    pub socket_inherited: bool,
    metrics: Option<TcpListener>,
    opts: ServeOptions,
    /// The node bound at `socket` (none when inherited): removed when the
    /// daemon is dropped, after the listener.
    node: Option<SocketNode>,
}

impl Daemon {
    /// Registers the metrics (and `ongrid_skilld_process_*`) in a fresh
    /// registry, binds both listeners and does the first scan.
    ///
    /// `inherited` is a listening socket passed by socket activation
    /// ([`plumbing::notify::take_listener`]): it is served as it is (its
    /// owner, group and mode are the socket unit's), and `settings.socket`
    /// is neither removed nor bound. Without it the socket is bound at
    /// `settings.socket` with `socket_mode` and `socket_group`, and removed
    /// again when the start fails after the bind or the daemon ends.
    ///
    /// # Errors
    ///
    /// [`StartError`].
    pub async fn start(
        settings: &Settings,
        inherited: Option<std::os::unix::net::UnixListener>,
    ) -> Result<Self, StartError> {
        let registry = prometheus::Registry::new();
        // `ongrid_skilld_process_*`: the executor's are renamed
        // `ongrid_executor_process_*` when its text is merged.
        let process = plumbing::process_metrics::ProcessMetrics::for_self(
            crate::daemon::metrics::PROCESS_NAMESPACE,
        )
        .map_err(StartError::Metrics)?;
        registry.register(Box::new(process)).map_err(StartError::Metrics)?;
        let metrics = Metrics::new(&registry).map_err(StartError::Metrics)?;
        let app = Arc::new(App::new(settings, metrics, registry).map_err(StartError::Audit)?);
        let socket_inherited = inherited.is_some();
        // Declared before the listener, so dropped after it (an error
        // below drops both): the node bound here goes with them.
        let node;
        let api = match inherited {
            Some(listener) => {
                node = None;
                plumbing::notify::into_tokio(listener).map_err(StartError::Inherited)?
            }
            None => {
                // With mode 0660 the group decides who may connect at all.
                // The daemon must be root or a member of the group to set it.
                let opts = NodeOptions {
                    group: settings.socket_group,
                    ..NodeOptions::new(settings.socket_mode)
                };
                let (api, bound) = plumbing::socket::bind(&settings.socket, &opts)?;
                node = Some(bound);
                api
            }
        };
        app.preload_approvals().await;
        let metrics = match settings.metrics_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| StartError::MetricsListen { addr, source })?,
            ),
            None => None,
        };
        app.reload().await;
        let socket = api
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
            .unwrap_or_default();
        tracing::info!(
            socket = %socket,
            executor = %settings.executor_socket.display(),
            metrics = ?settings.metrics_listen,
            socket_activation = socket_inherited,
            "ongrid-skilld listening"
        );
        let opts = ServeOptions {
            max_connections: settings.max_connections,
            header_timeout: settings.header_timeout,
            idle_timeout: settings.idle_timeout,
            requests_total: app.metrics().http_requests_total.clone(),
        };
        Ok(Self { app, api, socket_inherited, metrics, opts, node })
    }

    /// Serves the client API and the metrics until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let metrics = self.metrics.map(|listener| {
            let router = api::metrics_router(Arc::clone(&self.app));
            tokio::spawn(crate::daemon::metrics_listener::serve(listener, router, shutdown.clone()))
        });
        // The MCP servers' tool list changes, followed while serving.
        let mcp_watch = tokio::spawn(Arc::clone(&self.app).watch_mcp());
        let stopping = self.app.stopping().clone();
        let stop_polls = shutdown.clone();
        // Long polls (`GET /v1/registry`) answer at once when the drain starts.
        tokio::spawn(async move {
            stop_polls.cancelled().await;
            stopping.cancel();
        });
        let draining =
            server::serve(self.api, api::router(Arc::clone(&self.app)), self.opts, shutdown).await;
        self.app.stopping().cancel();
        mcp_watch.abort();
        // Runs in flight may end within their deadlines, as the executor
        // lets them (the longest a registered skill may take, with the
        // report's slack); what is left then is cut and recorded so.
        let deadline = self.app.longest_run();
        if !draining.wait(deadline).await {
            tracing::warn!(
                connections = draining.open(),
                deadline_seconds = deadline.as_secs(),
                "drain deadline passed; ending the runs still in flight"
            );
            self.app.audit().stopping();
            draining.abort().await;
        }
        if let Some(task) = metrics {
            let _ = task.await;
        }
        // Every answered run's rows into the database, the journal emptied.
        self.app.audit().flush().await;
        // The listener is gone (`serve` dropped it): the node goes too.
        drop(self.node);
        tracing::info!("ongrid-skilld stopped");
    }
}
