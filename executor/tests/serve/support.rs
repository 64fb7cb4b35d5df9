//! Helpers shared by the serve tests: a server on its own runtime, a
//! blocking line client, skills, the `serve` binary, metrics samples.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use executor::{Config, Engine, Metrics};
use serde_json::json;

pub(crate) const RUN_AS: &str = "ongrid-skill";

/// Whether runs can be sandboxed here (the kit's host-skip convention).
pub(crate) fn can_run() -> bool {
    testkit::can_run("serve tests")
}

pub(crate) use testkit::{dir_0755, wait_for};

/// Writes `<root>/<name>/{skill.json,run.sh}`; returns the manifest path.
pub(crate) fn skill(root: &Path, name: &str, class: &str, timeout: u32, script: &str) -> PathBuf {
    let extra = format!(r#","class":"{class}","timeout_seconds":{timeout}"#);
    testkit::write_pack(root, name, "run.sh", &extra, script).join("skill.json")
}

/// A server on its own runtime; dropping it shuts it down.
pub(crate) struct Server {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) socket: PathBuf,
    pub(crate) root: PathBuf,
    pub(crate) runtime_dir: PathBuf,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub(crate) done: Option<tokio::task::JoinHandle<()>>,
    pub(crate) _node: executor::server::SocketNode,
    pub(crate) _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Server {
    pub(crate) fn start(edit: impl FnOnce(&mut Config)) -> Server {
        let root = dir_0755();
        let runtime = dir_0755();
        let mut config = Config {
            roots: vec![root.path().to_owned()],
            runtime_dir: Some(runtime.path().to_owned()),
            socket: Some(runtime.path().join("executor.sock")),
            ..Config::default()
        };
        edit(&mut config);
        let config = config.for_serve();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_keep_alive(Duration::from_millis(100))
            .enable_all()
            .build()
            .unwrap();
        let registry = prometheus::Registry::new();
        let metrics = Arc::new(Metrics::new(&registry).unwrap());
        let socket = config.socket_path();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let engine = Arc::new(Engine::new(config).unwrap());
        let (listener, node) =
            rt.block_on(async { executor::server::bind(engine.config()) }).unwrap();
        let m = Arc::clone(&metrics);
        let done = rt.spawn(async move {
            executor::server::run(listener, engine, m, async {
                let _ = stopped.await;
            })
            .await;
        });
        Server {
            rt,
            socket,
            root: root.path().to_owned(),
            runtime_dir: runtime.path().to_owned(),
            metrics,
            stop: Some(stop),
            done: Some(done),
            _node: node,
            _dirs: (root, runtime),
        }
    }

    pub(crate) fn client(&self) -> Client {
        Client::connect(&self.socket)
    }

    /// Sends the shutdown signal.
    pub(crate) fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Waits up to `within` for `server::run` to return.
    pub(crate) fn finished_within(&mut self, within: Duration) -> bool {
        let done = self.done.take().unwrap();
        self.rt.block_on(async { tokio::time::timeout(within, done).await.is_ok() })
    }

    pub(crate) fn metrics(&self) -> String {
        self.metrics.render()
    }

    pub(crate) fn wait_in_flight(&self, n: i64) {
        wait_gauge("runs_in_flight", &self.metrics.runs_in_flight, n);
    }
}

/// A daemon started by a test, killed when the test ends early (a failed
/// assertion) so no server outlives it; one reaped already is left alone.
pub(crate) struct Spawned(pub(crate) std::process::Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `serve --config config` run as user nobody (65534), as an executor that
/// is not root runs: no cgroups, runs killed by process group.
pub(crate) fn spawn_serve_as_nobody(config: &Path) -> Spawned {
    Spawned(
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_ongrid-executor"))
            .args(["serve", "--config"])
            .arg(config)
            .env("ONGRID_LOG", "info")
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// The pids of the live (not zombie) processes whose command line holds
/// `marker`.
pub(crate) fn live_with(marker: &str) -> Vec<i32> {
    let procs = testkit::procs::with_cmdline(marker);
    procs.into_iter().filter(|p| p.state != 'Z').map(|p| p.pid).collect()
}

/// SIGTERM to a `serve` child.
pub(crate) fn sigterm(child: &std::process::Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
}

/// The executor at `socket` answers a `ping`.
pub(crate) fn pings(socket: &Path) -> bool {
    let mut c = Client::connect(socket);
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    c.recv()["result"]["ok"] == true
}

/// `<runtime>/executor.toml` for `serve` with `root` and its socket at
/// `<runtime>/x.sock`; returns (socket, config).
pub(crate) fn serve_config(root: &Path, runtime: &Path) -> (PathBuf, PathBuf) {
    let socket = runtime.join("x.sock");
    let config = runtime.join("executor.toml");
    let text = format!("roots = [{root:?}]\nruntime_dir = {runtime:?}\nsocket = {socket:?}\n");
    std::fs::write(&config, text).unwrap();
    (socket, config)
}

pub(crate) fn spawn_serve(config: &Path, stderr: std::process::Stdio) -> Spawned {
    spawn_serve_logging(config, stderr, Some("info"))
}

/// [`spawn_serve`] with `ONGRID_LOG` set to `log`, or unset (the
/// executor's default level).
pub(crate) fn spawn_serve_logging(
    config: &Path,
    stderr: std::process::Stdio,
    log: Option<&str>,
) -> Spawned {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ongrid-executor"));
    command.args(["serve", "--config"]).arg(config).stderr(stderr);
    match log {
        Some(level) => command.env("ONGRID_LOG", level),
        None => command.env_remove("ONGRID_LOG"),
    };
    Spawned(command.spawn().unwrap())
}

/// Waits for a child of this test process to end: its exit code and
/// signal. The other tests' engines reap "any child" of this process and
/// may take it first; the process-wide reaper then keeps its status.
pub(crate) fn wait_child(child: &mut std::process::Child) -> (Option<i32>, Option<i32>) {
    let pid = i32::try_from(child.id()).unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match child.try_wait() {
            Ok(Some(s)) => {
                return (s.code(), std::os::unix::process::ExitStatusExt::signal(&s));
            }
            Ok(None) => {}
            Err(_) => {
                if let Some(e) = executor::run::reaper::Reaper::global().collect(pid) {
                    return (e.code, e.signal);
                }
            }
        }
        assert!(Instant::now() < until, "child {pid} did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn wait_gauge(name: &str, gauge: &prometheus::IntGauge, n: i64) {
    let until = Instant::now() + Duration::from_secs(20);
    while gauge.get() != n {
        assert!(Instant::now() < until, "{name} never reached {n}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
        if let Some(done) = self.done.take() {
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), done).await });
        }
    }
}

pub(crate) use testkit::wire::Client;

/// The value of the sample `name` (with its labels, as rendered).
pub(crate) fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

pub(crate) fn runs_total(text: &str, skill: &str, outcome: &str) -> f64 {
    sample(text, &format!("ongrid_executor_runs_total{{outcome=\"{outcome}\",skill=\"{skill}\"}}"))
}

/// A marker unique to this test process and call site.
pub(crate) fn marker(n: u32) -> String {
    format!("{}.{:06}{}", 700 + n, std::process::id() % 1_000_000, n)
}
