//! The accept loop: connections and permits, the pauses after failures,
//! and cancellation at every wait.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::*;

/// A listener that answers a script, then waits for ever (and says so).
struct Scripted {
    script: Mutex<VecDeque<io::Result<u32>>>,
    calls: Mutex<Vec<Instant>>,
    done: Notify,
}

impl Scripted {
    fn new(script: impl IntoIterator<Item = io::Result<u32>>) -> Arc<Self> {
        Arc::new(Self {
            script: Mutex::new(script.into_iter().collect()),
            calls: Mutex::new(Vec::new()),
            done: Notify::new(),
        })
    }

    /// The pauses between one `accept` and the next, in milliseconds.
    fn gaps(&self) -> Vec<u128> {
        let calls = self.calls.lock().unwrap();
        calls.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect()
    }
}

impl Listener for Scripted {
    type Stream = u32;

    fn accept(&self) -> impl Future<Output = io::Result<u32>> + Send {
        self.calls.lock().unwrap().push(Instant::now());
        let next = self.script.lock().unwrap().pop_front();
        async move {
            match next {
                Some(r) => r,
                None => {
                    self.done.notify_one();
                    std::future::pending().await
                }
            }
        }
    }
}

fn emfile() -> io::Result<u32> {
    Err(io::Error::from_raw_os_error(nix::libc::EMFILE))
}

/// Runs the loop on `listener` in a task; the handled connections come out
/// of the receiver with their permits.
fn spawn<L>(
    listener: Arc<L>,
    permits: Arc<Semaphore>,
    backoff: Backoff,
    cancel: &CancellationToken,
) -> (tokio::task::JoinHandle<usize>, mpsc::UnboundedReceiver<(L::Stream, OwnedSemaphorePermit)>)
where
    L: Listener + Send + Sync + 'static,
    L::Stream: Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = cancel.clone();
    let task = tokio::spawn(async move {
        let mut errors = 0;
        let on_error = |_: &io::Error| errors += 1;
        let handle = |stream, permit| {
            let _ = tx.send((stream, permit));
        };
        serve(&*listener, permits, backoff, &cancel, on_error, handle).await;
        errors
    });
    (task, rx)
}

#[tokio::test(start_paused = true)]
async fn failures_pause_doubling_to_the_ceiling_and_a_connection_resets_it() {
    let script = (0..9).map(|_| emfile()).chain([Ok(1)]).chain([emfile(), emfile()]);
    let listener = Scripted::new(script);
    let cancel = CancellationToken::new();
    let (task, mut rx) =
        spawn(Arc::clone(&listener), Arc::new(Semaphore::new(4)), Backoff::DEFAULT, &cancel);
    listener.done.notified().await;
    cancel.cancel();
    assert_eq!(task.await.unwrap(), 11, "every failure reported");
    assert_eq!(listener.gaps(), [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 0, 10, 20]);
    let (stream, _permit) = rx.recv().await.unwrap();
    assert_eq!(stream, 1);
}

#[tokio::test(start_paused = true)]
async fn cancellation_ends_a_pause() {
    let listener = Scripted::new([emfile()]);
    let cancel = CancellationToken::new();
    let long = Backoff { first: Duration::from_secs(60), max: Duration::from_secs(60) };
    let start = Instant::now();
    let (task, _rx) = spawn(Arc::clone(&listener), Arc::new(Semaphore::new(1)), long, &cancel);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(listener.calls.lock().unwrap().len(), 1, "in the pause");
    cancel.cancel();
    assert_eq!(task.await.unwrap(), 1);
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    assert_eq!(listener.calls.lock().unwrap().len(), 1, "no accept after the cancellation");
}

#[tokio::test]
async fn cancellation_ends_the_wait_for_a_connection_or_a_permit() {
    let dir = tempfile::tempdir().unwrap();
    let listener = Arc::new(tokio::net::UnixListener::bind(dir.path().join("s.sock")).unwrap());
    for permits in [1, 0] {
        let cancel = CancellationToken::new();
        let permits = Arc::new(Semaphore::new(permits));
        let (task, _rx) = spawn(Arc::clone(&listener), permits, Backoff::DEFAULT, &cancel);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!task.is_finished());
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn closed_permits_end_the_loop() {
    let listener = Scripted::new([]);
    let permits = Arc::new(Semaphore::new(0));
    permits.close();
    let (task, _rx) = spawn(listener, permits, Backoff::DEFAULT, &CancellationToken::new());
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
}

/// With one permit, a second client waits (in the backlog) until the first
/// connection's permit is dropped.
#[tokio::test]
async fn a_connection_holds_its_permit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let listener = Arc::new(tokio::net::UnixListener::bind(&path).unwrap());
    let cancel = CancellationToken::new();
    let (task, mut rx) = spawn(listener, Arc::new(Semaphore::new(1)), Backoff::DEFAULT, &cancel);
    let _a = tokio::net::UnixStream::connect(&path).await.unwrap();
    let first = rx.recv().await.unwrap();
    let _b = tokio::net::UnixStream::connect(&path).await.unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await;
    assert!(waiting.is_err(), "a second connection beyond the cap");
    drop(first);
    let second = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap();
    assert!(second.is_some());
    cancel.cancel();
    assert_eq!(task.await.unwrap(), 0);
}

#[tokio::test]
async fn tcp_connections_are_served_too() {
    let listener = Arc::new(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let (task, mut rx) = spawn(listener, Arc::new(Semaphore::new(2)), Backoff::DEFAULT, &cancel);
    let client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (stream, _permit) = rx.recv().await.unwrap();
    assert_eq!(stream.peer_addr().unwrap(), client.local_addr().unwrap());
    cancel.cancel();
    assert_eq!(task.await.unwrap(), 0);
}
