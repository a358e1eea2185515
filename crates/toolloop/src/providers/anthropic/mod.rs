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

use crate::model::{EventStream, Model, ModelError, ModelRequest, ModelResponse};
#[cfg(any(test, feature = "testing"))]
use crate::providers::Decoded;
use crate::providers::native_refusal::{self, ContextRefusal};
use crate::transport::wire;
use async_trait::async_trait;
use futures::StreamExt;
use response::decode_message_body;
use stream::StreamDecoder;

mod config;
mod error;
mod request;
mod response;
mod stream;

pub use config::{
    AnthropicConfig, DEFAULT_BASE_URL, DEFAULT_MAX_TOKENS, DEFAULT_VERSION, MAX_CACHE_BREAKPOINTS,
    OWNED_FIELDS, PROVIDER,
};
use error::classify;
pub use error::parse_error;
pub use request::{build_request_body, wire_id};
pub use response::decode_message;

/// A model behind the Anthropic Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicModel {
    config: AnthropicConfig,
    /// Whether the server refused `context_management` (shared by clones).
    refusal: ContextRefusal,
}

impl AnthropicModel {
    /// A model with this configuration.
    pub fn new(config: AnthropicConfig) -> Self {
        AnthropicModel {
            config,
            refusal: ContextRefusal::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AnthropicConfig {
        &self.config
    }
}

impl AnthropicModel {
    async fn complete_once(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        wire::check_extras(
            "Anthropic",
            self.config.extra.as_ref(),
            Some(request),
            OWNED_FIELDS,
        )?;
        let body = build_request_body(request, &self.config, false);
        self.config
            .transport
            .post_json(
                &self.config.messages_url().into(),
                &request::headers(&self.config, request)?,
                body.to_string().into(),
                parse_error,
                decode_message_body,
            )
            .await
            .map_err(classify)
    }

    async fn stream_once(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        wire::check_extras(
            "Anthropic",
            self.config.extra.as_ref(),
            Some(request),
            OWNED_FIELDS,
        )?;
        let body = build_request_body(request, &self.config, true).to_string();
        let stream = wire::open_sse_stream(
            &self.config.transport,
            self.config.messages_url().into(),
            request::headers(&self.config, request)?,
            body.into(),
            parse_error,
            StreamDecoder::default,
        )
        .await
        .map_err(classify)?;
        Ok(Box::pin(stream.map(|item| item.map_err(classify))))
    }
}

#[async_trait]
impl Model for AnthropicModel {
    fn name(&self) -> &str {
        &self.config.model
    }

    /// A request asking for `context_management` that the server refuses is sent again
    /// without it (see [`crate::context::native`]).
    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        if let Some(settings) = self.refusal.settings_without(request) {
            let request = ModelRequest {
                settings: &settings,
                ..*request
            };
            return self
                .complete_once(&request)
                .await
                .map(native_refusal::mark_refused);
        }
        match self.complete_once(request).await {
            Err(e) => {
                let Some(settings) =
                    self.refusal
                        .learn(request, &e, &self.config.base_url, &self.config.model)
                else {
                    return Err(e);
                };
                let request = ModelRequest {
                    settings: &settings,
                    ..*request
                };
                self.complete_once(&request)
                    .await
                    .map(native_refusal::mark_refused)
            }
            done => done,
        }
    }

    /// As [`Self::complete`], the refusal coming as the stream's opening error.
    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        let settings = match self.refusal.settings_without(request) {
            Some(settings) => settings,
            None => match self.stream_once(request).await {
                Err(e) => {
                    match self
                        .refusal
                        .learn(request, &e, &self.config.base_url, &self.config.model)
                    {
                        Some(settings) => settings,
                        None => return Err(e),
                    }
                }
                open => return open,
            },
        };
        let request = ModelRequest {
            settings: &settings,
            ..*request
        };
        let stream = self.stream_once(&request).await?;
        let head = futures::stream::once(async { Ok(native_refusal::refused_event()) });
        Ok(Box::pin(head.chain(stream)))
    }

    /// The Messages API clears old tool results itself (`context_management`), unless this
    /// model's server refused it.
    fn native_context(&self) -> crate::context::NativeSupport {
        crate::context::NativeSupport {
            clear_tool_results: !self.refusal.refused(),
            compaction: false,
        }
    }
}
/// Decodes a recorded response body as the adapter would: `status` is the HTTP status, `stream`
/// whether the body is an SSE stream. Used by the conformance tests.
#[cfg(any(test, feature = "testing"))]
pub fn decode_recorded(status: u16, body: &[u8], stream: bool) -> Decoded {
    wire::decode_recorded(
        status,
        body,
        stream,
        parse_error,
        StreamDecoder::default(),
        |body| wire::whole(decode_message_body(body)),
    )
}
