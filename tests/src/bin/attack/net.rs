//! Network escapes: TCP, UDP and ICMP to loopback listeners the test
//! opened, and Unix sockets outside the sandbox.

use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::time::Duration;

use serde_json::{json, Value};

use crate::{errno, io_errno, outcome, param};

/// One ICMP echo request to the IPv4 `addr` from a socket of `kind` (a
/// ping socket with `SOCK_DGRAM`, a raw one with `SOCK_RAW`).
pub(crate) fn icmp_echo(addr: &str, kind: libc::c_int) -> Result<Value, i32> {
    let ip: std::net::Ipv4Addr = addr.parse().map_err(|_| libc::EINVAL)?;
    // SAFETY: plain socket(2) call with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, kind, libc::IPPROTO_ICMP) };
    if fd < 0 {
        return Err(errno());
    }
    // Echo request: type 8, code 0; ping sockets fill in id and checksum.
    let mut pkt = [8u8, 0, 0, 0, 0, 0, 0, 1];
    let sum = !(0x0800u16.wrapping_add(1));
    pkt[2..4].copy_from_slice(&sum.to_be_bytes());
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: `pkt` and `sa` are valid for the lengths passed; fd is ours.
    let n = unsafe {
        libc::sendto(
            fd,
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            std::ptr::from_ref(&sa).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let e = errno();
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    if n < 0 {
        Err(e)
    } else {
        Ok(json!({"sent": n}))
    }
}

/// Binds one end of a Unix stream pair to the abstract `name`: no
/// `socket(2)` needed, and the name is held in the host's network
/// namespace for as long as the socket lives.
fn abstract_bind(name: &str) -> Result<Value, i32> {
    let mut sv = [-1; 2];
    // SAFETY: `sv` has room for the two descriptors socketpair writes.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) } < 0 {
        return Err(errno());
    }
    // SAFETY: an all-zero sockaddr_un is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    if bytes.len() + 1 > sa.sun_path.len() {
        return Err(libc::EINVAL);
    }
    // sun_path[0] stays 0: an abstract name.
    for (d, &b) in sa.sun_path[1..].iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len();
    // SAFETY: `sa` is valid for `len` bytes; sv[0] is our socket.
    let r = unsafe { libc::bind(sv[0], std::ptr::from_ref(&sa).cast(), len as libc::socklen_t) };
    let e = errno();
    // SAFETY: both descriptors are ours and closed once.
    unsafe {
        libc::close(sv[0]);
        libc::close(sv[1]);
    }
    if r < 0 {
        Err(e)
    } else {
        Ok(json!({}))
    }
}

/// Runs one network case.
pub(crate) fn attempt(case: &str, args: &Value) -> Value {
    let addr = param(args, "addr");
    let r = match case {
        "tcp_connect" => match addr.parse::<SocketAddr>() {
            Err(_) => Err(libc::EINVAL),
            Ok(sa) => TcpStream::connect_timeout(&sa, Duration::from_secs(2))
                .map(|_| json!({}))
                .map_err(|e| io_errno(&e)),
        },
        "udp_send" => match addr.parse::<SocketAddr>() {
            Err(_) => Err(libc::EINVAL),
            Ok(sa) => {
                let local = if sa.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
                UdpSocket::bind(local)
                    .and_then(|s| s.send_to(b"ongrid-udp", sa))
                    .map(|n| json!({"sent": n}))
                    .map_err(|e| io_errno(&e))
            }
        },
        "icmp" => icmp_echo(addr, libc::SOCK_DGRAM),
        "raw_socket" => icmp_echo(addr, libc::SOCK_RAW),
        "unix_abstract" => std::os::unix::net::SocketAddr::from_abstract_name(param(args, "name"))
            .and_then(|sa| UnixStream::connect_addr(&sa))
            .map(|_| json!({}))
            .map_err(|e| io_errno(&e)),
        "unix_abstract_bind" => abstract_bind(param(args, "name")),
        "unix_path" => {
            UnixStream::connect(param(args, "path")).map(|_| json!({})).map_err(|e| io_errno(&e))
        }
        // No socket(2) needed: an unbound datagram socket from a pair can
        // still send to any pathname socket by name (`/dev/log`).
        "unix_dgram" => UnixDatagram::pair()
            .and_then(|(a, _b)| a.send_to(b"ongrid-dgram", param(args, "path")))
            .map(|n| json!({"sent": n}))
            .map_err(|e| io_errno(&e)),
        _ => Err(-1),
    };
    outcome(case, r)
}
