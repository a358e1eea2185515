//! The four HTTP adapters without a transport: what a call of a request is (URL, headers, body),
//! and what a response means (a complete body, or a streamed one fed as it arrives). A program
//! that makes HTTP calls its own way (a browser's `fetch`, through `toolloop-wasm`) gets the same
//! encoding and decoding as the adapters' own [`crate::Model`] implementations, which are these
//! plus the transport of [`crate::transport::http`] (retries, timeouts, limits).
//!
//! ```
//! use toolloop::message::Message;
//! use toolloop::model::{ModelRequest, ModelSettings};
//! use toolloop::providers::openai::OpenAiConfig;
//! use toolloop::providers::wire::WireAdapter;
//!
//! let adapter = WireAdapter::from(OpenAiConfig::new("gpt-4o-mini"));
//! let messages = [Message::user("hi")];
//! let settings = ModelSettings::default();
//! let request = ModelRequest { messages: (&messages).into(), reminders: &[], tools: &[], settings: &settings };
//! let call = adapter.call(&request, false).unwrap();
//! assert!(call.url.ends_with("/chat/completions"));
//! let body = br#"{"choices":[{"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}]}"#;
//! let response = adapter.response(&request, &call, 200, &Default::default(), body).unwrap();
//! assert_eq!(response.text.as_deref(), Some("hello"));
//! ```

use crate::model::{ModelError, ModelRequest, ModelResponse};
use crate::providers::adapter::{HttpAdapter, ReadSse, SseReader};
use crate::providers::anthropic::{AnthropicConfig, AnthropicModel};
use crate::providers::gemini::{GeminiConfig, GeminiModel};
use crate::providers::openai::{OpenAiConfig, OpenAiModel};
use crate::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use crate::redact::Redactor;
use crate::stream::StreamEvent;
use crate::transport::wire::{ErrorParser, rejects_request, retry_after};
use bytes::Bytes;
use http::header::HeaderMap;

/// One of the four HTTP adapters, for a transport of the caller's.
#[derive(Debug, Clone)]
pub struct WireAdapter {
    api: Api,
}

#[derive(Debug, Clone)]
enum Api {
    OpenAi(OpenAiModel),
    Responses(ResponsesModel),
    Anthropic(AnthropicModel),
    Gemini(GeminiModel),
}

/// One call to make: where, with which headers, with which body (always a `POST`).
#[derive(Debug, Clone)]
pub struct WireCall {
    /// The URL.
    pub url: String,
    /// The headers; the key is among them, marked sensitive.
    pub headers: HeaderMap,
    /// The JSON body.
    pub body: Bytes,
}

impl WireCall {
    /// What hides this call's secrets (its key, the credentials in its URL) in a text.
    pub fn redactor(&self) -> Redactor {
        Redactor::for_request(&self.url, &self.headers)
    }
}

impl From<OpenAiConfig> for WireAdapter {
    fn from(config: OpenAiConfig) -> Self {
        WireAdapter {
            api: Api::OpenAi(OpenAiModel::new(config)),
        }
    }
}

impl From<ResponsesConfig> for WireAdapter {
    fn from(config: ResponsesConfig) -> Self {
        WireAdapter {
            api: Api::Responses(ResponsesModel::new(config)),
        }
    }
}

impl From<AnthropicConfig> for WireAdapter {
    fn from(config: AnthropicConfig) -> Self {
        WireAdapter {
            api: Api::Anthropic(AnthropicModel::new(config)),
        }
    }
}

impl From<GeminiConfig> for WireAdapter {
    fn from(config: GeminiConfig) -> Self {
        WireAdapter {
            api: Api::Gemini(GeminiModel::new(config)),
        }
    }
}

/// The call of `request` by adapter `a`, written as the adapter writes it now.
fn call_of<A: HttpAdapter>(
    a: &A,
    request: &ModelRequest<'_>,
    stream: bool,
) -> Result<WireCall, ModelError> {
    Ok(WireCall {
        url: a.url(request, stream).as_str().to_string(),
        headers: a.headers(request)?.into_owned(),
        body: a.body(request, stream, a.shape(stream))?,
    })
}

/// A complete 2xx body, as adapter `a` reads it for `request`.
fn decode_by<A: HttpAdapter>(
    a: &A,
    request: &ModelRequest<'_>,
    body: &[u8],
) -> Result<ModelResponse, ModelError> {
    A::decode(body)
        .map(|r| a.finish(request, r))
        .map_err(A::classify)
}

/// What a non-2xx reply means to adapter `A`: its parser and its classification.
fn errors_of<A: HttpAdapter>(_: &A) -> (ErrorParser, fn(ModelError) -> ModelError) {
    (A::PARSE_ERROR, A::classify)
}

/// The stream reader of adapter `a` for `request`.
fn reader_of<A: HttpAdapter>(
    a: &A,
    request: &ModelRequest<'_>,
) -> (Box<dyn ReadSse>, fn(ModelError) -> ModelError) {
    let make = a.decoders(request);
    (Box::new(SseReader::new(make())), A::classify)
}

/// Runs `$f` on the adapter, whichever it is.
macro_rules! each {
    ($api:expr, $a:ident => $f:expr) => {
        match $api {
            Api::OpenAi($a) => $f,
            Api::Responses($a) => $f,
            Api::Anthropic($a) => $f,
            Api::Gemini($a) => $f,
        }
    };
}

impl WireAdapter {
    /// The model's name.
    pub fn model(&self) -> &str {
        each!(&self.api, a => HttpAdapter::model(a))
    }

    /// The call that sends `request`, streamed or not, after the checks the adapter makes
    /// before every call (a key that cannot be sent in a header, `extra` fields that collide
    /// with the adapter's own).
    pub fn call(&self, request: &ModelRequest<'_>, stream: bool) -> Result<WireCall, ModelError> {
        each!(&self.api, a => call_of(a, request, stream))
    }

    /// What the server's reply to `call` means: a 2xx body decoded as a complete response, any
    /// other status the error its body describes (never holding the call's secrets).
    pub fn response(
        &self,
        request: &ModelRequest<'_>,
        call: &WireCall,
        status: u16,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<ModelResponse, ModelError> {
        let redactor = call.redactor();
        if !(200..300).contains(&status) {
            return Err(self.error(&redactor, status, headers, body));
        }
        each!(&self.api, a => decode_by(a, request, body)).map_err(|e| redactor.redact_error(e))
    }

    /// The error a non-2xx reply means, as the adapter's transport reports it.
    pub fn error(
        &self,
        redactor: &Redactor,
        status: u16,
        headers: &HeaderMap,
        body: &[u8],
    ) -> ModelError {
        let body = redactor.redact_bytes(body);
        let (parse, classify) = each!(&self.api, a => errors_of(a));
        let mut err = parse(status, headers, &body);
        if err.retry_after.is_none() {
            err.retry_after = retry_after(headers);
        }
        if rejects_request(status, &body) {
            err.retryable = false;
        }
        classify(ModelError::Api(redactor.redact_api_error(err)))
    }

    /// A reader of the streamed (Server-Sent Events) 2xx reply to `call`, which was made for
    /// `request` with `stream` set.
    pub fn stream_reader(&self, request: &ModelRequest<'_>, call: &WireCall) -> StreamReader {
        let (reader, classify) = each!(&self.api, a => reader_of(a, request));
        StreamReader {
            reader,
            classify,
            redactor: call.redactor(),
            ended: false,
        }
    }
}

/// A streamed reply being read: give it the body's bytes as they arrive
/// ([`StreamReader::push`]), then say the body ended ([`StreamReader::finish`]). The events it
/// gives make the response ([`crate::stream::Accumulator`]).
pub struct StreamReader {
    reader: Box<dyn ReadSse>,
    classify: fn(ModelError) -> ModelError,
    redactor: Redactor,
    ended: bool,
}

impl std::fmt::Debug for StreamReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamReader")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl StreamReader {
    /// Adds bytes of the body: the events they complete go to `out`, also when an error
    /// follows them. After an error the stream is over: nothing more is read.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if self.ended {
            return Ok(());
        }
        let r = self.reader.push(bytes, out);
        if r.is_err() || self.reader.done() {
            self.ended = true;
        }
        r.map_err(|e| self.redactor.redact_error((self.classify)(e)))
    }

    /// The body ended: the closing events go to `out`, or the error says why the response is
    /// incomplete.
    pub fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if std::mem::replace(&mut self.ended, true) {
            return Ok(());
        }
        self.reader
            .finish(out)
            .map_err(|e| self.redactor.redact_error((self.classify)(e)))
    }

    /// Whether the response is complete (the rest of the body need not be read).
    pub fn done(&self) -> bool {
        self.ended
    }
}
