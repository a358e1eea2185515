//! The OpenAI adapter's codec, in isolation: encoding a request body and decoding a reply.
//!
//! Each figure is given beside a baseline measured in the same run: for decoding, parsing the
//! same bytes into a `serde_json::Value` (what any client does first); for encoding, serializing
//! the same body held as a `serde_json::Value`. The conversation is six rounds of two parallel
//! calls, as in the `mock_loops` benchmark.
//!
//! Run: `cargo bench -p toolloop --bench codec`

use serde_json::{Value, json};
use std::hint::black_box;
use std::time::Instant;
use toolloop::message::{AssistantMessage, Message, ToolCall, ToolResult};
use toolloop::model::{ModelRequest, ModelSettings, ToolSpec};
use toolloop::providers::openai::{
    OpenAiConfig, OpenAiModel, OpenAiSession, WireRequest, build_request_body, decode_recorded,
};

/// Nanoseconds per call of `f`, best of 5 batches.
fn time(iterations: u32, mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                f();
            }
            start.elapsed().as_nanos() as f64 / f64::from(iterations)
        })
        .fold(f64::INFINITY, f64::min)
}

fn conversation(rounds: usize) -> Vec<Message> {
    let mut messages = vec![Message::user("go")];
    for r in 0..rounds {
        let calls: Vec<ToolCall> = (0..2)
            .map(|i| ToolCall {
                id: format!("call_{r}_{i}"),
                name: "echo".into(),
                arguments: json!({"text": format!("hello #{}", r * 2 + i)}),
                invalid_arguments: None,
                provider_data: None,
            })
            .collect();
        let results: Vec<Message> = calls
            .iter()
            .map(|c| {
                Message::Tool(ToolResult {
                    call_id: c.id.clone(),
                    name: c.name.clone(),
                    content: json!({"success": true, "message": "ok", "data": c.arguments})
                        .to_string(),
                    is_error: false,
                    images: Vec::new(),
                })
            })
            .collect();
        messages.push(Message::Assistant(AssistantMessage {
            text: None,
            tool_calls: calls,
            parts: Vec::new(),
        }));
        messages.extend(results);
    }
    messages
}

fn main() {
    let tools = [ToolSpec {
        name: "echo".into(),
        description: "Echoes its input.".into(),
        parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
    }];
    let config = OpenAiConfig::new("mock").with_base_url("http://127.0.0.1:1/v1");
    let settings = ModelSettings::default();
    let messages = conversation(5);
    let request = ModelRequest {
        messages: (&messages).into(),
        reminders: &[],
        tools: &tools,
        settings: &settings,
    };
    let as_value = build_request_body(&request, &config, false);
    let bytes = serde_json::to_vec(&WireRequest::new(&request, &config, false)).expect("body");
    let encode = time(20_000, || {
        black_box(serde_json::to_vec(&WireRequest::new(black_box(&request), &config, false)).ok());
    });
    let encode_value = time(20_000, || {
        black_box(serde_json::to_vec(black_box(&as_value)).ok());
    });
    println!(
        "encode a {} B request: {encode:.0} ns; serializing the same body held as a Value: \
         {encode_value:.0} ns ({:.2}x)",
        bytes.len(),
        encode / encode_value
    );

    // In a run, the adapter encodes only the round's new messages (an assistant turn and its
    // two results) and reuses the rest from the run's prefix cache.
    let model = OpenAiModel::new(config.clone());
    let earlier = &messages[..messages.len() - 3];
    let body = |messages: &[Message], session: Option<&OpenAiSession>| {
        let request = ModelRequest {
            messages: messages.into(),
            ..request
        };
        match session {
            Some(session) => black_box(session.request_body(&request, false).ok()),
            None => black_box(model.request_body(&request, false).ok()),
        };
    };
    let uncached = time(20_000, || body(&messages, None));
    let both = time(20_000, || {
        let session = OpenAiSession::new(&model);
        body(earlier, Some(&session));
        body(&messages, Some(&session));
    });
    let first = time(20_000, || {
        let session = OpenAiSession::new(&model);
        body(earlier, Some(&session));
    });
    let cached = both - first;
    println!(
        "the adapter's body for that request: {uncached:.0} ns; with the earlier messages' \
         encoding kept from the run's previous request: {cached:.0} ns ({:.2}x)",
        cached / uncached
    );

    let reply = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "mock",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": null, "message": {
            "role": "assistant", "content": null, "refusal": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"hello #1\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"hello #2\"}"}}]}}],
        "usage": {"prompt_tokens": 66, "completion_tokens": 16, "total_tokens": 82}})
    .to_string();
    let reply = reply.as_bytes();
    let decode = time(100_000, || {
        black_box(decode_recorded(200, black_box(reply), false));
    });
    let parse_value = time(100_000, || {
        black_box(serde_json::from_slice::<Value>(black_box(reply)).ok());
    });
    println!(
        "decode a {} B reply with two calls: {decode:.0} ns; parsing it into a Value: \
         {parse_value:.0} ns ({:.2}x)",
        reply.len(),
        decode / parse_value
    );
}
