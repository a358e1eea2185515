//! The Anthropic adapter against a real HTTP server on 127.0.0.1: headers, complete and streamed
//! round trips, retries on 529 honouring `retry-after`, and error events inside a stream.
#![cfg(feature = "http")]

use crate::wire;

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use toolloop::message::{Message, ToolResult};
use toolloop::model::{
    FinishReason, Model, ModelError, ModelRequest, ModelResponse, ModelSettings, ToolSpec,
};
use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
use toolloop::transport::http::{HttpTransport, RetryPolicy};
use wire::{Reply, serve};

/// Anthropic's stream: each event named by its type.
fn sse_reply(events: &[Value]) -> Reply {
    let mut body = String::new();
    for e in events {
        body.push_str(&format!(
            "event: {}\ndata: {}\n\n",
            e["type"].as_str().unwrap(),
            e
        ));
    }
    Reply::sse(body)
}

fn model(base_url: &str, retries: u32) -> AnthropicModel {
    let mut transport = HttpTransport::new();
    transport.retry = RetryPolicy {
        max_retries: retries,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_secs(2),
    };
    AnthropicModel::new(AnthropicConfig {
        base_url: base_url.to_string(),
        api_key: Some("sk-test".into()),
        transport,
        ..AnthropicConfig::new("claude-test")
    })
}

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "read".into(),
        description: "Reads a file.".into(),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    }]
}

fn tool_use_message() -> Value {
    json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [
            {"type": "thinking", "thinking": "two files", "signature": "c2ln"},
            {"type": "text", "text": "Reading both."},
            {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
            {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"path": "b"}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 5},
    })
}

fn final_message() -> Value {
    json!({"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn", "usage": {"input_tokens": 3, "output_tokens": 1}})
}

fn request<'a>(
    messages: &'a [Message],
    tools: &'a [ToolSpec],
    settings: &'a ModelSettings,
) -> ModelRequest<'a> {
    ModelRequest {
        messages: messages.into(),
        reminders: &[],
        tools,
        settings,
    }
}

#[tokio::test]
async fn complete_round_trip_sends_headers_and_replays_the_turn() {
    let (url, seen) = serve(vec![
        Reply::json(200, tool_use_message()),
        Reply::json(200, final_message()),
    ])
    .await;
    let m = model(&url, 0);
    let tools = tools();
    let settings = ModelSettings::default();
    let mut transcript = vec![Message::system("sys"), Message::user("read a and b")];
    let r = m
        .complete(&request(&transcript, &tools, &settings))
        .await
        .unwrap();
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(r.text.as_deref(), Some("Reading both."));
    assert_eq!(r.tool_calls.len(), 2);
    let u = r.usage.unwrap();
    assert_eq!(
        (u.input_tokens, u.cache_read_tokens, u.cache_write_tokens),
        (1015, 1000, 5)
    );

    transcript.push(Message::Assistant(r.to_message()));
    for (i, c) in r.tool_calls.iter().enumerate() {
        transcript.push(Message::Tool(ToolResult {
            call_id: c.id.clone(),
            name: c.name.clone(),
            content: format!("content {i}"),
            is_error: i == 1,
            images: Vec::new(),
        }));
    }
    let r2 = m
        .complete(&request(&transcript, &tools, &settings))
        .await
        .unwrap();
    assert_eq!(r2.text.as_deref(), Some("done"));

    let seen = seen.requests();
    assert_eq!(seen.len(), 2);
    let (uri, headers, first) = (&seen[0].uri, &seen[0].headers, &seen[0].body);
    assert_eq!(uri, "/v1/messages");
    assert_eq!(headers["x-api-key"], "sk-test");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert_eq!(first["system"][0]["text"], "sys");
    assert!(first.get("stream").is_none());
    let second = &seen[1].body;
    let msgs = second["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    // The assistant turn goes back as received: signed thinking first.
    assert_eq!(msgs[1]["content"], tool_use_message()["content"]);
    let results = msgs[2]["content"].as_array().unwrap();
    assert_eq!(results[0]["tool_use_id"], "toolu_1");
    assert_eq!(results[1]["tool_use_id"], "toolu_2");
    assert_eq!(results[1]["is_error"], true);
}

fn streamed_tool_use() -> Vec<Value> {
    vec![
        json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 7, "cache_read_input_tokens": 100, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "ping"}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "look."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_9", "name": "read", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"Car"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "go.toml\"}"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 30}}),
        json!({"type": "message_stop"}),
    ]
}

#[tokio::test]
async fn streamed_round_trip() {
    let (url, seen) = serve(vec![sse_reply(&streamed_tool_use())]).await;
    let m = model(&url, 0);
    let tools = tools();
    let settings = ModelSettings::default();
    let msgs = [Message::user("read Cargo.toml")];
    let stream = m.stream(&request(&msgs, &tools, &settings)).await.unwrap();
    let r = ModelResponse::from_stream(stream).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("Let me look."));
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].id, "toolu_9");
    assert_eq!(r.tool_calls[0].arguments, json!({"path": "Cargo.toml"}));
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    let u = r.usage.unwrap();
    assert_eq!(
        (u.input_tokens, u.output_tokens, u.cache_read_tokens),
        (107, 30, 100)
    );
    let seen = seen.requests();
    assert_eq!(seen[0].body["stream"], true);
    assert_eq!(seen[0].headers["anthropic-version"], "2023-06-01");
}

fn overloaded() -> Reply {
    Reply::json(
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    )
    .header("retry-after", "0.3")
}

#[tokio::test]
async fn overloaded_529_is_retried_after_the_servers_wait() {
    let (url, seen) = serve(vec![overloaded(), Reply::json(200, final_message())]).await;
    let m = model(&url, 2);
    let settings = ModelSettings::default();
    let msgs = [Message::user("hi")];
    let started = Instant::now();
    let r = m.complete(&request(&msgs, &[], &settings)).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("done"));
    assert_eq!(seen.count(), 2);
    // The backoff alone would be ~1 ms; the server asked for 300 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(280),
        "{:?}",
        started.elapsed()
    );

    // Without retries the typed error comes through.
    let (url, _) = serve(vec![overloaded()]).await;
    let err = model(&url, 0)
        .complete(&request(&msgs, &[], &settings))
        .await
        .unwrap_err();
    match err {
        ModelError::Api(e) => {
            assert_eq!(e.status, 529);
            assert_eq!(e.error_type.as_deref(), Some("overloaded_error"));
            assert!(e.retryable);
            assert_eq!(e.retry_after, Some(Duration::from_millis(300)));
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn rate_limit_and_stream_open_are_retried_too() {
    let limited = Reply::json(
        429,
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
    )
    .header("retry-after", "0");
    let (url, seen) = serve(vec![limited, sse_reply(&streamed_tool_use())]).await;
    let settings = ModelSettings::default();
    let msgs = [Message::user("hi")];
    let stream = model(&url, 1)
        .stream(&request(&msgs, &[], &settings))
        .await
        .unwrap();
    let r = ModelResponse::from_stream(stream).await.unwrap();
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(seen.count(), 2);
}

fn error_stream() -> Reply {
    sse_reply(&[
        json!({"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 0}}}),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ])
}

#[tokio::test]
async fn error_event_inside_a_stream() {
    let settings = ModelSettings::default();
    let msgs = [Message::user("hi")];
    // Without retries: a typed, retryable error.
    let (url, _) = serve(vec![error_stream()]).await;
    let stream = model(&url, 0)
        .stream(&request(&msgs, &[], &settings))
        .await
        .unwrap();
    match ModelResponse::from_stream(stream).await {
        Err(ModelError::Api(e)) => {
            assert_eq!(e.error_type.as_deref(), Some("overloaded_error"));
            assert_eq!(e.message, "Overloaded");
            assert!(e.retryable);
        }
        other => panic!("expected the stream's error, got {other:?}"),
    }
    // With a retry: the stream had delivered no output, so it is opened again and succeeds.
    let (url, seen) = serve(vec![error_stream(), sse_reply(&streamed_tool_use())]).await;
    let stream = model(&url, 1)
        .stream(&request(&msgs, &[], &settings))
        .await
        .unwrap();
    let r = ModelResponse::from_stream(stream).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("Let me look."));
    assert_eq!(seen.count(), 2);
}

#[tokio::test]
async fn client_errors_are_typed_and_not_retried() {
    let settings = ModelSettings::default();
    let msgs = [Message::user("hi")];
    for (status, kind) in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
    ] {
        let (url, seen) = serve(vec![Reply::json(
            status,
            json!({"type": "error", "error": {"type": kind, "message": "no"}}),
        )])
        .await;
        match model(&url, 2)
            .complete(&request(&msgs, &[], &settings))
            .await
        {
            Err(ModelError::Api(e)) => {
                assert_eq!(
                    (e.status, e.error_type.as_deref(), e.retryable),
                    (status, Some(kind), false)
                );
            }
            other => panic!("{status}: expected an API error, got {other:?}"),
        }
        assert_eq!(seen.count(), 1, "{status} is not retried");
    }
}
