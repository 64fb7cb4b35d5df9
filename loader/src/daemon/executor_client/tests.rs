use serde_json::json;
use tokio::net::UnixListener;

use super::*;

/// An executor that answers the first request with `reply` verbatim.
async fn one_shot(reply: &'static [u8]) -> (tempfile::TempDir, ExecutorClient) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(reply).await;
    });
    (dir, ExecutorClient::new(path))
}

fn params() -> ExecuteParams {
    ExecuteParams {
        manifest: "/s/skill.json".into(),
        args: policy::RawJson::from_slice(b"{}").unwrap(),
        session_id: None,
        class: None,
        tool: None,
        manifest_sha256: None,
        hold: false,
    }
}

#[tokio::test]
async fn stderr_then_report() {
    let report = RunReport::not_run("s", Outcome::Rejected, "no");
    let mut reply = wire::encode_stderr(&json!(1), "a");
    reply.extend(wire::encode_report(&json!(1), &report));
    let reply: &'static [u8] = Box::leak(reply.into_boxed_slice());
    let (_d, c) = one_shot(reply).await;
    let mut conn = c.execute(&params()).await.unwrap();
    assert_eq!(conn.next().await.unwrap(), RunEvent::Stderr("a".into()));
    let RunEvent::Report(got) = conn.next().await.unwrap() else { panic!("no report") };
    assert_eq!(got.report, report);
    // The text forwarded is the executor's, and it is the report.
    assert_eq!(got.json.get(), serde_json::to_string(&report).unwrap());
    assert!(matches!(conn.next().await, Err(ExecutorError::Closed)));
}

/// A listener on a fresh socket and a client of it.
fn listening() -> (tempfile::TempDir, UnixListener, ExecutorClient) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.sock");
    let listener = UnixListener::bind(&path).unwrap();
    (dir, listener, ExecutorClient::new(path))
}

/// A connection opened ahead carries the run when used, and nothing
/// at all when dropped: it is kept, and the next run goes over it.
#[tokio::test]
async fn an_opened_connection_sends_only_when_used() {
    let (dir, listener, client) = listening();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        let second = tokio::time::timeout(Duration::from_millis(100), listener.accept()).await;
        (buf, second.is_ok())
    });
    drop(client.open().await.unwrap());
    assert_eq!(client.idle(), 1, "an unused connection is kept");
    let opened = client.open().await.unwrap();
    assert_eq!(client.idle(), 0);
    // Dropped before its report: closed, which cancels the run.
    drop(client.execute_on(Some(opened), &params()).await.unwrap());
    assert_eq!(client.idle(), 0, "a run dropped before its report is not kept");
    let (got, second) = server.await.unwrap();
    assert_eq!(got, wire::encode_execute(1, &params()), "nothing before the request");
    assert!(!second, "one connection served both");
    assert!(matches!(
        ExecutorClient::new(dir.path().join("none.sock")).open().await,
        Err(ExecutorError::Connect { .. })
    ));
}

/// An executor that answers every `execute` line with `report`, on
/// every connection, and counts the connections.
fn answering(listener: UnixListener, report: RunReport) -> Arc<std::sync::atomic::AtomicUsize> {
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let report = report.clone();
            tokio::spawn(async move {
                let mut lines = LineBuffer::new(MAX_LINE_BYTES);
                let mut chunk = [0u8; 4096];
                loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    for _ in lines.push(&chunk[..n]) {
                        let line = wire::encode_report(&json!(1), &report);
                        s.write_all(&line).await.unwrap();
                    }
                }
            });
        }
    });
    accepted
}

/// A run that ended with its report leaves its connection for the
/// next run; one closed by the executor meanwhile, or kept longer
/// than `IDLE_FOR`, is not used again.
#[tokio::test]
async fn a_finished_run_leaves_its_connection_for_the_next() {
    use std::sync::atomic::Ordering::SeqCst;
    let (_dir, listener, client) = listening();
    let report = RunReport::not_run("s", Outcome::Rejected, "no");
    let accepted = answering(listener, report.clone());
    for _ in 0..5 {
        let got = client.execute(&params()).await.unwrap().report().await.unwrap();
        assert_eq!(got, report);
        assert_eq!(client.idle(), 1);
    }
    assert_eq!(accepted.load(SeqCst), 1, "five runs, one connection");
    // Too old: a new connection.
    tokio::time::sleep(IDLE_FOR).await;
    client.execute(&params()).await.unwrap().report().await.unwrap();
    assert_eq!(accepted.load(SeqCst), 2);

    // The executor closes a kept connection: it is not taken.
    let (_dir, listener, client) = listening();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut chunk = [0u8; 4096];
        let _ = s.read(&mut chunk).await.unwrap();
        let line = wire::encode_report(&json!(1), &RunReport::not_run("s", Outcome::Ok, ""));
        s.write_all(&line).await.unwrap();
        drop(s);
        listener
    });
    client.execute(&params()).await.unwrap().report().await.unwrap();
    let listener = server.await.unwrap();
    assert_eq!(client.idle(), 1);
    let accepted = answering(listener, report.clone());
    let got = client.execute(&params()).await.unwrap().report().await.unwrap();
    assert_eq!(got, report, "served by a new connection");
    assert_eq!(accepted.load(SeqCst), 1);
}

/// A held run's request carries `hold`, its `start` comes only when
/// started, and a dropped one sends nothing more.
#[tokio::test]
async fn a_held_run_sends_start_only_when_started() {
    let (_dir, listener, client) = listening();
    let server = tokio::spawn(async move {
        let mut got = Vec::new();
        for answer in [false, true] {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let n = s.read(&mut chunk).await.unwrap();
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                if answer && buf.iter().filter(|b| **b == b'\n').count() == 2 {
                    let report = RunReport::not_run("s", Outcome::Rejected, "no");
                    s.write_all(&wire::encode_report(&json!(1), &report)).await.unwrap();
                }
            }
            got.push(buf);
        }
        got
    });
    drop(client.execute_held(params()).await.unwrap());
    let held = client.execute_held(params()).await.unwrap();
    let report = held.start().await.report().await.unwrap();
    assert_eq!(report.outcome, Outcome::Rejected);
    // The finished run's connection is kept: the client closes it.
    assert_eq!(client.idle(), 1);
    drop(client);
    let got = server.await.unwrap();
    let held_params = ExecuteParams { hold: true, ..params() };
    assert_eq!(got[0], wire::encode_execute(1, &held_params), "dropped: no start");
    let mut want = wire::encode_execute(1, &held_params);
    want.extend(wire::encode_start(1));
    assert_eq!(got[1], want);
}

type Case = (&'static [u8], fn(&ExecutorError) -> bool);

#[tokio::test]
async fn failures_are_typed() {
    let cases: [Case; 5] = [
        (b"", |e| matches!(e, ExecutorError::Closed)),
        (b"not json\n", |e| matches!(e, ExecutorError::Protocol(_))),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"x\":1}}\n", |e| {
            matches!(e, ExecutorError::Protocol(_))
        }),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32002,\"message\":\"full\"}}\n",
            |e| matches!(e, ExecutorError::Busy(m) if m == "full"),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32001,\"message\":\"who\"}}\n",
            |e| matches!(e, ExecutorError::Remote { code: -32001, .. }),
        ),
    ];
    for (reply, want) in cases {
        let (_d, c) = one_shot(reply).await;
        let e = c.execute(&params()).await.unwrap().report().await.unwrap_err();
        assert!(want(&e), "{:?}: {e:?}", String::from_utf8_lossy(reply));
    }
    let missing = ExecutorClient::new("/nonexistent/e.sock");
    assert!(matches!(missing.execute(&params()).await, Err(ExecutorError::Connect { .. })));
    assert!(!missing.ping(Duration::from_millis(100)).await);
}

/// An executor that accepts and never reads: a request larger than the
/// socket's buffers fails within the send bound instead of hanging.
#[tokio::test]
async fn a_request_never_read_fails_in_time() {
    let (_dir, listener, client) = listening();
    let client = client.send_timeout(Duration::from_millis(500));
    let accepted = tokio::spawn(async move { listener.accept().await.map(|(s, _)| s) });
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4 << 20));
    let params =
        ExecuteParams { args: policy::RawJson::from_slice(big.as_bytes()).unwrap(), ..params() };
    let sent = tokio::time::timeout(Duration::from_secs(5), client.execute(&params)).await;
    let e = sent.expect("still writing after 5 s").expect_err("an error");
    assert!(
        matches!(&e, ExecutorError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut),
        "{e:?}"
    );
    drop(accepted.await);
}

/// An executor that stopped reading before a held run's `start`: the
/// start gives up within the send bound and the run fails at once,
/// instead of waiting for the run's deadline.
#[tokio::test]
async fn a_start_never_read_fails_in_time() {
    let (ours, _theirs) = tokio::net::UnixStream::pair().unwrap();
    // The socket's buffer full: the next write would block.
    let chunk = [0u8; 4096];
    while ours.try_write(&chunk).is_ok() {}
    let conn = Conn {
        stream: Some(QuietStream::from_tokio(ours).unwrap()),
        idle: Arc::default(),
        reusable: false,
        since: Instant::now(),
    };
    let held = HeldRun {
        run: RunConnection::new(conn, MAX_LINE_BYTES),
        send_timeout: Duration::from_millis(300),
    };
    let started = tokio::time::timeout(Duration::from_secs(5), held.start()).await;
    let mut run = started.expect("start still writing after 5 s");
    let next = tokio::time::timeout(Duration::from_secs(5), run.next()).await;
    let e = next.expect("still waiting for an event after 5 s").expect_err("an error");
    assert!(
        matches!(&e, ExecutorError::Io(io) if io.kind() == io::ErrorKind::NotConnected),
        "{e:?}"
    );
}
