//! Egress allowlist probes: a batch of connects and sends, each timed,
//! made directly or from a forked, `setsid`, double-forked or exec'd
//! process, or on a socket made before a fork (the child connects it).
//!
//! `{"case": "egress", "cases": [{"kind": K, "addr": "HOST:PORT"}, ...]}`
//! prints `{"results": [{"errno": N, "ms": F}, ...]}`, errno 0 on success.
//! Kinds: `tcp`, `udp_sendto`, `udp_connect`, `icmp` (a ping socket,
//! `addr` an IPv4 address), `inherit` (TCP socket made by the parent,
//! connected by a forked child), `passed` (TCP socket made by a forked
//! child, passed to the parent over a Unix socket and connected there),
//! `udp_broadcast` (`SO_BROADCAST` set, then a `sendto`), `socket` (a
//! `socket(2)` of the case's `family`, `type` and `protocol` numbers),
//! `rthdr` (an IPv6 segment routing header naming `addr` set on a UDP
//! socket: `setsockopt` only, nothing sent), `ip_options` (a NOP option
//! set on a UDP socket), `rthdr_cmsg` (a UDP datagram to `addr` whose
//! `sendmsg` carries a Mobile IPv6 routing header naming `addr` again),
//! and `fork`, `setsid`, `double_fork`, `exec` wrapping a `case`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{errno, io_errno, param};

fn sockaddr(addr: &str) -> Result<SocketAddr, i32> {
    addr.parse::<SocketAddr>().map_err(|_| libc::EINVAL)
}

/// An ICMP echo request from a ping socket ([`crate::net::icmp_echo`]).
fn ping(addr: &str) -> i32 {
    crate::net::icmp_echo(addr, libc::SOCK_DGRAM).err().unwrap_or(0)
}

/// A TCP socket made here, connected by a forked child.
fn inherit(addr: &str) -> i32 {
    let sa = match sockaddr(addr) {
        Ok(sa) => sa,
        Err(e) => return e,
    };
    let family = if sa.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return errno();
    }
    // SAFETY: `fd` is the parent's socket of `sa`'s family, inherited.
    let e = in_child(false, false, &|| unsafe { raw_connect(fd, sa) });
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    e
}

/// `connect(2)` of the raw socket `fd` to `sa`; the errno or 0.
///
/// # Safety
///
/// `fd` must be an open socket of `sa`'s family.
unsafe fn raw_connect(fd: i32, sa: SocketAddr) -> i32 {
    let r = match sa {
        SocketAddr::V4(a) => {
            let s = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: `s` is valid for its length.
            unsafe {
                libc::connect(
                    fd,
                    std::ptr::from_ref(&s).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
        }
        SocketAddr::V6(a) => {
            let s = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: 0,
            };
            // SAFETY: `s` is valid for its length.
            unsafe {
                libc::connect(
                    fd,
                    std::ptr::from_ref(&s).cast(),
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    };
    if r < 0 {
        errno()
    } else {
        0
    }
}

/// Runs `f` in a forked child (after `setsid`, or in a grandchild) and
/// returns the errno it wrote back (-1 when none came).
fn in_child(setsid: bool, double: bool, f: &dyn Fn() -> i32) -> i32 {
    let mut p = [-1; 2];
    // SAFETY: `p` has room for two descriptors.
    if unsafe { libc::pipe(p.as_mut_ptr()) } < 0 {
        return errno();
    }
    // SAFETY: this binary is single-threaded; the child only runs `f` and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: setsid and fork in the child, which exits with _exit.
        unsafe {
            if setsid {
                libc::setsid();
            }
            if double && libc::fork() != 0 {
                libc::_exit(0);
            }
            let e = f();
            let mut w = std::fs::File::from_raw_fd(p[1]);
            let _ = w.write_all(&e.to_ne_bytes());
            libc::_exit(0);
        }
    }
    // SAFETY: the write end is ours to close; the read end is owned once.
    let mut r = unsafe {
        libc::close(p[1]);
        std::fs::File::from_raw_fd(p[0])
    };
    let mut b = [0u8; 4];
    let e = if r.read_exact(&mut b).is_ok() { i32::from_ne_bytes(b) } else { -1 };
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    e
}

/// The same case run by a new copy of this binary.
fn exec(case: &Value) -> i32 {
    let input = json!({"case": "egress", "cases": [case]}).to_string();
    let child = std::process::Command::new("/proc/self/exe")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else { return -1 };
    if let Some(mut i) = child.stdin.take() {
        let _ = i.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map(|o| o.stdout).unwrap_or_default();
    let v: Value = serde_json::from_slice(&out).unwrap_or_default();
    v["results"][0]["errno"].as_i64().and_then(|e| i32::try_from(e).ok()).unwrap_or(-1)
}

fn one(c: &Value) -> i32 {
    let addr = param(c, "addr");
    let sub = &c["case"];
    match param(c, "kind") {
        "tcp" => sockaddr(addr).map_or_else(
            |e| e,
            |sa| {
                TcpStream::connect_timeout(&sa, Duration::from_secs(2))
                    .map_or_else(|e| io_errno(&e), |_| 0)
            },
        ),
        "udp_sendto" | "udp_connect" => sockaddr(addr).map_or_else(
            |e| e,
            |sa| {
                let local = if sa.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
                let r = UdpSocket::bind(local).and_then(|s| {
                    if param(c, "kind") == "udp_connect" {
                        s.connect(sa).and_then(|()| s.send(b"ongrid-udp"))
                    } else {
                        s.send_to(b"ongrid-udp", sa)
                    }
                });
                r.map_or_else(|e| io_errno(&e), |_| 0)
            },
        ),
        "udp_broadcast" => sockaddr(addr).map_or_else(
            |e| e,
            |sa| {
                let r = UdpSocket::bind("0.0.0.0:0")
                    .and_then(|s| s.set_broadcast(true).and_then(|()| s.send_to(b"ongrid", sa)));
                r.map_or_else(|e| io_errno(&e), |_| 0)
            },
        ),
        "socket" => {
            let n = |k: &str| c[k].as_i64().and_then(|v| i32::try_from(v).ok()).unwrap_or(-1);
            // SAFETY: plain socket(2) call; the descriptor is closed here.
            let fd = unsafe { libc::socket(n("family"), n("type"), n("protocol")) };
            if fd < 0 {
                return errno();
            }
            // SAFETY: fd is ours and closed once.
            unsafe { libc::close(fd) };
            0
        }
        "rthdr" => sockopt(libc::AF_INET6, libc::IPPROTO_IPV6, libc::IPV6_RTHDR, &srh(addr)),
        "ip_options" => sockopt(libc::AF_INET, libc::IPPROTO_IP, libc::IP_OPTIONS, &[1, 1, 1, 0]),
        "rthdr_cmsg" => sockaddr(addr).map_or_else(|e| e, rthdr_cmsg),
        "icmp" => ping(addr),
        "inherit" => inherit(addr),
        "passed" => passed(addr),
        "fork" => in_child(false, false, &|| one(sub)),
        "setsid" => in_child(true, false, &|| one(sub)),
        "double_fork" => in_child(true, true, &|| one(sub)),
        "exec" => exec(sub),
        _ => libc::EINVAL,
    }
}

/// A type 4 (segment) IPv6 routing header of one segment, `addr`.
fn srh(addr: &str) -> Vec<u8> {
    let ip: std::net::Ipv6Addr = addr.parse().unwrap_or(std::net::Ipv6Addr::LOCALHOST);
    // Next header, length in 8-byte units past the first 8, type 4,
    // segments left 0, last entry 0, flags, tag; then the segment.
    let mut h = vec![0, 2, 4, 0, 0, 0, 0, 0];
    h.extend_from_slice(&ip.octets());
    h
}

/// A UDP datagram to the IPv6 `sa` whose `sendmsg` carries, as control
/// data, a type 2 routing header (one segment: `sa`'s address again).
/// Kernels without Mobile IPv6 refuse the header (`EINVAL`).
fn rthdr_cmsg(sa: SocketAddr) -> i32 {
    let SocketAddr::V6(v6) = sa else { return libc::EINVAL };
    let mut header = vec![0u8, 2, 2, 1, 0, 0, 0, 0];
    header.extend_from_slice(&v6.ip().octets());
    let len = u32::try_from(header.len()).unwrap_or(0);
    // SAFETY: the control buffer is sized by CMSG_SPACE for one header of
    // `len` bytes; every pointer is into locals alive for the call.
    unsafe {
        let fd = libc::socket(libc::AF_INET6, libc::SOCK_DGRAM, 0);
        if fd < 0 {
            return errno();
        }
        let mut control = vec![0u8; libc::CMSG_SPACE(len) as usize];
        let mut to: libc::sockaddr_in6 = std::mem::zeroed();
        to.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        to.sin6_port = v6.port().to_be();
        to.sin6_addr.s6_addr = v6.ip().octets();
        let mut payload = *b"ongrid";
        let mut iov = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_name = (&raw mut to).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len();
        let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        (*cmsg).cmsg_level = libc::IPPROTO_IPV6;
        (*cmsg).cmsg_type = libc::IPV6_RTHDR;
        (*cmsg).cmsg_len = libc::CMSG_LEN(len) as usize;
        std::ptr::copy_nonoverlapping(header.as_ptr(), libc::CMSG_DATA(cmsg), header.len());
        let r = libc::sendmsg(fd, &raw const msg, 0);
        let e = if r < 0 { errno() } else { 0 };
        libc::close(fd);
        e
    }
}

/// `setsockopt(level, name, value)` on a new UDP socket of `family`; the
/// errno or 0.
fn sockopt(family: i32, level: i32, name: i32, value: &[u8]) -> i32 {
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM, 0) };
    if fd < 0 {
        return errno();
    }
    let len = libc::socklen_t::try_from(value.len()).unwrap_or(0);
    // SAFETY: `value` is valid for `len` bytes; fd is ours.
    let r = unsafe { libc::setsockopt(fd, level, name, value.as_ptr().cast(), len) };
    let e = if r == 0 { 0 } else { errno() };
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    e
}

/// Runs the batch.
pub(crate) fn attempt(args: &Value) -> Value {
    let cases = args["cases"].as_array().cloned().unwrap_or_default();
    let results: Vec<Value> = cases
        .iter()
        .map(|c| {
            let t = Instant::now();
            let e = one(c);
            json!({"errno": e, "ms": t.elapsed().as_secs_f64() * 1e3})
        })
        .collect();
    json!({"attempt": "egress", "succeeded": true, "errno": null, "results": results})
}

/// A TCP socket made by a forked child and passed to this process over a
/// Unix socket (`SCM_RIGHTS`), connected here.
fn passed(addr: &str) -> i32 {
    use nix::sys::socket::{
        recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
        SockFlag, SockType,
    };
    use std::os::fd::AsRawFd;
    let sa = match sockaddr(addr) {
        Ok(sa) => sa,
        Err(e) => return e,
    };
    let Ok((ours, theirs)) =
        socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
    else {
        return errno();
    };
    let family = if sa.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    let sent = in_child(false, false, &|| {
        // SAFETY: plain socket(2) call.
        let fd = unsafe { libc::socket(family, libc::SOCK_STREAM, 0) };
        if fd < 0 {
            return errno();
        }
        let iov = [std::io::IoSlice::new(b"s")];
        let rights = [fd];
        let cmsg = [ControlMessage::ScmRights(&rights)];
        sendmsg::<()>(theirs.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
            .map_or_else(|e| e as i32, |_| 0)
    });
    if sent != 0 {
        return sent;
    }
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let fd = match recvmsg::<()>(ours.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::empty()) {
        Ok(msg) => msg.cmsgs().ok().and_then(|mut c| {
            c.find_map(|m| match m {
                ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
                _ => None,
            })
        }),
        Err(e) => return e as i32,
    };
    let Some(fd) = fd else { return -1 };
    // SAFETY: `fd` is the passed socket of `sa`'s family, ours from here.
    let e = unsafe { raw_connect(fd, sa) };
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    e
}
