//! The least a tool-calling loop has to do, written by hand, as a reference for the real loop's
//! share of the ceiling: no engine, no budgets, no retries, no timeouts, no hooks.
//!
//! It keeps the encoded messages of the next request, and, as [`Keep`] says, nothing else of the
//! conversation (the least memory and the least encoding a loop can do), or also the
//! conversation as toolloop's own message types (and, if asked, a record of each call, as a
//! run's outcome has it), or as JSON values, as many hand-written clients keep it. Each round it sends those bytes and the rest of the request (encoded once per run) on
//! the same bare HTTP client as the ceiling, decodes the reply into typed structures (derived, as
//! a hand-written client would), parses each call's arguments, runs the echo tool on them, and
//! appends the encoding of the assistant's message and of the results to its messages with
//! serde_json. It stops at the first reply without calls. What it sends has the shape and size of
//! the real loop's bodies (`floor` checks the sizes).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use toolloop::message::{AssistantMessage, Message, ToolCall, ToolResult};
use toolloop::outcome::{CallStatus, ExecutedCall};

#[derive(Deserialize)]
struct Reply {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    message: Assistant,
}

#[derive(Deserialize)]
struct Assistant {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<Call>,
}

#[derive(Deserialize)]
struct Call {
    id: String,
    function: Function,
}

#[derive(Deserialize)]
struct Function {
    name: String,
    arguments: String,
}

/// What every run starts from: the first request's messages, encoded, and its other fields,
/// encoded once.
pub(crate) struct Template {
    /// The first request's messages.
    first: Vec<Value>,
    /// `[` and the first request's messages, without the closing `]`.
    messages: Vec<u8>,
    /// The first request's fields but `messages`, encoded, without the braces.
    rest: Vec<u8>,
}

impl Template {
    /// Takes the first request body a real run sent.
    pub(crate) fn from_first_body(body: &[u8]) -> Template {
        let mut fields: Map<String, Value> = serde_json::from_slice(body).expect("a JSON object");
        let Some(Value::Array(first)) = fields.remove("messages") else {
            panic!("the first body has messages");
        };
        let mut messages = serde_json::to_vec(&first).expect("encodes");
        messages.pop();
        let rest = serde_json::to_vec(&Value::Object(fields)).expect("encodes");
        let rest = rest[1..rest.len() - 1].to_vec();
        Template {
            first,
            messages,
            rest,
        }
    }
}

#[derive(Serialize)]
struct AssistantOut<'a> {
    role: &'static str,
    content: Option<&'a str>,
    tool_calls: Vec<CallOut<'a>>,
}

#[derive(Serialize)]
struct CallOut<'a> {
    id: &'a str,
    r#type: &'static str,
    function: FunctionOut<'a>,
}

#[derive(Serialize)]
struct FunctionOut<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct ToolOut<'a> {
    role: &'static str,
    tool_call_id: &'a str,
    content: &'a str,
}

/// What a minimal loop keeps of its conversation.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Keep {
    /// Only the encoded messages of the next body: each round appends the new messages'
    /// encoding to them, and each body is those bytes and the run's other fields.
    Bytes,
    /// Those bytes, and the conversation as JSON values (the messages as the wire has them,
    /// which a caller could read back): each round's new messages are made as values, kept, and
    /// encoded from them.
    Values,
    /// Those bytes, and the conversation as toolloop's own messages (`Message`, each call's
    /// arguments parsed into a `Value`), encoded from them.
    Messages,
    /// As `Messages`, and a record of every call as a run's outcome gives it
    /// ([`ExecutedCall`]: the call and its result's content, copied from the conversation).
    Record,
}

/// One whole run on `client`; gives the rounds it took and the bytes of the bodies it sent.
pub(crate) async fn run(
    client: &reqwest::Client,
    endpoint: &reqwest::Url,
    template: &Template,
    keep: Keep,
) -> (usize, usize) {
    let mut transcript: Vec<Value> = match keep {
        Keep::Values => template.first.clone(),
        _ => Vec::new(),
    };
    let mut typed: Vec<Message> = match keep {
        Keep::Messages | Keep::Record => vec![Message::user("go")],
        _ => Vec::new(),
    };
    let mut record: Vec<ExecutedCall> = Vec::new();
    let mut messages = Vec::with_capacity(4096);
    messages.extend_from_slice(&template.messages);
    let (mut rounds, mut sent) = (0, 0);
    loop {
        // Each body in a buffer of its own, handed to the client without a copy.
        let mut body = Vec::with_capacity(messages.len() + template.rest.len() + 16);
        body.extend_from_slice(b"{\"messages\":");
        body.extend_from_slice(&messages);
        body.extend_from_slice(b"],");
        body.extend_from_slice(&template.rest);
        body.push(b'}');
        sent += body.len();
        let response = client
            .post(endpoint.clone())
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("mock answers");
        assert!(response.status().is_success());
        let bytes = response.bytes().await.expect("body");
        rounds += 1;
        let mut reply: Reply = serde_json::from_slice(&bytes).expect("a chat completion");
        let message = reply.choices.swap_remove(0).message;
        if message.tool_calls.is_empty() {
            assert!(message.content.is_some(), "an answer");
            match keep {
                Keep::Values => {
                    transcript.push(json!({"role": "assistant", "content": message.content}))
                }
                Keep::Messages | Keep::Record => {
                    typed.push(Message::assistant(message.content.unwrap_or_default()))
                }
                Keep::Bytes => {}
            }
            return (rounds, sent);
        }
        if matches!(keep, Keep::Messages | Keep::Record) {
            let before = typed.len();
            let mut calls = Vec::with_capacity(message.tool_calls.len());
            for call in message.tool_calls {
                let arguments: Value =
                    serde_json::from_str(&call.function.arguments).expect("arguments");
                let content = echo(arguments.clone()).to_string();
                let call = ToolCall {
                    id: call.id,
                    name: call.function.name,
                    arguments,
                    invalid_arguments: None,
                    provider_data: None,
                };
                if keep == Keep::Record {
                    record.push(ExecutedCall {
                        round: rounds as u32,
                        call: call.clone(),
                        status: CallStatus::Ok,
                        content: content.clone(),
                        duration_ms: 0,
                        attempts: 1,
                        spent: None,
                    });
                }
                typed.push(Message::Tool(ToolResult {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content,
                    is_error: false,
                    images: Vec::new(),
                }));
                calls.push(call);
            }
            let assistant = Message::Assistant(AssistantMessage {
                text: message.content,
                tool_calls: calls,
                parts: Vec::new(),
            });
            typed.insert(before, assistant);
            for m in &typed[before..] {
                messages.push(b',');
                write_message(&mut messages, m);
            }
            continue;
        }
        if keep == Keep::Values {
            let before = transcript.len();
            let mut calls = Vec::with_capacity(message.tool_calls.len());
            for call in message.tool_calls {
                let args: Value =
                    serde_json::from_str(&call.function.arguments).expect("arguments");
                transcript.push(json!({
                    "role": "tool",
                    "tool_call_id": &call.id,
                    "content": echo(args).to_string(),
                }));
                calls.push(json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }));
            }
            let assistant =
                json!({"role": "assistant", "content": message.content, "tool_calls": calls});
            transcript.insert(before, assistant);
            for m in &transcript[before..] {
                messages.push(b',');
                serde_json::to_writer(&mut messages, m).expect("encodes");
            }
            continue;
        }
        let results: Vec<String> = message
            .tool_calls
            .iter()
            .map(|call| {
                let args: Value =
                    serde_json::from_str(&call.function.arguments).expect("arguments");
                echo(args).to_string()
            })
            .collect();
        let assistant = AssistantOut {
            role: "assistant",
            content: message.content.as_deref(),
            tool_calls: message
                .tool_calls
                .iter()
                .map(|c| CallOut {
                    id: &c.id,
                    r#type: "function",
                    function: FunctionOut {
                        name: &c.function.name,
                        arguments: &c.function.arguments,
                    },
                })
                .collect(),
        };
        messages.push(b',');
        serde_json::to_writer(&mut messages, &assistant).expect("encodes");
        for (call, content) in message.tool_calls.iter().zip(&results) {
            messages.push(b',');
            let tool = ToolOut {
                role: "tool",
                tool_call_id: &call.id,
                content,
            };
            serde_json::to_writer(&mut messages, &tool).expect("encodes");
        }
    }
}

/// Writes one of toolloop's messages as the OpenAI wire has it (a call's arguments as the text of
/// their JSON).
fn write_message(out: &mut Vec<u8>, m: &Message) {
    match m {
        Message::Assistant(a) => {
            let arguments: Vec<String> = a
                .tool_calls
                .iter()
                .map(|c| c.arguments.to_string())
                .collect();
            let assistant = AssistantOut {
                role: "assistant",
                content: a.text.as_deref(),
                tool_calls: a
                    .tool_calls
                    .iter()
                    .zip(&arguments)
                    .map(|(c, arguments)| CallOut {
                        id: &c.id,
                        r#type: "function",
                        function: FunctionOut {
                            name: &c.name,
                            arguments,
                        },
                    })
                    .collect(),
            };
            serde_json::to_writer(out, &assistant).expect("encodes");
        }
        Message::Tool(r) => {
            let tool = ToolOut {
                role: "tool",
                tool_call_id: &r.call_id,
                content: &r.content,
            };
            serde_json::to_writer(out, &tool).expect("encodes");
        }
        other => serde_json::to_writer(out, other).expect("encodes"),
    }
}

/// The benchmark's tool: gives back its arguments, in the envelope the real loop's tool result
/// has (`ToolOutput::data`), so that both loops send the same bytes.
fn echo(args: Value) -> Value {
    json!({"success": true, "message": "ok", "data": args})
}
