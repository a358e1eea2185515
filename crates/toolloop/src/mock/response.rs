//! What a protocol module hands back: a status, a JSON or SSE body, and how long to wait.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Serialize;

/// A reply ready to send, built by a protocol module.
pub(crate) struct Prepared {
    pub status: StatusCode,
    pub payload: Payload,
    /// Waited before the response starts.
    pub latency: Duration,
    /// Waited between SSE events.
    pub chunk_delay: Duration,
}

pub(crate) enum Payload {
    Json(Vec<u8>),
    Sse(SseWriter),
}

impl Prepared {
    /// A JSON body with no delay.
    pub fn json(status: StatusCode, value: &impl Serialize) -> Prepared {
        Prepared {
            status,
            payload: Payload::Json(to_vec(value)),
            latency: Duration::ZERO,
            chunk_delay: Duration::ZERO,
        }
    }

    /// The HTTP response, with a `Server-Timing` header giving the server's processing time.
    pub fn into_response(self, processing: Duration) -> Response {
        let (content_type, body) = match self.payload {
            Payload::Json(bytes) => ("application/json", Body::from(bytes)),
            Payload::Sse(writer) => ("text/event-stream", writer.into_body(self.chunk_delay)),
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
        response
    }
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
}

impl SseWriter {
    /// Events end with a blank line: `\n\n`, or `\r\n\r\n` when `crlf` (as Gemini sends).
    pub fn new(crlf: bool) -> SseWriter {
        SseWriter {
            buf: Vec::with_capacity(1024),
            ends: Vec::with_capacity(16),
            separator: if crlf { b"\r\n\r\n" } else { b"\n\n" },
        }
    }

    /// Writes one event: an optional `event:` line and a `data:` line holding `data` as JSON.
    pub fn event(&mut self, name: Option<&str>, data: &impl Serialize) {
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

    /// Writes a `data:` line holding `raw` as is (`[DONE]`, or JSON already serialized).
    pub fn raw(&mut self, raw: &[u8]) {
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
