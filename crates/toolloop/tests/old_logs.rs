//! Run logs written by toolloop 0.1 (before the machine took one input type) still load and
//! replay to the same state. `tests/data/logs-0.1.json` holds, for each scenario below, the
//! records of a run as that release wrote them and the state its replay rebuilt (written by
//! the test `write_the_fixture` of the commit that added it, run on 0.1's code).

use async_trait::async_trait;
use futures::FutureExt;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use toolloop::agent::{Agent, AgentBuilder};
use toolloop::approval::Verdict;
use toolloop::approval::{Action, Answer, Approvals, Rule};
use toolloop::config::RoundLimitDecision;
use toolloop::engine::{Machine, ReplayError, Step};
use toolloop::journal;
use toolloop::journal::Record;
use toolloop::message::ToolCall;
use toolloop::model::{Model, ModelError, ModelRequest, ModelResponse};
use toolloop::output::OutputSchema;
use toolloop::providers::scripted::{ScriptStep, ScriptedModel};
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::tool_source::{ToolSource, ToolSourceError};
use toolloop::toolbox::Toolbox;

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
    fn approval_subject(&self, args: &Value) -> toolloop::approval::Subject {
        args["command"].as_str().unwrap_or_default().into()
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
        "output_schema" => {
            Agent::builder(scripted(vec![ModelResponse::text("{\"name\": \"Lyon\"}")]))
                .output_schema(OutputSchema::new(
                    "City",
                    json!({"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}),
                ))
        }
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

/// The live tools a scenario's replay has: the agent's own, and a source's as it lists now.
fn live_tools(scenario: &str, agent: &Agent) -> Arc<Toolbox> {
    match scenario {
        "tool_sources" => {
            let mut t = Toolbox::new();
            t.add_arc(echo()).unwrap();
            t.add_arc(shell()).unwrap();
            Arc::new(t)
        }
        _ => agent.toolbox().clone(),
    }
}

/// The scenario's records as 0.1 wrote them.
fn records_of(entry: &Value) -> Vec<Record> {
    serde_json::from_value(entry["records"].clone()).unwrap()
}

/// Replays records as `Agent::resume` does: brought up to date with the live tools, then
/// handed to a fresh machine. The state (without what 0.1 did not keep: the calls' approval
/// subjects and whether they started) and the calls in flight.
fn replayed(
    scenario: &str,
    mut records: Vec<Record>,
    upgrade: bool,
) -> Result<(Value, Vec<usize>), ReplayError> {
    let agent = builder(scenario).build().unwrap();
    let live = live_tools(scenario, &agent);
    if upgrade {
        journal::upgrade(&mut records, &live, &agent.config().approvals);
    }
    let machine = Machine::replay(
        Arc::new(agent.config().clone()),
        agent.hooks().into(),
        live.catalog().clone(),
        records,
    )?;
    let mut state = serde_json::to_value(machine.state()).unwrap();
    if let Some(slots) = state["phase"]
        .get_mut("slots")
        .and_then(Value::as_array_mut)
    {
        for slot in slots {
            let slot = slot.as_object_mut().unwrap();
            slot.remove("subject");
            slot.remove("started");
        }
    }
    Ok((state, machine.in_flight()))
}

fn fixture() -> Vec<Value> {
    let text = std::fs::read_to_string(FIXTURE).unwrap();
    let all: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(all.len(), SCENARIOS.len());
    all
}

#[test]
fn logs_of_0_1_replay_to_the_state_0_1_rebuilt() {
    let mut kinds = std::collections::BTreeSet::new();
    for entry in fixture() {
        let scenario = entry["scenario"].as_str().unwrap();
        let records = records_of(&entry);
        kinds.extend(records.iter().map(Record::kind));
        let (state, in_flight) = replayed(scenario, records, true).unwrap();
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

#[test]
fn what_0_1_did_not_log_is_taken_from_the_live_tools() {
    let all = fixture();
    let entry = |name: &str| all.iter().find(|e| e["scenario"] == name).unwrap();
    // 0.1 logged no approval subjects: rules over the command line cannot be judged without
    // them, and the machine refuses the response rather than judge it by the arguments.
    let approvals = records_of(entry("approvals"));
    let Err(ReplayError::Unfit { source, .. }) = replayed("approvals", approvals.clone(), false)
    else {
        panic!("a response without the subjects its calls need replays")
    };
    assert!(source.to_string().contains("approval subject"), "{source}");
    let mut upgraded = approvals;
    let agent = builder("approvals").build().unwrap();
    journal::upgrade(&mut upgraded, agent.toolbox(), &agent.config().approvals);
    let subjects = upgraded.iter().find_map(|r| match r {
        Record::ModelResponded { subjects, .. } => Some(subjects.clone()),
        _ => None,
    });
    assert_eq!(
        subjects.unwrap(),
        ["git status", "rm -rf /", "ls"].map(|s| Some(s.into()))
    );
    // Upgraded records are this version's: upgrading again changes nothing, and they read
    // back as they were written.
    let again = {
        let mut r = upgraded.clone();
        journal::upgrade(&mut r, agent.toolbox(), &agent.config().approvals);
        r
    };
    assert_eq!(again, upgraded);
    let text = serde_json::to_string(&upgraded).unwrap();
    assert_eq!(
        serde_json::from_str::<Vec<Record>>(&text).unwrap(),
        upgraded
    );

    // 0.1 logged no default approvals in a catalog: `shell` asks by default, and a replay
    // that took it as allowed would let the person's recorded decision go unused.
    let sources = records_of(entry("tool_sources"));
    let logged = sources.iter().find_map(|r| match r {
        Record::ToolsChanged { tools, .. } => tools.get("shell").cloned(),
        _ => None,
    });
    assert_eq!(logged.unwrap().default_approval, None);
    // The log cut after round 2's response, which calls `more` and `shell`.
    let responded = sources
        .iter()
        .rposition(|r| matches!(r, Record::ModelResponded { round: 2, .. }))
        .unwrap();
    let cut = sources[..=responded].to_vec();
    let agent = builder("tool_sources").build().unwrap();
    let live = live_tools("tool_sources", &agent);
    let next = |records: Vec<Record>| {
        let mut m = Machine::replay(
            Arc::new(agent.config().clone()),
            agent.hooks().into(),
            live.catalog().clone(),
            records,
        )
        .unwrap();
        m.next_step()
    };
    // Taken as allowed, `shell` would run unasked.
    assert!(matches!(next(cut.clone()), Step::RunTools(_)));
    let mut upgraded = cut;
    journal::upgrade(&mut upgraded, &live, &agent.config().approvals);
    match next(upgraded) {
        Step::Approve(requests) => {
            assert_eq!(requests.len(), 1);
            assert_eq!(requests[0].pending.call.name, "shell");
            assert_eq!(requests[0].verdict, Verdict::Ask);
        }
        other => panic!("{other:?}"),
    }
}
