//! Local OpenAI-compatible servers as people run them (llama-cpp-python, a proxy in front of
//! one, a server that restarts), played by the mock over real HTTP: what each refuses or drops,
//! and how the OpenAI adapter and the loop get through.
#![cfg(feature = "http")]

use serde_json::json;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolloop::agent::AgentBuilder;
use toolloop::event::Event;
use toolloop::model::Model;
use toolloop::outcome::{ErrorCode, Outcome, StopReason};
use toolloop::output::OutputSchema;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::ptk::{Auto, Dialect};
use toolloop::transport::request_log::RequestLog;
use toolloop_mock::{MockOptions, MockServer, start};

async fn server() -> MockServer {
    start(MockOptions::default()).await.expect("mock starts")
}

fn config(base: &str, model: &str) -> OpenAiConfig {
    OpenAiConfig::new(model).with_base_url(format!("{base}/v1"))
}

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), "# Demo\n\nversion 1.2.3\n").unwrap();
    dir
}

/// Runs an agent with the built-in file tools over `root`; the outcome and the events.
async fn run(model: Arc<dyn Model>, root: &Path, stream: bool) -> (Outcome, Vec<Event>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let agent = AgentBuilder::new(model)
        .tools(toolloop_tools::fs::builtin_tools(root, false).unwrap())
        .max_rounds(10)
        .stream(stream)
        .on_event(move |e| seen.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let outcome = agent.prompt("Look around the repository.").await;
    let events = events.lock().unwrap().clone();
    (outcome, events)
}

fn answered(o: &Outcome) {
    assert_eq!(o.stop_reason, StopReason::Answered, "{:?}", o.error);
}

/// llama-cpp-python answers a streamed request with `tool_choice: "auto"` with an empty stream.
/// The adapter sends it again without `tool_choice`, and remembers: the server's later
/// streamed requests go without it, and the run goes through.
#[tokio::test]
async fn a_streamed_tool_choice_refused_with_an_empty_stream_is_left_out_from_then_on() {
    let server = server().await;
    let dir = repo();
    let model = OpenAiModel::new(config(
        &server.base_url(),
        "mock:refuse_auto_stream=true,rounds=2",
    ));
    assert!(model.config().explicit_tool_choice);
    let (o, _) = run(Arc::new(model.clone()), dir.path(), true).await;
    answered(&o);
    assert_eq!(o.tool_calls.len(), 2);
    let stats = server.stats();
    assert_eq!(stats.quirks, 1, "one refused request, then none: {stats:?}");
    assert_eq!(stats.requests, 4, "{stats:?}");
    // The next run of the same model does not try again.
    let (o, _) = run(Arc::new(model), dir.path(), true).await;
    answered(&o);
    assert_eq!(server.stats().quirks, 1);
}

/// llama-cpp-python as it is: `"auto"` refused while streaming, and `tools` dropped without a
/// `tool_choice`. Streamed, the run learns both and `--tool-protocol auto` ends prompt-based
/// (the dropped catalog is told by the prompt tokens); not streamed, native calls work.
#[tokio::test]
async fn llama_cpp_python_streamed_falls_back_to_prompt_based_and_unstreamed_stays_native() {
    let scenario = "mock:refuse_auto_stream=true,drop_tools=without_choice,text_calls=hermes,\
                    accept_tools=true";
    let server = server().await;
    let dir = repo();
    let native = Arc::new(OpenAiModel::new(config(&server.base_url(), scenario)));
    let auto = Arc::new(Auto::new(native.clone(), Dialect::Hermes));
    let (o, events) = run(auto.clone(), dir.path(), true).await;
    answered(&o);
    assert!(auto.is_prompted());
    assert_eq!(o.tool_calls.len(), 1, "{:?}", o.messages);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::ModelRetry { reason, .. }
            if reason.contains("ignored the tools") && reason.contains("prompt tokens"))),
        "the streamed reply was asked for again, saying why"
    );
    // Without streaming, `tool_choice: "auto"` is sent and the server uses the tools natively.
    let native = Arc::new(OpenAiModel::new(config(&server.base_url(), scenario)));
    let auto = Arc::new(Auto::new(native, Dialect::Hermes));
    let (o, _) = run(auto.clone(), dir.path(), false).await;
    answered(&o);
    assert!(!auto.is_prompted());
    assert_eq!(o.tool_calls.len(), 1);
}

/// A proxy that strips `tools`: without streaming, `auto` sees the reply's prompt tokens below
/// the catalog's and asks again prompt-based at once.
#[tokio::test]
async fn dropped_tools_are_told_by_the_prompt_tokens_and_auto_falls_back() {
    let server = server().await;
    let dir = repo();
    let scenario = "mock:drop_tools=true,text_calls=hermes,accept_tools=true";
    let native = Arc::new(OpenAiModel::new(config(&server.base_url(), scenario)));
    let auto = Arc::new(Auto::new(native, Dialect::Hermes));
    let (o, _) = run(auto.clone(), dir.path(), false).await;
    answered(&o);
    assert!(auto.is_prompted());
    assert_eq!(o.tool_calls.len(), 1);
    // A server that keeps the catalog is never taken for one that dropped it.
    let scenario = "mock:text_calls=hermes,accept_tools=true";
    let native = Arc::new(OpenAiModel::new(config(&server.base_url(), scenario)));
    let auto = Arc::new(Auto::new(native, Dialect::Hermes));
    let (o, _) = run(auto.clone(), dir.path(), false).await;
    answered(&o);
    assert!(!auto.is_prompted());
}

/// llama-cpp-python 0.3.36's `chatml-function-calling` under `tool_choice: "auto"` makes tool
/// calls, but its text answers are empty (its grammar leaves no room for text). Native calling
/// then ends with an empty answer; `auto` takes an empty reply to a request with tools as
/// native calling not working there and asks again prompt-based, streamed or not.
#[tokio::test]
async fn an_empty_reply_to_a_request_with_tools_makes_auto_fall_back() {
    let scenario = "mock:empty_auto_answer=true,text_calls=hermes,accept_tools=true";
    let server = server().await;
    let dir = repo();
    for stream in [false, true] {
        let native = Arc::new(OpenAiModel::new(config(&server.base_url(), scenario)));
        let (o, _) = run(native.clone(), dir.path(), stream).await;
        assert_eq!(o.stop_reason, StopReason::EmptyAnswer, "stream {stream}");
        let auto = Arc::new(Auto::new(native, Dialect::Hermes));
        let (o, events) = run(auto.clone(), dir.path(), stream).await;
        answered(&o);
        assert!(auto.is_prompted(), "stream {stream}");
        assert!(
            o.text.as_deref().is_some_and(|t| t.starts_with("Done.")),
            "{:?}",
            o.text
        );
        if stream {
            assert!(
                events
                    .iter()
                    .any(|e| matches!(e, Event::ModelRetry { reason, .. }
                    if reason.contains("with nothing"))),
                "the streamed reply was asked for again, saying why"
            );
        }
    }
    assert_eq!(server.stats().rejected, 0);
}

/// llama-cpp-python takes `json_object` but not `json_schema` (a 500): the adapter asks for
/// `json_object` with the schema in the prompt, remembers it, and the loop checks the answer.
#[tokio::test]
async fn a_refused_json_schema_falls_back_to_json_object_and_the_answer_is_checked() {
    let server = start(MockOptions {
        answers: vec![r#"{"holds": true}"#.into()],
        ..MockOptions::default()
    })
    .await
    .unwrap();
    let schema = OutputSchema::new(
        "verdict",
        json!({"type": "object", "properties": {"holds": {"type": "boolean"}},
               "required": ["holds"]}),
    );
    let model = Arc::new(OpenAiModel::new(config(
        &server.base_url(),
        "mock:refuse_json_schema=true,rounds=0",
    )));
    for round in 1..=2 {
        let agent = AgentBuilder::new(model.clone())
            .output_schema(schema.clone())
            .build()
            .unwrap();
        let o = agent.prompt("Does it hold?").await;
        answered(&o);
        assert_eq!(o.output, Some(json!({"holds": true})));
        assert_eq!(server.stats().quirks, 1, "refused once only (run {round})");
    }
    assert_eq!(server.stats().requests, 3);
}

/// A local server restarting: connections are refused for a few seconds. The call waits for it
/// (with backoff) instead of giving up after the usual retries.
#[tokio::test]
async fn a_server_that_restarts_for_a_few_seconds_does_not_lose_the_call() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let base = format!("http://127.0.0.1:{port}");
    let up = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        start(MockOptions {
            port,
            ..MockOptions::default()
        })
        .await
        .expect("the port is free again")
    });
    let model = Arc::new(OpenAiModel::new(config(&base, "mock:rounds=0")));
    let agent = AgentBuilder::new(model).build().unwrap();
    let started = Instant::now();
    let o = agent.prompt("hello").await;
    answered(&o);
    assert!(started.elapsed() >= Duration::from_secs(2), "it waited");
    let server = up.await.unwrap();
    assert_eq!(server.stats().requests, 1);

    // Without the wait, a refused connection is given up after the retry policy's retries.
    let mut c = config("http://127.0.0.1:9", "mock");
    c.transport.connect_retry = Duration::ZERO;
    let agent = AgentBuilder::new(Arc::new(OpenAiModel::new(c)))
        .build()
        .unwrap();
    let started = Instant::now();
    let o = agent.prompt("hello").await;
    assert_eq!(o.stop_reason, StopReason::ModelError);
    let message = o.error.unwrap().message;
    assert!(message.contains("could not connect"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(4));
}

/// An answer with no text and no call (what a proxy gives when its backend failed) is not a
/// success: it has its own stop reason.
#[tokio::test]
async fn an_empty_answer_is_not_a_success() {
    let server = start(MockOptions {
        answers: vec![String::new()],
        ..MockOptions::default()
    })
    .await
    .unwrap();
    let dir = repo();
    for stream in [false, true] {
        let model = Arc::new(OpenAiModel::new(config(
            &server.base_url(),
            "mock:rounds=1",
        )));
        let (o, _) = run(model, dir.path(), stream).await;
        assert_eq!(o.stop_reason, StopReason::EmptyAnswer, "{:?}", o.error);
        assert!(!o.success);
        assert_eq!(o.error.unwrap().code, ErrorCode::EmptyAnswer);
        assert_eq!(o.tool_calls.len(), 1, "the round before it stays");
    }
}

/// A limit that stops the run after a round's calls: that round's end is reported before the
/// run's.
#[tokio::test]
async fn the_last_round_is_reported_finished_when_a_limit_stops_the_run() {
    let server = server().await;
    let dir = repo();
    let model = Arc::new(OpenAiModel::new(config(
        &server.base_url(),
        "mock:rounds=5",
    )));
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let agent = AgentBuilder::new(model)
        .tools(toolloop_tools::fs::builtin_tools(dir.path(), false).unwrap())
        .max_rounds(2)
        .on_event(move |e| seen.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let o = agent.prompt("go").await;
    assert_eq!(o.stop_reason, StopReason::MaxRounds);
    let events = events.lock().unwrap();
    let finished: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            Event::RoundFinished { round, .. } => Some(*round),
            _ => None,
        })
        .collect();
    assert_eq!(finished, [1, 2]);
    assert!(matches!(events.last(), Some(Event::RunFinished { .. })));
}

/// Every stream that breaks is in the request log, the loop's restarts included.
#[tokio::test]
async fn a_broken_stream_is_in_the_request_log() {
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let server = server().await;
    let dir = repo();
    let buf = Buf::default();
    let mut c = config(
        &server.base_url(),
        "mock:rounds=0,faults=1,fault_kinds=cut_call",
    );
    c.transport.debug_log = Some(Arc::new(RequestLog::new(buf.clone())));
    let (_, events) = run(Arc::new(OpenAiModel::new(c)), dir.path(), true).await;
    let log = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let broke: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "stream_broke")
        .collect();
    let retries = events
        .iter()
        .filter(|e| matches!(e, Event::ModelRetry { .. }))
        .count();
    assert_eq!(retries, 2, "every stream is cut; the loop asks twice more");
    assert_eq!(broke.len(), 3, "each of the three streams: {log}");
    assert!(
        broke[0]["error"]
            .as_str()
            .unwrap()
            .contains("ended before the response was complete"),
        "{log}"
    );
}
