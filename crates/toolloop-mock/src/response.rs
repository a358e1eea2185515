//! What a protocol module hands back: a status, a JSON or SSE body, and how long to wait.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Serialize;

use super::Shared;
use super::conn::ConnHandle;
use super::engine::Reply;
use super::fault::{self, Drawn, FaultKind};
use super::scenario::Scenario;

/// A reply ready to send, built by a protocol module.
pub(crate) struct Prepared {
    pub status: StatusCode,
    pub payload: Payload,
    /// Waited before the response starts.
    pub latency: Duration,
    /// Waited between SSE events.
    pub chunk_delay: Duration,
    /// The injected fault this response carries, if any (boxed: most responses carry none).
    pub injected: Option<Box<Injected>>,
}

/// An injected fault on a response.
#[derive(Debug, Clone)]
pub(crate) struct Injected {
    pub kind: FaultKind,
    /// Extra response headers (a 429's `Retry-After`).
    pub headers: Vec<(&'static str, String)>,
    /// Whether and where the connection is reset.
    pub reset: Reset,
}

/// Whether and where a fault resets the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Reset {
    #[default]
    No,
    /// Before any byte of the response.
    Before,
    /// After this many bytes of the body.
    InBody(usize),
}

/// How a wire writes a call's arguments in a JSON body.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ArgsOnWire {
    /// As the JSON object itself (Anthropic's `input`, Gemini's `args`).
    Object,
    /// As a JSON string holding the object (OpenAI's `arguments`, in both APIs).
    String,
}

pub(crate) enum Payload {
    Json(Vec<u8>),
    Sse(SseWriter),
}

impl Prepared {
    /// A JSON body with no delay.
    pub(crate) fn json(status: StatusCode, value: &impl Serialize) -> Prepared {
        Prepared {
            status,
            payload: Payload::Json(to_vec(value)),
            latency: Duration::ZERO,
            chunk_delay: Duration::ZERO,
            injected: None,
        }
    }

    /// A reply with status 200, this payload, the scenario's pacing and no fault.
    pub(crate) fn ok(payload: Payload, latency: Duration, chunk_delay: Duration) -> Prepared {
        Prepared {
            status: StatusCode::OK,
            payload,
            latency,
            chunk_delay,
            injected: None,
        }
    }

    /// The 200 reply of `payload`, paced as `shared` and `scenario` say (the latency, the delay
    /// between SSE events), with the fault drawn for it, if any, applied ([`Prepared::with_fault`]).
    /// A cut lands in the first call's arguments, found after the call's name, as the wire writes
    /// them in its body (`args`); in a reply of text, in the text.
    pub(crate) fn answer(
        payload: Payload,
        shared: &Shared,
        scenario: &Scenario,
        fault: Option<Drawn>,
        reply: &Reply<'_>,
        args: ArgsOnWire,
    ) -> Prepared {
        let prepared = Prepared::ok(payload, shared.latency(scenario), scenario.chunk_delay);
        let Some(drawn) = fault else {
            return prepared;
        };
        let (after, needle) = match reply {
            Reply::Calls(calls) => calls
                .first()
                .map(|c| {
                    let args = match args {
                        ArgsOnWire::Object => c.arguments_json.as_bytes().to_vec(),
                        ArgsOnWire::String => to_vec(&c.arguments_json),
                    };
                    (to_vec(&c.name), args)
                })
                .unwrap_or_default(),
            Reply::Text(text) => (Vec::new(), to_vec(text)),
        };
        prepared.with_fault(drawn, scenario.slow_delay, &after, &needle)
    }

    /// Applies a fault drawn for this reply that does not replace it by an error: `reset`,
    /// `reset_body`, `cut_call` (cut in the middle of `cut_needle`, found after `cut_after`, or
    /// at the SSE writer's mark), `malformed_json` and `slow`. Error faults are the protocol
    /// module's business (their bodies have its shape).
    pub(crate) fn with_fault(
        mut self,
        drawn: Drawn,
        slow_delay: Duration,
        cut_after: &[u8],
        cut_needle: &[u8],
    ) -> Prepared {
        let mut injected = Injected {
            kind: drawn.kind,
            headers: Vec::new(),
            reset: Reset::No,
        };
        match drawn.kind {
            FaultKind::Reset => injected.reset = Reset::Before,
            FaultKind::ResetBody => {
                let len = match &self.payload {
                    Payload::Json(bytes) => bytes.len(),
                    Payload::Sse(sse) => sse.buf.len(),
                };
                injected.reset = Reset::InBody(fault::reset_point(len, drawn.aux));
            }
            FaultKind::CutCall => match &mut self.payload {
                Payload::Json(bytes) => {
                    let at = fault::cut_point(bytes, cut_after, cut_needle);
                    bytes.truncate(at);
                }
                Payload::Sse(sse) => sse.cut(cut_after, cut_needle),
            },
            FaultKind::MalformedJson => match &mut self.payload {
                Payload::Json(bytes) => *bytes = fault::malform(bytes),
                Payload::Sse(sse) => sse.malform(),
            },
            FaultKind::Slow => self.latency = self.latency.saturating_add(slow_delay),
            // Error faults are rendered by the protocol modules.
            _ => {}
        }
        self.injected = Some(Box::new(injected));
        self
    }

    /// The kind of the injected fault this response carries, if any.
    pub(crate) fn fault(&self) -> Option<FaultKind> {
        self.injected.as_ref().map(|i| i.kind)
    }

    /// The reply for a fault that replaces the response: an error status, built by the protocol
    /// module's `error` (its body shape), or a reset before the response. `None` for the faults
    /// applied to a built reply ([`Prepared::with_fault`]).
    pub(crate) fn early_fault(
        drawn: Drawn,
        scenario: &Scenario,
        error: impl Fn(StatusCode, &str) -> Prepared,
    ) -> Option<Prepared> {
        let what = match drawn.kind {
            FaultKind::RateLimited => "rate limit reached",
            FaultKind::ServerError => "internal server error",
            FaultKind::Unavailable => "the service is unavailable",
            FaultKind::Overloaded => "overloaded",
            FaultKind::Reset => {
                let mut p = Prepared::json(StatusCode::OK, &());
                p.injected = Some(Box::new(Injected {
                    kind: FaultKind::Reset,
                    headers: Vec::new(),
                    reset: Reset::Before,
                }));
                return Some(p);
            }
            _ => return None,
        };
        let status = StatusCode::from_u16(drawn.kind.status()?).ok()?;
        let mut headers = Vec::new();
        let mut message = format!(
            "{what} (a fault injected by the mock: faults={}, seed={})",
            f64::from(scenario.faults) / 1e6,
            scenario.seed
        );
        if scenario.traceback && matches!(status.as_u16(), 500 | 503) {
            message = format!(
                "Traceback (most recent call last):\n  File \"/srv/llama_cpp/server/app.py\", \
                 line 512, in create_chat_completion\n    iterator_or_completion = await \
                 run_in_threadpool(llama.create_chat_completion, **kwargs)\n  File \
                 \"/srv/llama_cpp/llama_chat_format.py\", line 3801, in \
                 chatml_function_calling\n    raise ValueError(message)\nValueError: {message}"
            );
        }
        if drawn.kind == FaultKind::RateLimited {
            let wait = scenario.retry_after;
            headers.push(("retry-after-ms", wait.as_millis().to_string()));
            headers.push(("retry-after", wait.as_secs_f64().ceil().to_string()));
            message.push_str(&format!("; retry after {} ms", wait.as_millis()));
        }
        Some(error(status, &message).marked_fault(drawn.kind, headers))
    }

    /// Marks an error reply as an injected fault, with its extra headers.
    pub(crate) fn marked_fault(
        mut self,
        kind: FaultKind,
        headers: Vec<(&'static str, String)>,
    ) -> Prepared {
        self.injected = Some(Box::new(Injected {
            kind,
            headers,
            reset: Reset::No,
        }));
        self
    }

    /// The HTTP response, with a `Server-Timing` header giving the server's processing time.
    pub(crate) fn into_response(self, processing: Duration, conn: Option<&ConnHandle>) -> Response {
        let (reset, extra_headers) = match self.injected {
            Some(injected) => (injected.reset, injected.headers),
            None => (Reset::No, Vec::new()),
        };
        if let (Reset::Before, Some(conn)) = (reset, conn) {
            conn.reset();
        }
        let reset_at = match (reset, conn) {
            (Reset::InBody(at), Some(conn)) => Some((at, conn.clone())),
            _ => None,
        };
        let (content_type, body) = match self.payload {
            Payload::Json(bytes) => {
                let body = match reset_at {
                    Some((at, conn)) => reset_body(Bytes::from(bytes), at, conn),
                    None => Body::from(bytes),
                };
                ("application/json", body)
            }
            Payload::Sse(writer) => {
                let body = match reset_at {
                    Some((at, conn)) => reset_body(Bytes::from(writer.buf), at, conn),
                    None => writer.into_body(self.chunk_delay),
                };
                ("text/event-stream", body)
            }
        };
        let mut response = Response::new(body);
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        if content_type == "text/event-stream" {
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        }
        let timing = format!("mock;dur={:.3}", processing.as_secs_f64() * 1e3);
        if let Ok(value) = HeaderValue::from_str(&timing) {
            headers.insert("server-timing", value);
        }
        for (name, value) in extra_headers {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
        response
    }
}

/// A body that sends its first `at` bytes, then resets the connection.
fn reset_body(bytes: Bytes, at: usize, conn: ConnHandle) -> Body {
    let head = bytes.slice(..at.min(bytes.len()));
    let stream = futures::stream::unfold(Some(head), move |head| {
        let conn = conn.clone();
        async move {
            match head {
                Some(head) => Some((Ok(head), None)),
                None => {
                    // Give the server a moment to put the head on the wire, so that the reset
                    // comes during the body rather than before it.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    conn.reset();
                    let error = std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "connection reset by the mock (fault injection)",
                    );
                    Some((Err(error), None))
                }
            }
        }
    });
    Body::from_stream(stream)
}

/// Serializes into a fresh buffer. Serializing the mock's own response types cannot fail
/// (string keys only); should it, the buffer holds what was written.
pub(crate) fn to_vec(value: &impl Serialize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(256);
    let _ = serde_json::to_writer(&mut buf, value);
    buf
}

/// Builds an SSE body in one buffer, remembering where each event ends so that events can be
/// paced when a scenario asks for a delay between them.
pub(crate) struct SseWriter {
    buf: Vec<u8>,
    ends: Vec<usize>,
    separator: &'static [u8],
    /// Where a `cut_call` fault ends the stream (see [`SseWriter::mark`]); 0 for nowhere.
    mark: usize,
}

impl SseWriter {
    /// Events end with a blank line: `\n\n`, or `\r\n\r\n` when `crlf` (as Gemini sends).
    pub(crate) fn new(crlf: bool) -> SseWriter {
        SseWriter {
            buf: Vec::with_capacity(1024),
            ends: Vec::with_capacity(16),
            separator: if crlf { b"\r\n\r\n" } else { b"\n\n" },
            mark: 0,
        }
    }

    /// Marks the end of the events written so far as where a `cut_call` fault ends the stream
    /// (the first mark wins).
    pub(crate) fn mark(&mut self) {
        if self.mark == 0 {
            self.mark = self.buf.len();
        }
    }

    /// Ends the stream at the mark, else in the middle of `needle` (found after `after`), else
    /// halfway through.
    fn cut(&mut self, after: &[u8], needle: &[u8]) {
        let at = match self.mark {
            0 => fault::cut_point(&self.buf, after, needle),
            at => at,
        };
        self.buf.truncate(at);
        self.ends.retain(|&end| end <= at);
        if self.ends.last() != Some(&at) {
            self.ends.push(at);
        }
    }

    /// Puts an event whose data is not JSON before the others.
    fn malform(&mut self) {
        let mut event = b"data: ".to_vec();
        event.extend_from_slice(fault::MALFORMED_OBJECT);
        event.extend_from_slice(b"\"rest\":}");
        event.extend_from_slice(self.separator);
        let shift = event.len();
        event.extend_from_slice(&self.buf);
        self.buf = event;
        for end in &mut self.ends {
            *end += shift;
        }
        self.ends.insert(0, shift);
    }

    /// Writes one event: an optional `event:` line and a `data:` line holding `data` as JSON.
    pub(crate) fn event(&mut self, name: Option<&str>, data: &impl Serialize) {
        if let Some(name) = name {
            self.buf.extend_from_slice(b"event: ");
            self.buf.extend_from_slice(name.as_bytes());
            self.buf
                .extend_from_slice(&self.separator[..self.separator.len() / 2]);
        }
        self.buf.extend_from_slice(b"data: ");
        let _ = serde_json::to_writer(&mut self.buf, data);
        self.buf.extend_from_slice(self.separator);
        self.ends.push(self.buf.len());
    }

    /// Writes one event: a `data:` line whose text `write` appends (JSON written in pieces).
    pub(crate) fn data_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        self.buf.extend_from_slice(b"data: ");
        write(&mut self.buf);
        self.buf.extend_from_slice(self.separator);
        self.ends.push(self.buf.len());
    }

    /// Writes a `data:` line holding `raw` as is (`[DONE]`, or JSON already serialized).
    pub(crate) fn raw(&mut self, raw: &[u8]) {
        self.buf.extend_from_slice(b"data: ");
        self.buf.extend_from_slice(raw);
        self.buf.extend_from_slice(self.separator);
        self.ends.push(self.buf.len());
    }

    fn into_body(self, delay: Duration) -> Body {
        let bytes = Bytes::from(self.buf);
        if delay.is_zero() || self.ends.len() < 2 {
            return Body::from(bytes);
        }
        let ends = self.ends;
        let stream = futures::stream::unfold((0usize, 0usize), move |(i, start)| {
            let bytes = bytes.clone();
            let end = ends.get(i).copied();
            async move {
                let end = end?;
                if i > 0 {
                    tokio::time::sleep(delay).await;
                }
                Some((
                    Ok::<Bytes, std::convert::Infallible>(bytes.slice(start..end)),
                    (i + 1, end),
                ))
            }
        });
        Body::from_stream(stream)
    }
}
