//! `ongrid-skill up`: starts both daemons, answers `curl`, stops cleanly on
//! SIGTERM, SIGINT and SIGHUP with no process or socket left, and leaves
//! no executor behind when it is killed; and the README's "API examples"
//! run exactly as written against it.

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::harness::{
    bin, blocked_signals, eventually, free_port, process_alive, processes_with, temp_dir,
    with_blocked, write_skill,
};

/// A running `ongrid-skill up` and what it printed until ready.
struct Up {
    child: Child,
    runtime: PathBuf,
    metrics: SocketAddr,
    printed: Vec<String>,
    log: PathBuf,
}

/// What `up`'s stderr is told it is: `$JOURNAL_STREAM` unset, naming the
/// log file (as systemd names the journal's stream), or naming another file.
#[derive(Clone, Copy, PartialEq)]
enum Stream {
    Plain,
    Journal,
    Elsewhere,
}

impl Up {
    fn start(base: &Path, extra: &[&Path]) -> Self {
        Self::start_with(base, extra, Stream::Plain)
    }

    fn start_with(base: &Path, extra: &[&Path], stream: Stream) -> Self {
        Self::launch(base, extra, stream, &[])
    }

    /// As [`Up::start_with`], with `more` arguments for `up`.
    fn launch(base: &Path, extra: &[&Path], stream: Stream, more: &[&std::ffi::OsStr]) -> Self {
        Self::launch_from(Command::new(bin("ongrid-skill")), base, extra, stream, more)
    }

    /// As [`Up::start`], started with SIGHUP ignored, as `nohup` starts it.
    fn start_ignoring_sighup(base: &Path) -> Self {
        let mut sh = Command::new("/bin/sh");
        sh.args(["-c", "trap '' HUP; exec \"$0\" \"$@\""]).arg(bin("ongrid-skill"));
        Self::launch_from(sh, base, &[], Stream::Plain, &[])
    }

    /// `cmd` (`ongrid-skill`, or what execs it with its arguments) with
    /// `up` and its arguments.
    fn launch_from(
        mut cmd: Command,
        base: &Path,
        extra: &[&Path],
        stream: Stream,
        more: &[&std::ffi::OsStr],
    ) -> Self {
        if nix::unistd::geteuid().is_root() {
            ongrid_tests::host::skill_user();
        }
        let runtime = base.join("run");
        let metrics = free_port();
        let log = base.join("up.log");
        cmd.arg("up").arg("--runtime-dir").arg(&runtime);
        cmd.arg("--metrics-listen").arg(metrics.to_string());
        for dir in extra {
            cmd.arg("--skills").arg(dir);
        }
        cmd.args(more);
        let stderr = fs::File::create(&log).unwrap();
        let meta = stderr.metadata().unwrap();
        match stream {
            Stream::Plain => cmd.env_remove("JOURNAL_STREAM"),
            Stream::Journal => cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino())),
            Stream::Elsewhere => {
                cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino() + 1))
            }
        };
        let mut child = cmd
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut printed = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    let done = line.contains("Ctrl-C stops both daemons");
                    printed.push(line);
                    if done {
                        break;
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "`ongrid-skill up` not ready; printed:\n{}\nlog:\n{}",
                        printed.join("\n"),
                        fs::read_to_string(&log).unwrap_or_default()
                    );
                }
            }
        }
        Up { child, runtime, metrics, printed, log }
    }

    fn socket(&self) -> PathBuf {
        self.runtime.join("skilld.sock")
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The executor's pid, from the ready lines.
    fn executor_pid(&self) -> i32 {
        let line = self.printed.iter().find(|l| l.trim_start().starts_with("executor")).unwrap();
        let digits: String =
            line.split("pid ").nth(1).unwrap().chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap()
    }

    /// Sends `sig`, waits for the exit, checks nothing is left.
    fn stop(mut self, sig: Signal) {
        let executor = self.executor_pid();
        kill(Pid::from_raw(i32::try_from(self.child.id()).unwrap()), sig).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "`up` did not stop on {sig}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "`up` exit after {sig}: {status}\n{}", self.log());
        assert!(!Path::new(&format!("/proc/{executor}")).exists(), "executor {executor} left");
        let runtime = self.runtime.display().to_string();
        assert_eq!(processes_with(&runtime), Vec::<i32>::new(), "processes left in {runtime}");
        for name in ["skilld.sock", "executor.sock", "executor.toml"] {
            assert!(!self.runtime.join(name).exists(), "{name} left behind");
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bash(script: &str) -> (bool, String, String) {
    let out = Command::new("bash").arg("-c").arg(script).output().expect("run bash");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn have_curl() -> bool {
    Command::new("curl").arg("--version").output().is_ok_and(|o| o.status.success())
}

#[test]
fn up_starts_answers_curl_and_stops_cleanly_on_sigterm() {
    let (_tmp, base) = temp_dir("ongrid-e2e-up-");
    let extra = base.join("extra");
    fs::create_dir_all(&extra).unwrap();
    write_skill(&extra, "extra_pack", "", "echo '{\"extra\":true}'");
    let up = Up::start(&base, &[&extra]);
    let text = up.printed.join("\n");
    let sock = up.socket().display().to_string();
    let curl_line = format!("curl --unix-socket {sock} http://localhost/v1/skills");
    assert!(up.printed.iter().any(|l| l.trim() == curl_line), "{text}");
    assert!(text.contains(&format!("list --socket {sock}")), "{text}");
    assert!(text.contains("run host_load --socket"), "{text}");
    // The socket is the user's alone: the daemon's default (0660) would
    // let the primary group run the user's skills as the user.
    let mode = fs::metadata(up.socket()).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600, "skilld.sock mode {mode:o}");

    let list = if have_curl() {
        let (ok, out, err) = bash(&curl_line);
        assert!(ok, "{curl_line}: {err}");
        serde_json::from_str::<Value>(&out).unwrap()
    } else {
        println!("SKIP: curl is not installed; the list is fetched without it");
        crate::harness::http(&up.socket(), "GET", "/v1/skills", "application/json", None).json()
    };
    let names: Vec<&str> =
        list["items"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    for want in ["echo", "host_load", "disk_usage", "extra_pack"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }

    // The CLI lines it printed work too.
    let cli = bin("ongrid-skill");
    let out = Command::new(&cli)
        .args(["run", "extra_pack", "--json", "--socket"])
        .arg(up.socket())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["result"]["extra"], true, "{report}");
    let out = Command::new(&cli)
        .args(["run", "host_load", "--socket"])
        .arg(up.socket())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), up.log());
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(result["load1"].is_number(), "{result}");

    // A second `up` on the same runtime dir refuses without disturbing
    // the first; a world-writable runtime dir is refused (usage, 2).
    let second = Command::new(&cli)
        .args(["up", "--no-examples", "--metrics-listen", "", "--skills"])
        .arg(&extra)
        .arg("--runtime-dir")
        .arg(&up.runtime)
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1), "{}", String::from_utf8_lossy(&second.stderr));
    assert!(String::from_utf8_lossy(&second.stderr).contains("another"));
    let unsafe_dir = Command::new(&cli)
        .args(["up", "--metrics-listen", "", "--runtime-dir", "/tmp"])
        .output()
        .unwrap();
    assert_eq!(
        unsafe_dir.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&unsafe_dir.stderr)
    );
    let r = crate::harness::http(&up.socket(), "GET", "/v1/health", "application/json", None);
    assert_eq!(r.json()["executor"], "up");

    up.stop(Signal::SIGTERM);
}

/// Runs the `echo` example through `up`'s socket; its result.
fn run_echo(up: &Up) -> Value {
    let out = Command::new(bin("ongrid-skill"))
        .args(["run", "echo", "--args", r#"{"message":"still here"}"#, "--socket"])
        .arg(up.socket())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), up.log());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A pack of one's own whose `sandbox` asks for the network runs under
/// `up` once `--grants FILE` grants it (up grants only its examples'
/// requests); without the grant it is `rejected`, naming the grant.
#[test]
fn up_grants_a_packs_sandbox_request_from_a_file() {
    let (_tmp, base) = temp_dir("ongrid-e2e-up-grants-");
    let packs = base.join("packs");
    fs::create_dir_all(&packs).unwrap();
    write_skill(&packs, "netwant", r#","sandbox":{"network":true}"#, "exec /bin/cat");
    let run = |up: &Up| {
        let out = Command::new(bin("ongrid-skill"))
            .args(["run", "netwant", "--json", "--args", r#"{"x":1}"#, "--socket"])
            .arg(up.socket())
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}\n{}", String::from_utf8_lossy(&out.stderr), up.log())
        });
        report
    };
    let up = Up::start(&base, &[&packs]);
    let report = run(&up);
    up.stop(Signal::SIGTERM);
    assert_eq!(report["outcome"], "rejected", "{report}");
    assert!(report["error"].as_str().unwrap_or_default().contains("[skills.netwant]"), "{report}");

    let grants = base.join("grants.toml");
    fs::write(&grants, "[skills.netwant]\nnetwork = true\n").unwrap();
    let up =
        Up::launch(&base, &[&packs], Stream::Plain, &["--grants".as_ref(), grants.as_os_str()]);
    let report = run(&up);
    up.stop(Signal::SIGTERM);
    assert_eq!(report["outcome"], "ok", "{report}");
    assert_eq!(report["result"]["x"], 1, "{report}");
    assert_eq!(report["sandbox"]["network"]["enabled"], true, "{report}");
}

/// Under `up` (as root) a run sees only its own processes in `/proc` and
/// its report says `proc: own`; a pack granted `proc = "host"` through
/// `--grants` sees the host's table, PID 1 among it.
#[test]
fn up_runs_see_only_their_own_processes_unless_granted_the_hosts() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP up_runs_see_only_their_own_processes_unless_granted_the_hosts: needs root");
        return;
    }
    let (_tmp, base) = temp_dir("ongrid-e2e-up-proc-");
    let packs = base.join("packs");
    fs::create_dir_all(&packs).unwrap();
    let script = "cat >/dev/null\nn=$(ls /proc | grep -c '^[0-9]')\n\
                  if [ -d /proc/1 ]; then one=true; else one=false; fi\n\
                  echo \"{\\\"pids\\\": $n, \\\"init\\\": $one}\"";
    write_skill(&packs, "psview", "", script);
    let run = |up: &Up| {
        let out = Command::new(bin("ongrid-skill"))
            .args(["run", "psview", "--json", "--args", "{}", "--socket"])
            .arg(up.socket())
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}\n{}", String::from_utf8_lossy(&out.stderr), up.log())
        })
    };
    let up = Up::start(&base, &[&packs]);
    let own = run(&up);
    up.stop(Signal::SIGTERM);
    assert_eq!(own["outcome"], "ok", "{own}");
    assert_eq!(own["sandbox"]["proc"], "own", "{own}");
    assert_eq!(own["result"]["init"], false, "PID 1 in sight: {own}");
    // The script's shell, its command substitution's, `ls` and `grep`.
    assert!(own["result"]["pids"].as_u64().is_some_and(|n| n <= 4), "{own}");

    let grants = base.join("grants.toml");
    fs::write(&grants, "[skills.psview]\nproc = \"host\"\n").unwrap();
    let up =
        Up::launch(&base, &[&packs], Stream::Plain, &["--grants".as_ref(), grants.as_os_str()]);
    let host = run(&up);
    up.stop(Signal::SIGTERM);
    assert_eq!(host["outcome"], "ok", "{host}");
    assert_eq!(host["sandbox"]["proc"], "host", "{host}");
    assert_eq!(host["result"]["init"], true, "PID 1 unseen: {host}");
}

/// Ctrl-C with a run in flight says what `up` waits for (the run may take
/// its timeout); a second Ctrl-C stops at once: the run is killed and
/// nothing is left (before: the second was ignored, and `up` waited in
/// silence).
#[test]
fn a_second_ctrl_c_stops_up_at_once_and_kills_the_runs() {
    let (_tmp, base) = temp_dir("ongrid-e2e-up-twice-");
    let packs = base.join("packs");
    fs::create_dir_all(&packs).unwrap();
    let mark = format!("25.{:06}", std::process::id() % 1_000_000);
    write_skill(&packs, "sleeper", r#","timeout_seconds":60"#, &format!("exec /bin/sleep {mark}"));
    let mut up = Up::start(&base, &[&packs]);
    let executor = up.executor_pid();
    let mut client = Command::new(bin("ongrid-skill"))
        .args(["run", "sleeper", "--socket"])
        .arg(up.socket())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || !processes_with(&mark).is_empty()), "no run");
    let pid = Pid::from_raw(i32::try_from(up.child.id()).unwrap());
    kill(pid, Signal::SIGINT).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || up.log().contains("waiting for 1 run(s) in flight")),
        "{}",
        up.log()
    );
    assert!(up.child.try_wait().unwrap().is_none(), "the first Ctrl-C waits for the run");
    let second = Instant::now();
    kill(pid, Signal::SIGINT).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || up.child.try_wait().unwrap().is_some()),
        "`up` did not stop on a second Ctrl-C:\n{}",
        up.log()
    );
    assert!(second.elapsed() < Duration::from_secs(10));
    assert!(eventually(Duration::from_secs(5), || processes_with(&mark).is_empty()), "run left");
    assert!(!Path::new(&format!("/proc/{executor}")).exists(), "executor {executor} left");
    let _ = client.wait();
    assert!(up.log().contains("stopping now"), "{}", up.log());
}

#[test]
fn a_stray_sighup_leaves_the_executor_serving_and_a_closed_terminal_stops_up() {
    let (_tmp, base) = temp_dir("ongrid-e2e-up-hup-");
    let up = Up::start(&base, &[]);
    let executor = up.executor_pid();
    // A SIGHUP meant for skilld's rescan (`pkill -HUP ongrid`): its default
    // action would end the executor, and `up` with it.
    kill(Pid::from_raw(executor), Signal::SIGHUP).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || up.log().contains("SIGHUP ignored")),
        "no log line for the SIGHUP:\n{}",
        up.log()
    );
    assert!(process_alive(executor, "ongrid-executor"), "executor gone:\n{}", up.log());
    assert_eq!(run_echo(&up)["message"], "still here");
    // The terminal `up` runs in closes: both daemons stop, exit 0.
    up.stop(Signal::SIGHUP);
}

/// Started as `nohup` starts it (SIGHUP ignored), `up` goes on serving
/// when the terminal closes, and stops on SIGTERM.
#[test]
fn up_started_with_sighup_ignored_serves_on_after_one() {
    let (_tmp, base) = temp_dir("ongrid-e2e-up-nohup-");
    let up = Up::start_ignoring_sighup(&base);
    kill(Pid::from_raw(i32::try_from(up.child.id()).unwrap()), Signal::SIGHUP).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(run_echo(&up)["message"], "still here", "{}", up.log());
    up.stop(Signal::SIGTERM);
}

/// No one reads the ready lines (stdout a pipe closed at once): `up` stops
/// both daemons, leaves nothing behind and exits non-zero.
#[test]
fn up_whose_ready_lines_cannot_be_written_stops_and_fails() {
    let (_tmp, base) = temp_dir("ongrid-e2e-up-pipe-");
    let runtime = base.join("run");
    let mut cmd = Command::new(bin("ongrid-skill"));
    cmd.arg("up").arg("--runtime-dir").arg(&runtime).args(["--metrics-listen", ""]);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit {}: {err}", out.status);
    assert!(err.contains("cannot print the ready lines"), "{err}");
    for name in ["skilld.sock", "executor.sock", "executor.toml"] {
        assert!(!runtime.join(name).exists(), "{name} left behind: {err}");
    }
    assert_eq!(processes_with(&runtime.display().to_string()), Vec::<i32>::new());
}

#[test]
fn a_killed_up_leaves_no_executor_behind() {
    let (_tmp, base) = temp_dir("ongrid-e2e-up-kill-");
    let mut up = Up::start(&base, &[]);
    let executor = up.executor_pid();
    assert_eq!(run_echo(&up)["message"], "still here");
    // No handler runs on SIGKILL: only the closed pipe tells the executor.
    kill(Pid::from_raw(i32::try_from(up.child.id()).unwrap()), Signal::SIGKILL).unwrap();
    up.child.wait().unwrap();
    let gone = eventually(Duration::from_secs(20), || !process_alive(executor, "ongrid-executor"));
    if !gone {
        // Not left running past the test.
        let _ = kill(Pid::from_raw(executor), Signal::SIGTERM);
    }
    assert!(gone, "the executor {executor} outlived a killed `up`:\n{}", up.log());
    let runtime = up.runtime.display().to_string();
    assert!(
        eventually(Duration::from_secs(10), || processes_with(&runtime).is_empty()),
        "processes left in {runtime}: {:?}",
        processes_with(&runtime)
    );
    assert!(up.log().contains("standard input closed"), "{}", up.log());
    assert!(!up.runtime.join("executor.sock").exists(), "the executor left its socket");
    // skilld's socket is left (nothing ran to remove it); the next `up` in
    // the same runtime dir starts over it.
    let again = Up::start(&base, &[]);
    assert_eq!(run_echo(&again)["message"], "still here");
    again.stop(Signal::SIGTERM);
}

/// `up` started by a parent that blocks the stop signals around its spawn
/// (the mask survives `exec`): `up` and its executor clear it, so SIGTERM
/// still stops both (before, `up` ignored it for good).
#[test]
fn up_started_with_the_stop_signals_blocked_still_stops_on_sigterm() {
    let (_tmp, base) = temp_dir("ongrid-e2e-up-mask-");
    let stops = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];
    let up = with_blocked(&stops, || Up::start(&base, &[]));
    for pid in [up.child.id(), u32::try_from(up.executor_pid()).unwrap()] {
        for sig in stops {
            assert!(!blocked_signals(pid).contains(sig), "{pid} blocks {sig}");
        }
    }
    assert_eq!(run_echo(&up)["message"], "still here");
    up.stop(Signal::SIGTERM);
}

/// Whether `line` holds an RFC 3339 date and time (`2026-12-03T22:20:47`).
fn has_timestamp(line: &str) -> bool {
    let pattern = b"dddd-dd-ddTdd:";
    line.as_bytes().windows(pattern.len()).any(|w| {
        w.iter().zip(pattern).all(|(c, p)| if *p == b'd' { c.is_ascii_digit() } else { c == p })
    })
}

#[test]
fn under_systemd_log_lines_carry_journald_priorities_and_no_timestamp() {
    let (_tmp, base) = temp_dir("ongrid-e2e-up-journal-");
    let up = Up::start_with(&base, &[], Stream::Journal);
    // A warning from the executor, an info line from skilld.
    kill(Pid::from_raw(up.executor_pid()), Signal::SIGHUP).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || up.log().contains("SIGHUP ignored")),
        "{}",
        up.log()
    );
    let log = up.log();
    let line = |needle: &str| -> String {
        log.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle}:\n{log}"))
            .into()
    };
    let registered = line(r#"registered subprocess skill "echo""#);
    assert!(registered.starts_with("<6>loader::daemon::app: skill loader: "), "{registered}");
    let hup = line("SIGHUP ignored");
    assert!(hup.starts_with("<4>ongrid_executor: executor: SIGHUP ignored"), "{hup}");
    // journald stamps each line itself.
    let stamped: Vec<&str> = log.lines().filter(|l| has_timestamp(l)).collect();
    assert!(stamped.is_empty(), "{stamped:?}");
    up.stop(Signal::SIGTERM);

    // A `$JOURNAL_STREAM` naming another file (inherited from a service
    // whose stderr this is not) changes nothing.
    let (_tmp, base) = temp_dir("ongrid-e2e-up-journal-");
    let up = Up::start_with(&base, &[], Stream::Elsewhere);
    let log = up.log();
    let registered =
        log.lines().find(|l| l.contains(r#"registered subprocess skill "echo""#)).unwrap();
    assert!(has_timestamp(registered) && registered.contains(" INFO "), "{registered}");
    assert!(!registered.starts_with('<'), "{registered}");
    up.stop(Signal::SIGTERM);
}

/// The fenced `sh` block of README.md's "API examples" section.
fn readme_examples() -> Vec<String> {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = fs::read_to_string(&readme).unwrap();
    let section = text.split("\n## API examples").nth(1).expect("README has ## API examples");
    let block =
        section.split("```sh\n").nth(1).expect("a ```sh block").split("\n```").next().unwrap();
    block.lines().map(str::to_owned).collect()
}

/// Checks one example's output by the URL it asks for.
fn check_example(line: &str, out: &str) {
    let json = || -> Value {
        serde_json::from_str(out).unwrap_or_else(|e| panic!("{line}: not JSON ({e}): {out}"))
    };
    if line.contains("/metrics") {
        assert!(out.contains("# TYPE ongrid_executions_total counter"), "{line}: {out}");
        assert!(out.contains("ongrid_build_info"), "{line}");
    } else if line.contains("x-ndjson") {
        let events: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let last = events.last().unwrap_or_else(|| panic!("{line}: no events"));
        assert_eq!(last["event"], "report", "{line}: {out}");
        assert_eq!(last["report"]["outcome"], "ok", "{line}: {out}");
    } else if line.contains("/execute") {
        let v = json();
        assert_eq!(v["outcome"], "ok", "{line}: {v}");
        assert!(v["result"].is_object(), "{line}: {v}");
        assert!(v["sandbox"].is_object(), "{line}: {v}");
    } else if line.contains("/v1/reload") {
        assert!(json()["registered"].as_u64().unwrap() >= 3, "{line}: {out}");
    } else if line.contains("/v1/health") {
        let v = json();
        assert_eq!(v["status"], "ok", "{line}: {v}");
        assert_eq!(v["executor"], "up", "{line}: {v}");
    } else if line.contains("/v1/tools") {
        let v = json();
        assert!(!v["tools"].as_array().unwrap().is_empty(), "{line}: {v}");
    } else if line.contains("/v1/skills/") {
        assert!(json()["name"].is_string(), "{line}: {out}");
    } else if line.contains("/v1/skills") {
        let v = json();
        let items = v["items"].as_array().unwrap_or_else(|| panic!("{line}: {v}"));
        assert!(!items.is_empty(), "{line}: {v}");
        assert_eq!(v["total"].as_u64(), Some(items.len() as u64), "{line}: {v}");
    } else {
        panic!("README example with no check here: {line}");
    }
}

#[test]
fn readme_curl_examples_run_as_written() {
    let lines = readme_examples();
    assert!(lines.iter().any(|l| l.starts_with("SOCK=")), "the block defines SOCK: {lines:?}");
    let examples: Vec<&String> = lines.iter().filter(|l| l.starts_with("curl ")).collect();
    assert!(examples.len() >= 7, "{examples:?}");
    assert!(examples.iter().any(|l| l.contains("--unix-socket")));
    if !have_curl() {
        println!("SKIP: readme_curl_examples_run_as_written: curl is not installed");
        return;
    }
    let (_tmp, base) = temp_dir("ongrid-e2e-readme-");
    let up = Up::start(&base, &[]);
    // The variable lines are this test's values; every other line runs
    // exactly as the README writes it.
    let mut prelude = String::new();
    for l in &lines {
        if let Some((var, _)) = l.split_once('=').filter(|(v, _)| !v.contains(' ') && !v.is_empty())
        {
            let value = match var {
                "SOCK" => up.socket().display().to_string(),
                "METRICS" => up.metrics.to_string(),
                other => panic!("README example variable {other} unknown to the test"),
            };
            prelude.push_str(&format!("{var}={value}\n"));
        }
    }
    for line in &examples {
        let (ok, out, err) = bash(&format!("set -eu\n{prelude}{line}"));
        assert!(ok, "{line}: exit non-zero: {err}\n{}", up.log());
        check_example(line, &out);
    }
    up.stop(Signal::SIGINT);
}
