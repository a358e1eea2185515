//! What the adapters' sans-IO parts share with any transport: where a request goes
//! ([`Endpoint`]), what an error response means ([`ErrorParser`], [`retryable_status`],
//! [`retry_after`], [`rejects_request`]). Built on every target, WebAssembly included; the HTTP
//! client that uses them is [`super::http`] (feature `http`).

use crate::model::ApiError;
use http::header::HeaderMap;
use std::time::Duration;

/// Whether an HTTP status is worth retrying.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429 | 500 | 502 | 503 | 504 | 529)
}

/// Whether an HTTP 500 is the server refusing the request itself: a validation error of the
/// request body, as FastAPI and pydantic word it, which llama-cpp-python's server answers with a
/// 500 (`1 validation error: {'type': 'string_type', 'loc': ('body', 'messages', 2, 'content'),
/// …}`) where other servers answer 400 or 422. Sending the same request again would get the same
/// answer, so it is not retried. Narrow on purpose: only a 500 whose body names a location in
/// the request `body` (`'loc': ('body', …` or `"loc": ["body", …`); any other 500 is retried.
pub fn rejects_request(status: u16, body: &[u8]) -> bool {
    if status != 500 {
        return false;
    }
    let head = &body[..body.len().min(64 * 1024)];
    let compact: String = String::from_utf8_lossy(head)
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    [
        "'loc':('body'",
        "\"loc\":[\"body\"",
        "\\\"loc\\\":[\\\"body\\\"",
    ]
    .iter()
    .any(|p| compact.contains(p))
}

/// The server's requested wait: `retry-after-ms` (milliseconds), else `Retry-After` in seconds.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    get("retry-after")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

/// Turns an error response into an [`ApiError`]; each adapter knows its provider's error body.
pub type ErrorParser = fn(status: u16, headers: &HeaderMap, body: &[u8]) -> ApiError;

/// Where a request goes: a URL parsed once, when an adapter is built, rather than at every
/// request. A URL that does not parse is kept as text, and sending to it fails as it would
/// have (reqwest's own error).
#[derive(Debug, Clone)]
pub struct Endpoint {
    text: String,
    url: Option<url::Url>,
}

impl Endpoint {
    /// Parses `url`.
    pub fn new(url: impl Into<String>) -> Self {
        let text = url.into();
        let url = url::Url::parse(&text).ok();
        Endpoint { text, url }
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The URL parsed, when it parses.
    pub fn parsed(&self) -> Option<&url::Url> {
        self.url.as_ref()
    }
}

impl From<String> for Endpoint {
    fn from(url: String) -> Self {
        Endpoint::new(url)
    }
}

impl From<&str> for Endpoint {
    fn from(url: &str) -> Self {
        Endpoint::new(url)
    }
}
