//! The HTTP transport shared by the provider adapters: retries with backoff, `Retry-After`,
//! a first-byte timeout, and a cap on the size of response bodies.
//!
//! Retryable failures are HTTP 408, 409, 429, 500, 502, 503, 504 and 529, a connection error or
//! reset, and a timeout before the first byte. Backoff is exponential with jitter, and a
//! server's `retry-after-ms` or `Retry-After` wins when present. A stream that has delivered any
//! output is never replayed ([`resilient_stream`]).

use crate::model::{ApiError, EventStream, ModelError};
use crate::stream::StreamEvent;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::HeaderMap;
use std::future::Future;
use std::time::Duration;

/// How often and how patiently to retry.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (default 2, as in the official SDKs).
    pub max_retries: u32,
    /// The first backoff (default 500 ms); it doubles on each retry.
    pub base_delay: Duration,
    /// The longest backoff, and the longest server-requested wait we honour (default 30 s).
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 2,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn none() -> Self {
        RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        }
    }

    /// The wait before retry number `attempt` (1-based): the server's hint when it gave one,
    /// else `base_delay * 2^(attempt-1)` with ±50 % jitter, both capped at `max_delay`.
    pub fn delay(&self, attempt: u32, hint: Option<Duration>) -> Duration {
        if let Some(h) = hint {
            return h.min(self.max_delay);
        }
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let jitter = 0.5 + jitter_unit();
        exp.mul_f64(jitter).min(self.max_delay)
    }
}

fn jitter_unit() -> f64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 | 1)
                .unwrap_or(0x9e37_79b9_7f4a_7c15),
        );
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// Whether an HTTP status is worth retrying.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429 | 500 | 502 | 503 | 504 | 529)
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

/// A byte stream of a response body.
pub type ByteStream = BoxStream<'static, Result<Bytes, ModelError>>;

/// Where a request goes: a URL parsed once, when an adapter is built, rather than at every
/// request. A URL that does not parse is kept as text, and sending to it fails as it would
/// have (reqwest's own error).
#[derive(Debug, Clone)]
pub struct Endpoint {
    text: String,
    url: Option<reqwest::Url>,
}

impl Endpoint {
    /// Parses `url`.
    pub fn new(url: impl Into<String>) -> Self {
        let text = url.into();
        let url = reqwest::Url::parse(&text).ok();
        Endpoint { text, url }
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        &self.text
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

/// The HTTP client with its retry policy and limits.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// The largest response body accepted (default 32 MiB); a larger one is refused, not buffered.
    pub max_body_bytes: usize,
    /// How long to wait for the response headers (default 120 s).
    pub first_byte_timeout: Duration,
}

impl Default for HttpTransport {
    fn default() -> Self {
        HttpTransport::new()
    }
}

fn transport_error(e: reqwest::Error) -> ModelError {
    // A connection that breaks while the body is read shows up as a body or decode error:
    // retryable (a stream that already delivered output is still never replayed).
    let retryable =
        e.is_connect() || e.is_timeout() || e.is_request() || e.is_body() || e.is_decode();
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    ModelError::Transport { message, retryable }
}

impl HttpTransport {
    /// A transport with the default policy and limits.
    pub fn new() -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(1024)
            .build()
            .unwrap_or_default();
        HttpTransport {
            client,
            retry: RetryPolicy::default(),
            max_body_bytes: 32 * 1024 * 1024,
            first_byte_timeout: Duration::from_secs(120),
        }
    }

    async fn send_once(
        &self,
        url: &Endpoint,
        headers: &HeaderMap,
        body: &Bytes,
        parse_error: ErrorParser,
    ) -> Result<reqwest::Response, ModelError> {
        let builder = match &url.url {
            Some(parsed) => self.client.post(parsed.clone()),
            None => self.client.post(&url.text),
        };
        // Header by header: cloning the whole map would allocate it again for every request.
        let builder = headers.iter().fold(builder, |b, (name, value)| {
            b.header(name.clone(), value.clone())
        });
        let request = builder
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send();
        let response = match tokio::time::timeout(self.first_byte_timeout, request).await {
            Err(_) => {
                return Err(ModelError::Transport {
                    message: format!(
                        "no response within {:?} (timeout before the first byte)",
                        self.first_byte_timeout
                    ),
                    retryable: true,
                });
            }
            Ok(r) => r.map_err(transport_error)?,
        };
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(response);
        }
        let headers = response.headers().clone();
        let body = self.read_body(response).await.unwrap_or_default();
        let mut err = parse_error(status, &headers, &body);
        if err.retry_after.is_none() {
            err.retry_after = retry_after(&headers);
        }
        Err(ModelError::Api(err))
    }

    /// Reads a whole body, refusing one larger than the limit.
    async fn read_body(&self, response: reqwest::Response) -> Result<Bytes, ModelError> {
        let limit = self.max_body_bytes;
        match response.content_length() {
            Some(n) if n as usize > limit => return Err(ModelError::BodyTooLarge { limit }),
            // A declared length within the limit: the body can be no longer (hyper stops at the
            // length), so it is collected whole, without copying chunk by chunk.
            Some(_) => return response.bytes().await.map_err(transport_error),
            None => {}
        }
        let mut stream = response.bytes_stream();
        let mut buf = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(transport_error)?;
            if buf.len() + chunk.len() > limit {
                return Err(ModelError::BodyTooLarge { limit });
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buf))
    }

    async fn with_retries<T, F, Fut>(&self, mut attempt_fn: F) -> Result<T, ModelError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ModelError>>,
    {
        let mut attempt = 0;
        loop {
            match attempt_fn().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retryable() && attempt < self.retry.max_retries => {
                    attempt += 1;
                    let hint = match &e {
                        ModelError::Api(a) => a.retry_after,
                        _ => None,
                    };
                    let wait = self.retry.delay(attempt, hint);
                    tracing::debug!(error = %e, attempt, ?wait, "retrying model call");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// POSTs a JSON body and returns the whole response body, with retries.
    pub async fn post(
        &self,
        url: &Endpoint,
        headers: &HeaderMap,
        body: Bytes,
        parse_error: ErrorParser,
    ) -> Result<Bytes, ModelError> {
        self.with_retries(|| async {
            let response = self.send_once(url, headers, &body, parse_error).await?;
            self.read_body(response).await
        })
        .await
    }

    /// POSTs a JSON body and decodes the whole response body with `decode`, with retries.
    ///
    /// Besides the failures [`HttpTransport::post`] retries, a 2xx body that `decode` refuses
    /// and that is not valid JSON (cut short, corrupted, a proxy's error page) is retried like a
    /// broken connection; after the last attempt, the error is `decode`'s. A decode error on a
    /// well-formed body is returned at once unless it is itself retryable.
    pub async fn post_json<T>(
        &self,
        url: &Endpoint,
        headers: &HeaderMap,
        body: Bytes,
        parse_error: ErrorParser,
        decode: impl Fn(&[u8]) -> Result<T, ModelError>,
    ) -> Result<T, ModelError> {
        let mut attempt = 0;
        loop {
            let read = match self.send_once(url, headers, &body, parse_error).await {
                Ok(response) => self.read_body(response).await,
                Err(e) => Err(e),
            };
            let (error, retry) = match read {
                Ok(bytes) => match decode(&bytes) {
                    Ok(value) => return Ok(value),
                    Err(e) => {
                        let retry = e.is_retryable() || !is_json(&bytes);
                        (e, retry)
                    }
                },
                Err(e) => {
                    let retry = e.is_retryable();
                    (e, retry)
                }
            };
            if !retry || attempt >= self.retry.max_retries {
                return Err(error);
            }
            attempt += 1;
            let hint = match &error {
                ModelError::Api(a) => a.retry_after,
                _ => None,
            };
            let wait = self.retry.delay(attempt, hint);
            tracing::debug!(%error, attempt, ?wait, "retrying model call");
            tokio::time::sleep(wait).await;
        }
    }

    /// POSTs a JSON body and returns the response body as a byte stream. Failures before the
    /// response headers are retried; the body's total size is capped like any other.
    pub async fn post_stream(
        &self,
        url: &Endpoint,
        headers: &HeaderMap,
        body: Bytes,
        parse_error: ErrorParser,
    ) -> Result<ByteStream, ModelError> {
        let response = self
            .with_retries(|| self.send_once(url, headers, &body, parse_error))
            .await?;
        let limit = self.max_body_bytes;
        let mut seen = 0usize;
        Ok(Box::pin(response.bytes_stream().map(move |chunk| {
            let chunk = chunk.map_err(transport_error)?;
            seen += chunk.len();
            if seen > limit {
                return Err(ModelError::BodyTooLarge { limit });
            }
            Ok(chunk)
        })))
    }
}

/// Wraps a stream opener so that a stream failing with a retryable error *before it delivered
/// any output* is opened again (up to `policy.max_retries` times). Once output has been
/// delivered, an error is passed on and nothing is replayed.
pub fn resilient_stream<F, Fut>(policy: RetryPolicy, open: F) -> EventStream
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<EventStream, ModelError>> + Send + 'static,
{
    struct State<F> {
        open: F,
        policy: RetryPolicy,
        current: Option<EventStream>,
        delivered: bool,
        attempt: u32,
        done: bool,
    }
    let state = State {
        open,
        policy,
        current: None,
        delivered: false,
        attempt: 0,
        done: false,
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            if st.current.is_none() {
                match (st.open)().await {
                    Ok(s) => st.current = Some(s),
                    Err(e) => {
                        st.done = true;
                        return Some((Err(e), st));
                    }
                }
            }
            let next = st.current.as_mut().expect("opened above").next().await;
            match next {
                None => return None,
                Some(Ok(ev)) => {
                    if is_output(&ev) {
                        st.delivered = true;
                    }
                    return Some((Ok(ev), st));
                }
                Some(Err(e)) => {
                    if !st.delivered && e.is_retryable() && st.attempt < st.policy.max_retries {
                        st.attempt += 1;
                        st.current = None;
                        let hint = match &e {
                            ModelError::Api(a) => a.retry_after,
                            _ => None,
                        };
                        tokio::time::sleep(st.policy.delay(st.attempt, hint)).await;
                        continue;
                    }
                    st.done = true;
                    let e = if st.delivered && e.is_retryable() {
                        ModelError::StreamInterrupted(e.to_string())
                    } else {
                        e
                    };
                    return Some((Err(e), st));
                }
            }
        }
    }))
}

/// Whether `bytes` hold one well-formed JSON value.
fn is_json(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
}

fn is_output(ev: &StreamEvent) -> bool {
    !matches!(ev, StreamEvent::Usage(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn an_endpoint_that_does_not_parse_fails_the_call_without_a_retry() {
        let good = Endpoint::new("http://127.0.0.1:1/v1/chat/completions");
        assert!(good.url.is_some());
        let bad = Endpoint::from("not a url");
        assert!(bad.url.is_none());
        assert_eq!(bad.as_str(), "not a url");
        let never = |_: u16, _: &HeaderMap, _: &[u8]| -> ApiError { unreachable!() };
        let transport = HttpTransport::new();
        let started = std::time::Instant::now();
        let e = transport
            .post(&bad, &HeaderMap::new(), Bytes::from_static(b"{}"), never)
            .await
            .expect_err("no request can be made");
        match e {
            ModelError::Transport { retryable, message } => {
                assert!(!retryable, "{message}");
                assert!(message.contains("builder"), "{message}");
            }
            other => panic!("expected a transport error, got {other:?}"),
        }
        // Not retried: no backoff was waited for.
        assert!(started.elapsed() < Duration::from_millis(400));
    }

    #[test]
    fn retry_after_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            max_retries: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
        };
        for _ in 0..50 {
            let d1 = p.delay(1, None);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(150));
            let d3 = p.delay(3, None);
            assert!(d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(600));
            assert!(p.delay(10, None) <= Duration::from_millis(1000));
        }
        assert_eq!(
            p.delay(1, Some(Duration::from_millis(7))),
            Duration::from_millis(7)
        );
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(99))),
            Duration::from_millis(1000)
        );
    }

    fn reset() -> ModelError {
        ModelError::Transport {
            message: "reset".into(),
            retryable: true,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stream_is_reopened_only_before_output() {
        let opens = Arc::new(AtomicU32::new(0));
        let o = opens.clone();
        // first open fails before output, second delivers text then fails: no third open.
        let s = resilient_stream(RetryPolicy::default(), move || {
            let n = o.fetch_add(1, Ordering::SeqCst);
            async move {
                let events: Vec<Result<StreamEvent, ModelError>> = if n == 0 {
                    vec![Err(reset())]
                } else {
                    vec![Ok(StreamEvent::TextDelta("hi".into())), Err(reset())]
                };
                Ok(Box::pin(futures::stream::iter(events)) as EventStream)
            }
        });
        let items: Vec<_> = s.collect().await;
        assert_eq!(opens.load(Ordering::SeqCst), 2);
        assert_eq!(items.len(), 2);
        assert!(matches!(items[0], Ok(StreamEvent::TextDelta(_))));
        assert!(matches!(items[1], Err(ModelError::StreamInterrupted(_))));
    }
}
