//! The mock's fault injection on the wire (raw HTTP on 127.0.0.1): each kind of fault in each
//! protocol, streamed and not, the counts by kind, and the same faults for the same seed.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use toolloop::transport::sse::{SseDecoder, SseEvent};
use toolloop_mock::{FaultKind, MockOptions, MockServer, start};

async fn server() -> MockServer {
    start(MockOptions::default()).await.expect("mock starts")
}

/// The arguments the mock sends for the `lookup` tool (its schema's default).
const ARGS: &str = r#"{"q":"the quick brown fox jumps"}"#;

fn schema() -> Value {
    json!({"type": "object", "properties": {"q": {"type": "string", "default": "the quick brown fox jumps"}}})
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    OpenAi,
    Anthropic,
    Gemini,
}

const PROTOS: [Proto; 3] = [Proto::OpenAi, Proto::Anthropic, Proto::Gemini];

/// A first request asking `model` for a reply, with one tool offered; `prompt` makes its key.
fn request(
    base: &str,
    proto: Proto,
    model: &str,
    stream: bool,
    prompt: &str,
) -> (String, Vec<(&'static str, &'static str)>, Value) {
    match proto {
        Proto::OpenAi => (
            format!("{base}/v1/chat/completions"),
            vec![],
            json!({"model": model, "stream": stream,
                "messages": [{"role": "user", "content": prompt}],
                "tools": [{"type": "function", "function": {"name": "lookup", "parameters": schema()}}]}),
        ),
        Proto::Anthropic => (
            format!("{base}/v1/messages"),
            vec![("anthropic-version", "2023-06-01")],
            json!({"model": model, "max_tokens": 100, "stream": stream,
                "messages": [{"role": "user", "content": prompt}],
                "tools": [{"name": "lookup", "input_schema": schema()}]}),
        ),
        Proto::Gemini => {
            let method = if stream {
                "streamGenerateContent?alt=sse"
            } else {
                "generateContent"
            };
            (
                format!("{base}/v1beta/models/{model}:{method}"),
                vec![],
                json!({"contents": [{"role": "user", "parts": [{"text": prompt}]}],
                    "tools": [{"functionDeclarations": [{"name": "lookup", "parameters": schema()}]}]}),
            )
        }
    }
}

/// What came back: a failure to send (no response), a body that broke, or a whole response.
#[derive(Debug)]
enum Got {
    NoResponse(String),
    BrokenBody(StatusCode),
    Whole {
        status: StatusCode,
        headers: HeaderMap,
        body: Vec<u8>,
        elapsed: Duration,
    },
}

impl Got {
    fn whole(&self) -> (StatusCode, &HeaderMap, &[u8]) {
        match self {
            Got::Whole {
                status,
                headers,
                body,
                ..
            } => (*status, headers, body),
            other => panic!("expected a whole response, got {other:?}"),
        }
    }

    fn json(&self) -> Value {
        let (_, _, body) = self.whole();
        serde_json::from_slice(body).unwrap_or_else(|e| {
            panic!("not JSON ({e}): {}", String::from_utf8_lossy(body));
        })
    }

    fn events(&self) -> Vec<SseEvent> {
        let (_, _, body) = self.whole();
        let mut decoder = SseDecoder::new();
        let mut events = decoder.push(body);
        events.extend(decoder.finish());
        events
    }

    /// A short label of a response that is not [`complete`], to compare runs.
    fn label(&self) -> String {
        match self {
            Got::NoResponse(_) => "no response".into(),
            Got::BrokenBody(s) => format!("{s} broken"),
            Got::Whole { status, body, .. } => {
                let ok = serde_json::from_slice::<Value>(body).is_ok();
                format!("{status} {}", if ok { "json" } else { "not json" })
            }
        }
    }
}

async fn send(
    client: &reqwest::Client,
    (url, headers, body): &(String, Vec<(&'static str, &'static str)>, Value),
) -> Got {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let started = Instant::now();
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) => return Got::NoResponse(e.to_string()),
    };
    let status = response.status();
    let headers = response.headers().clone();
    match response.bytes().await {
        Ok(body) => Got::Whole {
            status,
            headers,
            body: body.to_vec(),
            elapsed: started.elapsed(),
        },
        Err(_) => Got::BrokenBody(status),
    }
}

fn client() -> reqwest::Client {
    // No connection reuse: a reset connection must not be handed to the next request.
    http_client_builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

#[tokio::test]
async fn error_faults_have_their_status_headers_and_body_shape() {
    let server = server().await;
    let client = client();
    let mut sent = 0;
    for proto in PROTOS {
        for kind in ["429", "500", "503", "529"] {
            if kind == "529" && proto != Proto::Anthropic {
                continue;
            }
            for stream in [false, true] {
                let model = format!("mock:faults=1,fault_kinds={kind},retry_after=1500ms");
                let req = request(&server.base_url(), proto, &model, stream, "hi");
                let got = send(&client, &req).await;
                sent += 1;
                let (status, headers, _) = got.whole();
                assert_eq!(status.as_str(), kind, "{proto:?} {kind}");
                let v = got.json();
                let message = v["error"]["message"].as_str().unwrap_or_default();
                assert!(message.contains("injected by the mock"), "{v}");
                if kind == "429" {
                    assert_eq!(headers["retry-after-ms"], "1500");
                    assert_eq!(headers["retry-after"], "2");
                } else {
                    assert!(headers.get("retry-after").is_none());
                }
                let want = match (proto, kind) {
                    (Proto::OpenAi, "429") => ("/error/code", "rate_limit_exceeded"),
                    (Proto::OpenAi, _) => ("/error/type", "server_error"),
                    (Proto::Anthropic, "429") => ("/error/type", "rate_limit_error"),
                    (Proto::Anthropic, "529") => ("/error/type", "overloaded_error"),
                    (Proto::Anthropic, _) => ("/error/type", "api_error"),
                    (Proto::Gemini, "429") => ("/error/status", "RESOURCE_EXHAUSTED"),
                    (Proto::Gemini, "503") => ("/error/status", "UNAVAILABLE"),
                    (Proto::Gemini, _) => ("/error/status", "INTERNAL"),
                };
                assert_eq!(v.pointer(want.0), Some(&json!(want.1)), "{proto:?} {v}");
            }
        }
    }
    let stats = server.stats();
    assert_eq!(stats.rejected, 0, "faults are not rejections");
    assert_eq!(stats.requests, sent);
    assert_eq!(stats.faults.get(FaultKind::RateLimited), 6);
    assert_eq!(stats.faults.get(FaultKind::ServerError), 6);
    assert_eq!(stats.faults.get(FaultKind::Unavailable), 6);
    assert_eq!(stats.faults.get(FaultKind::Overloaded), 2);
    assert_eq!(stats.faults.total(), sent);
}

#[tokio::test]
async fn a_529_is_drawn_on_the_anthropic_api_only() {
    let server = server().await;
    let client = client();
    for proto in [Proto::OpenAi, Proto::Gemini] {
        let req = request(
            &server.base_url(),
            proto,
            "mock:faults=1,fault_kinds=529",
            false,
            "hi",
        );
        let got = send(&client, &req).await;
        assert_eq!(got.whole().0, StatusCode::OK, "{proto:?}");
    }
    assert_eq!(server.stats().faults.total(), 0);
}

#[tokio::test]
async fn a_reset_comes_before_any_response() {
    let server = server().await;
    let client = client();
    for proto in PROTOS {
        for stream in [false, true] {
            let req = request(
                &server.base_url(),
                proto,
                "mock:faults=1,fault_kinds=reset",
                stream,
                "hi",
            );
            let got = send(&client, &req).await;
            assert!(
                matches!(&got, Got::NoResponse(why) if !why.is_empty()),
                "{proto:?} stream={stream}: {got:?}"
            );
        }
    }
    assert_eq!(server.stats().faults.get(FaultKind::Reset), 6);
    // The server is still fine afterwards.
    let req = request(&server.base_url(), Proto::OpenAi, "mock", false, "hi");
    assert_eq!(send(&client, &req).await.whole().0, StatusCode::OK);
}

#[tokio::test]
async fn a_body_reset_breaks_a_started_response() {
    let server = server().await;
    let client = client();
    for proto in PROTOS {
        for stream in [false, true] {
            for prompt in ["one", "two", "three"] {
                let req = request(
                    &server.base_url(),
                    proto,
                    "mock:faults=1,fault_kinds=reset_body",
                    stream,
                    prompt,
                );
                let got = send(&client, &req).await;
                assert!(
                    matches!(got, Got::BrokenBody(StatusCode::OK)),
                    "{proto:?} stream={stream}: {got:?}"
                );
            }
        }
    }
    assert_eq!(server.stats().faults.get(FaultKind::ResetBody), 18);
}

/// The arguments (or text) a streamed reply delivered before it ended, and whether it ended
/// properly.
fn streamed(proto: Proto, got: &Got) -> (String, bool) {
    let mut delivered = String::new();
    let mut ended = false;
    match proto {
        Proto::OpenAi => {
            for ev in got.events() {
                if ev.data == "[DONE]" {
                    ended = true;
                    continue;
                }
                let v: Value = serde_json::from_str(&ev.data).unwrap();
                let delta = &v["choices"][0]["delta"];
                if let Some(args) = delta["tool_calls"][0]["function"]["arguments"].as_str() {
                    delivered.push_str(args);
                }
                if let Some(text) = delta["content"].as_str() {
                    delivered.push_str(text);
                }
            }
        }
        Proto::Anthropic => {
            for ev in got.events() {
                let v: Value = serde_json::from_str(&ev.data).unwrap();
                match v["type"].as_str() {
                    Some("message_stop") => ended = true,
                    Some("content_block_delta") => {
                        let d = &v["delta"];
                        delivered.push_str(d["partial_json"].as_str().unwrap_or_default());
                        delivered.push_str(d["text"].as_str().unwrap_or_default());
                    }
                    _ => {}
                }
            }
        }
        Proto::Gemini => unreachable!("Gemini streams calls whole"),
    }
    (delivered, ended)
}

#[tokio::test]
async fn a_cut_ends_the_reply_in_the_middle_of_the_first_call() {
    let server = server().await;
    let client = client();
    let text = "Done. I saw 0 tool results in 0 rounds.";
    for proto in [Proto::OpenAi, Proto::Anthropic] {
        for (rounds, whole) in [(1, ARGS), (0, text)] {
            let model = format!("mock:rounds={rounds},chunk=4,faults=1,fault_kinds=cut_call");
            let req = request(&server.base_url(), proto, &model, true, "hi");
            let got = send(&client, &req).await;
            let (delivered, ended) = streamed(proto, &got);
            assert!(!ended, "{proto:?}: the stream must not end properly");
            assert!(
                !delivered.is_empty() && delivered.len() < whole.len(),
                "{proto:?}: {delivered}"
            );
            assert!(whole.starts_with(&delivered), "{proto:?}: {delivered}");
        }
    }
    // Gemini streams a call whole in one chunk: the chunk's line is cut inside `args`.
    let model = "mock:faults=1,fault_kinds=cut_call";
    let req = request(&server.base_url(), Proto::Gemini, model, true, "hi");
    let got = send(&client, &req).await;
    let (_, _, body) = got.whole();
    let body = String::from_utf8_lossy(body);
    let last = body.lines().last().unwrap();
    assert!(!body.ends_with("\r\n\r\n"), "{body}");
    assert!(
        last.starts_with("data: ") && last.contains(r#""functionCall""#),
        "{body}"
    );
    let data = last.trim_start_matches("data: ");
    assert!(serde_json::from_str::<Value>(data).is_err(), "{body}");
    let args_at = data.find(r#""args":"#).unwrap() + 7;
    assert!(ARGS.starts_with(&data[args_at..]), "{data}");

    // Not streamed: a 200 whose JSON body stops inside the first call's arguments.
    for proto in PROTOS {
        let req = request(&server.base_url(), proto, model, false, "hi");
        let got = send(&client, &req).await;
        let (status, _, body) = got.whole();
        assert_eq!(status, StatusCode::OK);
        assert!(serde_json::from_slice::<Value>(body).is_err());
        let body = String::from_utf8_lossy(body);
        assert!(body.contains("\"lookup\""), "{proto:?}: {body}");
        assert!(
            body.contains("the qu") && !body.contains("jumps"),
            "{proto:?}: {body}"
        );
    }
    assert_eq!(server.stats().faults.get(FaultKind::CutCall), 8);
}

#[tokio::test]
async fn malformed_json_is_a_200_that_does_not_parse() {
    let server = server().await;
    let client = client();
    let model = "mock:faults=1,fault_kinds=malformed_json";
    for proto in PROTOS {
        let req = request(&server.base_url(), proto, model, false, "hi");
        let got = send(&client, &req).await;
        let (status, _, body) = got.whole();
        assert_eq!(status, StatusCode::OK);
        assert!(body.starts_with(br#"{"mock_fault":malformed,"#));
        assert!(serde_json::from_slice::<Value>(body).is_err());

        let req = request(&server.base_url(), proto, model, true, "hi");
        let got = send(&client, &req).await;
        assert_eq!(got.whole().0, StatusCode::OK);
        let events = got.events();
        assert!(serde_json::from_str::<Value>(&events[0].data).is_err());
        assert!(
            events[1..]
                .iter()
                .all(|e| e.data == "[DONE]" || serde_json::from_str::<Value>(&e.data).is_ok()),
            "only the first event is broken"
        );
    }
    assert_eq!(server.stats().faults.get(FaultKind::MalformedJson), 6);
}

#[tokio::test]
async fn a_slow_fault_delays_the_first_byte() {
    let server = server().await;
    let client = client();
    for proto in PROTOS {
        let model = "mock:faults=1,fault_kinds=slow,slow_delay=300ms";
        let req = request(&server.base_url(), proto, model, false, "hi");
        let got = send(&client, &req).await;
        let Got::Whole { elapsed, .. } = &got else {
            panic!("{got:?}")
        };
        assert!(*elapsed >= Duration::from_millis(300), "{elapsed:?}");
        assert_eq!(got.whole().0, StatusCode::OK);
        assert!(got.json().is_object());
    }
    assert_eq!(server.stats().faults.get(FaultKind::Slow), 3);
}

/// Whether a response is a whole, well-formed reply: a JSON body, or a stream of JSON events
/// that ends the way its protocol ends one.
fn complete(proto: Proto, stream: bool, got: &Got) -> bool {
    let Got::Whole { status, body, .. } = got else {
        return false;
    };
    if *status != StatusCode::OK {
        return false;
    }
    if !stream {
        return serde_json::from_slice::<Value>(body).is_ok();
    }
    let events = got.events();
    let json: Option<Vec<Value>> = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .map(|e| serde_json::from_str(&e.data).ok())
        .collect();
    let Some(json) = json else {
        return false;
    };
    match proto {
        Proto::OpenAi => events.last().is_some_and(|e| e.data == "[DONE]"),
        Proto::Anthropic => json.last().is_some_and(|v| v["type"] == "message_stop"),
        Proto::Gemini => json
            .last()
            .is_some_and(|v| v["candidates"][0]["finishReason"].is_string()),
    }
}

/// Sends each of `prompts` in each protocol up to `tries` times (as a client retrying), and
/// labels what came back.
async fn run_sequence(model: &str, prompts: usize, tries: usize) -> (Vec<String>, String) {
    let server = server().await;
    let client = client();
    let mut labels = Vec::new();
    for p in 0..prompts {
        for proto in PROTOS {
            let req = request(
                &server.base_url(),
                proto,
                model,
                p % 2 == 0,
                &format!("task {p}"),
            );
            for _ in 0..tries {
                let got = send(&client, &req).await;
                let ok = complete(proto, p % 2 == 0, &got);
                let label = if ok { "ok".to_string() } else { got.label() };
                labels.push(format!("{p} {proto:?} {label}"));
                if ok {
                    break;
                }
            }
        }
    }
    let counts = server.stats().faults.to_string();
    server.shutdown().await;
    (labels, counts)
}

#[tokio::test]
async fn the_same_seed_gives_the_same_faults() {
    let model = "mock:faults=0.4,seed=7,slow_delay=1ms";
    let (first, counts) = run_sequence(model, 24, 6).await;
    let (again, counts_again) = run_sequence(model, 24, 6).await;
    assert_eq!(first, again);
    assert_eq!(counts, counts_again);
    // Faults happened, and retried requests got through.
    assert!(first.iter().any(|l| !l.ends_with(" ok")), "{first:?}");
    let recovered = first
        .windows(2)
        .filter(|w| !w[0].ends_with(" ok") && w[1].ends_with(" ok"))
        .count();
    assert!(recovered > 5, "{first:?}");
    let (other, _) = run_sequence("mock:faults=0.4,seed=8,slow_delay=1ms", 24, 6).await;
    assert_ne!(first, other, "another seed, other faults");
}

mod clients {
    //! The provider adapters against each kind of fault: a complete call always gets through
    //! (the transport retries), a streamed call gets through or, when the stream broke after
    //! output, says so with `StreamInterrupted` (the loop starts such calls again).

    use super::*;
    use futures::StreamExt;
    use toolloop::message::Message;
    use toolloop::model::{Model, ModelError, ModelRequest, ModelSettings, ToolSpec};
    use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
    use toolloop::providers::gemini::{GeminiConfig, GeminiModel};
    use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
    use toolloop::stream::Accumulator;
    use toolloop::transport::http::{HttpTransport, RetryPolicy};

    fn transport() -> HttpTransport {
        let mut t = HttpTransport::new();
        t.retry = RetryPolicy {
            max_retries: 12,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(10),
        };
        t.first_byte_timeout = Duration::from_millis(150);
        t.first_byte_retries = 12;
        t
    }

    fn model(proto: Proto, base: &str, scenario: &str) -> Box<dyn Model> {
        match proto {
            Proto::OpenAi => {
                let mut c = OpenAiConfig::new(scenario).with_base_url(format!("{base}/v1"));
                c.transport = transport();
                Box::new(OpenAiModel::new(c))
            }
            Proto::Anthropic => {
                let mut c = AnthropicConfig::new(scenario);
                c.base_url = base.into();
                c.transport = transport();
                Box::new(AnthropicModel::new(c))
            }
            Proto::Gemini => {
                let mut c = GeminiConfig::new(scenario);
                c.base_url = base.into();
                c.transport = transport();
                Box::new(GeminiModel::new(c))
            }
        }
    }

    /// One call, complete or streamed; `Ok(None)` when a stream broke after output.
    async fn call(model: &dyn Model, prompt: &str, stream: bool) -> Result<Option<String>, String> {
        let messages = [Message::user(prompt)];
        let tools = [ToolSpec {
            name: "lookup".into(),
            description: "Looks something up.".into(),
            parameters: schema(),
        }];
        let settings = ModelSettings::default();
        let request = ModelRequest {
            messages: (&messages).into(),
            reminders: &[],
            tools: &tools,
            settings: &settings,
        };
        let response = if stream {
            let mut events = model.stream(&request).await.map_err(|e| e.to_string())?;
            let mut acc = Accumulator::new();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => acc.push(event),
                    Err(ModelError::StreamInterrupted(_)) => return Ok(None),
                    Err(e) => return Err(e.to_string()),
                }
            }
            acc.finish()
        } else {
            model.complete(&request).await.map_err(|e| e.to_string())?
        };
        let call = response
            .tool_calls
            .first()
            .ok_or_else(|| format!("no tool call in {response:?}"))?;
        Ok(Some(call.arguments.to_string()))
    }

    /// Calls with `kind` faults: `(kind, proto, stream, outcome)` for each.
    async fn calls_with(
        base: String,
        kind: FaultKind,
        proto: Proto,
    ) -> Vec<(FaultKind, Proto, bool, Result<Option<String>, String>)> {
        let scenario =
            format!("mock:faults=0.5,seed=3,fault_kinds={kind},retry_after=2ms,slow_delay=1s");
        let model = model(proto, &base, &scenario);
        let mut out = Vec::new();
        for stream in [false, true] {
            for n in 0..6 {
                let prompt = format!("{kind} {n}");
                out.push((
                    kind,
                    proto,
                    stream,
                    call(model.as_ref(), &prompt, stream).await,
                ));
            }
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_adapter_gets_through_every_kind_of_fault() {
        let server = server().await;
        let base = server.base_url();
        let runs = FaultKind::ALL.into_iter().flat_map(|kind| {
            PROTOS
                .into_iter()
                .filter(move |p| kind != FaultKind::Overloaded || *p == Proto::Anthropic)
                .map(move |proto| (kind, proto))
        });
        let results = futures::future::join_all(
            runs.map(|(kind, proto)| calls_with(base.clone(), kind, proto)),
        )
        .await;
        let mut interrupted = 0;
        for (kind, proto, stream, result) in results.into_iter().flatten() {
            match result {
                Ok(Some(args)) => assert_eq!(args, ARGS, "{kind} {proto:?} stream={stream}"),
                Ok(None) => {
                    assert!(stream, "only a stream can break after output");
                    assert!(
                        matches!(kind, FaultKind::ResetBody | FaultKind::CutCall),
                        "{kind} {proto:?} broke a stream after output"
                    );
                    interrupted += 1;
                }
                Err(e) => panic!("{kind} {proto:?} stream={stream}: {e}"),
            }
        }
        let stats = server.stats();
        for kind in FaultKind::ALL {
            assert!(stats.faults.get(kind) > 0, "no {kind}: {}", stats.faults);
        }
        assert!(interrupted > 0, "some streams broke after output");
        println!(
            "{} requests, faults: {}, {interrupted} streams interrupted after output",
            stats.requests, stats.faults
        );
    }
}

/// A reqwest client builder, with the process's TLS crypto provider installed first (reqwest
/// builds its TLS configuration from it, even for plain HTTP).
#[allow(dead_code)]
fn http_client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// A reqwest client with the defaults.
#[allow(dead_code)]
fn http_client() -> reqwest::Client {
    http_client_builder()
        .build()
        .expect("the HTTP client builds")
}
