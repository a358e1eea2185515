//! Complete responses: a `generateContent` response decoded into a [`ModelResponse`].

use super::stream::ChunkDecoder;
use crate::model::{ModelError, ModelResponse};
use crate::providers::adapter;
use crate::providers::adapter::{Partial, snippet};
use serde_json::Value;

/// Decodes a complete `generateContent` response (or a JSON array of streamed chunks).
pub fn decode_response(v: &Value) -> Result<ModelResponse, ModelError> {
    match decode_chunks(std::slice::from_ref(v)) {
        (r, None) => Ok(r),
        (_, Some(e)) => Err(e),
    }
}

pub(super) fn decode_chunks(chunks: &[Value]) -> Partial {
    let chunks: Vec<&Value> = chunks
        .iter()
        .flat_map(|c| match c {
            Value::Array(items) => items.iter().collect::<Vec<_>>(),
            other => vec![other],
        })
        .collect();
    let mut decoder = ChunkDecoder::default();
    let mut events = Vec::new();
    let result = chunks
        .into_iter()
        .try_for_each(|c| decoder.chunk(c, &mut events))
        .and_then(|()| decoder.end(&mut events));
    adapter::accumulate(events, result)
}

pub(super) fn decode_body(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ModelError::InvalidResponse(format!(
            "the Gemini response is not JSON ({e}): {}",
            snippet(body, 300)
        ))
    })?;
    decode_response(&v)
}

#[cfg(test)]
mod tests {
    use super::super::parallel_response;
    use super::*;
    use crate::model::FinishReason;
    use serde_json::json;

    #[test]
    fn parallel_calls_get_ids_signatures_and_usage() {
        let r = decode_response(&parallel_response()).unwrap();
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls.len(), 2);
        assert_ne!(r.tool_calls[0].id, r.tool_calls[1].id);
        assert_eq!(r.tool_calls[0].arguments, json!({"city": "Paris"}));
        assert_eq!(
            r.tool_calls[0].provider_data,
            Some(json!({"gemini": {"thoughtSignature": "SIG_A"}}))
        );
        assert_eq!(r.tool_calls[1].provider_data, None);
        assert_eq!(r.text, None, "thoughts are not text");
        assert_eq!(r.parts.len(), 1);
        let u = r.usage.unwrap();
        assert_eq!(
            (
                u.input_tokens,
                u.output_tokens,
                u.cache_read_tokens,
                u.reasoning_tokens
            ),
            (50, 17, 20, 7)
        );
    }

    #[test]
    fn finish_reasons() {
        let decode = |reason: &str| {
            decode_response(&json!({"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": reason, "finishMessage": "Malformed function call: print(f(1))"}]}))
                .unwrap()
        };
        assert_eq!(decode("STOP").finish_reason, FinishReason::Stop);
        assert_eq!(decode("MAX_TOKENS").finish_reason, FinishReason::Length);
        assert_eq!(decode("SAFETY").finish_reason, FinishReason::ContentFilter);
        assert_eq!(
            decode("RECITATION").finish_reason,
            FinishReason::ContentFilter
        );
        let m = decode("MALFORMED_FUNCTION_CALL");
        assert_eq!(m.finish_reason, FinishReason::MalformedToolCall);
        let why = m.malformed_call.unwrap();
        assert!(
            why.contains("print(f(1))") && why.contains("JSON object"),
            "{why}"
        );
        let blocked =
            decode_response(&json!({"promptFeedback": {"blockReason": "SAFETY"}})).unwrap();
        assert_eq!(blocked.finish_reason, FinishReason::ContentFilter);
        assert!(decode_response(&json!({})).is_err());
    }
}
