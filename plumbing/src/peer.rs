//! The other end of a connected Unix socket: whether it is gone.
//!
//! A read of EOF alone does not say the peer left: a client that sends its
//! request and then shuts down its write side (`shutdown(SHUT_WR)`) still
//! waits for the answer, and its runs must go on. Only when both directions
//! are closed does the kernel report `POLLHUP` on an `AF_UNIX` stream; both
//! daemons ask this after a read returned EOF, to tell the two apart.

use std::os::fd::AsFd;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Returns true if and only if the peer closed its end in both directions:
/// a Unix socket reports `POLLHUP` (or `POLLERR`) then, but only `POLLIN`
/// (EOF) after a `shutdown(SHUT_WR)`. Never blocks; a failed `poll` counts
/// as still there.
#[must_use]
pub fn hung_up<F: AsFd>(stream: &F) -> bool {
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => {
            fds[0].revents().is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::Shutdown;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn a_peer_that_is_there_has_not_hung_up() {
        let (a, mut b) = UnixStream::pair().unwrap();
        assert!(!hung_up(&a));
        b.write_all(b"x").unwrap();
        assert!(!hung_up(&a), "data to read is no hang-up");
    }

    #[test]
    fn a_peer_that_only_stopped_writing_has_not_hung_up() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.shutdown(Shutdown::Write).unwrap();
        let mut buf = [0; 1];
        assert_eq!(a.read(&mut buf).unwrap(), 0, "EOF");
        assert!(!hung_up(&a), "it still reads the answer");
        a.write_all(b"answer").unwrap();
    }

    #[test]
    fn a_closed_peer_has_hung_up() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        assert!(hung_up(&a));
        let (a, b) = UnixStream::pair().unwrap();
        b.shutdown(Shutdown::Both).unwrap();
        assert!(hung_up(&a), "both directions shut down");
    }
}
