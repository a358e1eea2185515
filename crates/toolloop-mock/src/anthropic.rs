//! Anthropic Messages, server side: `POST /v1/messages`.

use std::fmt;

use axum::http::{HeaderMap, StatusCode};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Shared;
use super::engine::{self, Ledger, OfferedTool, Problem, Progress, Reply, Str, pieces_with_cut};
use super::fault::{Drawn, FaultKind, Protocol};
use super::response::{ArgsOnWire, Payload, Prepared, SseWriter};
use super::scenario::Scenario;

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: Str<'a>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(borrow)]
    messages: Vec<InMessage<'a>>,
    #[serde(default, borrow)]
    tools: Option<Vec<InTool<'a>>>,
    #[serde(default, borrow)]
    tool_choice: Option<ToolChoice<'a>>,
    #[serde(default)]
    stream: Option<bool>,
    /// Structured outputs: `{"format": {"type": "json_schema", "schema": …}}`.
    #[serde(default)]
    output_config: Option<Value>,
    /// The beta spelling: `{"type": "json_schema", "schema": …}`.
    #[serde(default)]
    output_format: Option<Value>,
    /// Context editing by the server (see [`super::native`]).
    #[serde(default)]
    context_management: Option<Value>,
}

impl Request<'_> {
    /// The JSON Schema the answer must match, when the request asks for one.
    fn output_schema(&self) -> Option<&Value> {
        let format = self
            .output_config
            .as_ref()
            .and_then(|c| c.get("format"))
            .or(self.output_format.as_ref())?;
        if format.get("type").and_then(Value::as_str) != Some("json_schema") {
            return None;
        }
        format.get("schema").filter(|s| s.is_object())
    }
}

#[derive(Deserialize)]
struct ToolChoice<'a> {
    #[serde(rename = "type", borrow)]
    kind: Str<'a>,
    #[serde(default, borrow)]
    name: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct InMessage<'a> {
    #[serde(borrow)]
    role: Str<'a>,
    #[serde(borrow)]
    content: Content<'a>,
}

/// A message's content: a plain string or a list of blocks.
enum Content<'a> {
    Text,
    Blocks(Vec<Block<'a>>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContentVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for ContentVisitor<'a> {
            type Value = Content<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Content::Text)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut blocks = Vec::with_capacity(seq.size_hint().unwrap_or(2));
                while let Some(block) = seq.next_element()? {
                    blocks.push(block);
                }
                Ok(Content::Blocks(blocks))
            }
        }
        deserializer.deserialize_any(ContentVisitor(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", borrow)]
    kind: Str<'a>,
    #[serde(default, borrow)]
    id: Option<Str<'a>>,
    #[serde(default, borrow)]
    name: Option<Str<'a>>,
    #[serde(default, borrow)]
    tool_use_id: Option<Str<'a>>,
    /// An `image` block's source.
    #[serde(default)]
    source: Option<Value>,
    /// A `tool_result` block's content: a string, or `text` and `image` blocks.
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Deserialize)]
struct InTool<'a> {
    #[serde(borrow)]
    name: Str<'a>,
    #[serde(rename = "type", default, borrow)]
    kind: Option<Str<'a>>,
    #[serde(default)]
    input_schema: Option<Value>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

/// An error in Anthropic's shape.
pub(crate) fn error(status: StatusCode, message: &str) -> Prepared {
    let kind = match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    };
    Prepared::json(
        status,
        &ErrorBody {
            kind: "error",
            error: ErrorDetail { kind, message },
        },
    )
}

/// Checks an `image` block's source: `base64` data of its `media_type`, or an http(s) `url`.
fn check_image(source: Option<&Value>) -> Result<(), String> {
    let field = |name: &str| {
        source
            .and_then(|s| s.get(name))
            .and_then(Value::as_str)
            .ok_or_else(|| format!("Field required: `{name}`"))
    };
    match field("type")? {
        "base64" => super::image::check_data(field("media_type")?, field("data")?),
        "url" => super::image::check_web_url(field("url")?),
        other => Err(format!(
            "Input tag '{other}' found using 'type' does not match any of the expected tags: \
             'base64', 'url'"
        )),
    }
}

fn bad(message: &str) -> Prepared {
    error(StatusCode::BAD_REQUEST, message)
}

/// Answers one request body.
pub(crate) fn handle(shared: &Shared, headers: &HeaderMap, body: &[u8]) -> Prepared {
    if !headers.contains_key("anthropic-version") {
        return bad("anthropic-version: header is required");
    }
    let request: Request<'_> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad(&format!("The request body could not be read: {e}")),
    };
    if request.max_tokens.is_none() {
        return bad("max_tokens: Field required");
    }
    let scenario = match engine::native_scenario(&request.model) {
        Ok(s) => s,
        Err(message) => return bad(&message),
    };
    let progress = match walk(&request.messages) {
        Ok(p) => engine::read_summaries(p, body),
        Err(prepared) => return prepared,
    };
    // A model or server without context management refuses the field or its beta.
    if scenario.refuse_context {
        let beta = headers
            .get_all("anthropic-beta")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|b| b.trim() == super::native::ANTHROPIC_BETA);
        if request.context_management.is_some() {
            shared.saw_quirk();
            return bad("context_management: Extra inputs are not permitted");
        }
        if beta {
            shared.saw_quirk();
            return bad(&format!(
                "Unexpected value(s) `{}` for the `anthropic-beta` header. Please consult our \
                 documentation at docs.anthropic.com or try again without the header.",
                super::native::ANTHROPIC_BETA
            ));
        }
    }
    // Context editing by the server: the request counts as what is left once it is applied.
    let cleared = match super::native::anthropic(headers, body, request.context_management.as_ref())
    {
        Ok(c) => c,
        Err(message) => return bad(&message),
    };
    let counted = body.len() - cleared.as_ref().map_or(0, |c| c.bytes.min(body.len()));
    if let Some((tokens, window)) = engine::over_window(shared, &scenario, counted) {
        return bad(&format!(
            "prompt is too long: {tokens} tokens > {window} maximum"
        ));
    }
    if request.output_schema().is_some() {
        shared.saw_output_schema();
    }
    let fault = shared
        .faults
        .draw(&scenario, Protocol::Anthropic, "anthropic", body);
    if let Some(early) = fault.and_then(|d| Prepared::early_fault(d, &scenario, error)) {
        return early;
    }
    let (allow, named) = match &request.tool_choice {
        Some(choice) if choice.kind == "none" => (false, None),
        Some(choice) if choice.kind == "tool" => (true, choice.name.as_deref()),
        _ => (true, None),
    };
    let tools: Vec<OfferedTool<'_>> = request
        .tools
        .iter()
        .flatten()
        .filter(|_| allow)
        // Server tools (web search and the like) carry a versioned type and no schema.
        .filter(|t| t.kind.as_deref().is_none_or(|k| k == "custom"))
        .filter(|t| named.is_none_or(|n| n == t.name))
        .map(|t| OfferedTool {
            name: &t.name,
            schema: t.input_schema.as_ref(),
        })
        .collect();
    let applied = cleared.map(|c| {
        shared.count_native_clear();
        c.report
    });
    reply(
        shared,
        &request,
        &scenario,
        &tools,
        progress,
        (counted, applied),
        fault,
    )
}

/// Checks that every `tool_use` is answered by exactly one `tool_result` in the next user
/// message, results first, and works out where the task stands.
fn walk(messages: &[InMessage<'_>]) -> Result<Progress, Prepared> {
    if messages.is_empty() {
        return Err(bad("messages: at least one message is required"));
    }
    let mut progress = Progress::default();
    let mut ledger = Ledger::default();
    for (i, message) in messages.iter().enumerate() {
        let blocks: &[Block<'_>] = match &message.content {
            Content::Text => &[],
            Content::Blocks(blocks) => blocks,
        };
        match message.role.as_ref() {
            "user" => {
                let answering = ledger.is_open();
                let turn = ledger.turn;
                let mut other_seen = false;
                let mut results = 0;
                let mut images = 0u32;
                for (j, block) in blocks.iter().enumerate() {
                    if block.kind == "image" {
                        check_image(block.source.as_ref())
                            .map_err(|e| bad(&format!("messages.{i}.content.{j}.source: {e}")))?;
                        images = images.saturating_add(1);
                    }
                    if block.kind != "tool_result" {
                        other_seen = true;
                        continue;
                    }
                    let id = block.tool_use_id.as_deref().unwrap_or("");
                    if !answering {
                        return Err(bad(&format!(
                            "messages.{i}.content.{j}: unexpected `tool_use_id` found in \
                             `tool_result` blocks: {id}. Each `tool_result` block must have a \
                             corresponding `tool_use` block in the previous message."
                        )));
                    }
                    if other_seen {
                        return Err(bad(&format!(
                            "messages.{i}.content.{j}: `tool_result` blocks must come first in \
                             the content of the user message that answers tool calls; put any \
                             text after all of them."
                        )));
                    }
                    if let Some(Value::Array(inner)) = &block.content {
                        for (k, b) in inner.iter().enumerate() {
                            let at = format!("messages.{i}.content.{j}.content.{k}");
                            match b.get("type").and_then(Value::as_str) {
                                Some("text") => {}
                                Some("image") => {
                                    check_image(b.get("source"))
                                        .map_err(|e| bad(&format!("{at}.source: {e}")))?;
                                    images = images.saturating_add(1);
                                }
                                other => {
                                    return Err(bad(&format!(
                                        "{at}.type: Input tag '{}' found using 'type' does not \
                                         match any of the expected tags: 'text', 'image', \
                                         'document', 'search_result'",
                                        other.unwrap_or("")
                                    )));
                                }
                            }
                        }
                    }
                    match ledger.answer(id) {
                        Ok(()) => {}
                        Err(Problem::Twice(id)) => {
                            return Err(bad(&format!(
                                "messages.{i}.content.{j}: `tool_use` id {id} is answered by more \
                                 than one `tool_result` block. Each `tool_use` block must have \
                                 exactly one corresponding `tool_result` block."
                            )));
                        }
                        Err(_) => {
                            return Err(bad(&format!(
                                "messages.{i}.content.{j}: unexpected `tool_use_id` found in \
                                 `tool_result` blocks: {id}. Each `tool_result` block must have \
                                 a corresponding `tool_use` block in the previous message \
                                 (messages.{turn})."
                            )));
                        }
                    }
                    results += 1;
                }
                if answering {
                    close(&mut ledger)?;
                    for _ in 0..results {
                        progress.tool_result();
                    }
                } else {
                    progress.user_text();
                }
                progress.user_images(images);
            }
            "assistant" => {
                if ledger.is_open() {
                    close(&mut ledger)?;
                }
                let calls = blocks.iter().filter(|b| b.kind == "tool_use");
                if calls.clone().next().is_some() {
                    let keys = calls.map(|b| {
                        (
                            b.id.as_deref().unwrap_or(""),
                            b.name.as_deref().unwrap_or(""),
                        )
                    });
                    if let Err(Problem::DuplicateId(id)) = ledger.open(i, keys, true) {
                        return Err(bad(&format!(
                            "messages.{i}.content: `tool_use` ids must be unique; {id} appears \
                             more than once."
                        )));
                    }
                    progress.tool_calls();
                } else {
                    progress.assistant_text();
                }
            }
            other => {
                return Err(bad(&format!(
                    "messages.{i}.role: Input should be 'user' or 'assistant', got '{other}'"
                )));
            }
        }
    }
    if ledger.is_open() {
        close(&mut ledger)?;
    }
    Ok(progress)
}

fn close(ledger: &mut Ledger<'_>) -> Result<(), Prepared> {
    let turn = ledger.turn;
    match ledger.close() {
        Ok(()) => Ok(()),
        Err(Problem::Missing(ids)) => Err(bad(&format!(
            "messages.{turn}: `tool_use` ids were found without `tool_result` blocks immediately \
             after: {}. Each `tool_use` block must have a corresponding `tool_result` block in \
             the next message.",
            engine::join(&ids)
        ))),
        Err(other) => Err(bad(&format!("messages.{turn}: {other:?}"))),
    }
}

// ---- responses ----

#[derive(Serialize, Clone, Copy)]
struct Usage {
    input_tokens: u64,
    output_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutBlock<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
}

#[derive(Serialize)]
struct Message<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: &'a [OutBlock<'a>],
    stop_reason: Option<&'static str>,
    stop_sequence: Option<()>,
    usage: Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    context_management: Option<&'a Value>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event<'a> {
    MessageStart {
        message: Message<'a>,
    },
    Ping,
    ContentBlockStart {
        index: usize,
        content_block: OutBlock<'a>,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta<'a>,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: OutputUsage,
        #[serde(skip_serializing_if = "Option::is_none")]
        context_management: Option<&'a Value>,
    },
    MessageStop,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta<'a> {
    TextDelta { text: &'a str },
    InputJsonDelta { partial_json: &'a str },
}

#[derive(Serialize)]
struct MessageDelta {
    stop_reason: &'static str,
    stop_sequence: Option<()>,
}

#[derive(Serialize)]
struct OutputUsage {
    output_tokens: u64,
}

fn reply(
    shared: &Shared,
    request: &Request<'_>,
    scenario: &Scenario,
    tools: &[OfferedTool<'_>],
    progress: Progress,
    (body_len, applied): (usize, Option<Value>),
    fault: Option<Drawn>,
) -> Prepared {
    let cut = fault.is_some_and(|d| d.kind == FaultKind::CutCall);
    let reply = engine::plan(
        scenario,
        tools,
        progress,
        "toolu_mock",
        &shared.ids,
        shared.scripted(),
        request.output_schema(),
    );
    let (input_tokens, output_tokens) = engine::usage(body_len, &reply);
    let usage = Usage {
        input_tokens,
        output_tokens,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 0,
    };
    let id = format!("msg_mock{:016x}", shared.next_response_id());
    let model = request.model.as_ref();
    let stop_reason = match reply {
        Reply::Calls(_) => "tool_use",
        Reply::Text(_) => "end_turn",
    };
    let payload = if request.stream == Some(true) {
        let mut sse = SseWriter::new(false);
        let event = |sse: &mut SseWriter, name: &str, event: Event<'_>| {
            sse.event(Some(name), &event);
        };
        let start_usage = Usage {
            output_tokens: 1,
            ..usage
        };
        event(
            &mut sse,
            "message_start",
            Event::MessageStart {
                message: Message {
                    id: &id,
                    kind: "message",
                    role: "assistant",
                    model,
                    content: &[],
                    stop_reason: None,
                    stop_sequence: None,
                    usage: start_usage,
                    context_management: None,
                },
            },
        );
        event(&mut sse, "ping", Event::Ping);
        match &reply {
            Reply::Text(text) => {
                let block = OutBlock::Text { text: "" };
                event(
                    &mut sse,
                    "content_block_start",
                    Event::ContentBlockStart {
                        index: 0,
                        content_block: block,
                    },
                );
                for piece in pieces_with_cut(text, scenario.chunk, cut) {
                    let Some(piece) = piece else {
                        sse.mark();
                        continue;
                    };
                    let delta = BlockDelta::TextDelta { text: piece };
                    event(
                        &mut sse,
                        "content_block_delta",
                        Event::ContentBlockDelta { index: 0, delta },
                    );
                }
                event(
                    &mut sse,
                    "content_block_stop",
                    Event::ContentBlockStop { index: 0 },
                );
            }
            Reply::Calls(calls) => {
                let empty = Value::Object(Default::default());
                for (index, call) in calls.iter().enumerate() {
                    let block = OutBlock::ToolUse {
                        id: &call.id,
                        name: call.name,
                        input: &empty,
                    };
                    event(
                        &mut sse,
                        "content_block_start",
                        Event::ContentBlockStart {
                            index,
                            content_block: block,
                        },
                    );
                    let first = cut && index == 0;
                    for piece in pieces_with_cut(&call.arguments_json, scenario.chunk, first) {
                        let Some(piece) = piece else {
                            sse.mark();
                            continue;
                        };
                        let delta = BlockDelta::InputJsonDelta {
                            partial_json: piece,
                        };
                        event(
                            &mut sse,
                            "content_block_delta",
                            Event::ContentBlockDelta { index, delta },
                        );
                    }
                    event(
                        &mut sse,
                        "content_block_stop",
                        Event::ContentBlockStop { index },
                    );
                }
            }
        }
        event(
            &mut sse,
            "message_delta",
            Event::MessageDelta {
                delta: MessageDelta {
                    stop_reason,
                    stop_sequence: None,
                },
                usage: OutputUsage { output_tokens },
                context_management: applied.as_ref(),
            },
        );
        event(&mut sse, "message_stop", Event::MessageStop);
        Payload::Sse(sse)
    } else {
        let content: Vec<OutBlock<'_>> = match &reply {
            Reply::Text(text) => vec![OutBlock::Text { text }],
            Reply::Calls(calls) => calls
                .iter()
                .map(|c| OutBlock::ToolUse {
                    id: &c.id,
                    name: c.name,
                    input: &c.arguments,
                })
                .collect(),
        };
        let message = Message {
            id: &id,
            kind: "message",
            role: "assistant",
            model,
            content: &content,
            stop_reason: Some(stop_reason),
            stop_sequence: None,
            usage,
            context_management: applied.as_ref(),
        };
        Payload::Json(super::response::to_vec(&message))
    };
    Prepared::answer(payload, shared, scenario, fault, &reply, ArgsOnWire::Object)
}
