//! The daemon under systemd: readiness notifications (`NOTIFY_SOCKET`,
//! `Type=notify`) and socket activation (`LISTEN_FDS`, `ongrid-skilld.socket`).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::time::Duration;

use loader::cli::client::DaemonClient;
use nix::sys::signal::Signal;

use crate::skilld::{Env, Skilld};

/// The notification socket a service manager would listen on.
fn notify_socket(env: &Env) -> (UnixDatagram, std::path::PathBuf) {
    let path = env.path("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    (sock, path)
}

fn recv(sock: &UnixDatagram, d: &Skilld) -> String {
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).unwrap_or_else(|e| panic!("no notification ({e}):\n{}", d.log()));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// `READY=1` arrives once the client socket answers and the first scan is
/// done (the registry is complete at that moment), with a `STATUS=` line;
/// SIGTERM sends `STOPPING=1` before the daemon exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_after_serving_and_stopping_on_sigterm() {
    let env = Env::new();
    let skills = env.standard_skills();
    let (notify, path) = notify_socket(&env);
    let mut d = Skilld::spawn(&env, &[&skills], "", |c| {
        c.env("NOTIFY_SOCKET", &path);
    });
    let ready = recv(&notify, &d);
    // Checked at once, with no retry: READY=1 must not come early.
    assert!(UnixStream::connect(&d.socket).is_ok(), "READY=1 before the socket accepts");
    let skills = d.client().get("/v1/skills").await.unwrap();
    assert!(skills.status.is_success(), "{skills:?}");
    assert_eq!(skills.body["total"], 5, "READY=1 before the first scan: {ready:?}");
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(ready.lines().any(|l| l == "STATUS=serving 5 skills (0 skipped)"), "{ready:?}");

    d.signal(Signal::SIGTERM);
    let stopping = recv(&notify, &d);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert!(d.wait_exit(Duration::from_secs(15)).success());
}

/// Every rescan, whatever asked for it (SIGHUP, `POST /v1/reload`), is
/// told to the service manager: `RELOADING=1` with `MONOTONIC_USEC=`
/// before it, then `READY=1` with the new skill count in `STATUS=`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescans_send_reloading_then_ready_with_the_new_status() {
    let env = Env::new();
    let skills = env.standard_skills();
    let (notify, path) = notify_socket(&env);
    let mut d = Skilld::spawn(&env, &[&skills], "", |c| {
        c.env("NOTIFY_SOCKET", &path);
    });
    let ready = recv(&notify, &d);
    assert!(ready.lines().any(|l| l == "STATUS=serving 5 skills (0 skipped)"), "{ready:?}");
    let reloading_at = |msg: &str| -> u64 {
        assert!(msg.lines().any(|l| l == "RELOADING=1"), "{msg:?}");
        let usec = msg.lines().find_map(|l| l.strip_prefix("MONOTONIC_USEC="));
        let usec: u64 =
            usec.unwrap_or_else(|| panic!("no MONOTONIC_USEC: {msg:?}")).parse().unwrap();
        assert!(usec > 0, "{msg:?}");
        usec
    };

    env.skill("skills", "hup", "", "echo '{}'");
    d.signal(Signal::SIGHUP);
    let first = reloading_at(&recv(&notify, &d));
    let done = recv(&notify, &d);
    assert!(done.lines().any(|l| l == "READY=1"), "{done:?}");
    assert!(done.lines().any(|l| l == "STATUS=serving 6 skills (0 skipped)"), "{done:?}");

    env.skill("skills", "posted", "", "echo '{}'");
    let r = d.client().post("/v1/reload", &serde_json::json!({})).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let second = reloading_at(&recv(&notify, &d));
    assert!(second > first, "MONOTONIC_USEC went back: {first} then {second}");
    let done = recv(&notify, &d);
    assert!(done.lines().any(|l| l == "READY=1"), "{done:?}");
    assert!(done.lines().any(|l| l == "STATUS=serving 7 skills (0 skipped)"), "{done:?}");

    d.signal(Signal::SIGTERM);
    let stopping = recv(&notify, &d);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert!(d.wait_exit(Duration::from_secs(15)).success());
}

/// With a listening socket passed as fd 3 (`LISTEN_FDS=1`, `LISTEN_PID` =
/// the daemon's pid, as systemd passes `ongrid-skilld.socket`), the daemon
/// serves on it, leaves its mode alone, binds nothing at the configured
/// path, and leaves the socket file in place at exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_an_inherited_socket_and_leaves_it_in_place() {
    let env = Env::new();
    let skills = env.standard_skills();
    let activated = env.path("activated.sock");
    let listener = UnixListener::bind(&activated).unwrap();
    std::fs::set_permissions(&activated, std::fs::Permissions::from_mode(0o640)).unwrap();
    let fd = listener.as_raw_fd();
    // Inherited across exec (std opens everything close-on-exec).
    nix::fcntl::fcntl(&listener, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
        .unwrap();
    let (notify, path) = notify_socket(&env);
    // The wrapper moves the socket to fd 3 and sets LISTEN_PID to its own
    // pid, which `exec` hands to the daemon. A socket that is fd 3 already
    // (the lowest number free while other tests run) stays: `3<&3 3<&-`
    // would close it.
    let redirect = if fd == 3 { String::new() } else { format!("3<&{fd} {fd}<&-") };
    let mut d = Skilld::spawn(&env, &[&skills], "", |c| {
        let program = c.get_program().to_owned();
        let args: Vec<_> = c.get_args().map(ToOwned::to_owned).collect();
        let mut wrapped = std::process::Command::new("/bin/bash");
        wrapped
            .arg("-c")
            .arg(format!("LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\" {redirect}"))
            .arg(program)
            .args(args);
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => wrapped.env(k, v),
                None => wrapped.env_remove(k),
            };
        }
        wrapped
            .env("NOTIFY_SOCKET", &path)
            .stderr(std::fs::File::create(env.path("skilld.log")).unwrap());
        *c = wrapped;
    });
    drop(listener);
    let ready = recv(&notify, &d);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    let client = DaemonClient::new(&activated);
    let health = client.get("/v1/health").await.unwrap();
    assert!(health.status.is_success(), "{health:?}");
    assert_eq!(client.get("/v1/skills").await.unwrap().body["total"], 5);
    let mode = std::fs::metadata(&activated).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "the daemon changed the mode of the socket systemd owns");
    assert!(!d.socket.exists(), "bound the configured socket too");
    assert!(d.log().contains("socket_activation=true"), "{}", d.log());

    d.signal(Signal::SIGTERM);
    assert!(d.wait_exit(Duration::from_secs(15)).success());
    let meta = std::fs::symlink_metadata(&activated).expect("the socket file was removed");
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
}
