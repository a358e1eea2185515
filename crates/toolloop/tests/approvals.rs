//! Approvals: asked as a step of the loop, logged, bound to the exact call, deferred and
//! resumed; a denial is the call's result.

use crate::common;
use common::{Charge, Effects, script};

use futures::FutureExt;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use toolloop::agent::{Agent, AgentBuilder};
use toolloop::approval::{Action, Answer, Approvals, DecidedBy, Decision, PendingApproval, Rule};
use toolloop::event::Event;
use toolloop::journal::{Journal, MemoryJournal, Record};
use toolloop::message::ToolCall;
use toolloop::model::ModelResponse;
use toolloop::outcome::{CallStatus, ErrorCode, StopReason};
use toolloop::providers::scripted::ScriptedModel;
use toolloop::tool::SideEffect;

fn effects() -> Effects {
    Arc::new(Mutex::new(Default::default()))
}

fn count(effects: &Effects) -> u32 {
    effects.lock().unwrap().values().sum()
}

fn builder(model: ScriptedModel, journal: Arc<dyn Journal>, effects: Effects) -> AgentBuilder {
    Agent::builder(model)
        .tool(Charge::new(effects, SideEffect::SideEffecting))
        .journal(journal)
        .approvals(Approvals::ask_all())
}

fn charge(id: &str, amount: u32) -> ToolCall {
    let mut c = ToolCall::new("charge", json!({"amount": amount}));
    c.id = id.into();
    c
}

/// A handler that records what it was asked and answers with `answer`.
fn handler(
    asked: Arc<Mutex<Vec<PendingApproval>>>,
    answer: impl Fn(&PendingApproval) -> Answer + Send + Sync + 'static,
) -> impl Fn(&PendingApproval) -> futures::future::BoxFuture<'static, Answer> + Send + Sync + 'static
{
    move |p| {
        asked.lock().unwrap().push(p.clone());
        let a = answer(p);
        async move { a }.boxed()
    }
}

#[tokio::test]
async fn an_approval_does_not_carry_over_to_changed_arguments() {
    // The model calls charge(1), then charge(2) with the same id shape: each is asked about,
    // and a person who approves only amount 1 sees amount 2 denied.
    let model = ScriptedModel::new(vec![
        ModelResponse::tool_calls(vec![charge("a", 1)]),
        ModelResponse::tool_calls(vec![charge("b", 2)]),
        ModelResponse::text("done"),
    ]);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let fx = effects();
    let out = builder(model, Arc::new(MemoryJournal::new()), fx.clone())
        .on_approval(handler(asked.clone(), |p| {
            if p.call.arguments["amount"] == 1 {
                Answer::Approve
            } else {
                Answer::Deny { reason: None }
            }
        }))
        .build()
        .unwrap()
        .prompt("charge")
        .await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(asked.lock().unwrap().len(), 2, "each call is asked about");
    assert_eq!(count(&fx), 1);
    assert_eq!(out.tool_calls[1].status, CallStatus::Denied);

    // A recorded approval for other arguments is not applied on resume: the call waits again.
    let journal = Arc::new(MemoryJournal::new());
    let fx = effects();
    let model = ScriptedModel::new(vec![ModelResponse::tool_calls(vec![charge("a", 5)])]);
    let out = builder(model, journal.clone(), fx.clone())
        .build()
        .unwrap()
        .prompt("charge")
        .await;
    assert_eq!(out.stop_reason, StopReason::AwaitingApproval);
    let run_id = out.run_id.clone().unwrap();
    let forged = Decision::new(&charge("a", 6), true, None, DecidedBy::Person);
    journal
        .append(
            &run_id,
            &Record::ApprovalDecided {
                round: 1,
                index: 0,
                decision: forged,
            },
        )
        .await
        .unwrap();
    let agent = builder(ScriptedModel::new(vec![]), journal.clone(), fx.clone())
        .build()
        .unwrap();
    let again = agent
        .resume(&run_id, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(again.stop_reason, StopReason::AwaitingApproval);
    assert_eq!(again.pending_approvals.len(), 1);
    assert_eq!(
        count(&fx),
        0,
        "nothing ran on an approval of other arguments"
    );
}

#[tokio::test]
async fn a_denied_call_is_answered_and_the_run_goes_on() {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let fx = effects();
    let out = builder(
        ScriptedModel::new(script()),
        Arc::new(MemoryJournal::new()),
        fx.clone(),
    )
    .on_approval(handler(asked.clone(), |p| {
        if p.call.id == "b" {
            Answer::Deny {
                reason: Some("too much".into()),
            }
        } else {
            Answer::Approve
        }
    }))
    .on_event(move |e| seen.lock().unwrap().push(e.clone()))
    .build()
    .unwrap()
    .prompt("charge")
    .await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(out.tool_calls.len(), 3, "every call has one result");
    let b = &out.tool_calls[1];
    assert_eq!(b.status, CallStatus::Denied);
    assert!(b.content.contains("denied: too much"), "{}", b.content);
    assert_eq!(count(&fx), 2);
    let events = events.lock().unwrap();
    let requested = events
        .iter()
        .filter(|e| matches!(e, Event::ApprovalRequested { .. }))
        .count();
    let decided: Vec<bool> = events
        .iter()
        .filter_map(|e| match e {
            Event::ApprovalDecided { approved, .. } => Some(*approved),
            _ => None,
        })
        .collect();
    assert_eq!(requested, 3);
    assert_eq!(decided, [true, false, true]);
}

#[tokio::test]
async fn rules_allow_and_deny_without_asking() {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let fx = effects();
    let policy = Approvals::default()
        .rule(Rule::parse(Action::Allow, "charge").unwrap())
        .rule(Rule::parse(Action::Deny, r#"charge:*"amount":2*"#).unwrap());
    let out = Agent::builder(ScriptedModel::new(script()))
        .tool(Charge::new(fx.clone(), SideEffect::SideEffecting))
        .approvals(policy)
        .on_approval(handler(asked.clone(), |_| Answer::Approve))
        .build()
        .unwrap()
        .prompt("charge")
        .await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert!(asked.lock().unwrap().is_empty());
    assert_eq!(out.tool_calls[1].status, CallStatus::Denied);
    assert!(out.tool_calls[1].content.contains("deny charge:"));
    assert_eq!(count(&fx), 2);
}

#[tokio::test]
async fn deferred_approvals_are_decided_and_resumed_by_another_agent() {
    let journal = Arc::new(MemoryJournal::new());
    let fx = effects();
    let out = builder(ScriptedModel::new(script()), journal.clone(), fx.clone())
        .build()
        .unwrap()
        .prompt("charge")
        .await;
    assert_eq!(out.stop_reason, StopReason::AwaitingApproval);
    assert_eq!(
        out.error.as_ref().unwrap().code,
        ErrorCode::AwaitingApproval
    );
    let ids: Vec<&str> = out
        .pending_approvals
        .iter()
        .map(|p| p.call.id.as_str())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(count(&fx), 0, "an unapproved call never runs");
    let run_id = out.run_id.unwrap();

    // "Another process": a fresh agent over the same log.
    let later = |responses: Vec<ModelResponse>| {
        builder(ScriptedModel::new(responses), journal.clone(), fx.clone())
            .build()
            .unwrap()
    };
    let agent = later(vec![]);
    assert_eq!(agent.pending_approvals(&run_id).await.unwrap().len(), 2);
    let err = agent
        .decide_approvals(&run_id, Some(&["zz".to_string()]), Some(Answer::Approve))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("waiting: a, b"), "{err}");
    agent
        .decide_approvals(&run_id, Some(&["a".to_string()]), Some(Answer::Approve))
        .await
        .unwrap();
    agent
        .decide_approvals(
            &run_id,
            Some(&["b".to_string()]),
            Some(Answer::Deny {
                reason: Some("no".into()),
            }),
        )
        .await
        .unwrap();
    // Resumed with no handler: round 1 runs, round 2's call waits again.
    let agent = later(script()[1..].to_vec());
    let out = agent
        .resume(&run_id, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stop_reason, StopReason::AwaitingApproval);
    assert_eq!(count(&fx), 1);
    assert_eq!(out.pending_approvals[0].call.id, "c");
    agent
        .decide_approvals(&run_id, None, Some(Answer::Approve))
        .await
        .unwrap();
    let agent = later(script()[2..].to_vec());
    let out = agent
        .resume(&run_id, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stop_reason, StopReason::Answered, "{:?}", out.error);
    assert_eq!(count(&fx), 2);
    let statuses: Vec<CallStatus> = out.tool_calls.iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [CallStatus::Ok, CallStatus::Denied, CallStatus::Ok]
    );
    let records = journal.load(&run_id).await.unwrap();
    assert!(matches!(records.last(), Some(Record::Finished)));
}

#[tokio::test]
async fn a_run_killed_while_asking_asks_again_on_resume_and_runs_nothing_unapproved() {
    let journal = Arc::new(MemoryJournal::new());
    let fx = effects();
    let asked = Arc::new(AtomicU32::new(0));
    let n = asked.clone();
    // The handler never answers: the run is dropped (the process dies) while it waits.
    let agent = builder(ScriptedModel::new(script()), journal.clone(), fx.clone())
        .on_approval(move |_| {
            n.fetch_add(1, Ordering::SeqCst);
            futures::future::pending().boxed()
        })
        .build()
        .unwrap();
    let run = tokio::spawn(async move { agent.prompt("charge").await });
    while asked.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    run.abort();
    let _ = run.await;
    let run_id = journal.run_ids().pop().unwrap();
    let records = journal.load(&run_id).await.unwrap();
    assert!(
        records
            .iter()
            .any(|r| matches!(r, Record::ModelResponded { .. })),
        "the round is durable before a person is asked"
    );
    assert_eq!(count(&fx), 0);
    // The dead process's hold on the run goes with it: a fresh journal with its records.
    let journal = Arc::new(MemoryJournal::new());
    for r in &records {
        journal.append(&run_id, r).await.unwrap();
    }

    // Resumed: the same calls are asked about again; only the approved one runs.
    let asked = Arc::new(Mutex::new(Vec::new()));
    let out = builder(
        ScriptedModel::new(script()[1..].to_vec()),
        journal.clone(),
        fx.clone(),
    )
    .on_approval(handler(asked.clone(), |p| {
        if p.call.id == "a" {
            Answer::Approve
        } else {
            Answer::Deny { reason: None }
        }
    }))
    .build()
    .unwrap()
    .resume(&run_id, CancellationToken::new())
    .await
    .unwrap();
    assert_eq!(out.stop_reason, StopReason::Answered);
    let asked: Vec<String> = asked
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.call.id.clone())
        .collect();
    assert_eq!(asked, ["a", "b", "c"]);
    assert_eq!(count(&fx), 1);
    assert_eq!(fx.lock().unwrap().get(&format!("{run_id}/a")), Some(&1));
}

/// A tool whose approval subject is its command line, and whose calls are asked about by
/// default; it counts the times its subject is asked for.
struct Shell {
    schema: serde_json::Value,
    subjects: Arc<AtomicU32>,
}

#[async_trait::async_trait]
impl toolloop::tool::Tool for Shell {
    fn name(&self) -> &str {
        "shell"
    }
    fn description(&self) -> &str {
        "Runs a command."
    }
    fn parameters(&self) -> &serde_json::Value {
        &self.schema
    }
    fn approval_subject(&self, args: &serde_json::Value) -> toolloop::approval::Subject {
        self.subjects.fetch_add(1, Ordering::SeqCst);
        args["command"].as_str().unwrap_or_default().into()
    }
    fn default_approval(&self) -> Action {
        Action::Ask
    }
    async fn call(
        &self,
        args: serde_json::Value,
        _ctx: toolloop::tool::ToolContext,
    ) -> Result<toolloop::tool::ToolOutput, toolloop::tool::ToolError> {
        Ok(toolloop::tool::ToolOutput::text(format!(
            "ran {}",
            args["command"]
        )))
    }
}

#[tokio::test]
async fn the_driver_takes_approval_subjects_from_the_tool_and_logs_them_with_the_response() {
    let shell = |id: &str, command: &str| {
        let mut c = ToolCall::new("shell", json!({ "command": command }));
        c.id = id.into();
        c
    };
    let model = ScriptedModel::new(vec![
        ModelResponse::tool_calls(vec![
            shell("g", "git status"),
            shell("r", "rm -rf /"),
            shell("l", "ls"),
        ]),
        ModelResponse::text("done"),
    ]);
    let subjects = Arc::new(AtomicU32::new(0));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let journal = Arc::new(MemoryJournal::new());
    let agent = Agent::builder(model)
        .tool(Shell {
            schema: json!({"type": "object", "properties": {"command": {"type": "string"}}}),
            subjects: subjects.clone(),
        })
        .approvals(
            Approvals::default()
                .rule(Rule::parse(Action::Allow, "shell:git *").unwrap())
                .rule(Rule::parse(Action::Deny, "shell:rm *").unwrap()),
        )
        .on_approval(handler(asked.clone(), |_| Answer::Approve))
        .journal(journal.clone())
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered, "{:?}", out.error);
    // The rules judged the command lines: `git` ran unasked, `rm` was denied, `ls` was asked.
    let statuses: Vec<CallStatus> = out.tool_calls.iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [CallStatus::Ok, CallStatus::Denied, CallStatus::Ok]
    );
    let asked: Vec<String> = asked
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.subject.clone())
        .collect();
    assert_eq!(asked, ["ls"]);
    // Each subject was taken by the driver, and logged with the response; the two calls that
    // ran were asked again just before (the subject they were weighed by still held).
    assert_eq!(subjects.load(Ordering::SeqCst), 3 + 2);
    let records = journal.load(out.run_id.as_deref().unwrap()).await.unwrap();
    let logged = records.iter().find_map(|r| match r {
        Record::ModelResponded { subjects, .. } if !subjects.is_empty() => Some(subjects.clone()),
        _ => None,
    });
    assert_eq!(
        logged.unwrap(),
        ["git status", "rm -rf /", "ls"].map(|s| Some(toolloop::approval::Subject::new(s)))
    );
    // A replay of the log asks no tool for a subject.
    let replayed = toolloop::engine::Machine::replay(
        Arc::new(agent.config().clone()),
        agent.hooks().into(),
        agent.toolbox().catalog().clone(),
        records,
    )
    .unwrap();
    assert_eq!(replayed.messages(), &out.messages[..]);
    assert_eq!(subjects.load(Ordering::SeqCst), 3 + 2);
}

/// A tool whose approval subject is a place that `move` (another tool) changes, as a link
/// would: what `open` touches is read from the shared place.
struct Place(Arc<Mutex<String>>);

#[async_trait::async_trait]
impl toolloop::tool::Tool for Place {
    fn name(&self) -> &str {
        "open"
    }
    fn description(&self) -> &str {
        "Opens what the place points at."
    }
    fn parameters(&self) -> &serde_json::Value {
        static SCHEMA: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
        SCHEMA.get_or_init(|| json!({"type": "object"}))
    }
    fn approval_subject(&self, _args: &serde_json::Value) -> toolloop::approval::Subject {
        self.0.lock().unwrap().clone().into()
    }
    fn default_approval(&self) -> Action {
        Action::Ask
    }
    async fn call(
        &self,
        _args: serde_json::Value,
        _ctx: toolloop::tool::ToolContext,
    ) -> Result<toolloop::tool::ToolOutput, toolloop::tool::ToolError> {
        Ok(format!("opened {}", self.0.lock().unwrap()).into())
    }
}

#[tokio::test]
async fn a_call_whose_subject_changed_after_it_was_weighed_does_not_run() {
    let place = Arc::new(Mutex::new("notes.txt".to_string()));
    let moved = place.clone();
    let mover = toolloop::tool::tool_fn(
        "move",
        "Points the place elsewhere.",
        move |_: serde_json::Value, _ctx| {
            let moved = moved.clone();
            async move {
                *moved.lock().unwrap() = "secret.env".to_string();
                Ok::<_, toolloop::tool::ToolError>("moved")
            }
        },
    );
    let call = |id: &str, name: &str| {
        let mut c = ToolCall::new(name, json!({ "id": id }));
        c.id = id.into();
        c
    };
    let model = ScriptedModel::new(vec![
        ModelResponse::tool_calls(vec![call("a", "move"), call("b", "open")]),
        ModelResponse::tool_calls(vec![call("c", "open")]),
        ModelResponse::text("done"),
    ]);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let journal = Arc::new(MemoryJournal::new());
    let agent = Agent::builder(model)
        .tool(mover)
        .tool(Place(place.clone()))
        .on_approval(handler(asked.clone(), |_| Answer::Approve))
        .journal(journal.clone())
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered, "{:?}", out.error);
    let subjects: Vec<String> = asked
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.subject.clone())
        .collect();
    assert_eq!(
        subjects,
        ["notes.txt", "secret.env"],
        "approved as notes.txt"
    );
    let results: Vec<String> = out.tool_calls.iter().map(|c| c.content.clone()).collect();
    assert!(
        results[1].contains("not run: what this call touches changed")
            && results[1].contains("`notes.txt` is now `secret.env`"),
        "{results:?}"
    );
    assert!(
        results[2].contains("opened secret.env"),
        "asked anew: {results:?}"
    );
    // The call not run is logged with its result: a replay, which asks no tool, rebuilds the
    // same transcript (the place points back at notes.txt by then).
    *place.lock().unwrap() = "notes.txt".to_string();
    let records = journal.load(out.run_id.as_deref().unwrap()).await.unwrap();
    let not_run = records.iter().any(|r| {
        matches!(r, Record::ToolFinished { round: 1, index: 1, result: Err(e), attempts: 0, .. }
            if e.message.contains("`notes.txt` is now `secret.env`"))
    });
    assert!(not_run, "{records:?}");
    let replayed = toolloop::engine::Machine::replay(
        Arc::new(agent.config().clone()),
        agent.hooks().into(),
        agent.toolbox().catalog().clone(),
        records,
    )
    .unwrap();
    assert_eq!(replayed.messages(), &out.messages[..]);
}
