//! The OpenAI Chat Completions adapter, for OpenAI and every server that speaks the same API.
//!
//! [`OpenAiModel`] sends the conversation and the tool catalog to `POST {base_url}/chat/completions`
//! and turns the reply, complete or streamed (Server-Sent Events), into a [`ModelResponse`] or
//! [`StreamEvent`]s. Retries, backoff, `Retry-After` and the body-size cap come from
//! [`HttpTransport`]; a stream that has delivered output is never replayed.
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
//! - An assistant turn with tool calls and no text is sent with `"content": ""`, never `null`,
//!   which llama-cpp-python's server refuses.
//! - Fields given in [`OpenAiConfig::extra`] and then [`ModelSettings::extra`] are merged into the
//!   top level of the request body last, so they can add or replace anything
//!   (`{"top_k": 20}`, `{"reasoning_effort": "low"}`, `{"max_tokens": 512}`).
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
//! `reasoning_content` is kept as a [`ProviderPart`] and sent back on later turns (DeepSeek
//! requires it after tool calls); a refusal is kept as a part too, and sent back as the
//! assistant's `refusal` field. Gemini's `extra_content` (thought signatures) is kept on the
//! message and on each tool call and sent back unchanged.
//!
//! Servers other than OpenAI's own let a call slip into `content` when their tool parser misses
//! it (Ollama, vLLM): with [`OpenAiConfig::rescue_text_tool_calls`] (on by default for them),
//! such calls are recovered as tool calls, complete or streamed, through [`Rescue`].
//!
//! Invalid argument JSON from the model is never replayed: the assistant turn carries the always
//! valid [`ToolCall::arguments`] value, and the loop reports the parse error in the tool result.
//!
//! # Errors
//!
//! A non-2xx status becomes [`ModelError::Api`] with the provider's error type, code (a numeric
//! code becomes its text) and message; 429, 500, 502, 503 and 504 are retryable. A 400, 404, 422
//! or 500 saying the server or model does not support tools (Ollama's "does not support tools",
//! vLLM's "auto tool choice requires --enable-auto-tool-choice", llama.cpp's "tools param requires
//! --jinja flag", …) becomes [`ModelError::ToolsUnsupported`], the signal for falling back to
//! prompt-based tool calling.

use crate::http::{Endpoint, HttpTransport, retry_after, retryable_status};
use crate::message::{Message, ProviderPart, ToolCall, new_call_id};
use crate::model::{
    ApiError, EventStream, FinishReason, Model, ModelError, ModelRequest, ModelResponse,
    ModelSettings, PrefixCache, ToolChoice, ToolSpec, catalog_fingerprint, message_fingerprint,
};
use crate::providers::Decoded;
use crate::providers::wire::{self, SseDecode, json_number};
use crate::ptk::Rescue;
use crate::sse::SseEvent;
use crate::stream::StreamEvent;
use crate::usage::Usage;
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{Value, json};
use std::sync::Arc;

/// OpenAI's own API.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The `provider` of the [`ProviderPart`]s this adapter makes; only this adapter sends them back.
pub const PROVIDER: &str = "openai";

/// Where transient reminders go in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReminderRole {
    /// One trailing `system` message per reminder (the default for OpenAI's own API).
    #[default]
    System,
    /// One trailing `user` message holding every reminder, or the reminders appended to the last
    /// user turn when the conversation ends with one (the default for other servers, whose chat
    /// templates often reject a system message that is not first).
    User,
}

/// How to reach an OpenAI-compatible server. Its `Debug` form hides the key.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// The model name sent in the request (`gpt-4.1`, `qwen3:8b`, …).
    pub model: String,
    /// The API's base URL, up to and without `/chat/completions`
    /// (default `https://api.openai.com/v1`).
    pub base_url: String,
    /// The API key, sent as `Authorization: Bearer <key>`; `None` sends no such header.
    pub api_key: Option<String>,
    /// Extra top-level request fields (a JSON object), merged into every request body last.
    pub extra: Option<Value>,
    /// The HTTP client, with its retry policy and body-size limit.
    pub transport: HttpTransport,
    /// Where transient reminders go (default: `System` for OpenAI's own API, `User` elsewhere).
    pub reminder_role: ReminderRole,
    /// Whether to recover tool calls that a model wrote in its text instead of the API's
    /// `tool_calls` (default: on for servers other than OpenAI's own API). When on and the
    /// request offers tools, the text of each response, complete or streamed, goes through
    /// [`Rescue`]: calls written in any prompt dialect (`<tool_call>…`, `[TOOL_CALLS]…`,
    /// `<PTK_CALL>…`, a fenced JSON call, …) become tool calls with fresh ids and
    /// `provider_data` `{"rescued": true}`, when the response carried no native call; the text
    /// around them stays text, no fragment of a call tag reaches the stream's text deltas, and
    /// an attempted call that does not parse stays text (never an error).
    pub rescue_text_tool_calls: bool,
    /// Whether a request that offers tools says `"tool_choice": "auto"` when the choice is
    /// [`ToolChoice::Auto`], rather than leaving it out (default: on for servers other than
    /// OpenAI's own API). Leaving it out means `auto` on OpenAI and vLLM, but llama-cpp-python's
    /// server ignores the tools unless it is said; every compatible server accepts it (vLLM
    /// without `--enable-auto-tool-choice` refuses it as it refuses tools at all, which
    /// `--tool-protocol auto` takes as the signal to fall back to prompt-based calling).
    pub explicit_tool_choice: bool,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("model", &self.model)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("extra", &self.extra)
            .field("transport", &self.transport)
            .field("reminder_role", &self.reminder_role)
            .field("rescue_text_tool_calls", &self.rescue_text_tool_calls)
            .field("explicit_tool_choice", &self.explicit_tool_choice)
            .finish()
    }
}

impl OpenAiConfig {
    /// A configuration for `model` on OpenAI's own API, with no key.
    pub fn new(model: impl Into<String>) -> Self {
        OpenAiConfig {
            model: model.into(),
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key: None,
            extra: None,
            transport: HttpTransport::new(),
            reminder_role: ReminderRole::System,
            rescue_text_tool_calls: false,
            explicit_tool_choice: false,
        }
    }

    /// Sets the base URL and the defaults that depend on it ([`OpenAiConfig::reminder_role`],
    /// [`OpenAiConfig::rescue_text_tool_calls`], [`OpenAiConfig::explicit_tool_choice`]).
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        let openai = self.is_openai();
        self.reminder_role = if openai {
            ReminderRole::System
        } else {
            ReminderRole::User
        };
        self.rescue_text_tool_calls = !openai;
        self.explicit_tool_choice = !openai;
        self
    }

    /// Reads the key and the base URL from the environment: the key from the variable named
    /// `api_key_env`, else `OPENAI_API_KEY`; the base URL from `OPENAI_BASE_URL`, else OpenAI's.
    ///
    /// A missing key is an error for OpenAI's own API, and when `api_key_env` names a variable
    /// that is not set; other servers (local ones especially) may need no key.
    pub fn from_env(model: &str, api_key_env: Option<&str>) -> Result<Self, ModelError> {
        Self::from_vars(model, api_key_env, |name| std::env::var(name).ok())
    }

    /// Like [`OpenAiConfig::from_env`], reading variables through `lookup`.
    pub fn from_vars(
        model: &str,
        api_key_env: Option<&str>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ModelError> {
        let nonempty = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let base_url = nonempty("OPENAI_BASE_URL")
            .map(|u| u.trim().to_string())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let mut config = OpenAiConfig::new(model).with_base_url(base_url);
        let key_var = api_key_env.unwrap_or("OPENAI_API_KEY");
        config.api_key = nonempty(key_var).map(|k| k.trim().to_string());
        if config.api_key.is_none() {
            if api_key_env.is_some() {
                return Err(ModelError::Config(format!(
                    "the API key variable {key_var} is not set (or is empty); set it, or leave \
                     out the key variable for servers that need no key"
                )));
            }
            if config.is_openai() {
                return Err(ModelError::Config(format!(
                    "OPENAI_API_KEY is not set: OpenAI's API ({}) needs a key. Set it, name \
                     another variable with --api-key-env, or point OPENAI_BASE_URL at a \
                     compatible server",
                    config.base_url
                )));
            }
        }
        Ok(config)
    }

    /// Whether the base URL is OpenAI's own API (`api.openai.com`).
    pub fn is_openai(&self) -> bool {
        is_openai_url(&self.base_url)
    }

    /// The full URL requests are sent to.
    pub fn endpoint(&self) -> String {
        let base = self.base_url.trim().trim_end_matches('/');
        if base.ends_with("/chat/completions") {
            base.to_string()
        } else {
            format!("{base}/chat/completions")
        }
    }
}

fn is_openai_url(url: &str) -> bool {
    let rest = url.trim();
    let rest = rest.split_once("://").map_or(rest, |(_, r)| r);
    let host_port = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = host_port.rsplit('@').next().unwrap_or(host_port);
    let host = host_port.split(':').next().unwrap_or("");
    host.eq_ignore_ascii_case("api.openai.com")
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

/// A model behind the OpenAI Chat Completions API.
#[derive(Debug, Clone)]
pub struct OpenAiModel {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: OpenAiConfig,
    url: Endpoint,
    headers: Result<HeaderMap, String>,
}

impl OpenAiModel {
    /// A model with this configuration. A key that cannot be sent in a header is reported by the
    /// first call, as [`ModelError::Config`].
    pub fn new(config: OpenAiConfig) -> Self {
        let mut headers = HeaderMap::new();
        let headers = match &config.api_key {
            None => Ok(headers),
            Some(key) => match HeaderValue::from_str(&format!("Bearer {key}")) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    headers.insert(AUTHORIZATION, v);
                    Ok(headers)
                }
                Err(_) => Err(
                    "the API key holds characters that cannot be sent in an HTTP header \
                     (control characters or non-ASCII)"
                        .to_string(),
                ),
            },
        };
        let url = Endpoint::new(config.endpoint());
        OpenAiModel {
            inner: Arc::new(Inner {
                config,
                url,
                headers,
            }),
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
    /// configuration. With a [`PrefixCache`] in the request, the messages encoded for the run's
    /// previous request are reused and the cache is updated, as in a real call.
    pub fn request_body(
        &self,
        request: &ModelRequest<'_>,
        stream: bool,
    ) -> Result<Bytes, ModelError> {
        check_extra("the adapter's `extra`", self.inner.config.extra.as_ref())?;
        check_extra("the settings' `extra`", request.settings.extra.as_ref())?;
        self.inner
            .headers
            .as_ref()
            .map_err(|e| ModelError::Config(e.clone()))?;
        let body = WireRequest::new(request, &self.inner.config, stream);
        let owner = Arc::as_ptr(&self.inner) as usize;
        match request.prefix_cache {
            Some(cache) => body.encode_cached(cache, owner),
            None => serde_json::to_vec(&body).map(Bytes::from),
        }
        .map_err(|e| ModelError::Other(format!("could not serialize the request: {e}")))
    }
}

fn check_extra(what: &str, extra: Option<&Value>) -> Result<(), ModelError> {
    match extra {
        None | Some(Value::Object(_)) => refuse_owned_fields(what, extra),
        Some(other) => Err(ModelError::Config(format!(
            "{what} must be a JSON object of top-level request fields (like {{\"top_k\": 20}}), \
             got {}",
            preview(&other.to_string())
        ))),
    }
}

/// The top-level request fields this adapter writes itself: the model, the conversation, the
/// tool catalog and choice, and the streaming mode. An `extra` (the adapter's or the settings')
/// that sets one is refused with [`ModelError::Config`], by [`OpenAiConfig::validate`] and by
/// every call.
pub const OWNED_FIELDS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "stream",
    "stream_options",
];

fn refuse_owned_fields(what: &str, extra: Option<&Value>) -> Result<(), ModelError> {
    crate::providers::wire::refuse_owned_fields("OpenAI", what, extra, OWNED_FIELDS)
}

impl OpenAiConfig {
    /// Checks the configuration without sending anything: the base URL (see
    /// [`crate::providers::check_base_url`]) and `extra` (a JSON object that sets none of the
    /// [`OWNED_FIELDS`]).
    pub fn validate(&self) -> Result<(), ModelError> {
        crate::providers::check_base_url(&self.base_url)
            .map_err(|e| ModelError::Config(format!("the base URL {e}")))?;
        check_extra("the adapter's `extra`", self.extra.as_ref())
    }
}

impl Inner {
    fn headers(&self) -> HeaderMap {
        self.headers.clone().unwrap_or_default()
    }
}

#[async_trait]
impl Model for OpenAiModel {
    fn name(&self) -> &str {
        &self.inner.config.model
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let body = self.request_body(request, false)?;
        let inner = &self.inner;
        let headers = inner
            .headers
            .as_ref()
            .map_err(|e| ModelError::Config(e.clone()))?;
        let response = inner
            .config
            .transport
            .post_json(&inner.url, headers, body, parse_error, decode_response)
            .await
            .map_err(classify)?;
        Ok(if self.rescues(request) {
            Rescue::apply(response, request.tools)
        } else {
            response
        })
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        let body = self.request_body(request, true)?;
        let inner = &self.inner;
        let rescue_tools: Option<Arc<[ToolSpec]>> =
            self.rescues(request).then(|| Arc::from(request.tools));
        let stream = wire::open_sse_stream(
            &inner.config.transport,
            inner.url.clone(),
            inner.headers(),
            body,
            parse_error,
            move || {
                let mut decoder = ChunkDecoder::new(200);
                decoder.rescue = rescue_tools.as_deref().map(Rescue::new);
                decoder
            },
        )
        .await
        .map_err(classify)?;
        Ok(Box::pin(stream.map(|item| item.map_err(classify))))
    }
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

/// The JSON body of one Chat Completions request, as a JSON value (for inspection and tests; the
/// adapter itself serializes [`WireRequest`] straight to bytes, with no intermediate tree).
///
/// Assistant turns carry `tool_calls` with the (always valid) [`ToolCall::arguments`] serialized
/// as text, never the model's invalid argument text; tool turns carry `tool_call_id`. Parts made
/// by other providers are left out. Reminders follow the conversation (see [`ReminderRole`]).
/// `config.extra`, then `settings.extra`, are merged into the top level last; a value that is not
/// a JSON object is ignored here ([`OpenAiModel`] refuses it with a clear error).
pub fn build_request_body(req: &ModelRequest<'_>, config: &OpenAiConfig, stream: bool) -> Value {
    // Serializing into a value cannot fail: every map key is a string.
    serde_json::to_value(WireRequest::new(req, config, stream)).unwrap_or(Value::Null)
}

/// A Chat Completions request body that serializes straight from the conversation, borrowing
/// it; [`build_request_body`] is the same body as a JSON value.
pub struct WireRequest<'a> {
    req: &'a ModelRequest<'a>,
    config: &'a OpenAiConfig,
    stream: bool,
    /// The extras' fields, later ones replacing earlier ones; they go last and replace any field
    /// of the same name.
    extras: Vec<(&'a str, &'a Value)>,
    /// Leave `messages` out (the cached encoding writes them itself).
    skip_messages: bool,
    /// Leave `tools` out (the cached encoding writes them itself).
    skip_tools: bool,
}

impl<'a> WireRequest<'a> {
    /// The body of `req` for a server configured by `config`, streamed or not.
    pub fn new(req: &'a ModelRequest<'a>, config: &'a OpenAiConfig, stream: bool) -> Self {
        let mut extras: Vec<(&str, &Value)> = Vec::new();
        for extra in [config.extra.as_ref(), req.settings.extra.as_ref()]
            .into_iter()
            .flatten()
        {
            if let Value::Object(fields) = extra {
                for (k, v) in fields {
                    match extras.iter_mut().find(|(name, _)| name == k) {
                        Some(slot) => slot.1 = v,
                        None => extras.push((k, v)),
                    }
                }
            }
        }
        WireRequest {
            req,
            config,
            stream,
            extras,
            skip_messages: false,
            skip_tools: false,
        }
    }

    /// Writes one field, unless an extra replaces it.
    fn field<M: SerializeMap, T: Serialize + ?Sized>(
        &self,
        map: &mut M,
        name: &str,
        value: &T,
    ) -> Result<(), M::Error> {
        if self.extras.iter().any(|(extra, _)| *extra == name) {
            Ok(())
        } else {
            map.serialize_entry(name, value)
        }
    }
}

impl Serialize for WireRequest<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let settings: &ModelSettings = self.req.settings;
        let mut map = s.serialize_map(None)?;
        let model = settings.model.as_deref().unwrap_or(&self.config.model);
        self.field(&mut map, "model", model)?;
        if !self.skip_messages {
            let messages = WireMessages {
                req: self.req,
                role: self.config.reminder_role,
            };
            self.field(&mut map, "messages", &messages)?;
        }
        if !self.req.tools.is_empty() {
            if !self.skip_tools {
                self.field(&mut map, "tools", &WireTools(self.req.tools))?;
            }
            // `auto` is sent to the servers that need it said (see
            // `OpenAiConfig::explicit_tool_choice`).
            match &settings.tool_choice {
                ToolChoice::Auto if self.config.explicit_tool_choice => {
                    self.field(&mut map, "tool_choice", "auto")?
                }
                ToolChoice::Auto => {}
                ToolChoice::None => self.field(&mut map, "tool_choice", "none")?,
                ToolChoice::Required => self.field(&mut map, "tool_choice", "required")?,
                ToolChoice::Tool(name) => {
                    let choice = json!({"type": "function", "function": {"name": name}});
                    self.field(&mut map, "tool_choice", &choice)?
                }
            }
        }
        if let Some(t) = settings.temperature {
            self.field(&mut map, "temperature", &json_number(t))?;
        }
        if let Some(n) = settings.max_output_tokens {
            let name = if self.config.is_openai() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            self.field(&mut map, name, &n)?;
        }
        if self.stream {
            self.field(&mut map, "stream", &true)?;
            let options = json!({"include_usage": true});
            self.field(&mut map, "stream_options", &options)?;
        }
        for (name, value) in &self.extras {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// The `messages` array: the conversation, then the reminders.
struct WireMessages<'a> {
    req: &'a ModelRequest<'a>,
    role: ReminderRole,
}

impl<'a> WireMessages<'a> {
    /// The messages sent as they are (all of them, or all but a last user turn that the
    /// reminders are appended to), and what follows them: `(role, content)` messages.
    fn split(&self) -> (&'a [Message], Vec<(&'static str, String)>) {
        let messages = self.req.messages;
        let reminders: Vec<String> = self.req.wrapped_reminders().collect();
        if reminders.is_empty() {
            return (messages, Vec::new());
        }
        match self.role {
            ReminderRole::System => (
                messages,
                reminders.into_iter().map(|r| ("system", r)).collect(),
            ),
            ReminderRole::User => {
                let joined = reminders.join("\n");
                // Appended to a last user turn, so that no two user turns follow each other.
                match messages.split_last() {
                    Some((Message::User { content }, head)) => {
                        (head, vec![("user", format!("{content}\n\n{joined}"))])
                    }
                    _ => (messages, vec![("user", joined)]),
                }
            }
        }
    }
}

impl Serialize for WireMessages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (head, tail) = self.split();
        let mut seq = s.serialize_seq(Some(head.len() + tail.len()))?;
        for m in head {
            seq.serialize_element(&WireMessage(m))?;
        }
        for (role, content) in &tail {
            seq.serialize_element(&Plain { role, content })?;
        }
        seq.end()
    }
}

/// What [`OpenAiModel`] keeps in a [`PrefixCache`]: the run's previous request body, whose
/// beginning encodes the conversation's first `count` messages, and the tool catalog's encoding.
struct EncodedPrefix {
    /// The adapter that wrote it.
    owner: usize,
    /// How many messages `body[..end]` encodes, and the fingerprint of the last of them (to
    /// check that the conversation still begins with them).
    count: usize,
    last: u64,
    /// The previous body: `{"messages":[` and those messages' encodings, then the rest. Its
    /// buffer is reused for the next body when nothing else holds it any more.
    body: Bytes,
    end: usize,
    /// The fingerprint of the catalog encoded in `tools_json` (empty: none kept).
    catalog: u64,
    tools_json: Vec<u8>,
}

impl EncodedPrefix {
    fn empty(owner: usize) -> Box<Self> {
        Box::new(EncodedPrefix {
            owner,
            count: 0,
            last: 0,
            body: Bytes::new(),
            end: 0,
            catalog: 0,
            tools_json: Vec::new(),
        })
    }
}

impl WireRequest<'_> {
    /// The body, reusing the encoding of the conversation's beginning (and of the tool catalog)
    /// kept in `cache` by the adapter `owner`: the previous body's buffer is truncated after
    /// those messages and the new ones are appended, so neither the beginning nor the buffer is
    /// made again. Gives the same JSON as serializing `self`, with `messages` (and `tools`)
    /// first.
    fn encode_cached(&self, cache: &PrefixCache, owner: usize) -> serde_json::Result<Bytes> {
        if self.extras.iter().any(|(name, _)| *name == "messages") {
            return serde_json::to_vec(self).map(Bytes::from);
        }
        let messages = WireMessages {
            req: self.req,
            role: self.config.reminder_role,
        };
        let (head, tail) = messages.split();
        let mut prefix = match cache.take::<EncodedPrefix>() {
            Some(p) if p.owner == owner => p,
            _ => EncodedPrefix::empty(owner),
        };
        let reusable = prefix.count > 0
            && prefix.count <= head.len()
            && message_fingerprint(&head[prefix.count - 1]) == prefix.last;
        let previous = std::mem::take(&mut prefix.body);
        // The previous body's buffer, when nothing else holds it any more (no copy either way).
        let mut buf: Vec<u8> = match (reusable, previous.try_into_mut()) {
            (true, Ok(mine)) => {
                let mut mine = Vec::from(mine);
                mine.truncate(prefix.end);
                mine
            }
            (true, Err(shared)) => {
                let mut b = Vec::with_capacity(shared.len() + 1024);
                b.extend_from_slice(&shared[..prefix.end]);
                b
            }
            (false, reclaimed) => {
                let mut b = reclaimed.map(Vec::from).unwrap_or_default();
                b.clear();
                b.extend_from_slice(b"{\"messages\":[");
                prefix.count = 0;
                b
            }
        };
        for m in &head[prefix.count..] {
            if buf.last() != Some(&b'[') {
                buf.push(b',');
            }
            serde_json::to_writer(&mut buf, &WireMessage(m))?;
        }
        prefix.end = buf.len();
        if let Some(last) = head.last()
            && prefix.count != head.len()
        {
            prefix.last = message_fingerprint(last);
        }
        prefix.count = head.len();
        for (role, content) in &tail {
            if buf.last() != Some(&b'[') {
                buf.push(b',');
            }
            serde_json::to_writer(&mut buf, &Plain { role, content })?;
        }
        buf.push(b']');
        let tools = self.req.tools;
        let cache_tools =
            !tools.is_empty() && !self.extras.iter().any(|(name, _)| *name == "tools");
        if cache_tools {
            let catalog = catalog_fingerprint(tools);
            if prefix.tools_json.is_empty() || prefix.catalog != catalog {
                prefix.tools_json.clear();
                serde_json::to_writer(&mut prefix.tools_json, &WireTools(tools))?;
                prefix.catalog = catalog;
            }
            buf.extend_from_slice(b",\"tools\":");
            buf.extend_from_slice(&prefix.tools_json);
        }
        // The other fields, written as an object whose `{` becomes the comma after `messages`
        // (or, when there are none, whose `{}` becomes the closing brace).
        let at = buf.len();
        let rest = WireRequest {
            skip_messages: true,
            skip_tools: cache_tools,
            extras: self.extras.clone(),
            ..*self
        };
        serde_json::to_writer(&mut buf, &rest)?;
        if buf.len() - at > 2 {
            buf[at] = b',';
        } else {
            buf.truncate(at);
            buf.push(b'}');
        }
        let body = Bytes::from(buf);
        prefix.body = body.clone();
        cache.put(prefix);
        Ok(body)
    }
}

/// A message that is only a role and text.
#[derive(Serialize)]
struct Plain<'a> {
    role: &'a str,
    content: &'a str,
}

/// One message of the conversation on the wire.
struct WireMessage<'a>(&'a Message);

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Message::System { content } => Plain {
                role: "system",
                content,
            }
            .serialize(s),
            Message::User { content } => Plain {
                role: "user",
                content,
            }
            .serialize(s),
            Message::Tool(r) => {
                let mut map = s.serialize_map(Some(3))?;
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("tool_call_id", &r.call_id)?;
                map.serialize_entry("content", &r.content)?;
                map.end()
            }
            Message::Assistant(a) => {
                let mut map = s.serialize_map(None)?;
                map.serialize_entry("role", "assistant")?;
                // Never `null`: llama-cpp-python's server refuses a `null` content with a 500,
                // and an empty string is accepted everywhere (OpenAI, vLLM, Mistral, Groq,
                // Ollama, llama.cpp), with or without tool calls.
                map.serialize_entry("content", a.text.as_deref().unwrap_or(""))?;
                if !a.tool_calls.is_empty() {
                    let calls: Vec<WireToolCall> = a.tool_calls.iter().map(WireToolCall).collect();
                    map.serialize_entry("tool_calls", &calls)?;
                }
                // This adapter's own parts, a later one replacing an earlier field.
                let mut replayed: Vec<(&str, &Value)> = Vec::new();
                for part in a.parts.iter().filter(|p| p.provider == PROVIDER) {
                    if let Value::Object(fields) = &part.data {
                        for (k, v) in fields {
                            if !REPLAYED_MESSAGE_FIELDS.contains(&k.as_str()) {
                                continue;
                            }
                            match replayed.iter_mut().find(|(name, _)| name == k) {
                                Some(slot) => slot.1 = v,
                                None => replayed.push((k, v)),
                            }
                        }
                    }
                }
                for (k, v) in replayed {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

/// Assistant-message fields kept in this adapter's parts and sent back.
const REPLAYED_MESSAGE_FIELDS: &[&str] = &["reasoning_content", "refusal", "extra_content"];

/// One tool call of an assistant turn on the wire.
///
/// `arguments` is always valid JSON; the model's invalid text (`invalid_arguments`) is never sent
/// back, because strict servers reject the whole request over it.
struct WireToolCall<'a>(&'a ToolCall);

impl Serialize for WireToolCall<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let call = self.0;
        let extra = call
            .provider_data
            .as_ref()
            .and_then(|d| d.get("extra_content"));
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("id", &call.id)?;
        map.serialize_entry("type", "function")?;
        // The arguments as JSON text, written into a buffer kept for the purpose (`to_string` on
        // a value goes through the formatter, several times slower, and a fresh string each
        // time would be an allocation per call).
        thread_local! {
            static TEXT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        TEXT.with(|text| {
            let mut text = text.try_borrow_mut().map_err(serde::ser::Error::custom)?;
            text.clear();
            serde_json::to_writer(&mut *text, &call.arguments)
                .map_err(serde::ser::Error::custom)?;
            let arguments = std::str::from_utf8(&text).map_err(serde::ser::Error::custom)?;
            let written = map.serialize_entry(
                "function",
                &WireFunction {
                    name: &call.name,
                    arguments,
                },
            );
            // A very large argument does not stay held by the thread.
            if text.capacity() > 64 * 1024 {
                *text = Vec::new();
            }
            written
        })?;
        if let Some(extra) = extra {
            map.serialize_entry("extra_content", extra)?;
        }
        map.end()
    }
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// The `tools` array.
struct WireTools<'a>(&'a [ToolSpec]);

impl Serialize for WireTools<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Function<'a> {
            name: &'a str,
            description: &'a str,
            parameters: &'a Value,
        }
        #[derive(Serialize)]
        struct Tool<'a> {
            r#type: &'a str,
            function: Function<'a>,
        }
        s.collect_seq(self.0.iter().map(|t| Tool {
            r#type: "function",
            function: Function {
                name: &t.name,
                description: &t.description,
                parameters: &t.parameters,
            },
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// Complete responses
// ---------------------------------------------------------------------------------------------

/// Decodes a complete response: through typed, borrowing structures when the body has the usual
/// shape, and through a JSON value otherwise (every quirk, and errors that say what was wrong).
/// Both give the same response for any body the first accepts.
fn decode_response(body: &[u8]) -> Result<ModelResponse, ModelError> {
    match typed::decode(body) {
        Some(response) => Ok(response),
        None => decode_value(body),
    }
}

/// The typed fast path of [`decode_response`].
mod typed {
    use super::{
        PROVIDER, ProviderPart, REPLAYED_MESSAGE_FIELDS, ToolCall, map_finish, new_call_id,
        parse_usage, settle_finish,
    };
    use crate::model::ModelResponse;
    use crate::usage::Usage;
    use serde::Deserialize;
    use serde::de::IgnoredAny;
    use serde_json::{Value, json};
    use std::borrow::Cow;

    #[derive(Deserialize)]
    struct Completion<'a> {
        #[serde(default)]
        error: Option<IgnoredAny>,
        #[serde(borrow)]
        choices: Vec<Obj<Choice<'a>>>,
        #[serde(default)]
        usage: Option<Obj<WireUsage>>,
        #[serde(default)]
        x_groq: Option<Value>,
    }

    /// A usage object of whole counts (anything else goes the value path).
    #[derive(Deserialize)]
    struct WireUsage {
        #[serde(default)]
        prompt_tokens: Option<u64>,
        #[serde(default)]
        completion_tokens: Option<u64>,
        #[serde(default)]
        prompt_tokens_details: Option<Obj<Details>>,
        #[serde(default)]
        cached_tokens: Option<u64>,
        #[serde(default)]
        prompt_cache_hit_tokens: Option<u64>,
        #[serde(default)]
        num_cached_tokens: Option<u64>,
        #[serde(default)]
        completion_tokens_details: Option<Obj<Details>>,
    }

    #[derive(Deserialize)]
    struct Details {
        #[serde(default)]
        cached_tokens: Option<u64>,
        #[serde(default)]
        reasoning_tokens: Option<u64>,
    }

    impl WireUsage {
        /// The usage, or `None` without a prompt or completion count (then the tokens are
        /// unknown, not zero).
        fn usage(&self) -> Option<Usage> {
            if self.prompt_tokens.is_none() && self.completion_tokens.is_none() {
                return None;
            }
            let cache_read = self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.0.cached_tokens)
                .or(self.cached_tokens)
                .or(self.prompt_cache_hit_tokens)
                .or(self.num_cached_tokens)
                .unwrap_or(0);
            Some(Usage {
                input_tokens: self.prompt_tokens.unwrap_or(0),
                output_tokens: self.completion_tokens.unwrap_or(0),
                cache_read_tokens: cache_read,
                cache_write_tokens: 0,
                reasoning_tokens: self
                    .completion_tokens_details
                    .as_ref()
                    .and_then(|d| d.0.reasoning_tokens)
                    .unwrap_or(0),
            })
        }
    }

    #[derive(Deserialize)]
    struct Choice<'a> {
        #[serde(default)]
        index: Option<u64>,
        #[serde(default, borrow)]
        message: Option<Obj<Message<'a>>>,
        #[serde(default, borrow)]
        finish_reason: Option<Cow<'a, str>>,
    }

    #[derive(Deserialize)]
    struct Message<'a> {
        #[serde(default, borrow)]
        content: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        tool_calls: Option<Vec<Obj<Call<'a>>>>,
        #[serde(default)]
        reasoning_content: Option<Value>,
        #[serde(default)]
        refusal: Option<Value>,
        #[serde(default)]
        extra_content: Option<Value>,
    }

    #[derive(Deserialize)]
    struct Call<'a> {
        #[serde(default, borrow)]
        id: Option<Cow<'a, str>>,
        #[serde(borrow)]
        function: Obj<Function<'a>>,
        #[serde(default)]
        extra_content: Option<Value>,
    }

    #[derive(Deserialize)]
    struct Function<'a> {
        #[serde(borrow)]
        name: Cow<'a, str>,
        #[serde(default, borrow)]
        arguments: Option<Cow<'a, str>>,
    }

    /// A value that must be a JSON object: a derived `Deserialize` would also take an array.
    struct Obj<T>(T);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Only<T>(std::marker::PhantomData<T>);
            impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Only<T> {
                type Value = T;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                    T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                }
            }
            d.deserialize_map(Only(std::marker::PhantomData)).map(Obj)
        }
    }

    /// The response, or `None` when the body is not of the usual shape (or is an error).
    pub(super) fn decode(body: &[u8]) -> Option<ModelResponse> {
        // One check of the whole body is cheaper than serde_json's check of each string.
        let body = std::str::from_utf8(body).ok()?;
        let Obj(c): Obj<Completion> = serde_json::from_str(body).ok()?;
        if c.error.is_some() {
            return None;
        }
        let usage = match (&c.usage, &c.x_groq) {
            (Some(u), _) => u.0.usage(),
            (None, Some(x)) => x
                .get("usage")
                .filter(|u| u.is_object())
                .and_then(parse_usage),
            (None, None) => None,
        };
        let index = c
            .choices
            .iter()
            .position(|c| c.0.index.unwrap_or(0) == 0)
            .unwrap_or(0);
        let Obj(choice) = c.choices.into_iter().nth(index)?;
        let mut response = ModelResponse {
            text: None,
            finish_reason: settle_finish(None, false),
            tool_calls: Vec::new(),
            usage,
            parts: Vec::new(),
            malformed_call: None,
        };
        if let Some(Obj(msg)) = choice.message {
            response.text = msg.content.filter(|t| !t.is_empty()).map(Cow::into_owned);
            let replayed = [msg.reasoning_content, msg.refusal, msg.extra_content];
            for (field, value) in REPLAYED_MESSAGE_FIELDS.iter().zip(replayed) {
                let kept = match &value {
                    Some(Value::String(s)) => !s.is_empty(),
                    Some(Value::Null) | None => false,
                    Some(_) => true,
                };
                if let (true, Some(value)) = (kept, value) {
                    response.parts.push(ProviderPart {
                        provider: PROVIDER.into(),
                        data: json!({ *field: value }),
                    });
                }
            }
            for Obj(call) in msg.tool_calls.unwrap_or_default() {
                if call.function.0.name.is_empty() {
                    // The value path says which call and why.
                    return None;
                }
                let id = call
                    .id
                    .filter(|id| !id.is_empty())
                    .map_or_else(new_call_id, Cow::into_owned);
                let raw = call.function.0.arguments.unwrap_or_default();
                let mut tool_call =
                    ToolCall::from_raw_arguments(id, call.function.0.name.into_owned(), &raw);
                if let Some(x) = call.extra_content.filter(|x| !x.is_null()) {
                    tool_call.provider_data = Some(json!({ "extra_content": x }));
                }
                response.tool_calls.push(tool_call);
            }
        }
        let finish = choice.finish_reason.as_deref().map(map_finish);
        response.finish_reason = settle_finish(finish, !response.tool_calls.is_empty());
        Some(response)
    }
}

/// The value path of [`decode_response`].
fn decode_value(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ModelError::InvalidResponse(format!(
            "the response body is not JSON ({e}); expected a chat.completion object, got: {}",
            preview(&String::from_utf8_lossy(body))
        ))
    })?;
    if v.get("error").is_some_and(|e| !e.is_null()) {
        return Err(ModelError::Api(api_error_from_value(200, &v, None)));
    }
    let choices = v.get("choices").and_then(Value::as_array).ok_or_else(|| {
        ModelError::InvalidResponse(format!(
            "the response has no `choices` array; expected a chat.completion object, got: {}",
            preview(&v.to_string())
        ))
    })?;
    let choice = choices
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        .or_else(|| choices.first())
        .ok_or_else(|| {
            ModelError::InvalidResponse("the response's `choices` array is empty".into())
        })?;
    let usage = usage_of(&v);
    let empty = Value::Null;
    let msg = choice.get("message").unwrap_or(&empty);

    let text = content_text(msg.get("content")).filter(|t| !t.is_empty());
    let mut parts = Vec::new();
    for field in REPLAYED_MESSAGE_FIELDS {
        if let Some(value) = msg.get(*field).filter(|x| match x {
            Value::String(s) => !s.is_empty(),
            Value::Null => false,
            _ => true,
        }) {
            parts.push(ProviderPart {
                provider: PROVIDER.into(),
                data: json!({ *field: value }),
            });
        }
    }
    let mut tool_calls = Vec::new();
    if let Some(calls) = msg.get("tool_calls").and_then(Value::as_array) {
        for (n, c) in calls.iter().enumerate() {
            let f = c.get("function").unwrap_or(&empty);
            let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map_or_else(new_call_id, str::to_string);
            let raw = arguments_text(f.get("arguments"));
            if name.is_empty() {
                return Err(ModelError::InvalidResponse(format!(
                    "tool call {n} of the response has no function name: {}",
                    preview(&c.to_string())
                )));
            }
            let mut call = ToolCall::from_raw_arguments(id, name.to_string(), &raw);
            if let Some(x) = c.get("extra_content").filter(|x| !x.is_null()) {
                call.provider_data = Some(json!({"extra_content": x}));
            }
            tool_calls.push(call);
        }
    }
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(map_finish);
    Ok(ModelResponse {
        text,
        finish_reason: settle_finish(finish, !tool_calls.is_empty()),
        tool_calls,
        usage,
        parts,
        malformed_call: None,
    })
}

/// The text of a `content` field: a string, or the `text` parts of an array of parts.
fn content_text(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match p {
                    Value::String(s) => out.push_str(s),
                    Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("text") => {
                        if let Some(t) = o.get("text").and_then(Value::as_str) {
                            out.push_str(t);
                        }
                    }
                    _ => {}
                }
            }
            Some(out)
        }
        _ => None,
    }
}

/// Argument text: a string as it is, a JSON object or array serialized, nothing as `""`.
fn arguments_text(arguments: Option<&Value>) -> String {
    match arguments {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

fn map_finish(reason: &str) -> FinishReason {
    match reason {
        "stop" | "end_turn" | "eos" | "stop_sequence" => FinishReason::Stop,
        "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
        "length" | "max_tokens" => FinishReason::Length,
        "content_filter" | "safety" | "refusal" => FinishReason::ContentFilter,
        "error" => FinishReason::Error,
        other => {
            tracing::debug!(
                finish_reason = other,
                "unknown finish_reason, taken as stop"
            );
            FinishReason::Stop
        }
    }
}

/// The finish reason of a reply: a `stop` that came with tool calls (as some servers say) is
/// `ToolCalls`; a missing one is `ToolCalls` or `Stop` by whether calls came.
fn settle_finish(finish: Option<FinishReason>, has_calls: bool) -> FinishReason {
    match finish {
        Some(FinishReason::Stop) | None if has_calls => FinishReason::ToolCalls,
        Some(f) => f,
        None => FinishReason::Stop,
    }
}

fn as_count(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    v.as_u64()
        .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
}

/// The usage object of a response or chunk (`usage`, else Groq's `x_groq.usage`).
fn usage_of(v: &Value) -> Option<Usage> {
    let u = v
        .get("usage")
        .filter(|u| u.is_object())
        .or_else(|| v.pointer("/x_groq/usage").filter(|u| u.is_object()))?;
    parse_usage(u)
}

/// The usage in a usage object, or `None` without a prompt or completion count (then the
/// tokens are unknown, not zero).
fn parse_usage(u: &Value) -> Option<Usage> {
    let input = as_count(u.get("prompt_tokens"));
    let output = as_count(u.get("completion_tokens"));
    if input.is_none() && output.is_none() {
        return None;
    }
    // Chained lookups: `pointer` allocates for every path segment.
    let cache_read = as_count(
        u.get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens")),
    )
    .or_else(|| as_count(u.get("cached_tokens")))
    .or_else(|| as_count(u.get("prompt_cache_hit_tokens")))
    .or_else(|| as_count(u.get("num_cached_tokens")))
    .unwrap_or(0);
    Some(Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        cache_read_tokens: cache_read,
        cache_write_tokens: 0,
        reasoning_tokens: as_count(
            u.get("completion_tokens_details")
                .and_then(|d| d.get("reasoning_tokens")),
        )
        .unwrap_or(0),
    })
}

// ---------------------------------------------------------------------------------------------
// Streamed responses
// ---------------------------------------------------------------------------------------------

/// One tool call being streamed.
#[derive(Debug)]
struct Slot {
    /// The server's `index`, when it sent one.
    wire: Option<u64>,
    /// The first non-empty id.
    id: Option<String>,
    has_name: bool,
}

/// Reads a Chat Completions SSE stream and emits normalized [`StreamEvent`]s: our tool-call
/// indices count from 0 in order of first appearance, whatever the server's indices were.
#[derive(Debug)]
struct ChunkDecoder {
    /// HTTP status, reported with an in-stream error.
    status: u16,
    slots: Vec<Slot>,
    /// The choice followed (the first one seen).
    choice: Option<u64>,
    finish: Option<FinishReason>,
    reasoning: String,
    refusal: String,
    /// The text-call rescue, when on for this request.
    rescue: Option<Rescue>,
    /// `[DONE]` or the end was reached and the closing events emitted.
    done: bool,
}

impl ChunkDecoder {
    fn new(status: u16) -> Self {
        ChunkDecoder {
            status,
            slots: Vec::new(),
            choice: None,
            finish: None,
            reasoning: String::new(),
            refusal: String::new(),
            rescue: None,
            done: false,
        }
    }

    fn delta(&mut self, d: &Value, out: &mut Vec<StreamEvent>) {
        if let Some(t) = content_text(d.get("content")).filter(|t| !t.is_empty()) {
            match self.rescue.as_mut() {
                Some(rescue) => out.extend(rescue.push(&t)),
                None => out.push(StreamEvent::TextDelta(t)),
            }
        }
        if let Some(r) = d.get("reasoning_content").and_then(Value::as_str) {
            self.reasoning.push_str(r);
        }
        if let Some(r) = d.get("refusal").and_then(Value::as_str) {
            self.refusal.push_str(r);
        }
        if let Some(calls) = d.get("tool_calls").and_then(Value::as_array) {
            for tc in calls {
                self.tool_delta(tc, out);
            }
        }
    }

    fn tool_delta(&mut self, tc: &Value, out: &mut Vec<StreamEvent>) {
        let f = tc.get("function");
        let wire = tc
            .get("index")
            .and_then(Value::as_u64)
            .or_else(|| f.and_then(|f| f.get("index")).and_then(Value::as_u64));
        let id = tc
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let name = f
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let args = arguments_text(f.and_then(|f| f.get("arguments")));

        let (index, is_new) = self.slot_for(wire, id, name.is_some());
        let slot = &mut self.slots[index];
        let new_id = slot.id.is_none() && id.is_some();
        let new_name = !slot.has_name && name.is_some();
        if is_new || new_id || new_name {
            out.push(StreamEvent::ToolCallStart {
                index,
                id: id.map(str::to_string),
                name: name.unwrap_or_default().to_string(),
            });
            if new_id {
                slot.id = id.map(str::to_string);
            }
            slot.has_name |= name.is_some();
        }
        if !args.is_empty() {
            out.push(StreamEvent::ToolCallDelta {
                index,
                arguments: args,
            });
        }
        if let Some(x) = tc.get("extra_content").filter(|x| !x.is_null()) {
            out.push(StreamEvent::ToolCallData {
                index,
                data: json!({"extra_content": x}),
            });
        }
    }

    /// The call a delta belongs to, and whether it is new.
    fn slot_for(&mut self, wire: Option<u64>, id: Option<&str>, has_name: bool) -> (usize, bool) {
        let found = match wire {
            // The latest call with this index, unless the delta brings a different id (servers
            // that give every parallel call the same index).
            Some(w) => self
                .slots
                .iter()
                .rposition(|s| s.wire == Some(w))
                .filter(|&p| match (id, &self.slots[p].id) {
                    (Some(new), Some(old)) => new == old,
                    _ => true,
                }),
            None => match id {
                Some(id) => self.slots.iter().rposition(|s| s.id.as_deref() == Some(id)),
                // No index and no id: a continuation of the last call, unless it names a tool
                // again while the last call already has its name.
                None => self
                    .slots
                    .len()
                    .checked_sub(1)
                    .filter(|&last| !(has_name && self.slots[last].has_name)),
            },
        };
        match found {
            Some(p) => (p, false),
            None => {
                self.slots.push(Slot {
                    wire,
                    id: None,
                    has_name: false,
                });
                (self.slots.len() - 1, true)
            }
        }
    }

    /// The closing events: parts, call ends, the finish reason.
    fn end(&mut self, out: &mut Vec<StreamEvent>) {
        if self.done {
            return;
        }
        self.done = true;
        for (field, text) in [
            ("reasoning_content", std::mem::take(&mut self.reasoning)),
            ("refusal", std::mem::take(&mut self.refusal)),
        ] {
            if !text.is_empty() {
                out.push(StreamEvent::Part(ProviderPart {
                    provider: PROVIDER.into(),
                    data: json!({ field: text }),
                }));
            }
        }
        let mut rescued = 0;
        if let Some(rescue) = self.rescue.take() {
            let (events, n) = rescue.finish(!self.slots.is_empty());
            out.extend(events);
            rescued = n;
        }
        for index in 0..self.slots.len() {
            out.push(StreamEvent::ToolCallEnd { index });
        }
        out.push(StreamEvent::Finish(settle_finish(
            self.finish,
            !self.slots.is_empty() || rescued > 0,
        )));
    }
}

impl SseDecode for ChunkDecoder {
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if self.done {
            return Ok(());
        }
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        if data == "[DONE]" {
            self.end(out);
            return Ok(());
        }
        // A 2xx stream with an event that is not JSON was corrupted or cut short on the way:
        // as retryable as a broken connection (never replayed once output was delivered).
        let v: Value = serde_json::from_str(data).map_err(|e| ModelError::Transport {
            message: format!(
                "a stream event is not JSON ({e}); expected a chat.completion.chunk object, \
                 got: {}",
                preview(data)
            ),
            retryable: true,
        })?;
        let has_error = v.get("error").is_some_and(|e| !e.is_null());
        if has_error || ev.event.as_deref() == Some("error") {
            if self.finish.is_none() {
                return Err(ModelError::Api(api_error_from_value(self.status, &v, None)));
            }
            // After a finish_reason, an error chunk only restates why the generation ended
            // (OpenRouter's "Token limit reached" after `length`); its usage still counts.
            tracing::debug!(chunk = %preview(data), "error chunk after the finish, ignored");
        }
        if let Some(u) = usage_of(&v) {
            out.push(StreamEvent::Usage(u));
        }
        if let Some(choices) = v.get("choices").and_then(Value::as_array) {
            for c in choices {
                let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                if *self.choice.get_or_insert(idx) != idx {
                    continue;
                }
                if let Some(delta) = c.get("delta").or_else(|| c.get("message")) {
                    self.delta(delta, out);
                }
                if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
                    self.finish = Some(map_finish(f));
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if !self.done {
            if self.finish.is_none() {
                return Err(ModelError::Transport {
                    message: "the stream ended before the response was complete (no \
                              finish_reason and no [DONE] marker)"
                        .into(),
                    retryable: true,
                });
            }
            self.end(out);
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Reads an error body (the [`crate::http::ErrorParser`] of this adapter). Understands OpenAI's
/// `{"error": {message, type, code}}`, a numeric `code` (OpenRouter, llama.cpp), a plain string
/// `error` (Ollama), vLLM's top-level `{"object": "error", message, type, code}`, FastAPI's
/// `detail`, a one-element array (Gemini), and a body that is not JSON at all.
pub fn parse_error(status: u16, headers: &HeaderMap, body: &[u8]) -> ApiError {
    let mut err = match serde_json::from_slice::<Value>(body) {
        Ok(v) => api_error_from_value(status, &v, Some(status)),
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            ApiError {
                status,
                error_type: None,
                code: None,
                message: if text.is_empty() {
                    format!("HTTP {status} with an empty body")
                } else {
                    preview(text)
                },
                retryable: retryable_status(status),
                retry_after: None,
            }
        }
    };
    if err.retry_after.is_none() {
        err.retry_after = retry_after(headers);
    }
    if tools_unsupported(&err) {
        err.retryable = false;
    }
    err
}

/// An [`ApiError`] from an error body or an error chunk. `http_status` is the status the
/// retryability is judged by; for an in-stream error it is the status the error object carries.
fn api_error_from_value(status: u16, v: &Value, http_status: Option<u16>) -> ApiError {
    let v = match v {
        Value::Array(items) => items.first().unwrap_or(v),
        other => other,
    };
    let text = |x: Option<&Value>| -> Option<String> {
        match x? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    let (obj, message) = match v.get("error") {
        Some(e @ Value::Object(_)) => (e, text(e.get("message"))),
        Some(Value::String(s)) => (v, Some(s.clone())),
        _ => (v, text(v.get("message")).or_else(|| text(v.get("detail")))),
    };
    let message = message
        .or_else(|| v.get("detail").map(|d| d.to_string()))
        .unwrap_or_else(|| preview(&v.to_string()));
    let error_type = text(obj.get("type"));
    let code = text(obj.get("code"));
    let judged = http_status.or_else(|| {
        as_count(obj.get("status_code"))
            .or_else(|| as_count(obj.get("code")))
            .and_then(|n| u16::try_from(n).ok())
    });
    let retryable = match judged {
        Some(s) => retryable_status(s),
        None => error_type.as_deref().is_some_and(|t| {
            let t = t.to_ascii_lowercase();
            t.contains("server_error") || t.contains("overloaded") || t.contains("rate_limit")
        }),
    };
    let mut err = ApiError {
        status,
        error_type,
        code,
        message,
        retryable,
        retry_after: None,
    };
    if tools_unsupported(&err) {
        err.retryable = false;
    }
    err
}

/// Whether an error says the server or model does not accept a tool catalog.
fn tools_unsupported(err: &ApiError) -> bool {
    if !matches!(err.status, 400 | 404 | 422 | 500) {
        return false;
    }
    let m = err.message.to_ascii_lowercase();
    const PATTERNS: &[&str] = &[
        "does not support tools",
        "doesn't support tools",
        "does not support tool",
        "doesn't support tool",
        "does not support function",
        "doesn't support function",
        "enable-auto-tool-choice",
        "tools param requires --jinja",
        "tool use is not supported",
        "tool calling is not supported",
        "tool calls are not supported",
        "tools are not supported",
        "tools is not supported",
        "function calling is not supported",
        "function calling is not enabled",
        "no endpoints found that support tool use",
    ];
    PATTERNS.iter().any(|p| m.contains(p))
}

/// Turns an API error that says tools are unsupported into [`ModelError::ToolsUnsupported`].
fn classify(e: ModelError) -> ModelError {
    match e {
        ModelError::Api(a) if tools_unsupported(&a) => ModelError::ToolsUnsupported(a.message),
        other => other,
    }
}

/// A short, char-boundary-safe excerpt of external text for error messages.
fn preview(text: &str) -> String {
    wire::preview(text, 300)
}

// ---------------------------------------------------------------------------------------------
// Recorded bodies
// ---------------------------------------------------------------------------------------------

/// Decodes one recorded response body (the conformance corpus): the HTTP `status`, the raw body,
/// and whether it is an SSE stream. A non-2xx status, an error object in a 200 body, or an error
/// event inside a stream gives [`Decoded::error`]; [`Decoded::response`] holds what arrived before.
pub fn decode_recorded(status: u16, body: &[u8], stream: bool) -> Decoded {
    wire::decode_recorded(
        status,
        body,
        stream,
        parse_error,
        ChunkDecoder::new(status),
        |body| wire::whole(decode_response(body)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{AssistantMessage, ToolResult};
    use crate::model::ToolSpec;
    use proptest::prelude::*;

    fn settings() -> ModelSettings {
        ModelSettings::default()
    }

    fn conversation() -> Vec<Message> {
        let good = ToolCall {
            id: "call_1".into(),
            name: "read".into(),
            arguments: json!({"path": "a.txt"}),
            invalid_arguments: None,
            provider_data: None,
        };
        let bad = ToolCall::from_raw_arguments("call_2".into(), "write".into(), "{\"path\": ");
        vec![
            Message::system("be brief"),
            Message::user("read a.txt"),
            Message::Assistant(AssistantMessage {
                text: None,
                tool_calls: vec![good, bad],
                parts: vec![
                    ProviderPart {
                        provider: "anthropic".into(),
                        data: json!({"type": "thinking", "thinking": "hmm", "signature": "s"}),
                    },
                    ProviderPart {
                        provider: PROVIDER.into(),
                        data: json!({"reasoning_content": "I should read it"}),
                    },
                ],
            }),
            Message::Tool(ToolResult {
                call_id: "call_1".into(),
                name: "read".into(),
                content: "hello".into(),
                is_error: false,
            }),
            Message::Tool(ToolResult {
                call_id: "call_2".into(),
                name: "write".into(),
                content: "arguments are not valid JSON".into(),
                is_error: true,
            }),
        ]
    }

    /// One step of a growing conversation, for the prefix-cache property.
    #[derive(Debug, Clone)]
    enum Step {
        /// Append this message of [`conversation`] (by index, cycling).
        Append(usize),
        /// Set the number of reminders for the next requests.
        Reminders(usize),
        /// Break the promise: change the last message (the cache must notice).
        EditLast,
        /// Drop the last message (the cache must notice).
        Shrink,
        /// Use the other of two models with the same cache (the cache must not be shared).
        SwapModel,
        /// Offer another tool catalog (none, one tool, or that tool described differently).
        Tools(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0usize..5).prop_map(Step::Append),
            2 => (0usize..3).prop_map(Step::Reminders),
            1 => Just(Step::EditLast),
            1 => Just(Step::Shrink),
            1 => Just(Step::SwapModel),
            1 => (0usize..3).prop_map(Step::Tools),
        ]
    }

    proptest! {
        #[test]
        fn cached_encoding_is_the_full_encoding(
            steps in proptest::collection::vec(step(), 1..24),
            user_role in proptest::bool::ANY,
            stream in proptest::bool::ANY,
            extra in 0usize..3,
            keep in proptest::collection::vec(proptest::bool::ANY, 24),
        ) {
            let template = conversation();
            let mut configs = [
                OpenAiConfig::new("m").with_base_url("http://127.0.0.1:1/v1"),
                OpenAiConfig::new("m2").with_base_url("http://127.0.0.1:1/v1"),
            ];
            for c in &mut configs {
                c.reminder_role = if user_role { ReminderRole::User } else { ReminderRole::System };
                c.extra = match extra {
                    0 => None,
                    // (`extra` may not set the fields the adapter owns: see OWNED_FIELDS.)
                    1 => Some(json!({"top_k": 20, "temperature": 0.5})),
                    _ => Some(json!({"metadata": {"tools": [{"name": "x"}]}})),
                };
            }
            let models = configs.clone().map(OpenAiModel::new);
            let catalog = |description: &str| vec![ToolSpec {
                name: "read".into(),
                description: description.into(),
                parameters: json!({"type": "object"}),
            }];
            let catalogs = [catalog("Reads"), Vec::new(), catalog("Reads \"quoted\"")];
            let mut tools = &catalogs[0];
            let settings = settings();
            let cache = PrefixCache::new();
            let (mut messages, mut reminders, mut which) = (vec![Message::user("go")], Vec::new(), 0);
            // Bodies still held elsewhere (as by a transport retrying): their buffer must not be
            // reused.
            let mut held = Vec::new();
            for (i, step) in steps.into_iter().enumerate() {
                match step {
                    Step::Append(i) => messages.push(template[i % template.len()].clone()),
                    Step::Reminders(n) => reminders = (0..n).map(|i| format!("r{i}")).collect(),
                    Step::EditLast => {
                        if let Some(Message::User { content } | Message::System { content }) = messages.last_mut() {
                            content.push('!');
                        } else {
                            messages.push(Message::user("edited"));
                        }
                    }
                    Step::Shrink => {
                        messages.pop();
                    }
                    Step::SwapModel => which = 1 - which,
                    Step::Tools(i) => tools = &catalogs[i],
                }
                let request = ModelRequest {
                    messages: &messages,
                    reminders: &reminders,
                    tools,
                    settings: &settings,
                    prefix_cache: Some(&cache),
                };
                let body = models[which].request_body(&request, stream).unwrap();
                let cached: Value = serde_json::from_slice(&body).unwrap();
                if keep[i] {
                    held.push((body.clone(), cached.clone()));
                }
                for (body, value) in &held {
                    prop_assert_eq!(&serde_json::from_slice::<Value>(body).unwrap(), value);
                }
                prop_assert_eq!(cached, build_request_body(&request, &configs[which], stream));
            }
        }
    }

    fn body(
        messages: &[Message],
        reminders: &[String],
        config: &OpenAiConfig,
        s: &ModelSettings,
    ) -> Value {
        let tools = [ToolSpec {
            name: "read".into(),
            description: "Reads a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }];
        let req = ModelRequest {
            messages,
            reminders,
            tools: &tools,
            settings: s,
            prefix_cache: None,
        };
        build_request_body(&req, config, false)
    }

    #[test]
    fn assistant_turns_carry_tool_calls_and_tool_turns_their_call_id() {
        let b = body(
            &conversation(),
            &[],
            &OpenAiConfig::new("gpt-x"),
            &settings(),
        );
        let m = &b["messages"];
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1], json!({"role": "user", "content": "read a.txt"}));
        assert_eq!(m[2]["role"], "assistant");
        // Never `null`: llama-cpp-python's server refuses it.
        assert_eq!(m[2]["content"], "");
        assert_eq!(
            m[2]["tool_calls"][0],
            json!({"id": "call_1", "type": "function",
                   "function": {"name": "read", "arguments": "{\"path\":\"a.txt\"}"}})
        );
        // Our own part is sent back as its field; Anthropic's is dropped.
        assert_eq!(m[2]["reasoning_content"], "I should read it");
        assert!(m[2].get("thinking").is_none() && m[2].get("signature").is_none());
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "hello"})
        );
        assert_eq!(m[4]["tool_call_id"], "call_2");
        assert_eq!(b["model"], "gpt-x");
        assert_eq!(b["tools"][0]["type"], "function");
        assert_eq!(b["tools"][0]["function"]["name"], "read");
        assert!(
            b.get("tool_choice").is_none(),
            "auto is left out for OpenAI"
        );
        let other = OpenAiConfig::new("m").with_base_url("http://localhost:8080/v1");
        let b = body(&conversation(), &[], &other, &settings());
        assert_eq!(b["tool_choice"], "auto", "and said to other servers");
        assert_eq!(b["messages"][2]["content"], "");
        assert!(b.get("stream").is_none());
    }

    #[test]
    fn invalid_arguments_are_never_replayed() {
        let b = body(&conversation(), &[], &OpenAiConfig::new("m"), &settings());
        let sent = b.to_string();
        assert!(
            !sent.contains("{\\\"path\\\": \""),
            "raw invalid text leaked: {sent}"
        );
        let args = b["messages"][2]["tool_calls"][1]["function"]["arguments"]
            .as_str()
            .unwrap();
        assert_eq!(serde_json::from_str::<Value>(args).unwrap(), json!({}));
    }

    #[test]
    fn reminders_follow_the_conversation_as_system_messages_for_openai() {
        let config = OpenAiConfig::new("m");
        assert_eq!(config.reminder_role, ReminderRole::System);
        let reminders = vec!["one".to_string(), "two".to_string()];
        let b = body(&conversation(), &reminders, &config, &settings());
        let m = b["messages"].as_array().unwrap();
        assert_eq!(m.len(), 7);
        assert_eq!(
            m[5],
            json!({"role": "system", "content": "<system-reminder>one</system-reminder>"})
        );
        assert_eq!(
            m[6],
            json!({"role": "system", "content": "<system-reminder>two</system-reminder>"})
        );
    }

    #[test]
    fn reminders_are_one_trailing_user_message_for_other_servers() {
        let config = OpenAiConfig::new("m").with_base_url("http://127.0.0.1:11434/v1");
        assert_eq!(config.reminder_role, ReminderRole::User);
        assert!(config.rescue_text_tool_calls);
        let reminders = vec!["one".to_string(), "two".to_string()];
        let b = body(&conversation(), &reminders, &config, &settings());
        let m = b["messages"].as_array().unwrap();
        assert_eq!(m.len(), 6);
        assert_eq!(
            m[5],
            json!({"role": "user", "content":
                "<system-reminder>one</system-reminder>\n<system-reminder>two</system-reminder>"})
        );
        // A conversation ending with a user turn gets the reminders appended to it instead.
        let convo = vec![Message::system("s"), Message::user("hi")];
        let b = body(&convo, &reminders[..1], &config, &settings());
        let m = b["messages"].as_array().unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[1]["content"],
            "hi\n\n<system-reminder>one</system-reminder>"
        );
        // The user can choose system messages anywhere.
        let mut config = config;
        config.reminder_role = ReminderRole::System;
        let b = body(&convo, &reminders[..1], &config, &settings());
        assert_eq!(b["messages"][2]["role"], "system");
        assert_eq!(b["messages"][1]["content"], "hi");
    }

    #[test]
    fn settings_limits_stream_options_and_extra_merge() {
        let mut s = settings();
        s.temperature = Some(0.7);
        s.max_output_tokens = Some(100);
        s.tool_choice = ToolChoice::Tool("read".into());
        s.extra = Some(json!({"top_k": 20, "temperature": 0.1}));
        let mut config = OpenAiConfig::new("m");
        config.extra = Some(json!({"seed": 7, "top_k": 5}));
        let msgs = [Message::user("x")];
        let tools = [];
        let req = ModelRequest {
            messages: &msgs,
            reminders: &[],
            tools: &tools,
            settings: &s,
            prefix_cache: None,
        };
        let b = build_request_body(&req, &config, true);
        assert_eq!(b["max_completion_tokens"], 100);
        assert!(b.get("max_tokens").is_none());
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"], json!({"include_usage": true}));
        assert!(b.get("tool_choice").is_none(), "no tools, no tool_choice");
        assert_eq!(b["seed"], 7);
        assert_eq!(b["top_k"], 20, "settings' extra wins over the config's");
        assert_eq!(b["temperature"], 0.1, "extra is merged last");

        let config = OpenAiConfig::new("m").with_base_url("http://localhost:8000/v1");
        s.extra = None;
        let b = body(&msgs, &[], &config, &s);
        assert_eq!(b["max_tokens"], 100);
        assert!(b.get("max_completion_tokens").is_none());
        assert_eq!(b["temperature"], 0.7);
        assert_eq!(
            b["tool_choice"],
            json!({"type": "function", "function": {"name": "read"}})
        );
        s.tool_choice = ToolChoice::Required;
        assert_eq!(body(&msgs, &[], &config, &s)["tool_choice"], "required");
    }

    #[test]
    fn config_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = OpenAiConfig::from_vars("gpt", None, env(&[("OPENAI_API_KEY", "sk-1")])).unwrap();
        assert_eq!(c.api_key.as_deref(), Some("sk-1"));
        assert_eq!(c.endpoint(), "https://api.openai.com/v1/chat/completions");
        assert!(!c.rescue_text_tool_calls);
        let e = OpenAiConfig::from_vars("gpt", None, env(&[])).unwrap_err();
        assert!(e.to_string().contains("OPENAI_API_KEY"), "{e}");
        let c = OpenAiConfig::from_vars(
            "llama",
            None,
            env(&[("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1/")]),
        )
        .unwrap();
        assert_eq!(c.api_key, None);
        assert_eq!(c.endpoint(), "http://127.0.0.1:8080/v1/chat/completions");
        assert_eq!(c.reminder_role, ReminderRole::User);
        let c = OpenAiConfig::from_vars(
            "x",
            Some("GROQ_API_KEY"),
            env(&[
                ("GROQ_API_KEY", "gsk"),
                ("OPENAI_API_KEY", "sk"),
                ("OPENAI_BASE_URL", "https://api.groq.com/openai/v1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.api_key.as_deref(), Some("gsk"));
        let e = OpenAiConfig::from_vars(
            "x",
            Some("GROQ_API_KEY"),
            env(&[("OPENAI_BASE_URL", "https://api.groq.com/openai/v1")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("GROQ_API_KEY"), "{e}");
    }

    #[test]
    fn debug_hides_the_key() {
        let mut c = OpenAiConfig::new("m");
        c.api_key = Some("sk-secret".into());
        let shown = format!("{:?} {:?}", c, OpenAiModel::new(c.clone()));
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn openai_urls() {
        assert!(is_openai_url("https://api.openai.com/v1"));
        assert!(is_openai_url("https://API.openai.com:443/v1/"));
        assert!(!is_openai_url("https://api.openai.com.evil.example/v1"));
        assert!(!is_openai_url("http://localhost:11434/v1"));
        let c = OpenAiConfig::new("m").with_base_url("http://x/v1/chat/completions");
        assert_eq!(c.endpoint(), "http://x/v1/chat/completions");
    }

    #[test]
    fn error_bodies() {
        let h = HeaderMap::new();
        let e = parse_error(
            400,
            &h,
            br#"{"error":{"message":"bad","type":"invalid_request_error","code":"x"}}"#,
        );
        assert_eq!(
            (
                e.error_type.as_deref(),
                e.code.as_deref(),
                e.message.as_str(),
                e.retryable
            ),
            (Some("invalid_request_error"), Some("x"), "bad", false)
        );
        let e = parse_error(429, &h, br#"{"error":{"code":429,"message":"slow"}}"#);
        assert_eq!((e.code.as_deref(), e.retryable), (Some("429"), true));
        let e = parse_error(404, &h, br#"{"error":"model 'x' not found"}"#);
        assert_eq!(e.message, "model 'x' not found");
        let e = parse_error(
            400,
            &h,
            br#"{"object":"error","message":"\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set","type":"BadRequestError","param":null,"code":400}"#,
        );
        assert_eq!(e.error_type.as_deref(), Some("BadRequestError"));
        assert!(tools_unsupported(&e));
        assert!(matches!(
            classify(ModelError::Api(e)),
            ModelError::ToolsUnsupported(m) if m.contains("enable-auto-tool-choice")
        ));
        let e = parse_error(
            400,
            &h,
            br#"{"error":{"message":"registry.ollama.ai/library/gemma:2b does not support tools","type":"api_error","param":null,"code":null}}"#,
        );
        assert!(matches!(
            classify(ModelError::Api(e)),
            ModelError::ToolsUnsupported(_)
        ));
        let e = parse_error(502, &h, b"<html>Bad Gateway</html>");
        assert_eq!(
            (e.message.as_str(), e.retryable),
            ("<html>Bad Gateway</html>", true)
        );
        let e = parse_error(503, &h, b"");
        assert!(e.message.contains("503") && e.retryable);
        let e = parse_error(
            400,
            &h,
            br#"[{"error":{"code":400,"message":"m","status":"INVALID_ARGUMENT"}}]"#,
        );
        assert_eq!(e.message, "m");
        // A plain 400 about something else stays an API error.
        let e = parse_error(400, &h, br#"{"error":{"message":"bad temperature"}}"#);
        assert!(matches!(classify(ModelError::Api(e)), ModelError::Api(_)));
        // Long non-JSON bodies are cut on a char boundary.
        let long = "é".repeat(1000);
        let e = parse_error(500, &h, long.as_bytes());
        assert!(e.message.chars().count() <= 301);
    }

    fn decode_stream(body: &str) -> Decoded {
        decode_recorded(200, body.as_bytes(), true)
    }

    fn sse(chunks: &[Value]) -> String {
        let mut s = String::new();
        for c in chunks {
            s.push_str(&format!("data: {c}\n\n"));
        }
        s.push_str("data: [DONE]\n\n");
        s
    }

    #[test]
    fn parallel_calls_sharing_one_index_are_told_apart_by_id() {
        let d = decode_stream(&sse(&[
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\":"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"b","function":{"name":"g","arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        ]));
        let calls = &d.response.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].id.as_str(), calls[0].name.as_str()), ("a", "f"));
        assert_eq!(calls[0].arguments, json!({"x": 1}));
        assert_eq!((calls[1].id.as_str(), calls[1].name.as_str()), ("b", "g"));
    }

    #[test]
    fn calls_without_index_or_id_in_one_delta_stay_apart() {
        let d = decode_stream(&sse(&[json!({"choices":[{"delta":{"tool_calls":[
            {"function":{"name":"f","arguments":{"a":1}}},
            {"function":{"name":"g","arguments":"{\"b\":2}"}}
        ]},"finish_reason":"stop"}]})]));
        let calls = &d.response.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, json!({"a": 1}), "object arguments");
        assert_eq!(calls[1].arguments, json!({"b": 2}));
        assert!(calls[0].id.starts_with("call_") && calls[0].id != calls[1].id);
        assert_eq!(
            d.response.finish_reason,
            FinishReason::ToolCalls,
            "stop with calls"
        );
    }

    #[test]
    fn a_stream_cut_short_is_an_error_and_a_refusal_is_kept_apart() {
        let d = decode_recorded(
            200,
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
            true,
        );
        assert_eq!(d.response.text.as_deref(), Some("hi"));
        assert!(d.error.unwrap().message.contains("ended before"));

        let d = decode_stream(&sse(&[
            json!({"choices":[{"index":0,"delta":{"refusal":"I can't"}}]}),
            json!({"choices":[{"index":0,"delta":{"refusal":" help."},"finish_reason":"stop"}]}),
        ]));
        assert_eq!(d.response.text, None);
        assert_eq!(
            d.response.parts,
            vec![ProviderPart {
                provider: PROVIDER.into(),
                data: json!({"refusal": "I can't help."})
            }]
        );
        assert_eq!(d.response.finish_reason, FinishReason::Stop);
    }

    #[test]
    fn complete_reply_keeps_reasoning_and_usage_details() {
        let body = include_bytes!(
            "../../tests/conformance/deepseek-parallel-tool-calls-reasoning/response.json"
        );
        let r = decode_response(body).unwrap();
        assert_eq!(r.parts.len(), 1);
        assert!(
            r.parts[0].data["reasoning_content"]
                .as_str()
                .unwrap()
                .starts_with("Great")
        );
        assert_eq!(r.usage.unwrap().reasoning_tokens, 26);
        let body =
            include_bytes!("../../tests/conformance/openai-tool-call-cached-tokens/response.json");
        let u = decode_response(body).unwrap().usage.unwrap();
        assert_eq!((u.input_tokens, u.cache_read_tokens), (1187, 1152));
        // The reasoning goes back to the server on the next turn.
        let msg = Message::Assistant(r.to_message());
        assert!(serde_json::to_value(WireMessage(&msg)).unwrap()["reasoning_content"].is_string());
        // Gemini's thought signature on a tool call survives the round trip.
        let body = br#"{"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"},"extra_content":{"google":{"thought_signature":"sig"}}}]}}]}"#;
        let r = decode_response(body).unwrap();
        let wire = serde_json::to_value(WireMessage(&Message::Assistant(r.to_message()))).unwrap();
        assert_eq!(
            wire["tool_calls"][0]["extra_content"]["google"]["thought_signature"],
            "sig"
        );
    }

    #[test]
    fn bad_bodies_say_what_was_wrong() {
        let e = decode_response(b"<html>").unwrap_err();
        assert!(e.to_string().contains("not JSON"), "{e}");
        let e = decode_response(b"{\"object\":\"list\"}").unwrap_err();
        assert!(e.to_string().contains("choices"), "{e}");
        let e = decode_response(br#"{"choices":[{"message":{"tool_calls":[{"id":"x","function":{"arguments":"{}"}}]}}]}"#).unwrap_err();
        assert!(e.to_string().contains("no function name"), "{e}");
    }

    const STREAMS: &[&str] = &[
        include_str!("../../tests/conformance/openai-stream-parallel-two-tools/response.sse"),
        include_str!("../../tests/conformance/mistral-stream-incremental-empty-name/response.sse"),
        include_str!("../../tests/conformance/anthropic-compat-stream-tool-index-1/response.sse"),
        include_str!("../../tests/conformance/openrouter-stream-comments-error-chunk/response.sse"),
        include_str!(
            "../../tests/conformance/groq-stream-error-event-tool-use-failed/response.sse"
        ),
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"18°C — ünïcödé ✓\"},\"finish_reason\":\"stop\"}]}\r\n\r\ndata: [DONE]\r\n\r\n",
    ];

    /// Decodes `body` fed in the given pieces, as events (so ids made up for missing ones do not
    /// differ between runs).
    fn events_in_pieces(body: &[u8], cuts: &[usize]) -> (Vec<StreamEvent>, Option<String>) {
        let mut d = wire::SseReader::new(ChunkDecoder::new(200));
        let mut out = Vec::new();
        let mut last = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        let mut result = Ok(());
        for c in cuts.into_iter().chain([body.len()]) {
            result = result.and_then(|()| d.push(&body[last..c], &mut out));
            last = c;
        }
        let result = result.and_then(|()| d.finish(&mut out));
        (out, result.err().map(|e| e.to_string()))
    }

    /// Decodes a stream whose content is `text` cut at `cuts`, with the rescue on for `tools`.
    fn rescued_stream(
        text: &str,
        cuts: &[usize],
        tools: &[ToolSpec],
    ) -> (ModelResponse, Vec<String>) {
        let chars: Vec<char> = text.chars().collect();
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (chars.len() + 1)).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut last = 0;
        for c in cuts.into_iter().chain([chars.len()]) {
            if c > last {
                let piece: String = chars[last..c].iter().collect();
                chunks.push(json!({"choices":[{"index":0,"delta":{"content": piece}}]}));
            }
            last = c;
        }
        chunks.push(json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}));
        let body = sse(&chunks);
        let mut decoder = ChunkDecoder::new(200);
        decoder.rescue = Some(Rescue::new(tools));
        let mut reader = wire::SseReader::new(decoder);
        let mut events = Vec::new();
        reader.push(body.as_bytes(), &mut events).unwrap();
        reader.finish(&mut events).unwrap();
        let deltas = events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::TextDelta(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        let mut acc = crate::stream::Accumulator::new();
        events.into_iter().for_each(|e| acc.push(e));
        (acc.finish(), deltas)
    }

    fn without_ids(mut r: ModelResponse) -> ModelResponse {
        r.tool_calls.iter_mut().for_each(|c| c.id.clear());
        r
    }

    /// The typed path, where it accepts a body, decodes it as the value path does.
    fn paths_agree(body: &[u8]) -> Result<bool, String> {
        let Some(fast) = typed::decode(body) else {
            return Ok(false);
        };
        match decode_value(body) {
            Ok(slow) if without_ids(fast.clone()) == without_ids(slow.clone()) => Ok(true),
            other => Err(format!(
                "typed {fast:?}\nvalue {other:?}\nbody {}",
                String::from_utf8_lossy(body)
            )),
        }
    }

    #[test]
    fn typed_and_value_decoding_agree_on_the_corpus() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
        let mut typed = 0;
        for case in std::fs::read_dir(&dir).unwrap() {
            let case = case.unwrap().path();
            let Ok(meta) = std::fs::read(case.join("meta.json")) else {
                continue;
            };
            let meta: Value = serde_json::from_slice(&meta).unwrap();
            if meta["api"] != "openai-chat" || meta["stream"] == true {
                continue;
            }
            let file = meta["response_file"].as_str().unwrap_or("response.json");
            let body = std::fs::read(case.join(file)).unwrap();
            match paths_agree(&body) {
                Ok(took) => typed += usize::from(took),
                Err(e) => panic!("{}: {e}", case.display()),
            }
        }
        // Every successful complete reply in the corpus has the usual shape.
        assert!(
            typed >= 12,
            "the typed path took only {typed} corpus bodies"
        );
    }

    /// Completion bodies built from the usual fields, each absent, of the right type, or odd:
    /// null, of the wrong type, empty, escaped.
    fn completion_body() -> BoxedStrategy<String> {
        let odd = proptest::sample::select(vec![
            "null",
            "0",
            "1",
            "-1",
            "0.0",
            "\"\"",
            "\"x\\n\\u00e9\"",
            "{}",
            "[]",
            "{\"a\":1}",
            "[{\"type\":\"text\",\"text\":\"hi\"}]",
            "[\"hi\",[]]",
        ])
        .prop_map(str::to_string)
        .boxed();
        let pick = |good: &[&'static str]| {
            let good = proptest::sample::select(good.to_vec()).prop_map(str::to_string);
            prop_oneof![12 => good, 1 => odd.clone()].boxed()
        };
        let object = |fields: Vec<(&'static str, BoxedStrategy<String>)>| {
            let fields: Vec<_> = fields
                .into_iter()
                .map(|(k, v)| {
                    proptest::option::weighted(0.85, v.prop_map(move |v| format!("\"{k}\":{v}")))
                })
                .collect();
            fields
                .prop_map(|f| {
                    format!(
                        "{{{}}}",
                        f.into_iter().flatten().collect::<Vec<_>>().join(",")
                    )
                })
                .boxed()
        };
        let array = |item: BoxedStrategy<String>| {
            proptest::collection::vec(item, 0..3)
                .prop_map(|items| format!("[{}]", items.join(",")))
                .boxed()
        };
        let either =
            |good: BoxedStrategy<String>| prop_oneof![12 => good, 1 => odd.clone()].boxed();
        let function = object(vec![
            (
                "name",
                pick(&["\"read\"", "\"read\"", "\"\"", "\"r\\u00e9ad\""]),
            ),
            (
                "arguments",
                pick(&[
                    "\"{\\\"a\\\":1}\"",
                    "\"\"",
                    "{\"a\":1}",
                    "\"{bad\"",
                    "\"\\\"{}\\\"\"",
                ]),
            ),
        ]);
        let call = object(vec![
            ("id", pick(&["\"call_1\"", "\"\"", "\"call_\\u00e9\""])),
            ("type", pick(&["\"function\""])),
            ("function", either(function)),
            (
                "extra_content",
                pick(&["{\"google\":{\"thought_signature\":\"s\"}}", "null"]),
            ),
        ]);
        let message = object(vec![
            ("role", pick(&["\"assistant\""])),
            ("content", pick(&["\"hi\"", "\"\"", "\"a\\\"b\""])),
            ("tool_calls", either(array(call))),
            ("reasoning_content", pick(&["\"why\"", "\"\""])),
            ("refusal", pick(&["\"no\"", "\"\""])),
            ("extra_content", pick(&["{\"k\":1}"])),
        ]);
        let choice = object(vec![
            ("index", pick(&["0", "1"])),
            ("message", either(message)),
            (
                "finish_reason",
                pick(&["\"stop\"", "\"tool_calls\"", "\"length\"", "\"odd\""]),
            ),
        ]);
        let usage = object(vec![
            ("prompt_tokens", pick(&["3", "3", "3", "3.0"])),
            ("completion_tokens", pick(&["2"])),
            (
                "prompt_tokens_details",
                pick(&["{\"cached_tokens\":1}", "{\"cached_tokens\":null}", "null"]),
            ),
            ("cached_tokens", pick(&["4"])),
            ("prompt_cache_hit_tokens", pick(&["5"])),
            ("num_cached_tokens", pick(&["6"])),
            (
                "completion_tokens_details",
                pick(&["{\"reasoning_tokens\":7}", "{}"]),
            ),
        ]);
        let groq = "{\"usage\":{\"prompt_tokens\":5}}";
        object(vec![
            ("id", pick(&["\"chatcmpl-1\""])),
            ("choices", either(array(choice))),
            ("usage", either(usage)),
            ("x_groq", pick(&[groq])),
            (
                "error",
                pick(&["null", "null", "null", "{\"message\":\"bad\"}"]),
            ),
        ])
    }

    #[test]
    fn typed_decoding_agrees_with_the_value_path() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let strategy = completion_body();
        let (mut typed, cases) = (0, 3000);
        for _ in 0..cases {
            let body = strategy.new_tree(&mut runner).unwrap().current();
            match paths_agree(body.as_bytes()) {
                Ok(took) => typed += usize::from(took),
                Err(e) => panic!("{e}"),
            }
        }
        // The bodies must exercise the typed path, not only the fallback.
        assert!(
            typed * 12 > cases,
            "the typed path took only {typed} of {cases} bodies"
        );
    }

    const LEAKED: &[&str] = &[
        "Let me look.\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>\n<tool_call>{\"name\": \"read\", \"arguments\": {'path': 'b',}}</tool_call>",
        "[TOOL_CALLS]read[ARGS]{\"path\": \"x\"}",
        "Sure: <PTK_CALL>{\"tool\": \"read\", \"args\": {\"path\": \"é\"}}</PTK_CALL> done.",
        "```json\n{\"name\": \"read\", \"arguments\": {\"path\": \"c\"}}\n```",
        "Use <tool_call> tags, like <tool_call>{oops</tool_call>, to call.",
        "Just text, with a < sign and [brackets].",
    ];

    proptest! {
        #[test]
        fn rescued_streams_decode_like_the_complete_body(
            which in 0..LEAKED.len(),
            cuts in proptest::collection::vec(0usize..400, 0..12),
        ) {
            let text = LEAKED[which];
            let tools = [ToolSpec {
                name: "read".into(),
                description: "Reads".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            }];
            let body = json!({"choices":[{"index":0,"finish_reason":"stop",
                "message":{"role":"assistant","content": text}}]});
            let complete = Rescue::apply(decode_response(body.to_string().as_bytes()).unwrap(), &tools);
            let (streamed, deltas) = rescued_stream(text, &cuts, &tools);
            prop_assert_eq!(without_ids(streamed), without_ids(complete.clone()));
            if which < 4 {
                for d in &deltas {
                    prop_assert!(
                        !d.contains(['<', '[', '`', '{', '}']),
                        "a call fragment streamed: {:?}",
                        deltas
                    );
                }
                prop_assert!(!complete.tool_calls.is_empty());
                prop_assert_eq!(complete.finish_reason, FinishReason::ToolCalls);
                for c in &complete.tool_calls {
                    prop_assert_eq!(c.provider_data.as_ref().and_then(|d| d.get("rescued")), Some(&json!(true)));
                }
            } else {
                // A near miss stays text, never an error; plain text is left as it is.
                prop_assert!(complete.tool_calls.is_empty());
                prop_assert_eq!(complete.malformed_call.clone(), None);
                prop_assert_eq!(complete.finish_reason, FinishReason::Stop);
                let got = complete.text.clone().unwrap_or_default();
                if which == 4 {
                    prop_assert!(got.contains("<tool_call>{oops</tool_call>"), "{}", got);
                } else {
                    prop_assert_eq!(got, text);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn any_chunking_decodes_like_one_chunk(
            which in 0..STREAMS.len(),
            cuts in proptest::collection::vec(0usize..100_000, 0..12),
        ) {
            let body = STREAMS[which].as_bytes();
            let whole = events_in_pieces(body, &[]);
            prop_assert!(!whole.0.is_empty() || whole.1.is_some());
            prop_assert_eq!(events_in_pieces(body, &cuts), whole);
        }
    }
}
