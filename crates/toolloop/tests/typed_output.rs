//! Typed final answers end to end: each wire API over real HTTP against the mock (the native
//! output format reaches the server, the answer is validated and typed, an invalid answer goes
//! back with its errors, answers that keep failing stop the run), prompt-based tool calling, and
//! the run log (a resumed run holds answers to the schema it started with).
#![cfg(feature = "http")]

use crate::recording;
use recording::Recording;

use crate::mock_models;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use toolloop::agent::{Agent, AgentBuilder};
use toolloop::engine::Machine;
use toolloop::journal::{Journal, MemoryJournal, Record};
use toolloop::message::Message;
use toolloop::model::{Model, ModelError, ModelRequest, ModelResponse};
use toolloop::outcome::{ErrorCode, Outcome, StopReason};
use toolloop::output::OutputSchema;
use toolloop::providers::scripted::ScriptedModel;
use toolloop::ptk::{Dialect, Prompted};
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop_mock::{MockOptions, MockServer, start};

/// The typed answer: every field required, so the OpenAI adapter asks for strict decoding.
#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
struct Report {
    /// A title.
    title: String,
    /// How many things were found.
    count: u32,
    /// Whether the work is done.
    done: bool,
}

/// An answer with an optional field: no strict form, so `strict: false` goes out (the mock
/// refuses `strict: true` for it, as OpenAI does).
#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
struct Loose {
    title: String,
    note: Option<String>,
}

const PROTOCOLS: [&str; 3] = ["openai", "anthropic", "gemini"];

fn model(protocol: &str, server: &MockServer, scenario: &str) -> Arc<dyn Model> {
    mock_models::mock_model(protocol, &server.base_url(), scenario)
}

#[derive(Deserialize, JsonSchema)]
struct Query {
    /// What to look up.
    query: String,
}

fn builder(model: Arc<dyn Model>, stream: bool) -> AgentBuilder {
    AgentBuilder::new(model)
        .tool(tool_fn(
            "lookup",
            "Looks something up.",
            |q: Query, _: ToolContext| async move {
                Ok::<_, ToolError>(ToolOutput::text(format!("found {}", q.query)))
            },
        ))
        .stream(stream)
}

async fn mock(answers: &[&str]) -> MockServer {
    start(MockOptions {
        answers: answers.iter().map(|a| a.to_string()).collect(),
        ..MockOptions::default()
    })
    .await
    .expect("mock starts")
}

/// The user messages the loop added after the first (the feedback on invalid answers).
fn feedback(o: &Outcome) -> Vec<String> {
    o.messages
        .iter()
        .skip(1)
        .filter_map(|m| match m {
            Message::User { content, .. } => Some(content.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn each_wire_api_carries_the_native_format_and_the_answer_is_typed() {
    for protocol in PROTOCOLS {
        for stream in [false, true] {
            let what = format!("{protocol}, stream {stream}");
            let server = mock(&[]).await;
            // One round of tool calls, then the answer: tools work while a schema is set.
            let agent = builder(model(protocol, &server, "mock:rounds=1"), stream)
                .output_type::<Report>()
                .build()
                .unwrap();
            let outcome = agent.prompt("Report.").await;
            assert_eq!(
                outcome.stop_reason,
                StopReason::Answered,
                "{what}: {:?}",
                outcome.error
            );
            assert_eq!(outcome.tool_calls.len(), 1, "{what}");
            // The mock answers with an instance of the schema it received.
            let report: Report = outcome.parse().unwrap();
            assert_eq!(
                report,
                Report {
                    title: "a".into(),
                    count: 0,
                    done: false
                },
                "{what}"
            );
            assert_eq!(
                outcome.output,
                Some(json!({"title": "a", "count": 0, "done": false}))
            );
            let stats = server.stats();
            assert_eq!(stats.rejected, 0, "{what}");
            assert_eq!(
                stats.output_schemas, 2,
                "{what}: every request asks for the format natively"
            );

            // A schema with an optional field is sent without strict decoding.
            let server = mock(&[]).await;
            let agent = builder(model(protocol, &server, "mock:rounds=0"), stream)
                .output_type::<Loose>()
                .build()
                .unwrap();
            let outcome = agent.prompt("Report.").await;
            assert_eq!(
                outcome.stop_reason,
                StopReason::Answered,
                "{what}: {:?}",
                outcome.error
            );
            let loose: Loose = outcome.parse().unwrap();
            assert_eq!(loose.title, "a", "{what}");
            assert_eq!(server.stats().output_schemas, 1, "{what}");
        }
    }
}

#[tokio::test]
async fn an_invalid_answer_goes_back_with_its_errors_and_the_corrected_one_is_taken() {
    for protocol in PROTOCOLS {
        let server = mock(&[
            r#"{"title": 5, "count": 1, "done": true}"#,
            "```json\n{\"title\": \"ok\", \"count\": 2, \"done\": true}\n```",
        ])
        .await;
        let agent = builder(model(protocol, &server, "mock:rounds=0"), false)
            .output_type::<Report>()
            .build()
            .unwrap();
        let outcome = agent.prompt("Report.").await;
        assert_eq!(
            outcome.stop_reason,
            StopReason::Answered,
            "{protocol}: {:?}",
            outcome.error
        );
        assert_eq!(outcome.rounds, 2, "{protocol}");
        assert_eq!(
            outcome.parse::<Report>().unwrap(),
            Report {
                title: "ok".into(),
                count: 2,
                done: true
            }
        );
        let fed = feedback(&outcome);
        assert_eq!(fed.len(), 1, "{protocol}: {fed:?}");
        assert!(
            fed[0].contains("`Report`") && fed[0].contains("/title") && fed[0].contains("string"),
            "{protocol}: {}",
            fed[0]
        );
        // The feedback went over the wire and the server accepted the conversation.
        assert_eq!(server.stats().rejected, 0);
        assert_eq!(server.stats().output_schemas, 2);
    }
}

#[tokio::test]
async fn answers_that_keep_failing_stop_the_run_over_the_budget_with_the_transcript() {
    for protocol in PROTOCOLS {
        let server = mock(&["Here is the report: it went fine."]).await;
        let agent = builder(model(protocol, &server, "mock:rounds=0"), false)
            .output_type::<Report>()
            .build()
            .unwrap();
        let outcome = agent.prompt("Report.").await;
        assert_eq!(outcome.stop_reason, StopReason::TooManyInvalidCalls);
        assert!(!outcome.success);
        let error = outcome.error.clone().unwrap();
        assert_eq!(error.code, ErrorCode::InvalidOutput, "{protocol}");
        assert!(
            error.message.contains("3 invalid") && error.message.contains("not valid JSON"),
            "{protocol}: {}",
            error.message
        );
        // The default budget is 2: three answers, each with its feedback.
        assert_eq!(outcome.rounds, 3, "{protocol}");
        assert_eq!(feedback(&outcome).len(), 3, "{protocol}");
        assert_eq!(outcome.messages.len(), 7, "{protocol}");
        assert_eq!(
            outcome.text.as_deref(),
            Some("Here is the report: it went fine.")
        );
        assert!(outcome.output.is_none() && outcome.parse::<Report>().is_err());
    }
}

#[tokio::test]
async fn prompt_based_calling_puts_the_schema_in_the_prompt() {
    let server = mock(&[
        "{\"title\": \"x\"}",
        "{\"title\": \"x\", \"count\": 3, \"done\": false}",
    ])
    .await;
    // What the prompted adapter asks of the model it wraps: the system prompt, and whether
    // JSON was asked for natively.
    let inner = Arc::new(Recording::new(
        model("openai", &server, "mock:text_calls=hermes,rounds=1"),
        |request| {
            let system = request
                .messages
                .iter()
                .find_map(|m| match m {
                    Message::System { content } => Some(content.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            (system, request.settings.output.is_some())
        },
    ));
    let prompted = Prompted::new(inner.clone(), Dialect::Hermes);
    let agent = builder(Arc::new(prompted), false)
        .output_type::<Report>()
        .build()
        .unwrap();
    let outcome = agent.prompt("Report.").await;
    assert_eq!(
        outcome.stop_reason,
        StopReason::Answered,
        "{:?} {:?}",
        outcome.error,
        outcome.messages
    );
    // The calls written as text ran; the invalid answer went back; the corrected one is taken.
    assert!(outcome.executed_calls().count() >= 1);
    assert_eq!(outcome.parse::<Report>().unwrap().count, 3);
    let fed = feedback(&outcome);
    assert!(fed.iter().any(|f| f.contains("required")), "{fed:?}");
    let seen = inner.seen();
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    for (system, native) in seen.iter() {
        assert!(!native, "the wrapped model is not asked for JSON natively");
        assert!(
            system.contains("JSON Schema (`Report`)") && system.contains("\"count\""),
            "{system}"
        );
    }
    assert_eq!(server.stats().output_schemas, 0);
    assert_eq!(server.stats().rejected, 0);
}

/// Answers by the number of assistant turns in the request, so a resumed run gets the same
/// answers as the original at each point.
struct ByTurn(Vec<ModelResponse>);

#[async_trait]
impl Model for ByTurn {
    fn name(&self) -> &str {
        "by-turn"
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        assert!(
            request.settings.output.is_some(),
            "every request of the run carries its output schema"
        );
        let turns = request
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .count();
        self.0
            .get(turns)
            .cloned()
            .ok_or_else(|| ModelError::Other("script exhausted".into()))
    }
}

fn by_turn() -> ByTurn {
    ByTurn(vec![
        ModelResponse::text("not yet"),
        ModelResponse::text(r#"{"title": "t", "count": 1, "done": true}"#),
    ])
}

#[tokio::test]
async fn a_logged_run_replays_and_resumes_to_the_same_validated_answer() {
    let journal = Arc::new(MemoryJournal::new());
    let agent = Agent::builder(by_turn())
        .output_type::<Report>()
        .journal(journal.clone())
        .build()
        .unwrap();
    let full = agent.prompt("Report.").await;
    assert_eq!(full.stop_reason, StopReason::Answered, "{:?}", full.error);
    assert_eq!(feedback(&full).len(), 1);
    let run_id = full.run_id.clone().unwrap();
    let records = journal.load(&run_id).await.unwrap();
    match &records[0] {
        Record::Started { output_schema, .. } => {
            assert_eq!(
                output_schema.as_ref(),
                Some(&OutputSchema::for_type::<Report>())
            )
        }
        other => panic!("{other:?}"),
    }

    // The log alone rebuilds the outcome, the schema included (the agent given none).
    let machine = Machine::replay(
        Arc::new(Default::default()),
        Default::default(),
        Arc::new(Default::default()),
        records.clone(),
    )
    .unwrap();
    let replayed = machine.into_outcome(0);
    assert_eq!(replayed.output, full.output);
    assert_eq!(replayed.messages, full.messages);

    // Cut after each record and resumed by an agent with no schema of its own: the run keeps
    // the schema it started with, sends it with every request, and ends the same.
    for cut in 1..records.len() {
        let journal = Arc::new(MemoryJournal::new());
        for r in &records[..cut] {
            journal.append(&run_id, r).await.unwrap();
        }
        let agent = Agent::builder(by_turn())
            .journal(journal.clone())
            .build()
            .unwrap();
        let resumed = agent
            .resume(&run_id, CancellationToken::new())
            .await
            .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(resumed.stop_reason, StopReason::Answered, "cut {cut}");
        assert_eq!(resumed.output, full.output, "cut {cut}");
        assert_eq!(resumed.messages, full.messages, "cut {cut}");
    }
}

#[test]
fn a_schema_that_does_not_compile_fails_the_build() {
    let err = Agent::builder(ScriptedModel::new(vec![]))
        .output_schema(OutputSchema::new("broken", json!({"type": "nonsense"})))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("`broken`"), "{err}");
}
