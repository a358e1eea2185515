//! Provider adapters: each translates the message model to and from one wire format.
//!
//! Nothing outside an adapter knows a wire format.

#[cfg(any(test, feature = "testing"))]
use crate::model::{ApiError, ModelResponse};

// Without `http`, the transport's parts (retries, refusals learned) are built and unused.
#[cfg_attr(not(feature = "http"), allow(dead_code, unused_imports))]
pub(crate) mod adapter;
// Without `http`, the transport's parts (retries, refusals learned) are built and unused.
#[cfg_attr(not(feature = "http"), allow(dead_code, unused_imports))]
pub mod anthropic;
pub mod gemini;
pub(crate) mod json_write;
// Without `http`, the transport's parts (retries, refusals learned) are built and unused.
#[cfg_attr(not(feature = "http"), allow(dead_code, unused_imports))]
pub mod openai;
// Without `http`, the transport's parts (retries, refusals learned) are built and unused.
#[cfg_attr(not(feature = "http"), allow(dead_code, unused_imports))]
pub mod openai_responses;
pub mod scripted;
pub mod test_model;
pub mod wire;
pub use crate::transport::check_base_url;

/// For an API that takes a tool result's images beside the result rather than in it: a line
/// that says which call they came from, and the images (`None` when the result has none).
pub(crate) fn tool_result_images(
    result: &crate::message::ToolResult,
) -> Option<(String, &[crate::image::Image])> {
    (!result.images.is_empty()).then(|| {
        let n = result.images.len();
        let noun = if n == 1 { "image" } else { "images" };
        (
            format!(
                "The {noun} the tool `{}` returned (call {}):",
                result.name, result.call_id
            ),
            result.images.as_slice(),
        )
    })
}

/// What an adapter makes of one recorded response body: the response, and the error the body
/// reported (an HTTP error body, or an error event inside a stream). Used by the conformance
/// tests, which feed recorded bodies byte for byte.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decoded {
    /// What arrived (for an error, whatever came before it).
    pub response: ModelResponse,
    /// The error, if the body reported one.
    pub error: Option<ApiError>,
}

#[cfg(all(test, feature = "http"))]
mod tool_image_tests {
    use crate::image::Image;
    use crate::message::{AssistantMessage, Message, ToolCall, ToolResult};
    use crate::model::{ModelRequest, ModelSettings};
    use serde_json::{Value, json};

    /// A round of two calls; the second result holds an image.
    fn conversation() -> Vec<Message> {
        let call = |id: &str| {
            let mut c = ToolCall::new("shot", json!({}));
            c.id = id.into();
            c
        };
        let result = |id: &str, images: Vec<Image>| {
            Message::Tool(ToolResult {
                call_id: id.into(),
                name: "shot".into(),
                content: format!("result {id}"),
                is_error: false,
                images,
            })
        };
        vec![
            Message::user("look"),
            Message::Assistant(AssistantMessage {
                text: None,
                tool_calls: vec![call("c1"), call("c2")],
                parts: vec![],
            }),
            result("c1", vec![]),
            result("c2", vec![Image::from_bytes(b"GIF89a\x01\x00").unwrap()]),
        ]
    }

    fn with<T>(f: impl FnOnce(&ModelRequest<'_>) -> T) -> T {
        let messages = conversation();
        let settings = ModelSettings::default();
        f(&ModelRequest {
            messages: (&messages).into(),
            reminders: &[],
            tools: &[],
            settings: &settings,
        })
    }

    const GIF: &str = "R0lGODlhAQA=";

    #[test]
    fn chat_completions_sends_a_rounds_images_after_its_last_result() {
        let body = with(|r| {
            super::openai::build_request_body(r, &super::openai::OpenAiConfig::new("m"), false)
        });
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m.len(), 5, "{body}");
        assert_eq!(m[2]["content"], "result c1");
        assert_eq!(m[3]["content"], "result c2");
        assert_eq!(
            m[4],
            json!({"role": "user", "content": [
                {"type": "text", "text": "The image the tool `shot` returned (call c2):"},
                {"type": "image_url", "image_url": {"url": format!("data:image/gif;base64,{GIF}")}},
            ]})
        );
    }

    #[test]
    fn the_responses_api_takes_them_in_the_output() {
        let body = with(|r| {
            super::openai_responses::build_request_body(
                r,
                &super::openai_responses::ResponsesConfig::new("m"),
                false,
            )
        });
        let items = body["input"].as_array().unwrap();
        let outputs: Vec<&Value> = items
            .iter()
            .filter(|i| i["type"] == "function_call_output")
            .collect();
        assert_eq!(outputs[0]["output"], "result c1");
        assert_eq!(
            outputs[1]["output"],
            json!([
                {"type": "input_text", "text": "result c2"},
                {"type": "input_image", "image_url": format!("data:image/gif;base64,{GIF}"), "detail": "auto"},
            ])
        );
    }

    #[test]
    fn anthropic_takes_them_in_the_tool_result() {
        let body = with(|r| {
            super::anthropic::build_request_body(
                r,
                &super::anthropic::AnthropicConfig::new("m"),
                false,
            )
        });
        let results = &body["messages"][2]["content"];
        assert_eq!(results[0]["content"], "result c1");
        assert_eq!(results[1]["content"][0]["text"], "result c2");
        assert_eq!(
            results[1]["content"][1],
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": GIF}})
        );
    }

    #[test]
    fn gemini_takes_them_after_the_function_responses() {
        let body = with(|r| {
            super::gemini::build_request_body(r, &super::gemini::GeminiConfig::new("m"), false)
        });
        let parts = body["contents"][2]["parts"].as_array().unwrap();
        assert!(parts[0].get("functionResponse").is_some(), "{body}");
        assert!(parts[1].get("functionResponse").is_some(), "{body}");
        assert_eq!(
            parts[2]["text"],
            "The image the tool `shot` returned (call c2):"
        );
        assert_eq!(
            parts[3],
            json!({"inlineData": {"mimeType": "image/gif", "data": GIF}})
        );
    }
}
