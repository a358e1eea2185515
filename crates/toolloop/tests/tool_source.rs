//! Tool sources: tools that change during a run are offered from the next model call on, the
//! run logs its catalog, and a resumed run judges its calls by the tools it had.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use toolloop::event::Event;
use toolloop::journal::{Journal, MemoryJournal, Record};
use toolloop::message::{Message, ToolCall};
use toolloop::model::{Model, ModelError, ModelRequest, ModelResponse};
use toolloop::outcome::{CallStatus, StopReason};
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::tool_source::{ToolSource, ToolSourceError};
use toolloop::{Agent, Outcome};

#[derive(Deserialize, JsonSchema)]
struct Text {
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct Nothing {}

/// A registry of tools: `add_tool` adds `extra` to it, as an MCP server does before it sends
/// `notifications/tools/list_changed`.
#[derive(Default)]
struct Registry {
    version: AtomicU64,
    tools: Mutex<Vec<Arc<dyn Tool>>>,
    failing: AtomicBool,
    listed: AtomicU64,
}

impl Registry {
    /// A registry with `add_tool`, and `extra` too when `with_extra`.
    fn new(with_extra: bool) -> Arc<Registry> {
        let registry = Arc::new(Registry::default());
        let weak = Arc::downgrade(&registry);
        let add = tool_fn(
            "add_tool",
            "Adds the tool `extra`.",
            move |_: Nothing, _ctx: ToolContext| {
                let registry = weak.upgrade();
                async move {
                    if let Some(r) = registry {
                        r.add(extra());
                    }
                    Ok::<_, ToolError>(ToolOutput::text("added"))
                }
            },
        );
        registry.add(Arc::new(add));
        if with_extra {
            registry.add(extra());
        }
        registry
    }

    fn add(&self, tool: Arc<dyn Tool>) {
        let mut tools = self.tools.lock().unwrap();
        if tools.iter().all(|t| t.name() != tool.name()) {
            tools.push(tool);
        }
        self.version.fetch_add(1, Ordering::SeqCst);
    }
}

fn extra() -> Arc<dyn Tool> {
    Arc::new(
        tool_fn(
            "extra",
            "Gives back the text.",
            |a: Text, _ctx: ToolContext| async move {
                Ok::<_, ToolError>(ToolOutput::text(format!("extra: {}", a.text)))
            },
        )
        .with_side_effect(SideEffect::ReadOnly),
    )
}

#[async_trait]
impl ToolSource for Registry {
    fn name(&self) -> &str {
        "registry"
    }
    fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }
    async fn tools(&self, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
        self.listed.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return Err(ToolSourceError {
                source_name: "registry".into(),
                message: "it is down".into(),
            });
        }
        let tools = self.tools.lock().unwrap().clone();
        Ok(tools
            .into_iter()
            .filter(|t| !reserved.contains(&t.name()))
            .collect())
    }
}

/// Answers by round (the assistant turns so far): `add_tool`, then `extra`, then a text; and
/// remembers the tools each request offered.
#[derive(Default)]
struct Offered {
    offered: Mutex<Vec<Vec<String>>>,
}

#[async_trait]
impl Model for Offered {
    fn name(&self) -> &str {
        "offered"
    }
    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.offered
            .lock()
            .unwrap()
            .push(request.tools.iter().map(|t| t.name.clone()).collect());
        let round = request
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .count();
        let call = |id: &str, name: &str, args: serde_json::Value| {
            let mut call = ToolCall::new(name, args);
            call.id = id.to_string();
            ModelResponse::tool_calls(vec![call])
        };
        Ok(match round {
            0 => call("c1", "add_tool", json!({})),
            1 => call("c2", "extra", json!({"text": "hi"})),
            _ => ModelResponse::text("done"),
        })
    }
}

/// The agent's own tool, offered first in every request.
fn own() -> Arc<dyn Tool> {
    Arc::new(
        tool_fn(
            "own",
            "The agent's own tool.",
            |_: Nothing, _ctx: ToolContext| async move { Ok::<_, ToolError>(ToolOutput::text("own")) },
        )
        .with_side_effect(SideEffect::ReadOnly),
    )
}

fn agent(
    model: Arc<Offered>,
    registry: Arc<Registry>,
    journal: Arc<MemoryJournal>,
    events: Arc<Mutex<Vec<Event>>>,
) -> Agent {
    Agent::builder(Forwarding(model))
        .tool_arc(own())
        .tool_source_arc(registry)
        .journal(journal)
        .on_event(move |e| events.lock().unwrap().push(e.clone()))
        .build()
        .unwrap()
}

/// The shared model, so a test can look at what it was offered.
struct Forwarding(Arc<Offered>);

#[async_trait]
impl Model for Forwarding {
    fn name(&self) -> &str {
        self.0.name()
    }
    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.0.complete(request).await
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn result_of<'a>(outcome: &'a Outcome, name: &str) -> &'a toolloop::outcome::ExecutedCall {
    outcome
        .tool_calls
        .iter()
        .find(|c| c.call.name == name)
        .unwrap_or_else(|| panic!("no call of {name}: {outcome:?}"))
}

/// The catalogs a log holds: (round, tool names).
fn logged_catalogs(records: &[Record]) -> Vec<(u32, Vec<String>)> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::ToolsChanged { round, tools } => {
                Some((*round, tools.names().map(String::from).collect()))
            }
            _ => None,
        })
        .collect()
}

/// A whole run: `add_tool` adds `extra` in round 1, and round 2 offers and calls it.
async fn full_run() -> (Outcome, Vec<Record>, Arc<Offered>, Vec<Event>) {
    let model = Arc::new(Offered::default());
    let journal = Arc::new(MemoryJournal::new());
    let events = Arc::new(Mutex::new(Vec::new()));
    let outcome = agent(
        model.clone(),
        Registry::new(false),
        journal.clone(),
        events.clone(),
    )
    .prompt("go")
    .await;
    let records = journal
        .load(outcome.run_id.as_deref().unwrap())
        .await
        .unwrap();
    let events = events.lock().unwrap().clone();
    (outcome, records, model, events)
}

#[tokio::test]
async fn a_tool_a_source_adds_during_a_run_is_offered_and_runs_from_the_next_round() {
    let (outcome, records, model, events) = full_run().await;
    assert_eq!(outcome.stop_reason, StopReason::Answered, "{outcome:?}");
    assert_eq!(
        *model.offered.lock().unwrap(),
        [
            names(&["own", "add_tool"]),
            names(&["own", "add_tool", "extra"]),
            names(&["own", "add_tool", "extra"]),
        ]
    );
    let extra = result_of(&outcome, "extra");
    assert_eq!(extra.status, CallStatus::Ok, "{extra:?}");
    assert!(extra.content.contains("extra: hi"), "{}", extra.content);
    // The change is an event, before the round's model call.
    let changed: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e, Event::ToolsChanged { .. }))
        .collect();
    assert_eq!(
        changed,
        [&Event::ToolsChanged {
            round: 2,
            added: names(&["extra"]),
            removed: vec![],
            changed: vec![],
        }]
    );
    // The log holds the catalog the run started with, and the one round 2 offered.
    assert_eq!(
        logged_catalogs(&records),
        [
            (0, names(&["own", "add_tool"])),
            (2, names(&["own", "add_tool", "extra"])),
        ]
    );
    // The catalog records what the loop judges calls by.
    let Some(Record::ToolsChanged { tools, .. }) = records
        .iter()
        .rfind(|r| matches!(r, Record::ToolsChanged { .. }))
    else {
        unreachable!()
    };
    let logged_extra = tools.get("extra").unwrap();
    assert_eq!(logged_extra.side_effect, SideEffect::ReadOnly);
    assert_eq!(logged_extra.parameters["required"], json!(["text"]));
}

/// The run's log cut right after round 2's response (the call of `extra` was in flight).
async fn cut_after_round_2(records: &[Record], run_id: &str) -> Arc<MemoryJournal> {
    let cut = records
        .iter()
        .position(|r| matches!(r, Record::ModelResponded { round: 2, .. }))
        .unwrap()
        + 1;
    let journal = Arc::new(MemoryJournal::new());
    for r in &records[..cut] {
        journal.append(run_id, r).await.unwrap();
    }
    journal
}

#[tokio::test]
async fn a_resumed_run_judges_its_calls_by_the_tools_it_had_and_runs_them_as_they_are_now() {
    let (outcome, records, _, _) = full_run().await;
    let run_id = outcome.run_id.clone().unwrap();

    // The source offers `extra` no more: the call the model made of it is still a valid call
    // (not an unknown tool) and, read-only and in flight, runs again: it fails, since no tool
    // of that name runs now. The next round offers the tools of now, logged as a change.
    let journal = cut_after_round_2(&records, &run_id).await;
    let model = Arc::new(Offered::default());
    let events = Arc::new(Mutex::new(Vec::new()));
    let gone = agent(
        model.clone(),
        Registry::new(false),
        journal.clone(),
        events.clone(),
    );
    let resumed = gone
        .resume(&run_id, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(resumed.stop_reason, StopReason::Answered, "{resumed:?}");
    let extra = result_of(&resumed, "extra");
    assert_eq!(extra.status, CallStatus::Failed, "{extra:?}");
    assert!(
        extra.content.contains("no longer available"),
        "{}",
        extra.content
    );
    assert_eq!(
        *model.offered.lock().unwrap(),
        [names(&["own", "add_tool"])],
        "only round 3 was asked, with the tools of now"
    );
    let log = journal.load(&run_id).await.unwrap();
    assert_eq!(
        logged_catalogs(&log).last(),
        Some(&(3, names(&["own", "add_tool"])))
    );
    assert!(events.lock().unwrap().iter().any(|e| matches!(
        e,
        Event::ToolsChanged { round: 3, removed, .. } if *removed == names(&["extra"])
    )));

    // The source offers `extra` again: the call runs on it.
    let journal = cut_after_round_2(&records, &run_id).await;
    let here = agent(
        Arc::new(Offered::default()),
        Registry::new(true),
        journal.clone(),
        Arc::default(),
    );
    let resumed = here
        .resume(&run_id, CancellationToken::new())
        .await
        .unwrap();
    let extra = result_of(&resumed, "extra");
    assert_eq!(extra.status, CallStatus::Ok, "{extra:?}");
    // Nothing changed since the log's catalog: no change is logged.
    let log = journal.load(&run_id).await.unwrap();
    assert_eq!(
        logged_catalogs(&log).len(),
        2,
        "{:?}",
        logged_catalogs(&log)
    );
}

#[tokio::test]
async fn a_source_that_cannot_list_keeps_what_it_listed_last_and_is_asked_again() {
    // Down from the start: the run offers the agent's own tools and goes on.
    let registry = Registry::new(false);
    registry.failing.store(true, Ordering::SeqCst);
    let model = Arc::new(Offered::default());
    let outcome = agent(
        model.clone(),
        registry.clone(),
        Arc::new(MemoryJournal::new()),
        Arc::default(),
    )
    .prompt("go")
    .await;
    let offered = model.offered.lock().unwrap().clone();
    assert_eq!(offered[0], names(&["own"]));
    // The model's call of a tool nobody offered is an invalid call, and the run goes on.
    assert_eq!(result_of(&outcome, "add_tool").status, CallStatus::Invalid);
    // A failed listing is tried again before every model call.
    assert!(registry.listed.load(Ordering::SeqCst) >= offered.len() as u64);

    // Down after it listed: its tools stay offered.
    let registry = Registry::new(false);
    let model = Arc::new(Offered::default());
    let agent = agent(
        model.clone(),
        registry.clone(),
        Arc::new(MemoryJournal::new()),
        Arc::default(),
    );
    let _ = agent.tools_now().await;
    registry.failing.store(true, Ordering::SeqCst);
    registry.version.fetch_add(1, Ordering::SeqCst);
    let outcome = agent.prompt("go").await;
    assert_eq!(result_of(&outcome, "add_tool").status, CallStatus::Ok);
    assert_eq!(
        model.offered.lock().unwrap()[0],
        names(&["own", "add_tool"])
    );
}

/// A source that never answers, and counts how often it was asked.
#[derive(Default)]
struct Silent {
    asked: AtomicU64,
}

#[async_trait]
impl ToolSource for Silent {
    fn name(&self) -> &str {
        "silent"
    }
    fn version(&self) -> u64 {
        0
    }
    async fn tools(&self, _reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_source_that_does_not_answer_is_given_up_on_and_the_run_goes_on() {
    // Real time, short: given up on after 100 ms, then left alone for 200 ms.
    let timeout = std::time::Duration::from_millis(100);
    let model = Arc::new(Offered::default());
    let silent = Arc::new(Silent::default());
    let agent = Agent::builder(Forwarding(model.clone()))
        .tool_arc(own())
        .tool_source_arc(silent.clone())
        .tool_source_timeout(timeout)
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let outcome = agent.prompt("go").await;
    let given_up = tokio::time::Instant::now();
    assert_eq!(outcome.stop_reason, StopReason::Answered, "{outcome:?}");
    assert_eq!(model.offered.lock().unwrap()[0], names(&["own"]));
    assert_eq!(silent.asked.load(Ordering::SeqCst), 1);
    // Given up on after the timeout set (not before, and not after the default's 30 s: a third
    // of it leaves room for a loaded machine's pauses).
    let waited = given_up - started;
    assert!(
        waited >= timeout && waited < std::time::Duration::from_secs(10),
        "gave up after {waited:?}"
    );
    // Left alone for twice the timeout: the next run (at once) does not ask it (unless a
    // loaded machine paused this test past those 200 ms, when asking again is right).
    assert_eq!(agent.prompt("go").await.stop_reason, StopReason::Answered);
    let mut given_up = given_up;
    let asked = silent.asked.load(Ordering::SeqCst);
    if asked == 2 {
        assert!(tokio::time::Instant::now() >= given_up + 2 * timeout);
        given_up = tokio::time::Instant::now();
    } else {
        assert_eq!(asked, 1);
    }
    // Then asked again.
    tokio::time::sleep_until(given_up + 2 * timeout).await;
    let later = tokio::time::Instant::now();
    assert_eq!(agent.prompt("go").await.stop_reason, StopReason::Answered);
    assert_eq!(silent.asked.load(Ordering::SeqCst), asked + 1);
    assert!(later.elapsed() >= timeout);
}

#[tokio::test]
async fn only_a_source_whose_version_moved_is_listed_again() {
    let (changing, steady) = (Registry::new(false), Registry::new(false));
    // The same tools under other names, so the two sources do not collide.
    let renamed = Arc::new(Renamed(steady.clone()));
    let agent = Agent::builder(Forwarding(Arc::new(Offered::default())))
        .tool_source_arc(changing.clone())
        .tool_source_arc(renamed)
        .build()
        .unwrap();
    let first = agent.tools_now().await;
    assert!(
        Arc::ptr_eq(&first, &agent.tools_now().await),
        "nothing moved"
    );
    changing.add(extra());
    let second = agent.tools_now().await;
    assert!(second.get("extra").is_some());
    assert_eq!(changing.listed.load(Ordering::SeqCst), 2);
    assert_eq!(steady.listed.load(Ordering::SeqCst), 1);
    assert!(second.get("steady_add_tool").is_some());
}

/// A registry's tools under a `steady_` prefix.
struct Renamed(Arc<Registry>);

struct Prefixed(Arc<dyn Tool>, String);

#[async_trait]
impl Tool for Prefixed {
    fn name(&self) -> &str {
        &self.1
    }
    fn description(&self) -> &str {
        self.0.description()
    }
    fn parameters(&self) -> &serde_json::Value {
        self.0.parameters()
    }
    async fn call(
        &self,
        args: serde_json::Value,
        ctx: ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        self.0.call(args, ctx).await
    }
}

#[async_trait]
impl ToolSource for Renamed {
    fn name(&self) -> &str {
        "renamed"
    }
    fn version(&self) -> u64 {
        self.0.version()
    }
    async fn tools(&self, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
        Ok(self
            .0
            .tools(reserved)
            .await?
            .into_iter()
            .map(|t| {
                let name = format!("steady_{}", t.name());
                Arc::new(Prefixed(t, name)) as Arc<dyn Tool>
            })
            .collect())
    }
}
