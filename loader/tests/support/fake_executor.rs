//! A fake `ongrid-executor serve` for the daemon tests: the same wire
//! ([`policy::wire`]) on a Unix socket, no sandbox. It "runs" a skill by
//! spawning its entry with stdin = args, streams stderr lines as `stderr`
//! notifications, and answers with a [`RunReport`]. Like the real one, it
//! kills the run (its whole process group) when the connection closes.
//! It also answers `ping` and `metrics`, and can be switched to answer
//! every `execute` with the busy error. A held `execute` (`hold`) waits
//! for its `start`; a connection closed first runs nothing.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use policy::wire::{self, ExecuteParams, LineBuffer, MetricsResult, Request};
use policy::{Manifest, Outcome, RunReport, ValidateOptions};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Counters the tests read.
#[derive(Debug, Default)]
pub struct Stats {
    /// Answer every `execute` with the busy error.
    pub busy: AtomicBool,
    /// Children spawned.
    pub runs_started: AtomicUsize,
    /// Runs killed because the loader closed the connection.
    pub runs_cancelled: AtomicUsize,
    /// `metrics` calls answered.
    pub metrics_calls: AtomicUsize,
    /// Held `execute` requests received.
    pub held: AtomicUsize,
    /// Held runs whose connection closed before their `start`.
    pub held_cancelled: AtomicUsize,
    /// `mcp_tools` calls received.
    pub mcp_tools_calls: AtomicUsize,
    /// How long each `mcp_tools` waits before its (empty) answer, ms;
    /// `u64::MAX`: it is never answered.
    pub mcp_tools_delay_ms: AtomicU64,
    /// Every `mcp_watch` is answered 50 ms later with a move of the last
    /// pack `mcp_tools` listed (else at once with none).
    pub mcp_moves: AtomicBool,
    /// The manifest of the last `mcp_tools`.
    pub mcp_last_pack: std::sync::Mutex<Option<String>>,
}

/// A running fake executor; [`FakeExecutor::stop`] ends it.
pub struct FakeExecutor {
    pub socket: PathBuf,
    pub stats: Arc<Stats>,
    token: CancellationToken,
    task: JoinHandle<()>,
}

impl FakeExecutor {
    /// Binds `socket` (removing a stale file) and serves; call inside a
    /// tokio runtime.
    pub fn start(socket: &Path) -> Self {
        Self::start_with(socket, Arc::new(Stats::default()))
    }

    /// Same, keeping counters across a restart.
    pub fn start_with(socket: &Path, stats: Arc<Stats>) -> Self {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).unwrap();
        let token = CancellationToken::new();
        let task = tokio::spawn(accept_loop(listener, stats.clone(), token.clone()));
        FakeExecutor { socket: socket.to_path_buf(), stats, token, task }
    }

    /// Stops accepting, kills every run in flight, removes the socket.
    pub async fn stop(self) -> Arc<Stats> {
        self.token.cancel();
        let _ = self.task.await;
        let _ = std::fs::remove_file(&self.socket);
        self.stats
    }
}

async fn accept_loop(listener: UnixListener, stats: Arc<Stats>, token: CancellationToken) {
    let tracker = tokio_util::task::TaskTracker::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((stream, _)) = r else { continue };
                let stats = stats.clone();
                let token = token.clone();
                tracker.spawn(async move {
                    tokio::select! {
                        () = connection(stream, stats) => {}
                        () = token.cancelled() => {}
                    }
                });
            }
            () = token.cancelled() => break,
        }
    }
    tracker.close();
    tracker.wait().await;
}

async fn connection(stream: UnixStream, stats: Arc<Stats>) {
    let (mut rd, mut wr) = stream.into_split();
    let mut lines = Lines {
        buf: LineBuffer::new(wire::MAX_LINE_BYTES),
        ready: VecDeque::new(),
        chunk: vec![0u8; 64 << 10],
    };
    while let Some(line) = lines.next(&mut rd).await {
        let reply = match wire::decode_line(&line) {
            Ok(Request::Ping { id }) => wire::encode_result(&id, &json!({"ok": true})),
            Ok(Request::Metrics { id }) => {
                let n = stats.metrics_calls.fetch_add(1, Ordering::SeqCst);
                wire::encode_result(&id, &json!(MetricsResult { text: metrics_text(&stats, n) }))
            }
            // No tools in any MCP server pack here, listed after the delay.
            Ok(Request::McpTools { id, params }) => {
                stats.mcp_tools_calls.fetch_add(1, Ordering::SeqCst);
                *stats.mcp_last_pack.lock().unwrap() = Some(params.manifest);
                match stats.mcp_tools_delay_ms.load(Ordering::SeqCst) {
                    u64::MAX => std::future::pending().await,
                    0 => {}
                    ms => tokio::time::sleep(std::time::Duration::from_millis(ms)).await,
                }
                wire::encode_result(&id, &json!({"tools": []}))
            }
            // A tool list moves only when the test says so.
            Ok(Request::McpWatch { id, params }) => {
                let pack = stats.mcp_last_pack.lock().unwrap().clone();
                match pack.filter(|_| stats.mcp_moves.load(Ordering::SeqCst)) {
                    Some(manifest) => {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        let moved = params.since + 1;
                        let pack = json!({"manifest": manifest, "generation": moved});
                        wire::encode_result(&id, &json!({"changes": moved, "packs": [pack]}))
                    }
                    None => {
                        wire::encode_result(&id, &json!({"changes": params.since, "packs": []}))
                    }
                }
            }
            // Grants no skill warm runs.
            Ok(Request::Warm { id, .. }) => wire::encode_result(&id, &json!(null)),
            Ok(Request::WarmDiscard { id }) => wire::encode_result(&id, &json!({"discarded": 0})),
            // A start for no held run: nothing to do, no answer.
            Ok(Request::Start { .. }) => continue,
            Ok(Request::Execute { id, params }) => {
                if params.hold {
                    stats.held.fetch_add(1, Ordering::SeqCst);
                    if !lines.wait_start(&mut rd, &id).await {
                        stats.held_cancelled.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
                if stats.busy.load(Ordering::SeqCst) {
                    wire::encode_error_code(&id, wire::code::BUSY, "fake executor is full")
                } else {
                    match run(&id, params, &mut rd, &mut wr, &stats).await {
                        Some(report) => wire::encode_report(&id, &report),
                        None => return, // cancelled: the loader went away
                    }
                }
            }
            Err((id, e)) => wire::encode_error(&id, &e),
        };
        if wr.write_all(&reply).await.is_err() {
            return;
        }
    }
}

/// The connection's request lines, one at a time.
struct Lines {
    buf: LineBuffer,
    ready: VecDeque<Vec<u8>>,
    chunk: Vec<u8>,
}

impl Lines {
    /// The next line; `None` at EOF, on an error or an overlong line.
    async fn next(&mut self, rd: &mut OwnedReadHalf) -> Option<Vec<u8>> {
        loop {
            if let Some(line) = self.ready.pop_front() {
                return Some(line);
            }
            let n = match rd.read(&mut self.chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => n,
            };
            for line in self.buf.push(&self.chunk[..n]) {
                self.ready.push_back(line.ok()?);
            }
        }
    }

    /// Skips lines until the `start` of run `id`; false if the connection
    /// ends first.
    async fn wait_start(&mut self, rd: &mut OwnedReadHalf, id: &Value) -> bool {
        while let Some(line) = self.next(rd).await {
            if matches!(wire::decode_line(&line), Ok(Request::Start { run }) if run == *id) {
                return true;
            }
        }
        false
    }
}

fn metrics_text(stats: &Stats, _calls: usize) -> String {
    format!(
        "# HELP ongrid_executor_fake_runs_total Runs started by the fake executor.\n\
         # TYPE ongrid_executor_fake_runs_total counter\n\
         ongrid_executor_fake_runs_total {}\n\
         # HELP process_open_fds Number of open file descriptors.\n\
         # TYPE process_open_fds gauge\n\
         process_open_fds 3\n",
        stats.runs_started.load(Ordering::SeqCst)
    )
}

fn kill_group(pgid: Option<u32>) {
    if let Some(pgid) = pgid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Runs the skill; `None` when the connection closed first (run killed).
async fn run(
    id: &Value,
    params: ExecuteParams,
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    stats: &Stats,
) -> Option<RunReport> {
    let start = Instant::now();
    let path = PathBuf::from(&params.manifest);
    let manifest = match std::fs::read(&path).map_err(|e| e.to_string()).and_then(|b| {
        Manifest::from_slice(&b, &ValidateOptions::default()).map_err(|e| e.to_string())
    }) {
        Ok(m) => m,
        Err(e) => return Some(RunReport::not_run("?", Outcome::Rejected, e)),
    };
    let name = manifest.name().as_str().to_owned();
    let dir = path.parent().unwrap().to_path_buf();
    let mut child = match tokio::process::Command::new(dir.join(manifest.entry()))
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Some(RunReport::not_run(name, Outcome::SpawnFailed, e.to_string())),
    };
    stats.runs_started.fetch_add(1, Ordering::SeqCst);
    let pgid = child.id();
    let args = serde_json::to_vec(&params.args).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::spawn(async move {
        let _ = stdin.write_all(&args).await;
    });
    let mut stdout = child.stdout.take().unwrap();
    let out_task = tokio::spawn(async move {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v).await;
        v
    });
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut tail = String::new();
    let deadline = tokio::time::sleep(manifest.timeout());
    tokio::pin!(deadline);
    let mut stderr_open = true;
    let mut probe = [0u8; 1];
    let status = loop {
        tokio::select! {
            line = stderr.next_line(), if stderr_open => match line {
                Ok(Some(l)) => {
                    tail.push_str(&l);
                    tail.push('\n');
                    if wr.write_all(&wire::encode_stderr(id, &l)).await.is_err() {
                        kill_group(pgid);
                        stats.runs_cancelled.fetch_add(1, Ordering::SeqCst);
                        return None;
                    }
                }
                _ => stderr_open = false,
            },
            st = child.wait(), if !stderr_open => break st.ok(),
            () = &mut deadline => {
                kill_group(pgid);
                let _ = child.wait().await;
                break None;
            }
            n = rd.read(&mut probe) => {
                if matches!(n, Ok(0) | Err(_)) {
                    kill_group(pgid);
                    let _ = child.wait().await;
                    stats.runs_cancelled.fetch_add(1, Ordering::SeqCst);
                    return None;
                }
            }
        }
    };
    let stdout = out_task.await.unwrap_or_default();
    let mut report = RunReport::not_run(name, Outcome::Ok, "");
    report.error = None;
    report.stderr = tail;
    report.duration_ms = u64::try_from(start.elapsed().as_millis()).unwrap();
    match status {
        None => {
            report.outcome = Outcome::Timeout;
            report.error = Some(format!("timed out after {}s", manifest.timeout().as_secs()));
            report.signal = Some(9);
        }
        Some(st) if st.success() => match policy::RawJson::from_slice(&stdout) {
            Ok(v) => {
                // As the real executor reports it.
                report.exit_code = Some(0);
                report.result = Some(v);
            }
            Err(e) => {
                report.outcome = Outcome::InvalidResult;
                report.error = Some(format!("stdout is not JSON: {e}"));
            }
        },
        Some(st) => {
            use std::os::unix::process::ExitStatusExt;
            report.exit_code = st.code();
            report.signal = st.signal();
            report.outcome =
                if st.code().is_some() { Outcome::ExitNonzero } else { Outcome::Signaled };
            report.error = Some(format!("{st}"));
        }
    }
    Some(report)
}
