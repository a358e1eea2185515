//! Anthropic Messages API (`POST /v1/messages`), complete and streamed, with prompt caching.
//!
//! How the message model maps to the wire:
//!
//! - Leading system messages become the top-level `system` field. A system message that appears
//!   later in the conversation (Anthropic has no mid-conversation system role) becomes a text
//!   block of a user turn, wrapped in `<system-reminder>` tags, where it stood.
//! - An assistant turn is sent as its Anthropic [`ProviderPart`](crate::message::ProviderPart)s
//!   (thinking, redacted thinking, server-side tool blocks, exactly as received, signatures
//!   included), then its text, then its `tool_use` blocks. Parts of other providers are left out.
//! - Tool results become `tool_result` blocks of the next user turn: all results of a round in one
//!   user message, first in it, in the order of the calls (`is_error` on failures). A call with no
//!   recorded result is answered with an error result; a result that answers no call of the
//!   previous turn is sent as text.
//! - Consecutive turns with the same role are merged, so roles always alternate.
//! - Transient reminders are text blocks at the end of the last user turn.
//!
//! Prompt caching ([`AnthropicConfig::cache`], on by default) puts `cache_control` breakpoints on
//! the last tool of the catalog, the system prompt, the last stable turn (the last message before
//! the reminders) and the previous round's last stable turn, at most four. Everything before the
//! reminders is built the same way on every round, so round N+1's request repeats round N's
//! prefix and reads it from the cache.
//!
//! Context management ([`crate::context::native`]): a request that asks the provider to clear
//! old tool results carries `context_management` with one `clear_tool_uses_20250919` edit and
//! the `anthropic-beta: context-management-2025-06-27` header (added to any beta the
//! configuration's headers already name); the edits the API reports applying
//! (`context_management.applied_edits`, in the response or the stream's `message_delta`)
//! become [`ModelResponse::context_edited`].
//!
//! Usage: `input_tokens` is Anthropic's `input_tokens` plus `cache_read_input_tokens` plus
//! `cache_creation_input_tokens` (toolloop's [`Usage`](crate::usage::Usage) counts cached tokens as
//! input).

use crate::model::{ModelError, ModelRequest, ModelResponse};
#[cfg(any(test, feature = "testing"))]
use crate::providers::Decoded;
use crate::providers::adapter::{self, HttpAdapter};
#[cfg(feature = "http")]
use crate::transport::http::HttpTransport;
use crate::transport::wire::{Endpoint, ErrorParser};
use http::header::HeaderMap;
use response::decode_message_body;
use serde_json::Value;
use std::borrow::Cow;
use stream::StreamDecoder;

mod config;
mod error;
mod request;
mod response;
mod stream;

use crate::providers::adapter::ErrorMeaning;
pub use config::{
    AnthropicConfig, DEFAULT_BASE_URL, DEFAULT_MAX_TOKENS, DEFAULT_VERSION, MAX_CACHE_BREAKPOINTS,
    OWNED_FIELDS, PROVIDER,
};
pub use error::parse_error;
// Adapter internals, public only for this crate's tests and benchmarks (feature `testing`).
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use request::build_request_body;
#[cfg(not(feature = "testing"))]
use request::build_request_body;

/// A model behind the Anthropic Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicModel {
    config: AnthropicConfig,
    /// Whether the server refused `context_management` (shared by clones).
    refusal: adapter::ContextRefusal,
}

impl AnthropicModel {
    /// A model with this configuration.
    pub fn new(config: AnthropicConfig) -> Self {
        AnthropicModel {
            config,
            refusal: adapter::ContextRefusal::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AnthropicConfig {
        &self.config
    }
}

impl HttpAdapter for AnthropicModel {
    type StreamDecoder = StreamDecoder;
    type Shape = ();
    const PARSE_ERROR: ErrorParser = parse_error;
    const ERRORS: ErrorMeaning = error::ERRORS;
    const API: &'static str = "Anthropic";
    const OWNED_FIELDS: &'static [&'static str] = OWNED_FIELDS;

    fn model(&self) -> &str {
        &self.config.model
    }

    #[cfg(feature = "http")]
    fn transport(&self) -> &HttpTransport {
        &self.config.transport
    }

    fn url(&self, _request: &ModelRequest<'_>, _stream: bool) -> Cow<'_, Endpoint> {
        Cow::Owned(Endpoint::new(self.config.endpoint()))
    }

    fn headers(&self, request: &ModelRequest<'_>) -> Result<Cow<'_, HeaderMap>, ModelError> {
        request::headers(&self.config, request).map(Cow::Owned)
    }

    fn extra(&self) -> Option<&Value> {
        self.config.extra.as_ref()
    }

    fn request_json(&self, request: &ModelRequest<'_>, stream: bool) -> Value {
        build_request_body(request, &self.config, stream)
    }

    fn decode(body: &[u8]) -> Result<ModelResponse, ModelError> {
        decode_message_body(body)
    }

    fn stream_decoder(_status: u16) -> StreamDecoder {
        StreamDecoder::default()
    }

    /// The Messages API clears old tool results itself (`context_management`).
    fn native_context(&self) -> crate::context::NativeSupport {
        crate::context::NativeSupport {
            clear_tool_results: true,
            compaction: false,
        }
    }

    /// A server or model without `context_management` refuses it: remembered here.
    fn context_refusal(&self) -> Option<&adapter::ContextRefusal> {
        Some(&self.refusal)
    }
}

/// Decodes a recorded response body as the adapter would: `status` is the HTTP status, `stream`
/// whether the body is an SSE stream. Used by the conformance tests.
#[cfg(any(test, feature = "testing"))]
pub fn decode_recorded(status: u16, body: &[u8], stream: bool) -> Decoded {
    adapter::decode_recorded_by::<AnthropicModel>(status, body, stream)
}
