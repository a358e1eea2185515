//! Prompt-based tool calling: round trips in every dialect, streaming in arbitrary chunks, and
//! the prompted adapter running the PTK Manager's flow over a scripted model.

use async_trait::async_trait;
use futures::StreamExt;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use toolloop::message::{Message, ToolCall, ToolResult};
use toolloop::model::{
    EventStream, FinishReason, Model, ModelError, ModelRequest, ModelResponse, ModelSettings,
    ToolChoice, ToolSpec,
};
use toolloop::ptk::{Dialect, ParsedReply, Prompted, StreamParser, parse_reply, write_calls};
use toolloop::stream::StreamEvent;

// ---------------------------------------------------------------------------------------------
// Generators

fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z ]{0,12}",
        any::<String>(),
        // Strings full of the format's own syntax.
        proptest::collection::vec(
            prop_oneof![
                Just("<PTK_CALL>"),
                Just("</PTK_CALL>"),
                Just("<tool_call>"),
                Just("</tool_call>"),
                Just("[TOOL_CALLS]"),
                Just("[ARGS]"),
                Just("```"),
                Just("<function=x>"),
                Just("</parameter>"),
                Just("<parameter=y>"),
                Just("</function>"),
                Just("\n"),
                Just("\""),
                Just("'"),
                Just("\\"),
                Just("{"),
                Just("}"),
                Just(";"),
                Just("é"),
                Just(" "),
                Just("<|python_tag|>"),
                Just("null"),
                Just("42"),
            ],
            0..8,
        )
        .prop_map(|v| v.concat()),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        json_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-zA-Z_][a-zA-Z0-9_ ]{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn args() -> impl Strategy<Value = Value> {
    proptest::collection::btree_map("[a-z_][a-z0-9_]{0,8}", json_value(), 0..5)
        .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()))
}

fn calls() -> impl Strategy<Value = Vec<(String, Value)>> {
    proptest::collection::vec(("[a-zA-Z_][a-zA-Z0-9_.-]{0,12}", args()), 1..4).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (n, a))| (format!("{n}{i}"), a))
            .collect()
    })
}

/// Text that holds no character that could start a call, so any such character in a text delta
/// is a leak.
fn prose() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 ,.!?é\n]{0,40}"
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Tools whose schemas match the generated arguments (Qwen3-Coder values are typed by them).
fn tools_for(calls: &[(String, Value)]) -> Vec<ToolSpec> {
    calls
        .iter()
        .map(|(name, args)| {
            let props: Map<String, Value> = args
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), json!({"type": type_of(v)})))
                        .collect()
                })
                .unwrap_or_default();
            ToolSpec {
                name: name.clone(),
                description: String::new(),
                parameters: json!({"type": "object", "properties": props}),
            }
        })
        .collect()
}

fn tool_calls(calls: &[(String, Value)]) -> Vec<ToolCall> {
    calls
        .iter()
        .map(|(n, a)| ToolCall::new(n.clone(), a.clone()))
        .collect()
}

fn dialect() -> impl Strategy<Value = Dialect> {
    proptest::sample::select(Dialect::ALL.to_vec())
}

fn expected_text(before: &str, after: &str) -> Option<String> {
    let parts: Vec<&str> = [before.trim(), after.trim()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    (!parts.is_empty()).then(|| parts.join("\n"))
}

// ---------------------------------------------------------------------------------------------
// Streaming helpers

/// What a reply means, independent of ids and of how text was split.
#[derive(Debug, PartialEq)]
struct Meaning {
    text: Option<String>,
    reasoning: Option<String>,
    calls: Vec<(String, Value, bool)>,
    malformed: Vec<String>,
    raws: Vec<String>,
}

fn meaning_of_reply(r: &ParsedReply) -> Meaning {
    Meaning {
        text: r.text.clone(),
        reasoning: r.reasoning.clone(),
        calls: r
            .calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone(), c.repaired))
            .collect(),
        malformed: r
            .near_miss
            .iter()
            .flat_map(|m| m.split("\n\n").map(str::to_string).collect::<Vec<_>>())
            .collect(),
        raws: r.malformed.clone(),
    }
}

fn meaning_of_events(events: &[StreamEvent]) -> Meaning {
    let mut text = String::new();
    let mut calls: Vec<(String, String, bool)> = Vec::new();
    let mut malformed = Vec::new();
    let mut raws = Vec::new();
    let mut reasoning: Vec<String> = Vec::new();
    for e in events {
        match e {
            StreamEvent::TextDelta(t) => text.push_str(t),
            StreamEvent::ToolCallStart { index, id, name } => {
                assert_eq!(*index, calls.len(), "indices count up");
                assert!(id.as_deref().is_some_and(|i| i.starts_with("call_")));
                calls.push((name.clone(), String::new(), false));
            }
            StreamEvent::ToolCallDelta { index, arguments } => calls[*index].1.push_str(arguments),
            StreamEvent::ToolCallData { index, data } => {
                assert_eq!(data, &json!({"repaired": true}));
                calls[*index].2 = true;
            }
            StreamEvent::ToolCallEnd { .. } => {}
            StreamEvent::MalformedCall(m) => malformed.extend(m.split("\n\n").map(str::to_string)),
            StreamEvent::Part(p) => {
                assert_eq!(p.provider, "ptk");
                match p.data.get("reasoning").and_then(Value::as_str) {
                    Some(r) => reasoning.push(r.to_string()),
                    None => raws.push(p.data["malformed"].as_str().unwrap().to_string()),
                }
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    Meaning {
        text: (!text.is_empty()).then_some(text),
        reasoning: (!reasoning.is_empty()).then(|| reasoning.join("\n")),
        calls: calls
            .into_iter()
            .map(|(n, a, r)| (n, serde_json::from_str(&a).expect("arguments are JSON"), r))
            .collect(),
        malformed,
        raws,
    }
}

/// Cuts `text` at the given fractions (snapped to char boundaries).
fn cut(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| {
            let mut p = c % (text.len() + 1);
            while !text.is_char_boundary(p) {
                p -= 1;
            }
            p
        })
        .collect();
    points.push(0);
    points.push(text.len());
    points.sort_unstable();
    points.dedup();
    points
        .windows(2)
        .map(|w| text[w[0]..w[1]].to_string())
        .collect()
}

fn stream_events(chunks: &[String], tools: &[ToolSpec]) -> Vec<StreamEvent> {
    feed(StreamParser::new(tools), chunks)
}

/// The events of a reply that may begin inside reasoning opened by the chat template.
fn implicit_think_events(chunks: &[String], tools: &[ToolSpec]) -> Vec<StreamEvent> {
    feed(StreamParser::with_implicit_think(tools), chunks)
}

fn feed(mut parser: StreamParser, chunks: &[String]) -> Vec<StreamEvent> {
    let mut events = Vec::new();
    for c in chunks {
        events.extend(parser.push(c));
    }
    events.extend(parser.finish());
    events
}

/// Fragments that make messy replies: tags of every dialect, JSON pieces, prose.
fn messy_reply() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("<PTK_CALL>"),
            Just("</PTK_CALL>"),
            Just("<tool_call>"),
            Just("</tool_call>"),
            Just("<ptk_call"),
            Just("[TOOL_CALLS]"),
            Just("[ARGS]"),
            Just("[CALL_ID]"),
            Just("```json\n"),
            Just("```"),
            Just("<function=read_file>"),
            Just("<parameter=path>"),
            Just("</parameter>"),
            Just("</function>"),
            Just("<|python_tag|>"),
            Just("<|eom_id|>"),
            Just("{"),
            Just("}"),
            Just("["),
            Just("]"),
            Just("\"tool\": \"read_file\""),
            Just("\"name\": \"read_file\""),
            Just("\"args\": {\"path\": \"a\"}"),
            Just("\"parameters\": {}"),
            Just(", "),
            Just(": "),
            Just(";"),
            Just("'"),
            Just("\""),
            Just("\n"),
            Just("\n\n"),
            Just(" "),
            Just("hello"),
            Just("é"),
            Just("True"),
            Just("read_file"),
            Just("<"),
            Just("`"),
            Just("<think>"),
            Just("</think>"),
            Just("<｜tool▁calls▁begin｜>"),
            Just("<｜tool▁call▁begin｜>"),
            Just("function<｜tool▁sep｜>read_file\n"),
            Just("read_file<｜tool▁sep｜>"),
            Just("<｜tool▁call▁end｜>"),
            Just("<｜tool▁calls▁end｜>"),
            Just("<|tool_calls_section_begin|>"),
            Just("<|tool_call_begin|>functions.read_file:0"),
            Just("<|tool_call_argument_begin|>"),
            Just("<|tool_call_end|>"),
            Just("<|tool_calls_section_end|>"),
            Just("<tool_call>read_file\n"),
            Just("<arg_key>path</arg_key>"),
            Just("<arg_value>a</arg_value>"),
            Just("[read_file("),
            Just("path='a'"),
            Just(")]"),
            Just("<|python_start|>"),
        ],
        0..30,
    )
    .prop_map(|v| v.concat())
}

fn read_file_tool() -> ToolSpec {
    ToolSpec {
        name: "read_file".into(),
        description: "Read content of a file".into(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": "File path"}},
            "required": ["path"]
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// Property tests

proptest! {
    #![proptest_config(ProptestConfig::default())]

    /// Calls written in any dialect read back as the same calls, text around them kept.
    #[test]
    fn written_calls_parse_back(d in dialect(), calls in calls(), before in prose(), after in prose()) {
        let tools = tools_for(&calls);
        let reply = format!("{before}\n{}\n{after}", write_calls(d, &tool_calls(&calls)));
        let parsed = parse_reply(&reply, &tools);
        prop_assert_eq!(parsed.near_miss.as_deref(), None, "reply: {}", reply);
        let got: Vec<(String, Value)> =
            parsed.calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect();
        prop_assert_eq!(got, calls.clone(), "reply: {}", reply);
        prop_assert!(parsed.calls.iter().all(|c| !c.repaired), "reply: {}", reply);
        prop_assert_eq!(parsed.text, expected_text(&before, &after), "reply: {}", reply);
    }

    /// A valid reply cut into arbitrary chunks streams to the same result as one chunk, and no
    /// text delta ever holds a fragment of a tag.
    #[test]
    fn valid_reply_streams_the_same_in_any_chunks(
        d in dialect(), calls in calls(), before in prose(), after in prose(),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let tools = tools_for(&calls);
        let reply = format!("{before}\n{}\n{after}", write_calls(d, &tool_calls(&calls)));
        let whole = meaning_of_reply(&parse_reply(&reply, &tools));
        let events = stream_events(&cut(&reply, &cuts), &tools);
        for e in &events {
            if let StreamEvent::TextDelta(t) = e {
                prop_assert!(
                    !t.contains(['<', '[', '`', '{', '|', '>', ']', '}']),
                    "tag fragment in text delta {:?} of {:?}", t, reply
                );
            }
        }
        prop_assert_eq!(meaning_of_events(&events), whole, "reply: {}", reply);
    }

    /// Any reply, however messy, streams to the same meaning as parse_reply gives.
    #[test]
    fn messy_reply_streams_the_same_in_any_chunks(
        reply in messy_reply(),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
        with_tools in any::<bool>(),
    ) {
        let tools = if with_tools { vec![read_file_tool()] } else { vec![] };
        let whole = meaning_of_reply(&parse_reply(&reply, &tools));
        let one_chunk = meaning_of_events(&stream_events(std::slice::from_ref(&reply), &tools));
        prop_assert_eq!(&one_chunk, &whole, "reply: {:?}", reply);
        let chunked = meaning_of_events(&stream_events(&cut(&reply, &cuts), &tools));
        prop_assert_eq!(chunked, whole, "reply: {:?}", reply);
    }

    /// With the `<think>` opener implicit: any reply streams to the same meaning in any chunks;
    /// a reply with `</think>` and no `<think>` before it is that reasoning, then the rest read
    /// as usual; a reply with no `</think>`, or a `<think>` first, reads as without the option.
    #[test]
    fn implicit_think_streams_the_same_in_any_chunks(
        before in messy_reply(),
        after in messy_reply(),
        close in any::<bool>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let tools = vec![read_file_tool()];
        let reply = if close { format!("{before}</think>{after}") } else { before.clone() };
        let one_chunk = meaning_of_events(&implicit_think_events(std::slice::from_ref(&reply), &tools));
        let chunked = meaning_of_events(&implicit_think_events(&cut(&reply, &cuts), &tools));
        prop_assert_eq!(&chunked, &one_chunk, "reply: {:?}", reply);
        let lower = reply.to_ascii_lowercase();
        let (open, shut) = (lower.find("<think>"), lower.find("</think>"));
        match shut {
            Some(k) if open.is_none_or(|o| o > k) => {
                let rest = meaning_of_reply(&parse_reply(&reply[k + "</think>".len()..], &tools));
                let reasoning = reply[..k].trim();
                let expected = match (reasoning.is_empty(), rest.reasoning.clone()) {
                    (true, r) => r,
                    (false, None) => Some(reasoning.to_string()),
                    (false, Some(r)) => Some(format!("{reasoning}\n{r}")),
                };
                prop_assert_eq!(&one_chunk.reasoning, &expected, "reply: {:?}", reply);
                prop_assert_eq!(&one_chunk.text, &rest.text, "reply: {:?}", reply);
                prop_assert_eq!(&one_chunk.calls, &rest.calls, "reply: {:?}", reply);
            }
            _ => {
                let usual = meaning_of_reply(&parse_reply(&reply, &tools));
                prop_assert_eq!(one_chunk, usual, "reply: {:?}", reply);
            }
        }
    }

    /// Calls longer than the parser's eager limit (so held calls wait behind their gates) stream
    /// the same in any chunks.
    #[test]
    fn long_calls_stream_the_same_in_any_chunks(
        d in dialect(), calls in calls(), pad in proptest::collection::vec(json_string(), 40..60),
        before in prose(), cuts in proptest::collection::vec(any::<usize>(), 0..60),
    ) {
        let pad = pad.concat() + &"x".repeat(600);
        let calls: Vec<(String, Value)> = calls
            .into_iter()
            .map(|(n, mut a)| {
                a["zz_pad"] = Value::String(pad.clone());
                (n, a)
            })
            .collect();
        let tools = tools_for(&calls);
        let reply = format!("{before}\n{}\nafter", write_calls(d, &tool_calls(&calls)));
        let whole = meaning_of_reply(&parse_reply(&reply, &tools));
        let got: Vec<(String, Value)> = whole.calls.iter().map(|c| (c.0.clone(), c.1.clone())).collect();
        prop_assert_eq!(got, calls);
        prop_assert_eq!(meaning_of_events(&stream_events(&cut(&reply, &cuts), &tools)), whole);
    }

    /// Character by character, too (the hardest split).
    #[test]
    fn char_by_char_streaming_agrees(d in dialect(), calls in calls(), before in prose()) {
        let tools = tools_for(&calls);
        let reply = format!("{before}\n{}", write_calls(d, &tool_calls(&calls)));
        let chunks: Vec<String> = reply.chars().map(String::from).collect();
        let whole = meaning_of_reply(&parse_reply(&reply, &tools));
        prop_assert_eq!(meaning_of_events(&stream_events(&chunks, &tools)), whole);
    }
}

// ---------------------------------------------------------------------------------------------
// Examples in the real formats, streamed

#[test]
fn text_streams_before_the_call_is_complete() {
    let mut p = StreamParser::new(&[read_file_tool()]);
    let mut events = p.push("I'll read the package.json file.\n<PTK_");
    assert_eq!(
        events,
        vec![StreamEvent::TextDelta(
            "I'll read the package.json file.".into()
        )]
    );
    events = p.push("CALL>\n{\"tool\": \"read_file\", \"args\": {\"path\": \"package.json\"}}\n");
    assert!(events.is_empty(), "{events:?}");
    events = p.push("</PTK_CALL>");
    assert!(
        matches!(&events[0], StreamEvent::ToolCallStart { index: 0, name, .. } if name == "read_file")
    );
    assert_eq!(
        events[1],
        StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "{\"path\":\"package.json\"}".into()
        }
    );
    assert_eq!(events[2], StreamEvent::ToolCallEnd { index: 0 });
    assert!(p.finish().is_empty());
}

// ---------------------------------------------------------------------------------------------
// The prompted adapter over a scripted model

/// One request the scripted model saw: messages, number of native tools, reminders.
type Seen = (Vec<Message>, usize, Vec<String>);

/// A model without tools that answers with canned text and records what it was asked.
struct Scripted {
    replies: Mutex<VecDeque<String>>,
    seen: Mutex<Vec<Seen>>,
    chunk: usize,
}

impl Scripted {
    fn new(replies: &[&str], chunk: usize) -> Arc<Self> {
        Arc::new(Scripted {
            replies: Mutex::new(replies.iter().map(|s| s.to_string()).collect()),
            seen: Mutex::new(Vec::new()),
            chunk,
        })
    }

    fn next(&self, request: &ModelRequest<'_>) -> Result<String, ModelError> {
        self.seen.lock().unwrap().push((
            request.messages.to_vec(),
            request.tools.len(),
            request.reminders.to_vec(),
        ));
        self.replies
            .lock()
            .unwrap()
            .pop_front()
            .ok_or_else(|| ModelError::Other("script ran out".into()))
    }
}

#[async_trait]
impl Model for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        Ok(ModelResponse::text(self.next(request)?))
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        let text = self.next(request)?;
        let chars: Vec<char> = text.chars().collect();
        let mut events: Vec<Result<StreamEvent, ModelError>> = chars
            .chunks(self.chunk.max(1))
            .map(|c| Ok(StreamEvent::TextDelta(c.iter().collect())))
            .collect();
        events.push(Ok(StreamEvent::Finish(FinishReason::Stop)));
        Ok(Box::pin(futures::stream::iter(events)))
    }
}

async fn call(
    model: &Prompted,
    messages: &[Message],
    tools: &[ToolSpec],
    streamed: bool,
    settings: &ModelSettings,
) -> ModelResponse {
    let request = ModelRequest {
        messages: messages.into(),
        reminders: &[],
        tools,
        settings,
    };
    if streamed {
        let stream = model.stream(&request).await.expect("stream opens");
        ModelResponse::from_stream(stream)
            .await
            .expect("stream completes")
    } else {
        model.complete(&request).await.expect("call succeeds")
    }
}

const SEED_CALL: &str = "I'll read the package.json file.\n<PTK_CALL>\n{\n  \"tool\": \"read_file\",\n  \"args\": {\"path\": \"package.json\"},\n  \"reasoning\": \"Need to read package.json to get version\"\n}\n</PTK_CALL>";

/// The PTK Manager's "Tool Calling Flow": catalog in the prompt, a `<PTK_CALL>` reply parsed into a
/// call, the result rendered as `PTK_RESULT:`, the final answer taken as text.
#[tokio::test]
async fn seed_tool_calling_flow() {
    for streamed in [false, true] {
        let inner = Scripted::new(&[SEED_CALL, "The version is 1.2.3"], 3);
        let model = Prompted::new(inner.clone(), Dialect::Ptk);
        let tools = [read_file_tool()];
        let settings = ModelSettings::default();
        let mut messages = vec![Message::user("Read package.json and tell me the version")];

        let first = call(&model, &messages, &tools, streamed, &settings).await;
        assert_eq!(
            first.text.as_deref(),
            Some("I'll read the package.json file.")
        );
        assert_eq!(first.finish_reason, FinishReason::ToolCalls);
        assert_eq!(first.tool_calls.len(), 1);
        let c = &first.tool_calls[0];
        assert_eq!(
            (c.name.as_str(), &c.arguments),
            ("read_file", &json!({"path": "package.json"}))
        );
        assert!(c.id.starts_with("call_"));
        assert_eq!(c.provider_data, None);
        assert_eq!(first.malformed_call, None);

        {
            let seen = inner.seen.lock().unwrap();
            let (msgs, tool_count, _) = &seen[0];
            assert_eq!(*tool_count, 0, "the inner model gets no native tools");
            let Message::System { content } = &msgs[0] else {
                panic!("catalog system message first: {msgs:?}")
            };
            assert!(
                content.contains("## read_file\nRead content of a file"),
                "{content}"
            );
            assert!(
                content.contains("  - path: string (required) - File path"),
                "{content}"
            );
            assert!(content.contains("<PTK_CALL>"), "{content}");
            assert_eq!(
                msgs[1],
                Message::user("Read package.json and tell me the version")
            );
        }

        messages.push(Message::Assistant(first.to_message()));
        messages.push(Message::Tool(ToolResult {
            call_id: c.id.clone(),
            name: "read_file".into(),
            content: "{\"content\": \"{\\\"name\\\": \\\"my-app\\\", \\\"version\\\": \\\"1.2.3\\\"}\", \"size\": 45}".into(),
            is_error: false,
            images: Vec::new(),
        }));
        let second = call(&model, &messages, &tools, streamed, &settings).await;
        assert_eq!(second.text.as_deref(), Some("The version is 1.2.3"));
        assert!(second.tool_calls.is_empty());
        assert_eq!(second.finish_reason, FinishReason::Stop);

        let seen = inner.seen.lock().unwrap();
        let (msgs, _, _) = &seen[1];
        assert_eq!(msgs.len(), 4, "{msgs:?}");
        let assistant = msgs[2].text();
        assert!(
            assistant.starts_with("I'll read the package.json file.\n<PTK_CALL>\n"),
            "{assistant}"
        );
        assert!(matches!(&msgs[2], Message::Assistant(a) if a.tool_calls.is_empty()));
        let result = msgs[3].text();
        assert!(
            result.starts_with(&format!(
                "PTK_RESULT: read_file (call id: {})\n{{\"content\"",
                c.id
            )),
            "{result}"
        );
        assert_eq!(msgs[3].role(), toolloop::message::Role::User);
    }
}

#[tokio::test]
async fn near_miss_is_reported_not_taken_as_the_answer() {
    for streamed in [false, true] {
        let broken =
            "Reading.\n<PTK_CALL>{\"tool\": \"read_file\", \"args\": {\"path\": }}</PTK_CALL>";
        let inner = Scripted::new(&[broken, "ok"], 4);
        let model = Prompted::new(inner.clone(), Dialect::Ptk);
        let tools = [read_file_tool()];
        let settings = ModelSettings::default();
        let mut messages = vec![Message::user("go")];
        let r = call(&model, &messages, &tools, streamed, &settings).await;
        assert_eq!(r.finish_reason, FinishReason::MalformedToolCall);
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.text.as_deref(), Some("Reading."));
        let why = r.malformed_call.clone().expect("explanation");
        assert!(
            why.contains("not valid") && why.contains("<PTK_CALL>\n{\"tool\": \"TOOL_NAME\""),
            "{why}"
        );
        // The attempt is kept for the model's own history, not shown as text.
        messages.push(Message::Assistant(r.to_message()));
        messages.push(Message::user(why));
        call(&model, &messages, &tools, streamed, &settings).await;
        let seen = inner.seen.lock().unwrap();
        let replayed = seen[1].0[2].text().to_string();
        assert_eq!(
            replayed,
            format!("Reading.\n{}", &broken["Reading.\n".len()..])
        );
    }
}

#[tokio::test]
async fn repaired_calls_are_marked_and_tool_choice_becomes_a_reminder() {
    for streamed in [false, true] {
        let inner = Scripted::new(
            &["<tool_call>{'name': 'read_file', 'arguments': {path: 'a',}}</tool_call>"],
            2,
        );
        let model = Prompted::new(inner.clone(), Dialect::Hermes);
        let settings = ModelSettings {
            tool_choice: ToolChoice::Required,
            ..ModelSettings::default()
        };
        let r = call(
            &model,
            &[Message::user("x")],
            &[read_file_tool()],
            streamed,
            &settings,
        )
        .await;
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].arguments, json!({"path": "a"}));
        assert_eq!(
            r.tool_calls[0].provider_data,
            Some(json!({"repaired": true}))
        );
        let seen = inner.seen.lock().unwrap();
        assert!(
            seen[0]
                .2
                .iter()
                .any(|m| m.contains("Call at least one tool") && m.contains("<tool_call>")),
            "{:?}",
            seen[0].2
        );
    }
}

#[tokio::test]
async fn every_dialect_runs_a_parallel_round_through_the_adapter() {
    let tools = [
        read_file_tool(),
        ToolSpec {
            name: "add".into(),
            description: "Adds".into(),
            parameters: json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}}),
        },
    ];
    let calls = vec![
        ("read_file".to_string(), json!({"path": "src/main.rs"})),
        ("add".to_string(), json!({"a": 2, "b": 0.5})),
    ];
    for d in Dialect::ALL {
        for streamed in [false, true] {
            let reply = format!("Two calls.\n{}", write_calls(d, &tool_calls(&calls)));
            let inner = Scripted::new(&[&reply], 5);
            let model = Prompted::new(inner.clone(), d);
            let r = call(
                &model,
                &[Message::user("x")],
                &tools,
                streamed,
                &ModelSettings::default(),
            )
            .await;
            let got: Vec<(String, Value)> = r
                .tool_calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect();
            assert_eq!(got, calls, "{d} streamed={streamed}: {reply}");
            assert_eq!(r.text.as_deref(), Some("Two calls."), "{d}");
            assert_ne!(r.tool_calls[0].id, r.tool_calls[1].id);
            let system = inner.seen.lock().unwrap()[0].0[0].text().to_string();
            assert!(system.contains(d.format()), "{d}: {system}");
        }
    }
}

#[tokio::test]
async fn inner_stream_errors_pass_through() {
    struct Failing;
    #[async_trait]
    impl Model for Failing {
        fn name(&self) -> &str {
            "failing"
        }
        async fn complete(&self, _: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
            Err(ModelError::Other("boom".into()))
        }
        async fn stream(&self, _: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
            Ok(Box::pin(futures::stream::iter(vec![
                Ok(StreamEvent::TextDelta("hi <PTK".into())),
                Err(ModelError::Other("cut".into())),
            ])))
        }
    }
    let model = Prompted::new(Arc::new(Failing), Dialect::Ptk);
    let settings = ModelSettings::default();
    let request = ModelRequest {
        messages: Default::default(),
        reminders: &[],
        tools: &[],
        settings: &settings,
    };
    assert!(model.complete(&request).await.is_err());
    let events: Vec<_> = model.stream(&request).await.unwrap().collect().await;
    assert_eq!(events.len(), 2);
    assert!(matches!(&events[0], Ok(StreamEvent::TextDelta(t)) if t == "hi"));
    assert!(events[1].is_err());
}

/// A large call (a whole file as an argument) streamed in small deltas, in every dialect.
#[test]
fn large_call_streams_in_small_chunks() {
    let line = "fn main() -> Result<(), E> { let x = [1, 2]; if a > b { return; } }\n";
    let content = line.repeat(100_000 / line.len());
    let calls = vec![(
        "write_file".to_string(),
        json!({"path": "big.rs", "content": content}),
    )];
    let tools = tools_for(&calls);
    for d in Dialect::ALL {
        let reply = format!("Writing.\n{}\nDone.", write_calls(d, &tool_calls(&calls)));
        let chars: Vec<char> = reply.chars().collect();
        let chunks: Vec<String> = chars.chunks(16).map(|c| c.iter().collect()).collect();
        let started = std::time::Instant::now();
        let got = meaning_of_events(&stream_events(&chunks, &tools));
        let elapsed = started.elapsed();
        assert_eq!(got.calls.len(), 1, "{d}");
        assert_eq!(got.calls[0].1, calls[0].1, "{d}");
        assert_eq!(got.text.as_deref(), Some("Writing.\nDone."), "{d}");
        eprintln!(
            "{d}: {} bytes in {} chunks: {elapsed:?}",
            reply.len(),
            chunks.len()
        );
    }
}

/// Replies the fuzzer found disagreeing once, streamed in every small chunk size.
#[test]
fn fuzz_findings_stream_the_same() {
    let cases = [
        "[TOOL_CALLS]read_file[ARGS]3333333\",\u{f6} :\\\" {\"ptext\"}\n",
        "[TOOL_CALLS]read_file[ARGS]None\n",
        "<|python_tag|>{\"name\": \"read_file\", \"parameters\": {}}; 12",
        "<function=\" f\">{}</function>",
        "{\"tool\": \"read_file\"[\"args\": {\"path\": \"a\"}```",
        "text\n```json\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\n{\"name\": 1}\n```\n<PTK_CALL>",
        "[TOOL_CALLS]read_file[CALL_ID]0123456789012345678901234567890123456789012345678901234567890[ARGS]{}",
    ];
    let tools = [read_file_tool()];
    for reply in cases {
        let whole = meaning_of_reply(&parse_reply(reply, &tools));
        let chars: Vec<char> = reply.chars().collect();
        for step in 1..=8 {
            let chunks: Vec<String> = chars.chunks(step).map(|c| c.iter().collect()).collect();
            assert_eq!(
                meaning_of_events(&stream_events(&chunks, &tools)),
                whole,
                "{reply:?} in chunks of {step}"
            );
        }
    }
}

/// The correction after a call that did not parse teaches the format exactly as the model must
/// write it, in every dialect: the format is never escaped (only quotes of the model's own text
/// are).
#[tokio::test]
async fn the_correction_after_a_malformed_call_teaches_the_format_unescaped() {
    use toolloop::agent::Agent;
    use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
    let cases = [
        (
            Dialect::Ptk,
            "<PTK_CALL>{\"tool\": \"read_file\", \"args\": {\"path\": @}}</PTK_CALL>",
        ),
        (
            Dialect::Hermes,
            "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"\n",
        ),
        (Dialect::Mistral, "[TOOL_CALLS]read_file(path=a)\n"),
        (
            Dialect::Llama3,
            "{\"name\": \"read_file\", \"parameters\": {\"path\": oops}}",
        ),
        (
            Dialect::Qwen3Coder,
            "<tool_call><function=read_file><parameter=path>a</parameter>junk</function></tool_call>",
        ),
        (
            Dialect::FencedJson,
            "```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\" \"x\": ]}\n```",
        ),
    ];
    for (dialect, broken) in cases {
        let inner = Scripted::new(&[broken, "done"], 5);
        let agent = Agent::builder(Prompted::new(inner.clone(), dialect))
            .tool(tool_fn(
                "read_file",
                "Reads a file.",
                |_: Value, _: ToolContext| async { Ok::<_, ToolError>(ToolOutput::text("x")) },
            ))
            .build()
            .unwrap();
        let out = agent.prompt("go").await;
        assert_eq!(out.text.as_deref(), Some("done"), "{dialect}: {out:?}");
        let seen = inner.seen.lock().unwrap();
        let msgs = &seen[1].0;
        let correction = msgs.last().unwrap();
        assert_eq!(correction.role(), toolloop::message::Role::User, "{msgs:?}");
        let text = correction.text();
        assert!(text.contains("exactly like this"), "{dialect}: {text}");
        let taught = Dialect::ALL
            .iter()
            .find(|d| text.contains(d.format()))
            .unwrap_or_else(|| panic!("{dialect}: no format written as it is in {text}"));
        assert!(
            !taught.format().contains('<') || !text.contains("&lt;"),
            "{dialect}: {text}"
        );
        assert!(!text.contains("&#91;"), "{dialect}: {text}");
        assert!(msgs.iter().any(|m| m.text() == "go"));
    }
    // A quote of the model's text in the explanation is escaped, the format is not.
    let tools = [read_file_tool()];
    let why = parse_reply(
        "<tool_call><function=read_file><parameter=path>a</parameter><PTK_CALL>x</function></tool_call>",
        &tools,
    )
    .near_miss
    .expect("a near miss");
    assert!(why.contains("found `&lt;PTK_CALL>x"), "{why}");
    assert!(why.contains(Dialect::Qwen3Coder.format()), "{why}");
}

/// DeepSeek R1 behind a server whose chat template opened the reasoning: the reply holds only
/// `</think>`. With the option, the reasoning stays out of the answer, and the calls after it
/// are read, whole and streamed character by character.
#[test]
fn an_r1_reply_without_its_think_opener_keeps_the_reasoning_out_of_the_answer() {
    let reply = "The user wants the weather in Paris.\nI should call the tool.\n</think>\n\nChecking.\
        <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n\
        ```json\n{\"path\": \"paris.txt\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let tools = vec![read_file_tool()];
    let chars: Vec<String> = reply.chars().map(String::from).collect();
    for events in [
        implicit_think_events(std::slice::from_ref(&reply.to_string()), &tools),
        implicit_think_events(&chars, &tools),
    ] {
        let m = meaning_of_events(&events);
        assert_eq!(
            m.reasoning.as_deref(),
            Some("The user wants the weather in Paris.\nI should call the tool.")
        );
        assert_eq!(m.text.as_deref(), Some("Checking."));
        assert_eq!(
            m.calls,
            vec![("read_file".to_string(), json!({"path": "paris.txt"}), false)]
        );
    }
    // Without the option, the reasoning would be answer text (the tag alone is dropped).
    let plain = parse_reply(reply, &tools);
    assert!(plain.text.unwrap().starts_with("The user wants"));
    // A model that did not reason: the reply reads as usual once it ends.
    let events = implicit_think_events(&["Just an answer.".to_string()], &tools);
    assert_eq!(
        meaning_of_events(&events).text.as_deref(),
        Some("Just an answer.")
    );
}
