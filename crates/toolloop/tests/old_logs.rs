//! Run logs written by toolloop 0.1 (before the machine took one input type) still load and
//! replay to the same state. `tests/data/logs-0.1.json` holds, for each scenario below, the
//! records of a run as that release wrote them and the state its replay rebuilt.

use async_trait::async_trait;
use futures::FutureExt;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolloop::agent::{Agent, AgentBuilder};
use toolloop::approval::{Action, Answer, Approvals, Rule};
use toolloop::config::RoundLimitDecision;
use toolloop::journal::{Journal, MemoryJournal, Record};
use toolloop::message::ToolCall;
use toolloop::model::{Model, ModelError, ModelRequest, ModelResponse};
use toolloop::output::OutputSchema;
use toolloop::providers::scripted::{ScriptStep, ScriptedModel};
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::tool_source::{ToolSource, ToolSourceError};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/logs-0.1.json");

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Text {
    text: String,
}

/// A read-only, parallel-safe tool.
fn echo() -> Arc<dyn Tool> {
    Arc::new(
        tool_fn("echo", "Says the text back.", |a: Text, _ctx: ToolContext| async move {
            Ok::<_, ToolError>(ToolOutput::text(a.text))
        })
        .allow_parallel()
        .with_side_effect(SideEffect::ReadOnly),
    )
}

/// A side-effecting tool.
fn charge() -> Arc<dyn Tool> {
    Arc::new(tool_fn(
        "charge",
        "Charges a card.",
        |a: Value, _ctx: ToolContext| async move {
            Ok::<_, ToolError>(ToolOutput::text(format!("charged {}", a["amount"])))
        },
    ))
}

/// A tool whose approval subject is its command line, asked about by default.
struct Shell {
    schema: Value,
}

#[async_trait]
impl Tool for Shell {
    fn name(&self) -> &str {
        "shell"
    }
    fn description(&self) -> &str {
        "Runs a command."
    }
    fn parameters(&self) -> &Value {
        &self.schema
    }
    fn approval_subject(&self, args: &Value) -> String {
        args["command"].as_str().unwrap_or_default().to_string()
    }
    fn default_approval(&self) -> Action {
        Action::Ask
    }
    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text(format!("ran {}", args["command"])))
    }
}

fn shell() -> Arc<dyn Tool> {
    Arc::new(Shell {
        schema: json!({"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}),
    })
}

/// Tools that change: `more` is listed from the second listing on (before round 1's call).
#[derive(Default)]
struct Plugins {
    version: AtomicU64,
    listed: AtomicU64,
}

#[async_trait]
impl ToolSource for Plugins {
    fn name(&self) -> &str {
        "plugins"
    }
    fn version(&self) -> u64 {
        // 0 when the run starts, 1 from then on: listed twice.
        self.version.fetch_add(1, Ordering::SeqCst).min(1)
    }
    async fn tools(&self, _reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
        let mut tools = vec![shell()];
        if self.listed.fetch_add(1, Ordering::SeqCst) > 0 {
            tools.push(Arc::new(
                tool_fn("more", "More.", |a: Text, _ctx: ToolContext| async move {
                    Ok::<_, ToolError>(ToolOutput::text(a.text))
                })
                .with_side_effect(SideEffect::Idempotent),
            ));
        }
        Ok(tools)
    }
}

/// A model that never answers.
struct Slow;

#[async_trait]
impl Model for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    async fn complete(&self, _request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Err(ModelError::Other("no answer".into()))
    }
}

fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
    let mut c = ToolCall::new(name, arguments);
    c.id = id.into();
    c
}

fn scripted(responses: Vec<ModelResponse>) -> ScriptedModel {
    ScriptedModel::new(responses)
}

/// The agent of each scenario (without its journal), as it was run and as it replays.
fn builder(scenario: &str) -> AgentBuilder {
    match scenario {
        // Every hook answers, calls run in parallel and alone, the round limit is extended.
        "hooks" => Agent::builder(scripted(vec![
            ModelResponse::tool_calls(vec![
                call("a", "echo", json!({"text": "one"})),
                call("b", "echo", json!({"text": "two"})),
                call("c", "charge", json!({"amount": 3})),
            ]),
            ModelResponse::text("done"),
        ]))
        .tool_arc(echo())
        .tool_arc(charge())
        .max_rounds(1)
        .reminders(|view| vec![format!("round {}", view.round)])
        .stop_when(|_calls| None)
        .on_round_limit(|_view| async { RoundLimitDecision::Extend(1) }.boxed()),
        // Rules decide by the command line; one call waits for a person.
        "approvals" => Agent::builder(scripted(vec![
            ModelResponse::tool_calls(vec![
                call("g", "shell", json!({"command": "git status"})),
                call("r", "shell", json!({"command": "rm -rf /"})),
                call("l", "shell", json!({"command": "ls"})),
            ]),
            ModelResponse::text("done"),
        ]))
        .tool_arc(shell())
        .approvals(Approvals {
            rules: vec![
                Rule::parse(Action::Allow, "shell:git *").unwrap(),
                Rule::parse(Action::Deny, "shell:rm *").unwrap(),
            ],
            default: None,
        }),
        // The tools change during the run; `shell` (a source's) is asked about by default.
        "tool_sources" => Agent::builder(scripted(vec![
            ModelResponse::tool_calls(vec![call("a", "echo", json!({"text": "x"}))]),
            ModelResponse::tool_calls(vec![
                call("m", "more", json!({"text": "y"})),
                call("s", "shell", json!({"command": "ls"})),
            ]),
            ModelResponse::text("done"),
        ]))
        .tool_arc(echo())
        .tool_source(Plugins::default())
        .on_approval(|_p| async { Answer::Approve }.boxed()),
        "model_failed" => Agent::builder(ScriptedModel::from_steps(vec![
            ScriptStep::Respond(ModelResponse::tool_calls(vec![call(
                "a",
                "echo",
                json!({"text": "x"}),
            )])),
            ScriptStep::Fail(ModelError::Other("the server is down".into())),
        ]))
        .tool_arc(echo()),
        "interrupted" => Agent::builder(Slow).timeout(Duration::from_millis(50)),
        // A side-effecting call was in flight at a crash; the resumed run did not run it again.
        "in_flight" | "in_flight_cut" => Agent::builder(scripted(vec![
            ModelResponse::tool_calls(vec![
                call("a", "charge", json!({"amount": 1})),
                call("b", "charge", json!({"amount": 2})),
            ]),
            ModelResponse::text("done"),
        ]))
        .tool_arc(charge()),
        "output_schema" => Agent::builder(scripted(vec![ModelResponse::text(
            "{\"name\": \"Lyon\"}",
        )]))
        .output_schema(OutputSchema::new(
            "City",
            json!({"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}),
        )),
        other => panic!("no scenario {other}"),
    }
}

const SCENARIOS: [&str; 8] = [
    "hooks",
    "approvals",
    "tool_sources",
    "model_failed",
    "interrupted",
    "in_flight",
    "in_flight_cut",
    "output_schema",
];

/// Runs a scenario with the current code and returns its records.
async fn run(scenario: &str) -> Vec<Record> {
    let journal = Arc::new(MemoryJournal::new());
    let agent = builder(scenario).journal(journal.clone()).build().unwrap();
    let outcome = agent.prompt("go").await;
    let run_id = outcome.run_id.clone().unwrap();
    match scenario {
        "approvals" => {
            agent
                .decide_approvals(&run_id, None, Some(Answer::Approve))
                .await
                .unwrap();
        }
        "in_flight" | "in_flight_cut" => {
            // Cut after the first call's intent: it was in flight.
            let records = journal.load(&run_id).await.unwrap();
            let cut = records
                .iter()
                .position(|r| matches!(r, Record::ToolStarted { .. }))
                .unwrap();
            journal.truncate(&run_id, cut + 1);
            if scenario == "in_flight" {
                agent
                    .resume(&run_id, CancellationToken::new())
                    .await
                    .unwrap();
            }
        }
        _ => {}
    }
    journal.load(&run_id).await.unwrap()
}

/// What 0.1's replay rebuilt from a scenario's records: its state and its calls in flight.
fn replayed_0_1(scenario: &str, records: &[Record]) -> (Value, Vec<usize>) {
    let agent = builder(scenario).build().unwrap();
    let toolbox = match scenario {
        // The live tools of a run with sources: the agent's own and the source's now.
        "tool_sources" => {
            let mut t = toolloop::toolbox::Toolbox::new();
            t.add_arc(echo()).unwrap();
            t.add_arc(shell()).unwrap();
            Arc::new(t)
        }
        _ => agent.toolbox().clone(),
    };
    let (machine, in_flight) = toolloop::engine::Machine::replay(
        Arc::new(agent.config().clone()),
        agent.hooks().clone(),
        toolbox,
        records,
    )
    .unwrap();
    (serde_json::to_value(machine.state()).unwrap(), in_flight)
}

/// Writes the fixture: `TOOLLOOP_WRITE_LOGS=1 cargo test -p toolloop --test old_logs -- --ignored`.
#[tokio::test]
#[ignore]
async fn write_the_fixture() {
    if std::env::var_os("TOOLLOOP_WRITE_LOGS").is_none() {
        return;
    }
    let mut all = Vec::new();
    for scenario in SCENARIOS {
        let records = run(scenario).await;
        let (state, in_flight) = replayed_0_1(scenario, &records);
        all.push(json!({
            "scenario": scenario,
            "records": records,
            "state": state,
            "in_flight": in_flight,
        }));
    }
    let text = serde_json::to_string_pretty(&all).unwrap();
    std::fs::create_dir_all(std::path::Path::new(FIXTURE).parent().unwrap()).unwrap();
    std::fs::write(FIXTURE, text + "\n").unwrap();
}

#[test]
fn logs_of_0_1_replay_to_the_state_0_1_rebuilt() {
    let text = std::fs::read_to_string(FIXTURE).unwrap();
    let all: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(all.len(), SCENARIOS.len());
    let mut kinds = std::collections::BTreeSet::new();
    for entry in all {
        let scenario = entry["scenario"].as_str().unwrap();
        let records: Vec<Record> = serde_json::from_value(entry["records"].clone()).unwrap();
        kinds.extend(records.iter().map(Record::kind));
        let (state, in_flight) = replayed_0_1(scenario, &records);
        assert_eq!(state, entry["state"], "{scenario}");
        let expected: Vec<usize> = serde_json::from_value(entry["in_flight"].clone()).unwrap();
        assert_eq!(in_flight, expected, "{scenario}");
    }
    // Every kind of record is in the fixture.
    for kind in [
        "started",
        "tools_changed",
        "reminders_given",
        "stop_checked",
        "model_requested",
        "model_responded",
        "model_failed",
        "tool_started",
        "tool_finished",
        "tool_unknown",
        "approval_decided",
        "round_limit_decided",
        "interrupted",
        "finished",
    ] {
        assert!(kinds.contains(kind), "no `{kind}` record in the fixture");
    }
}
