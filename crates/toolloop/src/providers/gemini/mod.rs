//! Google Gemini API, natively: `models/{model}:generateContent` and
//! `models/{model}:streamGenerateContent?alt=sse`.
//!
//! How the message model maps to the wire:
//!
//! - Leading system messages become `systemInstruction`; a later one becomes a user text part
//!   wrapped in `<system-reminder>` tags where it stood.
//! - The tool catalog is one `tools[{functionDeclarations}]` entry; each schema is sent whole as
//!   `parametersJsonSchema` (full JSON Schema).
//! - An assistant turn (`role: "model"`) is sent as its Gemini
//!   [`ProviderPart`](crate::message::ProviderPart)s (thought parts, code parts…, exactly as
//!   received), then its text, then one `functionCall` part per call. Thought signatures go back
//!   unchanged: a call's signature is kept in its `provider_data` as `{"gemini":
//!   {"thoughtSignature": "…"}}`, and a signature that came on a text part is kept as a part
//!   `{"thoughtSignature": "…"}` and put back on the text part. A model turn whose calls carry
//!   no signature (made by another provider, or kept without it) gets Google's documented
//!   placeholder, [`PLACEHOLDER_THOUGHT_SIGNATURE`], on its first call, since Gemini 3 rejects
//!   unsigned calls in the history (not for Gemini 1.x and 2.x models, which never check).
//! - Gemini gives calls no ids (unless it sends `functionCall.id`), so the adapter makes them up.
//!   Tool results go back as `functionResponse` parts carrying the call's name (and the wire id
//!   when there was one), all of a round in one user turn, in call order; the response object is
//!   `{"output": …}` or, for a failed call, `{"error": …}`.
//! - Consecutive turns with the same role are merged; reminders are trailing text parts of the
//!   last user turn.
//!
//! `finishReason` `MALFORMED_FUNCTION_CALL` (and `UNEXPECTED_TOOL_CALL`) give
//! [`FinishReason::MalformedToolCall`](crate::model::FinishReason::MalformedToolCall) with
//! [`ModelResponse::malformed_call`] explaining what the model must do instead. Errors come from
//! the `{"error": {code, message, status, details}}` body; a `google.rpc.RetryInfo` detail's
//! `retryDelay` becomes the wait before a retry.

use crate::model::{EventStream, Model, ModelError, ModelRequest, ModelResponse};
#[cfg(any(test, feature = "testing"))]
use crate::providers::Decoded;
use crate::transport::wire;
use async_trait::async_trait;
use futures::StreamExt;
use response::decode_body;
use stream::ChunkDecoder;

mod config;
mod error;
mod request;
mod response;
mod stream;

pub use config::{API_VERSION, DEFAULT_BASE_URL, GeminiConfig, OWNED_FIELDS, PROVIDER};
use error::classify;
pub(crate) use error::overflow_counts;
pub use error::{parse_duration, parse_error};
pub use request::PLACEHOLDER_THOUGHT_SIGNATURE;
// Adapter internals, public only for this crate's tests and benchmarks (feature `testing`).
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use request::build_request_body;
#[cfg(not(feature = "testing"))]
use request::build_request_body;
pub use response::decode_response;

/// A model behind the Gemini API.
#[derive(Debug, Clone)]
pub struct GeminiModel {
    config: GeminiConfig,
}

impl GeminiModel {
    /// A model with this configuration.
    pub fn new(config: GeminiConfig) -> Self {
        GeminiModel { config }
    }

    /// The configuration.
    pub fn config(&self) -> &GeminiConfig {
        &self.config
    }

    fn model_for<'a>(&'a self, req: &'a ModelRequest<'_>) -> &'a str {
        req.settings.model.as_deref().unwrap_or(&self.config.model)
    }
}

#[async_trait]
impl Model for GeminiModel {
    fn name(&self) -> &str {
        &self.config.model
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        wire::check_extras(
            "Gemini",
            self.config.extra.as_ref(),
            Some(request),
            OWNED_FIELDS,
        )?;
        let body = build_request_body(request, &self.config, false);
        self.config
            .transport
            .post_json(
                &self.config.generate_url(self.model_for(request)).into(),
                &self.config.headers()?,
                body.to_string().into(),
                parse_error,
                decode_body,
            )
            .await
            .map_err(classify)
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        wire::check_extras(
            "Gemini",
            self.config.extra.as_ref(),
            Some(request),
            OWNED_FIELDS,
        )?;
        let body = build_request_body(request, &self.config, true).to_string();
        let stream = wire::open_sse_stream(
            &self.config.transport,
            self.config.stream_url(self.model_for(request)).into(),
            self.config.headers()?,
            body.into(),
            parse_error,
            ChunkDecoder::default,
        )
        .await
        .map_err(classify)?;
        Ok(Box::pin(stream.map(|item| item.map_err(classify))))
    }
}

/// Decodes a recorded response body as the adapter would: `status` is the HTTP status, `stream`
/// whether the body is an SSE stream (`alt=sse`). Used by the conformance tests.
#[cfg(any(test, feature = "testing"))]
pub fn decode_recorded(status: u16, body: &[u8], stream: bool) -> Decoded {
    wire::decode_recorded(
        status,
        body,
        stream,
        parse_error,
        ChunkDecoder::default(),
        |body| match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(v) => response::decode_chunks(std::slice::from_ref(&v)),
            Err(e) => (
                ModelResponse::default(),
                Some(ModelError::InvalidResponse(format!(
                    "the Gemini response is not JSON ({e})"
                ))),
            ),
        },
    )
}

/// A real-shaped response: a thought part, then two parallel calls, the first signed.
#[cfg(test)]
fn parallel_response() -> serde_json::Value {
    serde_json::json!({
        "candidates": [{
            "content": {"role": "model", "parts": [
                {"text": "thinking about it", "thought": true},
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "SIG_A"},
                {"functionCall": {"name": "get_time", "args": {"tz": "CET"}}},
            ]},
            "finishReason": "STOP",
        }],
        "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 10, "thoughtsTokenCount": 7, "cachedContentTokenCount": 20},
    })
}
