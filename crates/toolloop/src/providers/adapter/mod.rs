//! What the HTTP adapters share: the [`HttpAdapter`] trait an adapter implements (where a call
//! goes, its headers and body, what its error bodies, responses and stream events mean), the one
//! [`Model`] implementation over it, and the plumbing that carries bytes, events and errors
//! between the transport, an adapter's decoder and the caller ([`plumbing`]).
//!
//! An adapter says what its API means; how a call is made (retries, streams opened again, keys
//! kept out of errors) is the same for every adapter and lives here and in
//! [`crate::transport`].

mod meaning;
mod native_refusal;
mod plumbing;

pub(crate) use meaning::{ErrorMeaning, tools_always_supported};
pub(crate) use native_refusal::ContextRefusal;
use native_refusal::{mark_refused, refused_event};
pub(crate) use plumbing::*;

#[cfg(feature = "http")]
use crate::model::{EventStream, Model};
use crate::model::{ModelError, ModelRequest, ModelResponse};
#[cfg(any(test, feature = "testing"))]
use crate::providers::Decoded;
#[cfg(feature = "http")]
use crate::transport::http::HttpTransport;
use crate::transport::wire::{Endpoint, ErrorParser};
#[cfg(feature = "http")]
use async_trait::async_trait;
use bytes::Bytes;
#[cfg(feature = "http")]
use futures::StreamExt;
use futures::future::BoxFuture;
use http::header::HeaderMap;
use std::borrow::Cow;

/// One HTTP provider's API, as an adapter describes it. The calls are made by the one
/// [`Model`] implementation over this trait, the same for every adapter.
pub(crate) trait HttpAdapter: Send + Sync + 'static {
    /// Decodes the events of a streamed response.
    type StreamDecoder: SseDecode;

    /// How a request is written after what the server refused of earlier ones (fields left out
    /// or replaced: see [`HttpAdapter::learn`]); `()` for an API whose requests have one shape.
    /// Its default is the shape of a server that has refused nothing.
    type Shape: Copy + Default + Send + Sync;

    /// The API's name in messages (`"Anthropic"`).
    const API: &'static str;

    /// The top-level request fields the adapter writes itself, which an `extra` (the
    /// configuration's or the settings') may not set.
    const OWNED_FIELDS: &'static [&'static str];

    /// The model's name (what [`Model::name`] says).
    fn model(&self) -> &str;

    /// The HTTP client calls go through.
    #[cfg(feature = "http")]
    fn transport(&self) -> &HttpTransport;

    /// Where `request` goes, streamed or not: borrowed when it is the same for every call (an
    /// adapter keeps it parsed), so a call neither copies nor parses it.
    fn url(&self, request: &ModelRequest<'_>, stream: bool) -> Cow<'_, Endpoint>;

    /// The headers of a call of `request` (the key among them, marked sensitive): borrowed when
    /// they are the same for every call, so a call does not copy them.
    fn headers(&self, request: &ModelRequest<'_>) -> Result<Cow<'_, HeaderMap>, ModelError>;

    /// Where a streamed call of `request` goes and its headers, held by the stream for as long
    /// as it may open again. The default copies [`HttpAdapter::url`] and
    /// [`HttpAdapter::headers`]; an adapter whose calls all go to one place with the same headers
    /// shares its own instead, so that opening a stream copies neither.
    #[cfg(feature = "http")]
    fn stream_target(&self, request: &ModelRequest<'_>) -> Result<HeldTarget, ModelError> {
        Ok(HeldTarget::Own(Target {
            url: self.url(request, true).into_owned(),
            headers: self.headers(request)?.into_owned(),
        }))
    }

    /// The configuration's `extra` request fields.
    fn extra(&self) -> Option<&serde_json::Value>;

    /// Checks what the configuration and `request` add to the request before it is written.
    /// The default: neither `extra` sets one of the [`HttpAdapter::OWNED_FIELDS`].
    fn check(&self, request: &ModelRequest<'_>) -> Result<(), ModelError> {
        check_extras(Self::API, self.extra(), Some(request), Self::OWNED_FIELDS)
    }

    /// The body of `request`, streamed or not, as a JSON value (of a server that has refused
    /// nothing).
    fn request_json(&self, request: &ModelRequest<'_>, stream: bool) -> serde_json::Value;

    /// The body of `request` in `shape`, streamed or not, after [`HttpAdapter::check`]. The
    /// default: [`HttpAdapter::request_json`], for an API whose requests have one shape, written
    /// as serde_json writes it (by [`crate::providers::json_write`], without a call per run of
    /// bytes between two escapes).
    fn body(
        &self,
        request: &ModelRequest<'_>,
        stream: bool,
        shape: Self::Shape,
    ) -> Result<Bytes, ModelError> {
        let _ = shape;
        self.check(request)?;
        let mut body = Vec::new();
        crate::providers::json_write::write_value(&mut body, &self.request_json(request, stream));
        Ok(body.into())
    }

    /// How requests (streamed or not) are written to this server now, after what it refused.
    /// The default: as to a server that has refused nothing.
    fn shape(&self, stream: bool) -> Self::Shape {
        let _ = stream;
        Self::Shape::default()
    }

    /// When `error` is the server refusing a field of a request written in `shape`, remembers
    /// it and gives the shape to send the request in again. The default: nothing is learned.
    fn learn(
        &self,
        request: &ModelRequest<'_>,
        shape: Self::Shape,
        stream: bool,
        error: &ModelError,
    ) -> Option<Self::Shape> {
        let _ = (request, shape, stream, error);
        None
    }

    /// Whether a streamed request in `shape` holds something the server could refuse with its
    /// stream's first event (or an empty stream), rather than with an error status: its first
    /// event is then read before the stream is handed on. The default: no.
    fn may_be_refused(&self, request: &ModelRequest<'_>, shape: Self::Shape) -> bool {
        let _ = (request, shape);
        false
    }

    /// A complete response to `request` as the caller gets it. The default: as decoded.
    fn finish(&self, request: &ModelRequest<'_>, response: ModelResponse) -> ModelResponse {
        let _ = request;
        response
    }

    /// What makes the decoders of the stream of `request` (one for each time the stream is
    /// opened). The default: [`HttpAdapter::stream_decoder`] of a 200.
    fn decoders(
        &self,
        request: &ModelRequest<'_>,
    ) -> impl Fn() -> Self::StreamDecoder + Send + Sync + 'static {
        let _ = request;
        || Self::stream_decoder(200)
    }

    /// What an error body means (a non-2xx status).
    const PARSE_ERROR: ErrorParser;

    /// Decodes a complete (not streamed) response body.
    fn decode(body: &[u8]) -> Result<ModelResponse, ModelError>;

    /// A complete response body decoded as far as it goes, with the error that stopped it (the
    /// conformance tests' recorded bodies). By default: all of it, or nothing and the error.
    #[cfg(any(test, feature = "testing"))]
    fn decode_partial(body: &[u8]) -> Partial {
        whole(Self::decode(body))
    }

    /// A decoder for a streamed response that came with `status`.
    fn stream_decoder(status: u16) -> Self::StreamDecoder;

    /// What the API's errors mean for the run (see [`ErrorMeaning`]).
    const ERRORS: ErrorMeaning;

    /// Reads what an error means for the run: a refusal for the context's size becomes
    /// [`ModelError::ContextOverflow`], say ([`ErrorMeaning::classify`] of
    /// [`HttpAdapter::ERRORS`]).
    fn classify(error: ModelError) -> ModelError {
        Self::ERRORS.classify(error)
    }

    /// What the API does with the context itself (see [`Model::native_context`]). The
    /// default: nothing.
    fn native_context(&self) -> crate::context::NativeSupport {
        crate::context::NativeSupport::default()
    }

    /// Where the adapter remembers that its server refused the context management a request
    /// asked of it (see [`ContextRefusal`]); `None` (the default) for an API that has none.
    fn context_refusal(&self) -> Option<&ContextRefusal> {
        None
    }

    /// The model for one run (see [`Model::session`]), when the adapter keeps state between a
    /// run's requests. The default: `None`, the model itself.
    #[cfg(feature = "http")]
    fn session(&self) -> Option<Box<dyn Model + '_>> {
        None
    }
}

#[cfg(feature = "http")]
#[async_trait]
impl<A: HttpAdapter> Model for A {
    fn name(&self) -> &str {
        self.model()
    }

    /// A request asking for context management that the server refuses is sent again
    /// without it (see `ContextRefusal`). Not an `async fn`: the call's future is the adapter's
    /// own, boxed once (see [`complete`]).
    fn complete<'s, 'r, 'm, 'f>(
        &'s self,
        request: &'r ModelRequest<'m>,
    ) -> BoxFuture<'f, Result<ModelResponse, ModelError>>
    where
        's: 'f,
        'r: 'f,
        'm: 'f,
        Self: 'f,
    {
        complete(self, request)
    }

    /// As [`Model::complete`], the refusal coming as the stream's opening error.
    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        stream(self, request).await
    }

    fn session(&self) -> Box<dyn Model + '_> {
        HttpAdapter::session(self).unwrap_or_else(|| crate::model::forward(self))
    }

    /// What the API does with the context itself, unless the server refused it.
    fn native_context(&self) -> crate::context::NativeSupport {
        if self.context_refusal().is_some_and(ContextRefusal::refused) {
            return crate::context::NativeSupport::default();
        }
        HttpAdapter::native_context(self)
    }
}

/// [`Model::complete`] of adapter `this`, boxed: a request asking for context management that
/// the server refuses is sent again without it (see `ContextRefusal`). The box holds the call's
/// own future: without a refusal to heed, the one complete call, with no layer of its own
/// around it (every run waiting on its model polls each layer, and each costs a cold cache line
/// when the response comes). An adapter's session returns it as its own.
#[cfg(feature = "http")]
pub(crate) fn complete<'f, A: HttpAdapter>(
    this: &'f A,
    request: &'f ModelRequest<'_>,
) -> BoxFuture<'f, Result<ModelResponse, ModelError>> {
    match this.context_refusal() {
        None => made_in_box(|| complete_once(this, request)),
        Some(refusal) => Box::pin(complete_heeding(this, refusal, request)),
    }
}

/// The future `make` gives, made in its box: the box is there first, so the future can be
/// written straight into it, not made beside it and copied in (every byte of its size, most of
/// them not yet used), as `Box::pin(make())` does.
#[cfg(feature = "http")]
#[inline(always)]
fn made_in_box<'f, F: Future + Send + 'f>(make: impl FnOnce() -> F) -> BoxFuture<'f, F::Output> {
    let slot = Box::<F>::new_uninit();
    let made: Box<F> = Box::write(slot, make());
    Box::into_pin(made)
}

/// [`complete`] for an adapter that may be refused context management.
#[cfg(feature = "http")]
async fn complete_heeding<A: HttpAdapter>(
    this: &A,
    refusal: &ContextRefusal,
    request: &ModelRequest<'_>,
) -> Result<ModelResponse, ModelError> {
    if let Some(settings) = refusal.settings_without(request) {
        let request = ModelRequest {
            settings: &settings,
            ..*request
        };
        return complete_once(this, &request).await.map(mark_refused);
    }
    match complete_once(this, request).await {
        Err(e) => {
            let Some(settings) =
                refusal.learn(request, &e, this.url(request, false).as_str(), this.model())
            else {
                return Err(e);
            };
            let request = ModelRequest {
                settings: &settings,
                ..*request
            };
            complete_once(this, &request).await.map(mark_refused)
        }
        done => done,
    }
}

/// [`Model::stream`] of adapter `this`, as [`complete`], the refusal coming as the stream's
/// opening error.
#[cfg(feature = "http")]
pub(crate) async fn stream<A: HttpAdapter>(
    this: &A,
    request: &ModelRequest<'_>,
) -> Result<EventStream, ModelError> {
    let Some(refusal) = this.context_refusal() else {
        return stream_once(this, request).await;
    };
    let settings = match refusal.settings_without(request) {
        Some(settings) => settings,
        None => match stream_once(this, request).await {
            Err(e) => {
                match refusal.learn(request, &e, this.url(request, false).as_str(), this.model()) {
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
    let stream = stream_once(this, &request).await?;
    let head = futures::stream::once(async { Ok(refused_event()) });
    Ok(Box::pin(head.chain(stream)))
}

/// One complete call of `request`, written in the shape the server accepts: a field it refuses
/// is left out (or replaced) and the call made again.
#[cfg(feature = "http")]
async fn complete_once<A: HttpAdapter>(
    this: &A,
    request: &ModelRequest<'_>,
) -> Result<ModelResponse, ModelError> {
    let mut shape = this.shape(false);
    loop {
        let body = this.body(request, false, shape)?;
        let headers = this.headers(request)?;
        let sent = this
            .transport()
            .post_json(
                &this.url(request, false),
                &headers,
                body,
                A::PARSE_ERROR,
                A::decode,
            )
            .await
            .map_err(A::classify);
        match sent {
            Err(e) => match this.learn(request, shape, false, &e) {
                Some(next) => shape = next,
                None => return Err(e),
            },
            Ok(response) => return Ok(this.finish(request, response)),
        }
    }
}

/// One streamed call of `request`, written in the shape the server accepts. A refusal may come
/// as the stream's opening error, as its first event, or as an empty stream.
#[cfg(feature = "http")]
async fn stream_once<A: HttpAdapter>(
    this: &A,
    request: &ModelRequest<'_>,
) -> Result<EventStream, ModelError> {
    let mut shape = this.shape(true);
    loop {
        let body = this.body(request, true, shape)?;
        let error = match open_stream(this, request, body).await {
            Ok(stream) if !this.may_be_refused(request, shape) => return Ok(stream),
            Ok(mut stream) => match stream.next().await {
                Some(Err(e)) => e,
                Some(first) => {
                    return Ok(Box::pin(futures::stream::iter([first]).chain(stream)));
                }
                None => return Ok(Box::pin(futures::stream::empty())),
            },
            Err(e) => e,
        };
        match this.learn(request, shape, true, &error) {
            Some(next) => shape = next,
            None => return Err(error),
        }
    }
}

/// Opens the stream of `request` with this body.
#[cfg(feature = "http")]
async fn open_stream<A: HttpAdapter>(
    this: &A,
    request: &ModelRequest<'_>,
    body: Bytes,
) -> Result<EventStream, ModelError> {
    open_sse_stream(
        this.transport(),
        this.stream_target(request)?,
        body,
        A::PARSE_ERROR,
        this.decoders(request),
        A::classify,
    )
    .await
    .map_err(A::classify)
}

/// Decodes a recorded response body as adapter `A` would: `status` is the HTTP status, `stream`
/// whether the body is an SSE stream. Used by the conformance tests.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn decode_recorded_by<A: HttpAdapter>(
    status: u16,
    body: &[u8],
    stream: bool,
) -> Decoded {
    plumbing::decode_recorded(
        status,
        body,
        stream,
        A::PARSE_ERROR,
        A::stream_decoder(status),
        A::decode_partial,
    )
}

/// What an adapter's configuration reads from the environment (`from_env`, `from_vars`): the
/// server's base URL and the API key, each the first of its variables that is set and not
/// blank, trimmed.
#[derive(Debug, Default)]
pub(crate) struct Vars {
    /// The base URL, when one of its variables is set.
    pub(crate) base_url: Option<String>,
    /// The API key, when one of its variables is set.
    pub(crate) api_key: Option<String>,
}

impl Vars {
    /// Reads the variables named, in order, through `lookup`.
    pub(crate) fn read(
        lookup: impl Fn(&str) -> Option<String>,
        base_url_vars: &[&str],
        key_vars: &[&str],
    ) -> Vars {
        let first = |names: &[&str]| {
            names
                .iter()
                .find_map(|name| lookup(name).filter(|v| !v.trim().is_empty()))
                .map(|v| v.trim().to_string())
        };
        Vars {
            base_url: first(base_url_vars),
            api_key: first(key_vars),
        }
    }
}

impl Vars {
    /// The base URL (`default` when no variable sets one) and the key; a missing key is refused
    /// with `missing` when the base URL is `default` (the provider's own API, which needs one).
    pub(crate) fn base_url_and_key(
        self,
        default: &str,
        missing: &str,
    ) -> Result<(String, Option<String>), ModelError> {
        let base_url = self.base_url.unwrap_or_else(|| default.to_string());
        if self.api_key.is_none() && base_url.trim_end_matches('/') == default {
            return Err(ModelError::Config(missing.to_string()));
        }
        Ok((base_url, self.api_key))
    }
}

/// Refuses a blank model name, saying how one is written: `{prefix}:<model>`, e.g.
/// `{prefix}:{example}` (`api` names the adapter).
pub(crate) fn require_model(
    model: &str,
    api: &str,
    prefix: &str,
    example: &str,
) -> Result<(), ModelError> {
    if model.trim().is_empty() {
        return Err(ModelError::Config(format!(
            "no {api} model given: expected `{prefix}:<model>`, e.g. `{prefix}:{example}`"
        )));
    }
    Ok(())
}

/// Adds the header that carries the API key, `name: {scheme}{key}` (the key trimmed), marked
/// sensitive so that it is never logged; nothing without a key. A key that cannot be sent in a
/// header is refused without showing it.
pub(crate) fn insert_key(
    headers: &mut HeaderMap,
    name: http::header::HeaderName,
    scheme: &str,
    key: Option<&str>,
) -> Result<(), ModelError> {
    let Some(key) = key else {
        return Ok(());
    };
    let mut value = http::header::HeaderValue::from_str(&format!("{scheme}{}", key.trim()))
        .map_err(|_| {
            ModelError::Config(
                "the API key holds characters that cannot be sent in an HTTP header (control \
                 characters or non-ASCII)"
                    .into(),
            )
        })?;
    value.set_sensitive(true);
    headers.insert(name, value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Vars;

    /// The adapters that write their body from their JSON value write serde_json's bytes.
    #[test]
    fn a_body_written_from_its_value_is_serde_json_text() {
        use super::HttpAdapter;
        use crate::message::{AssistantMessage, Message, ToolCall, ToolResult};
        use crate::model::{ModelRequest, ModelSettings, ToolSpec};
        use crate::providers::{anthropic, gemini, openai_responses};
        use serde_json::json;

        let odd = "a \"quote\", a \\ backslash, \u{1} \n \u{7f} \u{2028}\u{2029} é€😀 </script>";
        let messages = [
            Message::system(odd),
            Message::user(odd),
            Message::Assistant(AssistantMessage {
                text: Some(odd.into()),
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "read".into(),
                    arguments: json!({"path": odd, "n": [1, -2, 0.5, null, true]}),
                    invalid_arguments: None,
                    provider_data: None,
                }],
                parts: Vec::new(),
            }),
            Message::Tool(ToolResult {
                call_id: "call_1".into(),
                name: "read".into(),
                content: odd.into(),
                is_error: false,
                images: Vec::new(),
            }),
        ];
        let tools = [ToolSpec {
            name: "read".into(),
            description: odd.into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }];
        let settings = ModelSettings::default();
        let request = ModelRequest {
            messages: (&messages).into(),
            reminders: &[],
            tools: &tools,
            settings: &settings,
        };
        fn check<A: HttpAdapter>(adapter: &A, request: &ModelRequest<'_>) {
            for stream in [false, true] {
                let body = adapter.body(request, stream, A::Shape::default()).unwrap();
                let text = adapter.request_json(request, stream).to_string();
                assert_eq!(&body[..], text.as_bytes(), "{}", A::API);
            }
        }
        let mut config = anthropic::AnthropicConfig::new("m");
        config.api_key = Some("k".into());
        check(&anthropic::AnthropicModel::new(config), &request);
        let mut config = gemini::GeminiConfig::new("m");
        config.api_key = Some("k".into());
        check(&gemini::GeminiModel::new(config), &request);
        let mut config = openai_responses::ResponsesConfig::new("m");
        config.api_key = Some("k".into());
        check(&openai_responses::ResponsesModel::new(config), &request);
    }

    #[test]
    fn each_setting_is_its_first_variable_set_and_not_blank_trimmed() {
        let env = |name: &str| match name {
            "A_URL" => Some("  ".to_string()),
            "B_URL" => Some(" http://127.0.0.1:9 ".to_string()),
            "A_KEY" => Some("k1\n".to_string()),
            "B_KEY" => Some("k2".to_string()),
            _ => None,
        };
        let vars = Vars::read(env, &["A_URL", "B_URL"], &["A_KEY", "B_KEY"]);
        assert_eq!(vars.base_url.as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(vars.api_key.as_deref(), Some("k1"));
        let none = Vars::read(|_| None, &["A_URL"], &["A_KEY"]);
        assert!(none.base_url.is_none() && none.api_key.is_none());
    }

    /// The provider's own API needs a key; another server (a local one) may need none.
    #[test]
    fn a_key_is_required_for_the_default_server_only() {
        let read = |url: Option<&str>, key: Option<&str>| {
            let env = |name: &str| match name {
                "URL" => url.map(str::to_string),
                "KEY" => key.map(str::to_string),
                _ => None,
            };
            Vars::read(env, &["URL"], &["KEY"]).base_url_and_key("https://api.test", "no KEY")
        };
        let e = read(None, None).unwrap_err();
        assert!(e.to_string().contains("no KEY"), "{e}");
        assert!(read(Some("https://api.test/"), None).is_err());
        assert_eq!(
            read(None, Some("k")).unwrap(),
            ("https://api.test".to_string(), Some("k".to_string()))
        );
        assert_eq!(
            read(Some("http://127.0.0.1:9"), None).unwrap(),
            ("http://127.0.0.1:9".to_string(), None)
        );
    }

    /// The key's header is sensitive; a key that cannot be a header value is refused without
    /// being shown.
    #[test]
    fn the_key_header_is_sensitive_and_never_shown() {
        let mut headers = http::header::HeaderMap::new();
        let name = http::header::AUTHORIZATION;
        super::insert_key(&mut headers, name.clone(), "Bearer ", Some(" sk-1 ")).unwrap();
        assert_eq!(headers[&name], "Bearer sk-1");
        assert!(headers[&name].is_sensitive());
        let e = super::insert_key(&mut headers, name, "", Some("sk-\n2")).unwrap_err();
        assert!(!e.to_string().contains("sk-"), "{e}");
        let mut none = http::header::HeaderMap::new();
        super::insert_key(&mut none, http::header::AUTHORIZATION, "Bearer ", None).unwrap();
        assert!(none.is_empty());
    }
}
