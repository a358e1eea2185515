//! The OpenAI adapter over real HTTP: a small server on 127.0.0.1 plays the provider, and
//! `OpenAiModel` talks to it through the real transport (retries, limits, streaming). The tests of
//! retries and error classification run over both OpenAI APIs: Chat Completions and Responses
//! (`ResponsesModel`), which share the error format and the rules.

use crate::wire;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolloop::message::{Message, ToolCall};
use toolloop::model::{
    FinishReason, Model, ModelError, ModelRequest, ModelResponse, ModelSettings, ToolSpec,
};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use toolloop::stream::StreamEvent;
use toolloop::transport::http::RetryPolicy;
use wire::Server;

/// Starts a server (see [`wire::serve_with`]); returns its base URL, `…/v1`, and the server.
async fn serve(reply: impl Fn(u32) -> Response + Send + Sync + 'static) -> (String, Server) {
    let (url, server) = wire::serve_with(reply).await;
    (format!("{url}/v1"), server)
}

fn json_response(status: u16, body: &Value, headers: &[(&str, &str)]) -> Response {
    let mut b = Response::builder()
        .status(status)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::from(body.to_string())).unwrap()
}

fn sse_text(chunks: &[Value]) -> String {
    let mut s = String::new();
    for c in chunks {
        s.push_str(&format!("data: {c}\n\n"));
    }
    s
}

/// A streamed body: the pieces, a short pause between them, and optionally a broken connection
/// at the end.
fn sse_response(pieces: Vec<String>, break_at_end: bool) -> Response {
    let mut items: Vec<Result<Bytes, std::io::Error>> =
        pieces.into_iter().map(|p| Ok(Bytes::from(p))).collect();
    if break_at_end {
        items.push(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "server dropped the stream",
        )));
    }
    let stream = futures::stream::iter(items).then(|item| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        item
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn config(base_url: &str) -> OpenAiConfig {
    let mut c = OpenAiConfig::new("test-model").with_base_url(base_url);
    c.api_key = Some("sk-test".into());
    c.transport.retry = RetryPolicy {
        max_retries: 2,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_secs(2),
    };
    c
}

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "get_weather".into(),
        description: "Weather for a city".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}),
    }]
}

/// The two OpenAI APIs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Api {
    Chat,
    Responses,
}

const APIS: [Api; 2] = [Api::Chat, Api::Responses];

/// A model of `api` at `base_url`, configured as [`config`] does.
fn model_of(api: Api, base_url: &str) -> Box<dyn Model> {
    match api {
        Api::Chat => Box::new(OpenAiModel::new(config(base_url))),
        Api::Responses => {
            let chat = config(base_url);
            let mut c = ResponsesConfig::new("test-model").with_base_url(base_url);
            c.api_key = chat.api_key;
            c.transport = chat.transport;
            Box::new(ResponsesModel::new(c))
        }
    }
}

/// A complete text reply of `api`.
fn text_reply_of(api: Api, text: &str) -> Value {
    match api {
        Api::Chat => text_reply(text),
        Api::Responses => json!({"id": "resp_1", "object": "response", "status": "completed",
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "usage": {"input_tokens": 5, "output_tokens": 2}}),
    }
}

/// A streamed text reply of `api`.
fn text_stream_of(api: Api, text: &str) -> String {
    match api {
        Api::Chat => sse_text(&[json!({"choices": [{"index": 0,
            "delta": {"content": text}, "finish_reason": "stop"}]})]),
        Api::Responses => sse_text(&[
            json!({"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1",
                   "content_index": 0, "delta": text}),
            json!({"type": "response.completed", "response": {"status": "completed",
                   "output": [], "usage": {"input_tokens": 5, "output_tokens": 2}}}),
        ]),
    }
}

/// Calls the model once, complete or streamed.
async fn call(model: &dyn Model, stream: bool) -> Result<ModelResponse, ModelError> {
    let messages = vec![
        Message::system("be brief"),
        Message::user("weather in Paris?"),
    ];
    let tools = tools();
    let settings = ModelSettings::default();
    let req = ModelRequest {
        messages: (&messages).into(),
        reminders: &[],
        tools: &tools,
        settings: &settings,
    };
    if stream {
        ModelResponse::from_stream(model.stream(&req).await?).await
    } else {
        model.complete(&req).await
    }
}

fn tool_call_reply() -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "call_a", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 9,
                  "prompt_tokens_details": {"cached_tokens": 32}}
    })
}

fn text_reply(text: &str) -> Value {
    json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
}

fn error_body(message: &str, kind: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
}

#[tokio::test]
async fn non_streamed_round_trip_sends_key_and_tools() {
    let (url, server) = serve(|_| json_response(200, &tool_call_reply(), &[])).await;
    let model = OpenAiModel::new(config(&url));
    let r = call(&model, false).await.unwrap();
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].id, "call_a");
    assert_eq!(r.tool_calls[0].arguments, json!({"city": "Paris"}));
    let u = r.usage.unwrap();
    assert_eq!(
        (u.input_tokens, u.output_tokens, u.cache_read_tokens),
        (50, 9, 32)
    );

    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["authorization"], "Bearer sk-test");
    assert_eq!(seen[0].headers["content-type"], "application/json");
    let b = &seen[0].body;
    assert_eq!(b["model"], "test-model");
    assert_eq!(
        b["messages"][1],
        json!({"role": "user", "content": "weather in Paris?"})
    );
    assert_eq!(b["tools"][0]["function"]["name"], "get_weather");
    assert!(b.get("stream").is_none());
}

#[tokio::test]
async fn no_key_sends_no_authorization_header() {
    let (url, server) = serve(|_| json_response(200, &text_reply("hi"), &[])).await;
    let mut c = config(&url);
    c.api_key = None;
    let r = call(&OpenAiModel::new(c), false).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("hi"));
    assert!(server.requests()[0].headers.get("authorization").is_none());
}

fn streamed_tool_call_chunks() -> Vec<String> {
    vec![
        ": keep-alive\n\n".to_string(),
        sse_text(&[json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Check"}}]})]),
        sse_text(&[
            json!({"choices": [{"index": 0, "delta": {"content": "ing."}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_s",
                "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}}]}),
        ]),
        // An event split across two network chunks.
        "data: {\"choices\": [{\"index\": 0, \"delta\": {\"tool_calls\": [{\"index\": 0, \"function\": {\"argu".to_string(),
        "ments\": \"{\\\"city\\\":\\\"Paris\\\"}\"}}]}}]}\n\n".to_string(),
        sse_text(&[
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 12}}),
        ]),
        "data: [DONE]\n\n".to_string(),
    ]
}

#[tokio::test]
async fn streamed_round_trip() {
    let (url, server) = serve(|_| sse_response(streamed_tool_call_chunks(), false)).await;
    let model = OpenAiModel::new(config(&url));
    let r = call(&model, true).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("Checking."));
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].id, "call_s");
    assert_eq!(r.tool_calls[0].name, "get_weather");
    assert_eq!(r.tool_calls[0].arguments, json!({"city": "Paris"}));
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(r.usage.unwrap().output_tokens, 12);
    let seen = server.requests();
    assert_eq!(seen[0].body["stream"], true);
    assert_eq!(
        seen[0].body["stream_options"],
        json!({"include_usage": true})
    );
    assert_eq!(seen[0].headers["authorization"], "Bearer sk-test");
}

#[tokio::test]
async fn rate_limit_with_retry_after_ms_then_success() {
    for api in APIS {
        let (url, server) = serve(move |n| {
            if n == 0 {
                json_response(
                    429,
                    &error_body("Rate limit reached", "requests"),
                    &[("retry-after-ms", "150")],
                )
            } else {
                json_response(200, &text_reply_of(api, "done"), &[])
            }
        })
        .await;
        let model = model_of(api, &url);
        let start = Instant::now();
        let r = call(model.as_ref(), false).await.unwrap();
        assert_eq!(r.text.as_deref(), Some("done"), "{api:?}");
        assert_eq!(server.count(), 2, "{api:?}");
        // The backoff alone is ~1 ms: the wait shows the header was honoured.
        assert!(
            start.elapsed() >= Duration::from_millis(150),
            "{api:?}: {:?}",
            start.elapsed()
        );
    }
}

#[tokio::test]
async fn server_errors_twice_then_success() {
    for (api, stream) in APIS.into_iter().flat_map(|a| [(a, false), (a, true)]) {
        let (url, server) = serve(move |n| {
            if n < 2 {
                json_response(
                    500,
                    &error_body("The server had an error", "server_error"),
                    &[],
                )
            } else if stream {
                sse_response(vec![text_stream_of(api, "ok")], false)
            } else {
                json_response(200, &text_reply_of(api, "ok"), &[])
            }
        })
        .await;
        let r = call(model_of(api, &url).as_ref(), stream).await.unwrap();
        assert_eq!(r.text.as_deref(), Some("ok"), "{api:?}");
        assert_eq!(server.count(), 3, "{api:?} stream: {stream}");
    }
}

#[tokio::test]
async fn retries_exhausted_give_the_typed_error() {
    for api in APIS {
        let (url, server) = serve(|_| {
        json_response(
            503,
            &json!({"error": {"message": "overloaded", "type": "server_error", "code": "busy"}}),
            &[],
        )
    })
    .await;
        let err = call(model_of(api, &url).as_ref(), false).await.unwrap_err();
        assert_eq!(server.count(), 3, "1 attempt + 2 retries");
        match err {
            ModelError::Api(e) => {
                assert_eq!(e.status, 503);
                assert_eq!(e.error_type.as_deref(), Some("server_error"));
                assert_eq!(e.code.as_deref(), Some("busy"));
                assert_eq!(e.message, "overloaded");
                assert!(e.retryable);
            }
            other => panic!("expected an API error, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    for api in APIS {
        let (url, server) = serve(|_| {
            json_response(
                400,
                &error_body("Unsupported parameter: 'stop'", "invalid_request_error"),
                &[],
            )
        })
        .await;
        let err = call(model_of(api, &url).as_ref(), true).await.unwrap_err();
        assert_eq!(server.count(), 1);
        assert!(
            matches!(err, ModelError::Api(ref e) if e.status == 400 && !e.retryable),
            "{api:?}: {err:?}"
        );
    }
}

#[tokio::test]
async fn a_server_without_tools_gives_tools_unsupported() {
    for (api, stream) in APIS.into_iter().flat_map(|a| [(a, false), (a, true)]) {
        let (url, server) = serve(|_| {
            json_response(
                400,
                &error_body(
                    "registry.ollama.ai/library/gemma:2b does not support tools",
                    "api_error",
                ),
                &[],
            )
        })
        .await;
        let err = call(model_of(api, &url).as_ref(), stream)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ModelError::ToolsUnsupported(ref m) if m.contains("does not support tools")),
            "{api:?}: {err:?}"
        );
        assert_eq!(server.count(), 1);
    }
}

/// llama.cpp's server refused a request over its context with a 500 before it moved to a 400
/// (ggml-org/llama.cpp#15780): a status the transport retries, but not this error.
#[tokio::test]
async fn a_context_overflow_is_typed_and_not_retried_even_as_a_500() {
    for (api, stream) in APIS.into_iter().flat_map(|a| [(a, false), (a, true)]) {
        let (url, server) = serve(|_| {
            json_response(
                500,
                &json!({"error": {"code": 500, "message": "the request exceeds the available context size. try increasing the context size or enable context shift", "type": "exceed_context_size_error", "n_prompt_tokens": 1407, "n_ctx": 256}}),
                &[],
            )
        })
        .await;
        let err = call(model_of(api, &url).as_ref(), stream)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ModelError::ContextOverflow(ref o)
                if o.input_tokens == Some(1407) && o.limit == Some(256) && o.status == 500),
            "{api:?}: {err:?}"
        );
        assert!(!err.is_retryable());
        assert_eq!(server.count(), 1, "{api:?} {stream}");
    }
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused() {
    let big = "x".repeat(10_000);
    let (url, _server) = serve(move |n| {
        if n == 0 {
            json_response(200, &text_reply(&big), &[])
        } else {
            sse_response(
                vec![
                    sse_text(&[
                        json!({"choices": [{"index": 0, "delta": {"content": "y".repeat(600)}}]})
                    ]);
                    4
                ],
                false,
            )
        }
    })
    .await;
    let mut c = config(&url);
    c.transport.max_body_bytes = 1024;
    let model = OpenAiModel::new(c);
    let err = call(&model, false).await.unwrap_err();
    assert!(
        matches!(err, ModelError::BodyTooLarge { limit: 1024 }),
        "{err:?}"
    );
    let err = call(&model, true).await.unwrap_err();
    assert!(
        matches!(err, ModelError::BodyTooLarge { limit: 1024 }),
        "{err:?}"
    );
}

/// Reads one HTTP request (headers and a `content-length` body) from a raw connection.
async fn read_request(sock: &mut tokio::net::TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let n = sock.read(&mut tmp).await.unwrap();
        if n == 0 {
            return buf;
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return buf;
            }
        }
    }
}

#[tokio::test]
async fn a_connection_closed_before_the_response_is_retried() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicU32::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            let n = c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                read_request(&mut sock).await;
                if n == 0 {
                    // Hang up without a response.
                    drop(sock);
                    return;
                }
                let body = text_reply("after reconnect").to_string();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                sock.write_all(head.as_bytes()).await.unwrap();
                sock.write_all(body.as_bytes()).await.unwrap();
                sock.shutdown().await.ok();
            });
        }
    });
    let model = OpenAiModel::new(config(&format!("http://{addr}/v1")));
    let r = call(&model, false).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("after reconnect"));
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_stream_that_delivered_text_then_broke_is_not_replayed() {
    let (url, server) = serve(|_| {
        sse_response(
            vec![sse_text(&[
                json!({"choices": [{"index": 0, "delta": {"content": "Hello"}}]}),
            ])],
            true,
        )
    })
    .await;
    let model = OpenAiModel::new(config(&url));
    let messages = [Message::user("hi")];
    let settings = ModelSettings::default();
    let req = ModelRequest {
        messages: (&messages).into(),
        reminders: &[],
        tools: &[],
        settings: &settings,
    };
    let items: Vec<_> = model.stream(&req).await.unwrap().collect().await;
    assert_eq!(server.count(), 1, "never replayed");
    assert!(
        matches!(&items[0], Ok(StreamEvent::TextDelta(t)) if t == "Hello"),
        "{items:?}"
    );
    assert!(
        matches!(items.last(), Some(Err(ModelError::StreamInterrupted(_)))),
        "{items:?}"
    );
    assert_eq!(items.len(), 2);
}

#[tokio::test]
async fn a_stream_that_broke_before_any_output_is_opened_again() {
    let (url, server) = serve(|n| {
        if n == 0 {
            // Only a role delta (no output), then the connection breaks.
            sse_response(
                vec![sse_text(&[
                    json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
                ])],
                true,
            )
        } else {
            sse_response(streamed_tool_call_chunks(), false)
        }
    })
    .await;
    let r = call(&OpenAiModel::new(config(&url)), true).await.unwrap();
    assert_eq!(server.count(), 2);
    assert_eq!(r.text.as_deref(), Some("Checking."));
    assert_eq!(r.tool_calls.len(), 1);
}

#[tokio::test]
async fn an_error_object_inside_a_200_stream_is_a_typed_error() {
    let (url, server) = serve(|_| {
        let error = json!({"error": {
            "message": "Tool call validation failed: parameters for tool get_weather did not match schema",
            "type": "invalid_request_error", "code": "tool_use_failed",
            "failed_generation": "{\"name\": \"get_weather\"}", "status_code": 400}});
        sse_response(
            vec![
                sse_text(&[json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]),
                sse_text(&[json!({"choices": [{"index": 0, "delta": {"reasoning": "thinking"}}]})]),
                format!("event: error\ndata: {error}\n\n"),
            ],
            false,
        )
    })
    .await;
    let err = call(&OpenAiModel::new(config(&url)), true)
        .await
        .unwrap_err();
    assert_eq!(server.count(), 1, "a 400-class error is not retried");
    match err {
        ModelError::Api(e) => {
            assert_eq!(e.status, 200);
            assert_eq!(e.code.as_deref(), Some("tool_use_failed"));
            assert_eq!(e.error_type.as_deref(), Some("invalid_request_error"));
            assert!(e.message.starts_with("Tool call validation failed"));
            assert!(!e.retryable);
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn the_next_turn_replays_calls_and_results_validly() {
    let (url, server) = serve(|_| json_response(200, &text_reply("It is sunny."), &[])).await;
    let model = OpenAiModel::new(config(&url));
    let bad = ToolCall::from_raw_arguments("call_b".into(), "get_weather".into(), "{\"city\":");
    let messages = vec![
        Message::user("weather?"),
        Message::Assistant(toolloop::message::AssistantMessage {
            text: None,
            tool_calls: vec![bad],
            parts: vec![],
        }),
        Message::Tool(toolloop::message::ToolResult {
            call_id: "call_b".into(),
            name: "get_weather".into(),
            content: "arguments were not valid JSON".into(),
            is_error: true,
            images: Vec::new(),
        }),
    ];
    let tools = tools();
    let settings = ModelSettings::default();
    let reminders = vec!["stay on task".to_string()];
    let req = ModelRequest {
        messages: (&messages).into(),
        reminders: &reminders,
        tools: &tools,
        settings: &settings,
    };
    let r = model.complete(&req).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("It is sunny."));
    let seen = server.requests();
    let m = &seen[0].body["messages"];
    assert_eq!(m[1]["tool_calls"][0]["function"]["arguments"], "{}");
    assert_eq!(m[2]["tool_call_id"], "call_b");
    assert_eq!(
        m[3],
        json!({"role": "user", "content": "<system-reminder>stay on task</system-reminder>"})
    );
}

/// The same loops against the mock, streamed (Server-Sent Events, text and arguments in small
/// deltas) and not: the transcripts are the same, and the text deltas make the answers.
#[tokio::test]
async fn streamed_and_complete_loops_give_the_same_transcript_over_http() {
    use toolloop::agent::Agent;
    use toolloop::event::Event;
    use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Echo {
        /// What to echo.
        text: String,
    }
    let server = toolloop_mock::start(toolloop_mock::MockOptions::default())
        .await
        .unwrap();
    let url = format!("{}/v1", server.base_url());
    for scenario in [
        "mock:rounds=3,parallel=2,distinct=true",
        // One character per delta: arguments and text cut everywhere, non-ASCII included.
        "mock:rounds=2,parallel=3,chunk=1",
    ] {
        let run = |stream: bool| {
            let url = url.clone();
            async move {
                let deltas = Arc::new(std::sync::Mutex::new(String::new()));
                let seen = deltas.clone();
                let echo = tool_fn(
                    "echo",
                    "Echoes its input.",
                    |args: Echo, _ctx: ToolContext| async move {
                        Ok::<_, ToolError>(ToolOutput::text(args.text))
                    },
                );
                let agent = Agent::builder(OpenAiModel::new(
                    OpenAiConfig::new(scenario).with_base_url(url),
                ))
                .tool(echo)
                .stream(stream)
                .on_event(move |e| {
                    if let Event::TextDelta { text, .. } = e {
                        seen.lock().unwrap().push_str(text);
                    }
                })
                .build()
                .unwrap();
                let out = agent.prompt("go — ünïcode").await;
                assert!(out.error.is_none(), "{scenario}: {:?}", out.error);
                let deltas = deltas.lock().unwrap().clone();
                (out, deltas)
            }
        };
        let (complete, no_deltas) = run(false).await;
        let (streamed, deltas) = run(true).await;
        // The mock numbers its call ids across requests: the ids differ, and nothing else.
        let without_ids = |messages: &[Message]| {
            let mut messages = messages.to_vec();
            for m in &mut messages {
                match m {
                    Message::Assistant(a) => a.tool_calls.iter_mut().for_each(|c| c.id.clear()),
                    Message::Tool(r) => r.call_id.clear(),
                    _ => {}
                }
            }
            messages
        };
        assert_eq!(
            without_ids(&complete.messages),
            without_ids(&streamed.messages),
            "{scenario}"
        );
        assert!(complete.messages.len() > 4, "{scenario}");
        assert!(no_deltas.is_empty());
        let texts: String = streamed
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .map(Message::text)
            .collect();
        assert_eq!(deltas, texts, "{scenario}");
        assert!(!deltas.is_empty(), "{scenario}");
    }
    server.shutdown().await;
}
