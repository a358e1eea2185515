//! Provider-neutral plumbing shared by the HTTP adapters: opening a streamed call, turning a
//! Server-Sent Events body into [`StreamEvent`]s (live, or recorded for the conformance tests),
//! and small JSON and message helpers.
//!
//! What the events and error bodies of a provider mean stays in its adapter (an [`SseDecode`]
//! implementation and an [`ErrorParser`]); this module only carries bytes, events and errors
//! between the transport, that decoder and the caller.

#[cfg(any(test, feature = "testing"))]
use crate::model::ApiError;
#[cfg(feature = "http")]
use crate::model::EventStream;
use crate::model::{ModelError, ModelResponse};
#[cfg(any(test, feature = "testing"))]
use crate::providers::Decoded;
#[cfg(feature = "http")]
use crate::redact::Redactor;
use crate::stream::{Accumulator, StreamEvent};
#[cfg(feature = "http")]
use crate::transport::http::{
    ByteStream, CallBudget, HttpTransport, no_event_error, resilient_stream_from,
};
use crate::transport::sse::{SseDecoder, SseEvent};
use crate::transport::wire::Endpoint;
#[cfg(any(test, feature = "testing", feature = "http"))]
use crate::transport::wire::ErrorParser;
#[cfg(feature = "http")]
use bytes::Bytes;
#[cfg(feature = "http")]
use futures::StreamExt;
use http::header::HeaderMap;
use serde_json::Value;
#[cfg(feature = "http")]
use std::future::Future;
#[cfg(feature = "http")]
use std::pin::Pin;
#[cfg(feature = "http")]
use std::sync::Arc;
#[cfg(feature = "http")]
use std::task::{Context, Poll};
#[cfg(feature = "http")]
use std::time::Duration;

/// What one provider's stream events mean: turns SSE events into [`StreamEvent`]s.
pub(crate) trait SseDecode: Send + 'static {
    /// Decodes one SSE event, pushing the events it completes to `out`. An error ends the
    /// stream; the events pushed before it are still delivered, first.
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<(), ModelError>;

    /// As [`SseDecode::event`], with the event lent mutably: the decoder may change it in place
    /// while it reads it (the reader empties it for the next event). By default,
    /// [`SseDecode::event`].
    fn event_mut(
        &mut self,
        ev: &mut SseEvent,
        out: &mut Vec<StreamEvent>,
    ) -> Result<(), ModelError> {
        self.event(ev, out)
    }

    /// The body ended: pushes the closing events, or says why the response is incomplete.
    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError>;

    /// Whether the response is already complete, closing events pushed (OpenAI's `[DONE]`):
    /// the rest of the body is not read and [`SseDecode::finish`] is not called.
    fn done(&self) -> bool {
        false
    }
}

/// An SSE body being read: the event framing and a provider's decoder.
pub(crate) struct SseReader<D> {
    sse: SseDecoder,
    decoder: D,
    /// SSE events read so far (comments are not events).
    events: u64,
}

impl<D: SseDecode> SseReader<D> {
    /// A reader at the start of a body.
    pub(crate) fn new(decoder: D) -> Self {
        SseReader {
            // Room for a usual chunk's line, so that the event's data is allocated once.
            sse: SseDecoder::with_capacity(512),
            decoder,
            events: 0,
        }
    }

    /// Adds bytes; the events they complete go to `out`, also when an error follows them.
    pub(crate) fn push(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<StreamEvent>,
    ) -> Result<(), ModelError> {
        let (decoder, events) = (&mut self.decoder, &mut self.events);
        self.sse.push_each_mut(bytes, |ev| {
            *events += 1;
            decoder.event_mut(ev, out)
        })
    }

    /// Ends the body: decodes a last event left without its blank line, then the decoder's
    /// closing events.
    pub(crate) fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if self.decoder.done() {
            return Ok(());
        }
        let decoder = &mut self.decoder;
        self.sse.finish_each_mut(|ev| decoder.event_mut(ev, out))?;
        self.decoder.finish(out)
    }

    /// Whether the response is complete before the body ended.
    pub(crate) fn done(&self) -> bool {
        self.decoder.done()
    }

    /// The provider's decoder.
    #[cfg(test)]
    pub(crate) fn decoder(&self) -> &D {
        &self.decoder
    }
}

/// An SSE body being read, whatever its provider (what [`crate::providers::wire`] hands out).
pub(crate) trait ReadSse: Send {
    /// As [`SseReader::push`].
    fn push(&mut self, bytes: &[u8], out: &mut Vec<StreamEvent>) -> Result<(), ModelError>;
    /// As [`SseReader::finish`].
    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError>;
    /// As [`SseReader::done`].
    fn done(&self) -> bool;
}

impl<D: SseDecode> ReadSse for SseReader<D> {
    fn push(&mut self, bytes: &[u8], out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        SseReader::push(self, bytes, out)
    }
    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        SseReader::finish(self, out)
    }
    fn done(&self) -> bool {
        SseReader::done(self)
    }
}

/// A transport failure while a 2xx body is read is a broken connection (reqwest reports it as a
/// body or decode error, which the transport marks retryable), so that [`resilient_stream_from`]
/// opens the stream again when nothing was delivered yet. A failure the transport marked final
/// (an idle timeout) stays final, and other errors (a body over the size limit) are kept.
#[cfg(feature = "http")]
fn broken(e: ModelError) -> ModelError {
    match e {
        ModelError::Transport { message, retryable } => ModelError::Transport {
            message: format!("the stream broke: {message}"),
            retryable,
        },
        other => other,
    }
}

/// Decodes an SSE response body with `decoder`. Events that arrived before an error are
/// delivered first, then the error, then nothing more. With `event_timeout`, a body that goes
/// that long without an SSE event (nothing, or only comments) ends with an error.
#[cfg(feature = "http")]
pub(crate) fn sse_event_stream<D: SseDecode>(
    bytes: ByteStream,
    decoder: D,
    event_timeout: Option<Duration>,
) -> EventStream {
    Box::pin(SseEvents {
        bytes,
        reader: SseReader::new(decoder),
        // Room for the events of a usual read, so that it is allocated once.
        ready: Vec::with_capacity(16),
        error: None,
        ended: false,
        timer: event_timeout.map(|limit| EventTimer {
            limit,
            last_event: tokio::time::Instant::now(),
            sleep: None,
        }),
    })
}

/// The stream [`sse_event_stream`] gives: each poll reads what is ready, with no state moved
/// from one poll to the next.
#[cfg(feature = "http")]
struct SseEvents<D> {
    bytes: ByteStream,
    reader: SseReader<D>,
    /// The events the last chunk completed, last first, handed out from the end. The buffer
    /// keeps its capacity from chunk to chunk: reading a stream allocates nothing per chunk
    /// once it has grown.
    ready: Vec<StreamEvent>,
    /// The error that ended the body, delivered after `ready`.
    error: Option<ModelError>,
    ended: bool,
    timer: Option<EventTimer>,
}

/// The event timeout of a stream: armed once, when the stream first waits, and moved only
/// when it fires before its time (events came since it was armed), so that reading a chunk
/// touches no timer.
#[cfg(feature = "http")]
struct EventTimer {
    limit: Duration,
    /// When the last SSE event was read (or the stream opened).
    last_event: tokio::time::Instant,
    /// The timer, and the deadline it is armed for.
    sleep: Option<(Pin<Box<tokio::time::Sleep>>, tokio::time::Instant)>,
}

#[cfg(feature = "http")]
impl EventTimer {
    /// Whether the stream has gone `limit` without an event (registers the waker otherwise).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        // A limit too far to add to a time (`Duration::MAX`) is no limit.
        let Some(deadline) = self.last_event.checked_add(self.limit) else {
            return false;
        };
        let (sleep, armed_for) = self
            .sleep
            .get_or_insert_with(|| (Box::pin(tokio::time::sleep_until(deadline)), deadline));
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            // It fired: the stream is late unless an event came after it was armed.
            let Some(deadline) = self.last_event.checked_add(self.limit) else {
                return false;
            };
            if deadline <= *armed_for {
                return true;
            }
            sleep.as_mut().reset(deadline);
            *armed_for = deadline;
        }
    }
}

#[cfg(feature = "http")]
impl<D> Unpin for SseEvents<D> {}

#[cfg(feature = "http")]
impl<D: SseDecode> futures::Stream for SseEvents<D> {
    type Item = Result<StreamEvent, ModelError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.ready.pop() {
                return Poll::Ready(Some(Ok(event)));
            }
            if let Some(e) = this.error.take() {
                return Poll::Ready(Some(Err(e)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            let next = match this.bytes.poll_next_unpin(cx) {
                Poll::Ready(next) => next,
                Poll::Pending => {
                    if let Some(timer) = &mut this.timer
                        && timer.expired(cx)
                    {
                        this.ended = true;
                        return Poll::Ready(Some(Err(no_event_error(timer.limit))));
                    }
                    return Poll::Pending;
                }
            };
            let events_before = this.reader.events;
            let result = match next {
                Some(Ok(chunk)) => this.reader.push(&chunk, &mut this.ready),
                Some(Err(e)) => Err(broken(e)),
                None => {
                    this.ended = true;
                    this.reader.finish(&mut this.ready)
                }
            };
            if this.reader.events != events_before
                && let Some(timer) = &mut this.timer
            {
                timer.last_event = tokio::time::Instant::now();
            }
            this.ready.reverse();
            if this.reader.done() {
                this.ended = true;
            }
            if let Err(e) = result {
                this.ended = true;
                this.error = Some(e);
            }
        }
    }
}

/// Where a call goes and the headers it is sent with.
#[derive(Debug)]
pub(crate) struct Target {
    /// The URL, parsed.
    pub(crate) url: Endpoint,
    /// The headers (a key among them marked sensitive).
    pub(crate) headers: HeaderMap,
}

/// A [`Target`] a stream holds for as long as it may open again: the adapter's own, shared,
/// when every call has the same one, or a copy made for this call.
#[cfg(feature = "http")]
pub(crate) enum HeldTarget {
    /// The adapter's own, the same for every call.
    Shared(Arc<Target>),
    /// A copy for this call.
    Own(Target),
}

#[cfg(feature = "http")]
impl std::ops::Deref for HeldTarget {
    type Target = Target;
    fn deref(&self) -> &Target {
        match self {
            HeldTarget::Shared(target) => target,
            HeldTarget::Own(target) => target,
        }
    }
}

/// Everything needed to open one streamed call, again if need be.
#[cfg(feature = "http")]
struct Opener<F> {
    transport: HttpTransport,
    target: HeldTarget,
    body: Bytes,
    parse_error: ErrorParser,
    make_decoder: F,
    /// First-byte timeouts, counted across the openings of the call.
    budget: CallBudget,
}

#[cfg(feature = "http")]
impl<D: SseDecode, F: Fn() -> D + Send + Sync + 'static> Opener<F> {
    /// Opens the stream (again); the opener is shared with the stream when the request log needs
    /// it there.
    async fn open(this: &Arc<Self>) -> Result<EventStream, ModelError> {
        let bytes = this
            .transport
            .post_stream_within(
                &this.target.url,
                &this.target.headers,
                this.body.clone(),
                this.parse_error,
                &this.budget,
            )
            .await?;
        let stream = sse_event_stream(
            bytes,
            (this.make_decoder)(),
            Some(this.transport.event_timeout),
        );
        if this.transport.debug_log.is_none() {
            return Ok(stream);
        }
        // A body that broke is in the request log (a retry, if any, follows it there).
        let (opener, redactor) = (
            this.clone(),
            Redactor::for_request(this.target.url.as_str(), &this.target.headers),
        );
        Ok(Box::pin(stream.inspect(move |item| {
            if let (Err(e), Some(log)) = (item, &opener.transport.debug_log) {
                let e = redactor.redact_error(e.clone());
                opener
                    .budget
                    .log_stream_broke(log, &e.to_string(), e.is_retryable(), &redactor);
            }
        })))
    }

    /// `e` without the request's secrets (a stream's error event, or an event that does not
    /// decode, may quote them).
    fn redact(&self, e: ModelError) -> ModelError {
        Redactor::for_request(self.target.url.as_str(), &self.target.headers).redact_error(e)
    }
}

/// Opens a streamed call: POSTs `body` to the `target`'s URL and decodes the SSE reply with a
/// decoder made by `make_decoder`. The first attempt is made before this returns, so an HTTP error
/// (after the transport's retries) is this call's error; a stream that fails with a retryable error
/// before delivering output is opened again ([`resilient_stream_from`]), one that already delivered
/// output never is. The stream's errors are redacted, then given to `classify` (the adapter's).
///
/// Its layers: the opener (shared by the openings, holding the `target` without copying it when
/// it is shared), the reopening layer, which also redacts and classifies the errors it passes on
/// (no layer of its own for that), and the event reader over the opened body's bytes.
#[cfg(feature = "http")]
pub(crate) async fn open_sse_stream<D, F>(
    transport: &HttpTransport,
    target: HeldTarget,
    body: Bytes,
    parse_error: ErrorParser,
    make_decoder: F,
    classify: fn(ModelError) -> ModelError,
) -> Result<EventStream, ModelError>
where
    D: SseDecode,
    F: Fn() -> D + Send + Sync + 'static,
{
    let opener = Arc::new(Opener {
        transport: transport.clone(),
        target,
        body,
        parse_error,
        make_decoder,
        budget: CallBudget::default(),
    });
    // The first stream is opened here; the opener opens anew after a failure.
    let first = Opener::open(&opener).await?;
    let policy = opener.transport.retry.clone();
    let redactor = opener.clone();
    Ok(resilient_stream_from(
        policy,
        Some(first),
        move || {
            let opener = opener.clone();
            async move { Opener::open(&opener).await }
        },
        move |e| classify(redactor.redact(e)),
    ))
}

/// A response, with the error that ended it early (then the response holds what came before).
pub(crate) type Partial = (ModelResponse, Option<ModelError>);

/// The response `events` make, with the error that ended them, if any.
pub(crate) fn accumulate(events: Vec<StreamEvent>, result: Result<(), ModelError>) -> Partial {
    let mut acc = Accumulator::new();
    for e in events {
        acc.push(e);
    }
    (acc.finish(), result.err())
}

/// A complete response's decoding result as a [`Partial`]: nothing arrived before an error.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn whole(result: Result<ModelResponse, ModelError>) -> Partial {
    match result {
        Ok(r) => (r, None),
        Err(e) => (ModelResponse::default(), Some(e)),
    }
}

/// Runs a whole recorded SSE body through `decoder`.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn decode_sse_body<D: SseDecode>(body: &[u8], decoder: D) -> Partial {
    let mut reader = SseReader::new(decoder);
    let mut events = Vec::new();
    let result = reader
        .push(body, &mut events)
        .and_then(|()| reader.finish(&mut events));
    accumulate(events, result)
}

/// Decodes one recorded response body as an adapter does (the conformance tests): a non-2xx
/// `status` gives `parse_error`'s error, a 2xx SSE body (`stream`) goes through `decoder`, and a
/// 2xx complete body through `complete`. When the body reports an error, [`Decoded::error`] holds
/// it, [`Decoded::response`] what arrived before it, with
/// [`FinishReason::Error`](crate::model::FinishReason::Error).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn decode_recorded<D: SseDecode>(
    status: u16,
    body: &[u8],
    stream: bool,
    parse_error: ErrorParser,
    decoder: D,
    complete: impl FnOnce(&[u8]) -> Partial,
) -> Decoded {
    let (response, error) = if !(200..300).contains(&status) {
        let error = parse_error(status, &HeaderMap::new(), body);
        (ModelResponse::default(), Some(error))
    } else {
        let (response, error) = if stream {
            decode_sse_body(body, decoder)
        } else {
            complete(body)
        };
        (response, error.map(|e| as_api_error(status, e)))
    };
    match error {
        None => Decoded {
            response,
            error: None,
        },
        Some(error) => Decoded {
            response: ModelResponse {
                finish_reason: crate::model::FinishReason::Error,
                ..response
            },
            error: Some(error),
        },
    }
}

/// An error as an [`ApiError`], for [`Decoded`]: an API error as it is, anything else as an
/// `invalid_response` error with the error's text.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn as_api_error(status: u16, e: ModelError) -> ApiError {
    match e {
        ModelError::Api(a) => a,
        other => ApiError {
            status,
            error_type: Some("invalid_response".into()),
            code: None,
            retryable: other.is_retryable(),
            message: other.to_string(),
            retry_after: None,
        },
    }
}

/// A JSON number for an `f32` setting, through its shortest decimal text, so that 0.7f32 is sent
/// as 0.7 and not 0.699999988079071. A value JSON cannot hold (NaN, infinity) is `null`.
pub(crate) fn json_number(x: f32) -> Value {
    let f = format!("{x}").parse::<f64>().unwrap_or(f64::from(x));
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
}

/// Refuses an `extra` (named `what` in the message) that sets one of the request fields the
/// adapter writes itself (`owned`): merging it would silently replace the conversation, the
/// tool catalog, the model or the streaming mode that the engine relies on.
/// Refuses extras, of the adapter's configuration and of a request's settings, that set one of
/// the `owned` fields.
pub(crate) fn check_extras(
    adapter: &str,
    config_extra: Option<&Value>,
    request: Option<&crate::model::ModelRequest<'_>>,
    owned: &[&str],
) -> Result<(), ModelError> {
    let settings = request.and_then(|r| r.settings.extra.as_ref());
    for (what, extra) in [
        ("the adapter's `extra`", config_extra),
        ("the settings' `extra`", settings),
    ] {
        refuse_owned_fields(adapter, what, extra, owned)?;
    }
    Ok(())
}

/// Checks an adapter's configuration without sending anything: its base URL (see
/// [`crate::providers::check_base_url`]) and its `extra` (none of the `owned` fields).
pub(crate) fn validate_config(
    adapter: &str,
    base_url: &str,
    extra: Option<&Value>,
    owned: &[&str],
) -> Result<(), ModelError> {
    crate::providers::check_base_url(base_url)
        .map_err(|e| ModelError::Config(format!("the base URL {e}")))?;
    check_extras(adapter, extra, None, owned)
}

/// Refuses an `extra` (`what` says whose) that is not a JSON object of top-level request fields
/// (`example` shows one), or that sets one of the `owned` fields (`adapter` names the adapter).
pub(crate) fn check_object_extra(
    adapter: &str,
    what: &str,
    extra: Option<&Value>,
    owned: &[&str],
    example: &str,
) -> Result<(), ModelError> {
    match extra {
        None | Some(Value::Object(_)) => refuse_owned_fields(adapter, what, extra, owned),
        Some(other) => Err(ModelError::Config(format!(
            "{what} must be a JSON object of top-level request fields (like {example}), got {}",
            preview(&other.to_string(), 300)
        ))),
    }
}

pub(crate) fn refuse_owned_fields(
    adapter: &str,
    what: &str,
    extra: Option<&Value>,
    owned: &[&str],
) -> Result<(), ModelError> {
    let Some(Value::Object(fields)) = extra else {
        return Ok(());
    };
    match fields.keys().find(|k| owned.contains(&k.as_str())) {
        None => Ok(()),
        Some(name) => Err(ModelError::Config(format!(
            "{what} sets `{name}`, which the {adapter} adapter writes itself (the conversation, \
             the tools, the model and streaming belong to the engine); extra fields may not set \
             any of: {}",
            owned.join(", ")
        ))),
    }
}

/// Merges request-body extras (an adapter's, then the settings') into `body`, in order:
/// objects recursively, anything else replaced.
pub(crate) fn merge_extras<'a>(
    body: &mut Value,
    extras: impl IntoIterator<Item = Option<&'a Value>>,
) {
    for extra in extras.into_iter().flatten() {
        merge_json(body, extra);
    }
}

/// Merges `extra` into `base`: objects recursively, anything else replaced.
fn merge_json(base: &mut Value, extra: &Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                match b.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        merge_json(existing, v)
                    }
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, e) => *b = e.clone(),
    }
}

/// The first `max` characters of external text, cut on a char boundary (`…` marks a cut), for
/// error messages.
pub(crate) fn preview(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// The first `max` characters of a body (lossy UTF-8, trimmed), for error messages.
pub(crate) fn snippet(body: &[u8], max: usize) -> String {
    preview(String::from_utf8_lossy(body).trim(), max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::FinishReason;

    /// Each event's data is text; `bad` is an error, `end` completes the response early.
    #[derive(Default)]
    struct Echo {
        done: bool,
    }

    impl SseDecode for Echo {
        fn event(&mut self, ev: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
            match ev.data.as_str() {
                "bad" => Err(ModelError::InvalidResponse("bad event".into())),
                "end" => {
                    self.done = true;
                    out.push(StreamEvent::Finish(FinishReason::Stop));
                    Ok(())
                }
                text => {
                    out.push(StreamEvent::TextDelta(text.to_string()));
                    Ok(())
                }
            }
        }

        fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
            out.push(StreamEvent::Finish(FinishReason::Length));
            Ok(())
        }

        fn done(&self) -> bool {
            self.done
        }
    }

    fn body(chunks: Vec<Result<&'static str, ModelError>>) -> ByteStream {
        Box::pin(futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| c.map(|s| Bytes::from_static(s.as_bytes()))),
        ))
    }

    async fn collect(bytes: ByteStream) -> Vec<Result<StreamEvent, ModelError>> {
        sse_event_stream(bytes, Echo::default(), None)
            .collect()
            .await
    }

    fn text(item: &Result<StreamEvent, ModelError>) -> Option<&str> {
        match item {
            Ok(StreamEvent::TextDelta(t)) => Some(t),
            _ => None,
        }
    }

    #[tokio::test]
    async fn events_before_an_error_come_first_then_the_error_then_nothing() {
        let items = collect(body(vec![Ok(
            "data: a\n\ndata: b\n\ndata: bad\n\ndata: c\n\n",
        )]))
        .await;
        assert_eq!(items.len(), 3, "{items:?}");
        assert_eq!((text(&items[0]), text(&items[1])), (Some("a"), Some("b")));
        assert!(matches!(&items[2], Err(ModelError::InvalidResponse(m)) if m == "bad event"));
    }

    #[tokio::test]
    async fn a_transport_failure_while_reading_is_a_retryable_broken_connection() {
        // A final failure (an idle timeout) stays final.
        let stalled = ModelError::Transport {
            message: "idle".into(),
            retryable: false,
        };
        let items = collect(body(vec![Err(stalled)])).await;
        assert!(
            matches!(&items[..], [Err(ModelError::Transport { retryable: false, message })] if message == "the stream broke: idle"),
            "{items:?}"
        );
        let cut = ModelError::Transport {
            message: "connection reset".into(),
            retryable: true,
        };
        let items = collect(body(vec![Ok("data: a\n\nda"), Err(cut), Ok("data: b\n\n")])).await;
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(text(&items[0]), Some("a"));
        match &items[1] {
            Err(ModelError::Transport { message, retryable }) => {
                assert!(*retryable);
                assert_eq!(message, "the stream broke: connection reset");
            }
            other => panic!("expected a transport error, got {other:?}"),
        }
        // Other errors are passed on as they are.
        let items = collect(body(vec![Err(ModelError::BodyTooLarge { limit: 1 })])).await;
        assert!(matches!(
            items[..],
            [Err(ModelError::BodyTooLarge { limit: 1 })]
        ));
    }

    #[tokio::test]
    async fn the_body_end_finishes_and_an_early_end_stops_reading() {
        // A last event without its blank line is still decoded, then `finish`.
        let items = collect(body(vec![Ok("data: a\n\ndata: b")])).await;
        assert_eq!(items.len(), 3, "{items:?}");
        assert_eq!(text(&items[1]), Some("b"));
        assert!(matches!(
            items[2],
            Ok(StreamEvent::Finish(FinishReason::Length))
        ));
        // After `end`, the rest is not read (the error is never seen) and `finish` is not called.
        let items = collect(body(vec![Ok("data: end\n\n"), Ok("data: bad\n\n")])).await;
        assert_eq!(items.len(), 1, "{items:?}");
        assert!(matches!(
            items[0],
            Ok(StreamEvent::Finish(FinishReason::Stop))
        ));
    }

    fn teapot(status: u16, _: &HeaderMap, body: &[u8]) -> ApiError {
        ApiError {
            status,
            error_type: Some("teapot".into()),
            code: None,
            message: String::from_utf8_lossy(body).into_owned(),
            retryable: false,
            retry_after: None,
        }
    }

    #[test]
    fn recorded_bodies() {
        let never = |_: &[u8]| -> Partial { panic!("not a complete body") };
        let d = decode_recorded(
            418,
            b"short and stout",
            false,
            teapot,
            Echo::default(),
            never,
        );
        let e = d.error.unwrap();
        assert_eq!((e.status, e.message.as_str()), (418, "short and stout"));
        assert_eq!(d.response.finish_reason, FinishReason::Error);

        let d = decode_recorded(
            200,
            b"data: hi\n\ndata: bad\n\n",
            true,
            teapot,
            Echo::default(),
            never,
        );
        assert_eq!(d.response.text.as_deref(), Some("hi"));
        assert_eq!(d.response.finish_reason, FinishReason::Error);
        let e = d.error.unwrap();
        assert_eq!(e.error_type.as_deref(), Some("invalid_response"));
        assert!(e.message.contains("bad event"), "{}", e.message);

        let d = decode_recorded(200, b"data: hi\n\n", true, teapot, Echo::default(), never);
        assert_eq!(d.error, None);
        assert_eq!(d.response.finish_reason, FinishReason::Length);

        let d = decode_recorded(200, b"{}", false, teapot, Echo::default(), |b| {
            whole(Err(ModelError::InvalidResponse(format!(
                "{} bytes",
                b.len()
            ))))
        });
        assert!(d.error.unwrap().message.contains("2 bytes"));
    }

    #[test]
    fn json_helpers() {
        assert_eq!(json_number(0.7).to_string(), "0.7");
        assert_eq!(json_number(f32::NAN), Value::Null);
        let mut base = serde_json::json!({"a": {"x": 1, "y": 2}, "b": [1], "c": 3});
        merge_json(
            &mut base,
            &serde_json::json!({"a": {"y": 20, "z": 30}, "b": [2], "d": 4}),
        );
        assert_eq!(
            base,
            serde_json::json!({"a": {"x": 1, "y": 20, "z": 30}, "b": [2], "c": 3, "d": 4})
        );
        assert_eq!(preview("ééé", 2), "éé…");
        assert_eq!(preview("éé", 2), "éé");
        assert_eq!(snippet(b"  \xffabc \n", 10), "\u{fffd}abc");
    }
}
