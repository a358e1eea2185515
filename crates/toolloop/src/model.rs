//! The model interface: one call, complete or streamed.
//!
//! A [`Model`] takes a [`ModelRequest`] (the conversation, transient reminders, the tool catalog
//! and settings) and gives either a complete [`ModelResponse`] or a stream of
//! [`StreamEvent`]s. The [`Accumulator`] turns a stream into the response, so streamed and
//! non-streamed runs produce identical transcripts.

use crate::message::{AssistantMessage, Message, Messages, ProviderPart, ToolCall};
use crate::stream::{Accumulator, StreamEvent};
use crate::usage::Usage;
use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::hash::{BuildHasher, Hash, Hasher};
use std::time::Duration;

/// A stream of events from one model call.
pub type EventStream = BoxStream<'static, Result<StreamEvent, ModelError>>;

/// A language model, behind a provider adapter.
#[async_trait]
pub trait Model: Send + Sync {
    /// The model's name, as used for prices and logs (`gpt-4o`, `test`, …).
    fn name(&self) -> &str;

    /// One complete call.
    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError>;

    /// One streamed call. The default streams the complete response as events.
    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        let response = self.complete(request).await?;
        Ok(Box::pin(futures::stream::iter(
            response.into_events().into_iter().map(Ok),
        )))
    }

    /// The model for one run. The [`Agent`](crate::agent::Agent) asks for one at the start of
    /// each run and sends every request of that run through it, so a session may keep state
    /// between them: an adapter may keep its encoding of the conversation so far, so that each
    /// request encodes only the messages added since (as the OpenAI adapter's does). A
    /// session's requests come from one conversation that only grows; a wrapper that rewrites
    /// the conversation before calling an inner model calls the inner model itself, not a
    /// session of it. The default is this model, unchanged.
    fn session(&self) -> Box<dyn Model + '_> {
        Box::new(Forward(self))
    }

    /// What the provider's API does to the context itself (see [`crate::context::native`]):
    /// an adapter whose API can clear old tool results or compact the conversation says so,
    /// and translates [`ModelSettings::context`] into its API's field. The default: nothing.
    fn native_context(&self) -> crate::context::NativeSupport {
        crate::context::NativeSupport::default()
    }
}

/// The default [`Model::session`]: the model itself.
#[cfg(feature = "http")]
pub(crate) fn forward<M: Model + ?Sized>(model: &M) -> Box<dyn Model + '_> {
    Box::new(Forward(model))
}

/// The default [`Model::session`]: the model itself.
struct Forward<'a, M: ?Sized>(&'a M);

#[async_trait]
impl<M: Model + ?Sized> Model for Forward<'_, M> {
    fn name(&self) -> &str {
        self.0.name()
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.0.complete(request).await
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        self.0.stream(request).await
    }

    fn session(&self) -> Box<dyn Model + '_> {
        Box::new(Forward(self.0))
    }

    fn native_context(&self) -> crate::context::NativeSupport {
        self.0.native_context()
    }
}

/// What one model call is asked.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    /// The conversation so far: the transcript, or, with a context policy, the view the
    /// policy keeps of it, read in place (see [`Messages`]; built from a slice with
    /// `(&messages).into()`).
    pub messages: Messages<'a>,
    /// Transient reminders for this request only. Each adapter puts them where its API accepts
    /// them, wrapped in `<system-reminder>` tags, after the conversation; they are never stored.
    pub reminders: &'a [String],
    /// The tool catalog.
    pub tools: &'a [ToolSpec],
    /// Model name, temperature, limits, tool choice, output schema.
    pub settings: &'a ModelSettings,
}

/// A 64-bit fingerprint of a message (every field, arguments included), for an adapter's
/// [`Model::session`] to check that the message it remembers is unchanged without keeping a copy.
pub fn message_fingerprint(message: &Message) -> u64 {
    let mut h = fingerprint_hasher();
    match message {
        Message::System { content } => (0u8, content).hash(&mut h),
        Message::User { content, images } => (1u8, content, images).hash(&mut h),
        Message::Tool(r) => {
            (2u8, &r.call_id, &r.name, &r.content, r.is_error, &r.images).hash(&mut h)
        }
        Message::Assistant(a) => {
            (3u8, &a.text, a.tool_calls.len(), a.parts.len()).hash(&mut h);
            for c in &a.tool_calls {
                (&c.id, &c.name, &c.invalid_arguments).hash(&mut h);
                hash_value(&c.arguments, &mut h);
                match &c.provider_data {
                    Some(d) => hash_value(d, &mut h),
                    None => h.write_u8(0xff),
                }
            }
            for p in &a.parts {
                p.provider.hash(&mut h);
                hash_value(&p.data, &mut h);
            }
        }
    }
    h.finish()
}

/// A 64-bit fingerprint of a tool catalog (names, descriptions and schemas), for an adapter's
/// [`Model::session`] to check that the catalog it encoded is unchanged.
///
/// The agent's requests offer their run's catalog, whose fingerprint it made once: for that very
/// catalog (the same slice), during its model call, this is a read instead of a walk of every
/// schema.
pub fn catalog_fingerprint(tools: &[ToolSpec]) -> u64 {
    match KNOWN_CATALOG.with(|k| k.get()) {
        Some(known) if known.is(tools) => known.fingerprint,
        _ => fingerprint_of(tools),
    }
}

fn fingerprint_of(tools: &[ToolSpec]) -> u64 {
    let mut h = fingerprint_hasher();
    tools.len().hash(&mut h);
    for t in tools {
        (&t.name, &t.description).hash(&mut h);
        hash_value(&t.parameters, &mut h);
    }
    h.finish()
}

thread_local! {
    /// The catalog of the model call being polled on this thread, with its fingerprint (set by
    /// [`with_known_catalog`] for the length of one poll).
    static KNOWN_CATALOG: std::cell::Cell<Option<KnownCatalog>> = const { std::cell::Cell::new(None) };
}

/// A catalog whose fingerprint is known: where its specs are, how many, and the fingerprint.
///
/// It is only ever installed while a future that borrows those very specs is polled, and taken
/// away when the poll ends (or unwinds): so while it is installed, the address and length name
/// that catalog and no other (a slice can neither be freed nor changed while it is borrowed,
/// and a spec has nothing mutable behind a shared reference), and a slice with the same
/// address and length is that catalog.
#[derive(Clone, Copy)]
pub(crate) struct KnownCatalog {
    address: usize,
    len: usize,
    fingerprint: u64,
}

/// The fingerprint known for `tools` now, if one is.
#[cfg(test)]
pub(crate) fn known_fingerprint(tools: &[ToolSpec]) -> Option<u64> {
    KNOWN_CATALOG
        .with(|k| k.get())
        .filter(|k| k.is(tools))
        .map(|k| k.fingerprint)
}

impl KnownCatalog {
    fn is(&self, tools: &[ToolSpec]) -> bool {
        tools.as_ptr() as usize == self.address && tools.len() == self.len
    }
}

/// `fut`, polled with the fingerprint of `tools` known to be `fingerprint` (which the caller
/// made by [`catalog_fingerprint`] of the same `tools`), so that [`catalog_fingerprint`] of that
/// catalog during the poll reads it. An empty catalog is not worth it. Polls nest: each puts back
/// what was known before it.
pub(crate) fn with_known_catalog<'a, F: Future + ?Sized>(
    mut fut: std::pin::Pin<&'a mut F>,
    tools: &'a [ToolSpec],
    fingerprint: u64,
) -> impl Future<Output = F::Output> + 'a {
    let known = (!tools.is_empty()).then_some(KnownCatalog {
        address: tools.as_ptr() as usize,
        len: tools.len(),
        fingerprint,
    });
    std::future::poll_fn(move |cx| {
        /// Puts back what was known before, however the poll ends.
        struct Restore(Option<KnownCatalog>);
        impl Drop for Restore {
            fn drop(&mut self) {
                KNOWN_CATALOG.with(|k| k.set(self.0));
            }
        }
        let _restore = Restore(KNOWN_CATALOG.with(|k| k.replace(known)));
        // `tools` is borrowed for the whole of this poll (the closure holds it).
        let _ = tools;
        fut.as_mut().poll(cx)
    })
}

fn fingerprint_hasher() -> impl Hasher {
    foldhash::fast::FixedState::with_seed(0x746f_6f6c_6c6f_6f70).build_hasher()
}

/// Feeds a JSON value to `h`, walking it (no encoding, no allocation).
fn hash_value<H: Hasher>(v: &Value, h: &mut H) {
    match v {
        Value::Null => h.write_u8(0),
        Value::Bool(b) => (1u8, *b).hash(h),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => (2u8, u).hash(h),
            (None, Some(i)) => (3u8, i).hash(h),
            (None, None) => (4u8, n.as_f64().map(f64::to_bits)).hash(h),
        },
        Value::String(s) => (5u8, s).hash(h),
        Value::Array(items) => {
            (6u8, items.len()).hash(h);
            items.iter().for_each(|i| hash_value(i, h));
        }
        Value::Object(map) => {
            (7u8, map.len()).hash(h);
            for (k, v) in map {
                k.hash(h);
                hash_value(v, h);
            }
        }
    }
}

impl ModelRequest<'_> {
    /// Each reminder wrapped in `<system-reminder>` tags.
    pub fn wrapped_reminders(&self) -> impl Iterator<Item = String> + '_ {
        self.reminders
            .iter()
            .map(|r| format!("<system-reminder>{r}</system-reminder>"))
    }
}

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: Value,
}

/// Whether and which tools the model may call.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call.
    Required,
    /// This tool.
    Tool(String),
}

/// Settings for a model call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSettings {
    /// Overrides the adapter's model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The most output tokens one call may produce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Tool choice.
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// Extra top-level request fields, merged into the provider's request body as they are
    /// (`{"top_k": 20}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Value>,
    /// The JSON Schema the final answer must match (see [`crate::output`]): each adapter asks
    /// its API for JSON of that shape, and the loop validates the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<crate::output::OutputSchema>,
    /// The context management asked of the provider itself (see [`crate::context::native`]),
    /// set by the run from its context policy when the adapter offers it
    /// ([`Model::native_context`]); each adapter translates it into its API's field. An
    /// adapter that offers none leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<crate::context::NativeContext>,
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end of the turn.
    #[default]
    Stop,
    /// The model asked for tool calls.
    ToolCalls,
    /// The output-token limit cut the turn.
    Length,
    /// A content filter or a refusal ended the turn.
    ContentFilter,
    /// The model produced a tool call the provider could not parse (Gemini's
    /// `MALFORMED_FUNCTION_CALL`); the model may try again.
    MalformedToolCall,
    /// The provider reported an error.
    Error,
}

/// A complete model response.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The user-visible text, `None` when there was none.
    pub text: Option<String>,
    /// The tool calls, in output order.
    pub tool_calls: Vec<ToolCall>,
    /// Why the model stopped.
    pub finish_reason: FinishReason,
    /// Token usage, when the provider reported it.
    pub usage: Option<Usage>,
    /// Opaque provider parts (thinking blocks…), to be sent back unchanged.
    pub parts: Vec<ProviderPart>,
    /// Set when the reply attempted a tool call that could not be parsed (a near miss in
    /// prompt-based calling, Gemini's `MALFORMED_FUNCTION_CALL`): what was wrong and the exact
    /// format expected. The loop does not take such a reply as the final answer; it sends this
    /// explanation back to the model, within the invalid-call budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub malformed_call: Option<String>,
    /// What the provider reports it did to the request's context itself (see
    /// [`crate::context::native`]), when it did something.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_edited: Option<crate::context::NativeReport>,
}

impl ModelResponse {
    /// A text-only response.
    pub fn text(text: impl Into<String>) -> Self {
        ModelResponse {
            text: Some(text.into()),
            ..ModelResponse::default()
        }
    }

    /// A response that calls tools.
    pub fn tool_calls(calls: Vec<ToolCall>) -> Self {
        ModelResponse {
            tool_calls: calls,
            finish_reason: FinishReason::ToolCalls,
            ..ModelResponse::default()
        }
    }

    /// The response as the events a stream would carry; [`Accumulator`] turns them back into an
    /// equal response.
    pub fn into_events(self) -> Vec<StreamEvent> {
        let mut events = Vec::with_capacity(4 + self.tool_calls.len() * 3 + self.parts.len());
        for part in self.parts {
            events.push(StreamEvent::Part(part));
        }
        if let Some(text) = self.text {
            events.push(StreamEvent::TextDelta(text));
        }
        for (index, call) in self.tool_calls.into_iter().enumerate() {
            events.push(StreamEvent::ToolCallStart {
                index,
                id: Some(call.id),
                name: call.name,
            });
            let args = match call.invalid_arguments {
                Some(raw) => raw,
                None => call.arguments.to_string(),
            };
            events.push(StreamEvent::ToolCallDelta {
                index,
                arguments: args,
            });
            if let Some(data) = call.provider_data {
                events.push(StreamEvent::ToolCallData { index, data });
            }
            events.push(StreamEvent::ToolCallEnd { index });
        }
        if let Some(usage) = self.usage {
            events.push(StreamEvent::Usage(usage));
        }
        if let Some(why) = self.malformed_call {
            events.push(StreamEvent::MalformedCall(why));
        }
        if let Some(report) = self.context_edited {
            events.push(StreamEvent::ContextEdited(report));
        }
        events.push(StreamEvent::Finish(self.finish_reason));
        events
    }

    /// Collects a stream of events into a response.
    pub async fn from_stream(mut stream: EventStream) -> Result<ModelResponse, ModelError> {
        use futures::StreamExt;
        let mut acc = Accumulator::new();
        while let Some(event) = stream.next().await {
            acc.push(event?);
        }
        Ok(acc.finish())
    }

    /// The assistant message this response adds to the transcript.
    pub fn to_message(&self) -> AssistantMessage {
        AssistantMessage {
            text: self.text.clone(),
            tool_calls: self.tool_calls.clone(),
            parts: self.parts.clone(),
        }
    }
}

/// An error reported by a provider's API: an HTTP error body, or an error event in a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    /// The HTTP status (200 for an error event inside a successful stream).
    pub status: u16,
    /// The provider's error type (`invalid_request_error`, `rate_limit_error`, …).
    pub error_type: Option<String>,
    /// The provider's error code, as text.
    pub code: Option<String>,
    /// The provider's message.
    pub message: String,
    /// Whether trying again may succeed.
    pub retryable: bool,
    /// How long the provider asked us to wait, if it said.
    #[serde(default, with = "opt_millis")]
    pub retry_after: Option<Duration>,
}

/// Why a model call failed.
///
/// The variants carry messages, not the underlying errors: an HTTP client's error prints the
/// request's URL, which may hold a key (`?key=` for Gemini), and a server's error body may echo
/// one. Each message has its secrets removed before it is stored here (see [`crate::redact`]),
/// and the error is cloned into events, outcomes and run logs.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The provider answered with an error.
    #[error("{} error {}{}: {}", provider_label(.0), .0.status, .0.error_type.as_deref().map(|t| format!(" ({t})")).unwrap_or_default(), .0.message)]
    Api(ApiError),
    /// The connection failed, was reset, or timed out.
    #[error("transport error: {message}")]
    Transport {
        /// What happened.
        message: String,
        /// Whether trying again may succeed.
        retryable: bool,
    },
    /// A streamed response broke after it had delivered output. The transport never replays
    /// such a stream; the loop may restart the model call (see
    /// [`crate::config::LoopConfig::stream_restarts`]).
    #[error("the stream broke after delivering output: {0}")]
    StreamInterrupted(String),
    /// The response could not be understood.
    #[error("invalid response from the provider: {0}")]
    InvalidResponse(String),
    /// The response body was larger than the configured limit.
    #[error("response body larger than the limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The request does not fit the model's context window: the provider refused it for its
    /// size (OpenAI's `context_length_exceeded`, Anthropic's "prompt is too long", Gemini's
    /// "input token count exceeds the maximum", llama.cpp's `exceed_context_size_error`, …).
    /// Each adapter recognises its provider's shape; never retried as it is, since the same
    /// request would be refused again.
    #[error("{0}")]
    ContextOverflow(crate::context::ContextOverflow),
    /// The provider does not accept a tool catalog (the signal for falling back to prompt-based
    /// tool calling).
    #[error("the server does not support native tool calling: {0}")]
    ToolsUnsupported(String),
    /// Configuration is missing or wrong (an API key, a base URL…).
    #[error("configuration error: {0}")]
    Config(String),
    /// Any other failure (a scripted model that ran out of responses, for example).
    #[error("{0}")]
    Other(String),
}

fn provider_label(_: &ApiError) -> &'static str {
    "API"
}

impl ModelError {
    /// Whether trying the same call again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            ModelError::Api(e) => e.retryable,
            ModelError::Transport { retryable, .. } => *retryable,
            _ => false,
        }
    }
}

mod opt_millis {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        d.map(|d| d.as_millis() as u64).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fingerprints_follow_every_field() {
        let mut call = ToolCall::new("read", json!({"path": "a", "n": [1, -2, 2.5, null, true]}));
        call.provider_data = Some(json!({"sig": "x"}));
        let assistant = Message::Assistant(AssistantMessage {
            text: Some("t".into()),
            tool_calls: vec![call],
            parts: vec![ProviderPart {
                provider: "p".into(),
                data: json!({"k": 1}),
            }],
        });
        let edits: Vec<fn(&mut Message)> = vec![
            |m| {
                if let Message::Assistant(a) = m {
                    a.text = None;
                }
            },
            |m| {
                if let Message::Assistant(a) = m {
                    a.tool_calls[0].arguments["n"][1] = json!(2);
                }
            },
            |m| {
                if let Message::Assistant(a) = m {
                    a.tool_calls[0].arguments["n"][2] = json!(2.25);
                }
            },
            |m| {
                if let Message::Assistant(a) = m {
                    a.tool_calls[0].id.push('!');
                }
            },
            |m| {
                if let Message::Assistant(a) = m {
                    a.tool_calls[0].provider_data = None;
                }
            },
            |m| {
                if let Message::Assistant(a) = m {
                    a.parts[0].data = json!({"k": "1"});
                }
            },
        ];
        let base = message_fingerprint(&assistant);
        assert_eq!(base, message_fingerprint(&assistant.clone()));
        for (i, edit) in edits.iter().enumerate() {
            let mut m = assistant.clone();
            edit(&mut m);
            assert_ne!(message_fingerprint(&m), base, "edit {i} went unnoticed");
        }
        let tool = |content: &str, is_error| {
            Message::Tool(crate::message::ToolResult {
                call_id: "c".into(),
                name: "read".into(),
                content: content.into(),
                is_error,
                images: Vec::new(),
            })
        };
        assert_ne!(
            message_fingerprint(&tool("x", false)),
            message_fingerprint(&tool("x", true))
        );
        assert_ne!(
            message_fingerprint(&tool("x", false)),
            message_fingerprint(&tool("y", false))
        );
        assert_ne!(
            message_fingerprint(&Message::user("a")),
            message_fingerprint(&Message::system("a"))
        );
        let mut seen = tool("x", false);
        if let Message::Tool(r) = &mut seen {
            r.images
                .push(crate::image::Image::from_bytes(b"GIF89a\x01\x00").unwrap());
        }
        assert_ne!(
            message_fingerprint(&tool("x", false)),
            message_fingerprint(&seen)
        );

        let spec = |description: &str, parameters: Value| ToolSpec {
            name: "read".into(),
            description: description.into(),
            parameters,
        };
        let catalog = [spec("Reads", json!({"type": "object"}))];
        assert_eq!(
            catalog_fingerprint(&catalog),
            catalog_fingerprint(&catalog.clone())
        );
        for other in [
            vec![],
            vec![spec("Reads!", json!({"type": "object"}))],
            vec![spec("Reads", json!({"type": "array"}))],
            vec![catalog[0].clone(), catalog[0].clone()],
        ] {
            assert_ne!(catalog_fingerprint(&catalog), catalog_fingerprint(&other));
        }
    }

    #[tokio::test]
    async fn a_known_catalog_fingerprint_is_read_only_for_that_catalog_during_its_call() {
        let spec = |name: &str| ToolSpec {
            name: name.into(),
            description: "Reads".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        };
        let catalog = vec![spec("read"), spec("write")];
        let real = catalog_fingerprint(&catalog);
        // A known fingerprint unlike the real one shows which path answered.
        let known = real ^ 1;
        let copy = catalog.clone();
        let shorter = &catalog[..1];
        let seen = std::sync::Mutex::new(Vec::new());
        let call = async {
            for step in 0..2 {
                seen.lock().unwrap().push((
                    catalog_fingerprint(&catalog),
                    // Another catalog, equal or a part of it: made, not read.
                    catalog_fingerprint(&copy),
                    catalog_fingerprint(shorter),
                ));
                if step == 0 {
                    // Known again after the call waits (each poll).
                    tokio::task::yield_now().await;
                }
            }
        };
        with_known_catalog(std::pin::pin!(call), &catalog, known).await;
        let expected = (known, real, catalog_fingerprint(shorter));
        assert_eq!(*seen.lock().unwrap(), vec![expected, expected]);
        // Known only while the call is polled.
        assert_eq!(catalog_fingerprint(&catalog), real);

        // Nested calls each put back what was known before them; an unwinding poll too.
        let inner = async { catalog_fingerprint(&copy) };
        let outer = async {
            let nested = with_known_catalog(std::pin::pin!(inner), &copy, 5).await;
            (nested, catalog_fingerprint(&catalog))
        };
        assert_eq!(
            with_known_catalog(std::pin::pin!(outer), &catalog, known).await,
            (5, known)
        );
        let panics = async { panic!("the call panicked") };
        let unwound = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(
            with_known_catalog(std::pin::pin!(panics), &catalog, known),
        ))
        .await;
        assert!(unwound.is_err());
        assert_eq!(catalog_fingerprint(&catalog), real);
    }

    #[tokio::test]
    async fn response_survives_events_and_back() {
        let mut call = ToolCall::new("f", json!({"a": [1, 2]}));
        call.provider_data = Some(json!({"sig": "x"}));
        let mut bad = ToolCall::from_raw_arguments("c2".into(), "g".into(), "{oops");
        bad.provider_data = None;
        let r = ModelResponse {
            text: Some("hi".into()),
            tool_calls: vec![call, bad],
            finish_reason: FinishReason::ToolCalls,
            usage: Some(Usage {
                input_tokens: 3,
                output_tokens: 4,
                ..Usage::default()
            }),
            parts: vec![ProviderPart {
                provider: "anthropic".into(),
                data: json!({"type": "thinking"}),
            }],
            malformed_call: Some("bad tag".into()),
            context_edited: Some(crate::context::NativeReport {
                cleared_tool_uses: 2,
                cleared_input_tokens: 300,
                compacted: false,
                refused: true,
            }),
        };
        let events = r.clone().into_events();
        let stream: EventStream = Box::pin(futures::stream::iter(events.into_iter().map(Ok)));
        assert_eq!(ModelResponse::from_stream(stream).await.unwrap(), r);
    }

    #[test]
    fn errors_say_what_happened() {
        let e = ModelError::Api(ApiError {
            status: 429,
            error_type: Some("rate_limit_error".into()),
            code: None,
            message: "slow down".into(),
            retryable: true,
            retry_after: Some(Duration::from_millis(1500)),
        });
        assert!(e.is_retryable());
        assert_eq!(e.to_string(), "API error 429 (rate_limit_error): slow down");
    }
}
