//! The OpenAI Chat Completions format, server side: a client's request read into the engine's
//! messages and tool specs, and the engine's answers written as `chat.completion` objects and
//! `chat.completion.chunk` events. Every byte of a request is the client's: anything that does
//! not read is an error naming the field, never a panic.

use serde_json::{Map, Value, json};
use std::collections::{HashMap, HashSet};
use toolloop::image::Image;
use toolloop::message::{AssistantMessage, Message, ToolCall, ToolResult, parse_arguments};
use toolloop::model::{ToolChoice, ToolSpec};
use toolloop::usage::Usage;

/// What a request asks, read from its JSON body.
#[derive(Debug)]
pub(crate) struct ChatRequest {
    /// `model`.
    pub model: String,
    /// `messages`, as the engine's.
    pub messages: Vec<Message>,
    /// `tools` (functions only).
    pub tools: Vec<ToolSpec>,
    /// `tool_choice`.
    pub tool_choice: ToolChoice,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u32>,
}

/// A request that does not read: the message, and the field at fault.
#[derive(Debug)]
pub(crate) struct BadRequest {
    pub message: String,
    pub param: Option<String>,
}

fn bad(message: impl Into<String>, param: impl Into<String>) -> BadRequest {
    BadRequest {
        message: message.into(),
        param: Some(param.into()),
    }
}

impl ChatRequest {
    /// Reads a Chat Completions request body.
    pub(crate) fn parse(body: &[u8]) -> Result<ChatRequest, BadRequest> {
        let v: Value = serde_json::from_slice(body).map_err(|e| BadRequest {
            message: format!("the body is not JSON: {e}"),
            param: None,
        })?;
        let Value::Object(o) = v else {
            return Err(BadRequest {
                message: "the body is not a JSON object".into(),
                param: None,
            });
        };
        let model = match o.get("model") {
            Some(Value::String(m)) => m.clone(),
            _ => return Err(bad("`model` is required (a string)", "model")),
        };
        let Some(Value::Array(raw)) = o.get("messages") else {
            return Err(bad("`messages` is required (an array)", "messages"));
        };
        let messages = read_messages(raw)?;
        let tools = match o.get("tools") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(t)) => read_tools(t)?,
            Some(_) => return Err(bad("`tools` must be an array", "tools")),
        };
        let tool_choice = match o.get("tool_choice") {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return Err(bad(
                        format!(
                            "`tool_choice` `{other}`: expected auto, none, required or a function"
                        ),
                        "tool_choice",
                    ));
                }
            },
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(name) => ToolChoice::Tool(name.to_string()),
                None => {
                    return Err(bad(
                        "`tool_choice`: expected auto, none, required or {\"type\": \"function\", \"function\": {\"name\": …}}",
                        "tool_choice",
                    ));
                }
            },
        };
        let stream = o.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let include_usage = o
            .get("stream_options")
            .and_then(|s| s.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let temperature = match o.get("temperature") {
            None | Some(Value::Null) => None,
            Some(t) => match t.as_f64() {
                Some(t) if (0.0..=2.0).contains(&t) => Some(t as f32),
                _ => {
                    return Err(bad(
                        "`temperature`: expected a number from 0 to 2",
                        "temperature",
                    ));
                }
            },
        };
        let max_tokens = match o
            .get("max_completion_tokens")
            .or_else(|| o.get("max_tokens"))
        {
            None | Some(Value::Null) => None,
            Some(n) => match n.as_u64() {
                Some(n) if (1..=1_000_000).contains(&n) => Some(n as u32),
                _ => {
                    return Err(bad(
                        "`max_completion_tokens`: expected 1 to 1000000",
                        "max_completion_tokens",
                    ));
                }
            },
        };
        Ok(ChatRequest {
            model,
            messages,
            tools,
            tool_choice,
            stream,
            include_usage,
            temperature,
            max_tokens,
        })
    }
}

/// The text of a message's `content`: a string, or an array of parts whose `text` parts are
/// joined (images are gathered by [`user_content`]).
fn text_content(v: Option<&Value>, at: &str) -> Result<String, BadRequest> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") | Some("input_text") | Some("output_text") => {
                        if let Some(t) = p.get("text").and_then(Value::as_str) {
                            text.push_str(t);
                        }
                    }
                    Some("image_url") | Some("input_image") => {}
                    _ => {
                        return Err(bad(
                            format!("{at}.content[{j}]: expected a part of type text or image_url"),
                            format!("{at}.content"),
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(bad(
            format!("{at}.content: expected a string or an array of parts"),
            format!("{at}.content"),
        )),
    }
}

/// A user message's text and images.
fn user_content(v: Option<&Value>, at: &str) -> Result<Message, BadRequest> {
    let text = text_content(v, at)?;
    let mut images = Vec::new();
    if let Some(Value::Array(parts)) = v {
        for (j, p) in parts.iter().enumerate() {
            let url = match p.get("type").and_then(Value::as_str) {
                Some("image_url") => p
                    .get("image_url")
                    .and_then(|u| u.get("url").or(Some(u)))
                    .and_then(Value::as_str),
                Some("input_image") => p.get("image_url").and_then(Value::as_str),
                _ => continue,
            };
            let Some(url) = url else {
                return Err(bad(
                    format!("{at}.content[{j}]: an image part needs `image_url.url`"),
                    format!("{at}.content"),
                ));
            };
            images
                .push(Image::from_url(url).map_err(|e| {
                    bad(format!("{at}.content[{j}]: {e}"), format!("{at}.content"))
                })?);
        }
    }
    Ok(Message::user_with_images(text, images))
}

/// Reads `messages`. A tool message names its call by id; its tool's name is taken from the
/// assistant turn that made the call.
pub(crate) fn read_messages(raw: &[Value]) -> Result<Vec<Message>, BadRequest> {
    let mut out: Vec<Message> = Vec::with_capacity(raw.len());
    // The tool of each call id, the latest assistant message's first (a lookup per tool
    // message, not a search back through the conversation: a body of many tool messages must
    // not take time that grows with their square).
    let mut tool_of: HashMap<String, String> = HashMap::new();
    for (i, m) in raw.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let message = match role {
            "system" | "developer" => Message::system(text_content(m.get("content"), &at)?),
            "user" => user_content(m.get("content"), &at)?,
            "assistant" => {
                let text = text_content(m.get("content"), &at)?;
                let mut calls = Vec::new();
                if let Some(Value::Array(tc)) = m.get("tool_calls") {
                    for (j, c) in tc.iter().enumerate() {
                        let id = c.get("id").and_then(Value::as_str);
                        let name = c.pointer("/function/name").and_then(Value::as_str);
                        let (Some(id), Some(name)) = (id, name) else {
                            return Err(bad(
                                format!(
                                    "{at}.tool_calls[{j}]: a call needs `id` and `function.name`"
                                ),
                                format!("{at}.tool_calls"),
                            ));
                        };
                        let args = match c.pointer("/function/arguments") {
                            Some(Value::String(s)) => s.clone(),
                            Some(Value::Null) | None => "{}".into(),
                            Some(other) => other.to_string(),
                        };
                        let (arguments, invalid) = parse_arguments(&args);
                        let mut call = ToolCall::new(name, arguments);
                        call.id = id.to_string();
                        call.invalid_arguments = invalid;
                        calls.push(call);
                    }
                }
                // The first call of an id in a message names its tool, as a search would.
                for c in calls.iter().rev() {
                    tool_of.insert(c.id.clone(), c.name.clone());
                }
                Message::Assistant(AssistantMessage {
                    text: (!text.is_empty()).then_some(text),
                    tool_calls: calls,
                    parts: Vec::new(),
                })
            }
            "tool" => {
                let Some(call_id) = m.get("tool_call_id").and_then(Value::as_str) else {
                    return Err(bad(
                        format!("{at}: a tool message needs `tool_call_id`"),
                        format!("{at}.tool_call_id"),
                    ));
                };
                let name = tool_of
                    .get(call_id)
                    .cloned()
                    .ok_or_else(|| {
                        bad(
                            format!(
                                "{at}: `tool_call_id` {} answers no call of an earlier assistant message",
                                toolloop::result::shorten(call_id, 80)
                            ),
                            format!("{at}.tool_call_id"),
                        )
                    })?;
                Message::Tool(ToolResult {
                    call_id: call_id.to_string(),
                    name,
                    content: text_content(m.get("content"), &at)?,
                    is_error: false,
                    images: Vec::new(),
                })
            }
            other => {
                return Err(bad(
                    format!(
                        "{at}.role `{}`: expected system, developer, user, assistant or tool",
                        toolloop::result::shorten(other, 40)
                    ),
                    format!("{at}.role"),
                ));
            }
        };
        out.push(message);
    }
    Ok(out)
}

/// The Responses API's `input` items as Chat Completions messages: a `message` (or an item with
/// a `role`) as it is; a `function_call` as a call of the assistant message before it (a new
/// one when the item before was not the assistant's); a `function_call_output` as a `tool`
/// message. An item of another type is an error naming it.
pub(crate) fn responses_input(raw: &[Value]) -> Result<Vec<Value>, BadRequest> {
    let mut out: Vec<Value> = Vec::with_capacity(raw.len());
    for (i, item) in raw.iter().enumerate() {
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            Some("function_call") => {
                let call = json!({
                    "id": item.get("call_id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {
                        "name": item.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": item.get("arguments").cloned().unwrap_or(Value::Null),
                    },
                });
                let last_is_assistant = out
                    .last()
                    .is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
                if !last_is_assistant {
                    out.push(json!({"role": "assistant", "content": null, "tool_calls": []}));
                }
                if let Some(Value::Object(m)) = out.last_mut() {
                    match m.get_mut("tool_calls") {
                        Some(Value::Array(calls)) => calls.push(call),
                        _ => {
                            m.insert("tool_calls".into(), json!([call]));
                        }
                    }
                }
            }
            Some("function_call_output") => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => json!(s),
                    Some(other) => json!(other.to_string()),
                    None => json!(""),
                };
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": item.get("call_id").cloned().unwrap_or(Value::Null),
                    "content": output,
                }));
            }
            Some("message") | None => out.push(item.clone()),
            Some(other) => {
                return Err(bad(
                    format!(
                        "input[{i}].type `{}`: expected message, function_call or \
                         function_call_output",
                        toolloop::result::shorten(other, 40)
                    ),
                    format!("input[{i}].type"),
                ));
            }
        }
    }
    Ok(out)
}

/// Reads `tools`: each `{"type": "function", "function": {"name", "description",
/// "parameters"}}` (Chat Completions), or `{"type": "function", "name", "description",
/// "parameters"}` (the Responses API).
pub(crate) fn read_tools(raw: &[Value]) -> Result<Vec<ToolSpec>, BadRequest> {
    let mut out: Vec<ToolSpec> = Vec::with_capacity(raw.len());
    let mut names: HashSet<&str> = HashSet::with_capacity(raw.len());
    for (i, t) in raw.iter().enumerate() {
        let f = t.get("function").unwrap_or(t);
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            return Err(bad(
                format!("tools[{i}]: a function needs a `name`"),
                format!("tools[{i}]"),
            ));
        };
        if name.is_empty() || name.len() > 128 {
            return Err(bad(
                format!("tools[{i}]: the name must have 1 to 128 characters"),
                format!("tools[{i}]"),
            ));
        }
        if !names.insert(name) {
            return Err(bad(
                format!("tools[{i}]: two tools are named {name}"),
                format!("tools[{i}]"),
            ));
        }
        let parameters = match f.get("parameters") {
            Some(p @ Value::Object(_)) => p.clone(),
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(_) => {
                return Err(bad(
                    format!("tools[{i}].function.parameters: expected a JSON Schema object"),
                    format!("tools[{i}]"),
                ));
            }
        };
        out.push(ToolSpec {
            name: name.to_string(),
            description: f
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            parameters,
        });
    }
    Ok(out)
}

/// Seconds since the epoch.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The `usage` object.
pub(crate) fn usage_json(u: Option<&Usage>) -> Value {
    let u = u.copied().unwrap_or_default();
    json!({
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
    })
}

/// A call in a message's `tool_calls`.
pub(crate) fn call_json(c: &ToolCall) -> Value {
    json!({
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments.to_string()},
    })
}

/// A whole `chat.completion`.
pub(crate) fn completion(
    id: &str,
    model: &str,
    text: Option<&str>,
    calls: &[ToolCall],
    finish: &str,
    usage: Option<&Usage>,
) -> Value {
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert("content".into(), json!(text));
    if !calls.is_empty() {
        message.insert(
            "tool_calls".into(),
            Value::Array(calls.iter().map(call_json).collect()),
        );
    }
    json!({
        "id": id,
        "object": "chat.completion",
        "created": now_secs(),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
        "usage": usage_json(usage),
    })
}

/// One `chat.completion.chunk` with a delta (and a finish reason when it is the last).
pub(crate) fn chunk(id: &str, model: &str, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": now_secs(),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
    })
}

/// The chunk with the usage (no choices), sent last when asked for.
pub(crate) fn usage_chunk(id: &str, model: &str, usage: Option<&Usage>) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": now_secs(),
        "model": model,
        "choices": [],
        "usage": usage_json(usage),
    })
}

/// An SSE event carrying `v`.
pub(crate) fn sse(v: &Value) -> bytes::Bytes {
    bytes::Bytes::from(format!("data: {v}\n\n"))
}

/// The end of a Chat Completions stream.
pub(crate) fn sse_done() -> bytes::Bytes {
    bytes::Bytes::from_static(b"data: [DONE]\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_calls_and_results_reads_into_the_engines_messages() {
        let body = json!({
            "model": "gateway:openai:x",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{\"q\":1}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "found"}
            ],
            "tools": [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}],
            "stream": true,
            "stream_options": {"include_usage": true}
        });
        let r = ChatRequest::parse(body.to_string().as_bytes()).unwrap();
        assert_eq!(r.messages.len(), 4);
        assert!(r.stream && r.include_usage);
        assert_eq!(r.tools[0].name, "look");
        match &r.messages[3] {
            Message::Tool(t) => {
                assert_eq!((t.name.as_str(), t.content.as_str()), ("look", "found"))
            }
            other => panic!("{other:?}"),
        }
        match &r.messages[2] {
            Message::Assistant(a) => assert_eq!(a.tool_calls[0].arguments, json!({"q": 1})),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_body_of_many_tool_messages_or_tools_reads_in_time_linear_in_its_size() {
        // What a 4 MiB body can hold: a time that grows with the square of the count would
        // hold a worker for minutes.
        const N: usize = 100_000;
        let mut messages = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "tool_calls": [
                {"id": "c", "function": {"name": "first"}},
                {"id": "c", "function": {"name": "second"}}
            ]}),
        ];
        messages.extend((0..N).map(|_| json!({"role": "tool", "tool_call_id": "c"})));
        let tools: Vec<Value> = (0..N)
            .map(|i| json!({"type": "function", "function": {"name": format!("t{i}")}}))
            .collect();
        let body = json!({"model": "m", "messages": messages, "tools": tools}).to_string();
        let start = std::time::Instant::now();
        let r = ChatRequest::parse(body.as_bytes()).unwrap();
        let took = start.elapsed();
        assert_eq!((r.messages.len(), r.tools.len()), (N + 2, N));
        match &r.messages[N + 1] {
            // The first call with the id names the tool, as before.
            Message::Tool(t) => assert_eq!(t.name, "first"),
            other => panic!("{other:?}"),
        }
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }

    #[test]
    fn bad_requests_name_the_field() {
        for (body, param) in [
            (json!({"messages": []}), "model"),
            (json!({"model": "m"}), "messages"),
            (
                json!({"model": "m", "messages": [{"role": "robot"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "m", "messages": [{"role": "tool", "tool_call_id": "x", "content": ""}]}),
                "messages[0].tool_call_id",
            ),
            (
                json!({"model": "m", "messages": [], "tools": [{"function": {}}]}),
                "tools[0]",
            ),
        ] {
            let e = ChatRequest::parse(body.to_string().as_bytes()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        }
        assert!(ChatRequest::parse(b"\xff{").is_err());
    }
}
