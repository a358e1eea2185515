//! The mock's context window (`window=`): a request over it is refused as each API refuses one,
//! every adapter turns that refusal into the typed `ModelError::ContextOverflow` without
//! retrying it, and the mock counts the refusals.

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use toolloop::context::ContextOverflow;
use toolloop::message::Message;
use toolloop::model::{Model, ModelError, ModelRequest, ModelSettings, ToolSpec};
use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
use toolloop::providers::gemini::{GeminiConfig, GeminiModel};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use toolloop::stream::Accumulator;
use toolloop::transport::http::{HttpTransport, RetryPolicy};
use toolloop_mock::{MockOptions, start};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Chat,
    Responses,
    Anthropic,
    Gemini,
}

const PROTOS: [Proto; 4] = [
    Proto::Chat,
    Proto::Responses,
    Proto::Anthropic,
    Proto::Gemini,
];

/// A transport that retries whatever it may, at once: a refusal it retried would show in the
/// mock's request count.
fn transport() -> HttpTransport {
    let mut t = HttpTransport::new();
    t.retry = RetryPolicy {
        max_retries: 5,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(2),
    };
    t
}

fn model(proto: Proto, base: &str, scenario: &str) -> Box<dyn Model> {
    match proto {
        Proto::Chat => {
            let mut c = OpenAiConfig::new(scenario).with_base_url(format!("{base}/v1"));
            c.transport = transport();
            Box::new(OpenAiModel::new(c))
        }
        Proto::Responses => {
            let mut c = ResponsesConfig::new(scenario).with_base_url(format!("{base}/v1"));
            c.transport = transport();
            Box::new(ResponsesModel::new(c))
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

/// One call with a prompt of `prompt_bytes` bytes: the typed overflow, or `None` when the call
/// went through.
async fn call(model: &dyn Model, prompt_bytes: usize, stream: bool) -> Option<ContextOverflow> {
    let messages = [Message::user("x".repeat(prompt_bytes))];
    let tools = [ToolSpec {
        name: "lookup".into(),
        description: "Looks something up.".into(),
        parameters: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
    }];
    let settings = ModelSettings::default();
    let request = ModelRequest {
        messages: (&messages).into(),
        reminders: &[],
        tools: &tools,
        settings: &settings,
    };
    let result = if stream {
        match model.stream(&request).await {
            Err(e) => Err(e),
            Ok(mut events) => {
                let mut acc = Accumulator::new();
                let mut failed = None;
                while let Some(event) = events.next().await {
                    match event {
                        Ok(event) => acc.push(event),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                failed.map_or_else(|| Ok(acc.finish()), Err)
            }
        }
    } else {
        model.complete(&request).await
    };
    match result {
        Ok(response) => {
            assert!(!response.tool_calls.is_empty(), "{response:?}");
            None
        }
        Err(ModelError::ContextOverflow(o)) => Some(o),
        Err(other) => panic!("not the typed overflow: {other:?}"),
    }
}

#[tokio::test]
async fn every_adapter_gets_the_typed_overflow_and_never_retries_it() {
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    const WINDOW: u64 = 2000;
    let scenario = format!("mock:window={WINDOW}");
    let mut refusals = 0;
    for proto in PROTOS {
        let model = model(proto, &base, &scenario);
        for stream in [false, true] {
            let before = server.stats();
            // Well under the window: answered.
            assert_eq!(call(model.as_ref(), 1000, stream).await, None, "{proto:?}");
            // Twice the window: refused once, not retried.
            let o = call(model.as_ref(), 16_000, stream)
                .await
                .unwrap_or_else(|| panic!("{proto:?} stream={stream}: not refused"));
            refusals += 1;
            let after = server.stats();
            assert_eq!(after.requests - before.requests, 2, "{proto:?} {stream}");
            assert_eq!(after.context_refusals, refusals, "{proto:?} {stream}");
            match proto {
                // The Responses API gives no counts.
                Proto::Responses => {
                    assert_eq!(o.code.as_deref(), Some("context_length_exceeded"));
                    assert!(o.message.contains("exceeds the context window"), "{o:?}");
                    assert_eq!(o.status, if stream { 200 } else { 400 });
                }
                _ => {
                    assert_eq!(o.status, 400, "{proto:?}");
                    assert_eq!(o.limit, Some(WINDOW), "{proto:?}: {o:?}");
                    let tokens = o.input_tokens.expect("the count");
                    assert!(tokens > 4000 && tokens < 5000, "{proto:?}: {tokens}");
                }
            }
            let expected_code = match proto {
                Proto::Chat | Proto::Responses => "context_length_exceeded",
                Proto::Anthropic => "invalid_request_error",
                Proto::Gemini => "INVALID_ARGUMENT",
            };
            assert_eq!(o.code.as_deref(), Some(expected_code), "{proto:?}");
        }
    }
    // The HTTP 400 refusals are rejections too; the streamed Responses one is a 200.
    assert_eq!(server.stats().rejected, refusals - 1);
    server.shutdown().await;
}

#[tokio::test]
async fn without_a_window_size_is_no_concern() {
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    for proto in PROTOS {
        let model = model(proto, &base, "mock");
        assert_eq!(call(model.as_ref(), 64_000, false).await, None, "{proto:?}");
    }
    assert_eq!(server.stats().context_refusals, 0);
    server.shutdown().await;
}
