//! One client connection of the API listener: HTTP/1.1
//! through hyper over the Unix stream, with the caller's credentials on
//! each request, and the bounds a client cannot get around.
//!
//! # Slow and idle clients
//!
//! A client cannot hold one of the `max_connections` slots for ever:
//!
//! - a request head must be complete within `header_timeout` of its first
//!   byte (a slow-loris sending one byte a second is cut);
//! - a connection with no request in progress and no byte read or written
//!   for `idle_timeout` is closed: one that never sends anything, or sits
//!   idle on keep-alive after its answers. (hyper's own header read timeout
//!   is not used: it also runs while a keep-alive connection waits for its
//!   next request, which cut every idle connection at `header_timeout`.)
//! - an answer whose writes have been blocked (the client does not read)
//!   for `idle_timeout` ends the connection, unless the client took at
//!   least [`MIN_TAKE_RATE`] times `idle_timeout` of it meanwhile (then
//!   the clock starts again): a client reading a few bytes now and then
//!   cannot hold the answer, and the run slot that covers it, for ever;
//! - a request body must arrive within the request timeout (408, in the
//!   handlers).
//!
//! A request in progress is never cut for being quiet: a run in JSON mode
//! writes nothing until its report.
//!
//! # The request head's size
//!
//! A head (request line and headers) may be [`MAX_HEAD_BYTES`] long. The
//! connection hands hyper at most that many bytes of a head in progress;
//! when hyper asks for more, the head is over the limit: the connection
//! answers `431` itself, in the API's error shape (`head_too_large`,
//! counted in `ongrid_http_requests_total` with route `other`), and
//! closes. (hyper's own `max_buf_size` is a soft bound, which let heads
//! twice as large through, and its own `431` has no body and is counted
//! nowhere; its buffer is left a little above the limit so that this one
//! answers first.) The count is of the bytes read while no request is in
//! progress: bytes of a next request hyper reads along with the current
//! one (pipelining) are not counted (hyper's buffer bounds them), and the
//! rest of a body a handler left unread, if hyper drains it after the
//! answer instead of closing, counts towards the next head.
//!
//! A head hyper cannot parse (a bad request line or header field, more
//! than 100 fields) gets hyper's own bare 400 or 431; the connection counts
//! it in `ongrid_http_requests_total` with route `other` and logs it.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::os::unix::net::UnixStream as StdStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use plumbing::peer::hung_up;
use tokio::io::Interest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::daemon::api::error::ApiError;
use crate::daemon::quiet_stream::QuietStream;

/// Who is on the other end of a client connection, as the kernel says
/// (`SO_PEERCRED` at `connect()` time), never as the request claims.
/// Handlers get it as an `Extension<Caller>`; permission modes decide
/// from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The peer's uid.
    pub uid: u32,
    /// The peer's primary gid.
    pub gid: u32,
    /// The peer's pid, when the kernel gave one (it can be recycled: for
    /// logs only).
    pub pid: Option<i32>,
}

impl Caller {
    /// The credentials of the peer of `stream`.
    ///
    /// # Errors
    ///
    /// The `getsockopt` error.
    pub fn of(stream: &UnixStream) -> io::Result<Self> {
        let cred = stream.peer_cred()?;
        Ok(Self { uid: cred.uid(), gid: cred.gid(), pid: cred.pid() })
    }
}

/// The longest request head (request line and headers) served, in bytes.
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// hyper's bound on its read and write buffers: above [`MAX_HEAD_BYTES`],
/// so that a head over the limit is answered here, not by hyper.
const HYPER_MAX_BUF: usize = MAX_HEAD_BYTES + (16 << 10);

/// What ends a connection from outside: `shutdown` lets its request in
/// progress finish, `abort` does not.
pub(crate) struct Ends {
    pub(crate) shutdown: CancellationToken,
    pub(crate) abort: CancellationToken,
}

/// Serves HTTP/1.1 on `stream` for `caller` until the client leaves, a
/// bound is hit, or `ends` ends it (see the module docs).
pub(crate) async fn serve_connection(
    stream: QuietStream,
    caller: Caller,
    router: Router,
    (header_timeout, idle_timeout): (Duration, Duration),
    ends: Ends,
    requests_total: prometheus::IntCounterVec,
) {
    let activity =
        Arc::new(Activity::new(MIN_TAKE_RATE.saturating_mul(idle_timeout.as_secs().max(1))));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let watch = match hangup_watch(&stream) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the connection for a hang-up; closing it");
            return;
        }
    };
    let service = service(caller, router, &activity, &in_flight);
    let io = Tracked {
        inner: stream,
        activity: Arc::clone(&activity),
        requests: Arc::clone(&in_flight),
    };
    let conn = http1_builder().serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    // With a request in flight the connection is looked at every `busy_tick`
    // (is the client reading its answer?); with none, not before it can
    // have been idle for `idle_timeout`: an idle connection wakes nothing
    // until then.
    let busy_tick = (idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let idle_check = tokio::time::sleep(busy_tick);
    tokio::pin!(idle_check);
    // Set once the client has shut its write side: the watch is then left
    // alone (tokio never clears a read-closed readiness, so it would be
    // ready at once on every turn: the loop spun a CPU and starved the
    // request) and a hang-up is looked for on each tick instead.
    let mut half_closed = false;
    // Set once shutdown has come: the request in progress may finish (the
    // hang-up and idle checks go on), no new one is read.
    let mut draining = false;
    let result = loop {
        tokio::select! {
            r = conn.as_mut() => break r,
            () = ends.shutdown.cancelled(), if !draining => {
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
            () = ends.abort.cancelled() => return,
            // The head in progress is over the limit: hyper waits for
            // bytes it will not get.
            () = activity.head_too_large.notified() => {
                head_too_large(watch.get_ref(), &activity, caller, &requests_total);
                return;
            }
            // Woken by each new event on the socket (a request's bytes, an
            // end of file, a hang-up): nothing is read here.
            r = watch.readable(), if !half_closed => {
                match socket_event(r, caller) {
                    SocketEvent::Close => return,
                    SocketEvent::HalfClosed => half_closed = true,
                    SocketEvent::Bytes => {}
                }
                // Bytes between requests start a head: it is looked at
                // again when `header_timeout` is up.
                let head_due = tokio::time::Instant::now() + header_timeout;
                if in_flight.load(Ordering::Acquire) == 0 && idle_check.deadline() > head_due {
                    idle_check.as_mut().reset(head_due);
                }
            }
            () = &mut idle_check => {
                if half_closed && hung_up(watch.get_ref()) {
                    tracing::debug!(uid = caller.uid, "the client hung up; closing the connection");
                    return;
                }
                let busy = in_flight.load(Ordering::Acquire) != 0;
                let (why, next) = idle_verdict(&activity, busy, (header_timeout, idle_timeout), busy_tick);
                if let Some(why) = why {
                    tracing::debug!(uid = caller.uid, timeout = ?idle_timeout, "closing the connection: {why}");
                    return;
                }
                idle_check.as_mut().reset(next);
            }
        }
    };
    if let Err(e) = result {
        log_error_end(&e, caller, &requests_total);
    }
}

/// The connection's requests, each handed to `router` with `caller` on
/// it and counted in `in_flight` from its head until its answer's body is
/// dropped (fully written, or the connection gone); each head ends the
/// one in progress in `activity`.
fn service(
    caller: Caller,
    router: Router,
    activity: &Arc<Activity>,
    in_flight: &Arc<AtomicUsize>,
) -> impl hyper::service::Service<
    hyper::Request<Incoming>,
    Response = hyper::Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<hyper::Response<Body>, Infallible>> + Send,
> {
    let counter = Arc::clone(in_flight);
    let heads = Arc::clone(activity);
    hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        heads.head_done();
        req.extensions_mut().insert(caller);
        let router = router.clone();
        let guard = InFlight::new(&counter);
        async move {
            let response = router.oneshot(req).await.unwrap_or_else(|e| match e {});
            Ok::<_, Infallible>(response.map(|body| Body::new(Guarded { body, _guard: guard })))
        }
    })
}

/// What an event on the watched socket means for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SocketEvent {
    /// Bytes to read (hyper reads them).
    Bytes,
    /// The client shut its write side and may still read.
    HalfClosed,
    /// The client hung up, or the watch failed: the connection ends.
    Close,
}

/// Reads the readiness `ready` of the connection's watch: a hang-up, a
/// shut write side or bytes (the readiness cleared for the next ones).
fn socket_event(
    ready: io::Result<tokio::io::unix::AsyncFdReadyGuard<'_, StdStream>>,
    caller: Caller,
) -> SocketEvent {
    let mut ready = match ready {
        Ok(ready) => ready,
        Err(e) => {
            tracing::debug!(error = %e, uid = caller.uid, "connection watch failed; closing");
            return SocketEvent::Close;
        }
    };
    if hung_up(ready.get_inner()) {
        tracing::debug!(uid = caller.uid, "the client hung up; closing the connection");
        return SocketEvent::Close;
    }
    if ready.ready().is_read_closed() {
        tracing::debug!(uid = caller.uid, "the client shut its write side");
        return SocketEvent::HalfClosed;
    }
    ready.clear_ready();
    SocketEvent::Bytes
}

/// hyper's settings: no head timeout of its own (this connection keeps
/// `header_timeout`), buffers bounded by [`HYPER_MAX_BUF`], half-closed
/// connections served ([`hangup_watch`]).
fn http1_builder() -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(HYPER_MAX_BUF)
        .half_close(true);
    builder
}

/// A client may shut its write side once its request is sent (`nc -N`,
/// socat at the end of its input) and still read the answer: hyper goes on
/// after a read EOF (`half_close`, with which it no longer looks for one
/// mid-request either), and only a hang-up (`POLLHUP`, both directions
/// closed), seen on this duplicate of the socket registered for its
/// events, ends the connection, and with it the request's run.
fn hangup_watch(stream: &QuietStream) -> io::Result<tokio::io::unix::AsyncFd<StdStream>> {
    let dup = stream.get_ref().try_clone()?;
    crate::daemon::quiet_stream::register(dup, Interest::READABLE)
}

/// Whether the connection is to be closed now (and why), and when to look
/// again: with no request in flight, a head late for `header_timeout` or
/// quiet for `idle_timeout`; with one (`busy`), a client not reading its
/// answer for `idle_timeout`, looked at every `busy_tick`.
fn idle_verdict(
    activity: &Activity,
    busy: bool,
    (header_timeout, idle_timeout): (Duration, Duration),
    busy_tick: Duration,
) -> (Option<&'static str>, tokio::time::Instant) {
    if busy {
        let blocked = activity.write_blocked_for(idle_timeout).then_some("client not reading");
        return (blocked, tokio::time::Instant::now() + busy_tick);
    }
    let why = if activity.head_late(header_timeout) {
        Some("request head not complete within header_timeout")
    } else {
        activity.quiet_for(idle_timeout).then_some("idle")
    };
    let next = activity.quiet_until(idle_timeout);
    (why, activity.head_due(header_timeout).map_or(next, |h| h.min(next)))
}

/// Logs (and counts, when hyper answered it) the error that ended a
/// connection.
fn log_error_end(e: &hyper::Error, caller: Caller, requests_total: &prometheus::IntCounterVec) {
    match hyper_answer(e) {
        Some(status) => {
            requests_total.with_label_values(&["other", status.as_str()]).inc();
            tracing::info!(
                uid = caller.uid,
                pid = caller.pid,
                status = status.as_u16(),
                error = %e,
                "malformed request head; closing the connection"
            );
        }
        None => tracing::debug!(error = %e, uid = caller.uid, "connection ended with an error"),
    }
}

/// The answer hyper sent on its own before `e` ended the connection, if
/// any: a request head it could not parse (a bad method, URI, version or
/// header field, more than 100 fields) gets a bare 400 or 431 there, which
/// no handler saw, so it is counted here. A head over [`MAX_HEAD_BYTES`]
/// never gets that far (this connection answers it first), nor does a URI
/// too long for hyper (its limit is above [`MAX_HEAD_BYTES`]); an HTTP/2
/// preface gets no answer.
fn hyper_answer(e: &hyper::Error) -> Option<StatusCode> {
    if !e.is_parse() || e.is_parse_version_h2() || e.is_parse_status() {
        return None;
    }
    Some(if e.is_parse_too_large() {
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    } else {
        StatusCode::BAD_REQUEST
    })
}

/// Answers a head over [`MAX_HEAD_BYTES`] with a 431 in the API's error
/// shape, counted as the API counts its answers, unless a write of the
/// connection is blocked (hyper may then hold part of an earlier answer,
/// which must not be cut into); the caller closes the connection.
fn head_too_large(
    socket: &StdStream,
    activity: &Activity,
    caller: Caller,
    requests_total: &prometheus::IntCounterVec,
) {
    let e = ApiError::HeadTooLarge(MAX_HEAD_BYTES);
    let status = e.status();
    requests_total.with_label_values(&["other", status.as_str()]).inc();
    tracing::info!(
        uid = caller.uid,
        pid = caller.pid,
        status = status.as_u16(),
        "request head over {MAX_HEAD_BYTES} bytes; closing the connection"
    );
    if activity.blocked_now.load(Ordering::Acquire) {
        return;
    }
    let answer = http1_answer(status, &e.body().to_string());
    // One non-blocking write into a socket buffer nothing else waits in.
    if let Err(e) = io::Write::write(&mut &*socket, answer.as_bytes()) {
        tracing::debug!(error = %e, uid = caller.uid, "cannot send the 431");
    }
}

/// An HTTP/1.1 answer of `status` with the JSON `body`, closing the
/// connection.
fn http1_answer(status: StatusCode, body: &str) -> String {
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
}

/// What a client must take of an answer, per second, while its writes
/// block, counted over each `idle_timeout` (960 KiB a minute at the
/// default). (The kernel wakes a blocked writer of a Unix socket only once
/// about three quarters of its buffer, ~150 KB, were read: below that a
/// client is cut as one that does not read.)
pub(crate) const MIN_TAKE_RATE: u64 = 16 << 10;

/// When a connection last moved a byte, and since when its writes block
/// (milliseconds since `start`; 0 = not blocked).
#[derive(Debug)]
struct Activity {
    start: std::time::Instant,
    last_io: AtomicU64,
    /// Since when the writes block without the client taking `min_take`
    /// (0: they do not).
    blocked_since: AtomicU64,
    /// What the client must take within `idle_timeout` of blocked writes.
    min_take: u64,
    /// Bytes the client took since `blocked_since`.
    taken: AtomicU64,
    /// The last write would have blocked.
    blocked_now: std::sync::atomic::AtomicBool,
    /// When the first byte of a request head not yet complete was read
    /// (0: none).
    head_since: AtomicU64,
    /// Bytes read of the head in progress (with no request in progress).
    head_bytes: AtomicUsize,
    /// Notified when hyper asks for more of a head than
    /// [`MAX_HEAD_BYTES`].
    head_too_large: Notify,
}

impl Activity {
    fn new(min_take: u64) -> Self {
        Self {
            start: std::time::Instant::now(),
            last_io: AtomicU64::new(0),
            blocked_since: AtomicU64::new(0),
            min_take,
            taken: AtomicU64::new(0),
            blocked_now: std::sync::atomic::AtomicBool::new(false),
            head_since: AtomicU64::new(0),
            head_bytes: AtomicUsize::new(0),
            head_too_large: Notify::new(),
        }
    }

    /// Bytes read with no request in progress: a head begins, unless one
    /// already has.
    fn head_begins(&self) {
        let _ =
            self.head_since.compare_exchange(0, self.now(), Ordering::AcqRel, Ordering::Acquire);
    }

    /// A head is complete (its request is being served).
    fn head_done(&self) {
        self.head_since.store(0, Ordering::Release);
        self.head_bytes.store(0, Ordering::Release);
        // An earlier answer whose writes no longer block: its clock ends
        // with it (a pipelined request behind one still blocked does not
        // start it again).
        if !self.blocked_now.load(Ordering::Acquire) {
            self.blocked_since.store(0, Ordering::Release);
        }
    }

    /// When the head in progress will have taken `d`, if one is.
    fn head_due(&self, d: Duration) -> Option<tokio::time::Instant> {
        let since = self.head_since.load(Ordering::Acquire);
        (since != 0)
            .then(|| tokio::time::Instant::from_std(self.start + Duration::from_millis(since) + d))
    }

    /// A head has been in progress for `d` or more.
    fn head_late(&self, d: Duration) -> bool {
        self.head_due(d).is_some_and(|due| due <= tokio::time::Instant::now())
    }

    /// Milliseconds since `start`, at least 1.
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
    }

    fn moved(&self) {
        self.last_io.store(self.now(), Ordering::Release);
    }

    fn quiet_for(&self, d: Duration) -> bool {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.now().saturating_sub(self.last_io.load(Ordering::Acquire)) >= ms
    }

    /// When the connection will have been quiet for `d` if nothing moves
    /// before.
    fn quiet_until(&self, d: Duration) -> tokio::time::Instant {
        let last = Duration::from_millis(self.last_io.load(Ordering::Acquire));
        tokio::time::Instant::from_std(self.start + last + d)
    }

    /// The writes have blocked for `d` with the client taking less than
    /// `min_take` meanwhile. Writes that no longer block (the client took
    /// all there was) end the count.
    fn write_blocked_for(&self, d: Duration) -> bool {
        if !self.blocked_now.load(Ordering::Acquire) {
            self.blocked_since.store(0, Ordering::Release);
            return false;
        }
        let since = self.blocked_since.load(Ordering::Acquire);
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        since != 0 && self.now().saturating_sub(since) >= ms
    }

    /// A write would have blocked.
    fn write_blocks(&self) {
        self.blocked_now.store(true, Ordering::Release);
        if self
            .blocked_since
            .compare_exchange(0, self.now(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.taken.store(0, Ordering::Release);
        }
    }

    /// A write handed `n` bytes to the socket: the client took as many.
    fn wrote(&self, n: usize) {
        self.blocked_now.store(false, Ordering::Release);
        self.moved();
        if self.blocked_since.load(Ordering::Acquire) != 0 {
            let taken = self.taken.fetch_add(n as u64, Ordering::AcqRel) + n as u64;
            if taken >= self.min_take {
                self.blocked_since.store(0, Ordering::Release);
            }
        }
    }
}

/// The socket, recording its reads and writes in an [`Activity`], and
/// bytes read while no request is in progress (`requests`) as a head's:
/// at most [`MAX_HEAD_BYTES`] of them are handed to hyper.
#[derive(Debug)]
struct Tracked {
    inner: QuietStream,
    activity: Arc<Activity>,
    requests: Arc<AtomicUsize>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let head = self.requests.load(Ordering::Acquire) == 0;
        let r = if head {
            let room =
                MAX_HEAD_BYTES.saturating_sub(self.activity.head_bytes.load(Ordering::Acquire));
            if room == 0 {
                // hyper has the limit's worth of this head and wants more.
                self.activity.head_too_large.notify_one();
                return Poll::Pending;
            }
            if buf.remaining() > room {
                let mut limited = ReadBuf::new(buf.initialize_unfilled_to(room));
                let r = Pin::new(&mut self.inner).poll_read(cx, &mut limited);
                let n = limited.filled().len();
                buf.advance(n);
                r
            } else {
                Pin::new(&mut self.inner).poll_read(cx, buf)
            }
        } else {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        };
        let n = buf.filled().len() - before;
        if matches!(r, Poll::Ready(Ok(()))) && n > 0 {
            self.activity.moved();
            if head {
                self.activity.head_begins();
                self.activity.head_bytes.fetch_add(n, Ordering::AcqRel);
            }
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note_write(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note_write(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Tracked {
    fn note_write(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Pending => self.activity.write_blocks(),
            Poll::Ready(Ok(n)) => self.activity.wrote(*n),
            Poll::Ready(Err(_)) => {
                self.activity.blocked_now.store(false, Ordering::Release);
                self.activity.blocked_since.store(0, Ordering::Release);
            }
        }
    }
}

/// One request in progress on a connection (decremented when dropped).
#[derive(Debug)]
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(counter))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that holds its request's [`InFlight`] until dropped.
#[derive(Debug)]
struct Guarded {
    body: Body,
    _guard: InFlight,
}

impl hyper::body::Body for Guarded {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock of blocked writes: a trickle of bytes does not restart
    /// it, taking `min_take` does, and so does an answer taken whole; a
    /// next request's head ends the clock of an answer taken whole, not of
    /// one still blocked.
    #[test]
    fn blocked_writes_need_the_client_to_take_enough() {
        let window = Duration::from_millis(200);
        let past = || std::thread::sleep(Duration::from_millis(260));
        // A trickle: 4 KiB at a time, blocked again after each.
        let a = Activity::new(64 << 10);
        a.write_blocks();
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(60));
            a.wrote(4096);
            a.write_blocks();
        }
        assert!(a.write_blocked_for(window), "a trickle keeps the answer");
        // Enough taken: the clock starts again.
        let a = Activity::new(64 << 10);
        a.write_blocks();
        past();
        a.wrote(64 << 10);
        a.write_blocks();
        assert!(!a.write_blocked_for(window), "a client taking enough is cut");
        // All taken: nothing blocks.
        let a = Activity::new(64 << 10);
        a.write_blocks();
        past();
        a.wrote(100);
        assert!(!a.write_blocked_for(window), "an answer taken whole is cut");
        // A keep-alive connection's next answer does not inherit the clock.
        let a = Activity::new(64 << 10);
        a.write_blocks();
        a.wrote(100);
        past();
        a.head_done();
        a.write_blocks();
        assert!(!a.write_blocked_for(window), "the next answer was cut at once");
        // A pipelined head behind an answer still blocked does not reset it.
        let a = Activity::new(64 << 10);
        a.write_blocks();
        past();
        a.head_done();
        assert!(a.write_blocked_for(window), "a pipelined request reset the clock");
    }

    #[test]
    fn the_431_is_a_complete_answer() {
        let body = ApiError::HeadTooLarge(MAX_HEAD_BYTES).body().to_string();
        let text = http1_answer(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, &body);
        let (head, got) = text.split_once("\r\n\r\n").unwrap();
        assert_eq!(got, body);
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{head}");
        assert!(head.contains(&format!("\r\ncontent-length: {}\r\n", body.len())), "{head}");
        assert!(head.ends_with("\r\nconnection: close"), "{head}");
    }
}
