//! The `/metrics` listener (TCP, loopback by default).
//!
//! Anyone on the host may connect to it, not only the members of the API
//! socket's group, so it must never take what the API needs: it serves at
//! most [`MAX_CONNECTIONS`] connections at once (others wait in the
//! kernel's backlog, holding no descriptor of ours), gives each one
//! [`CONNECTION_TIME`] in all (the head, the scrape and the answer) and
//! answers one request per connection. `axum::serve` had no bound at all:
//! a user outside the group could hold 1,000 connections open and leave
//! skilld no descriptor to accept an API client with, or hold half-sent
//! requests for ever.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use plumbing::accept::Backoff;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Connections served at once; a scraper needs one.
pub const MAX_CONNECTIONS: usize = 8;

/// How long one connection may last, from its accept to its answer's end.
pub const CONNECTION_TIME: Duration = Duration::from_secs(10);

/// How long a client may take to send a request head.
const HEADER_TIME: Duration = Duration::from_secs(5);

/// How many connections, for how long.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Connections served at once.
    pub connections: usize,
    /// One connection's whole life.
    pub connection_time: Duration,
    /// Until the request head is in.
    pub header_time: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            connections: MAX_CONNECTIONS,
            connection_time: CONNECTION_TIME,
            header_time: HEADER_TIME,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then waits
/// for the connections in progress (each ends within [`CONNECTION_TIME`]).
pub async fn serve(listener: TcpListener, router: Router, shutdown: CancellationToken) {
    serve_bounded(listener, router, Bounds::default(), shutdown).await;
}

/// [`serve`] with other [`Bounds`].
pub async fn serve_bounded(
    listener: TcpListener,
    router: Router,
    bounds: Bounds,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(bounds.connections));
    let tracker = TaskTracker::new();
    plumbing::accept::serve(
        &listener,
        permits,
        Backoff::DEFAULT,
        &shutdown,
        |e| tracing::warn!(error = %e, "metrics: accept failed"),
        |stream, permit| {
            let router = router.clone();
            tracker.spawn(async move {
                let _permit = permit;
                serve_one(stream, router, bounds).await;
            });
        },
    )
    .await;
    tracker.close();
    tracker.wait().await;
}

/// Serves one scrape on `stream`: one request, then the connection closes;
/// the whole connection lasts at most `bounds.connection_time`.
async fn serve_one(stream: TcpStream, router: Router, bounds: Bounds) {
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let router = router.clone();
        async move { Ok::<_, Infallible>(router.oneshot(req).await.unwrap_or_else(|e| match e {})) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_time)
        .keep_alive(false)
        .max_buf_size(16 << 10);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    if tokio::time::timeout(bounds.connection_time, conn).await.is_err() {
        tracing::debug!(after = ?bounds.connection_time, "metrics: connection closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const B: Bounds = Bounds {
        connections: 4,
        connection_time: Duration::from_millis(600),
        header_time: Duration::from_millis(300),
    };

    async fn start() -> (std::net::SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/metrics", get(|| async { "up 1\n" }));
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve_bounded(listener, router, B, stop.clone()));
        (addr, stop, task)
    }

    async fn scrape(addr: std::net::SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut out = String::new();
        // One request per connection: the server closes after the answer.
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn idle_connections_neither_block_a_scrape_for_long_nor_stay() {
        let (addr, stop, task) = start().await;
        // More idle connections than the bound, each sending half a head.
        let mut idle = Vec::new();
        for _ in 0..B.connections + 4 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /metr").await.unwrap();
            idle.push(s);
        }
        // The scrape waits behind them, then is served once they are cut.
        let scrape = tokio::spawn(scrape(addr));
        let answer = tokio::time::timeout(B.connection_time * 10, scrape).await;
        let answer = answer.expect("the scrape waited for ever").unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("up 1\n"), "{answer}");
        // Every idle connection was closed by the server.
        for mut s in idle {
            let mut buf = [0u8; 64];
            let n = tokio::time::timeout(B.connection_time * 10, s.read(&mut buf)).await;
            assert!(matches!(n, Ok(Ok(_)) | Ok(Err(_))), "an idle connection stayed open");
        }
        stop.cancel();
        tokio::time::timeout(B.connection_time * 10, task).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_scrape_is_answered_and_the_connection_closed() {
        let (addr, stop, task) = start().await;
        for _ in 0..3 {
            let answer = scrape(addr).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        stop.cancel();
        task.await.unwrap();
    }
}
