//! Complete responses: a `response` object decoded into a [`ModelResponse`].

use super::config::PROVIDER;
use super::error::event_error;
use crate::message::{ProviderPart, ToolCall, new_call_id};
use crate::model::{FinishReason, ModelError, ModelResponse};
use crate::providers::adapter::snippet;
use crate::usage::Usage;
use serde_json::{Value, json};

/// Decodes a complete response body.
pub(super) fn decode_response_body(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ModelError::InvalidResponse(format!(
            "the Responses API response is not JSON ({e}): {}",
            snippet(body, 300)
        ))
    })?;
    decode_response(&v)
}

/// Decodes a `response` object: its `output` items (`message` with `output_text` parts,
/// `function_call`, `reasoning`), its `status` and `incomplete_details` (the finish reason) and
/// its `usage`. A `failed` response, or a body that is an error, is an [`ModelError::Api`].
pub fn decode_response(v: &Value) -> Result<ModelResponse, ModelError> {
    let failed = v.get("status").and_then(Value::as_str) == Some("failed");
    let only_error = v.get("error").is_some_and(Value::is_object) && v.get("output").is_none();
    if failed || only_error {
        let error = v.get("error").filter(|e| e.is_object()).unwrap_or(v);
        return Err(ModelError::Api(event_error(200, error)));
    }
    let output = v.get("output").and_then(Value::as_array).ok_or_else(|| {
        ModelError::InvalidResponse(format!(
            "expected a Responses API `response` object with an `output` array, got: {}",
            snippet(v.to_string().as_bytes(), 300)
        ))
    })?;
    let mut out = Output::default();
    for item in output {
        out.item(item);
    }
    Ok(out.finish(v))
}

/// What a response that holds a `compaction` item reports.
pub(super) fn compaction_report() -> crate::context::NativeReport {
    crate::context::NativeReport {
        compacted: true,
        ..Default::default()
    }
}

/// The output items of a response, collected.
#[derive(Default)]
pub(super) struct Output {
    text: String,
    calls: Vec<ToolCall>,
    parts: Vec<ProviderPart>,
    refused: bool,
    compacted: bool,
}

impl Output {
    /// Adds one output item.
    pub(super) fn item(&mut self, item: &Value) {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let (text, refusal) = message_text(item);
                self.text.push_str(&text);
                if let Some(refusal) = refusal {
                    self.refused = true;
                    self.parts.push(refusal_part(&refusal));
                }
            }
            Some("function_call") => self.calls.push(call_of(item)),
            Some("reasoning") => self.parts.push(ProviderPart {
                provider: PROVIDER.into(),
                data: item.clone(),
            }),
            // The server compacted the conversation: its opaque item is kept with the turn and
            // sent back, in place of everything before it.
            Some("compaction") => {
                self.compacted = true;
                self.parts.push(ProviderPart {
                    provider: PROVIDER.into(),
                    data: item.clone(),
                })
            }
            // Built-in tools' items and types added later carry nothing the loop uses.
            _ => {}
        }
    }

    /// The response, with the status, usage and finish reason of `response`.
    fn finish(self, response: &Value) -> ModelResponse {
        let has_calls = !self.calls.is_empty();
        let mut finish = finish_reason(response, has_calls);
        if self.refused && self.text.is_empty() && !has_calls {
            finish = FinishReason::ContentFilter;
        }
        let mut calls = self.calls;
        // Cut by the output limit inside its last call: the arguments may be incomplete, so the
        // call is reported but must not run.
        if finish == FinishReason::Length
            && let Some(last) = calls.last_mut()
            && last.invalid_arguments.is_none()
            && response
                .get("output")
                .and_then(Value::as_array)
                .and_then(|o| o.last())
                .is_some_and(|i| i["type"] == "function_call" && i["status"] == "incomplete")
        {
            last.invalid_arguments = Some(last.arguments.to_string());
            last.arguments = json!({});
        }
        ModelResponse {
            text: (!self.text.is_empty()).then_some(self.text),
            tool_calls: calls,
            finish_reason: finish,
            usage: usage_of(response.get("usage")),
            parts: self.parts,
            malformed_call: None,
            context_edited: self.compacted.then(compaction_report),
        }
    }
}

/// A message item's `output_text` (joined) and its refusal, if any.
pub(super) fn message_text(item: &Value) -> (String, Option<String>) {
    let mut text = String::new();
    let mut refusal: Option<String> = None;
    match item.get("content") {
        Some(Value::String(s)) => text.push_str(s),
        Some(Value::Array(parts)) => {
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("output_text" | "text") => {
                        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some("refusal") => {
                        let r = part.get("refusal").and_then(Value::as_str).unwrap_or("");
                        refusal.get_or_insert_with(String::new).push_str(r);
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    (text, refusal)
}

/// A refusal, kept as a part (not text; not sent back).
pub(super) fn refusal_part(refusal: &str) -> ProviderPart {
    ProviderPart {
        provider: PROVIDER.into(),
        data: json!({"type": "refusal", "refusal": refusal}),
    }
}

/// The id a call item answers to: its `call_id`, else its item `id`, else a fresh one.
pub(super) fn call_id_of(item: &Value) -> Option<String> {
    ["call_id", "id"]
        .iter()
        .find_map(|k| {
            item.get(*k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        })
        .map(str::to_string)
}

/// The argument text of a call item (`arguments` is a JSON string; an object is taken as is).
pub(super) fn arguments_of(item: &Value) -> String {
    match item.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    }
}

fn call_of(item: &Value) -> ToolCall {
    ToolCall::from_raw_arguments(
        call_id_of(item).unwrap_or_else(new_call_id),
        item.get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        &arguments_of(item),
    )
}

/// The finish reason of a response: `incomplete` for `max_output_tokens` is
/// [`FinishReason::Length`], for `content_filter` [`FinishReason::ContentFilter`]; a completed
/// response with calls is [`FinishReason::ToolCalls`].
pub(super) fn finish_reason(response: &Value, has_calls: bool) -> FinishReason {
    match response.get("status").and_then(Value::as_str) {
        Some("incomplete") => match response
            .pointer("/incomplete_details/reason")
            .and_then(Value::as_str)
        {
            Some("content_filter") => FinishReason::ContentFilter,
            _ => FinishReason::Length,
        },
        Some("failed") => FinishReason::Error,
        _ if has_calls => FinishReason::ToolCalls,
        _ => FinishReason::Stop,
    }
}

/// The usage of a response: `input_tokens` (cached ones included, as OpenAI counts them),
/// `output_tokens`, `input_tokens_details.cached_tokens` and
/// `output_tokens_details.reasoning_tokens`. `None` without input or output counts.
pub(super) fn usage_of(u: Option<&Value>) -> Option<Usage> {
    let u = u.filter(|u| u.is_object())?;
    let count = |p: &str| u.pointer(p).and_then(Value::as_u64);
    let input = count("/input_tokens");
    let output = count("/output_tokens");
    if input.is_none() && output.is_none() {
        return None;
    }
    Some(Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        cache_read_tokens: count("/input_tokens_details/cached_tokens").unwrap_or(0),
        cache_write_tokens: 0,
        reasoning_tokens: count("/output_tokens_details/reasoning_tokens").unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_items_become_text_calls_and_reasoning_parts() {
        let r = decode_response(&json!({
            "id": "resp_1", "object": "response", "status": "completed",
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Reading.", "annotations": []}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read",
                 "arguments": "{\"path\":\"a.txt\"}", "status": "completed"},
                {"type": "web_search_call", "id": "ws_1", "status": "completed"}
            ],
            "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64},
                      "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 12},
                      "total_tokens": 130}
        }))
        .unwrap();
        assert_eq!(r.text.as_deref(), Some("Reading."));
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls[0].id, "call_1");
        assert_eq!(r.tool_calls[0].arguments, json!({"path": "a.txt"}));
        assert_eq!(r.parts.len(), 1);
        assert_eq!(r.parts[0].data["encrypted_content"], "gAAA");
        let u = r.usage.unwrap();
        assert_eq!(
            (
                u.input_tokens,
                u.cache_read_tokens,
                u.output_tokens,
                u.reasoning_tokens
            ),
            (100, 64, 30, 12)
        );
    }

    #[test]
    fn status_and_errors() {
        let r = decode_response(&json!({
            "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{"type": "function_call", "call_id": "c", "name": "f",
                        "arguments": "{\"a\":1}", "status": "incomplete"}]
        }))
        .unwrap();
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert_eq!(
            r.tool_calls[0].invalid_arguments.as_deref(),
            Some("{\"a\":1}")
        );
        let r = decode_response(&json!({
            "status": "incomplete", "incomplete_details": {"reason": "content_filter"},
            "output": []
        }))
        .unwrap();
        assert_eq!(r.finish_reason, FinishReason::ContentFilter);
        let r = decode_response(&json!({"status": "completed", "output": [
            {"type": "message", "content": [{"type": "refusal", "refusal": "No."}]}]}))
        .unwrap();
        assert_eq!(
            (r.text, r.finish_reason),
            (None, FinishReason::ContentFilter)
        );
        assert_eq!(r.parts[0].data["refusal"], "No.");
        let e = decode_response(&json!({"status": "failed", "output": [],
            "error": {"code": "server_error", "message": "The model failed."}}))
        .unwrap_err();
        match e {
            ModelError::Api(a) => {
                assert!(a.retryable);
                assert_eq!(a.message, "The model failed.");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode_response(&json!({"output": 3})),
            Err(ModelError::InvalidResponse(m)) if m.contains("`output` array")
        ));
        assert!(decode_response_body(b"not json").is_err());
    }
}
