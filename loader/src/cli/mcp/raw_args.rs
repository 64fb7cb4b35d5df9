//! The `arguments` of each `tools/call` as the client wrote them.
//!
//! The SDK parses a call's `arguments` into a JSON map: numbers past 64
//! bits are rounded, keys are sorted, and of a key given twice the last
//! one counts. A skill must read its args as sent, and a key given twice
//! must be refused, as every other way in refuses it. So the bytes that
//! reach the SDK pass through [`Tee`], which keeps each `tools/call`'s
//! `params.arguments` as text, by request id, until the call takes it.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, ReadBuf};

/// Calls kept for the SDK to dispatch: a call it refuses before its
/// handler runs (say, before `initialize`) leaves its entry behind, and the
/// oldest goes when this many are kept.
const KEPT_CALLS: usize = 256;

/// Longest line inspected; a longer one passes through untouched, and its
/// call is refused (its arguments were not kept as written).
const MAX_LINE: usize = 4 << 20;

/// What a call's line held: its arguments as text, or why its `params`
/// could not be read (given twice, for one).
pub type Arguments = Result<Option<Box<RawValue>>, String>;

/// The calls seen and not yet taken, by request id as JSON text, read and
/// written as the SDK reads and writes it (`"esc"` for a client's
/// `"\u0065sc"`, `100` for `1e2`), so the SDK's id finds its call however
/// the client wrote it.
#[derive(Debug, Clone, Default)]
pub struct Calls(Arc<Mutex<VecDeque<(String, Arguments)>>>);

impl Calls {
    /// Takes the arguments of the call whose id is `id` (JSON text).
    pub fn take(&self, id: &str) -> Option<Arguments> {
        let mut calls = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let at = calls.iter().position(|(k, _)| k == id)?;
        calls.remove(at).map(|(_, args)| args)
    }

    fn keep(&self, id: String, args: Arguments) {
        let mut calls = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        calls.retain(|(k, _)| *k != id);
        if calls.len() == KEPT_CALLS {
            calls.pop_front();
        }
        calls.push_back((id, args));
    }

    /// Looks at one complete line: a `tools/call` request is kept; returns
    /// the line to hand on in its place, if not the line itself (see
    /// [`Tee`]).
    fn inspect(&self, line: &[u8]) -> Option<Vec<u8>> {
        #[derive(Deserialize)]
        struct Head<'a> {
            #[serde(borrow)]
            method: Option<std::borrow::Cow<'a, str>>,
            id: Option<rmcp::model::RequestId>,
        }
        #[derive(Deserialize)]
        struct Line<'a> {
            #[serde(borrow)]
            params: Option<Params<'a>>,
        }
        #[derive(Deserialize)]
        struct Params<'a> {
            #[serde(borrow)]
            arguments: Option<&'a RawValue>,
        }
        let Ok(head) = serde_json::from_slice::<Head<'_>>(line) else { return None };
        let (Some("tools/call"), Some(id)) = (head.method.as_deref(), head.id) else {
            return None;
        };
        let args = serde_json::from_slice::<Line<'_>>(line)
            .map(|l| l.params.and_then(|p| p.arguments))
            .map_err(|e| format!("params: {e}"));
        let id = serde_json::to_string(&id).ok()?;
        self.keep(id, args.clone().map(|a| a.map(RawValue::to_owned)));
        // The SDK drops, unanswered, a line it cannot read as JSON values
        // (a lone surrogate escape, a number past f64): its arguments,
        // kept above as written, are handed on as `{}`.
        if serde_json::from_slice::<serde_json::Value>(line).is_ok() {
            return None;
        }
        let raw = args.ok()??;
        let start = (raw.get().as_ptr() as usize).checked_sub(line.as_ptr() as usize)?;
        let end = start + raw.get().len();
        let mut fixed = Vec::with_capacity(line.len());
        fixed.extend_from_slice(line.get(..start)?);
        fixed.extend_from_slice(b"{}");
        fixed.extend_from_slice(line.get(end..)?);
        serde_json::from_slice::<serde_json::Value>(&fixed).is_ok().then_some(fixed)
    }
}

/// A reader that shows each complete line to [`Calls`] and hands it on,
/// or the line [`Calls::inspect`] gives in its place: the lines of the
/// input are held until complete (the SDK reads whole lines anyway), up to
/// [`MAX_LINE`]; a longer line passes through as it comes.
#[derive(Debug)]
pub struct Tee<R> {
    inner: R,
    calls: Calls,
    line: Vec<u8>,
    /// The current line grew past [`MAX_LINE`]: passed on to its end.
    skipping: bool,
    /// Bytes to hand on, from `at`.
    out: Vec<u8>,
    at: usize,
}

impl<R> Tee<R> {
    /// Tees `inner` into `calls`.
    pub fn new(inner: R, calls: Calls) -> Self {
        Self { inner, calls, line: Vec::new(), skipping: false, out: Vec::new(), at: 0 }
    }

    fn saw(&mut self, mut bytes: &[u8]) {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            if self.skipping || self.line.len() + end > MAX_LINE {
                self.out.append(&mut self.line);
                self.out.extend_from_slice(&bytes[..=end]);
            } else {
                self.line.extend_from_slice(&bytes[..end]);
                match self.calls.inspect(&self.line) {
                    Some(fixed) => self.out.extend_from_slice(&fixed),
                    None => self.out.extend_from_slice(&self.line),
                }
                self.out.push(b'\n');
            }
            self.line.clear();
            self.skipping = false;
            bytes = &bytes[end + 1..];
        }
        if self.skipping {
            self.out.extend_from_slice(bytes);
        } else {
            self.line.extend_from_slice(bytes);
            if self.line.len() > MAX_LINE {
                self.out.append(&mut self.line);
                self.line = Vec::new();
                self.skipping = true;
            }
        }
    }

    /// Hands on what is held, as much as `buf` takes.
    fn hand_on(&mut self, buf: &mut ReadBuf<'_>) {
        let n = buf.remaining().min(self.out.len() - self.at);
        buf.put_slice(&self.out[self.at..self.at + n]);
        self.at += n;
        if self.at == self.out.len() {
            self.out.clear();
            self.at = 0;
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Tee<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.at < this.out.len() {
                this.hand_on(buf);
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 << 10];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // The end: a last line without its newline goes as is.
                    if this.line.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                    this.out.append(&mut this.line);
                }
                Poll::Ready(Ok(())) => this.saw(read.filled()),
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    async fn tee(input: &[u8]) -> (Vec<u8>, Calls) {
        let calls = Calls::default();
        let mut out = Vec::new();
        Tee::new(input, calls.clone()).read_to_end(&mut out).await.unwrap();
        (out, calls)
    }

    #[tokio::test]
    async fn a_call_keeps_its_arguments_as_written() {
        let input = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":40,"method":"tools/call","params":{"name":"e","arguments":{"z":1.50,"big":123456789012345678901234567890}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":"e"},"params":{}}"#,
            "\n",
        );
        let (out, calls) = tee(input.as_bytes()).await;
        assert_eq!(out, input.as_bytes());
        let args = calls.take("40").unwrap().unwrap().unwrap();
        assert_eq!(args.get(), r#"{"z":1.50,"big":123456789012345678901234567890}"#);
        assert!(calls.take("40").is_none(), "taken once");
        assert!(calls.take("1").is_none(), "not a call");
        let twice = calls.take(r#""s""#).unwrap().unwrap_err();
        assert!(twice.contains("duplicate field"), "{twice}");
    }

    /// A call is found by its id as the SDK writes it, however the client
    /// escaped the id or the method.
    #[tokio::test]
    async fn a_call_is_found_by_its_id_however_it_was_escaped() {
        let input = concat!(
            r#"{"jsonrpc":"2.0","id":"esc","method":"tools\/call","params":{"name":"e","arguments":{"a":1,"a":2}}}"#,
            "
",
        );
        let (_, calls) = tee(input.as_bytes()).await;
        let id = serde_json::to_string(&serde_json::json!("esc")).unwrap();
        let numbers = concat!(
            r#"{"jsonrpc":"2.0","id":1e2,"method":"tools/call","params":{"arguments":{"n":1}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":-0,"method":"tools/call","params":{"arguments":{"n":2}}}"#,
            "\n",
        );
        let (_, by_number) = tee(numbers.as_bytes()).await;
        for (sdk, args) in [
            (rmcp::model::RequestId::Number(100), r#"{"n":1}"#),
            (rmcp::model::RequestId::Number(0), r#"{"n":2}"#),
        ] {
            let key = serde_json::to_string(&sdk).unwrap();
            let kept = by_number.take(&key).unwrap_or_else(|| panic!("no call under {key}"));
            assert_eq!(kept.unwrap().unwrap().get(), args);
        }
        let args = calls.take(&id).expect("the call is kept under \"esc\"").unwrap().unwrap();
        assert_eq!(
            args.get(),
            r#"{"a":1,"a":2}"#,
            "as written: the key given twice is refused later"
        );
    }

    /// A call whose line the SDK would drop unanswered (not JSON values it
    /// can hold) reaches it with `{}` as its arguments; they are kept as
    /// written, so the call is answered (refused, or run as written).
    #[tokio::test]
    async fn a_call_the_sdk_cannot_read_is_handed_on_with_empty_arguments() {
        let input = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e","arguments":{"s":"\ud800"},"_meta":{"k":1}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"e","arguments":{"n":1e400}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"e","arguments":{"n":1}}}"#,
        );
        let (out, calls) = tee(input.as_bytes()).await;
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.split('\n').collect();
        assert_eq!(
            lines[0],
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e","arguments":{},"_meta":{"k":1}}}"#
        );
        assert_eq!(
            lines[1],
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"e","arguments":{}}}"#
        );
        assert_eq!(lines[2], input.split('\n').nth(2).unwrap(), "a readable line is untouched");
        for line in &lines {
            assert!(serde_json::from_str::<serde_json::Value>(line).is_ok(), "{line}");
        }
        assert_eq!(calls.take("1").unwrap().unwrap().unwrap().get(), r#"{"s":"\ud800"}"#);
        assert_eq!(calls.take("2").unwrap().unwrap().unwrap().get(), r#"{"n":1e400}"#);
    }

    #[tokio::test]
    async fn old_entries_go_and_long_lines_pass_untouched() {
        let mut input = String::new();
        for id in 0..KEPT_CALLS + 1 {
            input.push_str(&format!(
                "{{\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"arguments\":{{}}}}}}\n"
            ));
        }
        let long = format!(
            "{{\"id\":999,\"method\":\"tools/call\",\"x\":\"{}\"}}\n",
            "a".repeat(MAX_LINE)
        );
        input.push_str(&long);
        let (out, calls) = tee(input.as_bytes()).await;
        assert_eq!(out.len(), input.len());
        assert!(calls.take("0").is_none(), "the oldest went");
        assert!(calls.take(&KEPT_CALLS.to_string()).is_some());
        assert!(calls.take("999").is_none(), "a line past the bound is not read");
    }
}
