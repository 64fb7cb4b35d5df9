use super::*;

/// A `cat` that exits once its stdin is closed, `after` from now (by
/// a thread), and its pidfd; reaped through the reaper.
fn child_exiting_after(after: Duration) -> (i32, OwnedFd) {
    #[allow(clippy::zombie_processes, reason = "reaped through the reaper, by pid")]
    let mut child = std::process::Command::new("cat")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        drop(stdin);
    });
    let pid = i32::try_from(child.id()).unwrap();
    (pid, process::pidfd_open(pid).unwrap())
}

/// With a spin, an exit that comes within it is collected by looking,
/// and the pidfd is never registered; without, it is waited for
/// through the registered pidfd. Either child exits only after the
/// first look (its stdin is closed 50 ms later).
#[tokio::test]
async fn an_exit_within_the_spin_is_collected_without_the_pidfd() {
    // The process-wide reaper: other tests of this binary reap any
    // child through it, and would take this one's status from a
    // private one.
    let reaper = Reaper::global();
    let (pid, fd) = child_exiting_after(Duration::from_millis(50));
    reaper.track(pid);
    let mut pidfd = Some(PidFd::Plain(fd));
    let exit = wait_exit(&mut pidfd, reaper, pid, Duration::from_secs(5)).await;
    assert_eq!(exit.code, Some(0));
    assert!(matches!(pidfd, Some(PidFd::Plain(_))), "the pidfd was registered");

    let (pid, fd) = child_exiting_after(Duration::from_millis(50));
    reaper.track(pid);
    let mut pidfd = Some(PidFd::Plain(fd));
    let exit = wait_exit(&mut pidfd, reaper, pid, Duration::ZERO).await;
    assert_eq!(exit.code, Some(0));
    assert!(matches!(pidfd, Some(PidFd::Polled(_))), "the pidfd was not registered");
}

/// `program args` in a process group of its own (the kill without a
/// cgroup is `killpg`), stdout and stderr on pipes, as a run's child;
/// reaped through the reaper.
fn group_child(program: &str, args: &[&str]) -> Child {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let pipe = || {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC).unwrap()
    };
    let ((out_r, out_w), (err_r, err_w)) = (pipe(), pipe());
    #[allow(clippy::zombie_processes, reason = "reaped through the reaper, by pid")]
    let child = Command::new(program)
        .args(args)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w))
        .spawn()
        .unwrap();
    let pid = i32::try_from(child.id()).unwrap();
    Child {
        pid,
        pidfd: process::pidfd_open(pid).unwrap(),
        stdin: None,
        stdout: out_r,
        stderr: err_r,
        exec_at: std::time::Instant::now(),
    }
}

/// Bounds of 1 KiB each, a 100 ms grace.
fn bounds(start: std::time::Instant, timeout: Duration) -> Bounds<'static> {
    Bounds {
        start,
        timeout,
        grace: Duration::from_millis(100),
        stdout_bytes: 1024,
        stderr_bytes: 1024,
        stderr_line_bytes: 1024,
        exit_spin: ExitSpin::default(),
    }
}

/// Supervises `child` with no cgroup and no cancellation.
async fn supervise_plain(child: Child, bounds: Bounds<'_>) -> Supervised {
    supervise(child, b"", None, Reaper::global(), bounds, &mut |_| {}, async {
        std::future::pending::<()>().await
    })
    .await
}

/// The deadline counts from the run's start as the caller gives it (a
/// warm run's take), not from when supervision begins: a run whose
/// clock started a timeout ago is stopped at once, not a timeout later.
#[tokio::test]
async fn the_deadline_counts_from_the_runs_start() {
    let child = group_child("sleep", &["30"]);
    let timeout = Duration::from_secs(1);
    let start = std::time::Instant::now().checked_sub(timeout).unwrap();
    let began = std::time::Instant::now();
    let sup = supervise_plain(child, bounds(start, timeout)).await;
    assert_eq!(sup.stop, Stop::WallTime);
    assert_eq!(sup.exit.signal, Some(libc::SIGTERM), "{:?}", sup.exit);
    assert!(began.elapsed() < timeout / 2, "stopped after {:?}", began.elapsed());
}

/// Without a cgroup, a process the run left in a session of its own
/// keeps stdout open past the main process's exit: the drain gives up
/// on the pipe, and what the main process wrote is still the output.
#[tokio::test]
async fn output_read_before_the_drain_gives_up_is_kept() {
    let child = group_child("/bin/sh", &["-c", "setsid sleep 8 & echo '{\"a\":1}'"]);
    let sup =
        supervise_plain(child, bounds(std::time::Instant::now(), Duration::from_secs(5))).await;
    assert_eq!(sup.exit.code, Some(0), "{:?}", sup.exit);
    assert_eq!(String::from_utf8_lossy(&sup.stdout), "{\"a\":1}\n");
}

/// The watch is decided when it is spent: the budget only while this
/// run is the only one in flight.
#[test]
fn the_exit_spin_is_for_the_only_run_in_flight() {
    let in_flight = std::sync::atomic::AtomicUsize::new(1);
    let spin = ExitSpin { budget: Duration::from_micros(150), in_flight: Some(&in_flight) };
    assert_eq!(spin.now(), Duration::from_micros(150));
    in_flight.store(2, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(spin.now(), Duration::ZERO);
    assert_eq!(ExitSpin::default().now(), Duration::ZERO);
}
