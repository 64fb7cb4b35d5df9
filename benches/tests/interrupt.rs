//! An interrupted `loadbench` leaves no daemon and no folder behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

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

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.split_whitespace().next() != Some("Z")))
        .unwrap_or(false)
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
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: the daemons loadbench starts need root (the executor's cgroups)");
        return;
    }
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_loadbench"));
    let bin_dir = bench.parent().unwrap();
    assert!(
        bin_dir.join("ongrid-executor").is_file() && bin_dir.join("ongrid-skilld").is_file(),
        "the daemons missing in {}: run `cargo build --workspace --bins` first",
        bin_dir.display()
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let mut child = Command::new(&bench)
            .args(["--iters", "1000000", "--warmup", "0", "--conc", "1"])
            .args(["--skills", "bin-cat", "--variants", "daemon", "--bin-dir"])
            .arg(bin_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
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
        let deadline = Instant::now() + Duration::from_secs(10);
        while (alive(executor) || alive(skilld)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(executor), "{signal}: the executor {executor} still runs");
        assert!(!alive(skilld), "{signal}: skilld {skilld} still runs");
        assert!(!base.exists(), "{signal}: {} left behind", base.display());
    }
}

#[test]
fn a_killed_loadbench_still_stops_its_executor() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: the daemons loadbench starts need root (the executor's cgroups)");
        return;
    }
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_loadbench"));
    let bin_dir = bench.parent().unwrap();
    let mut child = Command::new(&bench)
        .args(["--iters", "1000000", "--warmup", "0", "--conc", "1"])
        .args(["--skills", "bin-cat", "--variants", "daemon", "--bin-dir"])
        .arg(bin_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (executor, skilld, base) = wait_for_stack(&mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    // The executor ends on its stdin's end (`--stop-on-stdin-eof`).
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(executor) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let executor_alive = alive(executor);
    // skilld has no such switch: stopped here, and the folder removed.
    let _ = kill(Pid::from_raw(skilld as i32), Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(skilld) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&base);
    assert!(!executor_alive, "the executor {executor} outlived a SIGKILLed loadbench");
}
