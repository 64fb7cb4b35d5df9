//! [`DaemonClient`]: HTTP/1.1 over the daemon's Unix socket, for the CLI
//! and the tests. One connection per request.

use std::io;
use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use policy::RawJson;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::daemon::quiet_stream::QuietStream;

/// Largest answer body read (a skill's result is capped by the executor
/// at 16 MiB by default; the report wraps it).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Why a request to the daemon failed (not an HTTP error status: those
/// are answers).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("cannot connect to ongrid-skilld at {socket}")]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The HTTP exchange failed.
    #[error("HTTP exchange with ongrid-skilld failed")]
    Http(#[source] hyper::Error),
    /// The answer is not what the API documents.
    #[error("unexpected answer from ongrid-skilld: {0}")]
    Protocol(String),
}

/// An answer with a JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiResponse {
    /// The status.
    pub status: StatusCode,
    /// The body (`null` when empty).
    pub body: Value,
    /// The body as received.
    pub raw: Bytes,
}

impl ApiResponse {
    /// The `result` of the run report in this answer, as the skill printed
    /// it (key order, number spelling and escapes kept), when there is one.
    pub fn report_result(&self) -> Option<RawJson> {
        report_result(&self.raw)
    }
}

/// The `result` of a run report given as JSON text: an execute answer or
/// a stream's `{"event":"report","report":{...}}` line.
pub fn report_result(text: &[u8]) -> Option<RawJson> {
    #[derive(Deserialize)]
    struct Report {
        #[serde(default)]
        result: Option<RawJson>,
    }
    #[derive(Deserialize)]
    struct Body {
        #[serde(default)]
        result: Option<RawJson>,
        #[serde(default)]
        report: Option<Report>,
    }
    let body: Body = serde_json::from_slice(text).ok()?;
    body.report.map_or(body.result, |r| r.result)
}

/// A client of `ongrid-skilld`.
#[derive(Debug, Clone)]
pub struct DaemonClient {
    socket: PathBuf,
}

impl DaemonClient {
    /// A client of the daemon at `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self { socket: socket.into() }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends one request and returns the answer with its body unread.
    ///
    /// # Errors
    ///
    /// [`ClientError::Connect`] or [`ClientError::Http`].
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        accept: &str,
    ) -> Result<Response<Incoming>, ClientError> {
        // Registered for reading only: the daemon's read of the request
        // would otherwise come back as a write-readiness wake-up of this
        // runtime, for nothing (`QuietStream`).
        let stream = QuietStream::connect(&self.socket)
            .await
            .map_err(|source| ClientError::Connect { socket: self.socket.clone(), source })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(ClientError::Http)?;
        tokio::spawn(async move {
            // Errors surface through `send_request`.
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, "localhost")
            .header(ACCEPT, accept);
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Protocol(format!("building the request: {e}")))?;
        sender.send_request(req).await.map_err(ClientError::Http)
    }

    /// `GET path`, JSON answer.
    ///
    /// # Errors
    ///
    /// [`ClientError`].
    pub async fn get(&self, path: &str) -> Result<ApiResponse, ClientError> {
        let response = self.send(Method::GET, path, None, "application/json").await?;
        read_json(response).await
    }

    /// `POST path` with a JSON body, JSON answer.
    ///
    /// # Errors
    ///
    /// [`ClientError`].
    pub async fn post<B: Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<ApiResponse, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let response = self.send(Method::POST, path, Some(bytes), "application/json").await?;
        read_json(response).await
    }

    /// `POST /v1/skills/{name}/execute` asking for the NDJSON stream; calls
    /// `on_event` for each event line (parsed, and as received). Returns the status and, when the
    /// answer is not a stream (an error), its JSON body.
    ///
    /// # Errors
    ///
    /// [`ClientError`].
    pub async fn execute_stream<B: Serialize + ?Sized>(
        &self,
        name: &str,
        body: &B,
        mut on_event: impl FnMut(Value, &[u8]),
    ) -> Result<ApiResponse, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let path = format!("/v1/skills/{}/execute", encode_segment(name));
        let mut response =
            self.send(Method::POST, &path, Some(bytes), "application/x-ndjson").await?;
        let is_stream = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-ndjson"));
        if !is_stream {
            return read_json(response).await;
        }
        let status = response.status();
        let mut pending: Vec<u8> = Vec::new();
        while let Some(frame) = response.body_mut().frame().await {
            let frame = frame.map_err(ClientError::Http)?;
            let Some(data) = frame.data_ref() else { continue };
            pending.extend_from_slice(data);
            while let Some(i) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                let event = serde_json::from_slice(&line[..i])
                    .map_err(|e| ClientError::Protocol(format!("stream line: {e}")))?;
                on_event(event, &line[..i]);
            }
            if pending.len() > MAX_RESPONSE_BYTES {
                return Err(ClientError::Protocol("stream line too long".into()));
            }
        }
        Ok(ApiResponse { status, body: Value::Null, raw: Bytes::new() })
    }
}

/// Reads a JSON answer (at most 64 MiB).
///
/// # Errors
///
/// [`ClientError::Http`] when reading fails, [`ClientError::Protocol`]
/// when the body is too large or not JSON.
pub async fn read_json(response: Response<Incoming>) -> Result<ApiResponse, ClientError> {
    let status = response.status();
    let body = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| ClientError::Protocol(format!("reading the answer: {e}")))?
        .to_bytes();
    let raw = body;
    let body = if raw.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&raw)
            .map_err(|e| ClientError::Protocol(format!("answer is not JSON ({status}): {e}")))?
    };
    Ok(ApiResponse { status, body, raw })
}

/// Percent-encodes one path segment (everything but `[A-Za-z0-9_.-]`).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded() {
        assert_eq!(encode_segment("disk_usage"), "disk_usage");
        assert_eq!(encode_segment("a/b c"), "a%2Fb%20c");
        assert_eq!(encode_segment("é"), "%C3%A9");
    }
}
