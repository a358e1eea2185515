//! `test`: a deterministic offline model, like Pydantic AI's `TestModel`.
//!
//! Its first round (no tool calls since the last user message) calls every offered tool once,
//! with arguments built from the tool's JSON Schema by [`crate::schema::sample`]. Then it
//! answers with a JSON object mapping each tool's name to its result. With no tools (or tool
//! choice `none`) it answers at once. Usage is counted as one token per four characters.

use crate::message::{Message, ToolCall, new_call_id};
use crate::model::{FinishReason, Model, ModelError, ModelRequest, ModelResponse, ToolChoice};
use crate::schema::sample;
use crate::usage::Usage;
use async_trait::async_trait;
use serde_json::{Map, Value};

/// The deterministic offline model.
#[derive(Debug, Clone, Default)]
pub struct TestModel {
    _private: (),
}

impl TestModel {
    /// A new test model.
    pub fn new() -> Self {
        TestModel::default()
    }
}

fn tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

#[async_trait]
impl Model for TestModel {
    fn name(&self) -> &str {
        "test"
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let input_chars: usize = request
            .messages
            .iter()
            .map(|m| m.text().len())
            .sum::<usize>()
            + request.reminders.iter().map(String::len).sum::<usize>();
        let last_user = request
            .messages
            .iter()
            .rposition(|m| matches!(m, Message::User { .. }))
            .unwrap_or(0);
        let since = &request.messages[last_user..];
        let called = since
            .iter()
            .any(|m| matches!(m, Message::Assistant(a) if !a.tool_calls.is_empty()));
        let mut response =
            if request.tools.is_empty() || request.settings.tool_choice == ToolChoice::None {
                ModelResponse::text("success (no tool calls)")
            } else if !called {
                let calls = request
                    .tools
                    .iter()
                    .filter(|t| match &request.settings.tool_choice {
                        ToolChoice::Tool(name) => &t.name == name,
                        _ => true,
                    })
                    .map(|t| ToolCall {
                        id: new_call_id(),
                        name: t.name.clone(),
                        arguments: sample(&t.parameters),
                        invalid_arguments: None,
                        provider_data: None,
                    })
                    .collect();
                ModelResponse::tool_calls(calls)
            } else {
                let mut summary = Map::new();
                for m in since {
                    if let Message::Tool(r) = m {
                        let value = serde_json::from_str::<Value>(&r.content)
                            .unwrap_or_else(|_| Value::String(r.content.clone()));
                        summary.insert(r.name.clone(), value);
                    }
                }
                ModelResponse {
                    text: Some(Value::Object(summary).to_string()),
                    finish_reason: FinishReason::Stop,
                    ..ModelResponse::default()
                }
            };
        let output_chars = response.text.as_ref().map_or(0, String::len)
            + response
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.to_string().len())
                .sum::<usize>();
        response.usage = Some(Usage {
            input_tokens: tokens(input_chars),
            output_tokens: tokens(output_chars),
            ..Usage::default()
        });
        Ok(response)
    }
}
