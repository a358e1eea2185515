//! The mock provider server over real HTTP on 127.0.0.1: each protocol driven by hand through
//! multi-round parallel scenarios (streamed and not), its checks, its grammar errors, latency
//! and stats.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use toolloop::transport::sse::{SseDecoder, SseEvent};
use toolloop_mock::{MockOptions, MockServer, start};

async fn server() -> MockServer {
    start(MockOptions::default()).await.expect("mock starts")
}

fn tools_schema() -> Vec<(&'static str, Value)> {
    vec![
        (
            "read_file",
            json!({"type": "object", "properties": {"path": {"type": "string", "default": "README.md"}}, "required": ["path"]}),
        ),
        (
            "list_dir",
            json!({"type": "object", "properties": {"dir": {"type": "string"}, "depth": {"type": "integer", "minimum": 1}}}),
        ),
        (
            "search",
            json!({"type": "object", "properties": {"mode": {"enum": ["regex", "literal"]}}}),
        ),
    ]
}

/// The arguments the mock must send for each tool (from `schema::sample`).
fn expected_args(name: &str) -> Value {
    match name {
        "read_file" => json!({"path": "README.md"}),
        "list_dir" => json!({"dir": "a", "depth": 1}),
        "search" => json!({"mode": "regex"}),
        other => panic!("unexpected tool {other}"),
    }
}

struct Post {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
    elapsed: Duration,
}

impl Post {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn events(&self) -> Vec<SseEvent> {
        let content_type = self.headers[reqwest::header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(content_type, "text/event-stream");
        let mut decoder = SseDecoder::new();
        let mut events = decoder.push(&self.body);
        events.extend(decoder.finish());
        events
    }
}

async fn post(url: &str, headers: &[(&str, &str)], body: impl Into<reqwest::Body>) -> Post {
    let client = http_client();
    let mut request = client.post(url).header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let started = Instant::now();
    let response = request.body(body).send().await.expect("request sent");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await.expect("body read").to_vec();
    Post {
        status,
        headers,
        body,
        elapsed: started.elapsed(),
    }
}

/// A tool call as the test client saw it.
#[derive(Debug, Clone)]
struct SeenCall {
    id: String,
    name: String,
    args: Value,
}

/// Checks one round of calls: the count, round-robin names continuing across rounds, sampled
/// arguments, and ids never seen before.
fn check_round(calls: &[SeenCall], round: usize, parallel: usize, ids: &mut HashSet<String>) {
    let tools = tools_schema();
    assert_eq!(calls.len(), parallel, "round {round}: {calls:?}");
    for (i, call) in calls.iter().enumerate() {
        let expected = tools[(round * parallel + i) % tools.len()].0;
        assert_eq!(call.name, expected, "round {round} call {i}");
        assert_eq!(
            call.args,
            expected_args(&call.name),
            "round {round} call {i}"
        );
        if !call.id.is_empty() {
            assert!(ids.insert(call.id.clone()), "id {} repeated", call.id);
        }
    }
}

// ---------------------------------------------------------------- OpenAI

fn openai_tools() -> Value {
    Value::Array(
        tools_schema()
            .into_iter()
            .map(|(name, schema)| {
                json!({"type": "function", "function": {"name": name, "description": "d", "parameters": schema}})
            })
            .collect(),
    )
}

struct Turn {
    calls: Vec<SeenCall>,
    text: Option<String>,
    finish: String,
    usage: (u64, u64),
}

fn openai_parse(post: &Post, stream: bool) -> Turn {
    assert_eq!(
        post.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&post.body)
    );
    if !stream {
        let body = post.json();
        assert_eq!(body["object"], "chat.completion");
        let choice = &body["choices"][0];
        let calls = choice["message"]["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| {
                        assert_eq!(c["type"], "function");
                        let raw = c["function"]["arguments"].as_str().expect("string args");
                        SeenCall {
                            id: c["id"].as_str().unwrap().to_owned(),
                            name: c["function"]["name"].as_str().unwrap().to_owned(),
                            args: serde_json::from_str(raw).unwrap(),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        return Turn {
            calls,
            text: choice["message"]["content"].as_str().map(str::to_owned),
            finish: choice["finish_reason"].as_str().unwrap().to_owned(),
            usage: (
                body["usage"]["prompt_tokens"].as_u64().unwrap(),
                body["usage"]["completion_tokens"].as_u64().unwrap(),
            ),
        };
    }
    let events = post.events();
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(&event.data).unwrap();
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            assert_eq!(chunk["choices"], json!([]), "usage chunk has no choices");
            usage = Some((
                u["prompt_tokens"].as_u64().unwrap(),
                u["completion_tokens"].as_u64().unwrap(),
            ));
            continue;
        }
        let choice = &chunk["choices"][0];
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
        let delta = &choice["delta"];
        if let Some(t) = delta["content"].as_str() {
            text.push_str(t);
        }
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = tc["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                calls.push(Default::default());
            }
            let slot = &mut calls[index];
            if let Some(id) = tc["id"].as_str() {
                slot.0 = id.to_owned();
            }
            if let Some(name) = tc["function"]["name"].as_str() {
                slot.1 = name.to_owned();
            }
            slot.2
                .push_str(tc["function"]["arguments"].as_str().unwrap());
        }
    }
    Turn {
        calls: calls
            .into_iter()
            .map(|(id, name, args)| SeenCall {
                id,
                name,
                args: serde_json::from_str(&args).unwrap(),
            })
            .collect(),
        text: (!text.is_empty()).then_some(text),
        finish: finish.expect("a finish reason"),
        usage: usage.expect("a usage chunk"),
    }
}

async fn openai_scenario(stream: bool, chunk: usize) {
    let server = server().await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let (rounds, parallel) = (3, 2);
    let model = format!("mock:rounds={rounds},parallel={parallel},chunk={chunk}");
    let mut messages = vec![
        json!({"role": "system", "content": "be brief"}),
        json!({"role": "user", "content": "do the thing"}),
    ];
    let mut ids = HashSet::new();
    let mut last_input = 0;
    for round in 0..=rounds {
        let body = json!({
            "model": model, "messages": messages, "tools": openai_tools(), "stream": stream,
            "stream_options": {"include_usage": true},
        });
        let turn = openai_parse(&post(&url, &[], body.to_string()).await, stream);
        assert!(
            turn.usage.0 > last_input,
            "input tokens grow with the request"
        );
        assert!(turn.usage.1 > 0);
        last_input = turn.usage.0;
        if round == rounds {
            assert_eq!(turn.finish, "stop");
            assert!(turn.calls.is_empty());
            let text = turn.text.expect("final text");
            assert!(text.contains("saw 6 tool results"), "{text}");
            break;
        }
        assert_eq!(turn.finish, "tool_calls");
        check_round(&turn.calls, round, parallel, &mut ids);
        messages.push(json!({
            "role": "assistant", "content": null,
            "tool_calls": turn.calls.iter().map(|c| json!({
                "id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.args.to_string()}
            })).collect::<Vec<_>>(),
        }));
        for c in &turn.calls {
            messages.push(json!({"role": "tool", "tool_call_id": c.id, "content": "ok"}));
        }
    }
    assert_eq!(ids.len(), rounds * parallel);
    assert_eq!(server.stats().requests, rounds as u64 + 1);
    assert_eq!(server.stats().rejected, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn openai_multi_round_parallel_not_streamed() {
    openai_scenario(false, 16).await;
}

#[tokio::test]
async fn openai_multi_round_parallel_streamed() {
    openai_scenario(true, 16).await;
}

#[tokio::test]
async fn openai_streamed_in_tiny_fragments() {
    openai_scenario(true, 3).await;
}

#[tokio::test]
async fn openai_stream_without_include_usage_has_no_usage_chunk() {
    let server = server().await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let body = json!({"model": "mock:rounds=0", "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let post = post(&url, &[], body.to_string()).await;
    let events = post.events();
    assert_eq!(events.last().unwrap().data, "[DONE]");
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(&event.data).unwrap();
        assert!(chunk.get("usage").is_none(), "{chunk}");
        assert_eq!(chunk["choices"].as_array().unwrap().len(), 1);
    }
}

#[tokio::test]
async fn openai_also_serves_the_path_without_v1() {
    let server = server().await;
    let url = format!("{}/chat/completions", server.base_url());
    let body = json!({"model": "mock", "messages": [{"role": "user", "content": "hi"}],
        "tools": openai_tools()});
    let turn = openai_parse(&post(&url, &[], body.to_string()).await, false);
    assert_eq!(turn.calls.len(), 1);
    assert_eq!(turn.calls[0].name, "read_file");
}

#[tokio::test]
async fn openai_reminder_after_tool_results_continues_the_task() {
    let server = server().await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let body = json!({"model": "mock:rounds=2", "tools": openai_tools(), "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": "<system-reminder>stay focused</system-reminder>"},
    ]});
    let turn = openai_parse(&post(&url, &[], body.to_string()).await, false);
    // Round 1 of 2 (not a fresh task): the round-robin continues with the second tool.
    assert_eq!(turn.calls.len(), 1);
    assert_eq!(turn.calls[0].name, "list_dir");
}

#[tokio::test]
async fn openai_new_question_starts_a_new_task() {
    let server = server().await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let body = json!({"model": "mock:rounds=1", "tools": openai_tools(), "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "again"},
    ]});
    let turn = openai_parse(&post(&url, &[], body.to_string()).await, false);
    assert_eq!(turn.finish, "tool_calls");
    assert_eq!(turn.calls[0].name, "read_file");
}

#[tokio::test]
async fn openai_tool_choice_none_answers_at_once() {
    let server = server().await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let body = json!({"model": "mock:rounds=3", "tools": openai_tools(), "tool_choice": "none",
        "messages": [{"role": "user", "content": "go"}]});
    let turn = openai_parse(&post(&url, &[], body.to_string()).await, false);
    assert_eq!(turn.finish, "stop");
    assert!(turn.text.unwrap().contains("saw 0 tool results"));
}

fn openai_history(answers: &[&str]) -> Value {
    let mut messages = vec![
        json!({"role": "user", "content": "go"}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_A", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
            {"id": "call_B", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        ]}),
    ];
    for id in answers {
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "ok"}));
    }
    json!({"model": "mock:rounds=3", "tools": openai_tools(), "messages": messages})
}

async fn openai_rejects(body: Value, needles: &[&str]) {
    let server = server().await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let post = post(&url, &[], body.to_string()).await;
    assert_eq!(post.status, StatusCode::BAD_REQUEST);
    let error = &post.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    let message = error["message"].as_str().expect("a message");
    for needle in needles {
        assert!(message.contains(needle), "`{needle}` not in: {message}");
    }
    assert_eq!(server.stats().rejected, 1);
}

#[tokio::test]
async fn openai_rejects_an_unanswered_call() {
    openai_rejects(
        openai_history(&["call_A"]),
        &["call_B", "did not have response"],
    )
    .await;
}

#[tokio::test]
async fn openai_rejects_a_call_answered_twice() {
    openai_rejects(
        openai_history(&["call_A", "call_B", "call_A"]),
        &["call_A", "second time"],
    )
    .await;
}

#[tokio::test]
async fn openai_rejects_an_unknown_id() {
    openai_rejects(
        openai_history(&["call_A", "call_B", "call_Z"]),
        &["call_Z", "not a call"],
    )
    .await;
}

#[tokio::test]
async fn openai_rejects_an_unanswered_call_followed_by_a_user_turn() {
    let mut body = openai_history(&[]);
    body["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "hello?"}));
    openai_rejects(body, &["call_A, call_B"]).await;
}

#[tokio::test]
async fn openai_rejects_a_tool_message_with_no_call_before_it() {
    let body = json!({"model": "mock", "messages": [
        {"role": "user", "content": "go"},
        {"role": "tool", "tool_call_id": "x", "content": "ok"}]});
    openai_rejects(body, &["messages[1]", "role 'tool'"]).await;
}

// ---------------------------------------------------------------- Anthropic

const ANTHROPIC_HEADERS: &[(&str, &str)] = &[("anthropic-version", "2023-06-01")];

fn anthropic_tools() -> Value {
    Value::Array(
        tools_schema()
            .into_iter()
            .map(|(name, schema)| json!({"name": name, "description": "d", "input_schema": schema}))
            .chain([json!({"type": "web_search_20250305", "name": "web_search"})])
            .collect(),
    )
}

fn anthropic_parse(post: &Post, stream: bool) -> Turn {
    assert_eq!(
        post.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&post.body)
    );
    if !stream {
        let body = post.json();
        assert_eq!(body["type"], "message");
        let mut calls = Vec::new();
        let mut text = String::new();
        for block in body["content"].as_array().unwrap() {
            match block["type"].as_str().unwrap() {
                "tool_use" => calls.push(SeenCall {
                    id: block["id"].as_str().unwrap().to_owned(),
                    name: block["name"].as_str().unwrap().to_owned(),
                    args: block["input"].clone(),
                }),
                "text" => text.push_str(block["text"].as_str().unwrap()),
                other => panic!("unexpected block {other}"),
            }
        }
        return Turn {
            calls,
            text: (!text.is_empty()).then_some(text),
            finish: body["stop_reason"].as_str().unwrap().to_owned(),
            usage: (
                body["usage"]["input_tokens"].as_u64().unwrap(),
                body["usage"]["output_tokens"].as_u64().unwrap(),
            ),
        };
    }
    let events = post.events();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e.event.as_deref().expect("every event is named"))
        .collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut text = String::new();
    let mut open: Option<usize> = None;
    let (mut input, mut output, mut finish) = (0, 0, None);
    for event in &events {
        let data: Value = serde_json::from_str(&event.data).unwrap();
        assert_eq!(Some(data["type"].as_str().unwrap()), event.event.as_deref());
        match event.event.as_deref().unwrap() {
            "message_start" => input = data["message"]["usage"]["input_tokens"].as_u64().unwrap(),
            "content_block_start" => {
                assert_eq!(open, None, "blocks do not overlap");
                let index = data["index"].as_u64().unwrap() as usize;
                open = Some(index);
                let block = &data["content_block"];
                if block["type"] == "tool_use" {
                    assert_eq!(index, calls.len());
                    assert_eq!(block["input"], json!({}));
                    calls.push((
                        block["id"].as_str().unwrap().to_owned(),
                        block["name"].as_str().unwrap().to_owned(),
                        String::new(),
                    ));
                }
            }
            "content_block_delta" => {
                let index = data["index"].as_u64().unwrap() as usize;
                assert_eq!(open, Some(index));
                let delta = &data["delta"];
                match delta["type"].as_str().unwrap() {
                    "input_json_delta" => calls[index]
                        .2
                        .push_str(delta["partial_json"].as_str().unwrap()),
                    "text_delta" => text.push_str(delta["text"].as_str().unwrap()),
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                assert_eq!(open.take(), Some(data["index"].as_u64().unwrap() as usize))
            }
            "message_delta" => {
                finish = Some(data["delta"]["stop_reason"].as_str().unwrap().to_owned());
                output = data["usage"]["output_tokens"].as_u64().unwrap();
            }
            "ping" | "message_stop" => {}
            other => panic!("unexpected event {other}"),
        }
    }
    Turn {
        calls: calls
            .into_iter()
            .map(|(id, name, args)| SeenCall {
                id,
                name,
                args: serde_json::from_str(&args).unwrap(),
            })
            .collect(),
        text: (!text.is_empty()).then_some(text),
        finish: finish.expect("a stop reason"),
        usage: (input, output),
    }
}

async fn anthropic_scenario(stream: bool) {
    let server = server().await;
    let url = format!("{}/v1/messages", server.base_url());
    let (rounds, parallel) = (3, 4);
    let model = format!("mock:rounds={rounds},parallel={parallel},chunk=5");
    let mut messages = vec![json!({"role": "user", "content": "do the thing"})];
    let mut ids = HashSet::new();
    for round in 0..=rounds {
        let body = json!({"model": model, "max_tokens": 1024, "system": "be brief",
            "messages": messages, "tools": anthropic_tools(), "stream": stream});
        let turn = anthropic_parse(
            &post(&url, ANTHROPIC_HEADERS, body.to_string()).await,
            stream,
        );
        assert!(turn.usage.0 > 0 && turn.usage.1 > 0);
        if round == rounds {
            assert_eq!(turn.finish, "end_turn");
            let text = turn.text.expect("final text");
            assert!(text.contains("saw 12 tool results"), "{text}");
            break;
        }
        assert_eq!(turn.finish, "tool_use");
        check_round(&turn.calls, round, parallel, &mut ids);
        messages.push(json!({"role": "assistant", "content": turn.calls.iter().map(|c| json!({
            "type": "tool_use", "id": c.id, "name": c.name, "input": c.args})).collect::<Vec<_>>()}));
        let mut results: Vec<Value> = turn
            .calls
            .iter()
            .map(|c| json!({"type": "tool_result", "tool_use_id": c.id, "content": "ok"}))
            .collect();
        // A reminder after the results, as the adapter sends it.
        results.push(json!({"type": "text", "text": "<system-reminder>r</system-reminder>"}));
        messages.push(json!({"role": "user", "content": results}));
    }
    assert_eq!(ids.len(), rounds * parallel);
    assert!(ids.iter().all(|id| id.starts_with("toolu_")));
    assert_eq!(server.stats().requests, rounds as u64 + 1);
    server.shutdown().await;
}

#[tokio::test]
async fn anthropic_multi_round_parallel_not_streamed() {
    anthropic_scenario(false).await;
}

#[tokio::test]
async fn anthropic_multi_round_parallel_streamed() {
    anthropic_scenario(true).await;
}

fn anthropic_history(results: Value) -> Value {
    json!({"model": "mock:rounds=3", "max_tokens": 100, "tools": anthropic_tools(), "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "calling"},
            {"type": "tool_use", "id": "toolu_A", "name": "read_file", "input": {}},
            {"type": "tool_use", "id": "toolu_B", "name": "search", "input": {}}]},
        {"role": "user", "content": results},
    ]})
}

async fn anthropic_rejects(body: Value, headers: &[(&str, &str)], needles: &[&str]) {
    let server = server().await;
    let url = format!("{}/v1/messages", server.base_url());
    let post = post(&url, headers, body.to_string()).await;
    assert_eq!(post.status, StatusCode::BAD_REQUEST);
    let json = post.json();
    assert_eq!(json["type"], "error");
    assert_eq!(json["error"]["type"], "invalid_request_error");
    let message = json["error"]["message"].as_str().expect("a message");
    for needle in needles {
        assert!(message.contains(needle), "`{needle}` not in: {message}");
    }
    assert_eq!(server.stats().rejected, 1);
}

fn result(id: &str) -> Value {
    json!({"type": "tool_result", "tool_use_id": id, "content": "ok"})
}

#[tokio::test]
async fn anthropic_rejects_an_unanswered_call() {
    let body = anthropic_history(json!([result("toolu_A")]));
    anthropic_rejects(
        body,
        ANTHROPIC_HEADERS,
        &["messages.1", "toolu_B", "without `tool_result`"],
    )
    .await;
}

#[tokio::test]
async fn anthropic_rejects_a_call_answered_twice() {
    let body = anthropic_history(json!([
        result("toolu_A"),
        result("toolu_B"),
        result("toolu_A")
    ]));
    anthropic_rejects(body, ANTHROPIC_HEADERS, &["toolu_A", "more than one"]).await;
}

#[tokio::test]
async fn anthropic_rejects_an_unknown_id() {
    let body = anthropic_history(json!([
        result("toolu_A"),
        result("toolu_B"),
        result("toolu_Z")
    ]));
    anthropic_rejects(
        body,
        ANTHROPIC_HEADERS,
        &["toolu_Z", "unexpected `tool_use_id`"],
    )
    .await;
}

#[tokio::test]
async fn anthropic_rejects_results_outside_the_next_user_turn() {
    // Text-only user turn in between: the results are no longer "immediately after".
    let mut body = anthropic_history(json!("hello"));
    body["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": [result("toolu_A"), result("toolu_B")]}));
    anthropic_rejects(body, ANTHROPIC_HEADERS, &["toolu_A, toolu_B"]).await;
}

#[tokio::test]
async fn anthropic_rejects_text_before_results() {
    let body = anthropic_history(json!([
        {"type": "text", "text": "here"}, result("toolu_A"), result("toolu_B")]));
    anthropic_rejects(body, ANTHROPIC_HEADERS, &["must come first"]).await;
}

#[tokio::test]
async fn anthropic_requires_version_header_and_max_tokens() {
    let body = anthropic_history(json!([result("toolu_A"), result("toolu_B")]));
    anthropic_rejects(body.clone(), &[], &["anthropic-version"]).await;
    let mut body = body;
    body.as_object_mut().unwrap().remove("max_tokens");
    anthropic_rejects(body, ANTHROPIC_HEADERS, &["max_tokens"]).await;
}

// ---------------------------------------------------------------- Gemini

fn gemini_tools() -> Value {
    let mut declarations: Vec<Value> = tools_schema()
        .into_iter()
        .map(|(name, schema)| json!({"name": name, "description": "d", "parameters": schema}))
        .collect();
    // OpenAPI-style capital types, as Gemini's own examples write them.
    declarations[1]["parameters"] = json!({"type": "OBJECT", "properties": {
        "dir": {"type": "STRING"}, "depth": {"type": "INTEGER", "minimum": 1}}});
    json!([{"functionDeclarations": declarations}])
}

fn gemini_chunk_parts(chunk: &Value, calls: &mut Vec<SeenCall>, text: &mut String) {
    let candidate = &chunk["candidates"][0];
    assert_eq!(candidate["content"]["role"], "model");
    for part in candidate["content"]["parts"].as_array().unwrap() {
        if let Some(call) = part.get("functionCall") {
            calls.push(SeenCall {
                id: String::new(),
                name: call["name"].as_str().unwrap().to_owned(),
                args: call["args"].clone(),
            });
        } else {
            text.push_str(part["text"].as_str().unwrap());
        }
    }
}

fn gemini_parse(post: &Post, mode: &str) -> Turn {
    assert_eq!(
        post.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&post.body)
    );
    let chunks: Vec<Value> = match mode {
        "generate" => vec![post.json()],
        "array" => post.json().as_array().expect("a JSON array").clone(),
        _ => post
            .events()
            .iter()
            .map(|e| serde_json::from_str(&e.data).unwrap())
            .collect(),
    };
    assert!(!chunks.is_empty());
    let mut calls = Vec::new();
    let mut text = String::new();
    for chunk in &chunks {
        gemini_chunk_parts(chunk, &mut calls, &mut text);
    }
    let last = chunks.last().unwrap();
    for chunk in &chunks[..chunks.len() - 1] {
        assert!(chunk["candidates"][0].get("finishReason").is_none());
    }
    Turn {
        calls,
        text: (!text.is_empty()).then_some(text),
        finish: last["candidates"][0]["finishReason"]
            .as_str()
            .unwrap()
            .to_owned(),
        usage: (
            last["usageMetadata"]["promptTokenCount"].as_u64().unwrap(),
            last["usageMetadata"]["candidatesTokenCount"]
                .as_u64()
                .unwrap(),
        ),
    }
}

async fn gemini_scenario(mode: &str) {
    let server = server().await;
    let (rounds, parallel) = (2, 3);
    let model = format!("mock:rounds={rounds},parallel={parallel},chunk=4");
    let url = match mode {
        "generate" => format!(
            "{}/v1beta/models/{model}:generateContent",
            server.base_url()
        ),
        "array" => format!(
            "{}/v1beta/models/{model}:streamGenerateContent",
            server.base_url()
        ),
        _ => format!(
            "{}/v1beta/models/{model}:streamGenerateContent?alt=sse",
            server.base_url()
        ),
    };
    let mut contents = vec![json!({"role": "user", "parts": [{"text": "do the thing"}]})];
    let mut ids = HashSet::new();
    for round in 0..=rounds {
        let body = json!({"contents": contents, "tools": gemini_tools(),
            "systemInstruction": {"parts": [{"text": "be brief"}]}});
        let turn = gemini_parse(&post(&url, &[], body.to_string()).await, mode);
        assert_eq!(turn.finish, "STOP");
        assert!(turn.usage.0 > 0 && turn.usage.1 > 0);
        if round == rounds {
            assert!(turn.calls.is_empty());
            let text = turn.text.expect("final text");
            assert!(text.contains("saw 6 tool results"), "{text}");
            break;
        }
        check_round(&turn.calls, round, parallel, &mut ids);
        contents.push(
            json!({"role": "model", "parts": turn.calls.iter().map(|c| json!({
            "functionCall": {"name": c.name, "args": c.args}})).collect::<Vec<_>>()}),
        );
        contents.push(json!({"role": "user", "parts": turn.calls.iter().map(|c| json!({
            "functionResponse": {"name": c.name, "response": {"result": "ok"}}})).collect::<Vec<_>>()}));
    }
    assert_eq!(server.stats().requests, rounds as u64 + 1);
    server.shutdown().await;
}

#[tokio::test]
async fn gemini_multi_round_parallel_not_streamed() {
    gemini_scenario("generate").await;
}

#[tokio::test]
async fn gemini_multi_round_parallel_streamed_sse() {
    gemini_scenario("sse").await;
}

#[tokio::test]
async fn gemini_multi_round_parallel_streamed_json_array() {
    gemini_scenario("array").await;
}

fn gemini_history(responses: &[&str]) -> Value {
    json!({"tools": gemini_tools(), "contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [
            {"functionCall": {"name": "read_file", "args": {}}},
            {"functionCall": {"name": "search", "args": {}}}]},
        {"role": "user", "parts": responses.iter().map(|n| json!(
            {"functionResponse": {"name": n, "response": {}}})).collect::<Vec<_>>()},
    ]})
}

async fn gemini_rejects(body: Value, needles: &[&str]) {
    let server = server().await;
    let url = format!("{}/v1beta/models/mock:generateContent", server.base_url());
    let post = post(&url, &[], body.to_string()).await;
    assert_eq!(post.status, StatusCode::BAD_REQUEST);
    let json = post.json();
    assert_eq!(json["error"]["code"], 400);
    assert_eq!(json["error"]["status"], "INVALID_ARGUMENT");
    let message = json["error"]["message"].as_str().expect("a message");
    for needle in needles {
        assert!(message.contains(needle), "`{needle}` not in: {message}");
    }
    assert_eq!(server.stats().rejected, 1);
}

#[tokio::test]
async fn gemini_rejects_an_unanswered_call() {
    gemini_rejects(
        gemini_history(&["read_file"]),
        &["search", "number of function response"],
    )
    .await;
}

#[tokio::test]
async fn gemini_rejects_a_call_answered_twice() {
    gemini_rejects(
        gemini_history(&["read_file", "search", "read_file"]),
        &["read_file", "more calls than"],
    )
    .await;
}

#[tokio::test]
async fn gemini_rejects_an_unknown_function() {
    gemini_rejects(
        gemini_history(&["read_file", "search", "delete_all"]),
        &["delete_all", "matches no functionCall"],
    )
    .await;
}

#[tokio::test]
async fn gemini_answers_calls_of_the_same_name_in_order() {
    let server = server().await;
    let url = format!(
        "{}/v1beta/models/mock:rounds=2:generateContent",
        server.base_url()
    );
    let body = json!({"tools": gemini_tools(), "contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [
            {"functionCall": {"name": "read_file", "args": {}}},
            {"functionCall": {"name": "read_file", "args": {}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "read_file", "response": {}}},
            {"functionResponse": {"name": "read_file", "response": {}}}]},
    ]});
    let turn = gemini_parse(&post(&url, &[], body.to_string()).await, "generate");
    assert_eq!(turn.calls.len(), 1);
    assert_eq!(turn.calls[0].name, "list_dir");
}

// ---------------------------------------------------------------- all protocols

/// A request to send: url, headers, body.
type Request = (String, Vec<(&'static str, &'static str)>, Value);

/// A plain first request with `model`, for each protocol.
fn first_requests(base: &str, model: &str) -> Vec<Request> {
    vec![
        (
            format!("{base}/v1/chat/completions"),
            vec![],
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            format!("{base}/v1/messages"),
            ANTHROPIC_HEADERS.to_vec(),
            json!({"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            format!("{base}/v1beta/models/{model}:generateContent"),
            vec![],
            json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
        ),
    ]
}

fn error_message(json: &Value) -> String {
    json["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn bad_scenarios_are_rejected_by_every_protocol() {
    let server = server().await;
    let cases = [
        ("mock:rounds=lots", "rounds"),
        ("mock:parallel=0", "parallel"),
        ("mock:latency=fast", "latency"),
        ("mock:colour=blue", "unknown key `colour`"),
        ("mock:text_calls=1", "expects a dialect"),
        ("mock:faults=1.5", "faults"),
        ("mock:fault_kinds=404", "fault_kinds"),
        ("mock:rounds", "not `key=value`"),
    ];
    let mut rejected = 0;
    for (model, needle) in cases {
        for (url, headers, body) in first_requests(&server.base_url(), model) {
            let post = post(&url, &headers, body.to_string()).await;
            assert_eq!(post.status, StatusCode::BAD_REQUEST, "{url}");
            let message = error_message(&post.json());
            assert!(
                message.contains(needle),
                "{url}: `{needle}` not in {message}"
            );
            rejected += 1;
        }
    }
    assert_eq!(server.stats().rejected, rejected);
}

#[tokio::test]
async fn malformed_bodies_get_400_in_each_shape() {
    let server = server().await;
    for (url, headers, _) in first_requests(&server.base_url(), "mock") {
        for body in ["{not json", "", "[1,2]", "{\"model\": 5}", "\u{0}\u{ff}"] {
            let post = post(&url, &headers, body.to_owned()).await;
            assert_eq!(post.status, StatusCode::BAD_REQUEST, "{url} {body:?}");
            assert!(!error_message(&post.json()).is_empty(), "{url} {body:?}");
        }
    }
    // Wrong shapes for the fields the mock reads.
    let base = server.base_url();
    let weird = [
        json!({"model": "mock", "messages": "hi"}),
        json!({"model": "mock", "messages": [{"role": "assistant", "tool_calls": [{"id": 1}]}]}),
        json!({"model": "mock", "messages": []}),
        json!({"model": "mock", "messages": [{"role": "wizard", "content": "x"}]}),
    ];
    for body in weird {
        let post = post(
            &format!("{base}/v1/chat/completions"),
            &[],
            body.to_string(),
        )
        .await;
        assert_eq!(post.status, StatusCode::BAD_REQUEST, "{body}");
    }
    let post = post(
        &format!("{base}/v1/messages"),
        ANTHROPIC_HEADERS,
        json!({"model": "mock", "max_tokens": 5, "messages": [{"role": "user", "content": null}]})
            .to_string(),
    )
    .await;
    assert_eq!(post.status, StatusCode::BAD_REQUEST);
    assert!(error_message(&post.json()).contains("a string or an array"));
}

#[tokio::test]
async fn unknown_paths_and_methods_get_errors() {
    let server = server().await;
    let base = server.base_url();
    let missing = post(&format!("{base}/v1/completions"), &[], "{}").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(error_message(&missing.json()).contains("/v1/completions"));
    let embed = post(
        &format!("{base}/v1beta/models/mock:embedContent"),
        &[],
        "{}",
    )
    .await;
    assert_eq!(embed.status, StatusCode::NOT_FOUND);
    assert_eq!(embed.json()["error"]["status"], "NOT_FOUND");
    let get = http_client()
        .get(format!("{base}/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), StatusCode::METHOD_NOT_ALLOWED);
    let models: Value = http_client()
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "mock");
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let server = start(MockOptions {
        max_body_bytes: 1024,
        ..MockOptions::default()
    })
    .await
    .unwrap();
    let big = json!({"model": "mock", "messages": [{"role": "user", "content": "x".repeat(4096)}]});
    let post = post(
        &format!("{}/v1/chat/completions", server.base_url()),
        &[],
        big.to_string(),
    )
    .await;
    assert_eq!(post.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(post.json()["error"]["message"].is_string());
}

#[tokio::test]
async fn latency_is_honoured() {
    let server = server().await;
    for (url, headers, body) in first_requests(&server.base_url(), "mock:rounds=0,latency=150ms") {
        let post = post(&url, &headers, body.to_string()).await;
        assert_eq!(post.status, StatusCode::OK);
        assert!(
            post.elapsed >= Duration::from_millis(150),
            "{url}: {:?}",
            post.elapsed
        );
        assert!(
            post.elapsed < Duration::from_secs(3),
            "{url}: {:?}",
            post.elapsed
        );
        let timing = post.headers["server-timing"].to_str().unwrap();
        let ms: f64 = timing.trim_start_matches("mock;dur=").parse().unwrap();
        assert!(ms >= 150.0, "{timing}");
    }
    let stats = server.stats();
    assert!(
        stats.mean_processing() >= Duration::from_millis(150),
        "{stats:?}"
    );
    // Without latency it is fast.
    let (url, headers, body) = first_requests(&server.base_url(), "mock:rounds=0").remove(0);
    let post = post(&url, &headers, body.to_string()).await;
    assert!(
        post.elapsed < Duration::from_millis(150),
        "{:?}",
        post.elapsed
    );
}

#[tokio::test]
async fn default_latency_applies_when_the_scenario_sets_none() {
    let server = start(MockOptions {
        default_latency: Some(Duration::from_millis(120)),
        ..MockOptions::default()
    })
    .await
    .unwrap();
    let (url, headers, body) = first_requests(&server.base_url(), "mock").remove(0);
    let slow = post(&url, &headers, body.to_string()).await;
    assert!(
        slow.elapsed >= Duration::from_millis(120),
        "{:?}",
        slow.elapsed
    );
    let (url, headers, body) = first_requests(&server.base_url(), "mock:latency=0").remove(0);
    let fast = post(&url, &headers, body.to_string()).await;
    assert!(
        fast.elapsed < Duration::from_millis(120),
        "{:?}",
        fast.elapsed
    );
}

#[tokio::test]
async fn chunk_delay_paces_the_stream() {
    let server = server().await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let body = json!({"model": "mock:rounds=0,chunk=10,chunk_delay=40ms", "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let response = http_client()
        .post(&url)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let started = Instant::now();
    let mut stream = response.bytes_stream();
    let mut arrivals = 0;
    let mut all = Vec::new();
    use futures::StreamExt;
    while let Some(chunk) = stream.next().await {
        all.extend_from_slice(&chunk.unwrap());
        arrivals += 1;
    }
    let mut decoder = SseDecoder::new();
    let events = decoder.push(&all);
    // role chunk + text pieces + finish chunk + [DONE]
    assert!(events.len() >= 5, "{}", events.len());
    assert!(
        arrivals >= 3,
        "events arrive separately, got {arrivals} reads"
    );
    let expected = Duration::from_millis(40) * (events.len() as u32 - 2);
    assert!(
        started.elapsed() >= expected,
        "{:?} < {expected:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn stats_count_requests_and_rejections() {
    let server = server().await;
    assert_eq!(server.stats(), Default::default());
    for (url, headers, body) in first_requests(&server.base_url(), "mock") {
        assert_eq!(
            post(&url, &headers, body.to_string()).await.status,
            StatusCode::OK
        );
    }
    for (url, headers, _) in first_requests(&server.base_url(), "mock") {
        assert_eq!(
            post(&url, &headers, "nope").await.status,
            StatusCode::BAD_REQUEST
        );
    }
    let stats = server.stats();
    assert_eq!(stats.requests, 6);
    assert_eq!(stats.rejected, 3);
    assert!(stats.processing > Duration::ZERO);
    assert!(stats.max_processing >= stats.mean_processing());
    assert!(stats.processing >= stats.max_processing);
    server.shutdown().await;
}

#[tokio::test]
async fn many_concurrent_conversations() {
    let server = server().await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let client = http_client();
    let loops = 64;
    let tasks = (0..loops).map(|_| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            let mut messages = vec![json!({"role": "user", "content": "go"})];
            loop {
                let body = json!({"model": "mock:rounds=3,parallel=2", "messages": messages,
                    "tools": openai_tools()});
                let reply: Value = client
                    .post(&url)
                    .body(body.to_string())
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let message = reply["choices"][0]["message"].clone();
                let Some(calls) = message["tool_calls"].as_array().cloned() else {
                    return message["content"].as_str().unwrap().to_owned();
                };
                messages.push(message);
                for call in calls {
                    messages
                        .push(json!({"role": "tool", "tool_call_id": call["id"], "content": "ok"}));
                }
            }
        })
    });
    for answer in futures::future::join_all(tasks).await {
        assert!(answer.unwrap().contains("saw 6 tool results"));
    }
    let stats = server.stats();
    assert_eq!(stats.requests, loops * 4);
    assert_eq!(stats.rejected, 0);
}

#[tokio::test]
async fn shutdown_stops_the_server() {
    let server = server().await;
    let url = format!("{}/v1/models", server.base_url());
    assert!(
        http_client()
            .get(&url)
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    server.shutdown().await;
    let client = http_client_builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    assert!(client.get(&url).send().await.is_err());
}

/// A reqwest client builder, with the process's TLS crypto provider installed first (reqwest
/// builds its TLS configuration from it, even for plain HTTP).
#[allow(dead_code)]
fn http_client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// A reqwest client with the defaults.
#[allow(dead_code)]
fn http_client() -> reqwest::Client {
    http_client_builder()
        .build()
        .expect("the HTTP client builds")
}
