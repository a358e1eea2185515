//! Prompt-based tool calling end to end, over real HTTP against the mock's text-only mode: every
//! dialect through the prompted adapter, the automatic fallback, the OpenAI adapter's rescue of
//! calls written as text, and the PTK Manager's "Tool Calling Flow".
#![cfg(feature = "http")]

use crate::recording;
use recording::Recording;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::{Arc, Mutex};
use toolloop::agent::{Agent, AgentBuilder};
use toolloop::event::Event;
use toolloop::message::Message;
use toolloop::model::Model;
use toolloop::outcome::{CallStatus, Outcome, StopReason};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::ptk::{Auto, Dialect, Prompted};
use toolloop::tool::{ToolContext, ToolError, tool_fn};
use toolloop_mock::{MockOptions, MockServer, start};

async fn server() -> MockServer {
    start(MockOptions::default()).await.expect("mock starts")
}

fn openai(server: &MockServer, model: &str) -> OpenAiModel {
    OpenAiModel::new(OpenAiConfig::new(model).with_base_url(format!("{}/v1", server.base_url())))
}

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), "# Demo\n\nversion 1.2.3\n").unwrap();
    dir
}

/// Runs an agent with the built-in file tools over `root`, collecting the text deltas.
async fn run(model: Arc<dyn Model>, root: &Path, stream: bool) -> (Outcome, Vec<String>) {
    let deltas = Arc::new(Mutex::new(Vec::new()));
    let seen = deltas.clone();
    let agent = AgentBuilder::new(model)
        .tools(toolloop_tools::fs::builtin_tools(root, false).unwrap())
        .max_rounds(10)
        .max_tool_calls(50)
        .stream(stream)
        .on_event(move |e| {
            if let Event::TextDelta { text, .. } = e {
                seen.lock().unwrap().push(text.clone());
            }
        })
        .build()
        .unwrap();
    let outcome = agent.prompt("Look around the repository.").await;
    let deltas = deltas.lock().unwrap().clone();
    (outcome, deltas)
}

/// The transcript with call ids replaced by their order of appearance.
fn normalized(messages: &[Message]) -> String {
    let mut text = serde_json::to_string(messages).unwrap();
    let mut n = 0;
    for m in messages {
        if let Message::Assistant(a) = m {
            for c in &a.tool_calls {
                text = text.replace(&c.id, &format!("#{n}"));
                n += 1;
            }
        }
    }
    text
}

fn assert_answered(o: &Outcome, text: &str, calls: usize, what: &str) {
    assert_eq!(
        o.stop_reason,
        StopReason::Answered,
        "{what}: {:?} {:?}",
        o.error,
        o.messages
    );
    assert_eq!(o.text.as_deref(), Some(text), "{what}");
    assert_eq!(o.tool_calls.len(), calls, "{what}");
    // Every call passed validation and ran, except repeats of a call the model already made
    // with the same arguments (the mock repeats its rounds), which the loop answers without
    // running.
    for (n, c) in o.tool_calls.iter().enumerate() {
        let repeat = o.tool_calls[..n]
            .iter()
            .any(|p| p.call.name == c.call.name && p.call.arguments == c.call.arguments);
        if repeat {
            assert_eq!(c.status, CallStatus::Duplicate, "{what}: {}", c.content);
        } else {
            assert!(c.success(), "{what}: {} failed: {}", c.call.name, c.content);
        }
    }
}

/// No text delta holds a piece of a call: the mock's prose has none of these characters, its
/// calls always do.
fn assert_no_tag_fragment(deltas: &[String], what: &str) {
    assert!(!deltas.is_empty(), "{what}: no text streamed");
    for d in deltas {
        assert!(
            !d.contains(['<', '>', '[', ']', '`', '{', '}', '|']),
            "{what}: a call fragment reached the text: {d:?} (all deltas: {deltas:?})"
        );
    }
}

#[tokio::test]
async fn every_dialect_runs_rounds_of_parallel_calls_through_the_prompted_adapter() {
    let server = server().await;
    let dir = repo();
    for dialect in Dialect::ALL {
        let mut transcripts = Vec::new();
        for stream in [false, true] {
            let what = format!("{dialect} stream={stream}");
            let inner = openai(
                &server,
                &format!("mock:text_calls={dialect},rounds=2,parallel=3,chunk=3"),
            );
            let model = Arc::new(Prompted::new(Arc::new(inner), dialect));
            let (o, deltas) = run(model, dir.path(), stream).await;
            assert_answered(&o, "Done. I saw 6 tool results in 2 rounds.", 6, &what);
            assert_eq!(o.rounds, 3, "{what}");
            let names: Vec<&str> = o.tool_calls.iter().map(|c| c.call.name.as_str()).collect();
            assert_eq!(
                names,
                [
                    "read_file",
                    "list_dir",
                    "search_files",
                    "read_file",
                    "list_dir",
                    "search_files"
                ],
                "{what}"
            );
            // The catalog's example call gave read_file the schema's example path.
            assert_eq!(
                o.tool_calls[0].call.arguments["path"], "README.md",
                "{what}"
            );
            assert!(o.tool_calls[0].content.contains("version 1.2.3"), "{what}");
            if stream {
                assert_no_tag_fragment(&deltas, &what);
                assert_eq!(
                    deltas.concat(),
                    "I'll call read_file, list_dir, search_files.\
                     I'll call read_file, list_dir, search_files.\
                     Done. I saw 6 tool results in 2 rounds.",
                    "{what}"
                );
            }
            transcripts.push(normalized(&o.messages));
        }
        assert_eq!(
            transcripts[0], transcripts[1],
            "{dialect}: streamed and not"
        );
    }
    assert_eq!(server.stats().rejected, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn auto_falls_back_when_the_server_refuses_tools_and_stays_prompted() {
    let server = server().await;
    let dir = repo();
    for (n, stream) in [false, true].into_iter().enumerate() {
        let what = format!("stream={stream}");
        let inner = openai(&server, "mock:text_calls=hermes,rounds=2,parallel=2");
        let model = Arc::new(Auto::new(Arc::new(inner), Dialect::Hermes));
        assert!(!model.is_prompted());
        let (o, _) = run(model.clone(), dir.path(), stream).await;
        assert_answered(&o, "Done. I saw 4 tool results in 2 rounds.", 4, &what);
        assert!(model.is_prompted(), "{what}");
        // Only the first request carried `tools` and was refused.
        let stats = server.stats();
        assert_eq!(stats.rejected, n as u64 + 1, "{what}");
        assert_eq!(stats.requests, 4 * (n as u64 + 1), "{what}");
    }
    // A server that takes tools never triggers the fallback.
    let model = Arc::new(Auto::new(
        Arc::new(openai(&server, "mock:rounds=1")),
        Dialect::Ptk,
    ));
    let (o, _) = run(model.clone(), dir.path(), true).await;
    assert_answered(&o, "Done. I saw 1 tool results in 1 rounds.", 1, "native");
    assert!(!model.is_prompted());
    // Native calling of a text-only server fails with the refusal.
    let (o, _) = run(
        Arc::new(openai(&server, "mock:text_calls=ptk")),
        dir.path(),
        false,
    )
    .await;
    assert_eq!(o.stop_reason, StopReason::ModelError);
    let message = o.error.unwrap().message;
    assert!(message.contains("does not support tools"), "{message}");
    server.shutdown().await;
}

#[tokio::test]
async fn openai_adapter_rescues_calls_written_as_text_streamed_and_not() {
    let server = server().await;
    let dir = repo();
    for dialect in Dialect::ALL {
        let mut transcripts = Vec::new();
        for stream in [false, true] {
            let what = format!("{dialect} stream={stream}");
            let model = openai(
                &server,
                &format!("mock:text_calls={dialect},accept_tools=true,rounds=2,parallel=2,chunk=2"),
            );
            assert!(model.config().rescue_text_tool_calls);
            let (o, deltas) = run(Arc::new(model), dir.path(), stream).await;
            assert_answered(&o, "Done. I saw 4 tool results in 2 rounds.", 4, &what);
            for c in &o.tool_calls {
                assert_eq!(
                    c.call.provider_data.as_ref().and_then(|d| d.get("rescued")),
                    Some(&json!(true)),
                    "{what}"
                );
            }
            let Message::Assistant(first) = &o.messages[1] else {
                panic!("{what}: {:?}", o.messages)
            };
            assert_eq!(
                first.text.as_deref(),
                Some("I'll call read_file, list_dir."),
                "{what}"
            );
            if stream {
                assert_no_tag_fragment(&deltas, &what);
            }
            transcripts.push(normalized(&o.messages));
        }
        assert_eq!(
            transcripts[0], transcripts[1],
            "{dialect}: streamed and not"
        );
    }
    // Without the rescue, the calls stay text and the run takes them as the answer.
    let mut config = OpenAiConfig::new("mock:text_calls=ptk,accept_tools=true")
        .with_base_url(format!("{}/v1", server.base_url()));
    config.rescue_text_tool_calls = false;
    let (o, _) = run(Arc::new(OpenAiModel::new(config)), dir.path(), true).await;
    assert_eq!(o.stop_reason, StopReason::Answered);
    assert!(o.tool_calls.is_empty());
    assert!(o.text.unwrap().contains("<PTK_CALL>"));
    assert_eq!(server.stats().rejected, 0);
    server.shutdown().await;
}

#[derive(Deserialize, JsonSchema)]
struct ReadFileArgs {
    /// File path
    #[schemars(example = &"package.json")]
    path: String,
}

/// The PTK Manager's "Tool Calling Flow" against the mock: the catalog in the system prompt, a
/// `<PTK_CALL>` reply, `read_file` run, its result sent back as `PTK_RESULT:`, and a final text
/// answer.
#[tokio::test]
async fn seed_000_tool_calling_flow_runs_against_the_mock() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("package.json"),
        r#"{"name": "my-app", "version": "1.2.3"}"#,
    )
    .unwrap();
    for stream in [false, true] {
        let root = dir.path().to_path_buf();
        let read_file = tool_fn(
            "read_file",
            "Read content of a file",
            move |a: ReadFileArgs, _ctx: ToolContext| {
                let root = root.clone();
                async move {
                    let content = std::fs::read_to_string(root.join(&a.path))
                        .map_err(|e| ToolError::new(format!("cannot read {}: {e}", a.path)))?;
                    Ok::<_, ToolError>(json!({"content": content, "size": content.len()}))
                }
            },
        );
        let recording = Arc::new(Recording::new(
            Arc::new(openai(&server, "mock:text_calls=ptk,chunk=5")),
            |request| (request.messages.to_vec(), request.tools.len()),
        ));
        let model = Prompted::new(recording.clone(), Dialect::Ptk);
        let agent = Agent::builder(model)
            .tool(read_file)
            .stream(stream)
            .build()
            .unwrap();
        let o = agent
            .prompt("Read package.json and tell me the version")
            .await;
        let what = format!("stream={stream}");
        assert_answered(&o, "Done. I saw 1 tool results in 1 rounds.", 1, &what);
        let call = &o.tool_calls[0].call;
        assert_eq!(call.name, "read_file");
        assert_eq!(call.arguments, json!({"path": "package.json"}));
        assert!(o.tool_calls[0].content.contains("1.2.3"), "{what}");

        let requests = recording.seen();
        let requests = requests.lock().unwrap();
        assert_eq!(requests.len(), 2, "{what}");
        // 1-3: the prompt and the tool, the catalog in the system prompt, no native tools.
        let (first, tools) = &requests[0];
        assert_eq!(*tools, 0, "{what}");
        let Message::System { content: system } = &first[0] else {
            panic!("{what}: the catalog comes first: {first:?}")
        };
        assert!(
            system.contains("You have access to these tools:"),
            "{system}"
        );
        assert!(
            system.contains("## read_file\nRead content of a file"),
            "{system}"
        );
        assert!(
            system.contains("  - path: string (required) - File path"),
            "{system}"
        );
        assert!(system.contains("<PTK_CALL>"), "{system}");
        assert_eq!(
            first[1],
            Message::user("Read package.json and tell me the version")
        );
        // 5-11: the reply held a <PTK_CALL>, the call ran, and the result went back.
        let (second, _) = &requests[1];
        let reply = second[2].text();
        assert!(
            reply.starts_with("I'll call read_file.\n<PTK_CALL>\n{\"tool\": \"read_file\""),
            "{reply}"
        );
        let result = second[3].text();
        assert!(matches!(second[3], Message::User { .. }), "{what}");
        assert!(
            result.starts_with(&format!("PTK_RESULT: read_file (call id: {})\n", call.id)),
            "{result}"
        );
        assert!(
            result.contains("my-app") && result.contains("1.2.3"),
            "{result}"
        );
        // 13-15: the final reply is plain text, taken as the answer.
        assert!(!o.text.as_deref().unwrap_or_default().contains("PTK"));
    }
    assert_eq!(server.stats().rejected, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn the_mock_checks_text_results_like_native_ones() {
    let server = server().await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let client = http_client();
    let catalog = toolloop::ptk::render_system_prompt(
        &[toolloop::model::ToolSpec {
            name: "f".into(),
            description: "F.".into(),
            parameters: json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        }],
        Dialect::Ptk,
    );
    let call = "<PTK_CALL>{\"tool\": \"f\", \"args\": {\"n\": 0}}</PTK_CALL>\n<PTK_CALL>{\"tool\": \"f\", \"args\": {\"n\": 0}}</PTK_CALL>";
    let post = |messages: Value, tools: Option<Value>| {
        let mut body = json!({"model": "mock:text_calls=ptk,parallel=2", "messages": messages});
        if let Some(t) = tools {
            body["tools"] = t;
        }
        client.post(&url).json(&body).send()
    };
    // The first reply: two calls written as text, with arguments fitting the catalog.
    let r = post(
        json!([{"role": "system", "content": catalog}, {"role": "user", "content": "go"}]),
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    let parsed = toolloop::ptk::parse_reply(content, &[]);
    assert_eq!(parsed.calls.len(), 2, "{content}");
    assert_eq!(parsed.calls[0].arguments, json!({"n": 0}));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // A `tools` parameter is refused as Ollama refuses it.
    let r = post(
        json!([{"role": "user", "content": "go"}]),
        Some(json!([{"type": "function", "function": {"name": "f", "parameters": {}}}])),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with("does not support tools")
    );
    // Results: one missing, one twice, one unknown, and all answered.
    let history = |results: &str| {
        json!([
            {"role": "system", "content": catalog},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": call},
            {"role": "user", "content": results},
        ])
    };
    for (results, status, needle) in [
        ("PTK_RESULT: f (call id: a)\n1", 400, "got no result"),
        (
            "PTK_RESULT: f (call id: a)\n1\n\nPTK_RESULT: f (call id: a)\n2",
            400,
            "twice",
        ),
        (
            "PTK_RESULT: f (call id: a)\n1\n\nPTK_RESULT: g (call id: b)\n2",
            400,
            "did not call",
        ),
        (
            "PTK_RESULT: f (call id: a)\n1\n\nPTK_RESULT: f (call id: b, error)\n2",
            200,
            "Done. I saw 2 tool results in 1 rounds.",
        ),
    ] {
        let r = post(history(results), None).await.unwrap();
        assert_eq!(r.status(), status, "{results}");
        let body = r.text().await.unwrap();
        assert!(body.contains(needle), "{results}: {body}");
    }
    server.shutdown().await;
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
