//! Requests to `ongrid-skilld`'s API through the loader's own client
//! (`loader::cli::client::DaemonClient`, what `ongrid-skill` uses), made
//! blocking for the suites: one connection per request, the whole answer
//! read (hyper takes the chunked framing off).
//!
//! Checks of the exact bytes on the wire (a head cut short, the chunked
//! framing, a metrics listener over TCP) keep a raw socket and
//! [`parse_response`] instead.

use std::path::Path;
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::Method;
use loader::cli::client::DaemonClient;
use serde_json::Value;

/// The longest a request may take, answer read included.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The largest answer body read.
const MAX_BODY_BYTES: usize = 64 << 20;

/// An answer: status, lower-case headers, body (de-chunked).
#[derive(Debug)]
pub struct Resp {
    /// The status code.
    pub status: u16,
    /// `(name, value)`, names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body, without the chunked framing.
    pub body: Vec<u8>,
}

impl Resp {
    /// The body as JSON.
    ///
    /// # Panics
    ///
    /// When it is not JSON (the message shows the status and body).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The NDJSON lines of a stream answer.
    ///
    /// # Panics
    ///
    /// When a line is not JSON.
    pub fn events(&self) -> Vec<Value> {
        self.body
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }
}

/// One request to the daemon on `socket` through `DaemonClient`, `body`
/// sent as `application/json`; the answer read to its end.
///
/// # Errors
///
/// The client's error, or a timeout (60 s), as text.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    accept: &str,
    body: Option<&[u8]>,
) -> Result<Resp, String> {
    let method = Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
    let client = DaemonClient::new(socket);
    let body = body.map(<[u8]>::to_vec);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        let exchange = async {
            let answer = client.send(method, path, body, accept).await.map_err(|e| {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    text.push_str(&format!(": {s}"));
                    source = s.source();
                }
                text
            })?;
            let status = answer.status().as_u16();
            let headers = answer
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect();
            let body = Limited::new(answer.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes()
                .to_vec();
            Ok(Resp { status, headers, body })
        };
        tokio::time::timeout(TIMEOUT, exchange).await.map_err(|_| "timed out".to_owned())?
    })
}

/// Parses a whole HTTP/1.1 answer read from a raw socket.
pub fn parse_response(raw: &[u8]) -> Option<Resp> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked =
        headers.iter().any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked { dechunk(rest)? } else { rest.to_vec() };
    Some(Resp { status, headers, body })
}

/// The body of a chunked answer, or `None` when the framing is broken.
fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::parse_response;

    /// A chunked answer is put back together; a cut one is refused.
    #[test]
    fn chunked_answers_are_dechunked() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: a/b\r\n\r\n\
                    3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n";
        let r = parse_response(raw).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"abcde"[..]));
        assert_eq!(r.header("content-type"), Some("a/b"));
        assert!(parse_response(&raw[..raw.len() - 12]).is_none());
    }
}
