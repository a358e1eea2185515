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

use crate::model::{ModelError, ModelRequest, ModelResponse};
#[cfg(any(test, feature = "testing"))]
use crate::providers::Decoded;
#[cfg(any(test, feature = "testing"))]
use crate::providers::adapter;
use crate::providers::adapter::HttpAdapter;
#[cfg(feature = "http")]
use crate::transport::http::HttpTransport;
use crate::transport::wire::{Endpoint, ErrorParser};
use http::header::HeaderMap;
use response::decode_body;
use serde_json::Value;
use std::borrow::Cow;
use stream::ChunkDecoder;

mod config;
mod error;
mod request;
mod response;
mod stream;

use crate::providers::adapter::ErrorMeaning;
pub use config::{API_VERSION, DEFAULT_BASE_URL, GeminiConfig, OWNED_FIELDS, PROVIDER};
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

impl HttpAdapter for GeminiModel {
    type StreamDecoder = ChunkDecoder;
    type Shape = ();
    const PARSE_ERROR: ErrorParser = parse_error;
    const ERRORS: ErrorMeaning = error::ERRORS;
    const API: &'static str = "Gemini";
    const OWNED_FIELDS: &'static [&'static str] = OWNED_FIELDS;

    fn model(&self) -> &str {
        &self.config.model
    }

    #[cfg(feature = "http")]
    fn transport(&self) -> &HttpTransport {
        &self.config.transport
    }

    fn url(&self, request: &ModelRequest<'_>, stream: bool) -> Cow<'_, Endpoint> {
        Cow::Owned(Endpoint::new(
            self.config.endpoint(self.model_for(request), stream),
        ))
    }

    fn headers(&self, _request: &ModelRequest<'_>) -> Result<Cow<'_, HeaderMap>, ModelError> {
        self.config.headers().map(Cow::Owned)
    }

    fn extra(&self) -> Option<&Value> {
        self.config.extra.as_ref()
    }

    fn request_json(&self, request: &ModelRequest<'_>, stream: bool) -> Value {
        build_request_body(request, &self.config, stream)
    }

    fn decode(body: &[u8]) -> Result<ModelResponse, ModelError> {
        decode_body(body)
    }

    /// What the candidates hold before an error in them.
    #[cfg(any(test, feature = "testing"))]
    fn decode_partial(body: &[u8]) -> adapter::Partial {
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(v) => response::decode_chunks(std::slice::from_ref(&v)),
            Err(e) => (
                ModelResponse::default(),
                Some(ModelError::InvalidResponse(format!(
                    "the Gemini response is not JSON ({e})"
                ))),
            ),
        }
    }

    fn stream_decoder(_status: u16) -> ChunkDecoder {
        ChunkDecoder::default()
    }
}

/// Decodes a recorded response body as the adapter would: `status` is the HTTP status, `stream`
/// whether the body is an SSE stream (`alt=sse`). Used by the conformance tests.
#[cfg(any(test, feature = "testing"))]
pub fn decode_recorded(status: u16, body: &[u8], stream: bool) -> Decoded {
    adapter::decode_recorded_by::<GeminiModel>(status, body, stream)
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
