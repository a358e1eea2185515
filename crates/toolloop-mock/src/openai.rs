//! OpenAI Chat Completions, server side: `POST /v1/chat/completions`.

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Shared;
use super::engine::{self, Ledger, OfferedTool, Problem, Progress, Reply, Str, pieces_with_cut};
use super::fault::{Drawn, FaultKind, Protocol};
use super::response::{ArgsOnWire, Payload, Prepared, SseWriter};
use super::scenario::{DropTools, Scenario};
use super::text::{self, CatalogTool};
use toolloop::model::ToolSpec;
use toolloop::ptk;

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: Str<'a>,
    #[serde(borrow)]
    messages: Vec<InMessage<'a>>,
    #[serde(default, borrow)]
    tools: Option<Vec<InTool<'a>>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    response_format: Option<Value>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct InMessage<'a> {
    #[serde(borrow)]
    role: Str<'a>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<InCall<'a>>>,
    #[serde(default, borrow)]
    tool_call_id: Option<Str<'a>>,
    /// Read for images, and in text-only mode.
    #[serde(default)]
    content: Option<Value>,
}

/// The images of a user message's content (`image_url` parts), each checked.
fn user_images(message: &InMessage<'_>, i: usize) -> Result<u32, Prepared> {
    let Some(Value::Array(parts)) = &message.content else {
        return Ok(0);
    };
    let mut n = 0u32;
    for (j, part) in parts.iter().enumerate() {
        match part.get("type").and_then(Value::as_str) {
            // Parts the API takes that the mock does not look into.
            Some("text" | "input_audio" | "file") => {}
            Some("image_url") => {
                let url = part
                    .pointer("/image_url/url")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if let Err(reason) = super::image::check_url(url) {
                    return Err(bad(
                        &format!("Invalid image in messages[{i}].content[{j}]: {reason}."),
                        Some(&format!("messages.[{i}].content.[{j}].image_url.url")),
                    ));
                }
                n = n.saturating_add(1);
            }
            other => {
                return Err(bad(
                    &format!(
                        "Invalid value: '{}' in messages[{i}].content[{j}].type. Supported \
                         values are: 'text', 'image_url', 'input_audio' and 'file'.",
                        other.unwrap_or("")
                    ),
                    Some(&format!("messages.[{i}].content.[{j}].type")),
                ));
            }
        }
    }
    Ok(n)
}

impl InMessage<'_> {
    /// The text of `content`: a string, or the `text` parts of an array.
    fn text(&self) -> String {
        match &self.content {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
            _ => String::new(),
        }
    }
}

#[derive(Deserialize)]
struct InCall<'a> {
    #[serde(borrow)]
    id: Str<'a>,
    #[serde(borrow)]
    function: InFunctionRef<'a>,
}

#[derive(Deserialize)]
struct InFunctionRef<'a> {
    #[serde(borrow)]
    name: Str<'a>,
}

#[derive(Deserialize)]
struct InTool<'a> {
    #[serde(default, borrow)]
    function: Option<InFunction<'a>>,
}

#[derive(Deserialize)]
struct InFunction<'a> {
    #[serde(borrow)]
    name: Str<'a>,
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

/// The error of a fault drawn to replace the answer (see [`Prepared::early_fault`]), as OpenAI's
/// APIs write it: a 429 says `rate_limit_exceeded`.
pub(crate) fn early_fault(drawn: Drawn, scenario: &Scenario) -> Option<Prepared> {
    Prepared::early_fault(drawn, scenario, |status, message| {
        let code = (status == StatusCode::TOO_MANY_REQUESTS).then_some("rate_limit_exceeded");
        error(status, message, None, code)
    })
}

/// An error in OpenAI's shape.
pub(crate) fn error(
    status: StatusCode,
    message: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Prepared {
    let kind = match status.as_u16() {
        404 => "not_found_error",
        429 => "requests",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    };
    Prepared::json(
        status,
        &ErrorBody {
            error: ErrorDetail {
                message,
                kind,
                param,
                code,
            },
        },
    )
}

/// What Chat Completions answers to a request over the model's context window.
fn context_length_exceeded(tokens: u64, window: u64) -> Prepared {
    let message = format!(
        "This model's maximum context length is {window} tokens. However, your messages \
         resulted in {tokens} tokens. Please reduce the length of the messages."
    );
    error(
        StatusCode::BAD_REQUEST,
        &message,
        Some("messages"),
        Some("context_length_exceeded"),
    )
}

fn bad(message: &str, param: Option<&str>) -> Prepared {
    error(StatusCode::BAD_REQUEST, message, param, None)
}

/// The scenario the model name asks for, or the OpenAI-shaped 400 that names what is wrong
/// with it (the Chat Completions and Responses APIs answer alike).
pub(crate) fn scenario(model: &str) -> Result<Scenario, Prepared> {
    Scenario::from_model(model).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            &e.message,
            Some("model"),
            Some("invalid_scenario"),
        )
    })
}

/// Answers one request body.
pub(crate) fn handle(shared: &Shared, body: &[u8]) -> Prepared {
    let request: Request<'_> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return bad(
                &format!("We could not parse the JSON body of your request: {e}"),
                None,
            );
        }
    };
    let scenario = match scenario(&request.model) {
        Ok(s) => s,
        Err(answer) => return answer,
    };
    let mut request = request;
    let mut body_len = body.len();
    if let Some(quirk) = quirk(&scenario, &mut request, body, &mut body_len) {
        shared.saw_quirk();
        if let Some(answer) = quirk {
            return answer;
        }
    }
    let offers_tools = request.tools.as_ref().is_some_and(|t| !t.is_empty());
    if scenario.text_calls.is_some() && !scenario.accept_tools && offers_tools {
        // What Ollama answers for a model without tool support.
        let message = format!(
            "registry.ollama.ai/library/{} does not support tools",
            request.model
        );
        return error(StatusCode::BAD_REQUEST, &message, None, None);
    }
    // Text-only mode without a `tools` parameter: the tools are those of the catalog the client
    // wrote into its system prompt.
    let catalog: Vec<CatalogTool> = match scenario.text_calls {
        Some(_) if !offers_tools => request
            .messages
            .iter()
            .filter(|m| m.role == "system" || m.role == "developer")
            .map(|m| text::read_catalog(&m.text()))
            .find(|tools| !tools.is_empty())
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let text_mode = scenario.text_calls.map(|_| {
        if offers_tools {
            request
                .tools
                .iter()
                .flatten()
                .filter_map(|t| t.function.as_ref())
                .map(|f| ToolSpec {
                    name: f.name.to_string(),
                    description: String::new(),
                    parameters: f
                        .parameters
                        .clone()
                        .unwrap_or_else(|| serde_json::json!({})),
                })
                .collect()
        } else {
            catalog.iter().map(|t| t.spec.clone()).collect::<Vec<_>>()
        }
    });
    let progress = match walk(&request.messages, text_mode.as_deref()) {
        Ok(p) => engine::read_summaries(p, body),
        Err(prepared) => return prepared,
    };
    let output = match output_schema(request.response_format.as_ref()) {
        Ok(o) => o,
        Err(prepared) => return prepared,
    };
    if let Some((tokens, window)) = engine::over_window(shared, &scenario, body.len()) {
        return context_length_exceeded(tokens, window);
    }
    if output.is_some() {
        shared.saw_output_schema();
    }
    let fault = shared
        .faults
        .draw(&scenario, Protocol::OpenAi, "openai", body);
    if let Some(early) = fault.and_then(|d| early_fault(d, &scenario)) {
        return early;
    }
    let ctx = Ctx {
        request: &request,
        scenario: &scenario,
        output,
        progress,
        body_len,
        fault,
    };

    let named = match &request.tool_choice {
        Some(Value::String(s)) if s == "none" => {
            return reply(shared, &ctx, &[]);
        }
        Some(choice) => choice.pointer("/function/name").and_then(Value::as_str),
        None => None,
    };
    let mut tools: Vec<OfferedTool<'_>> = request
        .tools
        .iter()
        .flatten()
        .filter_map(|t| t.function.as_ref())
        .filter(|f| named.is_none_or(|n| n == f.name))
        .map(|f| OfferedTool {
            name: &f.name,
            schema: f.parameters.as_ref(),
        })
        .collect();
    tools.extend(catalog.iter().map(|t| OfferedTool {
        name: &t.spec.name,
        schema: Some(&t.arguments),
    }));
    reply(shared, &ctx, &tools)
}

/// Plays the quirks of real servers that the scenario asks for. `None`: none applies;
/// `Some(Some(reply))`: the request is answered so (an empty stream, an error);
/// `Some(None)`: the request was changed (its tools dropped, `body_len` without them) and goes
/// on.
fn quirk(
    scenario: &Scenario,
    request: &mut Request<'_>,
    body: &[u8],
    body_len: &mut usize,
) -> Option<Option<Prepared>> {
    let offers_tools = request.tools.as_ref().is_some_and(|t| !t.is_empty());
    let auto = matches!(&request.tool_choice, Some(Value::String(c)) if c == "auto");
    if scenario.refuse_auto_stream && offers_tools && auto && request.stream == Some(true) {
        // llama-cpp-python: "Automatic streaming tool choice is not supported", raised after
        // the stream's head was sent.
        return Some(Some(Prepared::ok(
            Payload::Sse(SseWriter::new(false)),
            std::time::Duration::ZERO,
            std::time::Duration::ZERO,
        )));
    }
    let json_schema = request
        .response_format
        .as_ref()
        .and_then(|f| f.get("type"))
        .and_then(Value::as_str)
        == Some("json_schema");
    if scenario.refuse_json_schema && json_schema {
        // llama-cpp-python answers a request it cannot validate with a 500.
        let message = "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', \
                       'response_format', 'type'), 'msg': \"Input should be 'text' or \
                       'json_object'\", 'input': 'json_schema', 'ctx': {'expected': \"'text' or \
                       'json_object'\"}}";
        return Some(Some(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            message,
            None,
            None,
        )));
    }
    let drop = match scenario.drop_tools {
        DropTools::Never => false,
        DropTools::Always => offers_tools,
        DropTools::WithoutChoice => offers_tools && request.tool_choice.is_none(),
    };
    if !drop {
        return None;
    }
    // The prompt holds no catalog: the tokens are counted without it.
    let tools_len = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("tools").map(|t| t.to_string().len()))
        .unwrap_or(0);
    *body_len = body_len.saturating_sub(tools_len);
    request.tools = None;
    request.tool_choice = None;
    Some(None)
}

/// The schema of a `response_format` of type `json_schema`, checked as OpenAI checks it: a
/// schema is required, and `strict: true` needs every object closed with all its properties
/// required. Other formats (`text`, `json_object`) ask for no schema.
fn output_schema(format: Option<&Value>) -> Result<Option<&Value>, Prepared> {
    let Some(format) = format else {
        return Ok(None);
    };
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Ok(None);
    }
    let param = Some("response_format");
    let spec = format.get("json_schema");
    let name = spec
        .and_then(|s| s.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name.is_empty() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "Missing required parameter: 'response_format.json_schema.name'.",
            param,
            Some("missing_required_parameter"),
        ));
    }
    let Some(schema) = spec.and_then(|s| s.get("schema")).filter(|s| s.is_object()) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "Missing required parameter: 'response_format.json_schema.schema'.",
            param,
            Some("missing_required_parameter"),
        ));
    };
    let strict = spec.and_then(|s| s.get("strict")) == Some(&Value::Bool(true));
    if strict && let Some(problem) = engine::strict_problem(schema, "()") {
        return Err(error(
            StatusCode::BAD_REQUEST,
            &format!("Invalid schema for response_format '{name}': {problem}"),
            param,
            None,
        ));
    }
    Ok(Some(schema))
}

/// What [`reply`] needs besides the tools.
struct Ctx<'r, 'a> {
    request: &'r Request<'a>,
    scenario: &'r Scenario,
    /// The JSON Schema of `response_format`, when the request asks for one.
    output: Option<&'r Value>,
    progress: Progress,
    body_len: usize,
    fault: Option<Drawn>,
}

/// Checks that every tool call is answered exactly once, right after the assistant message that
/// made it, and works out where the task stands.
///
/// In text-only mode (`text_tools` given: the tools the calls are read with), an assistant
/// message may also make its calls in its text (read with [`ptk::parse_reply`]), and a user
/// message starting `PTK_RESULT:` answers them, one `PTK_RESULT: NAME (call id: ID)` header per
/// call: every call must be answered exactly once, by name, in the message right after it.
fn walk(messages: &[InMessage<'_>], text_tools: Option<&[ToolSpec]>) -> Result<Progress, Prepared> {
    if messages.is_empty() {
        return Err(bad(
            "Invalid 'messages': empty array. Expected an array with minimum length 1.",
            Some("messages"),
        ));
    }
    // The texts, and the names of the calls written in assistant texts (text-only mode).
    let texts: Vec<String> = match text_tools {
        Some(_) => messages.iter().map(InMessage::text).collect(),
        None => Vec::new(),
    };
    let text_calls: Vec<Vec<String>> = match text_tools {
        Some(tools) => messages
            .iter()
            .zip(&texts)
            .map(|(m, t)| {
                if m.role == "assistant" && m.tool_calls.as_ref().is_none_or(Vec::is_empty) {
                    ptk::parse_reply(t, tools)
                        .calls
                        .into_iter()
                        .map(|c| c.name)
                        .collect()
                } else {
                    Vec::new()
                }
            })
            .collect(),
        None => Vec::new(),
    };
    let mut progress = Progress::default();
    let mut ledger = Ledger::default();
    let mut ledger_is_text = false;
    for (i, message) in messages.iter().enumerate() {
        if let Some(text) = texts
            .get(i)
            .filter(|t| message.role == "user" && text::is_results(t))
        {
            if !(ledger.is_open() && ledger_is_text) {
                return Err(bad(
                    &format!(
                        "Invalid parameter: messages[{i}] holds tool results ({}) but does not \
                         follow an assistant message that wrote tool calls in its text. A \
                         results message must answer the calls of the assistant message right \
                         before it.",
                        text::RESULT
                    ),
                    Some(&format!("messages.[{i}].content")),
                ));
            }
            let turn = ledger.turn;
            let headers = text::result_headers(text).map_err(|line| {
                bad(
                    &format!(
                        "Invalid parameter: messages[{i}] has a result header that does not \
                         read: `{line}`; expected `{} NAME (call id: ID)`.",
                        text::RESULT
                    ),
                    Some(&format!("messages.[{i}].content")),
                )
            })?;
            let mut ids: Vec<&str> = Vec::new();
            for (name, id) in headers {
                if ids.contains(&id) {
                    return Err(bad(
                        &format!(
                            "Invalid parameter: messages[{i}] answers call id '{id}' twice; \
                             each call of messages[{turn}] must be answered exactly once."
                        ),
                        Some("messages"),
                    ));
                }
                ids.push(id);
                if let Err(problem) = ledger.answer_by_name(name) {
                    return Err(text_problem_error(problem, turn, i));
                }
                progress.tool_result();
            }
            if let Err(problem) = ledger.close() {
                return Err(text_problem_error(problem, turn, i));
            }
            // The results' images come with them (prompt-based calling).
            progress.user_images(user_images(message, i)?);
            continue;
        }
        if message.role == "tool" {
            if !ledger.is_open() {
                return Err(bad(
                    &format!(
                        "Invalid parameter: messages[{i}] has role 'tool' but does not follow an \
                         assistant message with 'tool_calls' (or the tool messages that answer \
                         it). A 'tool' message must answer a call of the assistant message \
                         right before it."
                    ),
                    Some(&format!("messages.[{i}].role")),
                ));
            }
            let Some(id) = message.tool_call_id.as_deref() else {
                return Err(bad(
                    &format!(
                        "Missing required parameter: 'messages[{i}].tool_call_id'. A 'tool' \
                         message must carry the id of the call it answers."
                    ),
                    Some(&format!("messages.[{i}].tool_call_id")),
                ));
            };
            if let Err(problem) = ledger.answer(id) {
                return Err(problem_error(problem, ledger.turn, i));
            }
            progress.tool_result();
            continue;
        }
        if ledger.is_open() {
            let turn = ledger.turn;
            if let Err(problem) = ledger.close() {
                return Err(if ledger_is_text {
                    text_problem_error(problem, turn, i)
                } else {
                    problem_error(problem, turn, i)
                });
            }
        }
        match message.role.as_ref() {
            "assistant" => match message.tool_calls.as_deref() {
                Some(calls) if !calls.is_empty() => {
                    let keys = calls
                        .iter()
                        .map(|c| (c.id.as_ref(), c.function.name.as_ref()));
                    if let Err(problem) = ledger.open(i, keys, true) {
                        return Err(problem_error(problem, i, i));
                    }
                    ledger_is_text = false;
                    progress.tool_calls();
                }
                _ => match text_calls.get(i).filter(|c| !c.is_empty()) {
                    Some(names) => {
                        let keys = names.iter().map(|n| (n.as_str(), n.as_str()));
                        if let Err(problem) = ledger.open(i, keys, false) {
                            return Err(text_problem_error(problem, i, i));
                        }
                        ledger_is_text = true;
                        progress.tool_calls();
                    }
                    None => progress.assistant_text(),
                },
            },
            "user" => {
                progress.user_text();
                progress.user_images(user_images(message, i)?);
            }
            "system" | "developer" => {}
            other => {
                return Err(bad(
                    &format!(
                        "Invalid value: '{other}' in messages[{i}].role. Supported values are: \
                         'system', 'developer', 'user', 'assistant' and 'tool'."
                    ),
                    Some(&format!("messages.[{i}].role")),
                ));
            }
        }
    }
    if ledger.is_open() {
        let turn = ledger.turn;
        if let Err(problem) = ledger.close() {
            return Err(if ledger_is_text {
                text_problem_error(problem, turn, messages.len())
            } else {
                problem_error(problem, turn, messages.len())
            });
        }
    }
    Ok(progress)
}

/// The error for calls written as text that were not answered exactly once.
fn text_problem_error(problem: Problem<'_>, turn: usize, at: usize) -> Prepared {
    let message = match problem {
        Problem::Missing(names) => format!(
            "The tool calls written in the text of messages[{turn}] must be answered by the \
             message right after it, one `{} NAME (call id: ID)` block per call; these calls \
             got no result: {}",
            text::RESULT,
            engine::join(&names)
        ),
        Problem::Unknown(name) => format!(
            "Invalid parameter: messages[{at}] answers a call of `{name}`, which the text of \
             messages[{turn}] did not call."
        ),
        Problem::Twice(name) => format!(
            "Invalid parameter: messages[{at}] answers more calls of `{name}` than the text of \
             messages[{turn}] made; each call must be answered exactly once."
        ),
        Problem::DuplicateId(id) => {
            format!("Invalid parameter: two tool calls in messages[{turn}] share the id '{id}'.")
        }
    };
    bad(&message, Some("messages"))
}

fn problem_error(problem: Problem<'_>, turn: usize, at: usize) -> Prepared {
    let message = match problem {
        Problem::Missing(ids) => format!(
            "An assistant message with 'tool_calls' must be followed by tool messages \
             responding to each 'tool_call_id'. The following tool_call_ids of messages[{turn}] \
             did not have response messages: {}",
            engine::join(&ids)
        ),
        Problem::Unknown(id) => format!(
            "Invalid parameter: messages[{at}] answers tool_call_id '{id}', which is not a call \
             of the assistant message messages[{turn}] it follows."
        ),
        Problem::Twice(id) => format!(
            "Invalid parameter: messages[{at}] answers tool_call_id '{id}' a second time; each \
             call of messages[{turn}] must be answered by exactly one 'tool' message."
        ),
        Problem::DuplicateId(id) => format!(
            "Invalid parameter: two tool calls in messages[{turn}] share the id '{id}'; each \
             call needs its own id."
        ),
    };
    bad(&message, Some("messages"))
}

// ---- responses ----

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

impl Usage {
    fn new((input, output): (u64, u64)) -> Usage {
        Usage {
            prompt_tokens: input,
            completion_tokens: output,
            total_tokens: input + output,
        }
    }
}

#[derive(Serialize)]
struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    usage: Usage,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    message: OutMessage<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct OutMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutCall<'a>>,
    refusal: Option<()>,
}

#[derive(Serialize)]
struct OutCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutFunction<'a>,
}

#[derive(Serialize)]
struct OutFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [ChunkChoice<'a>],
    /// Absent without `include_usage`; `null` on every chunk but the last with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

/// Appends the JSON of a [`Chunk`] up to its `choices`, included: `{"id":…,…,"choices":`.
fn write_chunk_head(buf: &mut Vec<u8>, id: &str, created: u64, model: &str) {
    let chunk = Chunk {
        id,
        object: "chat.completion.chunk",
        created,
        model,
        choices: &[],
        usage: None,
    };
    let _ = serde_json::to_writer(&mut *buf, &chunk);
    // `[]}`: the empty choices and the end of the object.
    buf.truncate(buf.len().saturating_sub(3));
}

/// Appends the rest of a [`Chunk`] after its head (see [`write_chunk_head`]): the two give
/// the same bytes as the whole chunk serialized.
fn write_chunk_rest(buf: &mut Vec<u8>, choices: &[ChunkChoice<'_>], usage: Option<Option<Usage>>) {
    let _ = serde_json::to_writer(&mut *buf, choices);
    if let Some(usage) = usage {
        buf.extend_from_slice(b",\"usage\":");
        let _ = serde_json::to_writer(&mut *buf, &usage);
    }
    buf.push(b'}');
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[DeltaCall<'a>; 1]>,
}

#[derive(Serialize)]
struct DeltaCall<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: DeltaFunction<'a>,
}

#[derive(Serialize)]
struct DeltaFunction<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

fn reply(shared: &Shared, ctx: &Ctx<'_, '_>, tools: &[OfferedTool<'_>]) -> Prepared {
    let (request, scenario) = (ctx.request, ctx.scenario);
    let cut = ctx.fault.is_some_and(|d| d.kind == FaultKind::CutCall);
    let reply = engine::plan(
        scenario,
        tools,
        ctx.progress,
        "call_mock",
        &shared.ids,
        shared.scripted(),
        ctx.output,
    );
    let reply = match reply {
        Reply::Text(_) if !shared.answers_by_prompt.is_empty() => {
            let first = request
                .messages
                .iter()
                .find(|m| m.role.as_ref() == "user")
                .map(InMessage::text)
                .unwrap_or_default();
            match shared
                .answers_by_prompt
                .iter()
                .find(|a| first.contains(&a.when))
            {
                Some(a) => Reply::Text(a.text.clone()),
                None => reply,
            }
        }
        other => other,
    };
    let auto = matches!(&request.tool_choice, Some(Value::String(c)) if c == "auto");
    let reply = match reply {
        // llama-cpp-python's `chatml-function-calling`: under `tool_choice: "auto"` the text
        // after `message:` is held to a grammar of function names or the end: nothing.
        Reply::Text(_) if scenario.empty_auto_answer && auto && !tools.is_empty() => {
            shared.saw_quirk();
            Reply::Text(String::new())
        }
        other => other,
    };
    let reply = match scenario.text_calls {
        Some(dialect) => text::as_text(reply, dialect),
        None => reply,
    };
    let usage = engine::usage(ctx.body_len, &reply);
    let id = format!("chatcmpl-mock{:016x}", shared.next_response_id());
    let created = super::unix_time();
    let model = request.model.as_ref();
    let finish_reason = match reply {
        Reply::Calls(_) => "tool_calls",
        Reply::Text(_) => "stop",
    };
    let payload = if request.stream == Some(true) {
        let include_usage = request
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let mut sse = SseWriter::new(false);
        // Every chunk starts with the same fields: serialized once, into the first event, and
        // copied from there into the others.
        let mut head = None;
        let mut event = |sse: &mut SseWriter, choices: &[ChunkChoice<'_>], usage| {
            sse.data_with(|buf| {
                let range = head.get_or_insert_with(|| {
                    let start = buf.len();
                    write_chunk_head(buf, &id, created, model);
                    start..buf.len()
                });
                if range.end != buf.len() {
                    buf.extend_from_within(range.clone());
                }
                write_chunk_rest(buf, choices, usage);
            });
        };
        let mut chunk = |sse: &mut SseWriter, delta: Delta<'_>, finish: Option<&'static str>| {
            let choices = [ChunkChoice {
                index: 0,
                delta,
                logprobs: None,
                finish_reason: finish,
            }];
            // `null` on every chunk but the last with `include_usage`.
            event(sse, &choices, include_usage.then_some(None));
        };
        match &reply {
            Reply::Text(text) => {
                chunk(
                    &mut sse,
                    Delta {
                        role: Some("assistant"),
                        content: Some(Some("")),
                        ..Delta::default()
                    },
                    None,
                );
                for piece in pieces_with_cut(text, scenario.chunk, cut) {
                    let Some(piece) = piece else {
                        sse.mark();
                        continue;
                    };
                    let delta = Delta {
                        content: Some(Some(piece)),
                        ..Delta::default()
                    };
                    chunk(&mut sse, delta, None);
                }
            }
            Reply::Calls(calls) => {
                chunk(
                    &mut sse,
                    Delta {
                        role: Some("assistant"),
                        content: Some(None),
                        ..Delta::default()
                    },
                    None,
                );
                for (index, call) in calls.iter().enumerate() {
                    let open = DeltaCall {
                        index,
                        id: Some(&call.id),
                        kind: Some("function"),
                        function: DeltaFunction {
                            name: Some(call.name),
                            arguments: "",
                        },
                    };
                    let delta = Delta {
                        tool_calls: Some([open]),
                        ..Delta::default()
                    };
                    chunk(&mut sse, delta, None);
                    for piece in
                        pieces_with_cut(&call.arguments_json, scenario.chunk, cut && index == 0)
                    {
                        let Some(piece) = piece else {
                            sse.mark();
                            continue;
                        };
                        let more = DeltaCall {
                            index,
                            id: None,
                            kind: None,
                            function: DeltaFunction {
                                name: None,
                                arguments: piece,
                            },
                        };
                        let delta = Delta {
                            tool_calls: Some([more]),
                            ..Delta::default()
                        };
                        chunk(&mut sse, delta, None);
                    }
                }
            }
        }
        chunk(&mut sse, Delta::default(), Some(finish_reason));
        if include_usage {
            event(&mut sse, &[], Some(Some(Usage::new(usage))));
        }
        sse.raw(b"[DONE]");
        Payload::Sse(sse)
    } else {
        let (content, tool_calls) = match &reply {
            Reply::Text(text) => (Some(text.as_str()), Vec::new()),
            Reply::Calls(calls) => (
                None,
                calls
                    .iter()
                    .map(|c| OutCall {
                        id: &c.id,
                        kind: "function",
                        function: OutFunction {
                            name: c.name,
                            arguments: &c.arguments_json,
                        },
                    })
                    .collect(),
            ),
        };
        let completion = Completion {
            id: &id,
            object: "chat.completion",
            created,
            model,
            choices: [Choice {
                index: 0,
                message: OutMessage {
                    role: "assistant",
                    content,
                    tool_calls,
                    refusal: None,
                },
                logprobs: None,
                finish_reason,
            }],
            usage: Usage::new(usage),
        };
        Payload::Json(super::response::to_vec(&completion))
    };
    Prepared::answer(
        payload,
        shared,
        scenario,
        ctx.fault,
        &reply,
        ArgsOnWire::String,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_written_from_its_head_is_the_chunk_serialized() {
        // Absent, `null`, or a count.
        let usage = |which: u8| match which {
            0 => None,
            1 => Some(None),
            _ => Some(Some(Usage::new((12, 3)))),
        };
        let call = DeltaCall {
            index: 1,
            id: Some("call_\"1"),
            kind: Some("function"),
            function: DeltaFunction {
                name: Some("echo"),
                arguments: "{\"a\": \"é\\n\"}",
            },
        };
        let choices = [ChunkChoice {
            index: 0,
            delta: Delta {
                role: Some("assistant"),
                content: Some(None),
                tool_calls: Some([call]),
            },
            logprobs: None,
            finish_reason: Some("tool_calls"),
        }];
        for (choices, which) in [(&choices[..], 0), (&choices[..], 1), (&[][..], 2)] {
            let (id, model) = ("chatcmpl-\"mock", "mock:rounds=2,é");
            let whole = serde_json::to_vec(&Chunk {
                id,
                object: "chat.completion.chunk",
                created: 1_764_000_000,
                model,
                choices,
                usage: usage(which),
            })
            .unwrap();
            let mut pieces = b"data: ".to_vec();
            write_chunk_head(&mut pieces, id, 1_764_000_000, model);
            write_chunk_rest(&mut pieces, choices, usage(which));
            let pieces = pieces.split_off(6);
            assert_eq!(String::from_utf8(pieces), String::from_utf8(whole));
        }
    }
}
