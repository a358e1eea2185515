//! `test`: a deterministic offline model, like Pydantic AI's `TestModel`.
//!
//! Its first round (no tool calls since the last user message) calls every offered tool once,
//! with arguments built from the tool's JSON Schema by [`crate::schema::sample`]. Then it
//! answers with a JSON object mapping each tool's name to its result, or, with
//! [`TestAnswer::Summary`], a few lines a person can read (what each tool returned). With no
//! tools (or tool choice `none`) it answers at once. With an output schema (see
//! [`crate::output`]) its answer is [`crate::schema::sample`] of the schema, as JSON. Usage is
//! counted as one token per four
//! characters.

use crate::message::{Message, ToolCall, new_call_id};
use crate::model::{FinishReason, Model, ModelError, ModelRequest, ModelResponse, ToolChoice};
use crate::schema::sample;
use crate::usage::Usage;
use async_trait::async_trait;
use serde_json::{Map, Value};

/// The deterministic offline model.
#[derive(Debug, Clone, Default)]
pub struct TestModel {
    answer: TestAnswer,
}

/// How [`TestModel`] answers after its tools have run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TestAnswer {
    /// A JSON object mapping each tool's name to its result (for tests to inspect).
    #[default]
    Json,
    /// One line per tool: its name and a short account of what it returned (for people).
    Summary,
}

impl TestModel {
    /// A new test model, answering with [`TestAnswer::Json`].
    pub fn new() -> Self {
        TestModel::default()
    }

    /// Sets how the model answers after its tools have run.
    pub fn answer(mut self, answer: TestAnswer) -> Self {
        self.answer = answer;
        self
    }
}

/// The longest account of one tool's result in a [`TestAnswer::Summary`].
const SUMMARY_WIDTH: usize = 100;

/// The `message` of a `{"success": …, "message": …}` result whose end was cut off.
fn cut_message(content: &str) -> Option<String> {
    let at = content.find("\"message\":")? + "\"message\":".len();
    serde_json::Deserializer::from_str(content[at..].trim_start())
        .into_iter::<String>()
        .next()?
        .ok()
}

/// What one tool returned, in a few words: its message's first line (or its text's), and the
/// number of items or lines of its data.
fn account(result: &crate::message::ToolResult) -> String {
    let parsed = serde_json::from_str::<Value>(&result.content).ok();
    let (message, data) = match &parsed {
        Some(Value::Object(o)) => (
            o.get("message").and_then(Value::as_str).map(str::to_string),
            o.get("data"),
        ),
        // A result cut to the size limit is no longer JSON; its message usually survives.
        _ => (
            cut_message(&result.content).or_else(|| Some(result.content.clone())),
            None,
        ),
    };
    let mut parts = Vec::new();
    if let Some(m) = message.as_deref().map(str::trim).filter(|m| !m.is_empty()) {
        let first = m.lines().next().unwrap_or_default();
        let mut line: String = first.chars().take(SUMMARY_WIDTH).collect();
        if line.len() < first.len() {
            line.push('…');
        }
        let lines = m.lines().count();
        if lines > 1 {
            line.push_str(&format!(" ({lines} lines)"));
        }
        parts.push(line);
    }
    match data {
        Some(Value::Array(items)) => parts.push(format!("{} items", items.len())),
        Some(Value::String(text)) => parts.push(format!(
            "{} lines, {} bytes",
            text.lines().count(),
            text.len()
        )),
        _ => {}
    }
    if parts.is_empty() {
        parts.push("no output".into());
    }
    let verb = if result.is_error {
        "failed"
    } else {
        "returned"
    };
    format!("- {} {verb}: {}", result.name, parts.join("; "))
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
        let since = request.messages.slice(last_user..);
        let called = since
            .iter()
            .any(|m| matches!(m, Message::Assistant(a) if !a.tool_calls.is_empty()));
        let answers_now =
            request.tools.is_empty() || request.settings.tool_choice == ToolChoice::None || called;
        let mut response =
            if let Some(output) = request.settings.output.as_ref().filter(|_| answers_now) {
                ModelResponse::text(sample(&output.schema).to_string())
            } else if request.tools.is_empty() || request.settings.tool_choice == ToolChoice::None {
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
                let results = since.iter().filter_map(|m| match m {
                    Message::Tool(r) => Some(r),
                    _ => None,
                });
                let text = match self.answer {
                    TestAnswer::Json => {
                        let mut summary = Map::new();
                        for r in results {
                            let value = serde_json::from_str::<Value>(&r.content)
                                .unwrap_or_else(|_| Value::String(r.content.clone()));
                            summary.insert(r.name.clone(), value);
                        }
                        Value::Object(summary).to_string()
                    }
                    TestAnswer::Summary => {
                        let lines: Vec<String> = results.map(account).collect();
                        format!(
                            "I am the offline test model. I called {} tool{}:\n{}",
                            lines.len(),
                            if lines.len() == 1 { "" } else { "s" },
                            lines.join("\n")
                        )
                    }
                };
                ModelResponse {
                    text: Some(text),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolResult;

    fn result(name: &str, content: &str, is_error: bool) -> ToolResult {
        ToolResult {
            call_id: "c1".into(),
            name: name.into(),
            content: content.into(),
            is_error,
            images: Vec::new(),
        }
    }

    #[test]
    fn a_summary_line_says_what_a_tool_returned() {
        let object = result(
            "read_file",
            r#"{"success":true,"message":"a.txt: lines 1-3","data":{"content":"x"}}"#,
            false,
        );
        assert_eq!(account(&object), "- read_file returned: a.txt: lines 1-3");
        let ok = result(
            "list_dir",
            r#"{"success":true,"message":"3 entries","data":["a","b","c"]}"#,
            false,
        );
        assert_eq!(account(&ok), "- list_dir returned: 3 entries; 3 items");
        let failed = result(
            "read_file",
            r#"{"success":false,"message":"not found: x\nsecond line"}"#,
            true,
        );
        assert_eq!(
            account(&failed),
            "- read_file failed: not found: x (2 lines)"
        );
        let cut = result(
            "list_dir",
            r#"{"success":true,"message":"`.`: 147 entries","data":{"entries":[{"ki…"#,
            false,
        );
        assert_eq!(account(&cut), "- list_dir returned: `.`: 147 entries");
        let long = result("echo", &"y".repeat(500), false);
        let line = account(&long);
        assert!(line.ends_with('…'), "{line}");
        assert!(line.chars().count() < SUMMARY_WIDTH + 30, "{line}");
    }
}
