//! Waiting for a condition with a deadline, and a free loopback port.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// Polls `f` every 10 ms until it gives a value, for at most `within`.
pub fn poll<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `cond` holds, looking every 20 ms.
///
/// # Panics
///
/// When it does not hold within `within` ("timed out waiting for `what`").
pub fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free loopback port (bound, then released for the caller to bind).
///
/// # Panics
///
/// When no loopback port can be bound.
pub fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}
