//! An OpenAI session writes each request body of its run into the buffer of the previous one,
//! taken back once the transport let go of it: once that buffer has grown, a body that adds a
//! round to the conversation costs no allocation for its buffer (nor a copy of what it already
//! held), and its bytes are those of the whole request encoded afresh. A run's first body is
//! written into a buffer sized once for it, not grown a doubling at a time, with room for what
//! the model's earlier runs grew to.

use serde_json::json;
use toolloop::message::{AssistantMessage, Message, ToolCall, ToolResult};
use toolloop::model::{ModelRequest, ModelSettings, ToolSpec};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel, OpenAiSession};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

/// Round `i` of a tool loop: the model's call, then its result (with characters to escape).
fn round(i: usize) -> [Message; 2] {
    let id = format!("call_{i}");
    [
        Message::Assistant(AssistantMessage {
            text: None,
            tool_calls: vec![ToolCall {
                id: id.clone(),
                name: "echo".into(),
                arguments: json!({"text": format!("round \"{i}\"\n")}),
                invalid_arguments: None,
                provider_data: None,
            }],
            parts: Vec::new(),
        }),
        Message::Tool(ToolResult {
            call_id: id,
            name: "echo".into(),
            content: format!("echoed \"round {i}\" — ünïcode\t{}", "x".repeat(40)),
            is_error: false,
            images: Vec::new(),
        }),
    ]
}

/// The echo tool's one-tool catalog.
fn echo_tool() -> [ToolSpec; 1] {
    [ToolSpec {
        name: "echo".into(),
        description: "Echoes its text.".into(),
        parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
    }]
}

/// A system prompt, a task, and `rounds` rounds of the echo tool.
fn conversation(rounds: usize) -> Vec<Message> {
    let mut all = vec![Message::system("You echo."), Message::user("go")];
    for i in 0..rounds {
        all.extend(round(i));
    }
    all
}

/// The request of the first `n` messages of `all`.
fn first_messages<'a>(
    all: &'a [Message],
    n: usize,
    tools: &'a [ToolSpec],
    settings: &'a ModelSettings,
) -> ModelRequest<'a> {
    ModelRequest {
        messages: (&all[..n]).into(),
        reminders: &[],
        tools,
        settings,
    }
}

#[test]
fn a_session_writes_each_body_into_the_previous_ones_buffer_without_allocating() {
    let model = OpenAiModel::new(OpenAiConfig::new("m").with_base_url("http://127.0.0.1:9/v1"));
    let session = OpenAiSession::new(&model);
    let tools = echo_tool();
    let settings = ModelSettings::default();
    // Every message made first: the conversation only grows, as a run's does.
    let all = conversation(40);
    let request = |n: usize| first_messages(&all, n, &tools, &settings);
    // The first rounds grow the buffer far beyond what the later ones need; the capacity is
    // that of the longest body, as in a run.
    let longest = session.request_body(&request(all.len()), false).unwrap();
    drop(longest);
    let mut buffer = None;
    let mut counted = Vec::new();
    for n in (2..=all.len()).step_by(2) {
        // The same request encoded whole, by a session that has encoded nothing yet.
        let whole = OpenAiSession::new(&model)
            .request_body(&request(n), false)
            .unwrap();
        let before = allocations();
        let body = session.request_body(&request(n), false).unwrap();
        counted.push(allocations() - before);
        assert_eq!(&body[..], &whole[..], "the body of {n} messages");
        // Always the same buffer: nothing copied into another one.
        let at = body.as_ptr();
        assert_eq!(
            *buffer.get_or_insert(at),
            at,
            "the body of {n} messages moved"
        );
        // Let go of, as the transport does once the request is sent.
        drop(body);
    }
    // The first body after the conversation shrank (to two messages) encodes it all again,
    // into the same buffer; none allocates.
    assert!(
        counted.iter().all(|&n| n == 0),
        "allocations per body: {counted:?}"
    );
}

#[test]
fn a_runs_first_body_is_written_into_a_buffer_sized_once() {
    let model = OpenAiModel::new(OpenAiConfig::new("m").with_base_url("http://127.0.0.1:9/v1"));
    let tools: Vec<ToolSpec> = (0..20)
        .map(|i| ToolSpec {
            name: format!("tool_{i}"),
            description: "A tool whose description takes a line or two, as most do. ".repeat(3),
            parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        })
        .collect();
    let settings = ModelSettings::default();
    let messages = [
        Message::system("You use tools. ".repeat(40)),
        Message::user("go"),
    ];
    let request = ModelRequest {
        messages: (&messages).into(),
        reminders: &[],
        tools: &tools,
        settings: &settings,
    };
    // The model keeps the catalog's encoding for its sessions: the first session encodes it.
    let first = OpenAiSession::new(&model)
        .request_body(&request, false)
        .unwrap();
    assert!(first.len() > 4096, "{}", first.len());
    let session = OpenAiSession::new(&model);
    let before = allocations();
    let body = session.request_body(&request, false).unwrap();
    let made = allocations() - before;
    assert_eq!(&body[..], &first[..]);
    // The buffer, the header that lets it be shared with the transport and taken back, and the
    // fields after the catalog, kept for the run's later bodies.
    assert_eq!(made, 3, "allocations for a run's first body");
}

#[test]
fn a_run_like_the_ones_before_never_moves_its_body_into_a_larger_buffer() {
    let model = OpenAiModel::new(OpenAiConfig::new("m").with_base_url("http://127.0.0.1:9/v1"));
    let tools = echo_tool();
    let settings = ModelSettings::default();
    let all = conversation(40);
    let request = |n: usize| first_messages(&all, n, &tools, &settings);
    // One run, a round at a time, as the loop sends them; the buffer it ends in is the buffer of
    // each body, let go of by the transport before the next.
    let run = |model: &OpenAiModel| {
        let session = OpenAiSession::new(model);
        let mut buffers = Vec::new();
        for n in (2..=all.len()).step_by(2) {
            let body = session.request_body(&request(n), false).unwrap();
            if buffers.last() != Some(&body.as_ptr()) {
                buffers.push(body.as_ptr());
            }
        }
        buffers.len()
    };
    // The model's first run starts with the fixed room, and its conversation outgrows it (its
    // last body is several times 2 KiB).
    assert!(run(&model) > 1, "the first run's body never grew");
    // The next run starts with room for what the first grew to: one buffer, all run long.
    assert_eq!(run(&model), 1, "buffers of the second run's bodies");
}
