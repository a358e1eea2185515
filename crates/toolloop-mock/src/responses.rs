//! OpenAI Responses API, server side: `POST /v1/responses`.
//!
//! The request's `input` items are checked like Chat Completions messages: every `function_call`
//! item must be answered by exactly one `function_call_output` item with its `call_id`, after the
//! calls and before any other item. Errors have OpenAI's shape.
//!
//! With `include: ["reasoning.encrypted_content"]` the mock plays a reasoning model: every reply
//! starts with a `reasoning` item carrying encrypted content, and every round of
//! `function_call` items in the input must come after the reasoning item of its turn (a client
//! that drops its reasoning items between rounds gets a 400 naming the call).

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::Shared;
use super::engine::{self, Ledger, OfferedTool, Problem, Progress, Reply, pieces_with_cut};
use super::fault::{Drawn, FaultKind, Protocol};
use super::openai::error;
use super::response::{ArgsOnWire, Payload, Prepared, SseWriter, to_vec};
use super::scenario::Scenario;

fn bad(message: &str, param: Option<&str>) -> Prepared {
    error(StatusCode::BAD_REQUEST, message, param, None)
}

/// The images of a user message item's content (`input_image` parts), each checked.
fn user_images(item: &Value, i: usize) -> Result<u32, Prepared> {
    match item.get("content") {
        Some(Value::Array(parts)) => part_images(parts, i, "content"),
        _ => Ok(0),
    }
}

/// The images of a `function_call_output` item whose `output` is a list of parts, each checked.
fn output_images(item: &Value, i: usize) -> Result<u32, Prepared> {
    match item.get("output") {
        Some(Value::String(_)) => Ok(0),
        Some(Value::Array(parts)) => part_images(parts, i, "output"),
        _ => Err(bad(
            &format!(
                "Missing required parameter: 'input[{i}].output' (a string, or a list of \
                 parts)."
            ),
            Some(&format!("input[{i}].output")),
        )),
    }
}

/// The images of `input[i].<field>`'s parts (`input_text`, `input_image`, `input_file`), each
/// checked: an image's data is an image of its declared type, and its `detail` is given.
fn part_images(parts: &[Value], i: usize, field: &str) -> Result<u32, Prepared> {
    let mut n = 0u32;
    for (j, part) in parts.iter().enumerate() {
        let at = format!("input[{i}].{field}[{j}]");
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "input_file") => {}
            Some("input_image") => {
                let url = text_of(part, "image_url");
                if let Err(reason) = super::image::check_url(url) {
                    return Err(bad(
                        &format!("Invalid image in {at}: {reason}."),
                        Some(&format!("{at}.image_url")),
                    ));
                }
                if !matches!(text_of(part, "detail"), "auto" | "low" | "high") {
                    return Err(bad(
                        &format!(
                            "Missing required parameter: '{at}.detail' (one of 'auto', 'low', \
                             'high')."
                        ),
                        Some(&format!("{at}.detail")),
                    ));
                }
                n = n.saturating_add(1);
            }
            other => {
                return Err(bad(
                    &format!(
                        "Invalid value: '{}'. Supported values for {at}.type are: \
                         'input_text', 'input_image' and 'input_file'.",
                        other.unwrap_or("")
                    ),
                    Some(&format!("{at}.type")),
                ));
            }
        }
    }
    Ok(n)
}

/// The type of an input item (`message` when only a role is given).
fn kind(item: &Value) -> &str {
    match item.get("type").and_then(Value::as_str) {
        Some(t) => t,
        None if item.get("role").is_some() => "message",
        None => "",
    }
}

fn text_of<'a>(item: &'a Value, key: &str) -> &'a str {
    item.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Answers one request body.
pub(crate) fn handle(shared: &Shared, body: &[u8]) -> Prepared {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return bad("The request body must be a JSON object.", None),
        Err(e) => {
            return bad(
                &format!("We could not parse the JSON body of your request: {e}"),
                None,
            );
        }
    };
    let model = match request.get("model").and_then(Value::as_str) {
        Some(m) => m,
        None => return bad("Missing required parameter: 'model'.", Some("model")),
    };
    let scenario = match super::openai::scenario(model) {
        Ok(s) => s,
        Err(answer) => return answer,
    };
    if scenario.text_calls.is_some() {
        return bad(
            "bad mock scenario: text-only mode (`text_calls=`) is served on the Chat \
             Completions route only (POST /v1/chat/completions)",
            Some("model"),
        );
    }
    let reasoning = request
        .get("include")
        .and_then(Value::as_array)
        .is_some_and(|i| i.iter().any(|v| v == "reasoning.encrypted_content"));
    let single;
    let input: &[Value] = match request.get("input") {
        Some(Value::Array(items)) => items,
        Some(s @ Value::String(_)) => {
            single = [json!({"role": "user", "content": s})];
            &single
        }
        _ => {
            return bad(
                "Missing required parameter: 'input' (a string or an array of input items).",
                Some("input"),
            );
        }
    };
    let progress = match walk(input, reasoning) {
        Ok(p) => engine::read_summaries(p, body),
        Err(prepared) => return prepared,
    };
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    // Compaction by the server: a request over the threshold is counted as its instructions,
    // tools and the compaction item that replaces its input.
    if scenario.refuse_context && request.get("context_management").is_some() {
        shared.saw_quirk();
        return error(
            StatusCode::BAD_REQUEST,
            "Unknown parameter: 'context_management'.",
            Some("context_management"),
            Some("unknown_parameter"),
        );
    }
    let threshold = match super::native::responses_threshold(&request) {
        Ok(t) => t,
        Err(message) => return bad(&message, Some("context_management")),
    };
    let mut counted = body.len();
    let mut compaction = None;
    if let Some(threshold) = threshold
        && engine::request_tokens(body.len()) > threshold
    {
        let item = super::native::compaction_item(
            shared.next_response_id(),
            progress.rounds,
            progress.results,
        );
        let input_bytes: usize = input.iter().map(|i| to_vec(i).len() + 1).sum();
        counted = counted.saturating_sub(input_bytes) + to_vec(&item).len();
        shared.count_native_compaction();
        compaction = Some(item);
    }
    if engine::over_window(shared, &scenario, counted).is_some() {
        return context_length_exceeded(shared, model, &scenario, stream);
    }
    let fault = shared
        .faults
        .draw(&scenario, Protocol::OpenAi, "responses", body);
    if let Some(early) = fault.and_then(|d| super::openai::early_fault(d, &scenario)) {
        return early;
    }
    let choice = request.get("tool_choice");
    let allow = choice.and_then(Value::as_str) != Some("none");
    let named = choice.and_then(|c| c.get("name")).and_then(Value::as_str);
    let tools: Vec<OfferedTool<'_>> = request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|_| allow)
        .filter(|t| t.get("type").and_then(Value::as_str) == Some("function"))
        .filter_map(|t| {
            let name = t.get("name").and_then(Value::as_str)?;
            Some(OfferedTool {
                name,
                schema: t.get("parameters"),
            })
        })
        .filter(|t| named.is_none_or(|n| n == t.name))
        .collect();
    // Structured output: `text.format` of type `json_schema` carries the schema.
    let output = request
        .get("text")
        .and_then(|t| t.get("format"))
        .filter(|f| f.get("type").and_then(Value::as_str) == Some("json_schema"))
        .and_then(|f| f.get("schema"));
    if output.is_some() {
        shared.saw_output_schema();
    }
    reply(
        shared,
        model,
        &scenario,
        &tools,
        progress,
        Shape {
            body_len: counted,
            stream,
            reasoning,
            output,
            compaction,
        },
        fault,
    )
}

/// What the Responses API answers to a request over the model's context window: HTTP 400 with
/// code `context_length_exceeded`; streamed, the stream starts and its third event is an
/// `error` event holding the same error (as clients of the API report it: sequence number 2).
fn context_length_exceeded(
    shared: &Shared,
    model: &str,
    scenario: &Scenario,
    stream: bool,
) -> Prepared {
    const MESSAGE: &str = "Your input exceeds the context window of this model. Please adjust \
                           your input and try again.";
    if !stream {
        return error(
            StatusCode::BAD_REQUEST,
            MESSAGE,
            Some("input"),
            Some("context_length_exceeded"),
        );
    }
    let n = shared.next_response_id();
    let response = json!({
        "id": format!("resp_mock{n:016x}"),
        "object": "response",
        "created_at": super::unix_time(),
        "status": "in_progress",
        "error": null,
        "model": model,
        "output": [],
    });
    let mut sse = SseWriter::new(false);
    for (seq, data) in [
        json!({"type": "response.created", "response": response}),
        json!({"type": "response.in_progress", "response": response}),
        json!({"type": "error", "error": {"type": "invalid_request_error",
            "code": "context_length_exceeded", "message": MESSAGE, "param": "input"}}),
    ]
    .into_iter()
    .enumerate()
    {
        let mut data = data;
        data["sequence_number"] = json!(seq);
        let name = data["type"].as_str().unwrap_or("").to_string();
        sse.event(Some(&name), &data);
    }
    Prepared::ok(
        Payload::Sse(sse),
        shared.latency(scenario),
        scenario.chunk_delay,
    )
}

/// Checks that every call is answered exactly once, right after its round, and works out where
/// the task stands.
fn walk(items: &[Value], reasoning: bool) -> Result<Progress, Prepared> {
    if items.is_empty() {
        return Err(bad(
            "Invalid 'input': empty array. Expected an array with minimum length 1.",
            Some("input"),
        ));
    }
    let mut progress = Progress::default();
    let mut ledger = Ledger::default();
    // The last item was a reasoning item (or an assistant message after one), for the
    // reasoning check.
    let mut reasoned = false;
    let mut i = 0;
    while i < items.len() {
        let item = &items[i];
        match kind(item) {
            "function_call" => {
                if ledger.is_open() {
                    close(&mut ledger)?;
                }
                let end = items[i..]
                    .iter()
                    .position(|it| kind(it) != "function_call")
                    .map_or(items.len(), |p| i + p);
                let calls = &items[i..end];
                if reasoning && !reasoned {
                    return Err(bad(
                        &format!(
                            "Invalid 'input[{i}]': function call {} is not preceded by the \
                             reasoning item of its turn. This mock model reasons (the request \
                             includes reasoning.encrypted_content): send back the reasoning \
                             items it returned, before the calls.",
                            text_of(&items[i], "call_id")
                        ),
                        Some(&format!("input[{i}]")),
                    ));
                }
                let keys = calls
                    .iter()
                    .map(|c| (text_of(c, "call_id"), text_of(c, "name")));
                if let Err(Problem::DuplicateId(id)) = ledger.open(i, keys, true) {
                    return Err(bad(
                        &format!("Duplicate item found with call_id '{id}'."),
                        Some(&format!("input[{i}]")),
                    ));
                }
                progress.tool_calls();
                reasoned = false;
                i = end;
                continue;
            }
            "function_call_output" => {
                let id = text_of(item, "call_id");
                if !ledger.is_open() {
                    return Err(bad(
                        &format!("No tool call found for function call output with call_id {id}."),
                        Some(&format!("input[{i}]")),
                    ));
                }
                progress.user_images(output_images(item, i)?);
                match ledger.answer(id) {
                    Ok(()) => progress.tool_result(),
                    Err(Problem::Twice(_)) => {
                        return Err(bad(
                            &format!(
                                "Invalid 'input[{i}]': call_id {id} is answered by more than \
                                 one function_call_output item."
                            ),
                            Some(&format!("input[{i}]")),
                        ));
                    }
                    Err(_) => {
                        return Err(bad(
                            &format!(
                                "No tool call found for function call output with call_id {id}."
                            ),
                            Some(&format!("input[{i}]")),
                        ));
                    }
                }
                if items.get(i + 1).map(kind) != Some("function_call_output") {
                    close(&mut ledger)?;
                }
            }
            "message" => {
                if ledger.is_open() {
                    close(&mut ledger)?;
                }
                match text_of(item, "role") {
                    "user" => {
                        progress.user_text();
                        progress.user_images(user_images(item, i)?);
                        reasoned = false;
                    }
                    "assistant" => {
                        // The calls of the turn follow its text.
                        let calls_follow = items.get(i + 1).map(kind) == Some("function_call");
                        if !calls_follow {
                            progress.assistant_text();
                            reasoned = false;
                        }
                    }
                    "system" | "developer" => {}
                    other => {
                        return Err(bad(
                            &format!(
                                "Invalid value: '{other}'. Supported values are: 'assistant', \
                                 'system', 'developer', and 'user'."
                            ),
                            Some(&format!("input[{i}].role")),
                        ));
                    }
                }
            }
            "compaction" => {
                if ledger.is_open() {
                    close(&mut ledger)?;
                }
                match super::native::read_compaction(text_of(item, "encrypted_content")) {
                    Some((rounds, results)) => progress.compacted(rounds, results),
                    None => {
                        return Err(bad(
                            &format!(
                                "Invalid 'input[{i}]': the compaction item's encrypted_content                                  is missing or was not made by this server."
                            ),
                            Some(&format!("input[{i}].encrypted_content")),
                        ));
                    }
                }
            }
            "reasoning" => {
                if ledger.is_open() {
                    close(&mut ledger)?;
                }
                let encrypted = text_of(item, "encrypted_content");
                if reasoning && !encrypted.starts_with("mock-reasoning-") {
                    return Err(bad(
                        &format!(
                            "Invalid 'input[{i}]': the reasoning item's encrypted_content is \
                             missing or was not made by this server."
                        ),
                        Some(&format!("input[{i}]")),
                    ));
                }
                reasoned = true;
            }
            other => {
                return Err(bad(
                    &format!("Invalid value: '{other}'. Unknown input item type."),
                    Some(&format!("input[{i}].type")),
                ));
            }
        }
        i += 1;
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
        Err(Problem::Missing(ids)) => Err(bad(
            &format!(
                "No tool output found for function call {} (input[{turn}]): every function_call \
                 needs a function_call_output with its call_id right after its round.",
                engine::join(&ids)
            ),
            Some("input"),
        )),
        Err(other) => Err(bad(&format!("input[{turn}]: {other:?}"), Some("input"))),
    }
}

/// How the reply is written.
struct Shape<'r> {
    body_len: usize,
    stream: bool,
    reasoning: bool,
    /// The schema of a structured-output request.
    output: Option<&'r Value>,
    /// The compaction item the server made, given first.
    compaction: Option<Value>,
}

fn reply(
    shared: &Shared,
    model: &str,
    scenario: &Scenario,
    tools: &[OfferedTool<'_>],
    progress: Progress,
    shape: Shape<'_>,
    fault: Option<Drawn>,
) -> Prepared {
    let cut = fault.is_some_and(|d| d.kind == FaultKind::CutCall);
    let reply = engine::plan(
        scenario,
        tools,
        progress,
        "call_mock",
        &shared.ids,
        shared.scripted(),
        shape.output,
    );
    let (input_tokens, output_tokens) = engine::usage(shape.body_len, &reply);
    let n = shared.next_response_id();
    let id = format!("resp_mock{n:016x}");
    let usage = json!({
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": if shape.reasoning { 1 } else { 0 }},
        "total_tokens": input_tokens + output_tokens,
    });
    let mut output: Vec<Value> = Vec::new();
    output.extend(shape.compaction);
    if shape.reasoning {
        output.push(json!({
            "type": "reasoning",
            "id": format!("rs_mock{n:016x}"),
            "summary": [],
            "encrypted_content": format!("mock-reasoning-{n:016x}"),
        }));
    }
    match &reply {
        Reply::Text(text) => output.push(json!({
            "type": "message",
            "id": format!("msg_mock{n:016x}"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        })),
        Reply::Calls(calls) => {
            for (k, c) in calls.iter().enumerate() {
                output.push(json!({
                    "type": "function_call",
                    "id": format!("fc_mock{n:016x}_{k}"),
                    "call_id": c.id,
                    "name": c.name,
                    "arguments": c.arguments_json,
                    "status": "completed",
                }));
            }
        }
    }
    let response = |status: &str, output: &[Value], usage: Option<&Value>| {
        json!({
            "id": id,
            "object": "response",
            "created_at": super::unix_time(),
            "status": status,
            "error": null,
            "incomplete_details": null,
            "model": model,
            "output": output,
            "parallel_tool_calls": true,
            "store": false,
            "usage": usage,
        })
    };
    let payload = if shape.stream {
        let mut sse = SseWriter::new(false);
        let mut seq = 0u64;
        let mut event = |sse: &mut SseWriter, mut data: Value| {
            data["sequence_number"] = json!(seq);
            seq += 1;
            let name = data["type"].as_str().unwrap_or("").to_string();
            sse.event(Some(&name), &data);
        };
        event(
            &mut sse,
            json!({"type": "response.created", "response": response("in_progress", &[], None)}),
        );
        let mut first_call = true;
        for (at, item) in output.iter().enumerate() {
            let item_id = item["id"].clone();
            // The item as first announced: in progress, with nothing in it yet.
            let mut added = item.clone();
            match item["type"].as_str() {
                Some("message") => {
                    added["status"] = json!("in_progress");
                    added["content"] = json!([]);
                }
                Some("function_call") => {
                    added["status"] = json!("in_progress");
                    added["arguments"] = json!("");
                }
                _ => {
                    if let Some(o) = added.as_object_mut() {
                        o.remove("encrypted_content");
                    }
                }
            }
            event(
                &mut sse,
                json!({"type": "response.output_item.added", "output_index": at, "item": added}),
            );
            match item["type"].as_str() {
                Some("message") => {
                    event(
                        &mut sse,
                        json!({"type": "response.content_part.added", "output_index": at,
                               "item_id": item_id, "content_index": 0,
                               "part": {"type": "output_text", "text": "", "annotations": []}}),
                    );
                    let text = item["content"][0]["text"].as_str().unwrap_or("");
                    for piece in pieces_with_cut(text, scenario.chunk, cut) {
                        let Some(piece) = piece else {
                            sse.mark();
                            continue;
                        };
                        event(
                            &mut sse,
                            json!({"type": "response.output_text.delta", "output_index": at,
                                   "item_id": item_id, "content_index": 0, "delta": piece}),
                        );
                    }
                    event(
                        &mut sse,
                        json!({"type": "response.output_text.done", "output_index": at,
                               "item_id": item_id, "content_index": 0, "text": text}),
                    );
                    event(
                        &mut sse,
                        json!({"type": "response.content_part.done", "output_index": at,
                               "item_id": item_id, "content_index": 0,
                               "part": item["content"][0]}),
                    );
                }
                Some("function_call") => {
                    let args = item["arguments"].as_str().unwrap_or("");
                    let here = cut && std::mem::take(&mut first_call);
                    for piece in pieces_with_cut(args, scenario.chunk, here) {
                        let Some(piece) = piece else {
                            sse.mark();
                            continue;
                        };
                        event(
                            &mut sse,
                            json!({"type": "response.function_call_arguments.delta",
                                   "output_index": at, "item_id": item_id, "delta": piece}),
                        );
                    }
                    event(
                        &mut sse,
                        json!({"type": "response.function_call_arguments.done",
                               "output_index": at, "item_id": item_id, "arguments": args}),
                    );
                }
                _ => {}
            }
            event(
                &mut sse,
                json!({"type": "response.output_item.done", "output_index": at, "item": item}),
            );
        }
        event(
            &mut sse,
            json!({"type": "response.completed",
                   "response": response("completed", &output, Some(&usage))}),
        );
        Payload::Sse(sse)
    } else {
        Payload::Json(to_vec(&response("completed", &output, Some(&usage))))
    };
    Prepared::answer(payload, shared, scenario, fault, &reply, ArgsOnWire::String)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MockOptions, Shared};

    fn status_and_body(p: Prepared) -> (StatusCode, Value) {
        match p.payload {
            Payload::Json(bytes) => (p.status, serde_json::from_slice(&bytes).unwrap()),
            Payload::Sse(_) => panic!("streamed"),
        }
    }

    #[test]
    fn rounds_are_checked_and_reasoning_must_come_back() {
        let shared = Shared::new(&MockOptions::default());
        let tools = json!([{"type": "function", "name": "f",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]);
        let first = json!({"model": "mock:rounds=1", "input": "hi", "tools": tools,
                           "include": ["reasoning.encrypted_content"]});
        let (status, b) = status_and_body(handle(&shared, first.to_string().as_bytes()));
        assert_eq!(status, StatusCode::OK, "{b}");
        let out = b["output"].as_array().unwrap();
        assert_eq!(out[0]["type"], "reasoning");
        assert_eq!(out[1]["type"], "function_call");
        assert_eq!(out[1]["arguments"], "{\"q\":\"a\"}");
        let call_id = out[1]["call_id"].as_str().unwrap();
        let result = json!({"type": "function_call_output", "call_id": call_id, "output": "ok"});
        let mut input = vec![json!({"role": "user", "content": "hi"})];
        input.extend(out.iter().cloned());
        input.push(result.clone());
        let next = json!({"model": "mock:rounds=1", "input": input, "tools": tools,
                          "include": ["reasoning.encrypted_content"]});
        let (status, b) = status_and_body(handle(&shared, next.to_string().as_bytes()));
        assert_eq!(status, StatusCode::OK, "{b}");
        assert_eq!(
            b["output"][1]["content"][0]["text"],
            "Done. I saw 1 tool results in 1 rounds."
        );
        // Without the reasoning item: refused.
        let dropped = json!({"model": "mock:rounds=1", "tools": tools,
            "include": ["reasoning.encrypted_content"],
            "input": [{"role": "user", "content": "hi"}, out[1], result]});
        let (status, b) = status_and_body(handle(&shared, dropped.to_string().as_bytes()));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            b["error"]["message"]
                .as_str()
                .unwrap()
                .contains("reasoning item")
        );
        // A call without its output: refused.
        let missing = json!({"model": "mock", "input": [{"role": "user", "content": "hi"}, out[1],
            {"role": "user", "content": "again"}]});
        let (status, b) = status_and_body(handle(&shared, missing.to_string().as_bytes()));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            b["error"]["message"]
                .as_str()
                .unwrap()
                .contains("No tool output found"),
            "{b}"
        );
        // An output that answers nothing: refused.
        let stray = json!({"model": "mock", "input": [{"role": "user", "content": "hi"}, result]});
        let (status, _) = status_and_body(handle(&shared, stray.to_string().as_bytes()));
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
}
