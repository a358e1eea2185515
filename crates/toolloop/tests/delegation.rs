//! Delegation: agents as tools, each a child run with its own model, tools and budget; caps on
//! depth and on children at once; children logged under their parent and resumed from their own
//! logs; a child's approvals deferred to the root run.

use crate::common;
use common::{Charge, Effects};

use futures::FutureExt;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use toolloop::agent::Agent;
use toolloop::approval::{Answer, Approvals};
use toolloop::event::Event;
use toolloop::journal::{Journal, MemoryJournal, Record};
use toolloop::outcome::{CallStatus, StopReason};
use toolloop::providers::scripted::ScriptedModel;
use toolloop::subagent::{Delegation, DelegationError, check_graph};
use toolloop::tool::SideEffect;

fn script(json: serde_json::Value) -> ScriptedModel {
    ScriptedModel::from_json(&json.to_string()).unwrap()
}

fn effects() -> Effects {
    Arc::new(Mutex::new(Default::default()))
}

fn count(effects: &Effects) -> u32 {
    effects.lock().unwrap().values().sum()
}

/// A child with no tools that answers `text` after `delay_ms`, reporting 10 + 5 tokens.
fn leaf(text: &str, delay_ms: u64) -> (Agent, ScriptedModel) {
    let model = script(json!([{
        "text": text,
        "delay_ms": delay_ms,
        "usage": {"input_tokens": 10, "output_tokens": 5}
    }]));
    (Agent::builder(model.clone()).build().unwrap(), model)
}

/// A parent's response calling each of `calls` (tool name, call id) with a task.
fn delegate(calls: &[(&str, &str)]) -> serde_json::Value {
    let calls: Vec<_> = calls
        .iter()
        .map(
            |(name, id)| json!({"id": id, "name": name, "arguments": {"task": format!("do {id}")}}),
        )
        .collect();
    json!({"tool_calls": calls, "usage": {"input_tokens": 100, "output_tokens": 1}})
}

#[tokio::test]
async fn three_read_only_children_run_at_once_and_their_usage_adds_up() {
    let names = ["alpha", "beta", "gamma"];
    let parent_model = script(json!([
        delegate(&[("alpha", "c1"), ("beta", "c2"), ("gamma", "c3")]),
        {"text": "all three answered", "usage": {"input_tokens": 100, "output_tokens": 1}}
    ]));
    let mut builder = Agent::builder(parent_model);
    let mut models = Vec::new();
    for (i, name) in names.iter().enumerate() {
        // 300, 350 and 400 ms: run one after another they take 1050 ms.
        let (child, model) = leaf(&format!("{name} done"), 300 + 50 * i as u64);
        models.push(model);
        builder = builder.tool(child.as_tool(*name, "A helper.").unwrap());
    }
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let parent = builder
        .on_event(move |e| seen.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let started = Instant::now();
    let outcome = parent.prompt("ask all three").await;
    let took = started.elapsed();
    assert!(outcome.success, "{:?}", outcome.error);
    assert_eq!(outcome.text.as_deref(), Some("all three answered"));
    // Close to the slowest child's 400 ms, far from the 1050 ms of one after another.
    assert!(took < Duration::from_millis(800), "took {took:?}");
    for (call, name) in outcome.tool_calls.iter().zip(names) {
        assert_eq!(call.status, CallStatus::Ok);
        assert!(
            call.content.contains(&format!("{name} done")),
            "{}",
            call.content
        );
        let spent = call.spent.as_ref().expect("a child's spending is reported");
        assert_eq!(spent.path, vec![name.to_string()]);
        assert_eq!(spent.usage.unwrap().total_tokens(), 15);
        assert_eq!(spent.rounds, 1);
    }
    // Two parent rounds of 101 tokens and three children of 15.
    assert_eq!(outcome.usage.unwrap().total_tokens(), 2 * 101 + 3 * 15);
    for m in &models {
        assert_eq!(m.used(), 1);
    }
    // Each child's events reach the parent's handler, nested under its path.
    let events = events.lock().unwrap();
    for name in names {
        assert!(
            events.iter().any(|e| matches!(e,
                Event::Child { path, event, .. }
                    if path == &[name.to_string()] && matches!(**event, Event::RunFinished { .. }))),
            "no nested run_finished of {name}"
        );
    }
}

#[tokio::test]
async fn the_limit_on_children_at_once_holds() {
    let parent_model = script(json!([
        delegate(&[("alpha", "c1"), ("beta", "c2")]),
        {"text": "done"}
    ]));
    let (a, _) = leaf("a", 300);
    let (b, _) = leaf("b", 300);
    let parent = Agent::builder(parent_model)
        .tool(a.as_tool("alpha", "A.").unwrap())
        .tool(b.as_tool("beta", "B.").unwrap())
        .delegation(Delegation {
            max_children: 1,
            ..Delegation::default()
        })
        .build()
        .unwrap();
    let started = Instant::now();
    let outcome = parent.prompt("go").await;
    assert!(outcome.success);
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "one at a time"
    );
}

#[tokio::test]
async fn a_child_over_its_budget_returns_an_error_and_the_parent_answers_anyway() {
    let effects = effects();
    // The child spends 600 tokens in its first round (a call), and would answer in its second.
    let child_model = script(json!([
        {"tool_calls": [{"id": "k1", "name": "charge", "arguments": {"amount": 1}}],
         "usage": {"input_tokens": 500, "output_tokens": 100}},
        {"text": "never said", "usage": {"input_tokens": 500, "output_tokens": 100}}
    ]));
    let child = Agent::builder(child_model.clone())
        .tool(Charge::new(effects.clone(), SideEffect::ReadOnly))
        .build()
        .unwrap();
    let parent_model = script(json!([
        delegate(&[("worker", "w1")]),
        {"text": "the worker ran out; here is my own answer"}
    ]));
    let parent = Agent::builder(parent_model)
        .tool(
            child
                .as_tool("worker", "Does work.")
                .unwrap()
                .max_tokens(500),
        )
        .build()
        .unwrap();
    let outcome = parent.prompt("go").await;
    assert!(outcome.success, "{:?}", outcome.error);
    assert_eq!(
        outcome.text.as_deref(),
        Some("the worker ran out; here is my own answer")
    );
    let call = &outcome.tool_calls[0];
    assert_eq!(call.status, CallStatus::Failed);
    assert!(
        call.content
            .contains("the agent `worker` did not finish: it went over its budget: it used 600 tokens, and its limit is 500"),
        "{}",
        call.content
    );
    // The child stopped after the round that passed its budget: no second model call.
    assert_eq!(child_model.used(), 1);
    assert_eq!(
        call.spent.as_ref().unwrap().usage.unwrap().total_tokens(),
        600
    );
    // The parent's first round (101 tokens) and the child's 600.
    assert_eq!(outcome.usage.unwrap().total_tokens(), 701);
}

#[tokio::test]
async fn a_parent_budget_bounds_its_children() {
    // A child with 1000 tokens may spend at most what its parent (a child with 100) has left.
    let (leafy, leaf_model) = leaf("leaf", 0);
    let middle_model = script(json!([
        delegate(&[("leaf", "l1")]),
        {"text": "middle done"}
    ]));
    let middle = Agent::builder(middle_model)
        .tool(leafy.as_tool("leaf", "Leaf.").unwrap().max_tokens(1000))
        .build()
        .unwrap();
    let root = Agent::builder(script(
        json!([delegate(&[("middle", "m1")]), {"text": "ok"}]),
    ))
    .tool(middle.as_tool("middle", "Middle.").unwrap().max_tokens(10))
    .build()
    .unwrap();
    let outcome = root.prompt("go").await;
    assert!(outcome.success);
    // The leaf ran (15 tokens), then went over the 10 its parent had: it is reported over
    // budget, and the middle agent, over too, stopped before its second round.
    assert_eq!(leaf_model.used(), 1);
    let content = &outcome.tool_calls[0].content;
    assert!(content.contains("over its budget"), "{content}");
}

#[tokio::test]
async fn an_agent_that_lists_itself_is_refused_when_made_a_tool() {
    let (a, _) = leaf("a", 0);
    let b = Agent::builder(script(json!([])))
        .tool(a.as_tool("helper", "Helps.").unwrap())
        .build()
        .unwrap();
    // `b` has a sub-agent named "helper": `b` as "helper" would call itself.
    let err = b.as_tool("helper", "Helps.").unwrap_err();
    assert_eq!(
        err,
        DelegationError::Recursive {
            name: "helper".into(),
            cycle: vec!["helper".into(), "helper".into()]
        }
    );
    assert_eq!(
        err.to_string(),
        "the agent `helper` lists itself as a sub-agent (helper → helper)"
    );
    // And through another: c has b (as "middle"), which has "helper".
    let c = Agent::builder(script(json!([])))
        .tool(b.as_tool("middle", "M.").unwrap())
        .build()
        .unwrap();
    let err = c.as_tool("helper", "H.").unwrap_err();
    assert!(
        err.to_string().contains("helper → middle → helper"),
        "{err}"
    );
    // Definitions by name (a configuration file) are checked before anything is built.
    let err = check_graph([
        ("planner", vec!["reviewer"]),
        ("reviewer", vec!["tester"]),
        ("tester", vec!["planner"]),
    ])
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("planner → reviewer → tester → planner"),
        "{err}"
    );
    assert!(check_graph([("planner", vec!["reviewer"]), ("reviewer", vec![])]).is_ok());
}

#[tokio::test]
async fn the_depth_cap_holds_at_run_time() {
    let (c, c_model) = leaf("deepest", 0);
    let b_model = script(json!([delegate(&[("c", "x3")]), {"text": "b answered itself"}]));
    let b = Agent::builder(b_model)
        .tool(c.as_tool("c", "C.").unwrap())
        .build()
        .unwrap();
    let a_model = script(json!([delegate(&[("b", "x2")]), {"text": "a done"}]));
    let a = Agent::builder(a_model)
        .tool(b.as_tool("b", "B.").unwrap())
        .build()
        .unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let root = {
        Agent::builder(script(
            json!([delegate(&[("a", "x1")]), {"text": "root done"}]),
        ))
        .tool(a.as_tool("a", "A.").unwrap())
        .delegation(Delegation {
            max_depth: 2,
            ..Delegation::default()
        })
        .on_event(move |e| seen.lock().unwrap().push(e.clone()))
        .build()
        .unwrap()
    };
    let outcome = root.prompt("go").await;
    assert!(outcome.success, "{:?}", outcome.error);
    assert_eq!(c_model.used(), 0, "the third level never ran");
    let events = events.lock().unwrap();
    let refused = events.iter().find_map(|e| match e {
        Event::Child { path, event, .. } if path == &["a".to_string(), "b".to_string()] => {
            match &**event {
                Event::RunFinished { outcome } => Some(outcome.tool_calls[0].content.clone()),
                _ => None,
            }
        }
        _ => None,
    });
    let refused = refused.expect("b's run finished");
    assert!(
        refused.contains(
            "the agent `c` was not run: delegation would go 3 levels deep, and the limit is 2"
        ),
        "{refused}"
    );
}

/// A parent with a journal that delegates to `payer`, a child with a side-effecting tool.
fn payer_tree(
    journal: Arc<MemoryJournal>,
    effects: &Effects,
    parent_script: serde_json::Value,
    child_script: serde_json::Value,
    approvals: Approvals,
) -> (Agent, ScriptedModel, ScriptedModel) {
    let child_model = script(child_script);
    let child = Agent::builder(child_model.clone())
        .tool(Charge::new(effects.clone(), SideEffect::SideEffecting))
        .approvals(approvals)
        .build()
        .unwrap();
    let parent_model = script(parent_script);
    let parent = Agent::builder(parent_model.clone())
        .tool(child.as_tool("payer", "Pays.").unwrap())
        .journal(journal)
        .build()
        .unwrap();
    (parent, parent_model, child_model)
}

fn kinds(records: &[Record]) -> Vec<&'static str> {
    records.iter().map(|r| r.kind()).collect()
}

#[tokio::test]
async fn a_child_is_logged_under_its_parent_and_resumes_from_its_own_log() {
    let journal = Arc::new(MemoryJournal::new());
    let effects = effects();
    let (parent, _, _) = payer_tree(
        journal.clone(),
        &effects,
        json!([delegate(&[("payer", "p1")]), {"text": "paid"}]),
        json!([
            {"tool_calls": [{"id": "k1", "name": "charge", "arguments": {"amount": 5}}]},
            {"text": "charged 5"}
        ]),
        Approvals::default(),
    );
    let outcome = parent.prompt("pay").await;
    assert!(outcome.success, "{:?}", outcome.error);
    let root_id = outcome.run_id.clone().unwrap();
    let child_id = format!("{root_id}/p1");
    assert_eq!(
        outcome.tool_calls[0]
            .spent
            .as_ref()
            .unwrap()
            .run_id
            .as_deref(),
        Some(child_id.as_str())
    );
    let child_log = journal.load(&child_id).await.unwrap();
    assert_eq!(kinds(&child_log).last(), Some(&"finished"));
    assert_eq!(count(&effects), 1);

    // A crash inside the child: after its charge's result was durable, before its answer; the
    // parent's call still in flight.
    let charged = child_log
        .iter()
        .position(|r| r.kind() == "tool_finished")
        .unwrap();
    journal.truncate(&child_id, charged + 1);
    let root_log = journal.load(&root_id).await.unwrap();
    // (The intent of an idempotent call is written with its result: the crash loses both.)
    let started = root_log
        .iter()
        .position(|r| r.kind() == "tool_finished")
        .unwrap();
    journal.truncate(&root_id, started);
    let (parent, parent_model, child_model) = payer_tree(
        journal.clone(),
        &effects,
        json!([{"text": "paid after the crash"}]),
        json!([{"text": "charged 5 (resumed)"}]),
        Approvals::default(),
    );
    let outcome = parent
        .resume(&root_id, CancellationToken::new())
        .await
        .unwrap();
    assert!(outcome.success, "{:?}", outcome.error);
    assert_eq!(outcome.text.as_deref(), Some("paid after the crash"));
    assert!(
        outcome.tool_calls[0]
            .content
            .contains("charged 5 (resumed)")
    );
    // Nothing repeated: one charge, one model call each for what was left.
    assert_eq!(count(&effects), 1);
    assert_eq!(child_model.used(), 1);
    assert_eq!(parent_model.used(), 1);

    // A crash after the child finished, before the parent logged its result: the child is not
    // run again, its outcome is read from its log.
    journal.truncate(&root_id, started);
    let (parent, parent_model, child_model) = payer_tree(
        journal.clone(),
        &effects,
        json!([{"text": "paid, second resume"}]),
        json!([]),
        Approvals::default(),
    );
    let outcome = parent
        .resume(&root_id, CancellationToken::new())
        .await
        .unwrap();
    assert!(outcome.success, "{:?}", outcome.error);
    assert!(
        outcome.tool_calls[0]
            .content
            .contains("charged 5 (resumed)")
    );
    assert_eq!(child_model.used(), 0);
    assert_eq!(parent_model.used(), 1);
    assert_eq!(count(&effects), 1);
}

#[tokio::test]
async fn a_childs_call_that_needs_approval_is_deferred_to_the_root_run_then_decided() {
    let journal = Arc::new(MemoryJournal::new());
    let effects = effects();
    let (parent, _, child_model) = payer_tree(
        journal.clone(),
        &effects,
        json!([delegate(&[("payer", "p1")]), {"text": "paid"}]),
        json!([
            {"tool_calls": [{"id": "k1", "name": "charge", "arguments": {"amount": 5}}]},
            {"text": "charged 5"}
        ]),
        Approvals::ask_all(),
    );
    let outcome = parent.prompt("pay").await;
    assert_eq!(
        outcome.stop_reason,
        StopReason::AwaitingApproval,
        "{:?}",
        outcome.error
    );
    let root_id = outcome.run_id.clone().unwrap();
    assert_eq!(outcome.pending_approvals.len(), 1);
    let pending = &outcome.pending_approvals[0];
    assert_eq!(pending.path, vec!["payer".to_string()]);
    assert_eq!(
        pending.run_id.as_deref(),
        Some(format!("{root_id}/p1").as_str())
    );
    assert_eq!(pending.call.id, "k1");
    assert!(outcome.error.unwrap().message.contains("charge in payer"));
    assert_eq!(count(&effects), 0);

    // Listed and decided through the root run.
    let listed = parent.pending_approvals(&root_id).await.unwrap();
    assert_eq!(listed, outcome.pending_approvals);
    let decided = parent
        .decide_approvals(&root_id, Some(&["k1".to_string()]), Some(Answer::Approve))
        .await
        .unwrap();
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0].path, vec!["payer".to_string()]);
    assert!(parent.pending_approvals(&root_id).await.unwrap().is_empty());

    let outcome = parent
        .resume(&root_id, CancellationToken::new())
        .await
        .unwrap();
    assert!(outcome.success, "{:?}", outcome.error);
    assert_eq!(outcome.text.as_deref(), Some("paid"));
    assert_eq!(count(&effects), 1);
    assert_eq!(
        child_model.used(),
        2,
        "the child's first call was not made again"
    );
}

#[tokio::test]
async fn a_childs_approvals_reach_the_roots_handler() {
    let journal = Arc::new(MemoryJournal::new());
    let effects = effects();
    let child = Agent::builder(script(json!([
        {"tool_calls": [{"id": "k1", "name": "charge", "arguments": {"amount": 5}}]},
        {"text": "charged 5"}
    ])))
    .tool(Charge::new(effects.clone(), SideEffect::SideEffecting))
    .approvals(Approvals::ask_all())
    .build()
    .unwrap();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = asked.clone();
    let parent = Agent::builder(script(
        json!([delegate(&[("payer", "p1")]), {"text": "paid"}]),
    ))
    .tool(child.as_tool("payer", "Pays.").unwrap())
    .journal(journal)
    .on_approval(move |p| {
        seen.lock().unwrap().push(p.call.id.clone());
        async { Answer::Approve }.boxed()
    })
    .build()
    .unwrap();
    let outcome = parent.prompt("pay").await;
    assert!(outcome.success, "{:?}", outcome.error);
    assert_eq!(*asked.lock().unwrap(), vec!["k1".to_string()]);
    assert_eq!(count(&effects), 1);
}
