//! Runs logged to a journal survive being cut off at any record and resumed.

use crate::common;
use common::{Charge, agent, script};

use async_trait::async_trait;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use toolloop::agent::{Agent, InFlightDecision};
use toolloop::journal::{Journal, JournalError, MemoryJournal, Record};
use toolloop::message::Message;
use toolloop::outcome::{CallStatus, ErrorCode, StopReason};
use toolloop::providers::scripted::ScriptedModel;
use toolloop::tool::SideEffect;

/// A model that answers from the script by round (the number of assistant turns so far), so
/// a resumed run gets the same answers as the original.
fn model_for_resume() -> ScriptedModel {
    ScriptedModel::new(script())
}

#[tokio::test]
async fn a_run_cut_at_every_record_resumes_with_each_effect_at_most_once() {
    // The full run, to learn its records.
    let full_journal = Arc::new(MemoryJournal::new());
    let effects = Arc::new(Mutex::new(HashMap::new()));
    let full = agent(
        model_for_resume(),
        full_journal.clone(),
        effects.clone(),
        SideEffect::SideEffecting,
    )
    .prompt("charge")
    .await;
    assert_eq!(full.stop_reason, StopReason::Answered);
    let run_id = full.run_id.clone().unwrap();
    let records = full_journal.load(&run_id).await.unwrap();
    assert!(matches!(records.last(), Some(Record::Finished)));
    assert!(records.len() > 8);

    for cut in 1..records.len() {
        // A journal holding only the first `cut` records: the process died right after writing
        // record `cut`. Effects of calls whose start was logged happened (the call ran).
        let journal = Arc::new(MemoryJournal::new());
        for r in &records[..cut] {
            journal.append(&run_id, r).await.unwrap();
        }
        let effects: Arc<Mutex<HashMap<String, u32>>> = Arc::new(Mutex::new(HashMap::new()));
        let mut in_flight = Vec::new();
        for r in &records[..cut] {
            match r {
                Record::ToolStarted { call_id, .. } => {
                    *effects
                        .lock()
                        .unwrap()
                        .entry(format!("{run_id}/{call_id}"))
                        .or_default() += 1;
                    in_flight.push(call_id.clone());
                }
                Record::ToolFinished { .. } => {
                    in_flight.pop();
                }
                _ => {}
            }
        }
        // The model replays from where the log says the run was.
        let responded = records[..cut]
            .iter()
            .filter(|r| matches!(r, Record::ModelResponded { .. }))
            .count();
        let model = ScriptedModel::new(script()[responded.min(3)..].to_vec());
        let resumed = agent(
            model,
            journal.clone(),
            effects.clone(),
            SideEffect::SideEffecting,
        )
        .resume(&run_id, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(
            resumed.stop_reason,
            StopReason::Answered,
            "cut {cut}: {:?}",
            resumed.error
        );
        assert_eq!(resumed.text.as_deref(), Some("charged three times"));
        let effects = effects.lock().unwrap();
        for (key, n) in effects.iter() {
            assert_eq!(*n, 1, "cut {cut}: {key} happened {n} times");
        }
        let unknown: Vec<&str> = resumed
            .tool_calls
            .iter()
            .filter(|c| c.status == CallStatus::Unknown)
            .map(|c| c.call.id.as_str())
            .collect();
        // every call either happened once (ok) or is reported unknown
        for id in ["a", "b", "c"] {
            let key = format!("{run_id}/{id}");
            assert!(
                effects.get(&key) == Some(&1) || unknown.contains(&id),
                "cut {cut}: call {id} neither happened nor reported unknown"
            );
        }
        assert_eq!(resumed.tool_calls.len(), 3, "cut {cut}");
        assert_eq!(resumed.run_id.as_deref(), Some(run_id.as_str()));
    }
}

#[tokio::test]
async fn idempotent_calls_in_flight_run_again_and_policies_can_retry_side_effects() {
    for (side_effect, policy_retry, expect) in [
        (SideEffect::Idempotent, false, CallStatus::Ok),
        (SideEffect::SideEffecting, false, CallStatus::Unknown),
        (SideEffect::SideEffecting, true, CallStatus::Ok),
    ] {
        let journal = Arc::new(MemoryJournal::new());
        let effects = Arc::new(Mutex::new(HashMap::new()));
        let out = agent(
            ScriptedModel::new(script()),
            journal.clone(),
            effects.clone(),
            side_effect,
        )
        .prompt("charge")
        .await;
        let run_id = out.run_id.unwrap();
        let records = journal.load(&run_id).await.unwrap();
        // Cut right after the first response, and add call `a`'s intent: the log of a crash
        // during the call, its intent durable (a side-effecting call's always is; a read-only
        // or idempotent call's is when it shares a batch with a side-effecting one).
        let cut = records
            .iter()
            .position(|r| matches!(r, Record::ModelResponded { .. }))
            .unwrap()
            + 1;
        journal.truncate(&run_id, cut);
        journal
            .append(
                &run_id,
                &Record::ToolStarted {
                    round: 1,
                    index: 0,
                    call_id: "a".into(),
                },
            )
            .await
            .unwrap();
        let mut builder = Agent::builder(ScriptedModel::new(script()[1..].to_vec())).tool(Charge {
            effects: effects.clone(),
            side_effect,
            schema: json!({"type": "object"}),
        });
        if policy_retry {
            builder = builder.on_in_flight(|_| InFlightDecision::Retry);
        }
        let resumed = builder
            .journal(journal.clone())
            .build()
            .unwrap()
            .resume(&run_id, CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(
            resumed.tool_calls[0].status, expect,
            "{side_effect:?} retry={policy_retry}"
        );
        assert_eq!(resumed.stop_reason, StopReason::Answered);
    }
}

#[tokio::test]
async fn a_finished_run_resumes_to_the_same_outcome_and_leases_exclude_a_second_holder() {
    let journal = Arc::new(MemoryJournal::new());
    let effects = Arc::new(Mutex::new(HashMap::new()));
    let a = agent(
        ScriptedModel::new(script()),
        journal.clone(),
        effects.clone(),
        SideEffect::SideEffecting,
    );
    let out = a.prompt("charge").await;
    let run_id = out.run_id.clone().unwrap();
    let again = a.resume(&run_id, CancellationToken::new()).await.unwrap();
    assert_eq!(again.messages, out.messages);
    assert_eq!(again.stop_reason, StopReason::Answered);
    assert_eq!(effects.lock().unwrap().values().sum::<u32>(), 3);

    journal.acquire(&run_id, "someone else").await.unwrap();
    let err = a
        .resume(&run_id, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, JournalError::Locked { .. }), "{err}");
    let err = a.resume("run_nope", CancellationToken::new()).await;
    assert!(err.is_err());
}

/// A journal that fails after some appends.
struct Flaky {
    inner: MemoryJournal,
    left: AtomicU32,
}

#[async_trait]
impl Journal for Flaky {
    async fn append(&self, run_id: &str, record: &Record) -> Result<(), JournalError> {
        if self.left.fetch_sub(1, Ordering::SeqCst) == 0 {
            return Err(JournalError::Store("disk full".into()));
        }
        self.inner.append(run_id, record).await
    }
    async fn load(&self, run_id: &str) -> Result<Vec<Record>, JournalError> {
        self.inner.load(run_id).await
    }
}

#[tokio::test]
async fn a_failing_run_log_stops_the_run_before_acting_and_keeps_the_transcript_valid() {
    let effects = Arc::new(Mutex::new(HashMap::new()));
    // started, model responded, then the first ToolStarted fails
    let journal = Arc::new(Flaky {
        inner: MemoryJournal::new(),
        left: AtomicU32::new(2),
    });
    let out = agent(
        ScriptedModel::new(script()),
        journal,
        effects.clone(),
        SideEffect::SideEffecting,
    )
    .prompt("charge")
    .await;
    assert_eq!(out.stop_reason, StopReason::StoreFailed);
    let error = out.error.unwrap();
    assert_eq!(error.code, ErrorCode::StoreFailed);
    assert!(error.message.contains("disk full"));
    assert!(
        effects.lock().unwrap().is_empty(),
        "no call ran without its intent logged"
    );
    let ids: Vec<_> = out
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool(r) => Some(r.call_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["a", "b"]);
}

/// A journal that refuses a write of results alone (the write made after a round's calls).
#[derive(Default)]
struct LosesResults {
    inner: MemoryJournal,
    writes_after_failure: AtomicU32,
    failed: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl Journal for LosesResults {
    async fn append(&self, run_id: &str, record: &Record) -> Result<(), JournalError> {
        self.append_all(run_id, std::slice::from_ref(record)).await
    }
    async fn append_all(&self, run_id: &str, records: &[Record]) -> Result<(), JournalError> {
        if self.failed.load(Ordering::SeqCst) {
            self.writes_after_failure.fetch_add(1, Ordering::SeqCst);
        }
        if records
            .iter()
            .all(|r| matches!(r, Record::ToolFinished { .. }))
        {
            self.failed.store(true, Ordering::SeqCst);
            return Err(JournalError::Store("disk full".into()));
        }
        self.inner.append_all(run_id, records).await
    }
    async fn load(&self, run_id: &str) -> Result<Vec<Record>, JournalError> {
        self.inner.load(run_id).await
    }
}

#[tokio::test]
async fn results_written_during_the_next_model_call_are_durable_before_its_response_is_taken() {
    let effects = Arc::new(Mutex::new(HashMap::new()));
    let journal = Arc::new(LosesResults::default());
    // Two calls, then the answer.
    let mut responses = script();
    responses.remove(1);
    let out = agent(
        ScriptedModel::new(responses),
        journal.clone(),
        effects.clone(),
        SideEffect::SideEffecting,
    )
    .prompt("charge")
    .await;
    // The first round's results were lost: the second round's response (the answer) is not
    // taken, and the run says why.
    assert_eq!(out.stop_reason, StopReason::StoreFailed);
    assert!(out.error.unwrap().message.contains("disk full"));
    let mut ran: Vec<String> = effects.lock().unwrap().keys().cloned().collect();
    ran.sort();
    let run_id = out.run_id.clone().unwrap();
    assert_eq!(ran, [format!("{run_id}/a"), format!("{run_id}/b")]);
    // Nothing was written after the lost write: the log has no gap.
    assert_eq!(journal.writes_after_failure.load(Ordering::SeqCst), 0);
    let kinds: Vec<_> = journal
        .load(&run_id)
        .await
        .unwrap()
        .iter()
        .map(Record::kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "started",
            "model_responded",
            "tool_started",
            "tool_finished",
            "tool_started"
        ]
    );
}

/// A journal that remembers which records were written together.
#[derive(Default)]
struct Grouping {
    inner: MemoryJournal,
    writes: Mutex<Vec<Vec<&'static str>>>,
}

#[async_trait]
impl Journal for Grouping {
    async fn append(&self, run_id: &str, record: &Record) -> Result<(), JournalError> {
        self.append_all(run_id, std::slice::from_ref(record)).await
    }
    async fn append_all(&self, run_id: &str, records: &[Record]) -> Result<(), JournalError> {
        self.writes
            .lock()
            .unwrap()
            .push(records.iter().map(Record::kind).collect());
        self.inner.append_all(run_id, records).await
    }
    async fn load(&self, run_id: &str) -> Result<Vec<Record>, JournalError> {
        self.inner.load(run_id).await
    }
}

#[tokio::test]
async fn a_step_is_written_at_once_and_only_before_it_acts() {
    // Sorted kinds of one write.
    let w = |kinds: &[&'static str]| {
        let mut w = kinds.to_vec();
        w.sort();
        w
    };
    // Idempotent calls: the start; one write per round, its response and results together
    // (nothing need be durable before such calls run: they run again on resume; the request
    // and the intents, implied by the response and the results, are left out); the last
    // response with the end. No write before a model call.
    let idempotent = vec![
        w(&["started"]),
        w(&["model_responded", "tool_finished", "tool_finished"]),
        w(&["model_responded", "tool_finished"]),
        w(&["finished", "model_responded"]),
    ];
    // Side-effecting calls (one at a time): each intent is durable before its call runs, with
    // what came before it; the last result goes on its own while the next model call is made.
    let side_effecting = vec![
        w(&["started"]),
        w(&["model_responded", "tool_started"]),
        w(&["tool_finished", "tool_started"]),
        w(&["tool_finished"]),
        w(&["model_responded", "tool_started"]),
        w(&["tool_finished"]),
        w(&["finished", "model_responded"]),
    ];
    for (side_effect, expected) in [
        (SideEffect::Idempotent, idempotent),
        (SideEffect::SideEffecting, side_effecting),
    ] {
        let journal = Arc::new(Grouping::default());
        let effects = Arc::new(Mutex::new(HashMap::new()));
        let out = agent(
            model_for_resume(),
            journal.clone(),
            effects.clone(),
            side_effect,
        )
        .prompt("charge")
        .await;
        assert_eq!(out.stop_reason, StopReason::Answered);
        let writes: Vec<_> = journal
            .writes
            .lock()
            .unwrap()
            .iter()
            .map(|k| w(k))
            .collect();
        assert_eq!(writes, expected, "{side_effect:?}");
        // The log replays to the same outcome, with no effect twice.
        let again = agent(
            model_for_resume(),
            journal.clone(),
            effects.clone(),
            side_effect,
        )
        .resume(out.run_id.as_deref().unwrap(), CancellationToken::new())
        .await
        .unwrap();
        assert_eq!(again.messages, out.messages);
        assert_eq!(effects.lock().unwrap().values().sum::<u32>(), 3);
    }
}

#[tokio::test]
async fn a_log_with_every_request_and_intent_written_replays_alike() {
    // Logs written before requests and intents were left out of the writes that answer them
    // hold them all; they replay to the same outcome.
    let journal = Arc::new(MemoryJournal::new());
    let effects = Arc::new(Mutex::new(HashMap::new()));
    let out = agent(
        model_for_resume(),
        journal.clone(),
        effects.clone(),
        SideEffect::Idempotent,
    )
    .prompt("charge")
    .await;
    let run_id = out.run_id.clone().unwrap();
    let records = journal.load(&run_id).await.unwrap();
    assert!(!records.iter().any(|r| matches!(
        r,
        Record::ModelRequested { .. } | Record::ToolStarted { .. }
    )));
    let full = Arc::new(MemoryJournal::new());
    for r in &records {
        match r {
            Record::ModelResponded { round, .. } => {
                full.append(&run_id, &Record::ModelRequested { round: *round })
                    .await
                    .unwrap();
            }
            Record::ToolFinished { round, index, .. } => {
                let call_id = ["a", "b", "c"][*index + usize::from(*round == 2) * 2].to_string();
                full.append(
                    &run_id,
                    &Record::ToolStarted {
                        round: *round,
                        index: *index,
                        call_id,
                    },
                )
                .await
                .unwrap();
            }
            _ => {}
        }
        full.append(&run_id, r).await.unwrap();
    }
    assert_eq!(full.load(&run_id).await.unwrap().len(), records.len() + 6);
    let again = agent(
        model_for_resume(),
        full,
        effects.clone(),
        SideEffect::Idempotent,
    )
    .resume(&run_id, CancellationToken::new())
    .await
    .unwrap();
    assert_eq!(again.messages, out.messages);
    assert_eq!(again.stop_reason, StopReason::Answered);
    assert_eq!(effects.lock().unwrap().values().sum::<u32>(), 3);
}

/// A model that answers by round (the assistant turns so far) and records the reminders of
/// every request.
struct ByRound {
    reminders: Arc<Mutex<Vec<Vec<String>>>>,
}

#[async_trait]
impl toolloop::model::Model for ByRound {
    fn name(&self) -> &str {
        "by-round"
    }
    async fn complete(
        &self,
        request: &toolloop::model::ModelRequest<'_>,
    ) -> Result<toolloop::model::ModelResponse, toolloop::model::ModelError> {
        use toolloop::model::ModelResponse;
        self.reminders
            .lock()
            .unwrap()
            .push(request.reminders.to_vec());
        let turns = request
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .count();
        Ok(match turns {
            0 | 1 => ModelResponse::tool_calls(vec![toolloop::message::ToolCall::new(
                "note",
                json!({ "n": turns }),
            )]),
            _ => ModelResponse::text("done"),
        })
    }
}

#[tokio::test]
async fn hooks_that_answer_differently_the_second_time_do_not_break_a_resume() {
    use toolloop::tool::{ToolError, ToolOutput, tool_fn};
    let reminders_seen = Arc::new(Mutex::new(Vec::new()));
    let reminder_calls = Arc::new(AtomicU32::new(0));
    let stop_calls = Arc::new(AtomicU32::new(0));
    let journal = Arc::new(MemoryJournal::new());
    let (r, s) = (reminder_calls.clone(), stop_calls.clone());
    let agent = Agent::builder(ByRound {
        reminders: reminders_seen.clone(),
    })
    .tool(tool_fn(
        "note",
        "Takes a note.",
        |_: serde_json::Value, _: toolloop::tool::ToolContext| async {
            Ok::<_, ToolError>(ToolOutput::text("noted"))
        },
    ))
    .journal(journal.clone())
    // A different reminder every time it is asked.
    .reminders(move |_| vec![format!("reminder {}", r.fetch_add(1, Ordering::SeqCst) + 1)])
    // No signal the first two times, a signal every time after.
    .stop_when(move |_| (s.fetch_add(1, Ordering::SeqCst) >= 2).then(|| "late".to_string()))
    .build()
    .unwrap();
    let full = agent.prompt("go").await;
    assert_eq!(full.stop_reason, StopReason::Answered);
    assert_eq!(full.rounds, 3);
    assert_eq!(stop_calls.load(Ordering::SeqCst), 2);
    assert_eq!(reminder_calls.load(Ordering::SeqCst), 3);
    let run_id = full.run_id.clone().unwrap();
    let records = journal.load(&run_id).await.unwrap();

    // Cut right before the third model call's response: the process died during the call
    // (its request is not in the log: it was to be written with the response).
    let cut = records
        .iter()
        .rposition(|r| matches!(r, Record::ModelResponded { round: 3, .. }))
        .unwrap();
    journal.truncate(&run_id, cut);
    let resumed = agent
        .resume(&run_id, CancellationToken::new())
        .await
        .expect("the log replays without calling the hooks again");
    assert_eq!(resumed.stop_reason, StopReason::Answered);
    assert_eq!(resumed.text.as_deref(), Some("done"));
    assert_eq!(resumed.messages, full.messages);
    // Replaying asked no hook; the repeated model call carried the recorded reminders.
    assert_eq!(stop_calls.load(Ordering::SeqCst), 2);
    assert_eq!(reminder_calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        reminders_seen.lock().unwrap().last().unwrap(),
        &vec!["reminder 3".to_string()]
    );

    // Cut anywhere: the log always replays (a hook asked again at resume may end the run).
    for cut in 1..records.len() {
        let journal = Arc::new(MemoryJournal::new());
        for r in &records[..cut] {
            journal.append(&run_id, r).await.unwrap();
        }
        let agent = Agent::builder(ByRound {
            reminders: Arc::new(Mutex::new(Vec::new())),
        })
        .tool(tool_fn(
            "note",
            "Takes a note.",
            |_: serde_json::Value, _: toolloop::tool::ToolContext| async {
                Ok::<_, ToolError>(ToolOutput::text("noted"))
            },
        ))
        .journal(journal)
        .reminders(|_| vec!["other".into()])
        .stop_when(|_| Some("other".into()))
        .build()
        .unwrap();
        let out = agent
            .resume(&run_id, CancellationToken::new())
            .await
            .unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        assert!(out.success, "cut at {cut}: {:?}", out.stop_reason);
    }
}

#[tokio::test]
async fn a_record_that_does_not_fit_the_run_is_refused() {
    use toolloop::config::LoopConfig;
    use toolloop::engine::{HookFlags, Machine, ReplayError};
    use toolloop::model::ModelResponse;
    use toolloop::toolbox::Toolbox;
    let call = toolloop::message::ToolCall::new("charge", json!({"amount": 1}));
    let mut toolbox = Toolbox::new();
    toolbox
        .add(Charge::new(
            Arc::new(Mutex::new(HashMap::new())),
            SideEffect::SideEffecting,
        ))
        .unwrap();
    let records = vec![
        Record::Started {
            messages: vec![Message::user("go")],
            output_schema: None,
        },
        Record::ModelRequested { round: 1 },
        Record::ModelResponded {
            round: 1,
            response: ModelResponse::tool_calls(vec![call]),
            cost: None,
            subjects: Vec::new(),
        },
        // The round has one call: there is no call 3.
        Record::ToolFinished {
            round: 1,
            index: 3,
            result: Ok(toolloop::tool::ToolOutput::text("x")),
            duration_ms: 1,
            attempts: 1,
        },
    ];
    let replayed = Machine::replay(
        Arc::new(LoopConfig::default()),
        HookFlags::default(),
        toolbox.catalog().clone(),
        records,
    );
    let err = replayed.expect_err("the record is refused");
    let text = err.to_string();
    assert!(
        text.contains("record 3") && text.contains("call 3"),
        "{text}"
    );
    assert!(
        matches!(&err, ReplayError::Unfit { record: 3, source } if source.input == "tool_finished"),
        "{err:?}"
    );
}

/// A journal whose commits of intents take 100 ms, and which notes when they are durable.
struct SlowIntents {
    inner: MemoryJournal,
    order: Arc<Mutex<Vec<&'static str>>>,
}

#[async_trait]
impl Journal for SlowIntents {
    async fn append(&self, run_id: &str, record: &Record) -> Result<(), JournalError> {
        self.append_all(run_id, std::slice::from_ref(record)).await
    }
    async fn append_all(&self, run_id: &str, records: &[Record]) -> Result<(), JournalError> {
        let intents = records.iter().any(|r| r.kind() == "tool_started");
        if intents {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        self.inner.append_all(run_id, records).await?;
        if intents {
            self.order.lock().unwrap().push("intents durable");
        }
        Ok(())
    }
    async fn load(&self, run_id: &str) -> Result<Vec<Record>, JournalError> {
        self.inner.load(run_id).await
    }
}

/// A tool that notes when it runs.
struct Probe {
    side_effect: SideEffect,
    order: Arc<Mutex<Vec<&'static str>>>,
    schema: serde_json::Value,
}

#[async_trait]
impl toolloop::tool::Tool for Probe {
    fn name(&self) -> &str {
        "charge"
    }
    fn description(&self) -> &str {
        "Notes that it ran."
    }
    fn parameters(&self) -> &serde_json::Value {
        &self.schema
    }
    fn side_effect(&self) -> SideEffect {
        self.side_effect
    }
    async fn call(
        &self,
        _args: serde_json::Value,
        _ctx: toolloop::tool::ToolContext,
    ) -> Result<toolloop::tool::ToolOutput, toolloop::tool::ToolError> {
        self.order.lock().unwrap().push("ran");
        Ok(toolloop::tool::ToolOutput::text("ok"))
    }
}

#[tokio::test]
async fn only_side_effecting_calls_wait_for_their_intents_to_be_durable() {
    for (side_effect, first) in [
        (SideEffect::SideEffecting, "intents durable"),
        (SideEffect::ReadOnly, "ran"),
        (SideEffect::Idempotent, "ran"),
    ] {
        let order = Arc::new(Mutex::new(Vec::new()));
        let journal = Arc::new(SlowIntents {
            inner: MemoryJournal::new(),
            order: order.clone(),
        });
        let agent = Agent::builder(model_for_resume())
            .tool(Probe {
                side_effect,
                order: order.clone(),
                schema: json!({"type": "object"}),
            })
            .journal(journal.clone())
            .build()
            .unwrap();
        let out = agent.prompt("charge").await;
        assert_eq!(out.stop_reason, StopReason::Answered, "{side_effect:?}");
        assert_eq!(order.lock().unwrap()[0], first, "{side_effect:?}");
        // A side-effecting call's intent is in the log before its result; a read-only or
        // idempotent call's, written with its result, is implied by it and left out. The log
        // replays either way.
        let kinds: Vec<&str> = journal
            .load(out.run_id.as_deref().unwrap())
            .await
            .unwrap()
            .iter()
            .map(Record::kind)
            .collect();
        let intents = kinds.iter().filter(|k| **k == "tool_started").count();
        let results = kinds.iter().filter(|k| **k == "tool_finished").count();
        assert_eq!(results, 3, "{side_effect:?}");
        if side_effect == SideEffect::SideEffecting {
            assert_eq!(intents, 3);
            let first_result = kinds.iter().position(|k| *k == "tool_finished").unwrap();
            assert!(kinds[..first_result].contains(&"tool_started"));
        } else {
            assert_eq!(intents, 0, "{side_effect:?}");
        }
        let again = agent
            .resume(out.run_id.as_deref().unwrap(), CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(again.messages, out.messages, "{side_effect:?}");
    }
}

/// A journal that remembers how each run was taken.
#[derive(Default)]
struct Taking {
    inner: MemoryJournal,
    taken: Mutex<Vec<(String, &'static str)>>,
}

#[async_trait]
impl Journal for Taking {
    async fn append(&self, run_id: &str, record: &Record) -> Result<(), JournalError> {
        self.inner.append(run_id, record).await
    }
    async fn load(&self, run_id: &str) -> Result<Vec<Record>, JournalError> {
        self.inner.load(run_id).await
    }
    async fn acquire(&self, run_id: &str, _holder: &str) -> Result<(), JournalError> {
        self.taken
            .lock()
            .unwrap()
            .push((run_id.into(), "looked up"));
        Ok(())
    }
    async fn acquire_new(&self, run_id: &str, _holder: &str) -> Result<(), JournalError> {
        self.taken.lock().unwrap().push((run_id.into(), "new"));
        Ok(())
    }
}

#[tokio::test]
async fn a_run_takes_an_id_it_made_as_new_and_looks_up_an_id_it_was_given() {
    let journal = Arc::new(Taking::default());
    let effects = Arc::new(Mutex::new(HashMap::new()));
    let a = agent(
        ScriptedModel::new([script(), script()].concat()),
        journal.clone(),
        effects,
        SideEffect::SideEffecting,
    );
    let made = a.prompt("go").await;
    let made = made.run_id.expect("a logged run has an id");
    let given = a
        .run_with_id(
            "run-given",
            vec![Message::user("go")],
            CancellationToken::new(),
        )
        .await;
    assert_eq!(given.run_id.as_deref(), Some("run-given"));
    assert_eq!(
        *journal.taken.lock().unwrap(),
        [(made, "new"), ("run-given".to_string(), "looked up")]
    );
}
