//! The HTTP transport shared by the provider adapters: retries with backoff, `Retry-After`,
//! timeouts, a cap on the size of response bodies, no redirects, and no secrets in errors.
//!
//! Retryable failures are HTTP 408, 409, 429, 500, 502, 503, 504 and 529, a connection error or
//! reset, and a timeout before the first byte. Backoff is exponential with jitter, and a
//! server's `retry-after-ms` or `Retry-After` wins when present. A stream that has delivered any
//! output is never replayed ([`resilient_stream`]).
//!
//! A server that refuses connections (a local server restarting, or still loading its model) is
//! waited for longer than the retry policy alone would: connection failures are retried with
//! backoff (at most 2 s between attempts) for [`HttpTransport::connect_retry`] (default 10 s).
//!
//! Not retried, because the same request would get the same answer: a 500 whose body is a
//! validation error of the request itself ([`rejects_request`]: llama-cpp-python answers a
//! request it cannot validate with a 500), and any redirect.
//!
//! # Redirects
//!
//! Model calls never follow a redirect. A redirect to another origin would carry the API key
//! (reqwest drops `Authorization`, not Anthropic's `x-api-key` or Gemini's `x-goog-api-key`)
//! and, for a 307 or 308, the whole conversation; a 302 would turn the call into a `GET` whose
//! reply is taken for the answer. Any 3xx is a [`ModelError::Api`] of type `redirect`, not
//! retried, naming the status and the target (without its credentials and query).
//!
//! # Timeouts
//!
//! | what | default | field |
//! |---|---|---|
//! | connecting | 30 s | (fixed) |
//! | the response head, from sending the request | 120 s, retried once | [`HttpTransport::first_byte_timeout`], [`HttpTransport::first_byte_retries`] |
//! | silence while a body or a stream is read | 300 s | [`HttpTransport::idle_timeout`] |
//! | a stream with no event (nothing, or only keep-alive comments) | 600 s | [`HttpTransport::event_timeout`] |
//!
//! A timeout before the first byte is retried once per call by default
//! ([`HttpTransport::first_byte_retries`]), whatever the retry policy allows, so a server that
//! accepts connections and never answers costs two first-byte timeouts per call, not three (a
//! stream opened again after a break shares that allowance). An idle or
//! event timeout is not retried: the wait was already long. The event timeout is generous
//! because reasoning models think for minutes, and some servers send only comments meanwhile.
//!
//! # Secrets
//!
//! Every text that a server's reply puts into an error (an error body, a redirect's target, a
//! body that does not decode, a stream's error event) goes through a
//! [`Redactor`] holding the request's credentials (its sensitive
//! headers, and the credentials in its URL) first, so no error, event, log line or stored record
//! ever holds the API key.

use crate::model::{ApiError, EventStream, ModelError};
use crate::redact::{Redactor, redact_url_credentials};
use crate::stream::StreamEvent;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use reqwest::header::{HeaderMap, LOCATION};
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
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

pub use super::wire::{Endpoint, ErrorParser, rejects_request, retry_after, retryable_status};

/// A byte stream of a response body.
pub type ByteStream = BoxStream<'static, Result<Bytes, ModelError>>;

/// The HTTP client with its retry policy and limits. It never follows redirects (see the
/// [module documentation](self)).
#[derive(Debug, Clone)]
pub struct HttpTransport {
    /// The client, or why it could not be built (each call then fails with that reason).
    client: Result<reqwest::Client, ModelError>,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// The largest response body accepted (default 32 MiB); a larger one is refused, not buffered.
    pub max_body_bytes: usize,
    /// How long to wait for the response headers (default 120 s).
    pub first_byte_timeout: Duration,
    /// How many times one call retries a first-byte timeout (default 1), within what
    /// [`HttpTransport::retry`] allows: a server that accepts connections and never answers
    /// costs `first_byte_retries + 1` first-byte timeouts per call, not one per retry.
    pub first_byte_retries: u32,
    /// The longest silence accepted while a response body, complete or streamed, is read
    /// (default 300 s); then the call fails, not retried.
    pub idle_timeout: Duration,
    /// The longest a streamed response may go without an event (default 600 s): a stream that
    /// sends only keep-alive comments, or nothing, for that long fails, not retried. Generous
    /// because reasoning models think for minutes before their first token.
    pub event_timeout: Duration,
    /// Where every request and response is logged, keys redacted (none by default); see
    /// [`RequestLog`](super::request_log::RequestLog).
    pub debug_log: Option<std::sync::Arc<super::request_log::RequestLog>>,
    /// How long a server that refuses connections (one restarting, a local server still
    /// loading its model) is waited for: connection failures are retried with backoff (waits of
    /// at most 2 s) until this much time has passed since the call's first attempt, whatever
    /// [`HttpTransport::retry`] allows (default 10 s; zero: only the retry policy's retries).
    pub connect_retry: Duration,
    /// The cassette every request and response is recorded in, or played back from (none by
    /// default); see [`Cassette`](super::cassette::Cassette). Playing back, a request the
    /// cassette holds is answered from it and nothing is sent.
    pub cassette: Option<std::sync::Arc<super::cassette::Cassette>>,
}

/// The start of the message of a failure to connect (see [`HttpTransport::connect_retry`]).
const CONNECT_FAILED: &str = "could not connect to the server: ";

/// Whether `e` is a failure to connect (nothing was sent).
pub(crate) fn is_connect_error(e: &ModelError) -> bool {
    matches!(e, ModelError::Transport { message, .. } if message.starts_with(CONNECT_FAILED))
}

/// The longest wait between two attempts to connect to a server that refuses connections.
const CONNECT_MAX_WAIT: Duration = Duration::from_secs(2);

/// How many first-byte timeouts one call has met (see [`HttpTransport::first_byte_retries`]),
/// and its number and attempts in the request debug log.
#[derive(Debug, Default)]
pub(crate) struct CallBudget {
    first_byte_timeouts: AtomicU32,
    /// The call's number in the debug log (0: none yet).
    logged_call: std::sync::atomic::AtomicU64,
    attempts: AtomicU32,
}

impl CallBudget {
    /// The call's number in `log` (assigned on first use) and the number of this attempt.
    fn log_attempt(&self, log: &super::request_log::RequestLog) -> (u64, u32) {
        let mut call = self.logged_call.load(Ordering::Relaxed);
        if call == 0 {
            call = log.next_call();
            self.logged_call.store(call, Ordering::Relaxed);
        }
        (call, self.attempts.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn logged(&self) -> u64 {
        self.logged_call.load(Ordering::Relaxed)
    }

    /// Says in `log` (when the call is in it) that its stream broke, and whether it may be
    /// opened again.
    pub(crate) fn log_stream_broke(
        &self,
        log: &super::request_log::RequestLog,
        error: &str,
        retryable: bool,
        redactor: &Redactor,
    ) {
        let call = self.logged();
        if call != 0 {
            let attempt = self.attempts.load(Ordering::Relaxed);
            log.stream_broke(call, attempt, error, retryable, redactor);
        }
    }
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
    if e.is_connect() {
        message.insert_str(0, CONNECT_FAILED);
    }
    // reqwest names the URL, which may carry credentials.
    let message = redact_url_credentials(&message);
    ModelError::Transport { message, retryable }
}

/// A duration as people write it: `300 s`, `250 ms`.
fn human(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// The error for a body or stream that went silent.
fn idle_error(idle: Duration) -> ModelError {
    ModelError::Transport {
        message: format!(
            "the server sent nothing for {} while the response was read (idle timeout, \
             HttpTransport::idle_timeout); not retried",
            human(idle)
        ),
        retryable: false,
    }
}

/// The error for a stream that sent no event for `limit`.
pub(crate) fn no_event_error(limit: Duration) -> ModelError {
    ModelError::Transport {
        message: format!(
            "the stream sent no event for {} (nothing, or only keep-alive comments; \
             HttpTransport::event_timeout); not retried",
            human(limit)
        ),
        retryable: false,
    }
}

/// The next chunk of a body, waiting at most `idle`. A chunk (or the body's end) that is there
/// already is taken without a timer: a small body usually comes with the response's head, and
/// a timer costs a read of the clock and a reference to the runtime's handle, which every
/// thread shares.
async fn next_chunk<S>(body: &mut S, idle: Duration) -> Result<Option<Bytes>, ModelError>
where
    S: futures::Stream<Item = reqwest::Result<Bytes>> + Unpin,
{
    let next = match body.next().now_or_never() {
        Some(next) => next,
        None => tokio::time::timeout(idle, body.next())
            .await
            .map_err(|_| idle_error(idle))?,
    };
    match next {
        None => Ok(None),
        Some(Ok(chunk)) => Ok(Some(chunk)),
        Some(Err(e)) => Err(transport_error(e)),
    }
}

/// The error for a redirect: its status and where it pointed (scheme, host, port and path only,
/// resolved against the request's URL), redacted.
fn redirect_error(
    url: &Endpoint,
    status: u16,
    response_headers: &HeaderMap,
    redactor: &Redactor,
) -> ModelError {
    let target = response_headers
        .get(LOCATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .map(|location| {
            let resolved = match url.parsed() {
                Some(base) => base.join(location.trim()),
                None => reqwest::Url::parse(location.trim()),
            };
            match resolved {
                Ok(mut target) => {
                    let _ = target.set_username("");
                    let _ = target.set_password(None);
                    target.set_query(None);
                    target.set_fragment(None);
                    format!("to {target}")
                }
                Err(_) => "to a location that is not a URL".to_string(),
            }
        })
        .unwrap_or_else(|| "without a Location header".to_string());
    ModelError::Api(ApiError {
        status,
        error_type: Some("redirect".into()),
        code: None,
        message: redactor.redact(&format!(
            "the server answered HTTP {status}, a redirect {target}; model calls do not follow \
             redirects (they would carry the API key and the conversation to another address): \
             if the new address is trusted, use it as the base URL"
        )),
        retryable: false,
        retry_after: None,
    })
}

/// The request that POSTs `body` to `url` with `headers` (in their order), then
/// `Content-Type: application/json`.
///
/// Made as a `reqwest::Request` directly, its header map sized once for all of them, rather than
/// through reqwest's builder, whose map grows as headers are added and which looks into the URL
/// for credentials every time. A URL that does not parse, has no host, or carries credentials
/// (which reqwest's builder turns into a `Basic` authorization) still goes through the builder,
/// so that it fails, or is sent, exactly as before.
fn request(
    client: &reqwest::Client,
    url: &Endpoint,
    headers: &HeaderMap,
    body: &Bytes,
) -> reqwest::Result<reqwest::Request> {
    // A static value: made from a `&str`, the header's bytes were copied for every request.
    const JSON: reqwest::header::HeaderValue =
        reqwest::header::HeaderValue::from_static("application/json");
    let plain = url
        .parsed()
        .filter(|u| u.has_host() && u.username().is_empty() && u.password().is_none());
    if let Some(parsed) = plain {
        let mut request = reqwest::Request::new(reqwest::Method::POST, parsed.clone());
        // Room for what reqwest and hyper add to it besides (`Accept`, `Host`,
        // `Content-Length`): reqwest's copy of it for hyper keeps its size.
        let map = request.headers_mut();
        *map = HeaderMap::with_capacity(headers.len() + 4);
        for (name, value) in headers {
            map.append(name.clone(), value.clone());
        }
        map.append(reqwest::header::CONTENT_TYPE, JSON);
        *request.body_mut() = Some(body.clone().into());
        return Ok(request);
    }
    let builder = match url.parsed() {
        Some(parsed) => client.post(parsed.clone()),
        None => client.post(url.as_str()),
    };
    headers
        .iter()
        .fold(builder, |b, (name, value)| {
            b.header(name.clone(), value.clone())
        })
        .header(reqwest::header::CONTENT_TYPE, JSON)
        .body(body.clone())
        .build()
}

impl HttpTransport {
    /// A transport with the default policy and limits.
    pub fn new() -> Self {
        // Never reqwest's default client in its place: that one follows redirects. The TLS
        // configuration reads the system's roots at the first `https://` connection, not here.
        let client = super::tls::client_config()
            .map_err(|e| e.to_string())
            .and_then(|tls| {
                reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(30))
                    .pool_max_idle_per_host(1024)
                    .redirect(reqwest::redirect::Policy::none())
                    .tls_backend_preconfigured(tls)
                    .build()
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| ModelError::Config(format!("the HTTP client could not be built: {e}")));
        HttpTransport {
            client,
            retry: RetryPolicy::default(),
            max_body_bytes: 32 * 1024 * 1024,
            first_byte_timeout: Duration::from_secs(120),
            first_byte_retries: 1,
            idle_timeout: Duration::from_secs(300),
            event_timeout: Duration::from_secs(600),
            debug_log: None,
            connect_retry: Duration::from_secs(10),
            cassette: None,
        }
    }

    /// The wait before retry number `attempt` after `error`, the call having begun at
    /// `started`; `None`: not retried. Retryable errors are retried as the policy says; a
    /// failure to connect is retried besides, with backoff, until
    /// [`HttpTransport::connect_retry`] has passed.
    fn retry_wait(
        &self,
        error: &ModelError,
        retry: bool,
        attempt: u32,
        started: std::time::Instant,
    ) -> Option<Duration> {
        let hint = match error {
            ModelError::Api(a) => a.retry_after,
            _ => None,
        };
        let wait = self.retry.delay(attempt, hint);
        if retry && attempt <= self.retry.max_retries {
            return Some(wait);
        }
        if is_connect_error(error) {
            let wait = wait.min(CONNECT_MAX_WAIT);
            let left = self.connect_retry.saturating_sub(started.elapsed());
            if !left.is_zero() {
                return Some(wait.min(left));
            }
        }
        None
    }

    async fn send_once(
        &self,
        url: &Endpoint,
        headers: &HeaderMap,
        body: &Bytes,
        parse_error: ErrorParser,
        budget: &CallBudget,
    ) -> Result<reqwest::Response, ModelError> {
        let client = self.client.as_ref().map_err(Clone::clone)?;
        let logged = self.debug_log.as_deref().map(|log| {
            let (call, attempt) = budget.log_attempt(log);
            let redactor = Redactor::for_request(url.as_str(), headers);
            log.request(call, attempt, url.as_str(), headers, body, &redactor);
            (log, call, attempt, redactor, std::time::Instant::now())
        });
        // A request that cannot be built fails as reqwest's builder makes it fail when sent.
        let request = match request(client, url, headers, body) {
            Ok(request) => futures::future::Either::Left(client.execute(request)),
            Err(e) => futures::future::Either::Right(std::future::ready(Err(e))),
        };
        let response = match tokio::time::timeout(self.first_byte_timeout, request).await {
            Err(_) => {
                let before = budget.first_byte_timeouts.fetch_add(1, Ordering::Relaxed);
                let retryable = before < self.first_byte_retries;
                let why = if retryable {
                    String::new()
                } else {
                    format!(
                        "; {} in this call, not retried again (HttpTransport::first_byte_retries \
                         is {})",
                        before + 1,
                        self.first_byte_retries
                    )
                };
                Err(ModelError::Transport {
                    message: format!(
                        "no response within {} (timeout before the first byte, \
                         HttpTransport::first_byte_timeout){why}",
                        human(self.first_byte_timeout),
                    ),
                    retryable,
                })
            }
            Ok(r) => r.map_err(transport_error),
        };
        let response = match (response, &logged) {
            (Ok(r), _) => r,
            (Err(e), Some((log, call, attempt, redactor, _))) => {
                log.failed(*call, *attempt, &e.to_string(), redactor);
                return Err(e);
            }
            (Err(e), None) => return Err(e),
        };
        let status = response.status().as_u16();
        if let Some((log, call, attempt, redactor, started)) = &logged {
            log.response(
                *call,
                *attempt,
                status,
                response.headers(),
                started.elapsed(),
                redactor,
            );
        }
        if (200..300).contains(&status) {
            return Ok(response);
        }
        let redactor = Redactor::for_request(url.as_str(), headers);
        let response_headers = response.headers().clone();
        if (300..400).contains(&status) {
            return Err(redirect_error(url, status, &response_headers, &redactor));
        }
        let body = self.read_body(response).await.unwrap_or_default();
        // Before it is parsed, so that no part of a secret survives a message cut short.
        let body = redactor.redact_bytes(&body);
        if let Some((log, call, ..)) = &logged {
            log.body(*call, &body, &redactor);
        }
        let mut err = parse_error(status, &response_headers, &body);
        if err.retry_after.is_none() {
            err.retry_after = retry_after(&response_headers);
        }
        if rejects_request(status, &body) {
            err.retryable = false;
        }
        Err(ModelError::Api(redactor.redact_api_error(err)))
    }

    /// Reads a whole body, refusing one larger than the limit, and one that goes silent for the
    /// idle timeout.
    async fn read_body(&self, response: reqwest::Response) -> Result<Bytes, ModelError> {
        let limit = self.max_body_bytes;
        let declared = response.content_length();
        if let Some(n) = declared
            && n > limit as u64
        {
            return Err(ModelError::BodyTooLarge { limit });
        }
        let mut stream = response.bytes_stream();
        // A body that comes in one chunk is returned as it is, without a copy.
        let mut first: Option<Bytes> = None;
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = next_chunk(&mut stream, self.idle_timeout).await? {
            let so_far = first.as_ref().map_or(buf.len(), Bytes::len);
            if so_far + chunk.len() > limit {
                return Err(ModelError::BodyTooLarge { limit });
            }
            match first.take() {
                None if buf.is_empty() => first = Some(chunk),
                None => buf.extend_from_slice(&chunk),
                Some(head) => {
                    let hint = declared.map_or(0, |n| n as usize);
                    buf.reserve(hint.max(head.len() + chunk.len()));
                    buf.extend_from_slice(&head);
                    buf.extend_from_slice(&chunk);
                }
            }
        }
        Ok(first.unwrap_or_else(|| Bytes::from(buf)))
    }

    async fn with_retries<T, F, Fut>(
        &self,
        url: &Endpoint,
        headers: &HeaderMap,
        mut attempt_fn: F,
    ) -> Result<T, ModelError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ModelError>>,
    {
        let mut attempt = 0;
        let started = std::time::Instant::now();
        loop {
            match attempt_fn()
                .await
                .map_err(|e| Redactor::for_request(url.as_str(), headers).redact_error(e))
            {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let retry = e.is_retryable();
                    let Some(wait) = self.retry_wait(&e, retry, attempt + 1, started) else {
                        return Err(e);
                    };
                    attempt += 1;
                    tracing::info!(error = %e, attempt, ?wait, "retrying model call");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Logs a whole response body to the debug log, if there is one.
    fn log_body(&self, url: &Endpoint, headers: &HeaderMap, budget: &CallBudget, body: &[u8]) {
        if let Some(log) = &self.debug_log {
            log.body(
                budget.logged(),
                body,
                &Redactor::for_request(url.as_str(), headers),
            );
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
        let budget = CallBudget::default();
        self.with_retries(url, headers, || async {
            let response = self
                .send_once(url, headers, &body, parse_error, &budget)
                .await?;
            let bytes = self.read_body(response).await?;
            self.log_body(url, headers, &budget, &bytes);
            Ok(bytes)
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
        if let Some(bytes) = self.replayed(url, &body)? {
            return decode(&bytes);
        }
        let budget = CallBudget::default();
        let redact = |e: ModelError| Redactor::for_request(url.as_str(), headers).redact_error(e);
        let mut attempt = 0;
        let started = std::time::Instant::now();
        loop {
            let read = match self
                .send_once(url, headers, &body, parse_error, &budget)
                .await
            {
                Ok(response) => self.read_body(response).await,
                Err(e) => Err(e),
            };
            if let Ok(bytes) = &read {
                self.log_body(url, headers, &budget, bytes);
            }
            let (error, retry) = match read {
                Ok(bytes) => match decode(&bytes) {
                    Ok(value) => {
                        if let Some(cassette) = &self.cassette {
                            let redactor = Redactor::for_request(url.as_str(), headers);
                            cassette.record_body(url.as_str(), &body, 200, &bytes, &redactor);
                        }
                        return Ok(value);
                    }
                    Err(e) => {
                        let retry = e.is_retryable() || !is_json(&bytes);
                        (redact(e), retry)
                    }
                },
                Err(e) => {
                    let retry = e.is_retryable();
                    (redact(e), retry)
                }
            };
            let Some(wait) = self.retry_wait(&error, retry, attempt + 1, started) else {
                return Err(error);
            };
            attempt += 1;
            tracing::info!(%error, attempt, ?wait, "retrying model call");
            tokio::time::sleep(wait).await;
        }
    }

    /// POSTs a JSON body and returns the response body as a byte stream. Failures before the
    /// response headers are retried; the body's total size is capped like any other, and a body
    /// silent for the idle timeout ends with an error.
    pub async fn post_stream(
        &self,
        url: &Endpoint,
        headers: &HeaderMap,
        body: Bytes,
        parse_error: ErrorParser,
    ) -> Result<ByteStream, ModelError> {
        self.post_stream_within(url, headers, body, parse_error, &CallBudget::default())
            .await
    }

    /// [`HttpTransport::post_stream`], counting first-byte timeouts in `budget` (shared by the
    /// openings of one streamed call).
    pub(crate) async fn post_stream_within(
        &self,
        url: &Endpoint,
        headers: &HeaderMap,
        body: Bytes,
        parse_error: ErrorParser,
        budget: &CallBudget,
    ) -> Result<ByteStream, ModelError> {
        if let Some(bytes) = self.replayed(url, &body)? {
            // The events as recorded, one piece each, as a server would send them.
            let pieces: Vec<Result<Bytes, ModelError>> =
                split_stream(&bytes).into_iter().map(Ok).collect();
            return Ok(Box::pin(futures::stream::iter(pieces)));
        }
        let tape = self.cassette.clone().map(|cassette| StreamTape {
            cassette,
            url: url.as_str().to_string(),
            request: body.clone(),
            received: Vec::new(),
            broke: false,
            redactor: Redactor::for_request(url.as_str(), headers),
        });
        let response = self
            .with_retries(url, headers, || {
                self.send_once(url, headers, &body, parse_error, budget)
            })
            .await?;
        let limit = self.max_body_bytes;
        let idle = self.idle_timeout;
        let logged = self.debug_log.clone().map(|log| {
            (
                log,
                budget.logged(),
                Redactor::for_request(url.as_str(), headers),
            )
        });
        let state = (response.bytes_stream(), 0usize, false, (logged, tape));
        Ok(Box::pin(futures::stream::unfold(
            state,
            move |(mut body, mut seen, ended, (logged, mut tape))| async move {
                if ended {
                    return None;
                }
                let item = match next_chunk(&mut body, idle).await {
                    Ok(None) => return None,
                    Ok(Some(chunk)) => {
                        if let Some((log, call, redactor)) = &logged {
                            log.chunk(*call, &chunk, redactor);
                        }
                        if let Some(tape) = &mut tape {
                            tape.received.extend_from_slice(&chunk);
                        }
                        seen += chunk.len();
                        if seen > limit {
                            Err(ModelError::BodyTooLarge { limit })
                        } else {
                            Ok(chunk)
                        }
                    }
                    Err(e) => Err(e),
                };
                let ended = item.is_err();
                if ended && let Some(tape) = &mut tape {
                    tape.broke = true;
                }
                Some((item, (body, seen, ended, (logged, tape))))
            },
        )))
    }
}

impl HttpTransport {
    /// Playing back a cassette: the recorded response body for this request (`None`: not
    /// playing back, or a request the cassette lacks that goes to the server, the fallback).
    fn replayed(&self, url: &Endpoint, body: &[u8]) -> Result<Option<Vec<u8>>, ModelError> {
        use super::cassette::Replayed;
        let Some(cassette) = self.cassette.as_ref().filter(|c| c.is_replay()) else {
            return Ok(None);
        };
        match cassette.replay_request(url.as_str(), body) {
            Replayed::Hit(exchange) => Ok(Some(exchange.body_bytes())),
            Replayed::Miss(_) if cassette.has_fallback() => Ok(None),
            Replayed::Miss(why) => Err(ModelError::Config(format!(
                "replaying a cassette: {why}\n(record the run again, or give a live model \
                 to ask instead with a fallback, `--replay-fallback SPEC`)"
            ))),
        }
    }
}

/// A streamed response being recorded: what arrived, recorded when the stream is dropped
/// (read to its end, or left once the adapter had what it needed), unless it broke.
struct StreamTape {
    cassette: std::sync::Arc<super::cassette::Cassette>,
    url: String,
    request: Bytes,
    received: Vec<u8>,
    broke: bool,
    redactor: Redactor,
}

impl Drop for StreamTape {
    fn drop(&mut self) {
        // Playing back with a fallback, only what went to the server is recorded (appended).
        if !self.broke && !self.received.is_empty() {
            self.cassette.record_stream(
                &self.url,
                &self.request,
                200,
                &self.received,
                &self.redactor,
            );
        }
    }
}

/// A recorded stream cut back into its events (each with its blank line).
fn split_stream(bytes: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] == b'\n' && bytes[i + 1] == b'\n' {
            out.push(Bytes::copy_from_slice(&bytes[start..i + 2]));
            start = i + 2;
            i += 2;
        } else {
            i += 1;
        }
    }
    if start < bytes.len() {
        out.push(Bytes::copy_from_slice(&bytes[start..]));
    }
    out
}

/// Wraps a stream opener so that a stream failing with a retryable error *before it delivered
/// any output* is opened again (up to `policy.max_retries` times). Once output has been
/// delivered, an error is passed on and nothing is replayed.
pub fn resilient_stream<F, Fut>(policy: RetryPolicy, open: F) -> EventStream
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<EventStream, ModelError>> + Send + 'static,
{
    resilient_stream_from(policy, None, open, std::convert::identity)
}

/// [`resilient_stream`] starting with `first`, a stream already opened (`open` is then called
/// only to open it again). Every error the stream passes on goes through `map_err` first (an
/// adapter's redaction and classification), in the same layer rather than one more around it.
pub(crate) fn resilient_stream_from<F, Fut, M>(
    policy: RetryPolicy,
    first: Option<EventStream>,
    open: F,
    map_err: M,
) -> EventStream
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<EventStream, ModelError>> + Send + 'static,
    M: Fn(ModelError) -> ModelError + Send + 'static,
{
    Box::pin(Resilient {
        open,
        map_err,
        policy,
        phase: match first {
            Some(stream) => Phase::Reading(stream),
            None => Phase::Closed,
        },
        delivered: false,
        attempt: 0,
    })
}

/// The stream [`resilient_stream`] gives. Each event is passed on in one poll, with no state
/// moved between polls.
struct Resilient<F, Fut, M> {
    open: F,
    /// What every error passed on goes through.
    map_err: M,
    policy: RetryPolicy,
    phase: Phase<Fut>,
    /// Whether output was passed on (the stream is then never opened again).
    delivered: bool,
    /// Openings after the first.
    attempt: u32,
}

enum Phase<Fut> {
    /// No stream: one is to be opened.
    Closed,
    Opening(std::pin::Pin<Box<Fut>>),
    Reading(EventStream),
    /// Waiting before opening again.
    Waiting(std::pin::Pin<Box<tokio::time::Sleep>>),
    Done,
}

impl<F, Fut, M> Unpin for Resilient<F, Fut, M> {}

impl<F, Fut, M> futures::Stream for Resilient<F, Fut, M>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<EventStream, ModelError>>,
    M: Fn(ModelError) -> ModelError,
{
    type Item = Result<StreamEvent, ModelError>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        loop {
            match &mut this.phase {
                Phase::Done => return Poll::Ready(None),
                Phase::Closed => this.phase = Phase::Opening(Box::pin((this.open)())),
                Phase::Waiting(sleep) => {
                    futures::ready!(sleep.as_mut().poll(cx));
                    this.phase = Phase::Closed;
                }
                Phase::Opening(opening) => match futures::ready!(opening.as_mut().poll(cx)) {
                    Ok(stream) => this.phase = Phase::Reading(stream),
                    Err(e) => {
                        this.phase = Phase::Done;
                        return Poll::Ready(Some(Err((this.map_err)(e))));
                    }
                },
                Phase::Reading(stream) => match futures::ready!(stream.poll_next_unpin(cx)) {
                    None => {
                        this.phase = Phase::Done;
                        return Poll::Ready(None);
                    }
                    Some(Ok(ev)) => {
                        if is_output(&ev) {
                            this.delivered = true;
                        }
                        return Poll::Ready(Some(Ok(ev)));
                    }
                    Some(Err(e)) => {
                        if !this.delivered
                            && e.is_retryable()
                            && this.attempt < this.policy.max_retries
                        {
                            this.attempt += 1;
                            let hint = match &e {
                                ModelError::Api(a) => a.retry_after,
                                _ => None,
                            };
                            let wait = this.policy.delay(this.attempt, hint);
                            // Logged as the caller would see it: redacted (a server's
                            // error event may quote the key) and classified.
                            let shown = (this.map_err)(e.clone());
                            tracing::info!(error = %shown, attempt = this.attempt, ?wait, "the stream broke before any output; opening it again");
                            this.phase = Phase::Waiting(Box::pin(tokio::time::sleep(wait)));
                            continue;
                        }
                        this.phase = Phase::Done;
                        let e = if this.delivered && e.is_retryable() {
                            ModelError::StreamInterrupted(e.to_string())
                        } else {
                            e
                        };
                        return Poll::Ready(Some(Err((this.map_err)(e))));
                    }
                },
            }
        }
    }
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
        assert!(good.parsed().is_some());
        let bad = Endpoint::from("not a url");
        assert!(bad.parsed().is_none());
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

    /// Keeps the text of every event's fields.
    #[derive(Clone, Default)]
    struct Logged(Arc<std::sync::Mutex<Vec<String>>>);

    impl tracing::field::Visit for &Logged {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0
                .lock()
                .unwrap()
                .push(format!("{}={value:?}", field.name()));
        }
    }

    impl tracing::Subscriber for Logged {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            event.record(&mut &*self);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// A stream opened again after an error logs that error as its caller gets it, through the
    /// adapter's mapping (redaction): a key the server quoted never reaches the log.
    #[test]
    fn a_stream_opened_again_logs_its_error_redacted() {
        let logged = Logged::default();
        let opens = Arc::new(AtomicU32::new(0));
        let o = opens.clone();
        let policy = RetryPolicy {
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(1),
            ..RetryPolicy::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let items: Vec<_> = tracing::subscriber::with_default(logged.clone(), || {
            let s = resilient_stream_from(
                policy,
                None,
                move || {
                    let n = o.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let events: Vec<Result<StreamEvent, ModelError>> = if n == 0 {
                            vec![Err(ModelError::Transport {
                                message: "bad key sk-SECRET-123 quoted".into(),
                                retryable: true,
                            })]
                        } else {
                            vec![Ok(StreamEvent::TextDelta("hi".into()))]
                        };
                        Ok(Box::pin(futures::stream::iter(events)) as EventStream)
                    }
                },
                |e| match e {
                    ModelError::Transport { message, retryable } => ModelError::Transport {
                        message: message.replace("sk-SECRET-123", "[redacted]"),
                        retryable,
                    },
                    e => e,
                },
            );
            rt.block_on(s.collect())
        });
        assert_eq!(
            opens.load(Ordering::SeqCst),
            2,
            "opened again after the error"
        );
        assert!(matches!(items.as_slice(), [Ok(StreamEvent::TextDelta(_))]));
        let lines = logged.0.lock().unwrap().join("\n");
        assert!(lines.contains("[redacted]"), "the retry is logged: {lines}");
        assert!(!lines.contains("sk-SECRET-123"), "{lines}");
    }

    #[tokio::test]
    async fn stream_is_reopened_only_before_output() {
        let opens = Arc::new(AtomicU32::new(0));
        let o = opens.clone();
        // first open fails before output, second delivers text then fails: no third open
        // (the default number of retries, with a short wait between).
        let policy = RetryPolicy {
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            ..RetryPolicy::default()
        };
        let s = resilient_stream(policy, move || {
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
