//! The transport's defences, over real HTTP against servers on 127.0.0.1, through each provider
//! adapter: no redirect is followed, keys a server echoes never reach an error, a silent body or
//! a stream of keep-alive comments fails after its timeout, a server that never answers costs two
//! first-byte timeouts at most, and a 500 that refuses the request itself is not retried.

use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use toolloop::message::{AssistantMessage, Message, ToolCall, ToolResult};
use toolloop::model::{Model, ModelError, ModelRequest, ModelResponse, ModelSettings, ToolSpec};
use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
use toolloop::providers::gemini::{GeminiConfig, GeminiModel};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use toolloop::transport::http::{HttpTransport, RetryPolicy};

// ---------------------------------------------------------------------------------------------
// A raw HTTP/1.1 server
// ---------------------------------------------------------------------------------------------

/// One request as the server read it.
#[derive(Debug, Clone)]
struct Request {
    head: String,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Reads one request (head and a `Content-Length` body); `None` when the peer sent none.
async fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut request = Request {
        head,
        body: buf[head_end..].to_vec(),
    };
    let length: usize = request
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while request.body.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        request.body.extend_from_slice(&chunk[..n]);
    }
    Some(request)
}

/// What a server saw: connections accepted and requests read.
#[derive(Clone, Default)]
struct Seen {
    connections: Arc<AtomicU32>,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Seen {
    fn connections(&self) -> u32 {
        self.connections.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

type Handler =
    Arc<dyn Fn(u32, Request, TcpStream) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// Serves on 127.0.0.1: each connection's first request goes to `handler` with its number
/// (0-based), which writes whatever it likes to the socket.
async fn serve<F, Fut>(handler: F) -> (u16, Seen)
where
    F: Fn(u32, Request, TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let handler: Handler = Arc::new(move |n, r, s| Box::pin(handler(n, r, s)));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Seen::default();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let n = s.connections.fetch_add(1, Ordering::SeqCst);
            let s = s.clone();
            let handler = handler.clone();
            tokio::spawn(async move {
                if let Some(request) = read_request(&mut stream).await {
                    s.requests.lock().unwrap().push(request.clone());
                    handler(n, request, stream).await;
                }
            });
        }
    });
    (port, seen)
}

/// A complete response with a JSON body; the connection is closed after it.
async fn respond(mut stream: TcpStream, status: u16, extra_headers: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n{extra_headers}\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Keeps a connection open, silent, long after any test ends.
async fn hold(stream: TcpStream) {
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop(stream);
}

// ---------------------------------------------------------------------------------------------
// The four providers
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Provider {
    OpenAi,
    OpenAiResponses,
    Anthropic,
    Gemini,
}

const PROVIDERS: [Provider; 4] = [
    Provider::OpenAi,
    Provider::OpenAiResponses,
    Provider::Anthropic,
    Provider::Gemini,
];

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_retries: 2,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    }
}

/// A model of `provider` at `http://127.0.0.1:{port}` with `key`, its transport adjusted.
fn model(
    provider: Provider,
    port: u16,
    key: &str,
    adjust: impl Fn(&mut HttpTransport),
) -> Arc<dyn Model> {
    let base = format!("http://127.0.0.1:{port}");
    match provider {
        Provider::OpenAi => {
            let mut c = OpenAiConfig::new("m").with_base_url(format!("{base}/v1"));
            c.api_key = Some(key.into());
            c.transport.retry = fast_retries();
            adjust(&mut c.transport);
            Arc::new(OpenAiModel::new(c))
        }
        Provider::OpenAiResponses => {
            let mut c = ResponsesConfig::new("m").with_base_url(format!("{base}/v1"));
            c.api_key = Some(key.into());
            c.transport.retry = fast_retries();
            adjust(&mut c.transport);
            Arc::new(ResponsesModel::new(c))
        }
        Provider::Anthropic => {
            let mut c = AnthropicConfig::new("m");
            c.base_url = base;
            c.api_key = Some(key.into());
            c.transport.retry = fast_retries();
            adjust(&mut c.transport);
            Arc::new(AnthropicModel::new(c))
        }
        Provider::Gemini => {
            let mut c = GeminiConfig::new("m");
            c.base_url = base;
            c.api_key = Some(key.into());
            c.transport.retry = fast_retries();
            adjust(&mut c.transport);
            Arc::new(GeminiModel::new(c))
        }
    }
}

/// One call, complete or streamed (collected), with a 20 s guard against hanging.
async fn call(model: &dyn Model, stream: bool) -> Result<ModelResponse, ModelError> {
    let messages = [Message::user("hello")];
    let settings = ModelSettings::default();
    let request = ModelRequest {
        messages: (&messages).into(),
        reminders: &[],
        tools: &[],
        settings: &settings,
    };
    let work = async {
        if stream {
            ModelResponse::from_stream(model.stream(&request).await?).await
        } else {
            model.complete(&request).await
        }
    };
    tokio::time::timeout(Duration::from_secs(20), work)
        .await
        .expect("the call hung: no timeout ended it")
}

// ---------------------------------------------------------------------------------------------
// Redirects
// ---------------------------------------------------------------------------------------------

/// A redirect, to a server on another port, is not followed, for any provider, streamed or not:
/// the other server receives nothing (neither the key nor the conversation), the error names the
/// status and the target without its credentials and query, and it is not retried.
#[tokio::test]
async fn redirects_are_never_followed() {
    const KEY: &str = "sk-redirect-KEY-0123456789";
    let (evil_port, evil) = serve(|_, _, stream| respond(stream, 200, "", "{}")).await;
    for status in [302u16, 307, 308] {
        for provider in PROVIDERS {
            for stream in [false, true] {
                let location = format!(
                    "http://user:hunter2@127.0.0.1:{evil_port}/collect/{status}?key=QUERYSECRET#frag"
                );
                let (port, first) = serve(move |_, _, s| {
                    let location = location.clone();
                    async move {
                        let headers = format!("location: {location}\r\n");
                        respond(s, status, &headers, "").await;
                    }
                })
                .await;
                let what = format!("{provider:?} stream={stream} status={status}");
                let m = model(provider, port, KEY, |_| {});
                let err = call(m.as_ref(), stream).await.expect_err(&what);
                let text = err.to_string();
                assert!(!err.is_retryable(), "{what}: {text}");
                assert!(text.contains(&status.to_string()), "{what}: {text}");
                assert!(
                    text.contains(&format!("to http://127.0.0.1:{evil_port}/collect/{status}")),
                    "{what}: {text}"
                );
                for secret in ["hunter2", "user", "QUERYSECRET", "frag", KEY] {
                    assert!(!text.contains(secret), "{what}: {secret} in {text}");
                }
                assert_eq!(first.requests().len(), 1, "{what}: retried");
                assert_eq!(evil.connections(), 0, "{what}: the redirect was followed");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The request on the wire
// ---------------------------------------------------------------------------------------------

/// The header lines of a request's head, in order, names lowercased.
fn header_lines(request: &Request) -> Vec<(String, String)> {
    request
        .head
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            Some((n.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect()
}

/// A body with what JSON escapes and multi-byte text in it, longer than a socket read.
fn wire_body() -> bytes::Bytes {
    let text = "é€😀 \"quoted\" \\ ".repeat(500);
    bytes::Bytes::from(serde_json::to_vec(&json!({"messages": [{"content": text}]})).unwrap())
}

/// Every header a call is given arrives once, in the order given (a name given twice with both
/// values, in order), then `Content-Type: application/json`, once, and a `Content-Length` that
/// is the body's; the body arrives byte for byte, and the key's header is sent as given.
#[tokio::test]
async fn headers_and_body_arrive_once_in_order() {
    use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
    let (port, seen) = serve(|_, _, stream| respond(stream, 200, "", "{}")).await;
    let mut headers = HeaderMap::new();
    let mut key = HeaderValue::from_static("Bearer sk-wire-0123");
    key.set_sensitive(true);
    headers.insert(AUTHORIZATION, key);
    headers.insert("x-zeta", HeaderValue::from_static("z"));
    headers.append("x-multi", HeaderValue::from_static("first"));
    headers.append("x-multi", HeaderValue::from_static("second"));
    headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
    let body = wire_body();
    let url = toolloop::transport::http::Endpoint::new(format!(
        "http://127.0.0.1:{port}/v1/chat/completions"
    ));
    let answer = HttpTransport::new()
        .post(
            &url,
            &headers,
            body.clone(),
            toolloop::providers::openai::parse_error,
        )
        .await
        .expect("the server answers 200");
    assert_eq!(&answer[..], b"{}");
    let requests = seen.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert!(
        request
            .head
            .starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
        "{}",
        request.head
    );
    assert_eq!(request.body, &body[..], "the body arrives as it was given");
    let lines = header_lines(request);
    let given: Vec<(&str, &str)> = lines
        .iter()
        .filter(|(n, _)| {
            headers.contains_key(n.as_str()) || n == "content-type" || n == "content-length"
        })
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let length = body.len().to_string();
    assert_eq!(
        given,
        [
            ("authorization", "Bearer sk-wire-0123"),
            ("x-zeta", "z"),
            ("x-multi", "first"),
            ("x-multi", "second"),
            ("anthropic-version", "2023-06-01"),
            ("content-type", "application/json"),
            ("content-length", length.as_str()),
        ],
        "{}",
        request.head
    );
    // What the client adds, once each.
    for name in ["host", "accept"] {
        assert_eq!(
            lines.iter().filter(|(n, _)| n == name).count(),
            1,
            "{name}: {}",
            request.head
        );
    }
}

/// Each provider's key arrives in its own header, once, with `Content-Type` once.
#[tokio::test]
async fn each_providers_key_header_arrives_once() {
    const KEY: &str = "sk-once-KEY-0123456789";
    for provider in PROVIDERS {
        for stream in [false, true] {
            let (port, seen) = serve(|_, _, stream| respond(stream, 500, "", "{}")).await;
            let m = model(provider, port, KEY, |t| t.retry = RetryPolicy::none());
            let _ = call(m.as_ref(), stream).await;
            let requests = seen.requests();
            let what = format!("{provider:?} stream={stream}");
            assert_eq!(requests.len(), 1, "{what}");
            let lines = header_lines(&requests[0]);
            let keyed: Vec<&(String, String)> =
                lines.iter().filter(|(_, v)| v.contains(KEY)).collect();
            assert_eq!(keyed.len(), 1, "{what}: {}", requests[0].head);
            let types: Vec<&(String, String)> =
                lines.iter().filter(|(n, _)| n == "content-type").collect();
            assert_eq!(types.len(), 1, "{what}: {}", requests[0].head);
            assert_eq!(types[0].1, "application/json", "{what}");
        }
    }
}

/// Credentials in the URL are sent as a `Basic` authorization, and not in the request line.
#[tokio::test]
async fn credentials_in_the_url_become_a_basic_authorization() {
    let (port, seen) = serve(|_, _, stream| respond(stream, 200, "", "{}")).await;
    let url = toolloop::transport::http::Endpoint::new(format!(
        "http://user:pass@127.0.0.1:{port}/v1/chat/completions"
    ));
    let body = wire_body();
    HttpTransport::new()
        .post(
            &url,
            &reqwest::header::HeaderMap::new(),
            body.clone(),
            toolloop::providers::openai::parse_error,
        )
        .await
        .expect("the server answers 200");
    let request = &seen.requests()[0];
    assert!(
        request
            .head
            .starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
        "{}",
        request.head
    );
    assert_eq!(
        request.header("authorization").as_deref(),
        Some("Basic dXNlcjpwYXNz")
    );
    assert_eq!(
        request.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(request.body, &body[..]);
}

// ---------------------------------------------------------------------------------------------
// Keys echoed by a server
// ---------------------------------------------------------------------------------------------

const ECHOED_KEY: &str = "sk-ECHOED/KEY+0123456789=abcdefghijklmnopqrstuvwxyz";

/// The key as a server might quote it: as it is, percent-encoded, inside a URL, and last, at the
/// very end of a long message (so that a message cut short would keep its beginning).
fn echo_text(key: &str) -> String {
    let encoded: String = key
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!(
        "Incorrect API key provided: {key}. Request was https://api.example/v1?key={encoded} \
         ({encoded}). {} {key}",
        "padding ".repeat(40)
    )
}

fn error_body(provider: Provider, message: &str) -> String {
    match provider {
        Provider::OpenAi | Provider::OpenAiResponses => {
            json!({"error": {"message": message, "type": "invalid_request_error",
                                              "code": "invalid_api_key"}})
        }
        Provider::Anthropic => json!({"type": "error", "error": {"type": "authentication_error",
                                                                 "message": message}}),
        Provider::Gemini => json!({"error": {"code": 401, "message": message,
                                             "status": "UNAUTHENTICATED"}}),
    }
    .to_string()
}

/// Whether `text` holds any recognisable piece of `key`.
fn leaks(text: &str, key: &str) -> bool {
    let distinctive = key
        .split(['/', '+', '='])
        .any(|piece| piece.len() >= 6 && text.contains(piece));
    distinctive || text.contains("ECHOED")
}

/// A 401 whose body repeats the key the server was sent, for each provider, streamed and not:
/// the error (its text and its debug form) holds no trace of the key.
#[tokio::test]
async fn keys_echoed_in_error_bodies_never_reach_the_error() {
    for provider in PROVIDERS {
        let (port, seen) = serve(move |_, request, stream| async move {
            let key = request
                .header("authorization")
                .map(|v| v.trim_start_matches("Bearer ").to_string())
                .or_else(|| request.header("x-api-key"))
                .or_else(|| request.header("x-goog-api-key"))
                .unwrap_or_default();
            respond(stream, 401, "", &error_body(provider, &echo_text(&key))).await;
        })
        .await;
        for stream in [false, true] {
            let m = model(provider, port, ECHOED_KEY, |_| {});
            let err = call(m.as_ref(), stream).await.expect_err("a 401");
            let what = format!("{provider:?} stream={stream}");
            let text = format!("{err} {err:?}");
            assert!(!leaks(&text, ECHOED_KEY), "{what}: {text}");
            assert!(text.contains("[redacted]"), "{what}: {text}");
            assert!(text.contains("401"), "{what}: {text}");
        }
        // The server did receive the key: the test echoed the real thing.
        let request = &seen.requests()[0];
        assert!(request.head.contains(ECHOED_KEY), "{provider:?}");
    }
}

/// An error event inside a 200 stream that quotes the key, and a 200 body that does not decode
/// and quotes it: neither error holds it.
#[tokio::test]
async fn keys_echoed_in_streams_and_bodies_never_reach_the_error() {
    let (port, _) = serve(move |_, request, mut stream| async move {
        let key = request
            .header("authorization")
            .unwrap_or_default()
            .trim_start_matches("Bearer ")
            .to_string();
        if request.json()["stream"] == true {
            let event =
                json!({"error": {"message": format!("bad key {key}"), "type": "server_error"}});
            let body = format!("data: {event}\n\n");
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.shutdown().await;
        } else {
            let body = format!("{{\"choices\": [{{\"message\": {{\"content\": \"{key}\"");
            respond(stream, 200, "", &body).await;
        }
    })
    .await;
    for provider in [Provider::OpenAi, Provider::OpenAiResponses] {
        for stream in [false, true] {
            let m = model(provider, port, ECHOED_KEY, |_| {});
            let err = call(m.as_ref(), stream).await.expect_err("an error");
            let text = format!("{err} {err:?}");
            assert!(
                !leaks(&text, ECHOED_KEY),
                "{provider:?} stream={stream}: {text}"
            );
            assert!(
                text.contains("[redacted]"),
                "{provider:?} stream={stream}: {text}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Timeouts
// ---------------------------------------------------------------------------------------------

/// A body that stops arriving: after the idle timeout the call fails, once, for each provider,
/// streamed or not (before, it waited forever).
#[tokio::test]
async fn a_stalled_body_fails_after_the_idle_timeout() {
    for provider in PROVIDERS {
        for stream in [false, true] {
            let (port, seen) = serve(move |_, _, mut s| async move {
                let head = if stream {
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n".to_string()
                } else {
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{\"id\":"
                        .to_string()
                };
                let _ = s.write_all(head.as_bytes()).await;
                hold(s).await;
            })
            .await;
            let m = model(provider, port, "sk-stall", |t| {
                t.idle_timeout = Duration::from_millis(300);
            });
            let started = std::time::Instant::now();
            let err = call(m.as_ref(), stream).await.expect_err("a stall");
            let what = format!("{provider:?} stream={stream}");
            assert!(err.to_string().contains("idle timeout"), "{what}: {err}");
            assert!(!err.is_retryable(), "{what}");
            assert!(started.elapsed() < Duration::from_secs(10), "{what}");
            assert_eq!(
                seen.requests().len(),
                1,
                "{what}: an idle timeout is not retried"
            );
        }
    }
}

/// A stream that sends only keep-alive comments: it fails after the event timeout, though bytes
/// keep coming (before, it ran forever).
#[tokio::test]
async fn a_stream_of_comments_only_fails_after_the_event_timeout() {
    for provider in PROVIDERS {
        let (port, seen) = serve(|_, _, mut s| async move {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
            if s.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            for _ in 0..1200 {
                if s.write_all(b": keep-alive\n\n").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let m = model(provider, port, "sk-comments", |t| {
            t.idle_timeout = Duration::from_millis(400);
            t.event_timeout = Duration::from_millis(800);
        });
        let err = call(m.as_ref(), true).await.expect_err("no event");
        let what = format!("{provider:?}");
        assert!(
            err.to_string().contains("no event for 800 ms"),
            "{what}: {err}"
        );
        assert!(!err.is_retryable(), "{what}");
        assert_eq!(seen.requests().len(), 1, "{what}");
    }
}

/// Events reset the event timeout: a stream whose events are further apart than nothing but
/// closer than the timeout, with comments between, completes.
#[tokio::test]
async fn a_slow_stream_with_events_completes() {
    let (port, _) = serve(|_, _, mut s| async move {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        let _ = s.write_all(head.as_bytes()).await;
        for word in ["a", "b", "c", "d"] {
            let chunk = json!({"choices": [{"index": 0, "delta": {"content": word}}]});
            let _ = s.write_all(format!("data: {chunk}\n\n").as_bytes()).await;
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = s.write_all(b": thinking\n\n").await;
            }
        }
        let last = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        let _ = s
            .write_all(format!("data: {last}\n\ndata: [DONE]\n\n").as_bytes())
            .await;
        let _ = s.shutdown().await;
    })
    .await;
    let m = model(Provider::OpenAi, port, "sk-slow", |t| {
        t.idle_timeout = Duration::from_millis(250);
        t.event_timeout = Duration::from_millis(500);
    });
    let r = call(m.as_ref(), true).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("abcd"));
}

/// An event timeout too long to add to a time (`Duration::MAX`) is no limit, not a panic: a
/// stream that pauses between its events completes.
#[tokio::test]
async fn an_event_timeout_too_long_to_add_to_a_time_is_no_limit() {
    let (port, _) = serve(|_, _, mut s| async move {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        let _ = s.write_all(head.as_bytes()).await;
        for word in ["a", "b"] {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let chunk = json!({"choices": [{"index": 0, "delta": {"content": word}}]});
            let _ = s.write_all(format!("data: {chunk}\n\n").as_bytes()).await;
        }
        let last = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        let _ = s
            .write_all(format!("data: {last}\n\ndata: [DONE]\n\n").as_bytes())
            .await;
        let _ = s.shutdown().await;
    })
    .await;
    let m = model(Provider::OpenAi, port, "sk-forever", |t| {
        t.event_timeout = Duration::MAX;
    });
    let r = call(m.as_ref(), true).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("ab"));
}

/// A server that accepts the connection and never finishes the response head (a slow loris):
/// the first-byte timeout is retried once, not as often as the retry policy allows.
#[tokio::test]
async fn a_server_that_never_answers_costs_two_first_byte_timeouts_at_most() {
    for provider in PROVIDERS {
        for stream in [false, true] {
            let (port, seen) = serve(|_, _, mut s| async move {
                // One byte of the status line every 100 ms, never the end of the head.
                for b in b"HTTP/1.1 200 OK\r\nx-slow: "
                    .iter()
                    .chain(b"a".repeat(600).iter())
                {
                    if s.write_all(&[*b]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await;
            let m = model(provider, port, "sk-loris", |t| {
                t.first_byte_timeout = Duration::from_millis(300);
                t.retry.max_retries = 5;
            });
            let err = call(m.as_ref(), stream).await.expect_err("a timeout");
            let what = format!("{provider:?} stream={stream}");
            assert!(err.to_string().contains("first byte"), "{what}: {err}");
            assert!(!err.is_retryable(), "{what}");
            assert_eq!(seen.connections(), 2, "{what}: retried once, no more");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A server that refuses our own request with a 500
// ---------------------------------------------------------------------------------------------

/// llama-cpp-python's answer to a request its validation refuses: HTTP 500, the pydantic errors
/// as the message (two wordings, from two FastAPI versions).
fn validation_500(newer: bool) -> String {
    let message = if newer {
        "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 1, \
         'typed-dict', 'content'), 'msg': 'Input should be a valid string', 'input': None}"
    } else {
        "[{'type': 'string_type', 'loc': ('body', 'messages', 1, 'content'), 'msg': 'Input \
         should be a valid string', 'input': None, 'url': \
         'https://errors.pydantic.dev/2.6/v/string_type'}]"
    };
    json!({"error": {"message": message, "type": "internal_server_error", "param": null,
                     "code": null}})
    .to_string()
}

/// A 500 that is a validation error of the request is not retried; other 500s still are.
#[tokio::test]
async fn a_500_refusing_the_request_itself_is_not_retried() {
    for (body, retried) in [
        (validation_500(true), false),
        (validation_500(false), false),
        (
            json!({"error": {"message": "CUDA error: out of memory", "type": "internal_server_error"}})
                .to_string(),
            true,
        ),
    ] {
        for stream in [false, true] {
            let b = body.clone();
            let (port, seen) = serve(move |_, _, s| {
                let b = b.clone();
                async move { respond(s, 500, "", &b).await }
            })
            .await;
            let m = model(Provider::OpenAi, port, "sk-500", |_| {});
            let err = call(m.as_ref(), stream).await.expect_err("a 500");
            let what = format!("stream={stream} body={body}");
            assert_eq!(err.is_retryable(), retried, "{what}");
            let expected = if retried { 3 } else { 1 };
            assert_eq!(seen.requests().len(), expected, "{what}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A server that behaves like llama-cpp-python's
// ---------------------------------------------------------------------------------------------

fn weather() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "get_weather".into(),
        description: "Weather".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    }]
}

/// Plays llama-cpp-python's server: a `null` content anywhere is a 500 validation error, and
/// `tools` are ignored (a text answer) unless `tool_choice` is given.
async fn llama_cpp_python_like() -> (u16, Seen) {
    serve(|_, request, s| async move {
        let body = request.json();
        let null_content = body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m.get("content").is_some_and(|c| c.is_null()));
        if null_content {
            return respond(s, 500, "", &validation_500(true)).await;
        }
        let message = if body.get("tools").is_some() && body.get("tool_choice").is_some() {
            json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0,
                   "id": "call_1", "type": "function", "function": {"name": "get_weather",
                   "arguments": "{\"city\": \"Paris\"}"}}]})
        } else {
            json!({"role": "assistant", "content": "I cannot look that up."})
        };
        if body["stream"] == true {
            let chunk = json!({"choices": [{"index": 0, "delta": message,
                                            "finish_reason": "stop"}]});
            let mut s = s;
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s
                .write_all(format!("data: {chunk}\n\ndata: [DONE]\n\n").as_bytes())
                .await;
            let _ = s.shutdown().await;
            return;
        }
        let reply = json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
                           "message": message, "finish_reason": "stop"}]});
        respond(s, 200, "", &reply.to_string()).await;
    })
    .await
}

/// A conversation with a past tool call goes through to a llama-cpp-python-like server (an
/// assistant turn's missing text is `""`, not `null`) and the tools are used (`tool_choice`
/// `auto` is said).
#[tokio::test]
async fn a_llama_cpp_python_server_gets_a_request_it_accepts() {
    let (port, seen) = llama_cpp_python_like().await;
    let m = model(Provider::OpenAi, port, "sk-llama", |_| {});
    let call_msg = ToolCall::new("get_weather", json!({"city": "Rome"}));
    let id = call_msg.id.clone();
    let messages = [
        Message::user("weather in Rome, then Paris?"),
        Message::Assistant(AssistantMessage {
            text: None,
            tool_calls: vec![call_msg],
            parts: vec![],
        }),
        Message::Tool(ToolResult {
            call_id: id,
            name: "get_weather".into(),
            content: "sunny".into(),
            is_error: false,
            images: Vec::new(),
        }),
    ];
    let tools = weather();
    let settings = ModelSettings::default();
    let request = ModelRequest {
        messages: (&messages).into(),
        reminders: &[],
        tools: &tools,
        settings: &settings,
    };
    let r = m.complete(&request).await.expect("accepted");
    assert_eq!(r.tool_calls.len(), 1, "{r:?}");
    assert_eq!(r.tool_calls[0].name, "get_weather");
    let streamed = ModelResponse::from_stream(m.stream(&request).await.expect("accepted"))
        .await
        .expect("accepted");
    assert_eq!(streamed.tool_calls.len(), 1, "{streamed:?}");
    let sent = seen.requests();
    assert_eq!(sent.len(), 2, "no request was refused and retried");
    for r in &sent {
        let body = r.json();
        assert_eq!(body["tool_choice"], "auto");
        assert_eq!(body["messages"][1]["content"], "");
    }
}

/// OpenAI's own API keeps its default: no `tool_choice` for `auto` unless asked for.
#[tokio::test]
async fn tool_choice_auto_is_explicit_except_for_openai_unless_configured() {
    let openai = OpenAiConfig::new("gpt-x");
    assert!(!openai.explicit_tool_choice);
    let other = OpenAiConfig::new("m").with_base_url("http://localhost:8000/v1");
    assert!(other.explicit_tool_choice);
    let (port, seen) = llama_cpp_python_like().await;
    let mut c = OpenAiConfig::new("m").with_base_url(format!("http://127.0.0.1:{port}/v1"));
    c.explicit_tool_choice = false;
    let m = OpenAiModel::new(c);
    let messages = [Message::user("weather?")];
    let tools = weather();
    let settings = ModelSettings::default();
    let request = ModelRequest {
        messages: (&messages).into(),
        reminders: &[],
        tools: &tools,
        settings: &settings,
    };
    let r = m.complete(&request).await.unwrap();
    // Without it, such a server ignores the tools.
    assert!(r.tool_calls.is_empty());
    assert!(seen.requests()[0].json().get("tool_choice").is_none());
}
