//! Google Gemini API, natively: `models/{model}:generateContent` and
//! `models/{model}:streamGenerateContent?alt=sse`.
//!
//! How the message model maps to the wire:
//!
//! - Leading system messages become `systemInstruction`; a later one becomes a user text part
//!   wrapped in `<system-reminder>` tags where it stood.
//! - The tool catalog is one `tools[{functionDeclarations}]` entry; each schema is sent whole as
//!   `parametersJsonSchema` (full JSON Schema).
//! - An assistant turn (`role: "model"`) is sent as its Gemini [`ProviderPart`]s (thought parts,
//!   code parts…, exactly as received), then its text, then one `functionCall` part per call.
//!   Thought signatures go back unchanged: a call's signature is kept in its `provider_data` as
//!   `{"gemini": {"thoughtSignature": "…"}}`, and a signature that came on a text part is kept as
//!   a part `{"thoughtSignature": "…"}` and put back on the text part.
//! - Gemini gives calls no ids (unless it sends `functionCall.id`), so the adapter makes them up.
//!   Tool results go back as `functionResponse` parts carrying the call's name (and the wire id
//!   when there was one), all of a round in one user turn, in call order; the response object is
//!   `{"output": …}` or, for a failed call, `{"error": …}`.
//! - Consecutive turns with the same role are merged; reminders are trailing text parts of the
//!   last user turn.
//!
//! `finishReason` `MALFORMED_FUNCTION_CALL` (and `UNEXPECTED_TOOL_CALL`) give
//! [`FinishReason::MalformedToolCall`] with [`ModelResponse::malformed_call`] explaining what the
//! model must do instead. Errors come from the `{"error": {code, message, status, details}}`
//! body; a `google.rpc.RetryInfo` detail's `retryDelay` becomes the wait before a retry.

use crate::http::{HttpTransport, retryable_status};
use crate::message::{AssistantMessage, Message, ProviderPart, new_call_id};
use crate::model::{
    ApiError, EventStream, FinishReason, Model, ModelError, ModelRequest, ModelResponse, ToolChoice,
};
use crate::providers::Decoded;
use crate::providers::wire::{self, Partial, SseDecode, json_number, merge_extras, snippet};
use crate::sse::SseEvent;
use crate::stream::StreamEvent;
use crate::usage::Usage;
use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use std::time::Duration;

/// The provider name on [`ProviderPart`]s and in `provider_data` this adapter produces.
pub const PROVIDER: &str = "gemini";
/// The default API address.
pub const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com";
/// The API version path used when the base URL names none.
pub const API_VERSION: &str = "v1beta";

/// How to reach the Gemini API.
#[derive(Debug, Clone)]
pub struct GeminiConfig {
    /// The model id (`gemini-2.5-flash`, …), with or without a `models/` prefix.
    pub model: String,
    /// The API address (default [`DEFAULT_BASE_URL`], env `GEMINI_BASE_URL` or
    /// `GOOGLE_GEMINI_BASE_URL`). `/v1beta` is added unless the address ends with a version.
    pub base_url: String,
    /// The API key, sent as `x-goog-api-key` (env `GEMINI_API_KEY`, else `GOOGLE_API_KEY`).
    pub api_key: Option<String>,
    /// Extra request fields, merged (deeply) into every request body before the settings' own
    /// `extra` (`{"generationConfig": {"thinkingConfig": {"thinkingBudget": 1024}}}`).
    pub extra: Option<Value>,
    /// The HTTP transport (retries, limits).
    pub transport: HttpTransport,
}

impl GeminiConfig {
    /// A configuration with the defaults and no key.
    pub fn new(model: impl Into<String>) -> Self {
        GeminiConfig {
            model: model.into(),
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key: None,
            extra: None,
            transport: HttpTransport::new(),
        }
    }

    /// A configuration from the environment (see the fields). The key is required unless a base
    /// URL other than the official API is given.
    pub fn from_env(model: impl Into<String>) -> Result<Self, ModelError> {
        Self::from_vars(model, |name| std::env::var(name).ok())
    }

    /// Like [`GeminiConfig::from_env`], reading variables through `var`.
    pub fn from_vars(
        model: impl Into<String>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ModelError> {
        let mut config = GeminiConfig::new(model);
        if config.model.trim().is_empty() {
            return Err(ModelError::Config(
                "no Gemini model given: expected `gemini:<model>`, e.g. `gemini:gemini-2.5-flash`"
                    .into(),
            ));
        }
        let nonempty = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if let Some(url) =
            nonempty("GEMINI_BASE_URL").or_else(|| nonempty("GOOGLE_GEMINI_BASE_URL"))
        {
            config.base_url = url.trim().to_string();
        }
        config.api_key = nonempty("GEMINI_API_KEY").or_else(|| nonempty("GOOGLE_API_KEY"));
        if config.api_key.is_none() && config.base_url.trim_end_matches('/') == DEFAULT_BASE_URL {
            return Err(ModelError::Config(
                "neither GEMINI_API_KEY nor GOOGLE_API_KEY is set: the Gemini API needs a key \
                 (or set GEMINI_BASE_URL to a server that needs none)"
                    .into(),
            ));
        }
        Ok(config)
    }

    fn model_url(&self, model: &str) -> String {
        let base = self.base_url.trim_end_matches('/');
        let versioned = base
            .rsplit('/')
            .next()
            .is_some_and(|last| last.starts_with("v1"));
        let model = model.strip_prefix("models/").unwrap_or(model);
        if versioned {
            format!("{base}/models/{model}")
        } else {
            format!("{base}/{API_VERSION}/models/{model}")
        }
    }

    /// The `generateContent` endpoint for `model`.
    pub fn generate_url(&self, model: &str) -> String {
        format!("{}:generateContent", self.model_url(model))
    }

    /// The streaming endpoint for `model` (`streamGenerateContent?alt=sse`).
    pub fn stream_url(&self, model: &str) -> String {
        format!("{}:streamGenerateContent?alt=sse", self.model_url(model))
    }

    /// The request headers: `x-goog-api-key` when there is a key.
    pub fn headers(&self) -> Result<HeaderMap, ModelError> {
        let mut headers = HeaderMap::new();
        if let Some(key) = &self.api_key {
            let mut v = HeaderValue::from_str(key.trim()).map_err(|_| {
                ModelError::Config(
                    "the Gemini API key contains characters not allowed in an HTTP header".into(),
                )
            })?;
            v.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-goog-api-key"), v);
        }
        Ok(headers)
    }
}

/// The top-level request fields this adapter writes itself: the system instruction, the conversation (`contents`) and the tool catalog and configuration, in either spelling the API accepts (the model and the streaming mode are in the URL). An `extra` (the
/// adapter's or the settings') that sets one is refused with [`ModelError::Config`], by
/// [`GeminiConfig::validate`] and by every call.
pub const OWNED_FIELDS: &[&str] = &[
    "contents",
    "systemInstruction",
    "system_instruction",
    "tools",
    "toolConfig",
    "tool_config",
];

impl GeminiConfig {
    /// Checks the configuration without sending anything: the base URL (see
    /// [`crate::providers::check_base_url`]) and `extra` (none of the [`OWNED_FIELDS`]).
    pub fn validate(&self) -> Result<(), ModelError> {
        wire::validate_config("Gemini", &self.base_url, self.extra.as_ref(), OWNED_FIELDS)
    }
}

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
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        wire::check_extras(
            "Gemini",
            self.config.extra.as_ref(),
            Some(request),
            OWNED_FIELDS,
        )?;
        let body = build_request_body(request, &self.config, true).to_string();
        wire::open_sse_stream(
            &self.config.transport,
            self.config.stream_url(self.model_for(request)).into(),
            self.config.headers()?,
            body.into(),
            parse_error,
            ChunkDecoder::default,
        )
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// Request building
// ---------------------------------------------------------------------------------------------

/// A call of a model turn: our id, its name, and the id Gemini gave it, if any.
struct CallRef {
    id: String,
    name: String,
    wire_id: Option<String>,
}

#[derive(Default)]
struct Turn {
    role: &'static str,
    parts: Vec<Value>,
    calls: Vec<CallRef>,
    /// (call id, is_error, content) of tool results, placed when the turns are complete.
    results: Vec<(String, bool, String)>,
}

fn push(turns: &mut Vec<Turn>, turn: Turn) {
    if turn.parts.is_empty() && turn.calls.is_empty() && turn.results.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == turn.role => {
            last.parts.extend(turn.parts);
            last.calls.extend(turn.calls);
            last.results.extend(turn.results);
        }
        _ => turns.push(turn),
    }
}

fn user_text(text: String) -> Turn {
    Turn {
        role: "user",
        parts: vec![json!({"text": text})],
        ..Turn::default()
    }
}

/// A text-part signature is stored as a part holding nothing but `thoughtSignature`.
fn text_signature(part: &ProviderPart) -> Option<&Value> {
    match &part.data {
        Value::Object(m) if m.len() == 1 => m.get("thoughtSignature"),
        _ => None,
    }
}

fn model_turn(a: &AssistantMessage) -> Turn {
    let mut parts = Vec::new();
    let mut signature = None;
    for part in a.parts.iter().filter(|p| p.provider == PROVIDER) {
        match text_signature(part) {
            Some(sig) => {
                signature.get_or_insert(sig.clone());
            }
            None => parts.push(part.data.clone()),
        }
    }
    match a.text.as_deref().filter(|t| !t.is_empty()) {
        Some(text) => {
            let mut part = json!({"text": text});
            if let Some(sig) = signature {
                part["thoughtSignature"] = sig;
            }
            parts.push(part);
        }
        // A signature that came on an empty text part goes back the same way.
        None if a.tool_calls.is_empty() => {
            if let Some(sig) = signature {
                parts.push(json!({"text": "", "thoughtSignature": sig}));
            }
        }
        None => {}
    }
    let mut calls = Vec::new();
    for call in &a.tool_calls {
        let data = call.provider_data.as_ref().map(|d| &d[PROVIDER]);
        let wire_id = data.and_then(|d| d["id"].as_str()).map(str::to_string);
        let args = match &call.arguments {
            Value::Object(_) => call.arguments.clone(),
            _ => json!({}),
        };
        let mut fc = json!({"name": call.name, "args": args});
        if let Some(id) = &wire_id {
            fc["id"] = json!(id);
        }
        let mut part = json!({"functionCall": fc});
        if let Some(sig) = data.and_then(|d| d.get("thoughtSignature")) {
            part["thoughtSignature"] = sig.clone();
        }
        parts.push(part);
        calls.push(CallRef {
            id: call.id.clone(),
            name: call.name.clone(),
            wire_id,
        });
    }
    Turn {
        role: "model",
        parts,
        calls,
        results: Vec::new(),
    }
}

fn response_object(content: &str, is_error: bool) -> Value {
    let value = serde_json::from_str::<Value>(content.trim())
        .unwrap_or_else(|_| Value::String(content.to_string()));
    if is_error {
        json!({"error": value})
    } else {
        json!({"output": value})
    }
}

/// Puts each user turn's function responses first, one per call of the previous model turn, in
/// call order; a call with no result gets an error response, a result that answers no call
/// becomes text.
fn place_results(turns: &mut [Turn]) {
    for i in 0..turns.len() {
        if turns[i].role != "user" {
            continue;
        }
        let calls: Vec<(String, String, Option<String>)> = match i.checked_sub(1) {
            Some(j) if turns[j].role == "model" => turns[j]
                .calls
                .iter()
                .map(|c| (c.id.clone(), c.name.clone(), c.wire_id.clone()))
                .collect(),
            _ => Vec::new(),
        };
        let mut results = std::mem::take(&mut turns[i].results);
        if results.is_empty() && calls.is_empty() {
            continue;
        }
        let mut placed = Vec::with_capacity(calls.len() + turns[i].parts.len());
        for (id, name, wire_id) in calls {
            let response = match results.iter().position(|r| r.0 == id) {
                Some(pos) => {
                    let (_, is_error, content) = results.remove(pos);
                    response_object(&content, is_error)
                }
                None => {
                    json!({"error": "No result was recorded for this call; it was not executed."})
                }
            };
            let mut fr = json!({"name": name, "response": response});
            if let Some(wire_id) = wire_id {
                fr["id"] = json!(wire_id);
            }
            placed.push(json!({"functionResponse": fr}));
        }
        for (id, _, content) in results {
            placed.push(json!({
                "text": format!("Result of tool call {id} (no matching call in the previous turn): {content}")
            }));
        }
        placed.append(&mut turns[i].parts);
        turns[i].parts = placed;
    }
}

/// The `generateContent` request body for `req` (the same for the streaming endpoint).
pub fn build_request_body(req: &ModelRequest<'_>, config: &GeminiConfig, stream: bool) -> Value {
    let _ = stream; // streaming is chosen by the endpoint, not the body
    let mut system: Vec<Value> = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    let mut leading = true;
    for message in req.messages {
        match message {
            Message::System { content } if leading => {
                if !content.trim().is_empty() {
                    system.push(json!({"text": content}));
                }
            }
            Message::System { content } => {
                if !content.trim().is_empty() {
                    push(
                        &mut turns,
                        user_text(format!("<system-reminder>{content}</system-reminder>")),
                    );
                }
            }
            Message::User { content } => {
                leading = false;
                if !content.is_empty() {
                    push(&mut turns, user_text(content.clone()));
                }
            }
            Message::Assistant(a) => {
                leading = false;
                push(&mut turns, model_turn(a));
            }
            Message::Tool(r) => {
                leading = false;
                push(
                    &mut turns,
                    Turn {
                        role: "user",
                        results: vec![(r.call_id.clone(), r.is_error, r.content.clone())],
                        ..Turn::default()
                    },
                );
            }
        }
    }
    place_results(&mut turns);
    let reminders: Vec<Value> = req
        .wrapped_reminders()
        .map(|r| json!({"text": r}))
        .collect();
    if !reminders.is_empty() {
        match turns.last_mut() {
            Some(last) if last.role == "user" => last.parts.extend(reminders),
            _ => turns.push(Turn {
                role: "user",
                parts: reminders,
                ..Turn::default()
            }),
        }
    }

    let mut body = Map::new();
    if !system.is_empty() {
        body.insert("systemInstruction".into(), json!({"parts": system}));
    }
    let contents: Vec<Value> = turns
        .into_iter()
        .filter(|t| !t.parts.is_empty())
        .map(|t| json!({"role": t.role, "parts": t.parts}))
        .collect();
    body.insert("contents".into(), Value::Array(contents));
    if !req.tools.is_empty() {
        let declarations: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut d = json!({"name": t.name, "parametersJsonSchema": t.parameters});
                if !t.description.is_empty() {
                    d["description"] = json!(t.description);
                }
                d
            })
            .collect();
        body.insert(
            "tools".into(),
            json!([{"functionDeclarations": declarations}]),
        );
        let config = match &req.settings.tool_choice {
            ToolChoice::Auto => None,
            ToolChoice::None => Some(json!({"mode": "NONE"})),
            ToolChoice::Required => Some(json!({"mode": "ANY"})),
            ToolChoice::Tool(name) => Some(json!({"mode": "ANY", "allowedFunctionNames": [name]})),
        };
        if let Some(c) = config {
            body.insert("toolConfig".into(), json!({"functionCallingConfig": c}));
        }
    }
    let mut generation = Map::new();
    if let Some(t) = req.settings.temperature {
        generation.insert("temperature".into(), json_number(t));
    }
    if let Some(n) = req.settings.max_output_tokens {
        generation.insert("maxOutputTokens".into(), json!(n));
    }
    if !generation.is_empty() {
        body.insert("generationConfig".into(), Value::Object(generation));
    }
    let mut body = Value::Object(body);
    merge_extras(
        &mut body,
        [config.extra.as_ref(), req.settings.extra.as_ref()],
    );
    body
}

// ---------------------------------------------------------------------------------------------
// Response decoding
// ---------------------------------------------------------------------------------------------

/// Parses a `google.protobuf.Duration` as JSON gives it: `"12s"`, `"0.5s"`, or
/// `{"seconds": 12, "nanos": 0}`.
pub fn parse_duration(v: &Value) -> Option<Duration> {
    match v {
        Value::String(s) => s
            .trim()
            .strip_suffix('s')
            .and_then(|n| n.trim().parse::<f64>().ok())
            .filter(|n| n.is_finite() && *n >= 0.0)
            .map(Duration::from_secs_f64),
        Value::Object(m) => {
            let secs = m.get("seconds").and_then(|s| {
                s.as_u64()
                    .or_else(|| s.as_str().and_then(|t| t.parse().ok()))
            })?;
            let nanos = m.get("nanos").and_then(Value::as_u64).unwrap_or(0);
            Some(Duration::from_secs(secs) + Duration::from_nanos(nanos.min(999_999_999)))
        }
        _ => None,
    }
}

fn api_error(status: u16, error: &Value) -> ApiError {
    let retry_after = error["details"].as_array().and_then(|details| {
        details
            .iter()
            .filter(|d| {
                d["@type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("google.rpc.RetryInfo"))
            })
            .find_map(|d| parse_duration(&d["retryDelay"]))
    });
    let code = match &error["code"] {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    };
    let code_status = error["code"].as_u64().and_then(|c| u16::try_from(c).ok());
    ApiError {
        status,
        error_type: error["status"].as_str().map(str::to_string),
        code,
        message: error["message"]
            .as_str()
            .unwrap_or("the error body has no message")
            .to_string(),
        retryable: retryable_status(status) || code_status.is_some_and(retryable_status),
        retry_after,
    }
}

/// Turns a Gemini error response (`{"error": {code, message, status, details}}`, or a one-element
/// array of it) into an [`ApiError`]: `error_type` is the status name (`RESOURCE_EXHAUSTED`),
/// `code` the numeric code, and a `RetryInfo` detail's `retryDelay` the `retry_after`.
pub fn parse_error(status: u16, _headers: &HeaderMap, body: &[u8]) -> ApiError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| match v {
        Value::Array(items) => items.iter().find_map(|i| i.get("error")),
        other => other.get("error"),
    });
    match error.filter(|e| e.is_object()) {
        Some(e) => api_error(status, e),
        None => ApiError {
            status,
            error_type: None,
            code: None,
            message: if body.is_empty() {
                format!("HTTP {status} with an empty body")
            } else {
                format!("HTTP {status}: {}", snippet(body, 500))
            },
            retryable: retryable_status(status),
            retry_after: None,
        },
    }
}

/// The usage in `usageMetadata`, or `None` when it has neither a prompt nor an output count
/// (then the tokens are unknown, not zero; a count left out next to the other is zero, as
/// Gemini leaves zero counts out).
fn usage(meta: &Value) -> Option<Usage> {
    if meta.get("promptTokenCount").is_none() && meta.get("candidatesTokenCount").is_none() {
        return None;
    }
    let get = |k: &str| meta.get(k).and_then(Value::as_u64).unwrap_or(0);
    let thoughts = get("thoughtsTokenCount");
    Some(Usage {
        input_tokens: get("promptTokenCount") + get("toolUsePromptTokenCount"),
        output_tokens: get("candidatesTokenCount") + thoughts,
        cache_read_tokens: get("cachedContentTokenCount"),
        cache_write_tokens: 0,
        reasoning_tokens: thoughts,
    })
}

const MALFORMED_HELP: &str = "Call a function by emitting a function call with the exact name \
     of one of the declared functions and arguments as a JSON object matching that function's \
     parameter schema; do not write the call as code or as text.";

/// The finish reason, and the explanation for the model when its call was malformed.
fn finish(
    reason: Option<&str>,
    message: Option<&str>,
    has_calls: bool,
) -> (FinishReason, Option<String>) {
    let detail = message
        .filter(|m| !m.trim().is_empty())
        .map(|m| format!(": {}", m.trim()))
        .unwrap_or_default();
    match reason {
        Some("MAX_TOKENS") => (FinishReason::Length, None),
        Some(
            "SAFETY"
            | "RECITATION"
            | "BLOCKLIST"
            | "PROHIBITED_CONTENT"
            | "SPII"
            | "LANGUAGE"
            | "IMAGE_SAFETY"
            | "IMAGE_PROHIBITED_CONTENT"
            | "IMAGE_RECITATION",
        ) => (FinishReason::ContentFilter, None),
        Some("MALFORMED_FUNCTION_CALL") => (
            FinishReason::MalformedToolCall,
            Some(format!(
                "Your last function call could not be parsed (MALFORMED_FUNCTION_CALL{detail}). \
                 {MALFORMED_HELP}"
            )),
        ),
        Some("UNEXPECTED_TOOL_CALL") => (
            FinishReason::MalformedToolCall,
            Some(format!(
                "Your last function call named a function that is not declared for this request \
                 (UNEXPECTED_TOOL_CALL{detail}). {MALFORMED_HELP}"
            )),
        ),
        _ if has_calls => (FinishReason::ToolCalls, None),
        _ => (FinishReason::Stop, None),
    }
}

/// Turns `GenerateContentResponse` chunks (one for a complete response, many for a stream)
/// into [`StreamEvent`]s.
#[derive(Default)]
struct ChunkDecoder {
    calls: usize,
    finish_reason: Option<String>,
    finish_message: Option<String>,
    blocked: bool,
    seen_chunk: bool,
    /// Consecutive streamed thought fragments, joined into one part.
    thought: Option<Value>,
}

impl ChunkDecoder {
    fn flush_thought(&mut self, out: &mut Vec<StreamEvent>) {
        if let Some(data) = self.thought.take() {
            out.push(StreamEvent::Part(ProviderPart {
                provider: PROVIDER.into(),
                data,
            }));
        }
    }

    fn part(&mut self, part: &Value, out: &mut Vec<StreamEvent>) {
        let signature = part.get("thoughtSignature").cloned();
        if let Some(fc) = part.get("functionCall") {
            self.flush_thought(out);
            let index = self.calls;
            self.calls += 1;
            let wire_id = fc["id"].as_str().filter(|s| !s.is_empty());
            let id = wire_id.map_or_else(new_call_id, str::to_string);
            out.push(StreamEvent::ToolCallStart {
                index,
                id: Some(id),
                name: fc["name"].as_str().unwrap_or("").to_string(),
            });
            let args = match &fc["args"] {
                Value::Null => "{}".to_string(),
                v => v.to_string(),
            };
            out.push(StreamEvent::ToolCallDelta {
                index,
                arguments: args,
            });
            let mut data = Map::new();
            if let Some(sig) = signature {
                data.insert("thoughtSignature".into(), sig);
            }
            if let Some(id) = wire_id {
                data.insert("id".into(), json!(id));
            }
            if !data.is_empty() {
                out.push(StreamEvent::ToolCallData {
                    index,
                    data: json!({PROVIDER: data}),
                });
            }
            out.push(StreamEvent::ToolCallEnd { index });
            return;
        }
        let is_thought = part["thought"] == true;
        match part.get("text").and_then(Value::as_str) {
            Some(text) if is_thought => match &mut self.thought {
                Some(pending) if pending.get("thoughtSignature").is_none() => {
                    let joined = format!("{}{text}", pending["text"].as_str().unwrap_or(""));
                    pending["text"] = json!(joined);
                    if let Some(sig) = signature {
                        pending["thoughtSignature"] = sig;
                    }
                }
                _ => {
                    self.flush_thought(out);
                    self.thought = Some(part.clone());
                }
            },
            Some(text) => {
                self.flush_thought(out);
                if !text.is_empty() {
                    out.push(StreamEvent::TextDelta(text.to_string()));
                }
                if let Some(sig) = signature {
                    out.push(StreamEvent::Part(ProviderPart {
                        provider: PROVIDER.into(),
                        data: json!({"thoughtSignature": sig}),
                    }));
                }
            }
            None => {
                self.flush_thought(out);
                out.push(StreamEvent::Part(ProviderPart {
                    provider: PROVIDER.into(),
                    data: part.clone(),
                }));
            }
        }
    }

    /// Decodes one `GenerateContentResponse` chunk.
    fn chunk(&mut self, v: &Value, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if let Some(error) = v.get("error").filter(|e| e.is_object()) {
            return Err(ModelError::Api(api_error(200, error)));
        }
        self.seen_chunk = true;
        if v.pointer("/promptFeedback/blockReason").is_some() {
            self.blocked = true;
        }
        if let Some(candidate) = v["candidates"].as_array().and_then(|c| c.first()) {
            if let Some(parts) = candidate
                .pointer("/content/parts")
                .and_then(Value::as_array)
            {
                for part in parts {
                    self.part(part, out);
                }
            }
            if let Some(r) = candidate["finishReason"].as_str() {
                self.finish_reason = Some(r.to_string());
            }
            if let Some(m) = candidate["finishMessage"].as_str() {
                self.finish_message = Some(m.to_string());
            }
        }
        if let Some(meta) = v.get("usageMetadata").filter(|m| m.is_object()) {
            out.extend(usage(meta).map(StreamEvent::Usage));
        }
        Ok(())
    }

    /// The closing events, after the last chunk.
    fn end(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        self.flush_thought(out);
        if self.blocked && self.finish_reason.is_none() {
            out.push(StreamEvent::Finish(FinishReason::ContentFilter));
            return Ok(());
        }
        if self.finish_reason.is_none() {
            return Err(ModelError::Transport {
                message: if self.seen_chunk {
                    "the Gemini stream ended before a finishReason".into()
                } else {
                    "the Gemini response holds no candidate".into()
                },
                retryable: true,
            });
        }
        let (reason, malformed) = finish(
            self.finish_reason.as_deref(),
            self.finish_message.as_deref(),
            self.calls > 0,
        );
        if let Some(why) = malformed {
            out.push(StreamEvent::MalformedCall(why));
        }
        out.push(StreamEvent::Finish(reason));
        Ok(())
    }
}

impl SseDecode for ChunkDecoder {
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        let data = ev.data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(());
        }
        // A chunk corrupted or cut short on the way (in the middle of a line) is as retryable as a
        // broken connection (never replayed once output was delivered).
        let v = serde_json::from_str::<Value>(data).map_err(|e| ModelError::Transport {
            message: format!(
                "a Gemini stream chunk is not JSON ({e}): {}",
                snippet(data.as_bytes(), 300)
            ),
            retryable: true,
        })?;
        self.chunk(&v, out)
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        self.end(out)
    }
}

/// Decodes a complete `generateContent` response (or a JSON array of streamed chunks).
pub fn decode_response(v: &Value) -> Result<ModelResponse, ModelError> {
    match decode_chunks(std::slice::from_ref(v)) {
        (r, None) => Ok(r),
        (_, Some(e)) => Err(e),
    }
}

fn decode_chunks(chunks: &[Value]) -> Partial {
    let chunks: Vec<&Value> = chunks
        .iter()
        .flat_map(|c| match c {
            Value::Array(items) => items.iter().collect::<Vec<_>>(),
            other => vec![other],
        })
        .collect();
    let mut decoder = ChunkDecoder::default();
    let mut events = Vec::new();
    let result = chunks
        .into_iter()
        .try_for_each(|c| decoder.chunk(c, &mut events))
        .and_then(|()| decoder.end(&mut events));
    wire::accumulate(events, result)
}

fn decode_body(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ModelError::InvalidResponse(format!(
            "the Gemini response is not JSON ({e}): {}",
            snippet(body, 300)
        ))
    })?;
    decode_response(&v)
}

/// Decodes a recorded response body as the adapter would: `status` is the HTTP status, `stream`
/// whether the body is an SSE stream (`alt=sse`). Used by the conformance tests.
pub fn decode_recorded(status: u16, body: &[u8], stream: bool) -> Decoded {
    wire::decode_recorded(
        status,
        body,
        stream,
        parse_error,
        ChunkDecoder::default(),
        |body| match serde_json::from_slice::<Value>(body) {
            Ok(v) => decode_chunks(std::slice::from_ref(&v)),
            Err(e) => (
                ModelResponse::default(),
                Some(ModelError::InvalidResponse(format!(
                    "the Gemini response is not JSON ({e})"
                ))),
            ),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ToolCall, ToolResult};
    use crate::model::{ModelSettings, ToolSpec};

    fn body(messages: &[Message], reminders: &[String], tools: &[ToolSpec]) -> Value {
        let settings = ModelSettings::default();
        let req = ModelRequest {
            messages,
            reminders,
            tools,
            settings: &settings,
            prefix_cache: None,
        };
        build_request_body(&req, &GeminiConfig::new("gemini-test"), false)
    }

    fn result(id: &str, name: &str, content: &str, is_error: bool) -> Message {
        Message::Tool(ToolResult {
            call_id: id.into(),
            name: name.into(),
            content: content.into(),
            is_error,
        })
    }

    /// A real-shaped response: a thought part, then two parallel calls, the first signed.
    fn parallel_response() -> Value {
        json!({
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

    #[test]
    fn parallel_calls_get_ids_signatures_and_usage() {
        let r = decode_response(&parallel_response()).unwrap();
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls.len(), 2);
        assert_ne!(r.tool_calls[0].id, r.tool_calls[1].id);
        assert_eq!(r.tool_calls[0].arguments, json!({"city": "Paris"}));
        assert_eq!(
            r.tool_calls[0].provider_data,
            Some(json!({"gemini": {"thoughtSignature": "SIG_A"}}))
        );
        assert_eq!(r.tool_calls[1].provider_data, None);
        assert_eq!(r.text, None, "thoughts are not text");
        assert_eq!(r.parts.len(), 1);
        let u = r.usage.unwrap();
        assert_eq!(
            (
                u.input_tokens,
                u.output_tokens,
                u.cache_read_tokens,
                u.reasoning_tokens
            ),
            (50, 17, 20, 7)
        );
    }

    #[test]
    fn calls_and_signatures_go_back_and_responses_follow_call_order() {
        let r = decode_response(&parallel_response()).unwrap();
        let (a, b) = (r.tool_calls[0].id.clone(), r.tool_calls[1].id.clone());
        let msgs = vec![
            Message::system("sys"),
            Message::user("weather and time?"),
            Message::Assistant(r.to_message()),
            result(&b, "get_time", "{\"time\":\"12:00\"}", false),
            result(&a, "get_weather", "boom", true),
        ];
        let v = body(&msgs, &["hurry".into()], &[]);
        assert_eq!(v["systemInstruction"], json!({"parts": [{"text": "sys"}]}));
        let contents = v["contents"].as_array().unwrap();
        assert_eq!(contents.len(), 3);
        assert_eq!(
            contents[1],
            json!({"role": "model", "parts": [
                {"text": "thinking about it", "thought": true},
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "SIG_A"},
                {"functionCall": {"name": "get_time", "args": {"tz": "CET"}}},
            ]})
        );
        assert_eq!(
            contents[2],
            json!({"role": "user", "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"error": "boom"}}},
                {"functionResponse": {"name": "get_time", "response": {"output": {"time": "12:00"}}}},
                {"text": "<system-reminder>hurry</system-reminder>"},
            ]})
        );
    }

    #[test]
    fn text_signature_goes_back_on_the_text_and_foreign_parts_are_dropped() {
        let r = decode_response(&json!({
            "candidates": [{"content": {"parts": [{"text": "Hello", "thoughtSignature": "T1"}]}, "finishReason": "STOP"}]
        }))
        .unwrap();
        assert_eq!(r.text.as_deref(), Some("Hello"));
        let mut message = r.to_message();
        message.parts.push(ProviderPart {
            provider: "anthropic".into(),
            data: json!({"type": "thinking", "signature": "x"}),
        });
        let v = body(
            &[
                Message::user("hi"),
                Message::Assistant(message),
                Message::user("more"),
            ],
            &[],
            &[],
        );
        assert_eq!(
            v["contents"][1]["parts"],
            json!([{"text": "Hello", "thoughtSignature": "T1"}])
        );
    }

    #[test]
    fn wire_ids_missing_results_and_alternation() {
        let mut call = ToolCall::new("f", json!({}));
        call.provider_data = Some(json!({"gemini": {"id": "fc-1"}}));
        let id = call.id.clone();
        let other = ToolCall::new("g", json!({"a": 1}));
        let msgs = vec![
            Message::user("a"),
            Message::user("b"),
            Message::Assistant(AssistantMessage {
                tool_calls: vec![call, other],
                ..AssistantMessage::default()
            }),
            result(&id, "f", "42", false),
            Message::user("c"),
        ];
        let v = body(&msgs, &[], &[]);
        let contents = v["contents"].as_array().unwrap();
        assert_eq!(contents.len(), 3);
        assert_eq!(contents[0]["parts"], json!([{"text": "a"}, {"text": "b"}]));
        assert_eq!(contents[1]["parts"][0]["functionCall"]["id"], "fc-1");
        let parts = contents[2]["parts"].as_array().unwrap();
        assert_eq!(
            parts[0],
            json!({"functionResponse": {"name": "f", "id": "fc-1", "response": {"output": 42}}})
        );
        assert_eq!(parts[1]["functionResponse"]["name"], "g");
        assert!(parts[1]["functionResponse"]["response"]["error"].is_string());
        assert_eq!(parts[2], json!({"text": "c"}));
    }

    #[test]
    fn tools_and_settings() {
        let tools = [ToolSpec {
            name: "f".into(),
            description: "does f".into(),
            parameters: json!({"type": "object", "properties": {"x": {"type": ["string", "null"]}}}),
        }];
        let settings = ModelSettings {
            temperature: Some(0.2),
            max_output_tokens: Some(64),
            tool_choice: ToolChoice::Tool("f".into()),
            extra: Some(json!({"generationConfig": {"topK": 3}})),
            ..ModelSettings::default()
        };
        let msgs = [Message::user("x")];
        let req = ModelRequest {
            messages: &msgs,
            reminders: &[],
            tools: &tools,
            settings: &settings,
            prefix_cache: None,
        };
        let v = build_request_body(&req, &GeminiConfig::new("m"), true);
        assert_eq!(
            v["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"],
            tools[0].parameters
        );
        assert_eq!(
            v["toolConfig"]["functionCallingConfig"],
            json!({"mode": "ANY", "allowedFunctionNames": ["f"]})
        );
        assert_eq!(
            v["generationConfig"],
            json!({"temperature": 0.2, "maxOutputTokens": 64, "topK": 3})
        );
    }

    #[test]
    fn finish_reasons() {
        let decode = |reason: &str| {
            decode_response(&json!({"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": reason, "finishMessage": "Malformed function call: print(f(1))"}]}))
                .unwrap()
        };
        assert_eq!(decode("STOP").finish_reason, FinishReason::Stop);
        assert_eq!(decode("MAX_TOKENS").finish_reason, FinishReason::Length);
        assert_eq!(decode("SAFETY").finish_reason, FinishReason::ContentFilter);
        assert_eq!(
            decode("RECITATION").finish_reason,
            FinishReason::ContentFilter
        );
        let m = decode("MALFORMED_FUNCTION_CALL");
        assert_eq!(m.finish_reason, FinishReason::MalformedToolCall);
        let why = m.malformed_call.unwrap();
        assert!(
            why.contains("print(f(1))") && why.contains("JSON object"),
            "{why}"
        );
        let blocked =
            decode_response(&json!({"promptFeedback": {"blockReason": "SAFETY"}})).unwrap();
        assert_eq!(blocked.finish_reason, FinishReason::ContentFilter);
        assert!(decode_response(&json!({})).is_err());
    }

    #[test]
    fn streamed_chunks_join_and_end_with_finish() {
        let sse = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hel\"}]}}]}\r\n\r\n\
                   data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"lo\"},{\"functionCall\":{\"name\":\"f\",\"args\":{}},\"thoughtSignature\":\"S\"}]},\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":3,\"candidatesTokenCount\":2}}\r\n\r\n";
        let d = decode_recorded(200, sse.as_bytes(), true);
        assert!(d.error.is_none(), "{:?}", d.error);
        assert_eq!(d.response.text.as_deref(), Some("Hello"));
        assert_eq!(d.response.tool_calls[0].name, "f");
        assert_eq!(d.response.finish_reason, FinishReason::ToolCalls);
        assert_eq!(d.response.usage.unwrap().input_tokens, 3);
        let cut = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hel\"}]}}]}\n\n";
        let d = decode_recorded(200, cut.as_bytes(), true);
        assert!(d.error.unwrap().message.contains("finishReason"));
    }

    #[test]
    fn errors_with_retry_info() {
        let body = br#"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"12s"}]}}"#;
        let e = parse_error(429, &HeaderMap::new(), body);
        assert_eq!(e.error_type.as_deref(), Some("RESOURCE_EXHAUSTED"));
        assert_eq!(e.code.as_deref(), Some("429"));
        assert_eq!(e.retry_after, Some(Duration::from_secs(12)));
        assert!(e.retryable);
        let e = parse_error(
            400,
            &HeaderMap::new(),
            br#"[{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT"}}]"#,
        );
        assert_eq!((e.message.as_str(), e.retryable), ("bad", false));
        assert_eq!(
            parse_duration(&json!("0.25s")),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            parse_duration(&json!({"seconds": 2, "nanos": 500000000})),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(parse_duration(&json!("soon")), None);
    }

    #[test]
    fn config_and_urls() {
        let c = GeminiConfig::from_vars("models/gemini-2.5-flash", |k| {
            (k == "GOOGLE_API_KEY").then(|| "g-key".to_string())
        })
        .unwrap();
        assert_eq!(
            c.generate_url(&c.model),
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
        );
        assert_eq!(c.headers().unwrap()["x-goog-api-key"], "g-key");
        let local = GeminiConfig::from_vars("m", |k| {
            (k == "GEMINI_BASE_URL").then(|| "http://127.0.0.1:1/v1beta/".into())
        })
        .unwrap();
        assert_eq!(
            local.stream_url("m"),
            "http://127.0.0.1:1/v1beta/models/m:streamGenerateContent?alt=sse"
        );
        assert!(
            GeminiConfig::from_vars("m", |_| None)
                .unwrap_err()
                .to_string()
                .contains("GEMINI_API_KEY")
        );
    }
}
