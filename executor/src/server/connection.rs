//! One connection: the peer check, capped line reads, a writer task, and
//! telling a closed connection (cancel its runs) from a half-closed one.
//! The socket is registered for reading only ([`quiet`]).
//!
//! Idle connections: a connection with no run in flight that has not sent
//! a complete request line for `idle_timeout_seconds` is closed (one that
//! sends nothing, or a partial line a byte at a time, cannot keep one of
//! the `max_connections` slots). A connection with a run in flight is
//! never cut for being quiet: it ends with its runs.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream as StdStream;
use std::sync::Arc;
use std::time::Duration;

use plumbing::peer::hung_up;
use policy::wire::{self, code, LineBuffer};
use serde_json::Value;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::commands;
use super::context::{
    Backlog, ConnCtx, GaugeGuard, Lines, Outgoing, Shared, AFTER_REPORT_BYTES, WAITS,
};
use super::peer::Peer;
use crate::sys;

/// Read chunk (under 64 KiB: freeing a larger block makes glibc sweep its
/// fast bins, ~1 % of all CPU with one connection per run).
const READ_CHUNK: usize = 16 << 10;
/// After a read EOF, how often the socket is polled for a hang-up.
const HUP_POLL: Duration = Duration::from_millis(50);
/// How long a refused peer or a finished connection gets to take its last
/// lines before the socket is closed anyway.
const FLUSH: Duration = Duration::from_secs(2);
/// Serves one accepted connection to its end.
pub(super) async fn serve(mut stream: UnixStream, shared: Arc<Shared>) {
    let Some(peer) = admit(&mut stream, &shared).await else {
        return;
    };
    let _open = GaugeGuard::new(&shared.metrics.connections);
    tracing::debug!("executor: connection from {peer}");

    // Registered for reading only, written through a duplicate that asks
    // for write readiness only while a write is blocked ([`quiet`]).
    let (rd, wr) = match quiet(stream) {
        Ok(halves) => halves,
        Err(e) => {
            tracing::warn!("executor: cannot register the connection of {peer} ({e}); closing it");
            return;
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let backlog = Arc::new(Backlog::default());
    let token = shared.kill.child_token();
    // However this task ends, its runs are cancelled.
    let _cancel_runs = token.clone().drop_guard();
    let mut writer = tokio::spawn(write_lines(wr, rx, Arc::clone(&backlog), token.clone()));
    let runs = TaskTracker::new();
    runs.close();
    let ctx = ConnCtx {
        shared: Arc::clone(&shared),
        peer,
        lines: Lines { tx, backlog: Arc::clone(&backlog) },
        token: token.clone(),
        runs,
        held: Arc::default(),
        waits: Arc::new(Semaphore::new(WAITS)),
    };

    read_requests(&ctx, &rd, &backlog).await;
    // Every run is done: close the channel and let the writer flush.
    drop(ctx);
    if tokio::time::timeout(FLUSH, &mut writer).await.is_err() {
        writer.abort();
    }
}

/// The peer's credentials, if it may use the executor; a refused peer is
/// told why (within [`FLUSH`]) and `None` is returned.
async fn admit(stream: &mut UnixStream, shared: &Shared) -> Option<Peer> {
    let peer = match stream.peer_cred() {
        Ok(c) => Peer { uid: c.uid(), gid: c.gid(), pid: c.pid() },
        Err(e) => {
            tracing::warn!("executor: connection without peer credentials ({e}); closing it");
            return None;
        }
    };
    if shared.peers.admits(&peer) {
        return Some(peer);
    }
    shared.metrics.peer_rejected_total.inc();
    tracing::warn!("executor: refused connection from {peer}: not in allowed_uids or allowed_gids");
    let line = wire::encode_error_code(
        &Value::Null,
        code::FORBIDDEN,
        &format!("peer uid {} gid {} may not use the executor", peer.uid, peer.gid),
    );
    let _ = tokio::time::timeout(FLUSH, async {
        let _ = stream.write_all(&line).await;
        let _ = stream.shutdown().await;
    })
    .await;
    None
}

/// Reads and dispatches request lines until the connection is done with:
/// closed or idle with no run in flight, or its runs over once it stopped
/// reading (end of file, a read error) or the executor is stopping.
async fn read_requests(ctx: &ConnCtx, rd: &AsyncFd<StdStream>, backlog: &Backlog) {
    let (shared, peer, token) = (&ctx.shared, &ctx.peer, &ctx.token);
    let mut lines = LineBuffer::new(shared.engine.config().max_line_bytes);
    // Zeroed once, read into as it is.
    let mut buf = vec![0u8; READ_CHUNK];
    let mut reading = true;
    let mut stopping = shared.stopping.is_cancelled();
    let mut hup = tokio::time::interval(HUP_POLL);
    let idle_timeout = Duration::from_secs(shared.engine.config().idle_timeout_seconds);
    // While runs are in flight the idle time is looked at every `busy_tick`
    // (it counts from the end of the last run); with none, not before it
    // can be over: an idle connection wakes nothing until then.
    let busy_tick = (idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let idle_check = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle_check);
    let mut last_request = tokio::time::Instant::now();
    loop {
        // A peer that does not read its answers is not read from either.
        let backlogged = backlog.full();
        tokio::select! {
            () = backlog.drained.notified(), if reading && backlogged => {}
            r = read(rd, &mut buf), if reading && !backlogged => match r {
                Ok(0) => reading = false,
                Ok(n) => {
                    for item in lines.push(&buf[..n]) {
                        last_request = tokio::time::Instant::now();
                        commands::dispatch(ctx, item);
                    }
                }
                Err(e) => {
                    tracing::debug!("executor: read from {peer}: {e}");
                    token.cancel();
                    reading = false;
                }
            },
            _ = hup.tick(), if !reading && !token.is_cancelled() => {
                if hung_up(rd.get_ref()) {
                    tracing::debug!("executor: {peer} closed the connection; cancelling its runs");
                    token.cancel();
                }
            }
            () = &mut idle_check, if reading && !idle_timeout.is_zero() => {
                let next = if !ctx.runs.is_empty() {
                    last_request = tokio::time::Instant::now();
                    last_request + busy_tick
                } else if last_request.elapsed() >= idle_timeout {
                    tracing::debug!(
                        "executor: closing the connection of {peer}: no request for {} s",
                        idle_timeout.as_secs()
                    );
                    shared.metrics.idle_closed_total.inc();
                    break;
                } else {
                    // Only a request moves this on, and it is seen then.
                    last_request + idle_timeout
                };
                idle_check.as_mut().reset(next);
            }
            () = shared.stopping.cancelled(), if !stopping => stopping = true,
            () = ctx.runs.wait(), if !reading || stopping => break,
        }
    }
}

/// Splits an accepted stream into its read side, registered with the
/// reactor for reading only, and an unregistered duplicate to write with.
///
/// A `tokio::net::UnixStream` is registered for both: then each line this
/// side writes comes back as an `EPOLLOUT` edge once the peer has read it
/// (a Unix socket wakes its writer's wait queue whenever the peer frees
/// send space), waking a parked runtime thread for nothing, about once
/// per run. [`write_all`] asks for write readiness only when a write would
/// block.
fn quiet(stream: UnixStream) -> std::io::Result<(AsyncFd<StdStream>, StdStream)> {
    // `into_std` drops tokio's registration and leaves it non-blocking.
    let stream = stream.into_std()?;
    let wr = stream.try_clone()?;
    Ok((sys::reactor::register(stream, Interest::READABLE)?, wr))
}

/// One read into `buf`, waiting for the socket to be readable.
async fn read(rd: &AsyncFd<StdStream>, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        let mut guard = rd.readable().await?;
        if let Ok(r) = guard.try_io(|s| s.get_ref().read(buf)) {
            // A short read emptied the socket's queue: the next read
            // waits for the next edge rather than failing with `EAGAIN`.
            if r.as_ref().is_ok_and(|&n| 0 < n && n < buf.len()) {
                guard.clear_ready();
            }
            return r;
        }
    }
}

/// Writes all of `line` to the non-blocking `wr`; when a write would block
/// (the peer does not read fast enough), registers `wr` for write
/// readiness until it goes through, then deregisters it.
async fn write_all(mut wr: StdStream, line: &[u8]) -> std::io::Result<StdStream> {
    let mut done = 0;
    while done < line.len() {
        match (&wr).write(&line[done..]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let fd = sys::reactor::register(wr, Interest::WRITABLE)?;
                let r = loop {
                    let mut guard = fd.writable().await?;
                    if let Ok(r) = guard.try_io(|s| s.get_ref().write(&line[done..])) {
                        break r;
                    }
                };
                wr = fd.into_inner();
                done += r?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(wr)
}

/// Writes queued lines until every sender is gone; a failed write means the
/// client is gone, so the connection's runs are cancelled and the rest of
/// the queue is dropped.
async fn write_lines(
    wr: StdStream,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    backlog: Arc<Backlog>,
    token: CancellationToken,
) {
    let mut wr = Some(wr);
    while let Some(out) = rx.recv().await {
        let line = match out {
            Outgoing::Line(line) => line,
            Outgoing::Then(then) => {
                drop(then);
                backlog.done(AFTER_REPORT_BYTES);
                continue;
            }
        };
        if let Some(stream) = wr.take() {
            match write_all(stream, &line).await {
                Ok(stream) => wr = Some(stream),
                Err(e) => {
                    // The stream is gone with the error: the rest is dropped.
                    tracing::debug!("executor: write: {e}; cancelling the connection's runs");
                    token.cancel();
                }
            }
        }
        backlog.done(line.len());
    }
    if let Some(wr) = wr {
        let _ = wr.shutdown(std::net::Shutdown::Write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines written through the unregistered duplicate arrive whole and in
    /// order, a line larger than the socket buffer included (its write
    /// blocks and waits for write readiness), and the reader side sees
    /// them through its read-only registration, then end of file.
    #[tokio::test]
    async fn lines_larger_than_the_socket_buffer_arrive_whole_and_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let (_a_rd, a_wr) = quiet(a).unwrap();
        let (b_rd, _b_wr) = quiet(b).unwrap();
        let big: Vec<u8> = (0..4u32 << 20).map(|i| b'a' + (i % 26) as u8).collect();
        let lines = vec![b"first\n".to_vec(), big.clone(), b"\nlast\n".to_vec()];
        let expect: Vec<u8> = lines.concat();
        let writer = tokio::spawn(async move {
            let mut wr = a_wr;
            for line in &lines {
                wr = write_all(wr, line).await.unwrap();
            }
            // Dropping both ends of `a` (its read side is `_a_rd`, still
            // open) is not enough for EOF: shut the write direction.
            wr.shutdown(std::net::Shutdown::Write).unwrap();
        });
        // Let the writer fill the buffer and block before reading.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut got = Vec::new();
        let mut buf = vec![0u8; READ_CHUNK];
        let reading = async {
            loop {
                let n = read(&b_rd, &mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            writer.await.unwrap();
        };
        // A lost readiness edge would hang here: fail instead.
        tokio::time::timeout(Duration::from_secs(20), reading).await.expect("no hang");
        assert_eq!(got.len(), expect.len());
        assert!(got == expect, "the bytes arrive in order");
    }

    /// A short read takes the socket's readiness with it (no read that
    /// fails with `EAGAIN` follows); a line sent later still arrives, and
    /// so does the end of file after it.
    #[tokio::test]
    async fn a_short_read_clears_readiness_and_later_lines_still_arrive() {
        let (a, b) = UnixStream::pair().unwrap();
        let (_a_rd, a_wr) = quiet(a).unwrap();
        let (b_rd, _b_wr) = quiet(b).unwrap();
        let a_wr = write_all(a_wr, b"one\n").await.unwrap();
        let mut buf = vec![0u8; READ_CHUNK];
        assert_eq!(read(&b_rd, &mut buf).await.unwrap(), 4);
        let ready =
            std::future::poll_fn(|cx| std::task::Poll::Ready(b_rd.poll_read_ready(cx).is_ready()))
                .await;
        assert!(!ready, "the short read emptied the queue and cleared the readiness");
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let wr = write_all(a_wr, b"two\n").await.unwrap();
            wr.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let later = async {
            let n = read(&b_rd, &mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"two\n");
            assert_eq!(read(&b_rd, &mut buf).await.unwrap(), 0, "end of file");
        };
        tokio::time::timeout(Duration::from_secs(10), later).await.expect("no hang");
        writer.await.unwrap();
    }

    /// What follows a report in the queue is dropped only once the lines
    /// before it are written: the peer can read them then.
    #[tokio::test]
    async fn a_then_is_dropped_after_the_lines_before_it_are_written() {
        /// On drop, reads what the peer has received so far.
        struct Probe(StdStream, std::sync::mpsc::Sender<Vec<u8>>);
        impl Drop for Probe {
            fn drop(&mut self) {
                let mut got = vec![0u8; 64];
                let n = (&self.0).read(&mut got).unwrap_or(0);
                got.truncate(n);
                let _ = self.1.send(got);
            }
        }
        let (a, b) = UnixStream::pair().unwrap();
        let (_a_rd, a_wr) = quiet(a).unwrap();
        let peer = b.into_std().unwrap();
        peer.set_nonblocking(true).unwrap();
        let (seen_tx, seen) = std::sync::mpsc::channel();
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Outgoing::Line(b"report\n".to_vec())).unwrap();
        tx.send(Outgoing::Then(Box::new(Probe(peer, seen_tx)))).unwrap();
        drop(tx);
        let writer = write_lines(a_wr, rx, Arc::default(), CancellationToken::new());
        tokio::time::timeout(Duration::from_secs(10), writer).await.expect("no hang");
        assert_eq!(seen.recv().unwrap(), b"report\n", "written before the then was dropped");
    }

    /// A finished run's clean-up waiting behind lines not written counts in
    /// the backlog until it is dropped: a peer that never reads holds 64
    /// of them at most (the reader stops), not one per run.
    #[tokio::test]
    async fn a_then_counts_in_the_backlog_until_dropped() {
        let (tx, rx) = mpsc::unbounded_channel();
        let backlog = Arc::new(Backlog::default());
        let lines = Lines { tx, backlog: Arc::clone(&backlog) };
        for _ in 1..super::super::context::BACKLOG / AFTER_REPORT_BYTES {
            lines.then(Box::new(()));
        }
        assert!(!backlog.full());
        lines.then(Box::new(()));
        assert!(backlog.full(), "64 of them stop the reader");
        drop(lines);
        let (a, _b) = UnixStream::pair().unwrap();
        let (_a_rd, a_wr) = quiet(a).unwrap();
        let writer = write_lines(a_wr, rx, Arc::clone(&backlog), CancellationToken::new());
        tokio::time::timeout(Duration::from_secs(10), writer).await.expect("no hang");
        assert_eq!(backlog.bytes.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    /// A write to a peer that is gone fails (and so cancels the runs),
    /// whether it would have blocked or not.
    #[tokio::test]
    async fn a_write_to_a_closed_peer_fails() {
        let (a, b) = UnixStream::pair().unwrap();
        let (_a_rd, a_wr) = quiet(a).unwrap();
        drop(b);
        let err = write_all(a_wr, b"line\n").await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
    }
}
