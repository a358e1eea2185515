//! The OpenAI Responses API adapter (`POST {base_url}/responses`), complete and streamed: the
//! API OpenAI's own agents use, and the one that carries a reasoning model's reasoning from one
//! round to the next.
//!
//! [`ResponsesModel`] sends the conversation as `input` items and the tool catalog as function
//! tools, and turns the reply's `output` items, complete or streamed (Server-Sent Events), into a
//! [`ModelResponse`] or [`StreamEvent`](crate::stream::StreamEvent)s. Retries, backoff,
//! `Retry-After`, the body-size cap, key redaction and the request debug log come from
//! [`HttpTransport`](crate::transport::http::HttpTransport), as for every HTTP adapter; a stream
//! that has delivered output is never replayed.
//!
//! # How the message model maps to the wire
//!
//! | toolloop | Responses API |
//! |---|---|
//! | leading system messages | `instructions` (joined by blank lines) |
//! | a later system message | a `system` message item where it stood |
//! | a user turn | a `user` message item |
//! | an assistant turn | its reasoning items (kept as [`ProviderPart`](crate::message::ProviderPart)s of provider [`PROVIDER`], exactly as received, in order), an `assistant` message with its text, one `function_call` item per call (`call_id`, `name`, `arguments` as JSON text) |
//! | a tool result | a `function_call_output` item (`call_id`, `output`) |
//! | reminders | trailing `developer` message items |
//! | the catalog | `tools: [{type: "function", name, description, parameters, strict}]`, `tool_choice` |
//! | `max_output_tokens`, `temperature` | the same fields |
//!
//! Every request says `store: false` unless [`ResponsesConfig::store`] is on, so the server keeps
//! nothing and each request carries the whole conversation. When reasoning is requested
//! ([`ResponsesConfig::reasoning`], or an `extra` that sets `reasoning`), the request asks for
//! `include: ["reasoning.encrypted_content"]`: the reasoning items come back with their encrypted
//! content, are kept in the transcript and are sent back on the next round, which a reasoning
//! model needs to continue its reasoning across tool calls. A reasoning item without encrypted
//! content is sent back only with `store` on (the server refuses an id it did not store).
//!
//! # Replies
//!
//! `message` items' `output_text` parts are the text; a `refusal` part is kept as a part (a
//! reply that is only a refusal finishes with
//! [`FinishReason::ContentFilter`](crate::model::FinishReason::ContentFilter)); `function_call`
//! items are the calls (their `call_id` is the call id); `reasoning` items are parts; other items
//! (built-in tools) are ignored. `status: "incomplete"` is
//! [`FinishReason::Length`](crate::model::FinishReason::Length) (or `ContentFilter` when
//! `incomplete_details.reason` says so); a call cut by the limit is reported but never run.
//! `usage.input_tokens` (cached tokens included), `output_tokens`,
//! `input_tokens_details.cached_tokens` and `output_tokens_details.reasoning_tokens` become
//! [`Usage`](crate::usage::Usage).
//!
//! Streamed, `response.output_item.added`, `response.output_text.delta`,
//! `response.function_call_arguments.delta` / `.done` and `response.output_item.done` build the
//! reply; `response.completed` or `response.incomplete` ends it with its usage and status; a
//! stream that ends before either is a retryable transport error. Unknown events are ignored;
//! whatever did not come as deltas is taken from the items' `done` events or from the final
//! response object, so a server that sends only `response.completed` still works.
//!
//! # Errors
//!
//! HTTP errors are read and classified as for Chat Completions (the body shape is the same; see
//! [`parse_error`]): 429, 500, 502, 503 and 504 are retryable, with `Retry-After`. A
//! `response.failed` event, a `failed` response, or an `error` event is an
//! [`ModelError::Api`] with the error's code and message, retryable when the code or type says
//! the server failed or was rate-limited.

use crate::model::{ModelError, ModelRequest, ModelResponse};
#[cfg(any(test, feature = "testing"))]
use crate::providers::Decoded;
#[cfg(any(test, feature = "testing"))]
use crate::providers::adapter;
use crate::providers::adapter::ErrorMeaning;
use crate::providers::adapter::HttpAdapter;
use crate::transport::wire::{Endpoint, ErrorParser};
use http::header::HeaderMap;
use response::decode_response_body;
use std::borrow::Cow;
use stream::StreamDecoder;

mod config;
mod error;
mod request;
mod response;
mod stream;

pub use config::{DEFAULT_BASE_URL, OWNED_FIELDS, PROVIDER, ResponsesConfig};
pub use error::parse_error;
// Adapter internals, public only for this crate's tests and benchmarks (feature `testing`).
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use request::build_request_body;
#[cfg(not(feature = "testing"))]
use request::build_request_body;
pub use response::decode_response;

/// A model behind the OpenAI Responses API.
#[derive(Debug, Clone)]
pub struct ResponsesModel {
    config: ResponsesConfig,
    /// Whether the server refused `context_management` (shared by clones).
    refusal: crate::providers::adapter::ContextRefusal,
}

impl ResponsesModel {
    /// A model with this configuration. A key that cannot be sent in a header is reported by the
    /// first call, as [`ModelError::Config`].
    pub fn new(config: ResponsesConfig) -> Self {
        ResponsesModel {
            config,
            refusal: crate::providers::adapter::ContextRefusal::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ResponsesConfig {
        &self.config
    }

    /// The exact body this model sends for `request` (streamed or not), after checking the
    /// `extra`s.
    pub fn request_body(
        &self,
        request: &ModelRequest<'_>,
        stream: bool,
    ) -> Result<bytes::Bytes, ModelError> {
        HttpAdapter::body(self, request, stream, ())
    }
}

impl HttpAdapter for ResponsesModel {
    type StreamDecoder = StreamDecoder;
    type Shape = ();
    const PARSE_ERROR: ErrorParser = parse_error;
    const ERRORS: ErrorMeaning = error::ERRORS;
    const API: &'static str = "OpenAI Responses";
    const OWNED_FIELDS: &'static [&'static str] = OWNED_FIELDS;

    fn model(&self) -> &str {
        &self.config.model
    }

    #[cfg(feature = "http")]
    fn transport(&self) -> &crate::transport::http::HttpTransport {
        &self.config.transport
    }

    fn url(&self, _request: &ModelRequest<'_>, _stream: bool) -> Cow<'_, Endpoint> {
        Cow::Owned(Endpoint::new(self.config.endpoint()))
    }

    fn headers(&self, _request: &ModelRequest<'_>) -> Result<Cow<'_, HeaderMap>, ModelError> {
        self.config.headers().map(Cow::Owned)
    }

    fn extra(&self) -> Option<&serde_json::Value> {
        self.config.extra.as_ref()
    }

    /// Each `extra` is a JSON object that sets none of the [`OWNED_FIELDS`].
    fn check(&self, request: &ModelRequest<'_>) -> Result<(), ModelError> {
        config::check_extra("the adapter's `extra`", self.extra())?;
        config::check_extra("the settings' `extra`", request.settings.extra.as_ref())
    }

    fn request_json(&self, request: &ModelRequest<'_>, stream: bool) -> serde_json::Value {
        build_request_body(request, &self.config, stream)
    }

    fn decode(body: &[u8]) -> Result<ModelResponse, ModelError> {
        decode_response_body(body)
    }

    fn stream_decoder(status: u16) -> StreamDecoder {
        StreamDecoder::new(status)
    }

    /// The Responses API compacts the conversation itself (`context_management`).
    fn native_context(&self) -> crate::context::NativeSupport {
        crate::context::NativeSupport {
            clear_tool_results: false,
            compaction: true,
        }
    }

    /// A server or model without `context_management` refuses it: remembered here.
    fn context_refusal(&self) -> Option<&crate::providers::adapter::ContextRefusal> {
        Some(&self.refusal)
    }
}

/// Decodes one recorded response body as the adapter would (the conformance tests): the HTTP
/// `status`, the raw body, and whether it is an SSE stream.
#[cfg(any(test, feature = "testing"))]
pub fn decode_recorded(status: u16, body: &[u8], stream: bool) -> Decoded {
    adapter::decode_recorded_by::<ResponsesModel>(status, body, stream)
}
