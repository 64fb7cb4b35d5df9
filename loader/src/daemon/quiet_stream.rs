//! A Unix stream that asks the reactor for write readiness only while a
//! write is blocked.
//!
//! A `tokio::net::UnixStream` is registered with epoll for reading and
//! writing, edge-triggered. On a Unix stream socket every read by the peer
//! frees send space and wakes the writer's wait queue (`unix_write_space`),
//! so each message this side sends comes back as an `EPOLLOUT` edge once
//! the peer has read it: a wake-up of a parked runtime thread that finds
//! nothing to do. `strace` of a serving skilld counted 444 of its 1,038
//! `epoll_wait` returns over 3 s of sequential runs carrying `EPOLLOUT`
//! alone: about one and a half per run, each a thread woken (on this
//! machine kind, often a halted vCPU) for nothing.
//!
//! [`QuietStream`] registers the socket for reading only. A write goes
//! straight to the socket; only when it would block (the peer's buffer is
//! full: a large answer to a slow reader) is a duplicate of the descriptor
//! registered for writing, and it is dropped again once a write goes
//! through. Messages that fit in the socket buffer, nearly all of them,
//! never ask for write readiness.

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream as StdStream;
use std::path::Path;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;

/// A non-blocking Unix stream registered for reading only; see the module
/// docs.
#[derive(Debug)]
pub struct QuietStream {
    io: AsyncFd<StdStream>,
    /// A duplicate registered for writing while a write is blocked.
    writable: Option<AsyncFd<StdStream>>,
    /// Writes that would have blocked (tests check the path was taken).
    #[cfg(test)]
    blocked: usize,
}

impl QuietStream {
    /// Takes over a tokio stream (its registration is dropped first).
    ///
    /// # Errors
    ///
    /// Deregistering or registering the socket failed.
    pub fn from_tokio(stream: UnixStream) -> io::Result<Self> {
        // `into_std` leaves the socket non-blocking.
        Ok(Self {
            io: register(stream.into_std()?, Interest::READABLE)?,
            writable: None,
            #[cfg(test)]
            blocked: 0,
        })
    }

    /// Connects to `path`.
    ///
    /// # Errors
    ///
    /// The `connect` error, or registering the socket failed.
    pub async fn connect(path: &Path) -> io::Result<Self> {
        Self::from_tokio(UnixStream::connect(path).await?)
    }

    /// The socket.
    pub fn get_ref(&self) -> &StdStream {
        self.io.get_ref()
    }

    /// Runs one non-blocking write `op`; on `WouldBlock`, waits for write
    /// readiness on a duplicate registered for it (made on the first such
    /// write, dropped once a write goes through).
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        mut op: impl FnMut(&StdStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            if let Some(w) = self.writable.as_ref() {
                let mut guard = ready!(w.poll_write_ready(cx))?;
                if let Ok(r) = guard.try_io(|_| op(self.io.get_ref())) {
                    drop(guard);
                    // Through: back to asking for nothing but reads.
                    self.writable = None;
                    return Poll::Ready(r);
                }
                // Would block again: wait for the next edge.
                continue;
            }
            match op(self.io.get_ref()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    #[cfg(test)]
                    {
                        self.blocked += 1;
                    }
                    // Registering checks readiness at once, so space freed
                    // between the failed write and here is not missed.
                    let dup = self.io.get_ref().try_clone()?;
                    self.writable = Some(register(dup, Interest::WRITABLE)?);
                }
                r => return Poll::Ready(r),
            }
        }
    }
}

/// Registers `stream` with the runtime's reactor for `interest`.
///
/// tokio 1.54 deprecated this safe constructor for the `unsafe`
/// `register_with_interest`, because an `AsyncFd<T>` over a `T` that
/// does not own its descriptor (a bare `RawFd`, say) could be closed and
/// the number reused while registered. This crate forbids `unsafe`, and
/// here `T` is a `std` stream that owns its descriptor and is neither
/// replaced nor closed before the `AsyncFd` drops it (which deregisters
/// first), so the contract the `unsafe` version asks for holds.
#[allow(deprecated)]
pub(crate) fn register(stream: StdStream, interest: Interest) -> io::Result<AsyncFd<StdStream>> {
    AsyncFd::with_interest(stream, interest)
}

impl AsRawFd for QuietStream {
    fn as_raw_fd(&self) -> RawFd {
        self.io.get_ref().as_raw_fd()
    }
}

impl AsFd for QuietStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.get_ref().as_fd()
    }
}

impl AsyncRead for QuietStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.io.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let len = unfilled.len();
            match guard.try_io(|inner| inner.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    // A short read emptied the socket's queue (edge-
                    // triggered epoll reports what arrives later): the
                    // next read waits for that edge instead of costing a
                    // system call that fails with `EAGAIN`, as tokio's
                    // own streams do.
                    if 0 < n && n < len {
                        guard.clear_ready();
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // Would block: readiness cleared, wait for the next edge.
                Err(_) => {}
            }
        }
    }
}

impl AsyncWrite for QuietStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |mut s| s.write(buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |mut s| s.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Writes go straight to the socket: nothing is buffered here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(match self.io.get_ref().shutdown(Shutdown::Write) {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            r => r,
        })
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn pair() -> (QuietStream, QuietStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (QuietStream::from_tokio(a).unwrap(), QuietStream::from_tokio(b).unwrap())
    }

    #[tokio::test]
    async fn small_messages_go_both_ways_without_write_readiness() {
        let (mut a, mut b) = pair();
        for i in 0..100u32 {
            let msg = format!("ping {i}\n");
            a.write_all(msg.as_bytes()).await.unwrap();
            assert!(a.writable.is_none(), "no write registration for a message that fits");
            assert_eq!(a.blocked, 0);
            let mut got = vec![0u8; msg.len()];
            b.read_exact(&mut got).await.unwrap();
            assert_eq!(got, msg.as_bytes());
            b.write_all(b"pong\n").await.unwrap();
            let mut back = [0u8; 5];
            a.read_exact(&mut back).await.unwrap();
            assert_eq!(&back, b"pong\n");
        }
        assert!(b.writable.is_none());
    }

    /// A write larger than the socket buffer blocks, waits for the reader
    /// through the write registration, arrives whole and in order, and the
    /// registration is gone after it.
    #[tokio::test]
    async fn a_blocked_write_waits_for_the_reader_and_loses_nothing() {
        let (mut a, mut b) = pair();
        let data: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        let expect = data.clone();
        let writer = tokio::spawn(async move {
            a.write_all(&data).await.unwrap();
            a.shutdown().await.unwrap();
            a
        });
        // Let the writer fill the buffer and block before reading.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut got = Vec::new();
        let reading = async {
            b.read_to_end(&mut got).await.unwrap();
            writer.await.unwrap()
        };
        // A lost readiness edge would hang here: fail instead.
        let a = tokio::time::timeout(std::time::Duration::from_secs(20), reading)
            .await
            .expect("no hang");
        assert_eq!(got.len(), expect.len());
        assert!(got == expect, "the bytes arrive in order");
        assert!(a.blocked > 0, "the write blocked at least once");
        assert!(a.writable.is_none(), "the write registration is dropped once through");
    }

    /// A short read takes the readiness with it (no read that fails with
    /// `EAGAIN` follows); a message sent later still arrives, and so does
    /// the end of file after it.
    #[tokio::test]
    async fn a_short_read_clears_readiness_and_later_messages_still_arrive() {
        let (mut a, mut b) = pair();
        a.write_all(b"one\n").await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(b.read(&mut buf).await.unwrap(), 4);
        let ready =
            std::future::poll_fn(|cx| Poll::Ready(b.io.poll_read_ready(cx).is_ready())).await;
        assert!(!ready, "the short read emptied the queue and cleared the readiness");
        let writer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            a.write_all(b"two\n").await.unwrap();
            a.shutdown().await.unwrap();
            a
        });
        let later = async {
            let n = b.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"two\n");
            assert_eq!(b.read(&mut buf).await.unwrap(), 0, "end of file");
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), later).await.expect("no hang");
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn a_closed_peer_reads_as_end_of_file_and_fails_writes() {
        let (mut a, b) = pair();
        drop(b);
        let mut buf = [0u8; 16];
        assert_eq!(a.read(&mut buf).await.unwrap(), 0);
        let err = a.write_all(b"x").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
