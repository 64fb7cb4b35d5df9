//! Network confinement: without the grant nothing leaves the
//! box, not even to loopback listeners this test opens; with the grant TCP
//! and UDP work.

use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::Path;

use ongrid_tests::run::unsandboxed;
use ongrid_tests::{host, Config};
use serde_json::json;

use crate::{allowed, args, attack, blocked, blocked_with, no_leftovers, shared};

fn nothing_accepted(l: &TcpListener) {
    l.set_nonblocking(true).expect("nonblocking");
    match l.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the listener got a connection from the sandbox: {other:?}"),
    }
}

fn nothing_received(s: &UdpSocket) {
    s.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 64];
    match s.recv_from(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("a datagram from the sandbox arrived: {other:?}"),
    }
}

/// TCP to a loopback listener fails without the grant (v4 and v6).
#[test]
fn tcp_to_loopback_fails_without_grant() {
    let Some(g) = shared("tcp_to_loopback_fails_without_grant") else { return };
    let skill = attack("tcp");
    for bind in ["127.0.0.1:0", "[::1]:0"] {
        let Ok(l) = TcpListener::bind(bind) else {
            host::skip("tcp_to_loopback_fails_without_grant", &format!("cannot bind {bind}"));
            continue;
        };
        let addr = l.local_addr().expect("addr").to_string();
        let run = skill.run(&Config::new(), &args("tcp_connect", json!({"addr": addr})));
        blocked(&run);
        nothing_accepted(&l);
    }
    no_leftovers(&skill, &g);
}

/// UDP to a loopback socket fails without the grant.
#[test]
fn udp_to_loopback_fails_without_grant() {
    let Some(g) = shared("udp_to_loopback_fails_without_grant") else { return };
    let skill = attack("udp");
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    let addr = s.local_addr().expect("addr").to_string();
    let run = skill.run(&Config::new(), &args("udp_send", json!({"addr": addr})));
    blocked(&run);
    nothing_received(&s);
    no_leftovers(&skill, &g);
}

/// ICMP (ping socket and raw socket) fails without the grant.
#[test]
fn icmp_fails_without_grant() {
    let Some(g) = shared("icmp_fails_without_grant") else { return };
    let skill = attack("icmp");
    for case in ["icmp", "raw_socket"] {
        let run = skill.run(&Config::new(), &args(case, json!({"addr": "127.0.0.1"})));
        blocked_with(&run, &[libc::EPERM, libc::EACCES, libc::EAFNOSUPPORT, libc::ENOSYS]);
    }
    no_leftovers(&skill, &g);
}

/// With `sandbox.network` granted and the loopback ports named in the
/// grant's `connect` list (loopback is refused unless named), TCP and UDP
/// to them work, and the report says so.
#[test]
fn granted_network_reaches_loopback() {
    let Some(g) = shared("granted_network_reaches_loopback") else { return };
    let skill = attack("net_granted").with("sandbox", json!({"network": true}));
    let l = TcpListener::bind("127.0.0.1:0").expect("bind tcp");
    let addr = l.local_addr().expect("addr").to_string();
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    let udp = s.local_addr().expect("addr").to_string();
    let config = Config::new()
        .grant(skill.name(), &format!("network = true\nconnect = [\"{addr}\", \"{udp}\"]"));
    let run = skill.run(&config, &args("tcp_connect", json!({"addr": addr})));
    allowed(&run);
    assert!(
        run.report
            .sandbox
            .as_ref()
            .is_some_and(|s| s.network.enabled && s.network.enforced.contains(&addr)),
        "report: network not granted:\n{}",
        run.dump()
    );
    l.set_nonblocking(true).expect("nonblocking");
    assert!(l.accept().is_ok(), "granted TCP connect did not arrive");
    let addr = udp;
    let run = skill.run(&config, &args("udp_send", json!({"addr": addr})));
    allowed(&run);
    s.set_read_timeout(Some(std::time::Duration::from_secs(1))).expect("timeout");
    let mut buf = [0u8; 64];
    let (n, _) = s.recv_from(&mut buf).expect("granted datagram arrives");
    assert_eq!(&buf[..n], b"ongrid-udp");
    no_leftovers(&skill, &g);
}

/// An abstract Unix socket outside the sandbox is unreachable
/// (Landlock scope, ABI >= 6).
#[test]
fn abstract_unix_socket_is_unreachable() {
    let Some(g) = shared("abstract_unix_socket_is_unreachable") else { return };
    let skill = attack("abstract_unix");
    let name = format!("ongrid-sbx-{}", skill.marker());
    let l = UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name).expect("name"))
        .expect("bind abstract socket");
    let run = skill.run(&Config::new(), &args("unix_abstract", json!({"name": name})));
    blocked_with(&run, &[libc::EPERM, libc::EACCES]);
    l.set_nonblocking(true).expect("nonblocking");
    assert!(l.accept().is_err(), "the abstract socket got a connection from the sandbox");
    no_leftovers(&skill, &g);
}

/// Without the network grant a run cannot hold an abstract name in the
/// host's network namespace (one end of a socket pair bound to it would
/// keep a host service from binding it): `bind` is refused. It works
/// unsandboxed as the same user.
#[test]
fn abstract_unix_name_cannot_be_bound() {
    let Some(g) = shared("abstract_unix_name_cannot_be_bound") else { return };
    let skill = attack("abstract_bind");
    let a = args("unix_abstract_bind", json!({"name": format!("ongrid-sbx-{}", skill.marker())}));
    let (uid, gid) = host::skill_user();
    let base = unsandboxed(Path::new(crate::ATTACK), uid, gid, &a);
    assert_eq!(base["succeeded"], json!(true), "baseline: bind fails unsandboxed: {base}");
    let run = skill.run(&Config::new(), &a);
    blocked_with(&run, &[libc::EPERM]);
    no_leftovers(&skill, &g);
}

/// A world-connectable pathname Unix socket outside the sandbox
/// (a stand-in for the loader's client socket, D-Bus, docker.sock) is
/// unreachable.
#[test]
fn pathname_unix_socket_outside_is_unreachable() {
    let Some(g) = shared("pathname_unix_socket_outside_is_unreachable") else { return };
    let skill = attack("path_unix");
    let dir = tempfile::Builder::new().prefix("ongrid-sbx-sock-").tempdir().expect("dir");
    ongrid_tests::skill::set_mode(dir.path(), 0o777);
    let path = dir.path().join("s");
    let l = UnixListener::bind(&path).expect("bind socket");
    ongrid_tests::skill::set_mode(&path, 0o777);
    let run = skill.run(&Config::new(), &args("unix_path", json!({"path": path})));
    blocked(&run);
    l.set_nonblocking(true).expect("nonblocking");
    assert!(l.accept().is_err(), "the socket got a connection from the sandbox");
    no_leftovers(&skill, &g);
}

/// A datagram pair (no `socket(2)` needed) cannot send to a
/// pathname datagram socket outside the sandbox by name (`/dev/log`,
/// journald's socket): `socketpair` is allowed for stream and seqpacket
/// pairs only. As the same user unsandboxed the datagram arrives.
#[test]
fn pathname_datagram_socket_outside_is_unreachable() {
    let Some(g) = shared("pathname_datagram_socket_outside_is_unreachable") else { return };
    let skill = attack("path_dgram");
    let dir = tempfile::Builder::new().prefix("ongrid-sbx-dgram-").tempdir().expect("dir");
    ongrid_tests::skill::set_mode(dir.path(), 0o777);
    let path = dir.path().join("log");
    let l = std::os::unix::net::UnixDatagram::bind(&path).expect("bind socket");
    ongrid_tests::skill::set_mode(&path, 0o777);
    l.set_nonblocking(true).expect("nonblocking");
    let a = args("unix_dgram", json!({"path": path}));
    let (uid, gid) = host::skill_user();
    let base = unsandboxed(Path::new(crate::ATTACK), uid, gid, &a);
    assert_eq!(base["succeeded"], json!(true), "baseline: the datagram was not sent: {base}");
    let mut buf = [0u8; 64];
    assert_eq!(l.recv(&mut buf).ok(), Some(12), "baseline: nothing arrived");
    let run = skill.run(&Config::new(), &a);
    blocked_with(&run, &[libc::EPERM]);
    assert!(l.recv(&mut buf).is_err(), "a datagram from the sandbox arrived");
    no_leftovers(&skill, &g);
}
