//! The socket node: its mode and group, stale and foreign sockets, a
//! second `serve` on a live socket.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use executor::Config;

use crate::support::*;

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
