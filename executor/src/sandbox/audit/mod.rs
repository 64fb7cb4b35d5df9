//! The kernel's audit, as far as the executor uses it: its status read
//! and set over the audit netlink socket (`AUDIT_GET`, `AUDIT_SET`:
//! `CAP_AUDIT_CONTROL`), and the records it multicasts to readers of the
//! `AUDIT_NLGRP_READLOG` group (`CAP_AUDIT_READ`), from which a run's
//! Landlock and seccomp refusals are taken ([`record`]).
//!
//! The kernel sends the multicast copy from the initial network namespace
//! only: an executor in another one (systemd's `PrivateNetwork=yes`) reads
//! nothing, and reports say so.

pub mod record;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    bind, recv, sendto, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr,
    SockFlag, SockProtocol, SockType,
};

/// `AUDIT_GET`: the status.
const AUDIT_GET: u16 = 1000;
/// `AUDIT_SET`: change the status fields named in `mask`.
const AUDIT_SET: u16 = 1001;
/// `NLMSG_ERROR`: the acknowledgement of a request.
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
/// The multicast group of every record (`AUDIT_NLGRP_READLOG`).
const NLGRP_READLOG: u32 = 1;
/// `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;

/// `AUDIT_STATUS_*` mask bits of the fields [`set`] changes.
pub mod mask {
    /// `enabled`.
    pub const ENABLED: u32 = 0x1;
    /// `rate_limit`.
    pub const RATE_LIMIT: u32 = 0x8;
    /// `backlog_limit`.
    pub const BACKLOG_LIMIT: u32 = 0x10;
    /// `backlog_wait_time`.
    pub const BACKLOG_WAIT_TIME: u32 = 0x20;
}

/// The fields of `struct audit_status` the executor reads or sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// 0 off, 1 on, 2 on and locked.
    pub enabled: u32,
    /// Records per second past which records are dropped (0: no limit).
    pub rate_limit: u32,
    /// Records queued in the kernel past which new ones are dropped (or
    /// their makers wait, up to `backlog_wait_time`).
    pub backlog_limit: u32,
    /// Records lost so far (rate limit, backlog, memory).
    pub lost: u32,
    /// How long a task making a record may wait for room (jiffies).
    pub backlog_wait_time: u32,
}

impl Status {
    /// `struct audit_status` (eleven `u32`s) with `mask`.
    fn encode(&self, mask: u32) -> [u8; 44] {
        let f = [
            mask,
            self.enabled,
            0,
            0,
            self.rate_limit,
            self.backlog_limit,
            0,
            0,
            0,
            self.backlog_wait_time,
            0,
        ];
        let mut out = [0u8; 44];
        for (chunk, v) in out.chunks_exact_mut(4).zip(f) {
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
        out
    }

    /// From the payload of an `AUDIT_GET` answer; `None` when short.
    fn decode(b: &[u8]) -> Option<Self> {
        let word = |i: usize| -> Option<u32> {
            b.get(i * 4..i * 4 + 4).and_then(|w| w.try_into().ok()).map(u32::from_ne_bytes)
        };
        Some(Status {
            enabled: word(1)?,
            rate_limit: word(4)?,
            backlog_limit: word(5)?,
            lost: word(6)?,
            backlog_wait_time: word(9).unwrap_or(0),
        })
    }
}

/// Why the audit socket could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The socket could not be made (audit compiled out) or bound
    /// (`CAP_AUDIT_READ` missing for the group).
    #[error("audit netlink socket: {0}")]
    Socket(#[source] io::Error),
    /// A request failed (`EPERM` without `CAP_AUDIT_CONTROL`).
    #[error("audit {what}: {source}")]
    Request {
        /// `AUDIT_GET` or `AUDIT_SET`.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

fn io_err(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

fn open(groups: u32) -> io::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkAudit,
    )
    .map_err(io_err)?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups)).map_err(io_err)?;
    Ok(fd)
}

/// One request and its first answer of type `want` (or the
/// acknowledgement's error).
fn request(kind: u16, flags: u16, payload: &[u8], want: u16) -> io::Result<Vec<u8>> {
    let fd = open(0)?;
    setsockopt(&fd, sockopt::ReceiveTimeout, &nix::sys::time::TimeVal::new(1, 0))
        .map_err(io_err)?;
    let len = u32::try_from(NLMSG_HDRLEN + payload.len()).unwrap_or(u32::MAX);
    let mut msg = Vec::with_capacity(NLMSG_HDRLEN + payload.len());
    msg.extend_from_slice(&len.to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(payload);
    sendto(fd.as_raw_fd(), &msg, &NetlinkAddr::new(0, 0), MsgFlags::empty()).map_err(io_err)?;
    let mut buf = vec![0u8; 8192];
    for _ in 0..4 {
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(io_err)?;
        let got = buf.get(..n).unwrap_or_default();
        let Some(t) = got.get(4..6).and_then(|b| b.try_into().ok()).map(u16::from_ne_bytes) else {
            continue;
        };
        if t == NLMSG_ERROR {
            let code = got
                .get(NLMSG_HDRLEN..NLMSG_HDRLEN + 4)
                .and_then(|b| b.try_into().ok())
                .map_or(0, i32::from_ne_bytes);
            if code != 0 {
                return Err(io::Error::from_raw_os_error(-code));
            }
            if want == NLMSG_ERROR {
                return Ok(Vec::new());
            }
        } else if t == want {
            return Ok(got.get(NLMSG_HDRLEN..).unwrap_or_default().to_vec());
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "no answer from the kernel's audit"))
}

/// The kernel's audit status.
///
/// # Errors
///
/// [`AuditError`]: no audit in the kernel, no permission.
pub fn status() -> Result<Status, AuditError> {
    let fail = |source| AuditError::Request { what: "AUDIT_GET", source };
    let payload = request(AUDIT_GET, 0, &[], AUDIT_GET).map_err(fail)?;
    Status::decode(&payload)
        .ok_or_else(|| fail(io::Error::new(io::ErrorKind::InvalidData, "short audit status")))
}

/// Sets the fields of `status` named by `mask` (see [`mask`]).
///
/// # Errors
///
/// [`AuditError`]: no permission (`CAP_AUDIT_CONTROL`), audit locked.
pub fn set(status: &Status, mask: u32) -> Result<(), AuditError> {
    request(AUDIT_SET, NLM_F_ACK, &status.encode(mask), NLMSG_ERROR)
        .map(drop)
        .map_err(|source| AuditError::Request { what: "AUDIT_SET", source })
}

/// A socket subscribed to every audit record, non-blocking, with a
/// receive buffer of `buffer` bytes where the kernel allows it.
///
/// # Errors
///
/// [`AuditError::Socket`]: no audit in the kernel, no `CAP_AUDIT_READ`.
pub fn subscribe(buffer: usize) -> Result<OwnedFd, AuditError> {
    let fd = open(1 << (NLGRP_READLOG - 1)).map_err(AuditError::Socket)?;
    // Past `rmem_max` only with CAP_NET_ADMIN; the plain size otherwise.
    if setsockopt(&fd, sockopt::RcvBufForce, &buffer).is_err() {
        let _ = setsockopt(&fd, sockopt::RcvBuf, &buffer);
    }
    nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
        .map_err(|e| AuditError::Socket(io_err(e)))?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_through_its_layout() {
        let s = Status {
            enabled: 1,
            rate_limit: 200,
            backlog_limit: 8192,
            lost: 0,
            backlog_wait_time: 0,
        };
        let b = s.encode(mask::ENABLED | mask::RATE_LIMIT);
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()), 0x9);
        assert_eq!(Status::decode(&b), Some(s));
        assert_eq!(Status::decode(&b[..12]), None);
    }
}
