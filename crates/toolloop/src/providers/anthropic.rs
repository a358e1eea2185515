//! Anthropic Messages API (`POST /v1/messages`), complete and streamed, with prompt caching.
//!
//! How the message model maps to the wire:
//!
//! - Leading system messages become the top-level `system` field. A system message that appears
//!   later in the conversation (Anthropic has no mid-conversation system role) becomes a text
//!   block of a user turn, wrapped in `<system-reminder>` tags, where it stood.
//! - An assistant turn is sent as its Anthropic [`ProviderPart`]s (thinking, redacted thinking,
//!   server-side tool blocks, exactly as received, signatures included), then its text, then its
//!   `tool_use` blocks. Parts of other providers are left out.
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
//! Usage: `input_tokens` is Anthropic's `input_tokens` plus `cache_read_input_tokens` plus
//! `cache_creation_input_tokens` (toolloop's [`Usage`] counts cached tokens as input).

use crate::http::{HttpTransport, retryable_status};
use crate::message::{Message, ProviderPart, ToolCall};
use crate::model::{
    ApiError, EventStream, FinishReason, Model, ModelError, ModelRequest, ModelResponse, ToolChoice,
};
use crate::providers::Decoded;
use crate::providers::wire::{self, SseDecode, json_number, merge_extras, snippet};
use crate::sse::SseEvent;
use crate::stream::StreamEvent;
use crate::usage::Usage;
use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// The provider name on [`ProviderPart`]s this adapter produces.
pub const PROVIDER: &str = "anthropic";
/// The default API address.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The default `anthropic-version` header.
pub const DEFAULT_VERSION: &str = "2023-06-01";
/// The default `max_tokens` when the settings give none (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The most `cache_control` breakpoints the API accepts in one request.
pub const MAX_CACHE_BREAKPOINTS: usize = 4;

/// How to reach the Anthropic Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    /// The model id (`claude-sonnet-4-5`, …).
    pub model: String,
    /// The API address without `/v1` (default [`DEFAULT_BASE_URL`], env `ANTHROPIC_BASE_URL`).
    pub base_url: String,
    /// The API key, sent as `x-api-key` (env `ANTHROPIC_API_KEY`). Optional only for servers
    /// that need none (a local mock).
    pub api_key: Option<String>,
    /// The `anthropic-version` header (default [`DEFAULT_VERSION`]).
    pub version: String,
    /// `max_tokens` when the settings give none (default [`DEFAULT_MAX_TOKENS`]).
    pub max_tokens: u32,
    /// Whether to place prompt-caching breakpoints (default `true`).
    pub cache: bool,
    /// Extra request fields, merged (deeply) into every request body before the settings' own
    /// `extra` (`{"thinking": {"type": "enabled", "budget_tokens": 2048}}`).
    pub extra: Option<Value>,
    /// The HTTP transport (retries, limits).
    pub transport: HttpTransport,
}

impl AnthropicConfig {
    /// A configuration with the defaults and no key.
    pub fn new(model: impl Into<String>) -> Self {
        AnthropicConfig {
            model: model.into(),
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key: None,
            version: DEFAULT_VERSION.to_string(),
            max_tokens: DEFAULT_MAX_TOKENS,
            cache: true,
            extra: None,
            transport: HttpTransport::new(),
        }
    }

    /// A configuration from the environment: `ANTHROPIC_API_KEY`, and `ANTHROPIC_BASE_URL` when
    /// set. The key is required unless a base URL other than the official API is given.
    pub fn from_env(model: impl Into<String>) -> Result<Self, ModelError> {
        Self::from_vars(model, |name| std::env::var(name).ok())
    }

    /// Like [`AnthropicConfig::from_env`], reading variables through `var`.
    pub fn from_vars(
        model: impl Into<String>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ModelError> {
        let mut config = AnthropicConfig::new(model);
        if config.model.trim().is_empty() {
            return Err(ModelError::Config(
                "no Anthropic model given: expected `anthropic:<model>`, e.g. \
                 `anthropic:claude-sonnet-4-5`"
                    .into(),
            ));
        }
        if let Some(url) = var("ANTHROPIC_BASE_URL").filter(|u| !u.trim().is_empty()) {
            config.base_url = url.trim().to_string();
        }
        config.api_key = var("ANTHROPIC_API_KEY").filter(|k| !k.trim().is_empty());
        if config.api_key.is_none() && config.base_url.trim_end_matches('/') == DEFAULT_BASE_URL {
            return Err(ModelError::Config(
                "ANTHROPIC_API_KEY is not set: the Anthropic API needs a key (or set \
                 ANTHROPIC_BASE_URL to a server that needs none)"
                    .into(),
            ));
        }
        Ok(config)
    }

    /// The Messages endpoint: `{base_url}/v1/messages`.
    pub fn messages_url(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        format!("{base}/v1/messages")
    }

    /// The request headers: `x-api-key` (when there is a key) and `anthropic-version`.
    pub fn headers(&self) -> Result<HeaderMap, ModelError> {
        let mut headers = HeaderMap::new();
        let value = |name: &str, v: &str| {
            HeaderValue::from_str(v).map_err(|_| {
                ModelError::Config(format!(
                    "the {name} value contains characters not allowed in an HTTP header"
                ))
            })
        };
        if let Some(key) = &self.api_key {
            let mut v = value("API key", key.trim())?;
            v.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-api-key"), v);
        }
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            value("anthropic-version", &self.version)?,
        );
        Ok(headers)
    }
}

/// The top-level request fields this adapter writes itself: the model, the system prompt, the conversation, the tool catalog and choice, and the streaming mode. An `extra` (the
/// adapter's or the settings') that sets one is refused with [`ModelError::Config`], by
/// [`AnthropicConfig::validate`] and by every call.
pub const OWNED_FIELDS: &[&str] = &[
    "model",
    "system",
    "messages",
    "tools",
    "tool_choice",
    "stream",
];

impl AnthropicConfig {
    /// Checks the configuration without sending anything: the base URL (see
    /// [`crate::providers::check_base_url`]) and `extra` (none of the [`OWNED_FIELDS`]).
    pub fn validate(&self) -> Result<(), ModelError> {
        wire::validate_config(
            "Anthropic",
            &self.base_url,
            self.extra.as_ref(),
            OWNED_FIELDS,
        )
    }
}

/// A model behind the Anthropic Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicModel {
    config: AnthropicConfig,
}

impl AnthropicModel {
    /// A model with this configuration.
    pub fn new(config: AnthropicConfig) -> Self {
        AnthropicModel { config }
    }

    /// The configuration.
    pub fn config(&self) -> &AnthropicConfig {
        &self.config
    }
}

#[async_trait]
impl Model for AnthropicModel {
    fn name(&self) -> &str {
        &self.config.model
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
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
                &self.config.headers()?,
                body.to_string().into(),
                parse_error,
                decode_message_body,
            )
            .await
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        wire::check_extras(
            "Anthropic",
            self.config.extra.as_ref(),
            Some(request),
            OWNED_FIELDS,
        )?;
        let body = build_request_body(request, &self.config, true).to_string();
        wire::open_sse_stream(
            &self.config.transport,
            self.config.messages_url().into(),
            self.config.headers()?,
            body.into(),
            parse_error,
            StreamDecoder::default,
        )
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// Request building
// ---------------------------------------------------------------------------------------------

struct Turn {
    role: &'static str,
    blocks: Vec<Value>,
}

fn push_blocks(turns: &mut Vec<Turn>, role: &'static str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => last.blocks.extend(blocks),
        _ => turns.push(Turn { role, blocks }),
    }
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// A tool-use id as Anthropic accepts it (`^[a-zA-Z0-9_-]+$`): other characters become `_`.
/// Applied alike to `tool_use` and `tool_result`, so ids from other providers still pair up.
pub fn wire_id(id: &str) -> String {
    if id.is_empty() {
        return "toolu_missing_id".to_string();
    }
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn is_thinking(block: &Value) -> bool {
    matches!(
        block["type"].as_str(),
        Some("thinking" | "redacted_thinking")
    )
}

fn assistant_blocks(a: &crate::message::AssistantMessage) -> Vec<Value> {
    let mut blocks = Vec::new();
    for part in a.parts.iter().filter(|p| p.provider == PROVIDER) {
        // A thinking block without its signature is refused by the API; it cannot be replayed.
        if part.data["type"] == "thinking"
            && part.data["signature"].as_str().is_none_or(str::is_empty)
        {
            continue;
        }
        blocks.push(part.data.clone());
    }
    if let Some(text) = a.text.as_deref().filter(|t| !t.trim().is_empty()) {
        blocks.push(text_block(text));
    }
    for call in &a.tool_calls {
        let input = match &call.arguments {
            Value::Object(_) => call.arguments.clone(),
            _ => json!({}),
        };
        let mut block = json!({
            "type": "tool_use",
            "id": wire_id(&call.id),
            "name": call.name,
            "input": input,
        });
        if let Some(Value::Object(extra)) = call.provider_data.as_ref().map(|d| &d[PROVIDER]) {
            for (k, v) in extra {
                block[k.as_str()] = v.clone();
            }
        }
        blocks.push(block);
    }
    blocks
}

/// Puts each user turn's `tool_result` blocks first, in the order of the previous assistant
/// turn's `tool_use` blocks; answers calls that have no result with an error result; turns
/// results that answer nothing into text.
fn pair_tool_results(turns: &mut [Turn]) {
    for i in 0..turns.len() {
        if turns[i].role != "user" {
            continue;
        }
        let expected: Vec<String> = match i.checked_sub(1).map(|j| &turns[j]) {
            Some(prev) if prev.role == "assistant" => prev
                .blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .filter_map(|b| b["id"].as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        let blocks = std::mem::take(&mut turns[i].blocks);
        let (mut results, others): (Vec<Value>, Vec<Value>) =
            blocks.into_iter().partition(|b| b["type"] == "tool_result");
        if results.is_empty() && expected.is_empty() {
            turns[i].blocks = others;
            continue;
        }
        let mut ordered = Vec::with_capacity(expected.len() + others.len());
        for id in &expected {
            match results.iter().position(|r| r["tool_use_id"] == id.as_str()) {
                Some(pos) => ordered.push(results.remove(pos)),
                None => ordered.push(json!({
                    "type": "tool_result",
                    "tool_use_id": id,
                    "content": "No result was recorded for this call; it was not executed.",
                    "is_error": true,
                })),
            }
        }
        for orphan in results {
            let id = orphan["tool_use_id"].as_str().unwrap_or("");
            let content = orphan["content"].as_str().unwrap_or("");
            ordered.push(text_block(&format!(
                "Result of tool call {id} (no matching call in the previous turn): {content}"
            )));
        }
        ordered.extend(others);
        turns[i].blocks = ordered;
    }
}

fn cache_marker() -> Value {
    json!({"type": "ephemeral"})
}

/// Marks the last block of a turn that can carry `cache_control` (thinking blocks cannot).
fn mark_turn(turn: &mut Turn) -> bool {
    match turn.blocks.iter_mut().rev().find(|b| !is_thinking(b)) {
        Some(block) => {
            block["cache_control"] = cache_marker();
            true
        }
        None => false,
    }
}

/// The Messages request body for `req`.
pub fn build_request_body(req: &ModelRequest<'_>, config: &AnthropicConfig, stream: bool) -> Value {
    let mut system: Vec<Value> = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    let mut leading = true;
    for message in req.messages {
        match message {
            Message::System { content } if leading => {
                if !content.trim().is_empty() {
                    system.push(text_block(content));
                }
            }
            Message::System { content } => {
                if !content.trim().is_empty() {
                    let wrapped = format!("<system-reminder>{content}</system-reminder>");
                    push_blocks(&mut turns, "user", vec![text_block(&wrapped)]);
                }
            }
            Message::User { content } => {
                leading = false;
                if !content.trim().is_empty() {
                    push_blocks(&mut turns, "user", vec![text_block(content)]);
                }
            }
            Message::Assistant(a) => {
                leading = false;
                push_blocks(&mut turns, "assistant", assistant_blocks(a));
            }
            Message::Tool(r) => {
                leading = false;
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": wire_id(&r.call_id),
                    "content": r.content,
                });
                if r.is_error {
                    block["is_error"] = json!(true);
                }
                push_blocks(&mut turns, "user", vec![block]);
            }
        }
    }
    pair_tool_results(&mut turns);

    let mut tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            let mut schema = match &t.parameters {
                Value::Object(_) => t.parameters.clone(),
                _ => json!({"type": "object", "properties": {}}),
            };
            if schema.get("type").is_none() {
                schema["type"] = json!("object");
            }
            let mut tool = json!({"name": t.name, "input_schema": schema});
            if !t.description.is_empty() {
                tool["description"] = json!(t.description);
            }
            tool
        })
        .collect();

    if config.cache {
        let mut budget = MAX_CACHE_BREAKPOINTS;
        if let Some(last) = tools.last_mut() {
            last["cache_control"] = cache_marker();
            budget -= 1;
        }
        if let Some(last) = system.last_mut() {
            last["cache_control"] = cache_marker();
            budget -= 1;
        }
        // The last stable turn, then the previous round's last stable turn (the user turn before
        // the last assistant turn), so this round both reads the previous prefix exactly where it
        // was written and writes the new one.
        if let Some(last) = turns.len().checked_sub(1) {
            if budget > 0 && mark_turn(&mut turns[last]) {
                budget -= 1;
            }
            let previous = turns[..last]
                .iter()
                .rposition(|t| t.role == "user")
                .filter(|&j| turns[j + 1..last].iter().any(|t| t.role == "assistant"));
            if let Some(j) = previous
                && budget > 0
            {
                mark_turn(&mut turns[j]);
            }
        }
    }

    let reminders: Vec<Value> = req.wrapped_reminders().map(|r| text_block(&r)).collect();
    if !reminders.is_empty() {
        match turns.last_mut() {
            Some(last) if last.role == "user" => last.blocks.extend(reminders),
            _ => turns.push(Turn {
                role: "user",
                blocks: reminders,
            }),
        }
    }

    let messages: Vec<Value> = turns
        .into_iter()
        .map(|t| json!({"role": t.role, "content": t.blocks}))
        .collect();
    let mut body = Map::new();
    body.insert(
        "model".into(),
        json!(req.settings.model.as_deref().unwrap_or(&config.model)),
    );
    body.insert(
        "max_tokens".into(),
        json!(req.settings.max_output_tokens.unwrap_or(config.max_tokens)),
    );
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
        let choice = match &req.settings.tool_choice {
            ToolChoice::Auto => None,
            ToolChoice::None => Some(json!({"type": "none"})),
            ToolChoice::Required => Some(json!({"type": "any"})),
            ToolChoice::Tool(name) => Some(json!({"type": "tool", "name": name})),
        };
        if let Some(choice) = choice {
            body.insert("tool_choice".into(), choice);
        }
    }
    if let Some(t) = req.settings.temperature {
        body.insert("temperature".into(), json_number(t));
    }
    if stream {
        body.insert("stream".into(), json!(true));
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

/// Anthropic's usage counters, updated field by field as a stream reports them.
#[derive(Debug, Default, Clone, Copy)]
struct WireUsage {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    thinking: u64,
    /// Whether an input or output count was reported at all.
    reported: bool,
}

impl WireUsage {
    fn update(&mut self, u: &Value) {
        let get = |k: &str| u.get(k).and_then(Value::as_u64);
        if let Some(v) = get("input_tokens") {
            self.input = v;
            self.reported = true;
        }
        if let Some(v) = get("output_tokens") {
            self.output = v;
            self.reported = true;
        }
        if let Some(v) = get("cache_read_input_tokens") {
            self.cache_read = v;
        }
        if let Some(v) = get("cache_creation_input_tokens") {
            self.cache_write = v;
        }
        if let Some(v) = u
            .pointer("/output_tokens_details/thinking_tokens")
            .and_then(Value::as_u64)
        {
            self.thinking = v;
        }
    }

    /// The usage, or `None` when no input or output count was reported (a usage object
    /// without them reports nothing: its tokens are unknown, not zero).
    fn usage(&self) -> Option<Usage> {
        self.reported.then_some(Usage {
            input_tokens: self.input + self.cache_read + self.cache_write,
            output_tokens: self.output,
            cache_read_tokens: self.cache_read,
            cache_write_tokens: self.cache_write,
            reasoning_tokens: self.thinking,
        })
    }
}

fn finish_reason(stop_reason: Option<&str>, has_calls: bool) -> FinishReason {
    match stop_reason {
        Some("tool_use") => FinishReason::ToolCalls,
        Some("max_tokens" | "model_context_window_exceeded") => FinishReason::Length,
        // The server paused a long server-tool turn; sending the turn back continues it.
        Some("pause_turn") => FinishReason::Length,
        Some("refusal") => FinishReason::ContentFilter,
        Some("end_turn" | "stop_sequence") => FinishReason::Stop,
        _ if has_calls => FinishReason::ToolCalls,
        _ => FinishReason::Stop,
    }
}

fn error_type_for_status(status: u16) -> Option<&'static str> {
    Some(match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        500 => "api_error",
        529 => "overloaded_error",
        _ => return None,
    })
}

fn retryable_type(t: &str) -> bool {
    matches!(t, "overloaded_error" | "rate_limit_error" | "api_error")
}

/// Turns an Anthropic error response (`{"type":"error","error":{"type","message"}}`) into an
/// [`ApiError`]. 429, 500, 503 and 529 (and the overloaded, rate-limit and API error types) are
/// retryable; the transport adds the `retry-after` wait.
pub fn parse_error(status: u16, _headers: &HeaderMap, body: &[u8]) -> ApiError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let error_type = error
        .and_then(|e| e["type"].as_str())
        .map(str::to_string)
        .or_else(|| error_type_for_status(status).map(str::to_string));
    let message = match error.and_then(|e| e["message"].as_str()) {
        Some(m) => m.to_string(),
        None if body.is_empty() => format!("HTTP {status} with an empty body"),
        None => format!("HTTP {status}: {}", snippet(body, 500)),
    };
    let retryable = retryable_status(status) || error_type.as_deref().is_some_and(retryable_type);
    ApiError {
        status,
        error_type,
        code: None,
        message,
        retryable,
        retry_after: None,
    }
}

fn stream_error(v: &Value) -> ApiError {
    let error = &v["error"];
    let error_type = error["type"].as_str().map(str::to_string);
    ApiError {
        status: 200,
        retryable: error_type.as_deref().is_some_and(retryable_type),
        error_type,
        code: None,
        message: error["message"]
            .as_str()
            .unwrap_or("error event in the stream with no message")
            .to_string(),
        retry_after: None,
    }
}

/// Decodes a complete (non-streamed) Messages response.
pub fn decode_message(v: &Value) -> Result<ModelResponse, ModelError> {
    if v["type"] == "error" {
        return Err(ModelError::Api(ApiError {
            status: 200,
            ..stream_error(v)
        }));
    }
    let content = v["content"].as_array().ok_or_else(|| {
        ModelError::InvalidResponse(format!(
            "expected a Messages response with a `content` array, got: {}",
            snippet(v.to_string().as_bytes(), 300)
        ))
    })?;
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut parts = Vec::new();
    for block in content {
        match block["type"].as_str() {
            Some("text") => text.push_str(block["text"].as_str().unwrap_or("")),
            Some("tool_use") => {
                let arguments = match &block["input"] {
                    Value::Null => json!({}),
                    other => other.clone(),
                };
                calls.push(ToolCall {
                    id: block["id"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .unwrap_or_else(crate::message::new_call_id),
                    name: block["name"].as_str().unwrap_or("").to_string(),
                    arguments,
                    invalid_arguments: None,
                    provider_data: call_extras(block),
                });
            }
            _ => parts.push(ProviderPart {
                provider: PROVIDER.into(),
                data: block.clone(),
            }),
        }
    }
    let stop_reason = v["stop_reason"].as_str();
    // Cut by max_tokens inside its last tool_use: the input may be incomplete, so the call is
    // reported but must not run.
    if stop_reason == Some("max_tokens")
        && content.last().is_some_and(|b| b["type"] == "tool_use")
        && let Some(last) = calls.last_mut()
    {
        last.invalid_arguments = Some(last.arguments.to_string());
        last.arguments = json!({});
    }
    let usage = v.get("usage").filter(|u| u.is_object()).and_then(|u| {
        let mut w = WireUsage::default();
        w.update(u);
        w.usage()
    });
    Ok(ModelResponse {
        text: (!text.is_empty()).then_some(text),
        finish_reason: finish_reason(stop_reason, !calls.is_empty()),
        tool_calls: calls,
        usage,
        parts,
        malformed_call: None,
    })
}

fn decode_message_body(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ModelError::InvalidResponse(format!(
            "the Messages response is not JSON ({e}): {}",
            snippet(body, 300)
        ))
    })?;
    decode_message(&v)
}

/// Fields of a `tool_use` block besides type, id, name and input that must go back with it
/// (a non-direct `caller`), kept as `{"anthropic": {...}}` in the call's `provider_data`.
fn call_extras(block: &Value) -> Option<Value> {
    let caller = block.get("caller")?;
    if caller["type"] == "direct" {
        return None;
    }
    Some(json!({PROVIDER: {"caller": caller}}))
}

enum Block {
    Text,
    ToolUse {
        index: usize,
        id: Option<String>,
        name: String,
        initial: Value,
        extras: Option<Value>,
        started: bool,
        args_seen: bool,
    },
    Other {
        block: Value,
        json: String,
    },
}

/// Turns Messages stream events into [`StreamEvent`]s.
#[derive(Default)]
struct StreamDecoder {
    blocks: BTreeMap<u64, Block>,
    usage: WireUsage,
    stop_reason: Option<String>,
    stopped: bool,
    calls: usize,
    reported_calls: usize,
}

impl SseDecode for StreamDecoder {
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        // A corrupted or cut-short event is as retryable as a broken connection (never
        // replayed once output was delivered).
        let v: Value = serde_json::from_str(data).map_err(|e| ModelError::Transport {
            message: format!(
                "a Messages stream event is not JSON ({e}): {}",
                snippet(data.as_bytes(), 300)
            ),
            retryable: true,
        })?;
        let kind = v["type"]
            .as_str()
            .or(ev.event.as_deref())
            .unwrap_or_default();
        let index = v["index"].as_u64();
        match kind {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage").filter(|u| u.is_object()) {
                    self.usage.update(u);
                    out.extend(self.usage.usage().map(StreamEvent::Usage));
                }
            }
            "content_block_start" => {
                let (Some(index), Some(block)) = (index, v.get("content_block")) else {
                    return Err(ModelError::InvalidResponse(
                        "unexpected Messages stream: a content_block_start event without index \
                         or block"
                            .into(),
                    ));
                };
                let state = match block["type"].as_str() {
                    Some("text") => {
                        if let Some(t) = block["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push(StreamEvent::TextDelta(t.to_string()));
                        }
                        Block::Text
                    }
                    Some("tool_use") => {
                        let call = self.calls;
                        self.calls += 1;
                        Block::ToolUse {
                            index: call,
                            id: block["id"].as_str().map(str::to_string),
                            name: block["name"].as_str().unwrap_or("").to_string(),
                            initial: block["input"].clone(),
                            extras: call_extras(block),
                            started: false,
                            args_seen: false,
                        }
                    }
                    _ => Block::Other {
                        block: block.clone(),
                        json: String::new(),
                    },
                };
                if let Some(old) = self.blocks.insert(index, state) {
                    self.close(old, true, out);
                }
            }
            "content_block_delta" => {
                let delta = &v["delta"];
                let block = index.and_then(|i| self.blocks.get_mut(&i));
                match (delta["type"].as_str(), block) {
                    (Some("text_delta"), _) => {
                        if let Some(t) = delta["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push(StreamEvent::TextDelta(t.to_string()));
                        }
                    }
                    (Some("input_json_delta"), Some(block)) => {
                        let fragment = delta["partial_json"].as_str().unwrap_or("");
                        match block {
                            Block::ToolUse {
                                index,
                                id,
                                name,
                                started,
                                args_seen,
                                ..
                            } => {
                                if !fragment.is_empty() {
                                    if !*started {
                                        *started = true;
                                        out.push(StreamEvent::ToolCallStart {
                                            index: *index,
                                            id: id.clone(),
                                            name: name.clone(),
                                        });
                                    }
                                    *args_seen = true;
                                    out.push(StreamEvent::ToolCallDelta {
                                        index: *index,
                                        arguments: fragment.to_string(),
                                    });
                                }
                            }
                            Block::Other { json, .. } => json.push_str(fragment),
                            Block::Text => {}
                        }
                    }
                    (Some("thinking_delta"), Some(Block::Other { block, .. })) => {
                        let piece = delta["thinking"].as_str().unwrap_or("");
                        let joined = format!("{}{piece}", block["thinking"].as_str().unwrap_or(""));
                        block["thinking"] = json!(joined);
                    }
                    (Some("signature_delta"), Some(Block::Other { block, .. })) => {
                        let piece = delta["signature"].as_str().unwrap_or("");
                        let joined =
                            format!("{}{piece}", block["signature"].as_str().unwrap_or(""));
                        block["signature"] = json!(joined);
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(block) = index.and_then(|i| self.blocks.remove(&i)) {
                    self.close(block, true, out);
                }
            }
            "message_delta" => {
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(r.to_string());
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.usage.update(u);
                    out.extend(self.usage.usage().map(StreamEvent::Usage));
                }
            }
            "message_stop" => self.stopped = true,
            "error" => return Err(ModelError::Api(stream_error(&v))),
            _ => {} // ping, and event types added later
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        let open = std::mem::take(&mut self.blocks);
        for (_, block) in open {
            self.close(block, false, out);
        }
        if !self.stopped && self.stop_reason.is_none() {
            return Err(ModelError::Transport {
                message: "the Messages stream ended before message_stop".into(),
                retryable: true,
            });
        }
        out.push(StreamEvent::Finish(finish_reason(
            self.stop_reason.as_deref(),
            self.reported_calls > 0,
        )));
        Ok(())
    }
}

impl StreamDecoder {
    /// Ends a block. `complete` is false for a block the stream never closed (cut by
    /// `max_tokens`): a call that received argument text is reported with it (incomplete, so it
    /// will not parse and will not run); one that received none is left out.
    fn close(&mut self, block: Block, complete: bool, out: &mut Vec<StreamEvent>) {
        match block {
            Block::Text => {}
            Block::ToolUse {
                index,
                id,
                name,
                initial,
                extras,
                started,
                args_seen,
            } => {
                if !started {
                    if !complete {
                        return;
                    }
                    out.push(StreamEvent::ToolCallStart { index, id, name });
                }
                if !args_seen && initial.as_object().is_some_and(|o| !o.is_empty()) {
                    out.push(StreamEvent::ToolCallDelta {
                        index,
                        arguments: initial.to_string(),
                    });
                }
                if let Some(data) = extras {
                    out.push(StreamEvent::ToolCallData { index, data });
                }
                out.push(StreamEvent::ToolCallEnd { index });
                self.reported_calls += 1;
            }
            Block::Other { mut block, json } => {
                if !json.is_empty()
                    && let Ok(input) = serde_json::from_str::<Value>(&json)
                {
                    block["input"] = input;
                }
                out.push(StreamEvent::Part(ProviderPart {
                    provider: PROVIDER.into(),
                    data: block,
                }));
            }
        }
    }
}

/// Decodes a recorded response body as the adapter would: `status` is the HTTP status, `stream`
/// whether the body is an SSE stream. Used by the conformance tests.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{AssistantMessage, ToolResult};
    use crate::model::{ModelSettings, ToolSpec};

    fn config() -> AnthropicConfig {
        AnthropicConfig::new("claude-test")
    }

    fn call(id: &str, name: &str, args: Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args,
            invalid_arguments: None,
            provider_data: None,
        }
    }

    fn result(id: &str, content: &str, is_error: bool) -> Message {
        Message::Tool(ToolResult {
            call_id: id.into(),
            name: "t".into(),
            content: content.into(),
            is_error,
        })
    }

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("the {name} tool"),
            parameters: json!({"type": "object", "properties": {"x": {"type": "string"}}}),
        }
    }

    fn body(
        messages: &[Message],
        reminders: &[String],
        tools: &[ToolSpec],
        cfg: &AnthropicConfig,
    ) -> Value {
        let settings = ModelSettings::default();
        let req = ModelRequest {
            messages,
            reminders,
            tools,
            settings: &settings,
            prefix_cache: None,
        };
        build_request_body(&req, cfg, false)
    }

    fn no_cache() -> AnthropicConfig {
        AnthropicConfig {
            cache: false,
            ..config()
        }
    }

    fn thinking_part() -> ProviderPart {
        ProviderPart {
            provider: PROVIDER.into(),
            data: json!({"type": "thinking", "thinking": "plan", "signature": "sig=="}),
        }
    }

    /// A transcript with one parallel round: two calls, results recorded out of order.
    fn round_one() -> Vec<Message> {
        vec![
            Message::system("be brief"),
            Message::user("go"),
            Message::Assistant(AssistantMessage {
                text: Some("calling".into()),
                tool_calls: vec![
                    call("toolu_a", "read", json!({"x": "1"})),
                    call("toolu_b", "read", json!({"x": "2"})),
                ],
                parts: vec![
                    thinking_part(),
                    ProviderPart {
                        provider: "gemini".into(),
                        data: json!({"thoughtSignature": "gem"}),
                    },
                ],
            }),
            result("toolu_b", "second", true),
            result("toolu_a", "first", false),
        ]
    }

    #[test]
    fn system_on_top_and_results_in_one_user_turn_in_call_order() {
        let b = body(&round_one(), &[], &[], &no_cache());
        assert_eq!(b["system"], json!([{"type": "text", "text": "be brief"}]));
        assert_eq!(b["max_tokens"], json!(DEFAULT_MAX_TOKENS));
        let msgs = b["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[2]["role"], "user");
        assert_eq!(
            msgs[2]["content"],
            json!([
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "first"},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": "second", "is_error": true},
            ])
        );
    }

    #[test]
    fn thinking_goes_back_unchanged_first_and_other_providers_parts_are_dropped() {
        let b = body(&round_one(), &[], &[], &no_cache());
        let content = &b["messages"][1]["content"];
        assert_eq!(
            *content,
            json!([
                {"type": "thinking", "thinking": "plan", "signature": "sig=="},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"x": "1"}},
                {"type": "tool_use", "id": "toolu_b", "name": "read", "input": {"x": "2"}},
            ])
        );
    }

    #[test]
    fn same_role_turns_are_merged() {
        let msgs = vec![
            Message::user("a"),
            Message::user("b"),
            Message::assistant("x"),
            Message::assistant("y"),
            Message::user("c"),
        ];
        let b = body(&msgs, &[], &[], &no_cache());
        assert_eq!(
            b["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
                {"role": "user", "content": [{"type": "text", "text": "c"}]},
            ])
        );
    }

    #[test]
    fn results_come_before_user_text_and_missing_or_orphan_results_are_fixed() {
        let msgs = vec![
            Message::user("go"),
            Message::Assistant(AssistantMessage {
                tool_calls: vec![call("c.1", "f", json!({})), call("c2", "f", json!({}))],
                ..AssistantMessage::default()
            }),
            Message::user("also this"),
            result("c.1", "ok", false),
            result("zzz", "stray", false),
        ];
        let b = body(&msgs, &[], &[], &no_cache());
        let content = b["messages"][2]["content"].as_array().unwrap();
        assert_eq!(
            b["messages"][1]["content"][0]["id"], "c_1",
            "ids are sanitized"
        );
        assert_eq!(content[0]["tool_use_id"], "c_1");
        assert_eq!(content[1]["tool_use_id"], "c2");
        assert_eq!(content[1]["is_error"], true);
        assert_eq!(content[2]["type"], "text");
        assert!(content[2]["text"].as_str().unwrap().contains("stray"));
        assert_eq!(content[3], json!({"type": "text", "text": "also this"}));
    }

    #[test]
    fn reminders_close_the_last_user_turn() {
        let reminders = vec!["3 calls left".to_string()];
        let b = body(&round_one(), &reminders, &[], &no_cache());
        let msgs = b["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3);
        let last = msgs[2]["content"].as_array().unwrap();
        assert_eq!(
            last.last().unwrap(),
            &json!({"type": "text", "text": "<system-reminder>3 calls left</system-reminder>"})
        );
        assert_eq!(last[0]["type"], "tool_result");
        // After an assistant turn, reminders open a user turn of their own.
        let b = body(
            &[Message::user("hi"), Message::assistant("yes")],
            &reminders,
            &[],
            &no_cache(),
        );
        assert_eq!(b["messages"][2]["role"], "user");
    }

    #[test]
    fn later_system_messages_stay_in_place() {
        let msgs = vec![
            Message::system("top"),
            Message::user("a"),
            Message::system("note"),
        ];
        let b = body(&msgs, &[], &[], &no_cache());
        assert_eq!(b["system"][0]["text"], "top");
        assert_eq!(
            b["messages"][0]["content"][1]["text"],
            "<system-reminder>note</system-reminder>"
        );
    }

    fn markers(v: &Value, path: &mut String, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if m.contains_key("cache_control") {
                    out.push(path.clone());
                }
                for (k, x) in m {
                    let len = path.len();
                    path.push('/');
                    path.push_str(k);
                    markers(x, path, out);
                    path.truncate(len);
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("/{i}"));
                    markers(x, path, out);
                    path.truncate(len);
                }
            }
            _ => {}
        }
    }

    fn breakpoints(b: &Value) -> Vec<String> {
        let mut out = Vec::new();
        markers(b, &mut String::new(), &mut out);
        out
    }

    #[test]
    fn breakpoints_on_tools_system_and_last_stable_turn() {
        let tools = [tool("a"), tool("b")];
        let reminders = vec!["r".to_string()];
        let b = body(&round_one(), &reminders, &tools, &config());
        assert_eq!(
            breakpoints(&b),
            vec![
                "/messages/0/content/0", // the previous round's last stable turn
                "/messages/2/content/1", // the last tool_result, not the reminder after it
                "/system/0",
                "/tools/1",
            ]
        );
        assert_eq!(b["tools"][1]["cache_control"], json!({"type": "ephemeral"}));
        assert!(
            b["messages"][2]["content"][2]
                .get("cache_control")
                .is_none()
        );
        assert!(breakpoints(&b).len() <= MAX_CACHE_BREAKPOINTS);
        assert!(breakpoints(&body(&round_one(), &reminders, &tools, &no_cache())).is_empty());
    }

    #[test]
    fn breakpoint_skips_thinking_blocks_and_a_first_turn_gets_one() {
        let msgs = vec![
            Message::user("q"),
            Message::Assistant(AssistantMessage {
                parts: vec![thinking_part()],
                tool_calls: vec![call("t1", "f", json!({}))],
                ..AssistantMessage::default()
            }),
        ];
        let b = body(&msgs, &[], &[], &config());
        assert_eq!(breakpoints(&b), vec!["/messages/1/content/1"]);
        let b = body(&[Message::user("q")], &["r".into()], &[], &config());
        assert_eq!(breakpoints(&b), vec!["/messages/0/content/0"]);
    }

    fn strip_markers(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("cache_control");
                m.values_mut().for_each(strip_markers);
            }
            Value::Array(a) => a.iter_mut().for_each(strip_markers),
            _ => {}
        }
    }

    #[test]
    fn prefix_is_stable_from_round_to_round() {
        let tools = [tool("read")];
        let round1 = round_one();
        let mut round2 = round1.clone();
        round2.push(Message::Assistant(AssistantMessage {
            tool_calls: vec![call("toolu_c", "read", json!({"x": "3"}))],
            ..AssistantMessage::default()
        }));
        round2.push(result("toolu_c", "third", false));
        let b1 = body(&round1, &["first reminder".into()], &tools, &config());
        let b2 = body(&round2, &["second reminder".into()], &tools, &config());

        // Tools and system: identical bytes, markers included.
        assert_eq!(b1["tools"].to_string(), b2["tools"].to_string());
        assert_eq!(b1["system"].to_string(), b2["system"].to_string());
        // Round 2 keeps a breakpoint exactly where round 1 wrote its last one.
        let last1 = b1["messages"].as_array().unwrap().len() - 1;
        let mut p = format!("/messages/{last1}/content/1");
        assert!(breakpoints(&b1).contains(&p));
        assert!(breakpoints(&b2).contains(&p));
        p.push_str("/cache_control");
        assert_eq!(b2.pointer(&p), Some(&json!({"type": "ephemeral"})));

        // Round 1's messages without their reminder are byte for byte the start of round 2's.
        let mut m1 = b1["messages"].clone();
        m1[last1]["content"].as_array_mut().unwrap().pop();
        let mut m2 = b2["messages"].clone();
        strip_markers(&mut m1);
        strip_markers(&mut m2);
        let n = m1.as_array().unwrap().len();
        let head: Vec<Value> = m2.as_array().unwrap()[..n].to_vec();
        assert_eq!(m1.to_string(), Value::Array(head).to_string());
        // The reminder is the very last block, and only the current one is present.
        let text = b2.to_string();
        assert!(!text.contains("first reminder"));
        let last = b2["messages"].as_array().unwrap().last().unwrap()["content"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        assert_eq!(
            last["text"],
            "<system-reminder>second reminder</system-reminder>"
        );
    }

    #[test]
    fn settings_and_extra_reach_the_body() {
        let settings = ModelSettings {
            model: Some("claude-other".into()),
            temperature: Some(0.7),
            max_output_tokens: Some(99),
            tool_choice: ToolChoice::Required,
            extra: Some(json!({"thinking": {"type": "enabled"}})),
        };
        let cfg = AnthropicConfig {
            extra: Some(json!({"thinking": {"budget_tokens": 1024}, "top_k": 5})),
            ..no_cache()
        };
        let tools = [tool("a")];
        let msgs = [Message::user("x")];
        let req = ModelRequest {
            messages: &msgs,
            reminders: &[],
            tools: &tools,
            settings: &settings,
            prefix_cache: None,
        };
        let b = build_request_body(&req, &cfg, true);
        assert_eq!(b["model"], "claude-other");
        assert_eq!(b["max_tokens"], 99);
        assert_eq!(b["temperature"], json!(0.7));
        assert_eq!(b["tool_choice"], json!({"type": "any"}));
        assert_eq!(b["stream"], true);
        assert_eq!(b["top_k"], 5);
        assert_eq!(
            b["thinking"],
            json!({"type": "enabled", "budget_tokens": 1024})
        );
        assert_eq!(b["tools"][0]["input_schema"]["type"], "object");
    }

    #[test]
    fn usage_counts_cache_tokens_as_input() {
        let r = decode_message(&json!({
            "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20},
        }))
        .unwrap();
        let u = r.usage.unwrap();
        assert_eq!(
            (
                u.input_tokens,
                u.cache_read_tokens,
                u.cache_write_tokens,
                u.output_tokens
            ),
            (130, 100, 20, 3)
        );
        assert_eq!(u.uncached_input_tokens(), 10);
    }

    #[test]
    fn server_tool_blocks_are_parts_not_calls_and_go_back() {
        let r = decode_message(&json!({
            "content": [
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                {"type": "text", "text": "found"},
            ],
            "stop_reason": "end_turn",
        }))
        .unwrap();
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.parts.len(), 2);
        assert_eq!(r.finish_reason, FinishReason::Stop);
        let msgs = vec![Message::user("q"), Message::Assistant(r.to_message())];
        let b = body(&msgs, &[], &[], &no_cache());
        let content = b["messages"][1]["content"].as_array().unwrap();
        assert_eq!(content[0]["type"], "server_tool_use");
        assert_eq!(content[1]["type"], "web_search_tool_result");
        assert_eq!(content[2]["text"], "found");
    }

    #[test]
    fn max_tokens_inside_a_tool_call_marks_it_unrunnable() {
        let r = decode_message(&json!({
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}],
            "stop_reason": "max_tokens",
        }))
        .unwrap();
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert_eq!(
            r.tool_calls[0].invalid_arguments.as_deref(),
            Some("{\"a\":1}")
        );
        // Streamed: a call cut before any argument text is left out.
        let sse = "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n\n\
                   data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\n\
                   data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":5}}\n\n\
                   data: {\"type\":\"message_stop\"}\n\n";
        let d = decode_recorded(200, sse.as_bytes(), true);
        assert!(d.error.is_none());
        assert!(d.response.tool_calls.is_empty());
        assert_eq!(d.response.finish_reason, FinishReason::Length);
    }

    #[test]
    fn stream_error_event_and_truncated_stream() {
        let sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n\n\
                   event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        let d = decode_recorded(200, sse.as_bytes(), true);
        let e = d.error.unwrap();
        assert_eq!(e.error_type.as_deref(), Some("overloaded_error"));
        assert!(e.retryable);
        let d = decode_recorded(
            200,
            b"data: {\"type\":\"message_start\",\"message\":{}}\n\n",
            true,
        );
        assert!(d.error.unwrap().message.contains("before message_stop"));
    }

    #[test]
    fn errors_are_typed() {
        let h = HeaderMap::new();
        let e = parse_error(
            529,
            &h,
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        assert_eq!(
            (e.error_type.as_deref(), e.retryable),
            (Some("overloaded_error"), true)
        );
        let e = parse_error(401, &h, b"");
        assert_eq!(
            (e.error_type.as_deref(), e.retryable),
            (Some("authentication_error"), false)
        );
        let e = parse_error(413, &h, b"<html>too big</html>");
        assert_eq!(e.error_type.as_deref(), Some("request_too_large"));
        assert!(e.message.contains("too big"));
        for s in [429, 500, 503] {
            assert!(parse_error(s, &h, b"{}").retryable, "{s}");
        }
        for s in [400, 403, 404] {
            assert!(!parse_error(s, &h, b"{}").retryable, "{s}");
        }
    }

    #[test]
    fn config_from_vars() {
        let vars = |k: &str| match k {
            "ANTHROPIC_API_KEY" => Some("sk-1".to_string()),
            _ => None,
        };
        let c = AnthropicConfig::from_vars("claude-x", vars).unwrap();
        assert_eq!(c.messages_url(), "https://api.anthropic.com/v1/messages");
        assert_eq!(c.headers().unwrap()["x-api-key"], "sk-1");
        assert_eq!(c.headers().unwrap()["anthropic-version"], DEFAULT_VERSION);
        let err = AnthropicConfig::from_vars("claude-x", |_| None).unwrap_err();
        assert!(err.to_string().contains("ANTHROPIC_API_KEY"));
        let local = AnthropicConfig::from_vars("m", |k| {
            (k == "ANTHROPIC_BASE_URL").then(|| "http://127.0.0.1:9/v1/".to_string())
        })
        .unwrap();
        assert_eq!(local.messages_url(), "http://127.0.0.1:9/v1/messages");
    }
}
