//! The Gemini adapter against a real HTTP server on 127.0.0.1: endpoints and key header,
//! complete and streamed round trips with parallel calls and thought signatures, and the
//! `RetryInfo` delay honoured on a retry.
#![cfg(feature = "http")]

use crate::wire;

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use toolloop::message::{AssistantMessage, Message, ToolCall, ToolResult};
use toolloop::model::{
    FinishReason, Model, ModelError, ModelRequest, ModelResponse, ModelSettings, ToolSpec,
};
use toolloop::providers::gemini::{GeminiConfig, GeminiModel, PLACEHOLDER_THOUGHT_SIGNATURE};
use toolloop::transport::http::{HttpTransport, RetryPolicy};
use wire::{Reply, serve};

/// Gemini's stream (`alt=sse`): one chunk an event.
fn sse_reply(chunks: &[Value]) -> Reply {
    Reply::sse(
        chunks
            .iter()
            .map(|c| format!("data: {c}\r\n\r\n"))
            .collect(),
    )
}

fn model(base_url: &str, retries: u32) -> GeminiModel {
    named_model(base_url, retries, "gemini-test")
}

fn named_model(base_url: &str, retries: u32, name: &str) -> GeminiModel {
    let mut transport = HttpTransport::new();
    transport.retry = RetryPolicy {
        max_retries: retries,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_secs(2),
    };
    GeminiModel::new(GeminiConfig {
        base_url: base_url.to_string(),
        api_key: Some("g-test".into()),
        transport,
        ..GeminiConfig::new(name)
    })
}

fn tools() -> Vec<ToolSpec> {
    ["get_weather", "get_time"]
        .into_iter()
        .map(|n| ToolSpec {
            name: n.into(),
            description: format!("{n} for a city"),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        })
        .collect()
}

fn parallel_calls() -> Value {
    json!({
        "candidates": [{
            "content": {"role": "model", "parts": [
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "U0lHX0E="},
                {"functionCall": {"name": "get_time", "args": {"city": "Paris"}}},
            ]},
            "finishReason": "STOP",
        }],
        "usageMetadata": {"promptTokenCount": 40, "candidatesTokenCount": 12, "totalTokenCount": 52},
    })
}

fn final_text() -> Value {
    json!({
        "candidates": [{"content": {"role": "model", "parts": [{"text": "Sunny, 12:00."}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 70, "candidatesTokenCount": 5},
    })
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

fn answer(transcript: &mut Vec<Message>, r: &ModelResponse) {
    transcript.push(Message::Assistant(r.to_message()));
    // Results recorded in reverse order: the adapter must send them in call order.
    for c in r.tool_calls.iter().rev() {
        transcript.push(Message::Tool(ToolResult {
            call_id: c.id.clone(),
            name: c.name.clone(),
            content: json!({"success": true, "message": c.name}).to_string(),
            is_error: false,
            images: Vec::new(),
        }));
    }
}

fn check_second_request(body: &Value) {
    let contents = body["contents"].as_array().unwrap();
    assert_eq!(contents.len(), 3);
    assert_eq!(contents[1]["role"], "model");
    assert_eq!(
        contents[1]["parts"],
        parallel_calls()["candidates"][0]["content"]["parts"]
    );
    let parts = contents[2]["parts"].as_array().unwrap();
    assert_eq!(contents[2]["role"], "user");
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0]["functionResponse"]["name"], "get_weather");
    assert_eq!(parts[1]["functionResponse"]["name"], "get_time");
    assert_eq!(
        parts[1]["functionResponse"]["response"]["output"]["message"],
        "get_time"
    );
}

#[tokio::test]
async fn complete_round_trip_with_parallel_calls_and_signatures() {
    let (url, seen) = serve(vec![
        Reply::json(200, parallel_calls()),
        Reply::json(200, final_text()),
    ])
    .await;
    let m = model(&url, 0);
    let tools = tools();
    let settings = ModelSettings::default();
    let mut transcript = vec![
        Message::system("be brief"),
        Message::user("weather and time in Paris?"),
    ];
    let r = m
        .complete(&request(&transcript, &tools, &settings))
        .await
        .unwrap();
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(r.tool_calls.len(), 2);
    answer(&mut transcript, &r);
    let r2 = m
        .complete(&request(&transcript, &tools, &settings))
        .await
        .unwrap();
    assert_eq!(r2.text.as_deref(), Some("Sunny, 12:00."));
    assert_eq!(r2.finish_reason, FinishReason::Stop);

    let seen = seen.requests();
    let (uri, headers, first) = (&seen[0].uri, &seen[0].headers, &seen[0].body);
    assert_eq!(uri, "/v1beta/models/gemini-test:generateContent");
    assert_eq!(headers["x-goog-api-key"], "g-test");
    assert_eq!(first["systemInstruction"]["parts"][0]["text"], "be brief");
    assert_eq!(
        first["tools"][0]["functionDeclarations"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    check_second_request(&seen[1].body);
}

#[tokio::test]
async fn streamed_round_trip() {
    let chunks = vec![
        json!({"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "U0lHX0E="}]}}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": "get_time", "args": {"city": "Paris"}}}]}, "finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 40, "candidatesTokenCount": 12}}),
    ];
    let text = vec![
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Sunny, "}]}}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "12:00."}]}, "finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 70, "candidatesTokenCount": 5}}),
    ];
    let (url, seen) = serve(vec![sse_reply(&chunks), sse_reply(&text)]).await;
    let m = model(&url, 0);
    let tools = tools();
    let settings = ModelSettings::default();
    let mut transcript = vec![Message::user("weather and time in Paris?")];
    let r = ModelResponse::from_stream(
        m.stream(&request(&transcript, &tools, &settings))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(r.tool_calls.len(), 2);
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(r.usage.unwrap().input_tokens, 40);
    answer(&mut transcript, &r);
    let r2 = ModelResponse::from_stream(
        m.stream(&request(&transcript, &tools, &settings))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(r2.text.as_deref(), Some("Sunny, 12:00."));
    let seen = seen.requests();
    assert_eq!(
        seen[0].uri,
        "/v1beta/models/gemini-test:streamGenerateContent?alt=sse"
    );
    assert_eq!(seen[0].headers["x-goog-api-key"], "g-test");
    // The streamed call parts arrived in two chunks; they go back as one model turn.
    check_second_request(&seen[1].body);
}

fn exhausted(delay: &str) -> Reply {
    Reply::json(
        429,
        json!({"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
        ]}}),
    )
}

#[tokio::test]
async fn retry_info_delay_is_honoured() {
    let (url, seen) = serve(vec![exhausted("0.3s"), Reply::json(200, final_text())]).await;
    let settings = ModelSettings::default();
    let msgs = [Message::user("hi")];
    let started = Instant::now();
    let r = model(&url, 2)
        .complete(&request(&msgs, &[], &settings))
        .await
        .unwrap();
    assert_eq!(r.text.as_deref(), Some("Sunny, 12:00."));
    assert_eq!(seen.count(), 2);
    // The backoff alone would be ~1 ms; RetryInfo asked for 300 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(280),
        "{:?}",
        started.elapsed()
    );

    let (url, _) = serve(vec![exhausted("12s")]).await;
    match model(&url, 0)
        .complete(&request(&msgs, &[], &settings))
        .await
    {
        Err(ModelError::Api(e)) => {
            assert_eq!(e.status, 429);
            assert_eq!(e.error_type.as_deref(), Some("RESOURCE_EXHAUSTED"));
            assert_eq!(e.retry_after, Some(Duration::from_secs(12)));
            assert!(e.retryable);
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn malformed_function_call_is_reported_for_the_model() {
    let body = json!({"candidates": [{"content": {"parts": []}, "finishReason": "MALFORMED_FUNCTION_CALL", "finishMessage": "Malformed function call: get_weather(city=Paris)"}]});
    let (url, _) = serve(vec![sse_reply(&[body])]).await;
    let settings = ModelSettings::default();
    let msgs = [Message::user("hi")];
    let tools = tools();
    let r = ModelResponse::from_stream(
        model(&url, 0)
            .stream(&request(&msgs, &tools, &settings))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(r.finish_reason, FinishReason::MalformedToolCall);
    assert!(
        r.malformed_call
            .unwrap()
            .contains("get_weather(city=Paris)")
    );
    assert!(r.tool_calls.is_empty());
}

/// Calls made by another provider (no thought signature) go to Gemini 3 with the documented
/// placeholder on the first call of the turn; Gemini 2.x models get none; real signatures are
/// never replaced (checked by the round trips above).
#[tokio::test]
async fn unsigned_calls_from_another_provider_get_the_placeholder_signature() {
    let transcript = vec![
        Message::user("weather and time in Paris?"),
        Message::Assistant(AssistantMessage {
            text: Some("Checking.".into()),
            tool_calls: vec![
                ToolCall::new("get_weather", json!({"city": "Paris"})),
                ToolCall::new("get_time", json!({"city": "Paris"})),
            ],
            parts: Vec::new(),
        }),
    ];
    let mut transcript = transcript;
    let calls = match &transcript[1] {
        Message::Assistant(a) => a.tool_calls.clone(),
        _ => unreachable!(),
    };
    for c in &calls {
        transcript.push(Message::Tool(ToolResult {
            call_id: c.id.clone(),
            name: c.name.clone(),
            content: "ok".into(),
            is_error: false,
            images: Vec::new(),
        }));
    }
    let tools = tools();
    let settings = ModelSettings::default();
    for (name, signed) in [
        ("gemini-3-pro-preview", true),
        ("models/gemini-3-flash-preview", true),
        ("gemini-2.5-flash", false),
    ] {
        let (url, seen) = serve(vec![Reply::json(200, final_text())]).await;
        let m = named_model(&url, 0, name);
        m.complete(&request(&transcript, &tools, &settings))
            .await
            .unwrap();
        let seen = seen.requests();
        let parts = seen[0].body["contents"][1]["parts"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(parts[0]["text"], "Checking.", "{name}");
        assert!(parts[0].get("thoughtSignature").is_none(), "{name}");
        assert_eq!(parts[1]["functionCall"]["name"], "get_weather");
        let want = signed.then(|| json!(PLACEHOLDER_THOUGHT_SIGNATURE));
        assert_eq!(parts[1].get("thoughtSignature").cloned(), want, "{name}");
        assert!(parts[2].get("thoughtSignature").is_none(), "{name}");
    }
    assert_eq!(
        PLACEHOLDER_THOUGHT_SIGNATURE,
        "skip_thought_signature_validator"
    );
}
