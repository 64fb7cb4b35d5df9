//! Supervising: `ongrid-executor serve` started as a child and waited for,
//! `ongrid-skilld` served in this process, the lines to try printed, and
//! both stopped on a signal or when the executor dies.

use std::io::{self, Write};
use std::path::Path;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plumbing::errors::chain;
use tokio::process::{Child, ChildStdin, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::choose::{
    fail, is_root, nix_uid, Failure, Plan, EXECUTOR_CONFIG, EXECUTOR_SOCKET, SKILLD_SOCKET,
};
use super::write::{cleanup, prepare_dir, Made};
use crate::daemon::app::App;
use crate::daemon::Daemon;

/// How long the executor may take to open its socket.
const EXECUTOR_START: Duration = Duration::from_secs(20);
/// How long the executor may take to stop after SIGTERM (runs finish
/// within their deadlines first) before it is killed, at least: once
/// serving, as long as skilld's drain may wait for its runs
/// (`App::longest_run`, up to `drain_timeout_seconds`) and a margin.
const EXECUTOR_STOP: Duration = Duration::from_secs(45);
/// What the executor gets beyond skilld's drain to answer and stop.
const EXECUTOR_STOP_MARGIN: Duration = Duration::from_secs(5);

/// The stop signals `up` handles: SIGTERM, SIGINT and SIGHUP (the
/// terminal it runs in closed), unless SIGHUP was ignored when `up`
/// started (`nohup`): a handler would undo that.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Option<Signal>,
}

impl Signals {
    fn new() -> io::Result<Self> {
        let hup = match ignored_at_start(libc::SIGHUP) {
            true => None,
            false => Some(signal(SignalKind::hangup())?),
        };
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup,
        })
    }
}

/// The next SIGHUP; never, when it is ignored.
async fn hangup(hup: &mut Option<Signal>) {
    match hup {
        Some(hup) => {
            hup.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Whether `signal` is ignored in this process (`SigIgn` of
/// `/proc/self/status`): read before any handler is installed, it says
/// what `up` was started with.
fn ignored_at_start(signal: i32) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    let mask = status.lines().find_map(|l| l.strip_prefix("SigIgn:"));
    let mask = mask.and_then(|m| u64::from_str_radix(m.trim(), 16).ok()).unwrap_or(0);
    (1..=64).contains(&signal) && mask & (1 << (signal - 1)) != 0
}

/// Starts both daemons as `plan` says, serves until a stop signal or the
/// executor's death, then stops both and removes what was written.
///
/// # Errors
///
/// I/O errors writing `out` or `err`.
pub(super) async fn serve(
    plan: Plan,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<ExitCode> {
    // Handlers first: a signal during start-up stops cleanly too.
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => return fail(&Failure::start(format!("signal handlers: {e}")), err),
    };
    let mut made = Made::default();
    if let Err(f) = prepare_dir(&plan, &mut made) {
        return fail(&f, err);
    }
    let (mut executor, parent_alive) = match start_executor(&plan, &mut signals, &made).await {
        Ok(started) => started,
        Err(f) => return fail(&f, err),
    };
    made.note(plan.runtime_dir.join(EXECUTOR_SOCKET));
    let daemon = match Daemon::start(&plan.settings, None).await {
        Ok(d) => d,
        Err(e) => {
            stop_executor(&mut executor, EXECUTOR_STOP).await;
            cleanup(&made);
            let hint = match (&e, plan.metrics) {
                (crate::daemon::StartError::MetricsListen { .. }, Some(_)) => {
                    " (is another ongrid-skilld running? choose another --metrics-listen, or \"\" to disable)"
                }
                _ => "",
            };
            let f = Failure::start(format!("ongrid-skilld: {}{hint}", chain(&e)));
            return fail(&f, err);
        }
    };
    made.note(plan.runtime_dir.join(SKILLD_SOCKET));
    let app = Arc::clone(&daemon.app);
    if let Err(e) = print_ready(&plan, &app, executor.id(), out).and_then(|()| out.flush()) {
        // No one reads the ready lines (a closed pipe): nothing is left
        // serving, and the exit says it failed.
        drop(daemon);
        stop_executor(&mut executor, EXECUTOR_STOP).await;
        cleanup(&made);
        let _ = writeln!(err, "ongrid-skill up: cannot print the ready lines: {e}; stopped");
        return Ok(ExitCode::FAILURE);
    }

    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(daemon.run(shutdown.clone()));
    let (code, why) = tokio::select! {
        _ = signals.term.recv() => (ExitCode::SUCCESS, "SIGTERM".to_owned()),
        _ = signals.int.recv() => (ExitCode::SUCCESS, "SIGINT".to_owned()),
        () = hangup(&mut signals.hup) => (ExitCode::SUCCESS, "SIGHUP (the terminal closed)".to_owned()),
        st = executor.wait() => (
            ExitCode::FAILURE,
            format!("ongrid-executor exited unexpectedly ({})", describe(st)),
        ),
    };
    tracing::info!("ongrid-skill up: {why}: stopping both daemons");
    // Both at once: the executor lets runs finish within their
    // deadlines while ongrid-skilld drains the requests waiting on them.
    shutdown.cancel();
    stop_both(&app, &mut signals, &mut executor, err).await;
    drop(parent_alive);
    let _ = serving.await;
    cleanup(&made);
    // The terminal may be gone (SIGHUP): the exit code says it all.
    let _ = if code == ExitCode::FAILURE {
        writeln!(err, "ongrid-skill up: {why}")
    } else {
        writeln!(err, "ongrid-skill up: stopped")
    };
    Ok(code)
}

/// Starts `ongrid-executor serve` on the generated configuration and waits
/// for its socket. Returns the child and the write end of its standard
/// input (see `serve`). On a failure the child is stopped and what was
/// written removed.
async fn start_executor(
    plan: &Plan,
    signals: &mut Signals,
    made: &Made,
) -> Result<(Child, Option<ChildStdin>), Failure> {
    let config_path = plan.runtime_dir.join(EXECUTOR_CONFIG);
    let executor_socket = plan.runtime_dir.join(EXECUTOR_SOCKET);
    let mut executor = match Command::new(&plan.executor_bin)
        .arg("serve")
        .arg("--config")
        .arg(&config_path)
        // Stops when this process ends, however it ends: the pipe's
        // write end is `parent_alive`, held until `up` returns.
        .arg("--stop-on-stdin-eof")
        // Its own socket, not one passed to `up`; and only `up` itself
        // may talk to a service manager it runs under.
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDNAMES")
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            cleanup(made);
            let bin = plan.executor_bin.display();
            return Err(Failure::start(format!("cannot start {bin}: {e}")));
        }
    };
    // Never written to; closed (by the kernel if need be) when `up` ends.
    let parent_alive = executor.stdin.take();
    let started = tokio::select! {
        r = wait_for_socket(&mut executor, &executor_socket) => r,
        _ = signals.term.recv() => Err(Failure::start("stopped (SIGTERM) during start-up")),
        _ = signals.int.recv() => Err(Failure::start("stopped (SIGINT) during start-up")),
        () = hangup(&mut signals.hup) => Err(Failure::start("stopped (SIGHUP) during start-up")),
    };
    if let Err(f) = started {
        stop_executor(&mut executor, EXECUTOR_STOP).await;
        cleanup(made);
        return Err(f);
    }
    Ok((executor, parent_alive))
}

/// Stops the executor, waiting for the runs in flight (as long as
/// skilld's drain may wait for them); a second SIGTERM or SIGINT kills it
/// at once.
async fn stop_both(app: &App, signals: &mut Signals, executor: &mut Child, err: &mut dyn Write) {
    let within = EXECUTOR_STOP.max(app.longest_run() + EXECUTOR_STOP_MARGIN);
    let in_flight = app.metrics().runs_in_flight.get();
    if in_flight > 0 {
        let _ = writeln!(
            err,
            "ongrid-skill up: waiting for {in_flight} run(s) in flight to end (at most {} s); \
             Ctrl-C again to kill them now",
            app.longest_run().as_secs()
        );
    }
    // A second stop signal kills the executor: its watchdog kills the
    // runs and removes their directories and cgroups, and skilld's
    // drain ends with their connections.
    let Signals { term, int, .. } = signals;
    tokio::select! {
        () = stop_executor(executor, within) => {}
        _ = async { tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} } } => {
            tracing::warn!("ongrid-skill up: stopping now; the runs in flight are killed");
            let _ = executor.kill().await;
        }
    }
}

/// The ready lines: what runs where, and the lines to try.
fn print_ready(
    plan: &Plan,
    app: &App,
    executor_pid: Option<u32>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let snapshot = app.registry().current();
    let names: Vec<String> = snapshot.iter().map(|s| s.name().to_owned()).collect();
    let sock = plan.runtime_dir.join(SKILLD_SOCKET);
    let sock = shell_quote(&sock.display().to_string());
    let me = std::env::current_exe()
        .ok()
        .map_or_else(|| "ongrid-skill".to_owned(), |p| p.display().to_string());
    let me = shell_quote(&me);
    let pid = executor_pid.map_or_else(|| "?".to_owned(), |p| p.to_string());
    writeln!(out, "ongrid-skill up: ready")?;
    if is_root() {
        writeln!(out, "  executor   pid {pid}, as root")?;
    } else {
        writeln!(
            out,
            "  executor   pid {pid}, as uid {} (not root: skills keep this uid and get no \
             cgroup; each report's sandbox.degraded says what was not enforced)",
            nix_uid()
        )?;
    }
    writeln!(out, "  registry   {} skills: {}", names.len(), names.join(", "))?;
    for root in &plan.roots {
        writeln!(out, "  skills     {}", root.display())?;
    }
    writeln!(out, "  runtime    {}", plan.runtime_dir.display())?;
    writeln!(out, "  audit      {}", plan.settings.audit.db.display())?;
    let me_caller = app.authz().identify(&crate::daemon::connection::Caller {
        uid: nix_uid(),
        gid: nix::unistd::getgid().as_raw(),
        pid: None,
    });
    writeln!(
        out,
        "  you        uid {}: role {}, {} ({} approvers configured)",
        me_caller.uid,
        me_caller.role,
        me_caller.mode,
        app.authz().approvers().len()
    )?;
    if let Some(m) = plan.metrics {
        writeln!(out, "  metrics    http://{m}/metrics")?;
    }
    writeln!(out)?;
    writeln!(out, "Try:")?;
    writeln!(out, "  curl --unix-socket {sock} http://localhost/v1/skills")?;
    let pick = |wanted: &str| names.iter().find(|n| *n == wanted).cloned();
    let skill = try_skill(snapshot.iter().map(|s| s.registered().manifest()));
    if let Some(skill) = &skill {
        writeln!(
            out,
            "  curl --unix-socket {sock} -d '{{\"args\":{{}}}}' http://localhost/v1/skills/{skill}/execute"
        )?;
    }
    writeln!(out, "  {me} list --socket {sock}")?;
    if let Some(skill) = &skill {
        writeln!(out, "  {me} run {skill} --socket {sock}")?;
    }
    if pick("echo").is_some() {
        writeln!(out, "  {me} run echo --args '{{\"message\":\"hi\"}}' --socket {sock}")?;
    }
    if let Some(m) = plan.metrics {
        writeln!(out, "  curl http://{m}/metrics")?;
    }
    writeln!(out)?;
    writeln!(out, "Ctrl-C stops both daemons.")?;
    Ok(())
}

/// The skill the printed run lines suggest, which send `{}` as its args:
/// `host_load` when served, else the first `safe` skill whose schema takes
/// `{}` (a skill with a required argument would answer the pasted line with
/// a 400, a `mutating` or `dangerous` one with a 403); none if no skill does.
fn try_skill<'a>(manifests: impl IntoIterator<Item = &'a policy::Manifest>) -> Option<String> {
    let takes_empty = |m: &policy::Manifest| {
        m.class() == policy::SkillClass::Safe
            && crate::scan::validators::compile(m.schema())
                .is_ok_and(|v| v.is_valid(&serde_json::json!({})))
    };
    let fits: Vec<&policy::Manifest> = manifests.into_iter().filter(|m| takes_empty(m)).collect();
    let host_load = fits.iter().find(|m| m.name().as_str() == "host_load");
    host_load.or_else(|| fits.first()).map(|m| m.name().as_str().to_owned())
}

fn describe(st: io::Result<ExitStatus>) -> String {
    match st {
        Ok(st) => st.to_string(),
        Err(e) => e.to_string(),
    }
}

/// Waits until the executor accepts connections on `socket`.
async fn wait_for_socket(child: &mut Child, socket: &Path) -> Result<(), Failure> {
    let deadline = Instant::now() + EXECUTOR_START;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(Failure::start(format!(
                "ongrid-executor exited during start-up ({st}); see its messages above"
            )));
        }
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Failure::start(format!(
                "ongrid-executor did not open {} within {}s",
                socket.display(),
                EXECUTOR_START.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// SIGTERM to the executor, then wait (SIGKILL after `within`).
async fn stop_executor(child: &mut Child, within: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(within, child.wait()).await.is_err() {
        tracing::warn!("ongrid-executor did not stop within {within:?}; killing it");
        let _ = child.kill().await;
    }
}

/// Quotes `s` for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+:,@=".contains(&b)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/run/ongrid-up/skilld.sock"), "/run/ongrid-up/skilld.sock");
        assert_eq!(shell_quote("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn the_suggested_run_takes_empty_args() {
        let manifest = |name: &str, extra: &str| {
            let text = format!(r#"{{"name":"{name}","description":"d","entry":"run.sh"{extra}}}"#);
            policy::Manifest::from_slice(text.as_bytes(), &policy::ValidateOptions::default())
                .unwrap()
        };
        let required = r#","schema":{"type":"object","required":["who"]}"#;
        let needs_args = manifest("greet", required);
        let mutating = manifest("apply", r#","class":"mutating""#);
        let plain = manifest("zeta", "");
        let host_load = manifest("host_load", "");
        // The first name would answer `{}` with a 400, the second with a 403.
        assert_eq!(try_skill([&needs_args, &mutating, &plain]).as_deref(), Some("zeta"));
        assert_eq!(try_skill([&needs_args, &plain, &host_load]).as_deref(), Some("host_load"));
        assert_eq!(try_skill([&needs_args, &mutating]), None);
        assert_eq!(try_skill([]), None);
    }
}
