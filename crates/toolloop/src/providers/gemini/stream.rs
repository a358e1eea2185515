//! Streamed responses (and the chunk decoder both paths share): `GenerateContentResponse` chunks
//! decoded into [`StreamEvent`]s.

use super::config::PROVIDER;
use super::error::api_error;
use crate::message::{ProviderPart, new_call_id};
use crate::model::{FinishReason, ModelError};
use crate::providers::adapter::{SseDecode, snippet};
use crate::stream::StreamEvent;
use crate::transport::sse::SseEvent;
use crate::usage::Usage;
use serde_json::{Map, Value, json};

/// The usage in `usageMetadata`, or `None` when it has neither a prompt nor an output count
/// (then the tokens are unknown, not zero; a count left out next to the other is zero, as
/// Gemini leaves zero counts out).
pub(super) fn usage(meta: &Value) -> Option<Usage> {
    if meta.get("promptTokenCount").is_none() && meta.get("candidatesTokenCount").is_none() {
        return None;
    }
    let get = |k: &str| meta.get(k).and_then(Value::as_u64).unwrap_or(0);
    let thoughts = get("thoughtsTokenCount");
    Some(Usage {
        input_tokens: get("promptTokenCount") + get("toolUsePromptTokenCount"),
        output_tokens: get("candidatesTokenCount") + thoughts,
        cache_read_tokens: get("cachedContentTokenCount"),
        cache_write_tokens: 0,
        reasoning_tokens: thoughts,
    })
}

pub(super) const MALFORMED_HELP: &str = "Call a function by emitting a function call with the exact name \
     of one of the declared functions and arguments as a JSON object matching that function's \
     parameter schema; do not write the call as code or as text.";

/// The finish reason, and the explanation for the model when its call was malformed.
pub(super) fn finish(
    reason: Option<&str>,
    message: Option<&str>,
    has_calls: bool,
) -> (FinishReason, Option<String>) {
    let detail = message
        .filter(|m| !m.trim().is_empty())
        .map(|m| format!(": {}", m.trim()))
        .unwrap_or_default();
    match reason {
        Some("MAX_TOKENS") => (FinishReason::Length, None),
        Some(
            "SAFETY"
            | "RECITATION"
            | "BLOCKLIST"
            | "PROHIBITED_CONTENT"
            | "SPII"
            | "LANGUAGE"
            | "IMAGE_SAFETY"
            | "IMAGE_PROHIBITED_CONTENT"
            | "IMAGE_RECITATION",
        ) => (FinishReason::ContentFilter, None),
        Some("MALFORMED_FUNCTION_CALL") => (
            FinishReason::MalformedToolCall,
            Some(format!(
                "Your last function call could not be parsed (MALFORMED_FUNCTION_CALL{detail}). \
                 {MALFORMED_HELP}"
            )),
        ),
        Some("UNEXPECTED_TOOL_CALL") => (
            FinishReason::MalformedToolCall,
            Some(format!(
                "Your last function call named a function that is not declared for this request \
                 (UNEXPECTED_TOOL_CALL{detail}). {MALFORMED_HELP}"
            )),
        ),
        _ if has_calls => (FinishReason::ToolCalls, None),
        _ => (FinishReason::Stop, None),
    }
}

/// Turns `GenerateContentResponse` chunks (one for a complete response, many for a stream)
/// into [`StreamEvent`]s.
#[derive(Default)]
pub(crate) struct ChunkDecoder {
    calls: usize,
    finish_reason: Option<String>,
    finish_message: Option<String>,
    blocked: bool,
    seen_chunk: bool,
    /// Consecutive streamed thought fragments, joined into one part.
    thought: Option<Value>,
}

impl ChunkDecoder {
    fn flush_thought(&mut self, out: &mut Vec<StreamEvent>) {
        if let Some(data) = self.thought.take() {
            out.push(StreamEvent::Part(ProviderPart {
                provider: PROVIDER.into(),
                data,
            }));
        }
    }

    fn part(&mut self, part: &Value, out: &mut Vec<StreamEvent>) {
        let signature = part.get("thoughtSignature").cloned();
        if let Some(fc) = part.get("functionCall") {
            self.flush_thought(out);
            let index = self.calls;
            self.calls += 1;
            let wire_id = fc["id"].as_str().filter(|s| !s.is_empty());
            let id = wire_id.map_or_else(new_call_id, str::to_string);
            out.push(StreamEvent::ToolCallStart {
                index,
                id: Some(id),
                name: fc["name"].as_str().unwrap_or("").to_string(),
            });
            let args = match &fc["args"] {
                Value::Null => "{}".to_string(),
                v => v.to_string(),
            };
            out.push(StreamEvent::ToolCallDelta {
                index,
                arguments: args,
            });
            let mut data = Map::new();
            if let Some(sig) = signature {
                data.insert("thoughtSignature".into(), sig);
            }
            if let Some(id) = wire_id {
                data.insert("id".into(), json!(id));
            }
            if !data.is_empty() {
                out.push(StreamEvent::ToolCallData {
                    index,
                    data: json!({PROVIDER: data}),
                });
            }
            out.push(StreamEvent::ToolCallEnd { index });
            return;
        }
        let is_thought = part["thought"] == true;
        match part.get("text").and_then(Value::as_str) {
            Some(text) if is_thought => match &mut self.thought {
                Some(pending) if pending.get("thoughtSignature").is_none() => {
                    let joined = format!("{}{text}", pending["text"].as_str().unwrap_or(""));
                    pending["text"] = json!(joined);
                    if let Some(sig) = signature {
                        pending["thoughtSignature"] = sig;
                    }
                }
                _ => {
                    self.flush_thought(out);
                    self.thought = Some(part.clone());
                }
            },
            Some(text) => {
                self.flush_thought(out);
                if !text.is_empty() {
                    out.push(StreamEvent::TextDelta(text.to_string()));
                }
                if let Some(sig) = signature {
                    out.push(StreamEvent::Part(ProviderPart {
                        provider: PROVIDER.into(),
                        data: json!({"thoughtSignature": sig}),
                    }));
                }
            }
            None => {
                self.flush_thought(out);
                out.push(StreamEvent::Part(ProviderPart {
                    provider: PROVIDER.into(),
                    data: part.clone(),
                }));
            }
        }
    }

    /// Decodes one `GenerateContentResponse` chunk.
    pub(super) fn chunk(
        &mut self,
        v: &Value,
        out: &mut Vec<StreamEvent>,
    ) -> Result<(), ModelError> {
        if let Some(error) = v.get("error").filter(|e| e.is_object()) {
            return Err(ModelError::Api(api_error(200, error)));
        }
        self.seen_chunk = true;
        if v.pointer("/promptFeedback/blockReason").is_some() {
            self.blocked = true;
        }
        if let Some(candidate) = v["candidates"].as_array().and_then(|c| c.first()) {
            if let Some(parts) = candidate
                .pointer("/content/parts")
                .and_then(Value::as_array)
            {
                for part in parts {
                    self.part(part, out);
                }
            }
            if let Some(r) = candidate["finishReason"].as_str() {
                self.finish_reason = Some(r.to_string());
            }
            if let Some(m) = candidate["finishMessage"].as_str() {
                self.finish_message = Some(m.to_string());
            }
        }
        if let Some(meta) = v.get("usageMetadata").filter(|m| m.is_object()) {
            out.extend(usage(meta).map(StreamEvent::Usage));
        }
        Ok(())
    }

    /// The closing events, after the last chunk.
    pub(super) fn end(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        self.flush_thought(out);
        if self.blocked && self.finish_reason.is_none() {
            out.push(StreamEvent::Finish(FinishReason::ContentFilter));
            return Ok(());
        }
        if self.finish_reason.is_none() {
            return Err(ModelError::Transport {
                message: if self.seen_chunk {
                    "the Gemini stream ended before a finishReason".into()
                } else {
                    "the Gemini response holds no candidate".into()
                },
                retryable: true,
            });
        }
        let (reason, malformed) = finish(
            self.finish_reason.as_deref(),
            self.finish_message.as_deref(),
            self.calls > 0,
        );
        if let Some(why) = malformed {
            out.push(StreamEvent::MalformedCall(why));
        }
        out.push(StreamEvent::Finish(reason));
        Ok(())
    }
}

impl SseDecode for ChunkDecoder {
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        let data = ev.data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(());
        }
        // A chunk corrupted or cut short on the way (in the middle of a line) is as retryable as a
        // broken connection (never replayed once output was delivered).
        let v = serde_json::from_str::<Value>(data).map_err(|e| ModelError::Transport {
            message: format!(
                "a Gemini stream chunk is not JSON ({e}): {}",
                snippet(data.as_bytes(), 300)
            ),
            retryable: true,
        })?;
        self.chunk(&v, out)
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        self.end(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode_recorded;
    use super::*;

    #[test]
    fn streamed_chunks_join_and_end_with_finish() {
        let sse = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hel\"}]}}]}\r\n\r\n\
                   data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"lo\"},{\"functionCall\":{\"name\":\"f\",\"args\":{}},\"thoughtSignature\":\"S\"}]},\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":3,\"candidatesTokenCount\":2}}\r\n\r\n";
        let d = decode_recorded(200, sse.as_bytes(), true);
        assert!(d.error.is_none(), "{:?}", d.error);
        assert_eq!(d.response.text.as_deref(), Some("Hello"));
        assert_eq!(d.response.tool_calls[0].name, "f");
        assert_eq!(d.response.finish_reason, FinishReason::ToolCalls);
        assert_eq!(d.response.usage.unwrap().input_tokens, 3);
        let cut = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hel\"}]}}]}\n\n";
        let d = decode_recorded(200, cut.as_bytes(), true);
        assert!(d.error.unwrap().message.contains("finishReason"));
    }
}
