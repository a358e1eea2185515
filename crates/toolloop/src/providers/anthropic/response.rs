//! Complete responses: a Messages response decoded into a [`ModelResponse`].

use super::config::PROVIDER;
use super::error::stream_error;
use crate::context::NativeReport;
use crate::message::{ProviderPart, ToolCall};
use crate::model::{ApiError, FinishReason, ModelError, ModelResponse};
use crate::providers::adapter::snippet;
use crate::usage::Usage;
use serde_json::{Value, json};

/// Anthropic's usage counters, updated field by field as a stream reports them.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct WireUsage {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    thinking: u64,
    /// Whether an input or output count was reported at all.
    reported: bool,
}

impl WireUsage {
    pub(super) fn update(&mut self, u: &Value) {
        let get = |k: &str| u.get(k).and_then(Value::as_u64);
        if let Some(v) = get("input_tokens") {
            self.input = v;
            self.reported = true;
        }
        if let Some(v) = get("output_tokens") {
            self.output = v;
            self.reported = true;
        }
        if let Some(v) = get("cache_read_input_tokens") {
            self.cache_read = v;
        }
        if let Some(v) = get("cache_creation_input_tokens") {
            self.cache_write = v;
        }
        if let Some(v) = u
            .pointer("/output_tokens_details/thinking_tokens")
            .and_then(Value::as_u64)
        {
            self.thinking = v;
        }
    }

    /// The usage, or `None` when no input or output count was reported (a usage object
    /// without them reports nothing: its tokens are unknown, not zero).
    pub(super) fn usage(&self) -> Option<Usage> {
        self.reported.then_some(Usage {
            input_tokens: self.input + self.cache_read + self.cache_write,
            output_tokens: self.output,
            cache_read_tokens: self.cache_read,
            cache_write_tokens: self.cache_write,
            reasoning_tokens: self.thinking,
        })
    }
}

pub(super) fn finish_reason(stop_reason: Option<&str>, has_calls: bool) -> FinishReason {
    match stop_reason {
        Some("tool_use") => FinishReason::ToolCalls,
        Some("max_tokens" | "model_context_window_exceeded") => FinishReason::Length,
        // The server paused a long server-tool turn; sending the turn back continues it.
        Some("pause_turn") => FinishReason::Length,
        Some("refusal") => FinishReason::ContentFilter,
        Some("end_turn" | "stop_sequence") => FinishReason::Stop,
        _ if has_calls => FinishReason::ToolCalls,
        _ => FinishReason::Stop,
    }
}

/// Decodes a complete (non-streamed) Messages response.
pub(super) fn decode_message(v: &Value) -> Result<ModelResponse, ModelError> {
    if v["type"] == "error" {
        return Err(ModelError::Api(ApiError {
            status: 200,
            ..stream_error(v)
        }));
    }
    let content = v["content"].as_array().ok_or_else(|| {
        ModelError::InvalidResponse(format!(
            "expected a Messages response with a `content` array, got: {}",
            snippet(v.to_string().as_bytes(), 300)
        ))
    })?;
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut parts = Vec::new();
    for block in content {
        match block["type"].as_str() {
            Some("text") => text.push_str(block["text"].as_str().unwrap_or("")),
            Some("tool_use") => {
                let arguments = match &block["input"] {
                    Value::Null => json!({}),
                    other => other.clone(),
                };
                calls.push(ToolCall {
                    id: block["id"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .unwrap_or_else(crate::message::new_call_id),
                    name: block["name"].as_str().unwrap_or("").to_string(),
                    arguments,
                    invalid_arguments: None,
                    provider_data: call_extras(block),
                });
            }
            _ => parts.push(ProviderPart {
                provider: PROVIDER.into(),
                data: block.clone(),
            }),
        }
    }
    let stop_reason = v["stop_reason"].as_str();
    // Cut by max_tokens inside its last tool_use: the input may be incomplete, so the call is
    // reported but must not run.
    if stop_reason == Some("max_tokens")
        && content.last().is_some_and(|b| b["type"] == "tool_use")
        && let Some(last) = calls.last_mut()
    {
        last.invalid_arguments = Some(last.arguments.to_string());
        last.arguments = json!({});
    }
    let usage = v.get("usage").filter(|u| u.is_object()).and_then(|u| {
        let mut w = WireUsage::default();
        w.update(u);
        w.usage()
    });
    Ok(ModelResponse {
        text: (!text.is_empty()).then_some(text),
        finish_reason: finish_reason(stop_reason, !calls.is_empty()),
        tool_calls: calls,
        usage,
        parts,
        malformed_call: None,
        context_edited: applied_edits(v),
    })
}

/// What the API reports it cleared from the request (`context_management.applied_edits`, in a
/// response or in a stream's `message_delta`), when it cleared anything: the tool uses and
/// input tokens of every edit, added up.
pub(super) fn applied_edits(v: &Value) -> Option<NativeReport> {
    let edits = v.pointer("/context_management/applied_edits")?.as_array()?;
    let mut report: Option<NativeReport> = None;
    for edit in edits.iter().filter(|e| e.is_object()) {
        let count = |k: &str| edit.get(k).and_then(Value::as_u64).unwrap_or(0);
        report
            .get_or_insert_with(NativeReport::default)
            .merge(NativeReport {
                cleared_tool_uses: count("cleared_tool_uses"),
                cleared_input_tokens: count("cleared_input_tokens"),
                ..NativeReport::default()
            });
    }
    report
}

pub(super) fn decode_message_body(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ModelError::InvalidResponse(format!(
            "the Messages response is not JSON ({e}): {}",
            snippet(body, 300)
        ))
    })?;
    decode_message(&v)
}

/// Fields of a `tool_use` block besides type, id, name and input that must go back with it
/// (a non-direct `caller`), kept as `{"anthropic": {...}}` in the call's `provider_data`.
pub(super) fn call_extras(block: &Value) -> Option<Value> {
    let caller = block.get("caller")?;
    if caller["type"] == "direct" {
        return None;
    }
    Some(json!({PROVIDER: {"caller": caller}}))
}

#[cfg(test)]
mod tests {
    use super::super::decode_recorded;
    use super::*;

    #[test]
    fn usage_counts_cache_tokens_as_input() {
        let r = decode_message(&json!({
            "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20},
        }))
        .unwrap();
        let u = r.usage.unwrap();
        assert_eq!(
            (
                u.input_tokens,
                u.cache_read_tokens,
                u.cache_write_tokens,
                u.output_tokens
            ),
            (130, 100, 20, 3)
        );
        assert_eq!(u.uncached_input_tokens(), 10);
    }

    #[test]
    fn max_tokens_inside_a_tool_call_marks_it_unrunnable() {
        let r = decode_message(&json!({
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}],
            "stop_reason": "max_tokens",
        }))
        .unwrap();
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert_eq!(
            r.tool_calls[0].invalid_arguments.as_deref(),
            Some("{\"a\":1}")
        );
        // Streamed: a call cut before any argument text is left out.
        let sse = "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n\n\
                   data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\n\
                   data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":5}}\n\n\
                   data: {\"type\":\"message_stop\"}\n\n";
        let d = decode_recorded(200, sse.as_bytes(), true);
        assert!(d.error.is_none());
        assert!(d.response.tool_calls.is_empty());
        assert_eq!(d.response.finish_reason, FinishReason::Length);
    }
}
