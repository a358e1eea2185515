//! The OpenAI Chat Completions adapter, for OpenAI and every server that speaks the same API.
//!
//! [`OpenAiModel`] sends the conversation and the tool catalog to `POST
//! {base_url}/chat/completions` and turns the reply, complete or streamed (Server-Sent Events),
//! into a [`ModelResponse`] or [`StreamEvent`](crate::stream::StreamEvent)s. Retries, backoff,
//! `Retry-After` and the body-size cap come from
//! [`HttpTransport`]; a stream that has delivered output is
//! never replayed.
//!
//! # Pointing it at a server
//!
//! Set [`OpenAiConfig::base_url`] (or the `OPENAI_BASE_URL` variable read by
//! [`OpenAiConfig::from_env`]). The key goes in the `Authorization: Bearer` header; local servers
//! need none.
//!
//! | server | base URL | notes |
//! |---|---|---|
//! | OpenAI | `https://api.openai.com/v1` (default) | key from `OPENAI_API_KEY` |
//! | vLLM | `http://localhost:8000/v1` | start it with `--enable-auto-tool-choice --tool-call-parser <parser>` |
//! | Ollama | `http://localhost:11434/v1` | the model must support tools (`ollama show <model>`) |
//! | llama.cpp (`llama-server`) | `http://localhost:8080/v1` | start it with `--jinja` |
//! | LM Studio | `http://localhost:1234/v1` | |
//! | Groq | `https://api.groq.com/openai/v1` | `--api-key-env GROQ_API_KEY` |
//! | OpenRouter | `https://openrouter.ai/api/v1` | `--api-key-env OPENROUTER_API_KEY` |
//! | Together | `https://api.together.xyz/v1` | `--api-key-env TOGETHER_API_KEY` |
//! | DeepSeek | `https://api.deepseek.com/v1` | `--api-key-env DEEPSEEK_API_KEY` |
//! | Mistral | `https://api.mistral.ai/v1` | `--api-key-env MISTRAL_API_KEY` |
//! | Gemini | `https://generativelanguage.googleapis.com/v1beta/openai` | `--api-key-env GEMINI_API_KEY` |
//!
//! A base URL that already ends in `/chat/completions` is used as it is.
//!
//! # What differs between OpenAI and the other servers
//!
//! - Transient reminders ([`ModelRequest::reminders`]) go after the conversation: as trailing
//!   `system` messages for OpenAI, and as one trailing `user` message elsewhere, because many chat
//!   templates reject a system message that is not first ([`ReminderRole`] overrides this). When
//!   the conversation already ends with a user turn, the reminders are appended to it on the wire,
//!   so that strict templates never see two user turns in a row.
//! - The output limit is sent as `max_completion_tokens` to OpenAI and as `max_tokens` elsewhere.
//! - A request that offers tools says `"tool_choice": "auto"` to other servers, where OpenAI's
//!   leaves it out (its default): llama-cpp-python's server ignores the tools unless it is said
//!   ([`OpenAiConfig::explicit_tool_choice`]).
//! - What a server refuses is learned from its answers and remembered by the model (one model,
//!   one server), said once at `warn`: a refused `tool_choice` (an empty stream, which is
//!   llama-cpp-python's answer to `"auto"` while streaming, remembered for streamed requests; or
//!   a 400, 422 or 500 naming the field) is left out and the call made again; a refused
//!   `response_format` of type `json_schema` (a 400, 422 or 500 naming `response_format`,
//!   `json_schema` or `json_object`) becomes `json_object`, with the schema's instructions after
//!   the conversation, and the call is made again (the loop validates the answer either way). A
//!   2xx stream with no event at all is an error that says so.
//! - An assistant turn with tool calls and no text is sent with `"content": ""`, never `null`,
//!   which llama-cpp-python's server refuses.
//! - Fields given in [`OpenAiConfig::extra`] and then
//!   [`ModelSettings::extra`](crate::model::ModelSettings::extra) are merged into the top level of
//!   the request body last, so they can add or replace anything (`{"top_k": 20}`,
//!   `{"reasoning_effort": "low"}`, `{"max_tokens": 512}`).
//!
//! # Replies
//!
//! Every quirk of the conformance corpus (`tests/conformance/`) is handled: tool-call deltas
//! without an `index` or with one starting at 1, ids and names that are empty or repeated in later
//! deltas (the first non-empty one wins; a new id under an index already used starts a new call),
//! usage in a last chunk with empty `choices`, SSE comment lines, an error object inside a 200
//! stream (an error chunk arriving after a `finish_reason` only restates it and is ignored),
//! arguments sent as a JSON object instead of a string, a choice with no message, and content sent
//! as an array of parts. Reasoning (`reasoning_content`, `reasoning`) and refusals are not text.
//! `reasoning_content` is kept as a [`ProviderPart`](crate::message::ProviderPart) and sent back on
//! later turns (DeepSeek requires it after tool calls); a refusal is kept as a part too, and sent
//! back as the assistant's `refusal` field. Gemini's `extra_content` (thought signatures) is kept
//! on the message and on each tool call and sent back unchanged.
//!
//! Servers other than OpenAI's own let a call slip into `content` when their tool parser misses
//! it (Ollama, vLLM): with [`OpenAiConfig::rescue_text_tool_calls`] (on by default for them),
//! such calls are recovered as tool calls, complete or streamed, through [`Rescue`].
//!
//! Invalid argument JSON from the model is never replayed: the assistant turn carries the always
//! valid [`ToolCall::arguments`](crate::message::ToolCall::arguments) value, and the loop reports
//! the parse error in the tool result.
//!
//! # Errors
//!
//! A non-2xx status becomes [`ModelError::Api`] with the provider's error type, code (a numeric
//! code becomes its text) and message; 429, 500, 502, 503 and 504 are retryable. A 400, 404, 422
//! or 500 saying the server or model does not support tools (Ollama's "does not support tools",
//! vLLM's "auto tool choice requires --enable-auto-tool-choice", llama.cpp's "tools param requires
//! --jinja flag", …) becomes [`ModelError::ToolsUnsupported`], the signal for falling back to
//! prompt-based tool calling.

use crate::model::{
    EventStream, Model, ModelError, ModelRequest, ModelResponse, ToolChoice, ToolSpec,
};
#[cfg(any(test, feature = "testing"))]
use crate::providers::Decoded;
#[cfg(feature = "http")]
use crate::providers::adapter::HeldTarget;
use crate::providers::adapter::{ErrorMeaning, HttpAdapter, Target};
use crate::ptk::Rescue;
#[cfg(feature = "http")]
use crate::transport::http::HttpTransport;
use crate::transport::wire::{Endpoint, ErrorParser};
use async_trait::async_trait;
use bytes::Bytes;
use config::check_extra;
pub(crate) use error::{context_overflow, tools_unsupported};
use http::header::{AUTHORIZATION, HeaderMap};
use request::{BodyRoom, EncodedPrefix, SharedCatalog};
use response::decode_response;
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use stream::ChunkDecoder;

mod config;
mod error;
mod in_place;
#[cfg(test)]
mod json_text;
mod request;
mod response;
mod stream;

pub(crate) use config::is_openai_url;
pub use config::{DEFAULT_BASE_URL, OWNED_FIELDS, OpenAiConfig, PROVIDER, ReminderRole};
pub(crate) use error::api_error_from_value;
pub use error::parse_error;
// Adapter internals, public only for this crate's tests and benchmarks (feature `testing`).
#[cfg(not(feature = "testing"))]
use request::{WireRequest, build_request_body};
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use request::{WireRequest, build_request_body};

/// A model behind the OpenAI Chat Completions API.
#[derive(Clone)]
pub struct OpenAiModel {
    inner: Arc<Inner>,
    /// A session's encoding of its run's conversation so far ([`OpenAiSession`]); `None`: every
    /// request encodes every message.
    prefix: Option<Arc<Mutex<EncodedPrefix>>>,
}

#[derive(Debug)]
struct Inner {
    config: OpenAiConfig,
    /// Where every call goes, parsed once, and its headers (none when the key cannot be sent
    /// in one): shared with the streams opened, which keep them to open again.
    target: Arc<Target>,
    /// Why the key cannot be sent in a header, if it cannot.
    key_error: Option<ModelError>,
    /// What this server refused so far (the model talks to one server).
    refused: Refused,
    /// The tool catalog of the last streamed request with the text-call rescue on, shared by
    /// the rescues of the streams to come while the catalog stays the same.
    rescue_tools: Mutex<Option<Arc<[ToolSpec]>>>,
    /// The encoding of the tool catalog its sessions last offered, shared by them.
    catalogs: SharedCatalog,
    /// How long its sessions' conversations grew, for the room of a new session's first body.
    body_room: BodyRoom,
}

/// Request fields a server refused, learned from its answers and remembered for its later
/// requests.
#[derive(Debug, Default)]
struct Refused {
    /// `tool_choice`, in any request.
    tool_choice: AtomicBool,
    /// `tool_choice` in a streamed request (llama-cpp-python answers `"auto"` while streaming
    /// with an empty stream).
    streamed_tool_choice: AtomicBool,
    /// `response_format` of type `json_schema` (llama-cpp-python takes only `text` and
    /// `json_object`).
    json_schema: AtomicBool,
}

/// How a request is written, after what the server refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Leave `tool_choice` out.
    omit_tool_choice: bool,
    /// Ask for `json_object` output (with the schema in the prompt) instead of `json_schema`.
    json_object: bool,
}

impl std::fmt::Debug for OpenAiModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiModel")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl OpenAiModel {
    /// A model with this configuration. A key that cannot be sent in a header is reported by the
    /// first call, as [`ModelError::Config`].
    pub fn new(config: OpenAiConfig) -> Self {
        let mut headers = HeaderMap::new();
        let key_error = crate::providers::adapter::insert_key(
            &mut headers,
            AUTHORIZATION,
            "Bearer ",
            config.api_key.as_deref(),
        )
        .err();
        let url = Endpoint::new(config.endpoint());
        OpenAiModel {
            inner: Arc::new(Inner {
                config,
                target: Arc::new(Target { url, headers }),
                key_error,
                refused: Refused::default(),
                rescue_tools: Mutex::default(),
                catalogs: SharedCatalog::default(),
                body_room: BodyRoom::default(),
            }),
            prefix: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &OpenAiConfig {
        &self.inner.config
    }

    /// Whether calls written as text are rescued from the responses to this request.
    fn rescues(&self, request: &ModelRequest<'_>) -> bool {
        self.inner.config.rescue_text_tool_calls && !request.tools.is_empty()
    }

    /// The exact body this model sends for `request` (streamed or not), after checking the
    /// configuration. Every message is encoded; an [`OpenAiSession`] reuses the encoding of the
    /// messages its run's previous request already had.
    pub fn request_body(
        &self,
        request: &ModelRequest<'_>,
        stream: bool,
    ) -> Result<Bytes, ModelError> {
        OpenAiModel {
            inner: self.inner.clone(),
            prefix: None,
        }
        .body(request, stream, HttpAdapter::shape(self, stream))
    }

    /// The body in `shape`: every message encoded, or, in a session, the messages added since
    /// its previous request (the encoding of the conversation kept for the next one).
    fn encode(
        &self,
        request: &ModelRequest<'_>,
        stream: bool,
        shape: Shape,
    ) -> Result<Bytes, ModelError> {
        let wire = self.wire(request, stream, shape);
        let Some(prefix) = &self.prefix else {
            return serde_json::to_vec(&wire)
                .map(Bytes::from)
                .map_err(serialize_error);
        };
        let mut slot = prefix.lock().unwrap_or_else(PoisonError::into_inner);
        // Taken out, and put back only whole: a failed encoding leaves nothing half-written.
        let mut taken = std::mem::take(&mut *slot);
        let body = wire
            .encode_cached(&mut taken, &self.inner.catalogs, &self.inner.body_room)
            .map_err(serialize_error)?;
        *slot = taken;
        Ok(body)
    }

    /// The body of `request` in `shape`.
    fn wire<'a>(
        &'a self,
        request: &'a ModelRequest<'a>,
        stream: bool,
        shape: Shape,
    ) -> WireRequest<'a> {
        WireRequest::new(request, &self.inner.config, stream)
            .without_tool_choice(shape.omit_tool_choice)
            .json_object_output(shape.json_object)
    }

    /// `tools`, shared: the copy made for an earlier stream when it holds the same tools (the
    /// catalog of a run, and of most runs, stays the same), else a new one, kept for the next.
    fn shared_tools(&self, tools: &[ToolSpec]) -> Arc<[ToolSpec]> {
        let mut kept = self
            .inner
            .rescue_tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match kept.as_ref() {
            Some(shared) if shared[..] == *tools => shared.clone(),
            _ => {
                let shared: Arc<[ToolSpec]> = Arc::from(tools);
                *kept = Some(shared.clone());
                shared
            }
        }
    }
}

fn serialize_error(e: serde_json::Error) -> ModelError {
    ModelError::Other(format!("could not serialize the request: {e}"))
}

impl HttpAdapter for OpenAiModel {
    type StreamDecoder = ChunkDecoder;
    type Shape = Shape;
    const PARSE_ERROR: ErrorParser = parse_error;
    const ERRORS: ErrorMeaning = error::ERRORS;
    const API: &'static str = "OpenAI";
    const OWNED_FIELDS: &'static [&'static str] = OWNED_FIELDS;

    fn model(&self) -> &str {
        &self.inner.config.model
    }

    #[cfg(feature = "http")]
    fn transport(&self) -> &HttpTransport {
        &self.inner.config.transport
    }

    fn url(&self, _request: &ModelRequest<'_>, _stream: bool) -> Cow<'_, Endpoint> {
        Cow::Borrowed(&self.inner.target.url)
    }

    fn headers(&self, _request: &ModelRequest<'_>) -> Result<Cow<'_, HeaderMap>, ModelError> {
        match &self.inner.key_error {
            None => Ok(Cow::Borrowed(&self.inner.target.headers)),
            Some(e) => Err(e.clone()),
        }
    }

    /// The model's own target, shared: every call goes to one URL with the same headers.
    #[cfg(feature = "http")]
    fn stream_target(&self, _request: &ModelRequest<'_>) -> Result<HeldTarget, ModelError> {
        match &self.inner.key_error {
            None => Ok(HeldTarget::Shared(self.inner.target.clone())),
            Some(e) => Err(e.clone()),
        }
    }

    fn extra(&self) -> Option<&serde_json::Value> {
        self.inner.config.extra.as_ref()
    }

    /// Each `extra` is a JSON object that sets none of the [`OWNED_FIELDS`], and the key can be
    /// sent in a header.
    fn check(&self, request: &ModelRequest<'_>) -> Result<(), ModelError> {
        check_extra("the adapter's `extra`", self.extra())?;
        check_extra("the settings' `extra`", request.settings.extra.as_ref())?;
        match &self.inner.key_error {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }

    /// The body as a value; [`HttpAdapter::body`] writes the same fields straight to bytes.
    fn request_json(&self, request: &ModelRequest<'_>, stream: bool) -> serde_json::Value {
        build_request_body(request, &self.inner.config, stream)
    }

    /// The body serialized straight from the conversation, in `shape`; in a session, the
    /// encoding of the messages its run's previous request already had is reused.
    fn body(
        &self,
        request: &ModelRequest<'_>,
        stream: bool,
        shape: Shape,
    ) -> Result<Bytes, ModelError> {
        self.check(request)?;
        self.encode(request, stream, shape)
    }

    /// How requests are written to this server now, after what it refused.
    fn shape(&self, stream: bool) -> Shape {
        let refused = &self.inner.refused;
        Shape {
            omit_tool_choice: refused.tool_choice.load(Ordering::Relaxed)
                || (stream && refused.streamed_tool_choice.load(Ordering::Relaxed)),
            json_object: refused.json_schema.load(Ordering::Relaxed),
        }
    }

    /// When `error` is the server refusing a field of a request in `shape`, remembers it (and
    /// says so, once) and gives the shape to try next.
    fn learn(
        &self,
        request: &ModelRequest<'_>,
        shape: Shape,
        stream: bool,
        error: &ModelError,
    ) -> Option<Shape> {
        let config = &self.inner.config;
        let refused = &self.inner.refused;
        let url = &config.base_url;
        if !shape.omit_tool_choice
            && request::sends_tool_choice(request, config)
            && let Some(why) = error::refuses_tool_choice(error)
        {
            let (flag, when) = if stream && error::is_empty_stream(error) {
                (&refused.streamed_tool_choice, "streamed requests")
            } else {
                (&refused.tool_choice, "requests")
            };
            if !flag.swap(true, Ordering::Relaxed) {
                let unenforced = if matches!(request.settings.tool_choice, ToolChoice::Auto) {
                    ""
                } else {
                    " (the tool choice asked for is then not enforced)"
                };
                tracing::warn!(
                    "the server at {url} refused `tool_choice` ({why}); sending {when} without \
                     it from now on{unenforced}"
                );
            }
            return Some(Shape {
                omit_tool_choice: true,
                ..shape
            });
        }
        if !shape.json_object
            && request.settings.output.is_some()
            && let Some(why) = error::refuses_json_schema(error)
        {
            if !refused.json_schema.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the server at {url} refused a `json_schema` response format ({why}); asking \
                     for `json_object` with the schema in the prompt instead, and checking the \
                     answer against the schema"
                );
            }
            return Some(Shape {
                json_object: true,
                ..shape
            });
        }
        None
    }

    /// Whether a request in `shape` holds something the server could refuse (and that could be
    /// left out or replaced on a second try): a refused `tool_choice` can come as an empty
    /// stream (llama-cpp-python).
    fn may_be_refused(&self, request: &ModelRequest<'_>, shape: Shape) -> bool {
        (!shape.omit_tool_choice && request::sends_tool_choice(request, &self.inner.config))
            || (!shape.json_object && request.settings.output.is_some())
    }

    /// Calls a server wrote as text are rescued (see [`Rescue`]).
    fn finish(&self, request: &ModelRequest<'_>, response: ModelResponse) -> ModelResponse {
        if self.rescues(request) {
            Rescue::apply(response, request.tools)
        } else {
            response
        }
    }

    fn decoders(
        &self,
        request: &ModelRequest<'_>,
    ) -> impl Fn() -> ChunkDecoder + Send + Sync + 'static {
        let rescue_tools: Option<Arc<[ToolSpec]>> = self
            .rescues(request)
            .then(|| self.shared_tools(request.tools));
        move || {
            let mut decoder = ChunkDecoder::new(200);
            decoder.rescue = rescue_tools.as_ref().map(Rescue::shared);
            decoder
        }
    }

    fn decode(body: &[u8]) -> Result<ModelResponse, ModelError> {
        decode_response(body)
    }

    fn stream_decoder(status: u16) -> ChunkDecoder {
        ChunkDecoder::new(status)
    }

    #[cfg(feature = "http")]
    fn session(&self) -> Option<Box<dyn Model + '_>> {
        Some(Box::new(OpenAiSession::new(self)))
    }
}

/// One run's calls to an [`OpenAiModel`] (what its [`Model::session`] gives): it keeps the body
/// of the run's previous request, so that each request encodes only the messages added since,
/// and the tool catalog only when it changed (the model keeps the catalog's encoding for all
/// its sessions: a new run that offers the same catalog does not encode it again).
///
/// A run's first body is written into a buffer with room for what the model's earlier runs grew
/// to (learned as each session ends), so a run like them never moves its body into a larger one.
///
/// Before reusing anything it checks that the conversation did not shrink and that the last
/// message it encoded and the catalog are unchanged (by
/// [`message_fingerprint`](crate::model::message_fingerprint) and
/// [`catalog_fingerprint`](crate::model::catalog_fingerprint)); otherwise it encodes everything.
/// Its requests must come from one conversation that only grows (as the loop's do): a message
/// changed before the last one it encoded would go unnoticed. A body still held elsewhere (by a
/// transport retrying) is never written over.
pub struct OpenAiSession {
    /// The model, with the session's encoding of the conversation.
    model: OpenAiModel,
}

impl Drop for OpenAiSession {
    /// Tells the model how long the run's last body was: its next runs start with that much
    /// room.
    fn drop(&mut self) {
        if let Some(prefix) = &self.model.prefix {
            let last = prefix
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .last_body_len();
            if last > 0 {
                self.model.inner.body_room.observe(last);
            }
        }
    }
}

impl OpenAiSession {
    /// A session of `model`, with nothing encoded yet.
    pub fn new(model: &OpenAiModel) -> Self {
        OpenAiSession {
            model: OpenAiModel {
                inner: model.inner.clone(),
                prefix: Some(Arc::default()),
            },
        }
    }

    /// The exact body this session sends for `request` (streamed or not), after checking the
    /// configuration: the same JSON as [`OpenAiModel::request_body`], reusing the encoding of
    /// the messages the previous request had. Remembers it for the next request, as a call does.
    pub fn request_body(
        &self,
        request: &ModelRequest<'_>,
        stream: bool,
    ) -> Result<Bytes, ModelError> {
        let model = &self.model;
        model.body(request, stream, model.shape(stream))
    }
}

impl std::fmt::Debug for OpenAiSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiSession")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "http")]
#[async_trait]
impl Model for OpenAiSession {
    fn name(&self) -> &str {
        self.model.name()
    }

    // The adapter's calls directly: one boxed future per call, not two, and no layer of the
    // session's own inside it.
    fn complete<'s, 'r, 'm, 'f>(
        &'s self,
        request: &'r ModelRequest<'m>,
    ) -> futures::future::BoxFuture<'f, Result<ModelResponse, ModelError>>
    where
        's: 'f,
        'r: 'f,
        'm: 'f,
        Self: 'f,
    {
        crate::providers::adapter::complete(&self.model, request)
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        crate::providers::adapter::stream(&self.model, request).await
    }
}

/// Decodes one recorded response body (the conformance corpus): the HTTP `status`, the raw body,
/// and whether it is an SSE stream. A non-2xx status, an error object in a 200 body, or an error
/// event inside a stream gives [`Decoded::error`]; [`Decoded::response`] holds what arrived before.
#[cfg(any(test, feature = "testing"))]
pub fn decode_recorded(status: u16, body: &[u8], stream: bool) -> Decoded {
    crate::providers::adapter::decode_recorded_by::<OpenAiModel>(status, body, stream)
}

/// A response without its tool calls' ids (made up where the server sent none, so they differ
/// between two decodings).
#[cfg(test)]
fn without_ids(mut r: ModelResponse) -> ModelResponse {
    r.tool_calls.iter_mut().for_each(|c| c.id.clear());
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_call_borrows_the_endpoint_and_headers_parsed_when_the_model_was_made() {
        let mut config = OpenAiConfig::new("m").with_base_url("http://127.0.0.1:9/v1");
        config.api_key = Some("sk-test".into());
        let model = OpenAiModel::new(config);
        let messages: Vec<crate::message::Message> = Vec::new();
        let request = ModelRequest {
            messages: (&messages).into(),
            reminders: &[],
            tools: &[],
            settings: &Default::default(),
        };
        for stream in [false, true] {
            let url = model.url(&request, stream);
            assert!(
                matches!(url, Cow::Borrowed(_)),
                "the URL is copied per call"
            );
            assert_eq!(url.as_str(), "http://127.0.0.1:9/v1/chat/completions");
            assert!(
                url.parsed().is_some(),
                "the URL is parsed once, not per call"
            );
        }
        let headers = model.headers(&request).unwrap();
        assert!(
            matches!(headers, Cow::Borrowed(_)),
            "the headers are copied per call"
        );
        assert!(headers["authorization"].is_sensitive());
        // A key that cannot be sent is still every call's error.
        let mut config = OpenAiConfig::new("m");
        config.api_key = Some("bad\nkey".into());
        let e = OpenAiModel::new(config).headers(&request).unwrap_err();
        assert!(matches!(e, ModelError::Config(_)), "{e}");
    }

    #[test]
    fn streams_offering_the_same_tools_share_one_copy_of_them() {
        let model = OpenAiModel::new(OpenAiConfig::new("m").with_base_url("http://127.0.0.1:9/v1"));
        let tools = vec![ToolSpec {
            name: "read".into(),
            description: "Reads a file.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }];
        let first = model.shared_tools(&tools);
        // Another run's catalog, equal but not the same memory: no new copy.
        assert!(Arc::ptr_eq(&first, &model.shared_tools(&tools.clone())));
        let mut changed = tools.clone();
        changed[0].parameters["properties"]["path"]["maxLength"] = json!(10);
        let second = model.shared_tools(&changed);
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(&second[..], &changed[..]);
        assert_eq!(&first[..], &tools[..]);
    }
}
