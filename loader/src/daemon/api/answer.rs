//! A run's answer on its way to the client, holding the run's slot.
//!
//! A run slot (`max_concurrent_runs`) covers a run until its answer has
//! been handed to the connection, not only until the executor's report
//! came: a report can be as large as the skill's stdout cap (16 MiB by
//! default), and a client that does not read would otherwise keep it in
//! skilld's memory, one per connection (`max_connections`), while the slot
//! served further runs. The answer goes out in slices of [`SLICE`] bytes
//! (views of one buffer, nothing copied); hyper asks for the next slice
//! only when its write buffer has room, so the slot is let go with the
//! last slice, when all but a few hundred KiB were written to the socket.
//! A client that stops reading keeps the slot until its connection is cut
//! (`idle_timeout` with its writes blocked), which drops
//! the answer and the slot with it. Answers held in skilld are so bounded
//! by `max_concurrent_runs` times the largest report, whatever the number
//! of connections; `ongrid_answers_unsent` counts them meanwhile.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use hyper::body::{Frame, SizeHint};

/// Bytes handed to hyper at a time.
pub const SLICE: usize = 64 << 10;

/// A JSON answer's body: `bytes` in slices, with `held` (the run slot and
/// the `ongrid_answers_unsent` count) let go as the last one is taken, or
/// when the body is dropped (a connection cut).
#[derive(Debug)]
pub struct Answer<H> {
    rest: Bytes,
    held: Option<H>,
}

impl<H> Answer<H> {
    /// The body `bytes`, holding `held` until they are all taken.
    pub fn new(bytes: Bytes, held: H) -> Self {
        Answer { rest: bytes, held: Some(held) }
    }
}

impl<H: Unpin> hyper::body::Body for Answer<H> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let frame = next_slice(&mut this.rest);
        if this.rest.is_empty() {
            this.held = None;
        }
        Poll::Ready(frame.map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// The next slice of `rest` (at most [`SLICE`] bytes), taken off it; `None`
/// once it is empty.
fn next_slice(rest: &mut Bytes) -> Option<Bytes> {
    (!rest.is_empty()).then(|| rest.split_to(rest.len().min(SLICE)))
}

/// `bytes` as slices of at most [`SLICE`] bytes, for a streamed answer
/// (NDJSON): the stream is asked for its next line, and so lets go of the
/// run and its slot, only once every slice of this one was taken.
pub fn slices(mut bytes: Bytes) -> impl Iterator<Item = Bytes> {
    std::iter::from_fn(move || next_slice(&mut bytes))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use tokio::sync::Semaphore;

    use super::*;

    #[tokio::test]
    async fn the_slot_goes_with_the_last_slice() {
        let slots = Arc::new(Semaphore::new(1));
        let text: Vec<u8> = (0..SLICE * 2 + 10).map(|i| (i % 251) as u8).collect();
        let permit = Arc::clone(&slots).try_acquire_owned().unwrap();
        let mut body = Answer::new(Bytes::from(text.clone()), permit);
        assert_eq!(hyper::body::Body::size_hint(&body).exact(), Some(text.len() as u64));
        let mut got = Vec::new();
        let mut frames = 0;
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= SLICE);
            got.extend_from_slice(&data);
            frames += 1;
            let done = got.len() == text.len();
            // Held while any byte is left to take, free with the last.
            assert_eq!(slots.available_permits(), usize::from(done), "after {frames} frames");
        }
        assert_eq!((got, frames), (text, 3));
        assert!(hyper::body::Body::is_end_stream(&body));
    }

    #[test]
    fn a_dropped_answer_frees_its_slot_and_an_empty_one_holds_nothing() {
        let slots = Arc::new(Semaphore::new(1));
        let permit = Arc::clone(&slots).try_acquire_owned().unwrap();
        let body = Answer::new(Bytes::from_static(b"{}"), permit);
        assert_eq!(slots.available_permits(), 0);
        drop(body);
        assert_eq!(slots.available_permits(), 1);
        assert_eq!(slices(Bytes::new()).count(), 0);
        let parts: Vec<Bytes> = slices(Bytes::from(vec![7u8; SLICE + 1])).collect();
        assert_eq!(parts.iter().map(Bytes::len).collect::<Vec<_>>(), [SLICE, 1]);
    }
}
