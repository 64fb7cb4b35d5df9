//! `ongrid-executor serve` end to end: `server::run` in-process on a socket
//! in a temporary directory (and once the real binary), driven by plain
//! blocking clients. Every server runs on its own multi-thread runtime whose
//! blocking-pool threads exit after 100 ms idle, so a run spawned from such
//! a thread would be killed by its parent-death signal and fail the tests.
//!
//! Root only (the sandbox needs it); as another user each test prints SKIP.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use executor::config::PeerClasses;
use executor::{Config, Engine, Metrics};
use policy::wire::code;
use policy::SkillClass;
use serde_json::{json, Value};

const RUN_AS: &str = "ongrid-skill";

fn can_run() -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: serve tests need root (the sandbox switches users)");
        return false;
    }
    if nix::unistd::User::from_name(RUN_AS).ok().flatten().is_none() {
        eprintln!("SKIP: run-as user {RUN_AS} missing (scripts/test creates it)");
        return false;
    }
    true
}

fn dir_0755() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Writes `<root>/<name>/{skill.json,run.sh}`; returns the manifest path.
fn skill(root: &Path, name: &str, class: &str, timeout: u32, script: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = dir.join("skill.json");
    std::fs::write(
        &manifest,
        format!(
            r#"{{"name":"{name}","description":"t","entry":"run.sh","class":"{class}","timeout_seconds":{timeout}}}"#
        ),
    )
    .unwrap();
    let entry = dir.join("run.sh");
    std::fs::write(&entry, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755)).unwrap();
    manifest
}

/// A server on its own runtime; dropping it shuts it down.
struct Server {
    rt: tokio::runtime::Runtime,
    socket: PathBuf,
    root: PathBuf,
    runtime_dir: PathBuf,
    metrics: Arc<Metrics>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
    _node: executor::server::SocketNode,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Server {
    fn start(edit: impl FnOnce(&mut Config)) -> Server {
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

    fn client(&self) -> Client {
        Client::connect(&self.socket)
    }

    /// Sends the shutdown signal.
    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Waits up to `within` for `server::run` to return.
    fn finished_within(&mut self, within: Duration) -> bool {
        let done = self.done.take().unwrap();
        self.rt.block_on(async { tokio::time::timeout(within, done).await.is_ok() })
    }

    fn metrics(&self) -> String {
        self.metrics.render()
    }

    fn wait_in_flight(&self, n: i64) {
        wait_gauge("runs_in_flight", &self.metrics.runs_in_flight, n);
    }
}

/// A daemon started by a test, killed when the test ends early (a failed
/// assertion) so no server outlives it; one reaped already is left alone.
struct Spawned(std::process::Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// SIGTERM to a `serve` child.
fn sigterm(child: &std::process::Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
}

/// The executor at `socket` answers a `ping`.
fn pings(socket: &Path) -> bool {
    let mut c = Client::connect(socket);
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    c.recv()["result"]["ok"] == true
}

/// `<runtime>/executor.toml` for `serve` with `root` and its socket at
/// `<runtime>/x.sock`; returns (socket, config).
fn serve_config(root: &Path, runtime: &Path) -> (PathBuf, PathBuf) {
    let socket = runtime.join("x.sock");
    let config = runtime.join("executor.toml");
    let text = format!("roots = [{root:?}]\nruntime_dir = {runtime:?}\nsocket = {socket:?}\n");
    std::fs::write(&config, text).unwrap();
    (socket, config)
}

fn spawn_serve(config: &Path, stderr: std::process::Stdio) -> Spawned {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_ongrid-executor"))
        .args(["serve", "--config"])
        .arg(config)
        .env("ONGRID_LOG", "info")
        .stderr(stderr)
        .spawn()
        .unwrap();
    Spawned(child)
}

/// Waits for a child of this test process to end: its exit code and
/// signal. The other tests' engines reap "any child" of this process and
/// may take it first; the process-wide reaper then keeps its status.
fn wait_child(child: &mut std::process::Child) -> (Option<i32>, Option<i32>) {
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

fn wait_gauge(name: &str, gauge: &prometheus::IntGauge, n: i64) {
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

/// A blocking line client.
struct Client {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Client {
    fn connect(socket: &Path) -> Client {
        let stream = UnixStream::connect(socket).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Client { stream, reader }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    fn send(&mut self, v: &Value) {
        let mut line = serde_json::to_vec(v).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
    }

    fn execute(&mut self, id: u64, manifest: &Path, args: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "execute",
            "params": {"manifest": manifest, "args": args, "session_id": "t"}}));
    }

    /// The next line, or None at EOF.
    fn recv_opt(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => None,
            Ok(_) => Some(serde_json::from_str(&line).unwrap()),
            Err(e) => panic!("read: {e}"),
        }
    }

    fn recv(&mut self) -> Value {
        self.recv_opt().expect("connection closed")
    }

    /// Reads the stderr notifications, then the report.
    fn run_result(&mut self) -> (Vec<String>, Value) {
        let mut stderr = Vec::new();
        loop {
            let v = self.recv();
            if v["method"] == "stderr" {
                stderr.push(v["params"]["line"].as_str().unwrap().to_owned());
            } else {
                return (stderr, v);
            }
        }
    }
}

/// The value of the sample `name` (with its labels, as rendered).
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

fn runs_total(text: &str, skill: &str, outcome: &str) -> f64 {
    sample(text, &format!("ongrid_executor_runs_total{{outcome=\"{outcome}\",skill=\"{skill}\"}}"))
}

fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A marker unique to this test process and call site.
fn marker(n: u32) -> String {
    format!("{}.{:06}{}", 700 + n, std::process::id() % 1_000_000, n)
}

/// `ping` (with the longest run timeout, 600 s by default) and `metrics`
/// answer on one connection; the connection gauge counts it.
#[test]
fn ping_and_metrics() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let mut c = server.client();
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    let pong = json!({"ok": true, "max_timeout_seconds": 600});
    assert_eq!(c.recv(), json!({"jsonrpc": "2.0", "id": 1, "result": pong}));
    c.send(&json!({"jsonrpc": "2.0", "id": "m", "method": "metrics"}));
    let v = c.recv();
    assert_eq!(v["id"], "m");
    let text = v["result"]["text"].as_str().unwrap();
    assert_eq!(sample(text, "ongrid_executor_connections"), 1.0);
    assert_eq!(sample(text, "ongrid_executor_runs_in_flight"), 0.0);
    assert_eq!(sample(text, "ongrid_executor_peer_rejected_total"), 0.0);
    drop(c);
    wait_for("the connection gauge to drop", Duration::from_secs(5), || {
        server.metrics.connections.get() == 0
    });
}

/// A good `execute` streams stderr notifications in order, then the report;
/// the metrics count exactly; the run directory is gone.
#[test]
fn execute_streams_stderr_then_report() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let m = skill(&server.root, "echo", "safe", 5, "echo first >&2\necho second >&2\ncat\npwd >&2");
    let mut c = server.client();
    c.execute(7, &m, json!({"a": [1, 2]}));
    let (stderr, reply) = c.run_result();
    assert_eq!(stderr[..2], ["first", "second"]);
    let cwd = PathBuf::from(&stderr[2]);
    assert!(cwd.starts_with(server.runtime_dir.join("runs")), "{cwd:?}");
    assert_eq!(reply["id"], 7);
    let report = &reply["result"];
    assert_eq!(report["outcome"], "ok", "{report}");
    assert_eq!(report["skill"], "echo");
    assert_eq!(report["result"], json!({"a": [1, 2]}));
    assert_eq!(
        report["sandbox"]["uid"],
        nix::unistd::User::from_name(RUN_AS).unwrap().unwrap().uid.as_raw()
    );

    // Twice more on the same connection (the manifest cache hits).
    c.execute(8, &m, json!({}));
    assert_eq!(c.run_result().1["result"]["outcome"], "ok");
    c.execute(9, &m, json!([1]));
    assert_eq!(c.run_result().1["result"]["outcome"], "invalid_args");

    let text = server.metrics();
    assert_eq!(runs_total(&text, "echo", "ok"), 2.0);
    assert_eq!(runs_total(&text, "echo", "invalid_args"), 1.0);
    assert_eq!(sample(&text, "ongrid_executor_run_duration_seconds_count"), 3.0);
    assert_eq!(sample(&text, "ongrid_sandbox_setup_seconds_count"), 2.0);
    assert_eq!(sample(&text, "ongrid_executor_queue_wait_seconds_count"), 3.0);
    let landlock: f64 = ["full", "partial", "none"]
        .iter()
        .filter_map(|s| {
            let name = format!("ongrid_landlock_enforcement_total{{status=\"{s}\"}}");
            text.contains(&name).then(|| sample(&text, &name))
        })
        .sum();
    assert_eq!(landlock, 2.0);
    assert_eq!(sample(&text, "ongrid_executor_runs_in_flight"), 0.0);
    // Removed after the report (by the engine, maybe in the background).
    wait_for("the run directory to go", Duration::from_secs(5), || !cwd.exists());
}

/// What a served skill sees of its seccomp filter: the status fields, and
/// whether `socket(AF_UNIX)` and `unshare(CLONE_NEWUSER)` work (errno when
/// not). Served runs get the filter from the engine's spawner threads (a
/// child inherits it; `sys::spawner`), so this checks that path from the
/// inside, where the sandbox suite goes through the one-shot `run`.
const FILTER_PROBE: &str = r#"exec /usr/bin/python3 -c '
import ctypes, json, socket
st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
    sock = "ok"
except OSError as e:
    sock = e.errno
libc = ctypes.CDLL(None, use_errno=True)
un = "ok" if libc.unshare(0x10000000) == 0 else ctypes.get_errno()
print(json.dumps({"seccomp": st["Seccomp"].strip(), "filters": st["Seccomp_filters"].strip(),
                  "nnp": st["NoNewPrivs"].strip(), "socket": sock, "unshare": un,
                  "capbnd": st["CapBnd"].strip(), "capeff": st["CapEff"].strip()}))
'"#;

#[test]
fn served_runs_carry_the_filter_from_the_spawner_threads() {
    if !can_run() {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        println!("SKIP: served_runs_carry_the_filter_from_the_spawner_threads needs python3");
        return;
    }
    let server = Server::start(|c| {
        c.skills.insert(
            "netprobe".into(),
            policy::SkillGrant { network: true, ..policy::SkillGrant::default() },
        );
        c.skills.insert(
            "capprobe".into(),
            policy::SkillGrant {
                capabilities: vec!["CAP_NET_RAW".into()],
                ..policy::SkillGrant::default()
            },
        );
    });
    // The probe under `name`, its manifest asking for `sandbox`.
    let probe = |name: &str, sandbox: Value| {
        let m = skill(&server.root, name, "safe", 10, FILTER_PROBE);
        let mut manifest: Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
        manifest["sandbox"] = sandbox;
        std::fs::write(&m, manifest.to_string()).unwrap();
        m
    };
    let plain = skill(&server.root, "probe", "safe", 10, FILTER_PROBE);
    let net = probe("netprobe", json!({"network": true}));
    // Granted a capability: created without a spawner thread (whose
    // bounding set is empty), it keeps that one capability and no other.
    let cap = probe("capprobe", json!({"capabilities": ["CAP_NET_RAW"]}));
    let mut c = server.client();
    let eperm = json!(libc::EPERM);
    let none = json!("0000000000000000");
    let net_raw = json!(format!("{:016x}", 1u64 << 13)); // CAP_NET_RAW
    c.execute(200, &cap, json!({}));
    let report = c.run_result().1["result"].clone();
    assert_eq!(report["outcome"], "ok", "{report}");
    let seen = &report["result"];
    assert_eq!((&seen["capbnd"], &seen["capeff"]), (&net_raw, &net_raw), "{report}");
    assert_eq!((&seen["seccomp"], &seen["filters"]), (&json!("2"), &json!("1")), "{report}");
    // Several runs each, so more than one spawner thread serves them.
    for i in 0..4 {
        c.execute(i, &plain, json!({}));
        let report = c.run_result().1["result"].clone();
        assert_eq!(report["outcome"], "ok", "{report}");
        let seen = &report["result"];
        assert_eq!(seen["seccomp"], "2", "{report}");
        assert_eq!(seen["filters"], "1", "one filter, inherited, not two: {report}");
        assert_eq!(seen["nnp"], "1", "{report}");
        assert_eq!(seen["socket"], eperm, "socket(AF_UNIX) without the network grant: {report}");
        assert_eq!(seen["unshare"], eperm, "unshare(CLONE_NEWUSER): {report}");
        assert_eq!((&seen["capbnd"], &seen["capeff"]), (&none, &none), "{report}");

        c.execute(100 + i, &net, json!({}));
        let report = c.run_result().1["result"].clone();
        assert_eq!(report["outcome"], "ok", "{report}");
        let seen = &report["result"];
        assert_eq!((&seen["seccomp"], &seen["filters"]), (&json!("2"), &json!("1")), "{report}");
        assert_eq!(seen["socket"], "ok", "socket with the network grant: {report}");
        assert_eq!(seen["unshare"], eperm, "unshare with the network grant: {report}");
    }
}

/// A run slot keeps the Landlock rulesets built in it, and a later run of
/// the same policy there takes one instead of building it; it still
/// confines (a directory every user may write stays out of reach, the run's
/// own directory in the slot is writable), and a skill granted that
/// directory in the same slots gets its own ruleset, whose grant the first
/// skill never gets. The counts are the metric's.
#[test]
fn cached_rulesets_confine_and_serve_only_their_own_policy() {
    if !can_run() {
        return;
    }
    if executor::run::spawn::Host::detect().landlock_abi == 0 {
        println!("SKIP: cached_rulesets_confine_and_serve_only_their_own_policy needs Landlock");
        return;
    }
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let target = open.path().to_owned();
    let server = Server::start({
        let target = target.clone();
        move |c| {
            c.skills.insert(
                "granted".into(),
                policy::SkillGrant { fs_write: vec![target], ..policy::SkillGrant::default() },
            );
        }
    });
    let script = format!(
        "cat >/dev/null\n\
         if echo x > {t}/f.$$ 2>/dev/null; then d=true; else d=false; fi\n\
         if echo x > ./mine 2>/dev/null; then c=true; else c=false; fi\n\
         printf '{{\"d\":%s,\"c\":%s,\"cwd\":\"%s\"}}\\n' \"$d\" \"$c\" \"$(pwd)\"",
        t = target.display()
    );
    let plain = skill(&server.root, "plain", "safe", 10, &script);
    let granted = skill(&server.root, "granted", "safe", 10, &script);
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&granted).unwrap()).unwrap();
    manifest["sandbox"] = json!({"fs_write": [target]});
    std::fs::write(&granted, manifest.to_string()).unwrap();
    let mut c = server.client();
    let mut id = 0;
    let mut run = |c: &mut Client, manifest: &Path| -> Value {
        id += 1;
        c.execute(id, manifest, json!({}));
        let report = c.run_result().1["result"].clone();
        assert_eq!(report["outcome"], "ok", "{report}");
        // The janitor has given the slot's directory a new run directory
        // (or removed it) before the next run takes a slot.
        let cwd = PathBuf::from(report["result"]["cwd"].as_str().unwrap());
        let home = cwd.parent().unwrap().to_owned();
        wait_for("the slot to be renewed", Duration::from_secs(10), || {
            !cwd.exists() && std::fs::read_dir(&home).map_or(true, |mut d| d.next().is_some())
        });
        report["result"].clone()
    };
    let rulesets = |c: &mut Client| {
        c.send(&json!({"jsonrpc": "2.0", "id": "m", "method": "metrics"}));
        let text = c.recv()["result"]["text"].as_str().unwrap().to_owned();
        let n =
            |how: &str| sample(&text, &format!("ongrid_landlock_rulesets_total{{how=\"{how}\"}}"));
        (n("built"), n("reused"))
    };
    assert_eq!(rulesets(&mut c), (0.0, 0.0));
    for _ in 0..6 {
        for (manifest, may_write) in [(&plain, false), (&granted, true), (&plain, false)] {
            let seen = run(&mut c, manifest);
            assert_eq!(seen["d"], json!(may_write), "{}: {seen}", manifest.display());
            assert_eq!(seen["c"], json!(true), "the run directory: {seen}");
        }
    }
    let (built, reused) = rulesets(&mut c);
    assert_eq!(built + reused, 18.0, "built {built}, reused {reused}");
    assert!(reused > 0.0, "no ruleset reused in 18 runs (built {built})");
    // Every run after the janitor started (the second) found a slot ready,
    // since each waited for its slot to be renewed.
    c.send(&json!({"jsonrpc": "2.0", "id": "m", "method": "metrics"}));
    let text = c.recv()["result"]["text"].as_str().unwrap().to_owned();
    let slots =
        |how: &str| sample(&text, &format!("ongrid_executor_run_slots_total{{how=\"{how}\"}}"));
    let (ready, recycled, made) = (slots("ready"), slots("recycled"), slots("made"));
    assert_eq!(ready + recycled + made, 18.0, "ready {ready}, recycled {recycled}, made {made}");
    assert!((1.0..=2.0).contains(&made) && recycled == 0.0, "{text}");
}

/// Malformed lines get JSON-RPC errors (with the id when readable) and the
/// connection keeps working; an oversized line is skipped up to its newline.
#[test]
fn malformed_lines_get_errors_and_the_connection_survives() {
    if !can_run() {
        return;
    }
    let server = Server::start(|c| c.max_line_bytes = 4096);
    let m = skill(&server.root, "ok", "safe", 5, "cat");
    let mut c = server.client();
    let cases: Vec<(Vec<u8>, i64, Value)> = vec![
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"pi".to_vec(), code::PARSE_ERROR, Value::Null),
        (b"\xff\xfe{}".to_vec(), code::PARSE_ERROR, Value::Null),
        (b"[1,2]".to_vec(), code::INVALID_REQUEST, Value::Null),
        (br#"{"jsonrpc":"2.0","method":"ping"}"#.to_vec(), code::INVALID_REQUEST, Value::Null),
        (br#"{"jsonrpc":"2.0","id":2,"method":"rm -rf"}"#.to_vec(), code::METHOD_NOT_FOUND, json!(2)),
        (br#"{"jsonrpc":"2.0","id":3,"method":"execute","params":{"manifest":5,"args":{}}}"#.to_vec(), code::INVALID_PARAMS, json!(3)),
        (br#"{"jsonrpc":"2.0","id":4,"method":"execute","params":{"manifest":"/x","args":{},"uid":0}}"#.to_vec(), code::INVALID_PARAMS, json!(4)),
        (br#"{"jsonrpc":"2.0","id":5,"method":"execute","params":{"manifest":"/x","args":{},"class":"root"}}"#.to_vec(), code::INVALID_PARAMS, json!(5)),
        (vec![b'x'; 10_000], code::LINE_TOO_LONG, Value::Null),
    ];
    for (line, want, id) in &cases {
        let mut l = line.clone();
        l.push(b'\n');
        c.send_raw(&l);
        let v = c.recv();
        assert_eq!(v["error"]["code"], json!(want), "{:?}: {v}", String::from_utf8_lossy(line));
        assert_eq!(&v["id"], id);
    }
    // An oversized line sent in pieces, then blank lines (ignored).
    c.send_raw(&vec![b'{'; 3000]);
    c.send_raw(&vec![b'"'; 3000]);
    c.send_raw(b"\n\n \n");
    assert_eq!(c.recv()["error"]["code"], json!(code::LINE_TOO_LONG));
    c.send(&json!({"jsonrpc": "2.0", "id": 6, "method": "ping"}));
    assert_eq!(c.recv()["result"]["ok"], true);
    c.execute(7, &m, json!({"still": "working"}));
    assert_eq!(c.run_result().1["result"]["result"], json!({"still": "working"}));
    let text = server.metrics();
    assert_eq!(runs_total(&text, "ok", "ok"), 1.0);
    assert_eq!(sample(&text, "ongrid_executor_run_duration_seconds_count"), 1.0);
}

/// A manifest outside the roots, a relative path, a missing file, a FIFO
/// (which once blocked an executor thread in `open`) and a directory are
/// `rejected` before any slot is taken, counted with `skill=""`.
#[test]
fn manifests_outside_the_roots_are_rejected() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let elsewhere = dir_0755();
    let outside = skill(elsewhere.path(), "outside", "safe", 5, "cat");
    std::fs::create_dir_all(server.root.join("fifo")).unwrap();
    let fifo = server.root.join("fifo/skill.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let dir = server.root.join("dir/skill.json");
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = server.client();
    for (i, path) in [
        outside.clone(),
        PathBuf::from("outside/skill.json"),
        server.root.join("nope/skill.json"),
        server.root.join("../outside/skill.json"),
        fifo,
        dir,
    ]
    .iter()
    .enumerate()
    {
        c.execute(i as u64, path, json!({}));
        let (_, v) = c.run_result();
        assert_eq!(v["result"]["outcome"], "rejected", "{path:?}: {v}");
    }
    let text = server.metrics();
    assert_eq!(runs_total(&text, "", "rejected"), 6.0);
    assert_eq!(sample(&text, "ongrid_executor_run_duration_seconds_count"), 0.0);
}

/// `[[peers]]` restricts the classes a peer uid may run, by the class the
/// executor reads; a class claim that differs from the manifest is denied.
#[test]
fn classes_not_allowed_for_the_peer_are_denied() {
    if !can_run() {
        return;
    }
    let server = Server::start(|c| {
        c.peers = vec![PeerClasses { uid: Some(0), user: None, classes: vec![SkillClass::Safe] }];
    });
    let mutating = skill(&server.root, "mut", "mutating", 5, "cat");
    let safe = skill(&server.root, "safe", "safe", 5, "cat");
    let mut c = server.client();
    c.execute(1, &mutating, json!({}));
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "denied", "{v}");
    assert!(v["result"]["error"].as_str().unwrap().contains("may not run mutating"));
    c.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "execute",
        "params": {"manifest": safe, "args": {}, "class": "dangerous"}}));
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "denied", "{v}");
    c.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "execute",
        "params": {"manifest": safe, "args": {}, "class": "safe"}}));
    assert_eq!(c.run_result().1["result"]["outcome"], "ok");
    let text = server.metrics();
    assert_eq!(runs_total(&text, "mut", "denied"), 1.0);
    assert_eq!(runs_total(&text, "safe", "denied"), 1.0);
    assert_eq!(runs_total(&text, "safe", "ok"), 1.0);
}

/// Beyond `max_concurrent_runs` + `max_queued_runs` an `execute` gets the
/// BUSY error at once; a queued run is told so (`queued`), and starts
/// (`started`) when a slot frees up.
#[test]
fn busy_beyond_the_cap_and_the_queue() {
    if !can_run() {
        return;
    }
    let server = Server::start(|c| {
        c.max_concurrent_runs = 1;
        c.max_queued_runs = 1;
    });
    let mark = marker(1);
    let slow = skill(&server.root, "slow", "safe", 30, &format!("exec sleep {mark}"));
    let quick = skill(&server.root, "quick", "safe", 5, "echo '{\"q\":1}'");
    let mut a = server.client();
    a.execute(1, &slow, json!({}));
    server.wait_in_flight(1);
    let mut b = server.client();
    b.execute(2, &quick, json!({}));
    wait_gauge("runs_queued", &server.metrics.runs_queued, 1);
    let queued_at = Instant::now();
    // B is told it waits for a slot (A was not).
    let v = b.recv();
    assert_eq!((&v["method"], &v["params"]["id"]), (&json!("queued"), &json!(2)), "{v}");
    let mut c = server.client();
    c.execute(3, &quick, json!({}));
    let v = c.recv();
    assert_eq!(v["id"], 3);
    assert_eq!(v["error"]["code"], json!(code::BUSY), "{v}");
    // Closing A kills its run; B's queued run takes the slot.
    std::thread::sleep(Duration::from_millis(100));
    let queued_for = queued_at.elapsed().as_secs_f64();
    drop(a);
    let v = b.recv();
    assert_eq!((&v["method"], &v["params"]["id"]), (&json!("started"), &json!(2)), "{v}");
    let (_, v) = b.run_result();
    assert_eq!(v["result"]["outcome"], "ok", "{v}");
    assert!(common::procs_with(&mark).is_empty());
    let text = server.metrics();
    assert_eq!(runs_total(&text, "quick", "busy"), 1.0);
    assert_eq!(runs_total(&text, "quick", "ok"), 1.0);
    assert_eq!(runs_total(&text, "slow", "signaled"), 1.0);
    assert_eq!(sample(&text, "ongrid_executor_queue_wait_seconds_count"), 2.0);
    let waited = sample(&text, "ongrid_executor_queue_wait_seconds_sum");
    assert!(waited >= queued_for, "B waited in the queue {waited} s, at least {queued_for} s");
    assert_eq!(server.metrics.runs_queued.get(), 0);
}

/// Closing the connection mid-run kills the run's process tree.
#[test]
fn closing_the_connection_kills_its_run() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let mark = marker(2);
    // A child of the skill, in the background: the whole tree must go.
    let m = skill(
        &server.root,
        "sleeper",
        "safe",
        60,
        &format!("echo started >&2\nsleep {mark} &\nexec sleep {mark}"),
    );
    let mut c = server.client();
    c.execute(1, &m, json!({}));
    assert_eq!(c.recv()["params"]["line"], "started");
    wait_for("the marker processes", Duration::from_secs(5), || {
        common::procs_with(&mark).len() == 2
    });
    drop(c);
    wait_for("the run to be killed", Duration::from_secs(5), || {
        common::procs_with(&mark).is_empty()
    });
    server.wait_in_flight(0);
    wait_for("the run to be counted", Duration::from_secs(5), || {
        server.metrics().contains("outcome=\"signaled\",skill=\"sleeper\"} 1")
    });
}

/// A held `execute` is checked and prepared, but its skill starts only on
/// the `start` naming it (a stamp taken before the `start` is not later
/// than the skill's clock); the wait is not counted as setup or duration;
/// a `start` for another id starts nothing; a second held run with the
/// same id replaces the first; a held run whose connection closes never
/// runs and is not counted; one never started ends `rejected` after
/// `hold_timeout_seconds`.
#[test]
fn held_runs_spawn_only_on_their_start() {
    if !can_run() {
        return;
    }
    let server = Server::start(|c| c.hold_timeout_seconds = 2);
    let m =
        skill(&server.root, "stamp", "safe", 5, "printf '{\"t\":%s}\\n' \"$(/bin/date +%s%N)\"");
    let unix_ns =
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let held = |c: &mut Client, id: u64| {
        c.send(&json!({"jsonrpc": "2.0", "id": id, "method": "execute",
            "params": {"manifest": m, "args": {}, "hold": true}}));
    };
    let start = |c: &mut Client, id: u64| {
        c.send(&json!({"jsonrpc": "2.0", "method": "start", "params": {"id": id}}));
    };

    let mut c = server.client();
    let sent = Instant::now();
    held(&mut c, 1);
    wait_gauge("runs_held", &server.metrics.runs_held, 1);
    let prepared = sent.elapsed();
    start(&mut c, 99);
    std::thread::sleep(Duration::from_millis(300));
    let before = unix_ns();
    let started = Instant::now();
    start(&mut c, 1);
    let (_, v) = c.run_result();
    let answered = started.elapsed();
    let report = &v["result"];
    assert_eq!(v["id"], 1);
    assert_eq!(report["outcome"], "ok", "{report}");
    let t = report["result"]["t"].as_u64().unwrap();
    assert!(
        u128::from(t) >= before,
        "the skill ran {} ms before its start",
        (before - u128::from(t)) / 1_000_000
    );
    // Bounds from the client's own clock, whatever the host's load. Both
    // figures count the preparation before the hold plus time after the
    // start: setup up to the spawn, duration up to the exit. The
    // preparation ends before the held gauge shows the run, the rest lies
    // between the start and the answer; a counted hold (the 300 ms sleep,
    // in neither window) would not fit.
    let setup = Duration::from_micros(report["setup_us"].as_u64().unwrap());
    let duration = Duration::from_millis(report["duration_ms"].as_u64().unwrap());
    assert!(
        setup <= prepared + answered,
        "the hold counted as setup ({prepared:?} to prepare, {answered:?} from start to answer): {report}"
    );
    assert!(
        duration <= setup + answered,
        "the hold counted as duration ({answered:?} from start to answer): {report}"
    );

    // A second held run with the same id replaces the first, which ends
    // unstarted; the start then goes to the second.
    held(&mut c, 5);
    server.wait_in_flight(1);
    held(&mut c, 5);
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "rejected", "{v}");
    start(&mut c, 5);
    let (_, v) = c.run_result();
    assert_eq!((&v["id"], &v["result"]["outcome"]), (&json!(5), &json!("ok")), "{v}");

    // Held, then the connection closes: nothing runs, nothing is counted.
    held(&mut c, 2);
    server.wait_in_flight(1);
    drop(c);
    server.wait_in_flight(0);
    // Held and never started: rejected once the hold times out.
    let mut c = server.client();
    let asked = Instant::now();
    held(&mut c, 3);
    let (_, v) = c.run_result();
    assert!(asked.elapsed() >= Duration::from_secs(2), "{v}");
    assert_eq!(v["result"]["outcome"], "rejected", "{v}");
    assert!(v["result"]["error"].as_str().unwrap().contains("not started"), "{v}");

    let text = server.metrics();
    assert_eq!(runs_total(&text, "stamp", "ok"), 2.0);
    assert_eq!(runs_total(&text, "stamp", "rejected"), 2.0);
    assert_eq!(sample(&text, "ongrid_sandbox_setup_seconds_count"), 2.0);
}

/// `dynmods::ensure` (what `serve` runs at start) turns `favordynmods` on
/// for a cgroup hierarchy that lacks it, keeping its other options, and
/// then finds it on. The option is first taken off every hierarchy here.
#[test]
fn favordynmods_is_turned_on_and_other_options_kept() {
    use executor::host::dynmods::{self, Favor};
    if !can_run() {
        return;
    }
    let mounts =
        || dynmods::cgroup_mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    let before = mounts();
    if before.is_empty() {
        println!("SKIP: favordynmods_is_turned_on_and_other_options_kept: no cgroup mounted");
        return;
    }
    for m in before.iter().filter(|m| m.favors_dynmods()) {
        let data: Vec<&str> = m
            .super_opts
            .split(',')
            .filter(|o| !matches!(*o, "rw" | "ro" | dynmods::OPTION))
            .collect();
        nix::mount::mount(
            None::<&str>,
            &m.target,
            Some(m.fstype.as_str()),
            m.remount_flags(),
            Some(data.join(",").as_str()),
        )
        .unwrap();
    }
    let cleared = mounts();
    assert!(cleared.iter().all(|m| !m.favors_dynmods()), "{cleared:?}");
    let Favor::Enabled(at) = dynmods::ensure().unwrap() else { panic!("not enabled") };
    let after = mounts();
    let was = cleared.iter().find(|m| m.target == at).unwrap();
    let now = after.iter().find(|m| m.target == at).unwrap();
    assert!(now.favors_dynmods(), "{now:?}");
    assert_eq!(now.mount_opts, was.mount_opts);
    let options = |m: &dynmods::CgroupMount| {
        let mut v: Vec<String> =
            m.super_opts.split(',').filter(|o| *o != dynmods::OPTION).map(str::to_owned).collect();
        v.sort();
        v
    };
    assert_eq!(options(now), options(was));
    assert_eq!(dynmods::ensure().unwrap(), Favor::Already(at));
    assert!(Config::default().cgroup_favordynmods, "on by default");
}

/// A client that shuts down only its write side still gets its report.
#[test]
fn half_closed_connection_keeps_its_run() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let m = skill(&server.root, "half", "safe", 10, "sleep 0.3\necho '{\"done\":true}'");
    let mut c = server.client();
    c.execute(1, &m, json!({}));
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "ok", "{v}");
    assert_eq!(c.recv_opt(), None, "the executor closes once the run is done");
}

/// Runs multiplexed on one connection whose peer does not read: a run is
/// still supervised (its timeout fires, its process is killed) while a
/// report far larger than the socket buffer waits to be written, and both
/// answers arrive intact once the peer reads.
#[test]
fn a_peer_that_does_not_read_stalls_no_run() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let mark = marker(9);
    let slow = skill(&server.root, "stuck", "safe", 1, &format!("exec sleep {mark}"));
    // A 2 MB result: about ten times what the socket buffers hold.
    let big = skill(
        &server.root,
        "big",
        "safe",
        10,
        "printf '{\"s\":\"'; head -c 2000000 /dev/zero | tr '\\0' a; printf '\"}'",
    );
    let mut c = server.client();
    c.execute(1, &slow, json!({}));
    c.execute(2, &big, json!({}));
    // Nothing is read until the first run has timed out and been counted.
    wait_for("the big run to be counted", Duration::from_secs(10), || {
        server.metrics().contains("outcome=\"ok\",skill=\"big\"} 1")
    });
    wait_for("the stuck run to time out", Duration::from_secs(10), || {
        server.metrics().contains("outcome=\"timeout\",skill=\"stuck\"} 1")
    });
    assert!(common::procs_with(&mark).is_empty(), "the timed-out run's process is gone");
    let mut replies: Vec<Value> = vec![c.run_result().1, c.run_result().1];
    replies.sort_by_key(|v| v["id"].as_u64());
    assert_eq!(replies[0]["result"]["outcome"], "timeout", "{}", replies[0]);
    assert_eq!(replies[1]["result"]["outcome"], "ok");
    let s = replies[1]["result"]["result"]["s"].as_str().unwrap();
    assert_eq!(s.len(), 2_000_000);
    assert!(s.bytes().all(|b| b == b'a'));
}

/// A run longer than the blocking pool's keep-alive (100 ms here, 10 s by
/// default) is not killed by its parent-death signal: runs are spawned from
/// runtime worker threads, never from blocking-pool threads.
#[test]
fn runs_outlive_the_blocking_pool_keep_alive() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    // Give the blocking pool threads to retire while the run goes on.
    server.rt.block_on(async {
        for _ in 0..4 {
            let _ = tokio::task::spawn_blocking(|| ()).await;
        }
    });
    let m = skill(&server.root, "long", "safe", 10, "sleep 1.5\necho '{\"slept\":1.5}'");
    let mut c = server.client();
    c.execute(1, &m, json!({}));
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "ok", "{v}");
}

fn python_client(socket: &Path) -> std::process::Output {
    const SCRIPT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
except OSError:
    pass
s.settimeout(10)
data = b""
while True:
    try:
        d = s.recv(65536)
    except OSError:
        break
    if not d:
        break
    data += d
    if b"ok" in data:
        break
sys.stdout.write(data.decode())
"#;
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"])
        .arg(SCRIPT)
        .arg(socket)
        .output()
        .unwrap()
}

/// A peer whose uid and gid are not allowed gets FORBIDDEN and the
/// connection closes; the same peer listed in allowed_uids is served.
#[test]
fn peers_not_allowed_are_refused() {
    if !can_run() {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        eprintln!("SKIP: /usr/bin/python3 missing");
        return;
    }
    let server = Server::start(|c| {
        c.allowed_uids = Some(vec![0]);
        c.allowed_gids = Some(vec![0]);
        c.socket_mode = "0666".into();
    });
    let out = python_client(&server.socket);
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text:?} {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["error"]["code"], json!(code::FORBIDDEN), "{v}");
    assert_eq!(v["id"], Value::Null);
    assert!(v["error"]["message"].as_str().unwrap().contains("uid 65534"));
    let text = server.metrics();
    assert_eq!(sample(&text, "ongrid_executor_peer_rejected_total"), 1.0);
    assert_eq!(sample(&text, "ongrid_executor_connections"), 0.0);
    // Root is still served.
    let mut c = server.client();
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    assert_eq!(c.recv()["result"]["ok"], true);

    let allowed = Server::start(|c| {
        c.allowed_uids = Some(vec![65534]);
        c.allowed_gids = Some(vec![]);
        c.socket_mode = "0666".into();
    });
    let out = python_client(&allowed.socket);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["result"]["ok"], true, "{v}");
    assert_eq!(sample(&allowed.metrics(), "ongrid_executor_peer_rejected_total"), 0.0);
}

/// Shutdown: the socket stops accepting, new and queued runs get BUSY,
/// runs in flight finish (a slow one by its own deadline), then `run`
/// returns.
#[test]
fn shutdown_drains_runs_then_returns() {
    if !can_run() {
        return;
    }
    let mut server = Server::start(|_| {});
    // It runs until the test says go, so it is in flight whatever the load.
    let go = server.root.join("finishing").join("go");
    let script =
        format!("while [ ! -e {} ]; do sleep 0.05; done\necho '{{\"f\":1}}'", go.display());
    let finishing = skill(&server.root, "finishing", "safe", 10, &script);
    let mark = marker(3);
    let stuck = skill(&server.root, "stuck", "safe", 1, &format!("exec sleep {mark}"));
    let mut a = server.client();
    a.execute(1, &finishing, json!({}));
    let mut b = server.client();
    b.execute(2, &stuck, json!({}));
    server.wait_in_flight(2);
    let stopped_at = Instant::now();
    server.shutdown();
    wait_for("the socket to refuse connections", Duration::from_secs(2), || {
        UnixStream::connect(&server.socket).is_err()
    });
    // The connection with a run in flight still answers, but runs no more.
    a.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}));
    assert_eq!(a.recv()["result"]["ok"], true);
    a.execute(4, &finishing, json!({}));
    let v = a.recv();
    assert_eq!((v["id"].clone(), v["error"]["code"].clone()), (json!(4), json!(code::BUSY)));
    std::fs::write(&go, "").unwrap();
    let (_, v) = a.run_result();
    assert_eq!((v["id"].clone(), v["result"]["outcome"].clone()), (json!(1), json!("ok")));
    assert_eq!(a.recv_opt(), None, "closed once its runs are done");
    let (_, v) = b.run_result();
    assert_eq!(v["result"]["outcome"], "timeout", "{v}");
    assert!(server.finished_within(Duration::from_secs(5)));
    assert!(stopped_at.elapsed() < Duration::from_secs(6));
    assert!(common::procs_with(&mark).is_empty());
    let text = server.metrics();
    assert_eq!(runs_total(&text, "finishing", "ok"), 1.0);
    assert_eq!(runs_total(&text, "finishing", "busy"), 1.0);
    assert_eq!(runs_total(&text, "stuck", "timeout"), 1.0);
}

/// Shutdown is bounded by `drain_timeout_seconds` as well as by the
/// longest run: a run with a 30 s timeout in flight at SIGTERM is killed
/// once the drain's 1 s is up, and the server returns, leaving no process
/// (before: the drain waited for `max_timeout_seconds` and more, 607 s by
/// default, past the unit's stop timeout).
#[test]
fn shutdown_drain_is_bounded_by_drain_timeout_seconds() {
    if !can_run() {
        return;
    }
    let mut server = Server::start(|c| c.drain_timeout_seconds = 1);
    let mark = marker(5);
    let long = skill(&server.root, "long", "safe", 30, &format!("exec sleep {mark}"));
    let mut a = server.client();
    a.execute(1, &long, json!({}));
    server.wait_in_flight(1);
    let stopped_at = Instant::now();
    server.shutdown();
    assert!(server.finished_within(Duration::from_secs(8)), "the drain outlived its bound");
    let took = stopped_at.elapsed();
    assert!(took >= Duration::from_secs(1), "the run was not given its drain: {took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(common::procs_with(&mark).is_empty(), "the run outlived the executor");
}

/// On start the server removes run directories (without following
/// symlinks) and kills and removes the cgroups a crash left.
#[test]
fn start_up_sweeps_crash_leftovers() {
    if !can_run() {
        return;
    }
    let runtime = dir_0755();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), "x").unwrap();
    let id = format!("dead{:012x}", std::process::id());
    let run_dir = runtime.path().join("runs").join(&id);
    std::fs::create_dir_all(&run_dir).unwrap();
    std::os::unix::fs::symlink(outside.path(), run_dir.join("link")).unwrap();
    std::fs::write(run_dir.join("file"), "x").unwrap();

    let (h, _) = executor::sandbox::cgroup::Hierarchies::detect();
    let mark = marker(4);
    let mut orphan = std::process::Command::new("sleep").arg(&mark).spawn().unwrap();
    let mut leaves = Vec::new();
    for base in [&h.v2, &h.v1_pids, &h.v1_memory].into_iter().flatten() {
        let leaf = base.join(&id);
        std::fs::create_dir(&leaf).unwrap();
        std::fs::write(leaf.join("cgroup.procs"), orphan.id().to_string()).unwrap();
        leaves.push(leaf);
    }
    // An old, empty leaf without a run directory (a crash mid-setup).
    let stale = h.v2.as_ref().map(|b| b.join(format!("{id}-stale")));
    let mut stale_aged = false;
    if let Some(stale) = &stale {
        std::fs::create_dir(stale).unwrap();
        let old = nix::sys::time::TimeVal::new(1_000_000_000, 0);
        stale_aged = nix::sys::stat::utimes(stale, &old, &old).is_ok()
            && std::fs::metadata(stale).unwrap().mtime() == 1_000_000_000;
    }

    let rt_path = runtime.path().to_owned();
    let server = Server::start(|c| c.runtime_dir = Some(rt_path));
    let mut c = server.client();
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    assert_eq!(c.recv()["result"]["ok"], true, "the sweep ran before serving");
    if !leaves.is_empty() {
        // (No status at all: another test's engine reaped it as an
        // orphan; it ended long before its `sleep`, so it was killed too.)
        let status = wait_child(&mut orphan);
        assert!(
            matches!(status, (_, Some(libc::SIGKILL)) | (None, None)),
            "the leftover process was killed: {status:?}"
        );
        assert!(common::procs_with(&mark).is_empty());
    } else {
        let _ = orphan.kill();
        wait_child(&mut orphan);
    }
    for leaf in &leaves {
        assert!(!leaf.exists(), "{} removed", leaf.display());
    }
    assert!(!run_dir.exists());
    assert!(outside.path().join("keep").exists(), "symlink not followed");
    if let Some(stale) = stale {
        if stale_aged {
            assert!(!stale.exists(), "old empty leaf removed");
        } else {
            eprintln!("note: cannot age a cgroup's mtime here; old-leaf sweep not checked");
            let _ = std::fs::remove_dir(stale);
        }
    }
}

/// The socket node gets the configured mode and group; a stale socket is
/// replaced, anything else at the path is left alone and refused.
#[test]
fn socket_node_mode_group_and_stale_files() {
    if !can_run() {
        return;
    }
    let dir = dir_0755();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let path = dir.path().join("sub/executor.sock");
    let config =
        Config { socket: Some(path.clone()), socket_mode: "0640".into(), ..Config::default() };
    let (listener, node) = rt.block_on(async { executor::server::bind(&config) }).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o640);
    assert_eq!(meta.uid(), 0);
    let ongrid_gid = nix::unistd::Group::from_name("ongrid").unwrap().map_or(0, |g| g.gid.as_raw());
    assert_eq!(meta.gid(), ongrid_gid);
    assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777, 0o755);
    // While the listener is there, a second bind is refused and the node
    // stays.
    let e = rt.block_on(async { executor::server::bind(&config) }).unwrap_err();
    assert!(e.to_string().contains("in use by a running daemon"), "{e}");
    assert!(std::os::unix::net::UnixStream::connect(&path).is_ok(), "the node was replaced");
    // Rebinding over the stale node works (the listener is gone); the
    // first node's owner then leaves the new node alone, whose own owner
    // removes it.
    drop(listener);
    let again = rt.block_on(async { executor::server::bind(&config) });
    assert!(again.is_ok(), "{again:?}");
    drop(node);
    assert!(path.exists(), "the first owner removed the second node");
    drop(again);
    assert!(!path.exists(), "the node is removed with its owner");

    let file = dir.path().join("file.sock");
    std::fs::write(&file, "precious").unwrap();
    let config = Config { socket: Some(file.clone()), ..Config::default() };
    let e = rt.block_on(async { executor::server::bind(&config) }).unwrap_err();
    assert!(e.to_string().contains("not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");

    let config = Config { socket_group: Some("no-such-group-x".into()), ..config };
    let e = rt.block_on(async { executor::server::bind(&config) }).unwrap_err();
    assert!(e.to_string().contains("no-such-group-x"), "{e}");
}

/// The real binary: `serve --config`, a ping and a metrics call (with the
/// process collector), then SIGTERM: exit 0, the socket node removed, and
/// the watchdog gone at once (the executor told it the end was normal; it
/// does not wait on the users lock this test holds as another instance
/// would, and the runs tmpfs that instance still uses stays mounted).
#[test]
fn binary_serves_until_sigterm() {
    if !can_run() {
        return;
    }
    let root = dir_0755();
    let runtime = dir_0755();
    let (socket, config) = serve_config(root.path(), runtime.path());
    let mut spawned = spawn_serve(&config, std::process::Stdio::piped());
    let child = &mut spawned.0;
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let mut c = Client::connect(&socket);
    c.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    assert_eq!(c.recv()["result"]["ok"], true);
    // The probes of the wait above count until the server sees them close.
    let mut text = String::new();
    wait_for("only this connection", Duration::from_secs(5), || {
        c.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "metrics"}));
        text = c.recv()["result"]["text"].as_str().unwrap().to_owned();
        sample(&text, "ongrid_executor_connections") == 1.0
    });
    assert!(text.contains("process_cpu_seconds_total"), "{text}");
    drop(c);
    let runs = runtime.path().join("runs");
    let guard = std::fs::read_dir(&runs)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("ex-"))
        .map(|e| std::fs::read_to_string(e.path().join(".guard")).unwrap())
        .expect("an instance directory");
    let watchdog: i32 = guard.split_whitespace().next().unwrap().parse().unwrap();
    assert!(
        executor::host::sweep::start_time(watchdog).is_some(),
        "watchdog {watchdog} not running"
    );
    let other_user = users_lock_shared(runtime.path());
    sigterm(child);
    let exit = wait_child(child);
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert_eq!(exit, (Some(0), None), "{log}");
    assert!(log.contains("serving on"), "{log}");
    assert!(!socket.exists(), "socket removed at exit");
    wait_for("the watchdog to exit", Duration::from_millis(1500), || {
        executor::host::sweep::start_time(watchdog).is_none()
    });
    assert!(std::fs::read_dir(&runs).unwrap().next().is_none(), "instance directory left");
    assert!(mounted(&runs), "unmounted under another user");
    drop(other_user);
    nix::mount::umount(&runs).unwrap();
}

/// A node another user listens on at the executor's path (the loader's
/// user may create nodes in `/run/ongrid`) is no executor: `serve` replaces
/// it with a warning instead of refusing to start for good.
#[test]
fn a_socket_another_user_listens_on_is_replaced() {
    if !can_run() {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        eprintln!("SKIP: /usr/bin/python3 missing");
        return;
    }
    let root = dir_0755();
    let runtime = dir_0755();
    std::fs::set_permissions(runtime.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (socket, config) = serve_config(root.path(), runtime.path());
    const SQUAT: &str = "import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(1)
print('ready', flush=True)
time.sleep(60)";
    let mut squatter = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"])
        .arg(SQUAT)
        .arg(&socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(squatter.stdout.take().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready.trim(), "ready");

    let mut serve = spawn_serve(&config, std::process::Stdio::piped());
    wait_for("the executor's node", Duration::from_secs(10), || {
        std::fs::metadata(&socket).is_ok_and(|m| m.uid() == 0)
    });
    assert!(pings(&socket), "the executor does not answer");
    let child = &mut serve.0;
    sigterm(child);
    assert_eq!(wait_child(child), (Some(0), None));
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(log.contains("answered by uid 65534, not by an executor"), "{log}");
    let _ = squatter.kill();
    let _ = squatter.wait();
}

/// A second `serve` with the same configuration refuses the socket a
/// running executor answers on: it exits non-zero saying so, and neither
/// replaces nor (at its exit) removes the node; the first executor still
/// answers, and removes its own node when it stops.
#[test]
fn second_serve_on_a_live_socket_is_refused() {
    if !can_run() {
        return;
    }
    let root = dir_0755();
    let runtime = dir_0755();
    let (socket, config) = serve_config(root.path(), runtime.path());
    let mut first = spawn_serve(&config, std::process::Stdio::null());
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let inode = std::fs::metadata(&socket).unwrap().ino();

    let mut second = spawn_serve(&config, std::process::Stdio::piped());
    let exit = wait_child(&mut second.0);
    let mut log = String::new();
    std::io::Read::read_to_string(second.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert_ne!(exit, (Some(0), None), "the second serve started: {log}");
    assert!(exit.0.is_some(), "the second serve did not exit by itself: {exit:?} {log}");
    assert!(log.contains("is in use by a running daemon"), "{log}");
    assert!(log.contains(&socket.display().to_string()), "{log}");

    assert_eq!(std::fs::metadata(&socket).map(|m| m.ino()).ok(), Some(inode), "node replaced");
    assert!(pings(&socket), "the first executor no longer answers");

    let child = &mut first.0;
    sigterm(child);
    assert_eq!(wait_child(child), (Some(0), None));
    assert!(!socket.exists(), "the first executor left its node");
}

/// At the default log level (`warn`, no `ONGRID_LOG`) the real `serve`
/// says why it refused a run (an entry made group-writable: a tamper
/// signal) and why a sandbox could not be set up, naming the skill; the
/// args never reach the log.
#[test]
fn refusals_and_sandbox_failures_are_logged_at_warn() {
    if !can_run() {
        return;
    }
    let root = dir_0755();
    let runtime = dir_0755();
    let socket = runtime.path().join("x.sock");
    let config = runtime.path().join("executor.toml");
    let ghost_user = "no-such-user-zq";
    std::fs::write(
        &config,
        format!(
            "roots = [{:?}]\nruntime_dir = {:?}\nsocket = {:?}\n\
             [skills.ghost]\nrun_as = [{ghost_user:?}]\n",
            root.path(),
            runtime.path(),
            socket
        ),
    )
    .unwrap();
    let tamper = skill(root.path(), "tamper", "safe", 5, "cat");
    std::fs::set_permissions(
        tamper.with_file_name("run.sh"),
        std::fs::Permissions::from_mode(0o775),
    )
    .unwrap();
    let ghost = skill(root.path(), "ghost", "safe", 5, "cat");
    std::fs::write(
        &ghost,
        format!(
            r#"{{"name":"ghost","description":"t","entry":"run.sh","sandbox":{{"run_as":"{ghost_user}"}}}}"#
        ),
    )
    .unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_ongrid-executor"))
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove("ONGRID_LOG")
        .env_remove("JOURNAL_STREAM")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut spawned = Spawned(child);
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let secret = marker(11);
    let mut c = Client::connect(&socket);
    c.execute(1, &tamper, json!({"token": secret}));
    let (_, rejected) = c.run_result();
    assert_eq!(rejected["result"]["outcome"], "rejected", "{rejected}");
    let rejected_why = rejected["result"]["error"].as_str().unwrap().to_owned();
    c.execute(2, &ghost, json!({"token": secret}));
    let (_, failed) = c.run_result();
    assert_eq!(failed["result"]["outcome"], "sandbox_failed", "{failed}");
    let failed_why = failed["result"]["error"].as_str().unwrap().to_owned();
    drop(c);

    let child = &mut spawned.0;
    sigterm(child);
    assert_eq!(wait_child(child), (Some(0), None));
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    let warned = |skill: &str, outcome: &str, why: &str| {
        log.lines().any(|l| {
            l.contains("WARN")
                && l.contains(&format!("run \"{skill}\" {outcome}: "))
                && l.contains(why)
        })
    };
    assert!(warned("tamper", "rejected", &rejected_why), "{rejected_why}\n{log}");
    assert!(warned("ghost", "sandbox_failed", &failed_why), "{failed_why}\n{log}");
    assert!(!log.contains(&secret), "the args reached the log:\n{log}");
}

/// Beyond `max_connections` a client waits in the listen backlog until a
/// connection closes.
#[test]
fn connections_beyond_the_cap_wait() {
    if !can_run() {
        return;
    }
    let server = Server::start(|c| c.max_connections = 1);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let mut a = server.client();
    a.send(&ping);
    assert_eq!(a.recv()["result"]["ok"], true);
    let mut b = server.client();
    b.send(&ping);
    b.stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut line = String::new();
    let waited = b.reader.read_line(&mut line);
    assert!(waited.is_err(), "served beyond the cap: {line:?}");
    drop(a);
    b.stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(b.recv()["result"]["ok"], true);
}

/// A shared lock on the runtime directory's users lock, as another
/// executor instance holds it.
fn users_lock_shared(runtime: &Path) -> nix::fcntl::Flock<std::fs::File> {
    let f = std::fs::File::open(runtime.join(".runs-users.lock")).unwrap();
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock)
        .map_err(|(_, e)| e)
        .unwrap()
}

fn mounted(path: &Path) -> bool {
    let Ok(path) = std::fs::canonicalize(path) else { return false };
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == path.to_str())
}

/// SIGKILL of the real `serve` mid-run: the watchdog kills the run's whole
/// tree (a stopped child too), removes its cgroups and directory, and
/// unmounts the runs tmpfs once no one else uses it. Here "someone else"
/// is this test, holding the users lock as another instance would, or as
/// the dying executor does for a moment after the kernel closed the pipe
/// that woke the watchdog: the mount stays while it is held, and goes when
/// it is let go within the watchdog's patience.
#[test]
fn killed_binary_takes_its_runs_with_it() {
    if !can_run() {
        return;
    }
    let root = dir_0755();
    let runtime = dir_0755();
    let (socket, config) = serve_config(root.path(), runtime.path());
    let mark = marker(9);
    let m = skill(
        root.path(),
        "stubborn",
        "safe",
        60,
        &format!(
            "trap '' TERM\necho started >&2\n/bin/sh -c 'kill -STOP $$; exec sleep 1' {mark} &\n\
             exec sleep {mark}"
        ),
    );
    let mut spawned = spawn_serve(&config, std::process::Stdio::null());
    let child = &mut spawned.0;
    wait_for("the socket", Duration::from_secs(10), || UnixStream::connect(&socket).is_ok());
    let runs = runtime.path().join("runs");
    assert!(mounted(&runs), "no tmpfs on {}", runs.display());
    let (h, _) = executor::sandbox::cgroup::Hierarchies::detect();
    let instance = std::fs::read_dir(&runs)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .find(|n| n.to_string_lossy().starts_with("ex-"))
        .expect("an instance directory");
    let parents: Vec<PathBuf> = [&h.v2, &h.v1_pids, &h.v1_memory]
        .into_iter()
        .flatten()
        .map(|b| b.join(&instance))
        .collect();
    assert!(parents.iter().all(|p| p.is_dir()), "{parents:?}");
    let other_user = users_lock_shared(runtime.path());
    let mut c = Client::connect(&socket);
    c.execute(1, &m, json!({}));
    assert_eq!(c.recv()["params"]["line"], "started");
    wait_for("both processes", Duration::from_secs(5), || common::procs_with(&mark).len() == 2);
    child.kill().unwrap();
    wait_child(child);
    wait_for("the run's tree to die", Duration::from_secs(10), || {
        common::procs_with(&mark).is_empty()
    });
    wait_for("the instance directory to be removed", Duration::from_secs(2), || {
        std::fs::read_dir(&runs).is_ok_and(|mut d| d.next().is_none())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(mounted(&runs), "unmounted while another user holds the lock");
    drop(other_user);
    wait_for("the runs tmpfs to be unmounted", Duration::from_secs(5), || !mounted(&runs));
    let left: Vec<_> = parents.iter().filter(|p| p.exists()).collect();
    assert!(left.is_empty(), "instance cgroups left: {left:?}");
}

/// An instance whose guard is dead (its watchdog was killed too) is swept
/// by the next engine: its processes killed, cgroups and directory removed;
/// a live instance's are left alone.
#[test]
fn next_engine_sweeps_dead_instances_only() {
    if !can_run() {
        return;
    }
    let runtime = dir_0755();
    let runs = runtime.path().join("runs");
    let (h, _) = executor::sandbox::cgroup::Hierarchies::detect();
    let mark = marker(10);
    let mut orphan = std::process::Command::new("sleep").arg(&mark).spawn().unwrap();
    let dead = format!("ex-dead{:08x}", std::process::id());
    let live = format!("ex-live{:08x}", std::process::id());
    let me = std::fs::read_to_string("/proc/self/stat").unwrap();
    let start = me[me.rfind(')').unwrap() + 1..].split_whitespace().nth(19).unwrap().to_owned();
    for (name, guard) in
        [(&dead, "999999999 1".to_owned()), (&live, format!("{} {start}", std::process::id()))]
    {
        let dir = runs.join(name);
        std::fs::create_dir_all(dir.join("0123456789abcdef")).unwrap();
        std::fs::write(dir.join(".guard"), guard).unwrap();
    }
    let mut leaves = Vec::new();
    for base in [&h.v2, &h.v1_pids, &h.v1_memory].into_iter().flatten() {
        for name in [&dead, &live] {
            let leaf = base.join(name).join("r1");
            std::fs::create_dir_all(&leaf).unwrap();
            if name == &dead {
                std::fs::write(leaf.join("cgroup.procs"), orphan.id().to_string()).unwrap();
            }
            leaves.push(leaf);
        }
    }
    let config = Config { runtime_dir: Some(runtime.path().to_owned()), ..Config::default() };
    let engine = Engine::new(config).unwrap();
    // (Another test's engine in this process may reap the orphan first.)
    if !leaves.is_empty() {
        wait_for("the dead instance's process to die", Duration::from_secs(2), || {
            common::procs_with(&mark).is_empty()
        });
    }
    let _ = orphan.kill();
    let _ = orphan.wait();
    // (The runs tmpfs now hides the directories; they are checked below.)
    for leaf in &leaves {
        let is_dead = leaf.parent().unwrap().ends_with(&dead);
        assert_eq!(leaf.exists(), !is_dead, "{}", leaf.display());
        assert_eq!(leaf.parent().unwrap().exists(), !is_dead, "{}", leaf.display());
    }
    drop(engine);
    assert!(!mounted(&runs), "runs tmpfs left mounted");
    assert!(!runs.join(&dead).exists(), "dead instance directory left");
    assert!(runs.join(&live).join("0123456789abcdef").exists(), "live instance swept");
    for leaf in &leaves {
        let _ = std::fs::remove_dir(leaf);
        let _ = std::fs::remove_dir(leaf.parent().unwrap());
    }
    let _ = std::fs::remove_dir_all(runs.join(&live));
}

/// A peer that sends requests and never reads the answers is not read from
/// once about 4 MiB of answers wait for it: before, the executor read all
/// it was sent and kept every answer (230 MB in 11 s), until the peer hung
/// up. Its answers all come once it reads.
#[test]
fn a_peer_that_never_reads_its_answers_is_not_read_from() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    let mut c = server.client();
    c.stream.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    // Each request (~300 bytes) asks for the metrics, whose answer is some
    // KiB of text and repeats the id (at most 256 bytes).
    let id = "x".repeat(policy::wire::MAX_ID_BYTES);
    let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":\"{id}\",\"method\":\"metrics\"}}\n");
    let mut sent = 0usize;
    let stalled = loop {
        if sent * line.len() >= 64 << 20 {
            break false;
        }
        match c.stream.write_all(line.as_bytes()) {
            Ok(()) => sent += 1,
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ),
                    "{e}"
                );
                break true;
            }
        }
    };
    let bytes = sent * line.len();
    assert!(stalled, "the executor read all {bytes} bytes of requests nobody read answers to");
    assert!(bytes < 16 << 20, "{bytes} bytes read before the executor stopped");
    // Reading the answers lets it go on: every complete request is answered.
    for _ in 0..sent {
        let v = c.recv();
        assert!(v["result"]["text"].as_str().is_some_and(|t| t.len() > 1000), "{v}");
        assert_eq!(v["id"].as_str().map(str::len), Some(id.len()));
    }
}
