//! An interrupted `loadbench` leaves no daemon and no folder behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use ongrid_benches::interrupt::running;

/// The pids whose parent is `parent`, with their command lines.
fn children_of(parent: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push((pid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
        }
    }
    found
}

/// Whether `pid` still runs (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    running(pid as i32)
}

/// Waits up to `within` for `pid` to stop running; whether it did.
fn stops_within(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

/// Whether this test may start the daemons (else it says SKIP).
fn can_run() -> bool {
    testkit::root_or_skip("the daemons loadbench starts", "the executor's cgroups")
}

/// A loadbench of `daemon` runs that would take hours, on the daemons
/// built next to it, its stderr as given.
fn start_loadbench(stderr: Stdio) -> Child {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_loadbench"));
    let bin_dir = bench.parent().unwrap();
    assert!(
        bin_dir.join("ongrid-executor").is_file() && bin_dir.join("ongrid-skilld").is_file(),
        "the daemons missing in {}: run `cargo build --workspace --bins` first",
        bin_dir.display()
    );
    Command::new(&bench)
        .args(["--iters", "1000000", "--warmup", "0", "--conc", "1"])
        .args(["--skills", "bin-cat", "--variants", "daemon", "--bin-dir"])
        .arg(bin_dir)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// The executor's and skilld's pids once both run, and the temp folder
/// (from the executor's `--config DIR/stack/executor.toml`).
fn wait_for_stack(bench: &mut Child) -> (u32, u32, PathBuf) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(bench.try_wait().unwrap().is_none(), "loadbench ended before its stack ran");
        assert!(Instant::now() < deadline, "no stack within 120 s");
        let kids = children_of(bench.id());
        let find = |name: &str| kids.iter().find(|(_, c)| c.contains(name)).cloned();
        if let (Some((ex, cmd)), Some((sk, _))) = (find("ongrid-executor"), find("ongrid-skilld")) {
            let config = cmd.split_whitespace().find(|a| a.ends_with("executor.toml")).unwrap();
            let base = Path::new(config).parent().and_then(Path::parent).unwrap().to_path_buf();
            return (ex, sk, base);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_interrupted_loadbench_stops_its_daemons_and_removes_their_folder() {
    if !can_run() {
        return;
    }
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let mut child = start_loadbench(Stdio::piped());
        let (executor, skilld, base) = wait_for_stack(&mut child);
        assert!(base.join("stack").is_dir());
        // Let runs begin, then interrupt.
        std::thread::sleep(Duration::from_millis(500));
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(128 + signal as i32), "{signal}: {stderr}");
        assert!(stderr.contains("stopped 2 started processes"), "{signal}: {stderr}");
        // The threads whose requests failed once the daemons went waited
        // for the exit: no panic, no other exit code.
        assert!(!stderr.contains("panicked"), "{signal}: {stderr}");
        // Orphans are reaped by init; gone or a zombie for a moment.
        let executor_stopped = stops_within(executor, Duration::from_secs(10));
        assert!(executor_stopped, "{signal}: the executor {executor} still runs");
        let skilld_stopped = stops_within(skilld, Duration::from_secs(10));
        assert!(skilld_stopped, "{signal}: skilld {skilld} still runs");
        assert!(!base.exists(), "{signal}: {} left behind", base.display());
    }
}

#[test]
fn a_killed_loadbench_still_stops_its_executor() {
    if !can_run() {
        return;
    }
    let mut child = start_loadbench(Stdio::null());
    let (executor, skilld, base) = wait_for_stack(&mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    // The executor ends on its stdin's end (`--stop-on-stdin-eof`).
    let executor_stopped = stops_within(executor, Duration::from_secs(20));
    // skilld has no such switch: stopped here, and the folder removed.
    let _ = kill(Pid::from_raw(skilld as i32), Signal::SIGKILL);
    stops_within(skilld, Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&base);
    assert!(executor_stopped, "the executor {executor} outlived a SIGKILLed loadbench");
}
