//! `ongrid-skilld`: the skill registry daemon. See [`loader::daemon`].
//!
//! Exit codes: 0 after SIGTERM/SIGINT, 1 on a start-up failure, 78
//! (EX_CONFIG) when the configuration is invalid (`--check-config` too).
//!
//! Under systemd (`Type=notify`): `READY=1` once the client socket accepts,
//! the metrics listener is bound and the first scan is done; `RELOADING=1`
//! (with `MONOTONIC_USEC=`) and then `READY=1` around every rescan (SIGHUP
//! or `POST /v1/reload`); `STOPPING=1` when SIGTERM/SIGINT starts the
//! drain. With `ongrid-skilld.socket` the
//! client socket is the one systemd passes (`LISTEN_FDS`); it is left in
//! place at exit.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use loader::daemon::cli::Args;
use loader::daemon::config::{FileConfig, Overrides};
use loader::daemon::Daemon;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::Level;

const EX_CONFIG: u8 = 78;

fn main() -> ExitCode {
    // Before any thread: no signal blocked. A mask is inherited across
    // `exec`, and one the parent set (blocking SIGTERM around its spawn)
    // would keep the stop and reload signals from ever reaching their
    // handlers.
    let _ = nix::sys::signal::SigSet::empty().thread_set_mask();
    let args = Args::parse();
    // Under systemd, lines for the journal (priorities, no timestamp).
    let _ = plumbing::journald::try_init(
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    );
    if let Err(e) = loader::daemon::raise_nofile() {
        tracing::warn!("ongrid-skilld: cannot raise the soft RLIMIT_NOFILE: {e}");
    }
    let overrides = Overrides {
        socket: args.socket,
        executor_socket: args.executor_socket,
        metrics_listen: args.metrics_listen,
        skills_dirs: args.skills_dirs,
        ..Overrides::default()
    };
    let mut origin = None;
    let settings = match FileConfig::load(args.config.as_deref()).and_then(|f| {
        origin.clone_from(&f.origin);
        f.resolve(overrides, loader::scan::roots::from_env())
    }) {
        Ok(s) => s,
        Err(e) => {
            // With its sources: the OS error of a file that cannot be read.
            let e = anyhow::Error::from(e);
            plumbing::journald::eprint(
                Level::ERROR,
                &format!("ongrid-skilld: configuration: {e:#}"),
            );
            return ExitCode::from(EX_CONFIG);
        }
    };
    if args.check_config {
        print!("{}", summary(origin.as_deref(), &settings));
        return ExitCode::SUCCESS;
    }
    // Before the runtime starts any thread: this edits the environment.
    let inherited = match plumbing::notify::take_listener("ongrid-skilld") {
        Ok(l) => l,
        Err(e) => {
            plumbing::journald::eprint(Level::ERROR, &format!("ongrid-skilld: {e}"));
            return ExitCode::FAILURE;
        }
    };
    match serve(settings, inherited) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            plumbing::journald::eprint(Level::ERROR, &format!("ongrid-skilld: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// What `--check-config` prints for a valid configuration: the file, then
/// what the daemon would serve on and read, one line each.
fn summary(origin: Option<&std::path::Path>, s: &loader::daemon::config::Settings) -> String {
    let file =
        origin.map_or_else(|| "no file, the defaults".to_owned(), |p| p.display().to_string());
    let group = s.socket_group.map_or_else(|| "the daemon's".to_owned(), |g| g.to_string());
    let dirs: Vec<String> = s.skills_dirs.iter().map(|d| d.display().to_string()).collect();
    let metrics = s.metrics_listen.map_or_else(|| "off".to_owned(), |a| a.to_string());
    format!(
        "ok: {file}\n\
         socket: {} (mode {:04o}, group {group})\n\
         executor socket: {}\n\
         skill directories: {}\n\
         metrics: {metrics}\n\
         audit database: {}\n\
         callers: {}, approvers: {}\n",
        s.socket.display(),
        s.socket_mode,
        s.executor_socket.display(),
        dirs.join(", "),
        s.audit.db.display(),
        s.callers.len(),
        s.approvers.len(),
    )
}

fn serve(
    settings: loader::daemon::config::Settings,
    inherited: Option<std::os::unix::net::UnixListener>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        // The daemon removes the socket node it bound when it ends, and
        // when its start fails after the bind.
        let daemon = Daemon::start(&settings, inherited).await.context("starting")?;
        // Bound, listening and scanned: clients are answered from here on;
        // each rescan since is told to systemd (RELOADING=1, READY=1). The
        // signals that came meanwhile wait in their streams.
        plumbing::notify::ready(&daemon.app.status_line());
        daemon.app.notify_reloads();
        let app = daemon.app.clone();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        // SIGHUP's rescans, in a task of their own so that SIGTERM is heard
        // during a long one (RELOADING=1 ... READY=1 around each,
        // App::reload); the SIGHUPs that come during one make one more.
        let rescan = Arc::new(tokio::sync::Notify::new());
        let asked = rescan.clone();
        tokio::spawn(async move {
            loop {
                asked.notified().await;
                app.reload().await;
            }
        });
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = term.recv() => break,
                    _ = int.recv() => break,
                    _ = hup.recv() => {
                        tracing::info!("SIGHUP: rescanning");
                        rescan.notify_one();
                    }
                }
            }
            tracing::info!("shutting down");
            plumbing::notify::stopping();
            stop.cancel();
        });
        daemon.run(shutdown).await;
        Ok(())
    })
}
