//! `ongrid-executor serve` under systemd, with the real binary: readiness
//! (`NOTIFY_SOCKET`: `READY=1` once the socket answers, `STOPPING=1` on
//! SIGTERM) and socket activation (`LISTEN_FDS`: an inherited socket is
//! served and left in place at exit).
//!
//! Root only (the engine needs it); as another user each test prints SKIP.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn can_run() -> bool {
    testkit::root_or_skip("systemd tests of serve", "the engine switches users")
}

struct Setup {
    dir: tempfile::TempDir,
    config: PathBuf,
    socket: PathBuf,
    notify: UnixDatagram,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = dir.path().join("skills");
    std::fs::create_dir(&root).unwrap();
    let socket = dir.path().join("x.sock");
    let config = dir.path().join("executor.toml");
    std::fs::write(
        &config,
        format!(
            "roots = [{:?}]\nruntime_dir = {:?}\nsocket = {:?}\n",
            root,
            dir.path().join("rt"),
            socket
        ),
    )
    .unwrap();
    let notify = UnixDatagram::bind(dir.path().join("notify.sock")).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    Setup { dir, config, socket, notify }
}

/// The next datagram. A signal to this process (a child of another test
/// exiting) interrupts a read with a timeout whatever `SA_RESTART` says
/// (signal(7)): it is read again.
fn recv(sock: &UnixDatagram) -> std::io::Result<String> {
    let mut buf = [0u8; 4096];
    loop {
        match sock.recv(&mut buf) {
            Ok(n) => return Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The next notification of `child`; when none comes, the test fails with
/// what the server wrote to stderr (killed first, so the read ends).
fn notification(sock: &UnixDatagram, child: &mut Child) -> String {
    match recv(sock) {
        Ok(n) => n,
        Err(e) => {
            let _ = child.kill();
            let status = child.wait();
            let mut log = String::new();
            if let Some(err) = child.stderr.as_mut() {
                let _ = std::io::Read::read_to_string(err, &mut log);
            }
            panic!("no notification ({e}); serve: {status:?}, stderr:\n{log}");
        }
    }
}

fn ping(socket: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(socket) else { return false };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).is_ok() && line.contains("\"ok\":true")
}

/// Kills the server if the test fails before it stops it.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn term_and_wait(child: &mut Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < until, "serve did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `READY=1` only once the socket answers a ping; `STOPPING=1` on SIGTERM;
/// the socket it bound itself is removed at exit.
#[test]
fn ready_after_the_socket_answers_and_stopping_on_sigterm() {
    if !can_run() {
        return;
    }
    let s = setup();
    let child = Command::new(env!("CARGO_BIN_EXE_ongrid-executor"))
        .args(["serve", "--config"])
        .arg(&s.config)
        .env("NOTIFY_SOCKET", s.dir.path().join("notify.sock"))
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let ready = notification(&s.notify, &mut child.0);
    // At once, no retry: READY=1 must not come before the socket serves.
    assert!(ping(&s.socket), "READY=1 before the socket answers");
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    let status = term_and_wait(&mut child.0);
    let stopping = notification(&s.notify, &mut child.0);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert!(status.success(), "{status:?}");
    assert!(!s.socket.exists(), "a socket it bound itself is removed at exit");
}

/// A listening socket passed as fd 3 (`LISTEN_FDS=1`, `LISTEN_PID` = the
/// executor's pid, as systemd passes `ongrid-executor.socket`) is served,
/// its mode is left as the socket unit set it, nothing is bound at the
/// configured path, and the socket file stays at exit.
#[test]
fn serves_an_inherited_socket_and_leaves_it_in_place() {
    if !can_run() {
        return;
    }
    let s = setup();
    let activated = s.dir.path().join("activated.sock");
    let listener = UnixListener::bind(&activated).unwrap();
    std::fs::set_permissions(&activated, std::fs::Permissions::from_mode(0o640)).unwrap();
    let fd = listener.as_raw_fd();
    nix::fcntl::fcntl(&listener, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
        .unwrap();
    // bash (fd numbers over 9) moves the socket to fd 3 and sets LISTEN_PID
    // to its own pid, which `exec` hands to the executor.
    let child = Command::new("/bin/bash")
        .arg("-c")
        .arg(format!("LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\" 3<&{fd} {fd}<&-"))
        .arg(env!("CARGO_BIN_EXE_ongrid-executor"))
        .args(["serve", "--config"])
        .arg(&s.config)
        .env("NOTIFY_SOCKET", s.dir.path().join("notify.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    drop(listener);
    let ready = notification(&s.notify, &mut child.0);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(ping(&activated), "no answer on the inherited socket");
    let mode = std::fs::metadata(&activated).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "the executor changed the mode of the socket systemd owns");
    assert!(!s.socket.exists(), "bound the configured socket too");
    let status = term_and_wait(&mut child.0);
    let mut log = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(status.success(), "{status:?}\n{log}");
    assert!(log.contains("serving on the socket passed by systemd"), "{log}");
    let meta = std::fs::symlink_metadata(&activated).expect("the socket file was removed");
    assert!(meta.file_type().is_socket());
}

/// A bad executor.toml ends `serve` with 78 (EX_CONFIG), which the unit's
/// `RestartPreventExitStatus=78` does not restart into; the message names
/// the file. Needs no root: nothing is set up before the configuration.
#[test]
fn bad_configuration_exits_78() {
    let dir = tempfile::tempdir().unwrap();
    let unknown_key = dir.path().join("typo.toml");
    std::fs::write(&unknown_key, "sokcet = \"/x\"\n").unwrap();
    let bad_value = dir.path().join("value.toml");
    std::fs::write(&bad_value, "roots = [\"relative\"]\n").unwrap();
    let missing = dir.path().join("missing.toml");
    for config in [&unknown_key, &bad_value, &missing] {
        let out = Command::new(env!("CARGO_BIN_EXE_ongrid-executor"))
            .args(["serve", "--config"])
            .arg(config)
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{}: {err}", config.display());
        assert!(err.contains(&config.display().to_string()), "{err}");
    }
}
