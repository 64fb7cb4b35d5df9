//! The socket node in a temporary directory: modes, owner, stale and live
//! nodes, and what a dropped node removes.

use std::os::unix::net::UnixListener as StdListener;

use super::*;

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn ino_of(path: &Path) -> u64 {
    fs::symlink_metadata(path).unwrap().ino()
}

fn executor_like() -> NodeOptions {
    NodeOptions {
        owner: Some(nix::unistd::geteuid().as_raw()),
        chown: Chown::IfRoot,
        parent_mode: Some(0o755),
        live: Live::ReplaceForeign { daemon: "an executor" },
        ..NodeOptions::new(0o660)
    }
}

#[tokio::test]
async fn the_node_gets_its_mode_and_goes_with_its_listener() {
    let dir = tempfile::tempdir().unwrap();
    for mode in [0o600, 0o660, 0o666] {
        let path = dir.path().join("s.sock");
        let (listener, node) = bind(&path, &NodeOptions::new(mode)).unwrap();
        assert_eq!(node.path(), path);
        assert_eq!(mode_of(&path), mode);
        assert!(!nobody_listens(&path));
        drop(listener);
        assert!(nobody_listens(&path), "stale once the listener is gone");
        drop(node);
        assert!(!path.exists(), "the node outlived its listener");
    }
}

#[tokio::test]
async fn a_node_still_listened_on_is_not_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let (listener, node) = bind(&path, &NodeOptions::new(0o600)).unwrap();
    drop(node);
    assert!(path.exists(), "removed under its listener");
    drop(listener);
}

#[tokio::test]
async fn a_node_bound_since_by_another_is_left_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let (listener, node) = bind(&path, &NodeOptions::new(0o600)).unwrap();
    drop(listener);
    let (other, other_node) = bind(&path, &NodeOptions::new(0o600)).unwrap();
    let inode = ino_of(&path);
    drop(node);
    assert_eq!(ino_of(&path), inode, "another daemon's node was removed");
    drop(other);
    drop(other_node);
    assert!(!path.exists());
}

#[tokio::test]
async fn a_missing_directory_is_created_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run/ongrid/s.sock");
    let refused = bind(&path, &NodeOptions::new(0o600)).unwrap_err();
    assert!(matches!(refused, SocketError::Io { what: "bind", .. }), "{refused:?}");
    let (_listener, _node) = bind(&path, &executor_like()).unwrap();
    assert_eq!(mode_of(&dir.path().join("run/ongrid")), 0o755);
    assert_eq!(mode_of(&dir.path().join("run")), 0o755);
    assert_eq!(mode_of(&path), 0o660);
}

#[tokio::test]
async fn a_stale_node_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    for opts in [NodeOptions::new(0o600), executor_like()] {
        drop(StdListener::bind(&path).unwrap());
        assert!(path.exists() && nobody_listens(&path));
        ensure_free(&path, &opts).unwrap();
        let (listener, node) = bind(&path, &opts).unwrap();
        assert!(!nobody_listens(&path));
        drop(listener);
        drop(node);
    }
}

#[tokio::test]
async fn a_live_node_of_our_own_uid_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let live = StdListener::bind(&path).unwrap();
    let inode = ino_of(&path);
    for opts in [NodeOptions::new(0o600), executor_like()] {
        let e = bind(&path, &opts).unwrap_err();
        assert!(matches!(e, SocketError::InUse { .. }), "{e:?}");
        assert!(e.to_string().contains("in use by a running daemon"), "{e}");
        assert!(matches!(ensure_free(&path, &opts), Err(SocketError::InUse { .. })));
        assert_eq!(ino_of(&path), inode, "the node was replaced");
    }
    drop(live);
}

#[tokio::test]
async fn what_is_not_a_socket_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    fs::write(&file, "keep").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(dir.path().join("elsewhere.sock"), &link).unwrap();
    for path in [&file, &link] {
        let e = bind(path, &executor_like()).unwrap_err();
        assert!(matches!(e, SocketError::NotASocket { .. }), "{e:?}");
        assert!(e.to_string().ends_with("exists and is not a socket; not replacing it"), "{e}");
        ensure_free(path, &executor_like()).unwrap();
    }
    assert_eq!(fs::read_to_string(&file).unwrap(), "keep");
    assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
}

/// A daemon whose backlog is full still answers (its clients wait): a
/// second `bind` on its path is refused instead of taking the path over
/// (a blocking probe would wait, a failed one took it for stale), and the
/// node stays.
#[tokio::test]
async fn a_live_socket_with_a_full_backlog_is_not_taken_over() {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let live = StdListener::bind(&path).unwrap();
    let addr = UnixAddr::new(&path).unwrap();
    let mut queued = Vec::new();
    loop {
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        if connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).is_err() {
            break;
        }
        queued.push(fd);
        assert!(queued.len() < 100_000, "the backlog never filled");
    }
    let inode = ino_of(&path);
    assert!(!nobody_listens(&path));
    for opts in [NodeOptions::new(0o600), executor_like()] {
        // Ours by the node's owner: this uid bound it.
        assert!(matches!(bind(&path, &opts), Err(SocketError::InUse { .. })));
        assert_eq!(ino_of(&path), inode, "the node was replaced");
    }
    drop(queued);
    drop(live);
    let (listener, node) = bind(&path, &NodeOptions::new(0o600)).unwrap();
    drop(listener);
    drop(node);
    assert!(!path.exists(), "the node outlived its listener");
}

#[test]
fn who_keeps_the_path() {
    let foreign = Live::ReplaceForeign { daemon: "an executor" };
    let me = 0;
    // skilld: any listener.
    assert!(keeps(Live::Refuse, None, Some(65534), 65534, me));
    assert!(keeps(Live::Refuse, None, None, 65534, me));
    // The executor: a listener of its uid, or behind a full backlog a node
    // of its uid or of the configured owner.
    assert!(keeps(foreign, None, Some(me), 65534, me));
    assert!(!keeps(foreign, None, Some(65534), me, me));
    assert!(keeps(foreign, None, None, me, me));
    assert!(keeps(foreign, Some(998), None, 998, me));
    assert!(!keeps(foreign, Some(998), None, 65534, me));
}

/// A node another user listens on is replaced when foreign listeners are,
/// with a warning; refused otherwise. Needs root (to listen as another
/// uid) and python3 (the listener).
#[tokio::test]
async fn a_node_another_user_listens_on() {
    if !nix::unistd::geteuid().is_root() || !Path::new("/usr/bin/python3").exists() {
        eprintln!("SKIP: needs root and /usr/bin/python3");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join("s.sock");
    let squatter = Squatter::start(&path);
    let e = bind(&path, &NodeOptions::new(0o600)).unwrap_err();
    assert!(matches!(e, SocketError::InUse { .. }), "{e:?}");
    let log = Log::default();
    let (listener, node) = {
        let _guard = tracing::subscriber::set_default(log.subscriber());
        bind(&path, &executor_like()).unwrap()
    };
    assert_eq!(fs::symlink_metadata(&path).unwrap().uid(), 0);
    let text = log.text();
    assert!(
        text.contains("answered by uid 65534, not by an executor (uid 0); replacing"),
        "{text}"
    );
    drop(squatter);
    drop(listener);
    drop(node);
    assert!(!path.exists());
}

/// A listener as uid 65534, killed and reaped when dropped.
struct Squatter(std::process::Child);

impl Squatter {
    fn start(path: &Path) -> Self {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        const SQUAT: &str = "import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(1)
print('ready', flush=True)
time.sleep(60)";
        let mut child = Squatter(
            std::process::Command::new("/usr/bin/python3")
                .args(["-c", SQUAT])
                .arg(path)
                .uid(65534)
                .gid(65534)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut ready = String::new();
        let out = child.0.stdout.take().unwrap();
        std::io::BufReader::new(out).read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "ready");
        child
    }
}

impl Drop for Squatter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// As root the owner and group are set (both policies); as another user
/// `IfRoot` leaves them and `Always` fails, removing the node.
#[tokio::test]
async fn the_owner_and_group_are_set_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let opts = NodeOptions { owner: Some(65534), group: Some(65534), ..NodeOptions::new(0o660) };
    if nix::unistd::geteuid().is_root() {
        for chown in [Chown::Always, Chown::IfRoot] {
            let (listener, node) = bind(&path, &NodeOptions { chown, ..opts.clone() }).unwrap();
            let meta = fs::symlink_metadata(&path).unwrap();
            assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777), (65534, 65534, 0o660));
            drop(listener);
            drop(node);
        }
    } else {
        let me = nix::unistd::geteuid().as_raw();
        let (listener, node) =
            bind(&path, &NodeOptions { chown: Chown::IfRoot, ..opts.clone() }).unwrap();
        assert_eq!(fs::symlink_metadata(&path).unwrap().uid(), me);
        drop(listener);
        drop(node);
        let e = bind(&path, &NodeOptions { chown: Chown::Always, ..opts }).unwrap_err();
        assert!(matches!(e, SocketError::Io { what: "chown", .. }), "{e:?}");
        assert!(!path.exists(), "a failed bind left its node");
    }
}

#[test]
fn owners_are_names_or_numbers() {
    let path = Path::new("/run/ongrid/executor.sock");
    assert_eq!(resolve_user(path, "root").unwrap(), 0);
    assert_eq!(resolve_user(path, "998").unwrap(), 998);
    assert_eq!(resolve_group(path, "0").unwrap(), 0);
    let e = resolve_group(path, "no-such-group-here").unwrap_err();
    assert_eq!(
        e.to_string(),
        "socket /run/ongrid/executor.sock: group \"no-such-group-here\" does not exist"
    );
    assert!(matches!(resolve_user(path, "no-such-user-here"), Err(SocketError::Unknown { .. })));
}

/// What a test logs, as text.
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Log {
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let log = self.clone();
        tracing_subscriber::fmt().with_writer(move || log.clone()).with_ansi(false).finish()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
