//! The context policy in the machine, with no I/O: whatever it does, the conversation it sends
//! keeps every call with exactly one result, in order; a replay of the run's log rebuilds the
//! same view without asking for a summary again; a log cut inside a compaction asks for it
//! once; spilled results are read back whole with `read_result`; a refusal for size is
//! compacted and retried once, then the run stops with `context_exhausted`.

use std::sync::Arc;

use proptest::prelude::*;
use toolloop::config::LoopConfig;
use toolloop::context::{ContextOverflow, ContextPolicy};
use toolloop::engine::ContextState;
use toolloop::engine::{Compaction, HookFlags, Input, Machine, Step};
use toolloop::message::{Message, Messages, ToolCall};
use toolloop::model::ModelResponse;
use toolloop::outcome::StopReason;
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::toolbox::{Catalog, Toolbox};
use toolloop::usage::Usage;

fn catalog() -> Arc<Catalog> {
    let mut tb = Toolbox::new();
    tb.add(tool_fn(
        "fetch",
        "Fetches.",
        |_: serde_json::Value, _: ToolContext| async { Ok::<_, ToolError>(ToolOutput::text("")) },
    ))
    .unwrap();
    tb.catalog().clone()
}

fn config(policy: ContextPolicy) -> Arc<LoopConfig> {
    Arc::new(LoopConfig {
        max_rounds: 1_000,
        max_tool_calls: 10_000,
        detect_duplicates: false,
        max_result_chars: 0,
        context: Some(policy),
        ..LoopConfig::default()
    })
}

/// Checks the conversation a request sends: every call has exactly one result, right after
/// its turn, in the turn's call order; no result answers nothing.
fn check_view<'a>(view: impl Into<Messages<'a>>) -> Result<(), String> {
    let view = view.into();
    let mut i = 0;
    while i < view.len() {
        match &view[i] {
            Message::Assistant(a) => {
                for (k, call) in a.tool_calls.iter().enumerate() {
                    match view.get(i + 1 + k) {
                        Some(Message::Tool(r)) if r.call_id == call.id => {}
                        other => {
                            return Err(format!(
                                "message {i}: call {k} ({}) is answered by {other:?}",
                                call.id
                            ));
                        }
                    }
                }
                i += 1 + a.tool_calls.len();
            }
            Message::Tool(r) => {
                return Err(format!("message {i}: result {} answers nothing", r.call_id));
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// What a run of the script did.
struct Run {
    log: Vec<Input>,
    machine: Machine,
    compactions: usize,
    max_sent_tokens: u64,
}

/// Drives a machine through `rounds` (each the sizes of its calls' results; an empty round is
/// the final answer), answering its steps as a driver would and logging every input. Each
/// request's view is checked; its input tokens are reported as a quarter of its bytes.
fn drive(policy: ContextPolicy, prompt: &str, rounds: &[Vec<usize>]) -> Result<Run, String> {
    let cfg = config(policy);
    let messages = vec![Message::system("Be brief."), Message::user(prompt)];
    let log = vec![Input::Started {
        messages: messages.clone(),
        output_schema: None,
    }];
    let m = Machine::new(cfg, HookFlags::default(), catalog(), messages);
    drive_on(m, log, rounds)
}

/// [`drive`] from a machine that ran (or was resumed) so far, its log so far in `log`.
fn drive_on(mut m: Machine, mut log: Vec<Input>, rounds: &[Vec<usize>]) -> Result<Run, String> {
    let mut compactions = 0;
    let mut max_sent_tokens = 0;
    let mut next_call = m
        .messages()
        .iter()
        .map(|m| match m {
            Message::Assistant(a) => a.tool_calls.len() as u64,
            _ => 0,
        })
        .sum::<u64>();
    let feed = |m: &mut Machine, log: &mut Vec<Input>, input: Input| {
        log.push(input.clone());
        m.handle(input).map_err(|e| e.to_string())
    };
    for _ in 0..10_000 {
        match m.next_step() {
            Step::Finished => {
                return Ok(Run {
                    log,
                    machine: m,
                    compactions,
                    max_sent_tokens,
                });
            }
            Step::CallModel { round, .. } => {
                let view = m.sent_messages();
                check_view(view)?;
                let bytes: usize = view.iter().map(|m| m.text().len() + 16).sum();
                let tokens = bytes as u64 / 4;
                max_sent_tokens = max_sent_tokens.max(tokens);
                let sizes = rounds.get(round as usize - 1).cloned().unwrap_or_default();
                let mut response = if sizes.is_empty() {
                    ModelResponse::text("done")
                } else {
                    ModelResponse::tool_calls(
                        sizes
                            .iter()
                            .map(|&n| {
                                next_call += 1;
                                let mut c = ToolCall::new("fetch", serde_json::json!({ "n": n }));
                                c.id = format!("call_{next_call}");
                                c
                            })
                            .collect(),
                    )
                };
                response.usage = Some(Usage {
                    input_tokens: tokens,
                    output_tokens: 5,
                    ..Usage::default()
                });
                feed(
                    &mut m,
                    &mut log,
                    Input::ModelResponded {
                        round,
                        response,
                        cost: None,
                        subjects: Vec::new(),
                    },
                )?;
            }
            Step::RunTools(batches) => {
                let round = m.round();
                for batch in batches {
                    for index in batch.calls {
                        let call = m.round_call(index).unwrap().clone();
                        let n = call.arguments["n"].as_u64().unwrap_or(10) as usize;
                        feed(
                            &mut m,
                            &mut log,
                            Input::ToolStarted {
                                round,
                                index,
                                call_id: call.id.clone(),
                            },
                        )?;
                        feed(
                            &mut m,
                            &mut log,
                            Input::ToolFinished {
                                round,
                                index,
                                result: Ok(ToolOutput::text("r".repeat(n))),
                                duration_ms: 0,
                                attempts: 1,
                            },
                        )?;
                    }
                }
            }
            Step::EditContext { round, edits } => {
                feed(&mut m, &mut log, Input::ContextEdited { round, edits })?
            }
            Step::Compact(request) => {
                check_view(&request.messages)?;
                compactions += 1;
                let input = Input::Compacted {
                    round: request.round,
                    compaction: Compaction {
                        cut: request.cut,
                        summary: format!("summary {compactions}"),
                        usage: Some(Usage {
                            input_tokens: 100,
                            output_tokens: 10,
                            ..Usage::default()
                        }),
                        cost: Some(0.5),
                    },
                };
                feed(&mut m, &mut log, input)?;
            }
            other => return Err(format!("unexpected step {other:?}")),
        }
    }
    Err("the run did not end".into())
}

fn replay(policy: ContextPolicy, log: Vec<Input>) -> Machine {
    Machine::replay(config(policy), HookFlags::default(), catalog(), log).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the policy does, every call of the sent view has exactly one result, in
    /// order; the transcript keeps every result whole; and a replay of the log rebuilds the
    /// same view and asks for no summary.
    #[test]
    fn every_call_keeps_one_result_in_order(
        rounds in prop::collection::vec(prop::collection::vec(1usize..3_000, 1..4), 1..40),
        keep_rounds in 0u32..4,
        spill in prop::option::of(256usize..2_000),
        window in 800u64..6_000,
        compact_at in 0.3f64..1.0,
    ) {
        let policy = ContextPolicy {
            window: Some(window),
            compact_at,
            keep_rounds,
            spill_over: spill,
            spill_preview: 100,
            compact: true,
            ..ContextPolicy::default()
        };
        let run = drive(policy.clone(), "the task", &rounds).map_err(TestCaseError::fail)?;
        let state = run.machine.state().clone();
        let results = state.messages().iter().filter(|m| matches!(m, Message::Tool(_))).count();
        prop_assert_eq!(results, rounds.iter().map(Vec::len).sum::<usize>());
        let again = replay(policy, run.log);
        prop_assert_eq!(again.state(), &state);
        let ctx = state.context().unwrap();
        // Saved and loaded, in today's form or in the earlier one (the whole view written
        // out), the state reads as the same view.
        let view = ctx.view(state.messages());
        let saved: ContextState = serde_json::from_value(serde_json::to_value(ctx).unwrap()).unwrap();
        prop_assert_eq!(saved.view(state.messages()), view);
        prop_assert_eq!(&saved, ctx);
        let earlier: ContextState = serde_json::from_value(earlier_form(ctx, state.messages())).unwrap();
        prop_assert_eq!(earlier.view(state.messages()), view);
        prop_assert_eq!(ctx.compactions as usize, run.compactions);
        if run.compactions > 0 {
            prop_assert_eq!(ctx.usage.unwrap().input_tokens, 100 * run.compactions as u64);
        }
    }
}

/// A 2 KB result per round for 200 rounds, in a 6,000-token window: the requests stay below it.
#[test]
fn long_runs_stay_inside_the_window() {
    let rounds = vec![vec![2_048]; 200];
    let policy = ContextPolicy {
        window: Some(6_000),
        ..ContextPolicy::default()
    };
    let run = drive(policy, "the task", &rounds).unwrap();
    assert!(run.compactions >= 1, "{}", run.compactions);
    assert!(run.max_sent_tokens < 6_000, "{}", run.max_sent_tokens);
}

/// A log cut after a summary replays without asking for it; cut before, the resumed run asks
/// for exactly that summary, once.
#[test]
fn a_compaction_is_asked_once_across_a_crash() {
    let rounds = vec![vec![2_048]; 150];
    let policy = ContextPolicy {
        window: Some(6_000),
        ..ContextPolicy::default()
    };
    let run = drive(policy.clone(), "the task", &rounds).unwrap();
    let at = run
        .log
        .iter()
        .position(|i| matches!(i, Input::Compacted { .. }))
        .expect("a compaction");
    let Input::Compacted { compaction, .. } = &run.log[at] else {
        unreachable!()
    };
    // Killed while the summariser was asked: the resumed run asks for the same one.
    let mut before = replay(policy.clone(), run.log[..at].to_vec());
    match before.next_step() {
        Step::Compact(request) => assert_eq!(request.cut, compaction.cut),
        other => panic!("{other:?}"),
    }
    // Killed after the summary was logged: the resumed run goes on to its model call.
    let mut after = replay(policy, run.log[..=at].to_vec());
    let step = after.next_step();
    assert!(matches!(step, Step::CallModel { .. }), "{step:?}");
    let view = after.sent_messages();
    assert!(view.iter().any(|m| m.text().contains(&compaction.summary)));
}

/// A log written with no policy (or another one) replays as it ran: the context steps it does
/// not hold are not taken.
#[test]
fn a_log_without_context_records_replays_as_it_ran() {
    let rounds = vec![vec![2_048]; 30];
    let run = drive(ContextPolicy::off(), "the task", &rounds).unwrap();
    let policy = ContextPolicy {
        window: Some(4_000),
        ..ContextPolicy::default()
    };
    let m = replay(policy, run.log);
    assert!(m.is_finished());
    assert_eq!(m.state().context().unwrap().compactions, 0);
}

/// A result over `spill_over` is sent as its head and tail; `read_result` reads it whole,
/// page by page, answered by the machine from the transcript.
#[test]
fn spilled_results_are_read_back_whole() {
    let policy = ContextPolicy {
        spill_over: Some(1_000),
        spill_preview: 100,
        ..ContextPolicy::default()
    };
    let mut m = Machine::new(
        config(policy),
        HookFlags::default(),
        catalog(),
        vec![Message::user("task")],
    );
    assert!(matches!(m.next_step(), Step::CallModel { round: 1, .. }));
    let mut call = ToolCall::new("fetch", serde_json::json!({}));
    call.id = "call_big".into();
    m.handle(Input::ModelResponded {
        round: 1,
        response: ModelResponse::tool_calls(vec![call]),
        cost: None,
        subjects: Vec::new(),
    })
    .unwrap();
    let whole: String = (0..500).map(|i| format!("{i:04}")).collect(); // 2,000 bytes
    m.handle(Input::ToolFinished {
        round: 1,
        index: 0,
        result: Ok(ToolOutput::text(whole.clone())),
        duration_ms: 0,
        attempts: 1,
    })
    .unwrap();
    assert!(!m.offers_read_result());
    let Step::EditContext { round, edits } = m.next_step() else {
        panic!()
    };
    assert_eq!(edits.spilled, ["call_big"]);
    m.handle(Input::ContextEdited { round, edits }).unwrap();
    assert!(m.offers_read_result());
    let Step::CallModel { round: 2, .. } = m.next_step() else {
        panic!()
    };
    let Some(Message::Tool(sent)) = m.sent_messages().last() else {
        panic!()
    };
    assert!(sent.content.len() < 600, "{}", sent.content);
    assert!(sent.content.contains("read_result(handle=\"call_big\""));
    // The transcript keeps it whole.
    let Some(Message::Tool(kept)) = m.messages().last() else {
        panic!()
    };
    assert!(kept.content.contains(&whole));
    let kept = kept.content.clone();
    // Read back page by page (a page is at most half of `spill_over`, so it is never spilled).
    let read = |offset: usize, id: &str| {
        let mut c = ToolCall::new(
            "read_result",
            serde_json::json!({"handle": "call_big", "offset": offset, "limit": 1_500}),
        );
        c.id = id.into();
        c
    };
    m.handle(Input::ModelResponded {
        round: 2,
        response: ModelResponse::tool_calls(
            (0..5).map(|k| read(k * 500, &format!("r{k}"))).collect(),
        ),
        cost: None,
        subjects: Vec::new(),
    })
    .unwrap();
    // Both were settled by the machine: nothing to run.
    let step = m.next_step();
    assert!(
        matches!(step, Step::EditContext { .. } | Step::CallModel { .. }),
        "{step:?}"
    );
    let pages: Vec<&str> = m
        .messages()
        .iter()
        .filter_map(|m| match m {
            Message::Tool(r) if r.name == "read_result" => Some(r.content.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(pages.len(), 5);
    assert!(pages[0].starts_with("[bytes 0..500 of "), "{}", pages[0]);
    assert!(pages[4].contains("; the end]"), "{}", pages[4]);
    let joined: String = pages
        .iter()
        .map(|p| p.split_once('\n').unwrap().1)
        .collect();
    assert_eq!(joined, kept);
}

/// A refusal for size compacts and retries the same round once; a second refusal of that
/// round stops the run with `context_exhausted`, its transcript kept; with nothing to compact
/// the run stops at once.
#[test]
fn a_refusal_is_compacted_and_retried_once() {
    let policy = ContextPolicy {
        window: None,
        keep_rounds: 0,
        ..ContextPolicy::default()
    };
    let rounds = vec![vec![2_048]; 5];
    let run = drive(policy.clone(), "the task", &rounds).unwrap();
    // Take the run up to its last round's call and refuse it.
    let cut = run
        .log
        .iter()
        .rposition(|i| matches!(i, Input::ModelResponded { .. }))
        .unwrap();
    let mut m = replay(policy.clone(), run.log[..cut].to_vec());
    let Step::CallModel { round, .. } = m.next_step() else {
        panic!()
    };
    let overflow = ContextOverflow::new(400, Some("context_length_exceeded".into()), "too long");
    m.handle(Input::ContextOverflowed {
        round,
        overflow: overflow.clone(),
    })
    .unwrap();
    let Step::Compact(request) = m.next_step() else {
        panic!()
    };
    assert!(request.forced && request.round == round);
    m.handle(Input::Compacted {
        round,
        compaction: Compaction {
            cut: request.cut,
            summary: "short".into(),
            usage: None,
            cost: None,
        },
    })
    .unwrap();
    // The same round is asked again.
    assert!(matches!(m.next_step(), Step::CallModel { round: r, .. } if r == round));
    m.handle(Input::ContextOverflowed { round, overflow })
        .unwrap();
    assert!(m.is_finished());
    let outcome = m.into_outcome(0);
    assert_eq!(outcome.stop_reason, StopReason::ContextExhausted);
    assert!(outcome.error.unwrap().message.contains("refused again"));
    assert_eq!(
        outcome
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Tool(_)))
            .count(),
        5
    );

    // Nothing to compact: a first request too large stops the run at once.
    let mut m = Machine::new(
        config(policy),
        HookFlags::default(),
        catalog(),
        vec![Message::user("x".repeat(100_000))],
    );
    let Step::CallModel { round, .. } = m.next_step() else {
        panic!()
    };
    m.handle(Input::ContextOverflowed {
        round,
        overflow: ContextOverflow::new(400, None, "prompt is too long"),
    })
    .unwrap();
    let outcome = m.into_outcome(0);
    assert_eq!(outcome.stop_reason, StopReason::ContextExhausted);
    assert!(
        outcome
            .error
            .unwrap()
            .message
            .contains("nothing left to compact")
    );
}

/// Old results are cleared K rounds at a time, so that the sent prefix changes once every K
/// rounds (a provider's prompt cache holds in between), and between K and 2K rounds keep
/// their results.
#[test]
fn results_are_cleared_in_batches_of_keep_rounds() {
    let policy = ContextPolicy {
        window: None,
        keep_rounds: 4,
        spill_over: None,
        ..ContextPolicy::default()
    };
    let run = drive(policy, "the task", &vec![vec![500]; 20]).unwrap();
    let edits: Vec<usize> = run
        .log
        .iter()
        .filter_map(|i| match i {
            Input::ContextEdited { round, .. } => Some(*round as usize),
            _ => None,
        })
        .collect();
    // Rounds 9, 13, 17 and 21 start after 8, 12, 16 and 20 rounds of calls.
    assert_eq!(edits, [9, 13, 17, 21]);
    let view = run.machine.sent_messages();
    let whole = view
        .iter()
        .filter(|m| matches!(m, Message::Tool(r) if r.content.len() >= 500))
        .count();
    assert_eq!(whole, 4, "the last K rounds keep their results");
}

/// A log written with a policy replays on a machine without one: its edits and summaries
/// change nothing, and the run's outcome is the same.
#[test]
fn a_log_with_context_records_replays_without_a_policy() {
    let policy = ContextPolicy {
        window: Some(6_000),
        ..ContextPolicy::default()
    };
    let run = drive(policy, "the task", &vec![vec![2_048]; 150]).unwrap();
    assert!(run.compactions > 0);
    let off = Arc::new(LoopConfig {
        context: None,
        ..(*config(ContextPolicy::off())).clone()
    });
    let m = Machine::replay(off, HookFlags::default(), catalog(), run.log).unwrap();
    assert!(m.is_finished());
    assert!(m.state().context().is_none());
    assert_eq!(m.messages(), run.machine.messages());
}

/// Past the threshold, the results of every round but the last are cleared before any
/// summary is asked for: a model call only when that is not enough.
#[test]
fn past_the_threshold_results_are_cleared_before_a_summary_is_asked() {
    let policy = ContextPolicy {
        window: Some(6_000),
        keep_rounds: 1_000, // the usual clearing never comes
        ..ContextPolicy::default()
    };
    let run = drive(policy, "the task", &vec![vec![2_048]; 60]).unwrap();
    let first_edit = run
        .log
        .iter()
        .position(|i| matches!(i, Input::ContextEdited { .. }))
        .expect("a clearing");
    let first_summary = run
        .log
        .iter()
        .position(|i| matches!(i, Input::Compacted { .. }))
        .unwrap_or(usize::MAX);
    assert!(first_edit < first_summary);
    // 60 results of 2 KB are 30,000 tokens: clearing alone kept 60 rounds inside 6,000.
    assert_eq!(run.compactions, 0);
    assert!(run.max_sent_tokens < 6_000, "{}", run.max_sent_tokens);
}

/// `state` saved in the form of earlier versions: the whole view written out in `view`.
fn earlier_form(state: &ContextState, transcript: &[Message]) -> serde_json::Value {
    let mut saved = serde_json::to_value(state).unwrap();
    let fields = saved.as_object_mut().unwrap();
    for part in ["head", "shared_from", "edited"] {
        fields.remove(part);
    }
    fields.insert(
        "view".into(),
        serde_json::to_value(state.view(transcript).to_vec()).unwrap(),
    );
    saved
}

/// The view reads the transcript's messages in place: the state holds none of them, only the
/// results it replaced (here the cleared ones, each a stub), and a state saved by an earlier
/// version (the whole view written out) goes on as the same run.
#[test]
fn the_view_holds_no_copy_of_the_transcript() {
    let rounds = vec![vec![500]; 20];
    let untouched = ContextPolicy {
        window: None,
        keep_rounds: 0,
        spill_over: None,
        ..ContextPolicy::default()
    };
    let run = drive(untouched, "the task", &rounds).unwrap();
    let ctx = run.machine.state().context().unwrap();
    let saved = serde_json::to_value(ctx).unwrap();
    assert!(
        saved.get("head").is_none() && saved.get("edited").is_none(),
        "{saved}"
    );
    // The view as last sent: the transcript but its final answer.
    let transcript = run.machine.messages();
    assert_eq!(ctx.view(transcript), transcript[..transcript.len() - 1]);

    let clearing = ContextPolicy {
        keep_rounds: 4,
        ..ContextPolicy::default()
    };
    let run = drive(clearing.clone(), "the task", &rounds).unwrap();
    let state = run.machine.state();
    let ctx = state.context().unwrap();
    let saved = serde_json::to_value(ctx).unwrap();
    assert!(saved.get("head").is_none(), "{saved}");
    let edited = saved["edited"].as_array().unwrap();
    assert_eq!(
        edited.len(),
        16,
        "the results of the 16 rounds before the last 4"
    );
    for e in edited {
        assert!(e[1]["content"].as_str().unwrap().contains("cleared"), "{e}");
    }
    // Resumed halfway from a snapshot whose view is in the earlier form, the run goes on
    // as the one that was never stopped.
    let half = run
        .log
        .iter()
        .position(|i| matches!(i, Input::ContextEdited { round: 13, .. }))
        .unwrap();
    let m = replay(clearing.clone(), run.log[..half].to_vec());
    let earlier = earlier_form(m.state().context().unwrap(), m.messages());
    let mut snapshot = serde_json::to_value(m.snapshot()).unwrap();
    *snapshot
        .pointer_mut("/state/context")
        .expect("the snapshot holds the context state") = earlier;
    let snapshot = serde_json::from_value(snapshot).unwrap();
    let resumed = Machine::resume(
        config(clearing.clone()),
        HookFlags::default(),
        catalog(),
        snapshot,
    );
    let resumed = drive_on(resumed, run.log[..half].to_vec(), &rounds)
        .unwrap()
        .machine;
    assert_eq!(resumed.messages(), state.messages());
    assert_eq!(resumed.sent_messages(), ctx.view(state.messages()));
}

/// A snapshot whose context state or compaction in flight points past the view (a file from
/// another version, damaged, or written by hand) is refused when it is read, naming what is
/// wrong, rather than resuming into a machine that slices out of range.
#[test]
fn a_snapshot_with_indices_past_the_view_is_refused() {
    let rounds = vec![vec![2_048]; 150];
    let policy = ContextPolicy {
        window: Some(6_000),
        ..ContextPolicy::default()
    };
    let run = drive(policy.clone(), "the task", &rounds).unwrap();
    let at = run
        .log
        .iter()
        .position(|i| matches!(i, Input::Compacted { .. }))
        .expect("a compaction");
    let mut m = replay(policy.clone(), run.log[..at].to_vec());
    let Step::Compact(request) = m.next_step() else {
        panic!("expected the compaction")
    };
    let saved = serde_json::to_value(m.snapshot()).unwrap();
    let view_len = m.sent_messages().len();
    let transcript = m.messages().len();

    // As saved, it reads and goes on.
    let snapshot: toolloop::engine::Snapshot = serde_json::from_value(saved.clone()).unwrap();
    let mut resumed = Machine::resume(config(policy), HookFlags::default(), catalog(), snapshot);
    assert_eq!(resumed.next_step(), Step::Compact(request.clone()));

    let damaged = [
        (
            "/state/phase/request/lead",
            serde_json::json!(request.cut + 1),
        ),
        ("/state/phase/request/cut", serde_json::json!(view_len + 1)),
        ("/state/context/synced", serde_json::json!(transcript + 1)),
        (
            "/state/context/cleared_upto",
            serde_json::json!(view_len + 1),
        ),
        (
            "/state/context/unspilled_from",
            serde_json::json!(view_len + 1),
        ),
        ("/state/context/turns", serde_json::json!([view_len])),
        ("/state/context/turns", serde_json::json!([3, 2])),
        (
            "/state/context/edited",
            serde_json::json!([[view_len, Message::user("x")]]),
        ),
    ];
    for (pointer, value) in damaged {
        let mut bad = saved.clone();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        bad.pointer_mut(parent)
            .and_then(|p| p.as_object_mut())
            .expect("the snapshot holds the part")
            .insert(key.to_string(), value.clone());
        let e = serde_json::from_value::<toolloop::engine::Snapshot>(bad)
            .expect_err(&format!("{pointer} = {value} is refused"))
            .to_string();
        let field = pointer.rsplit('/').next().unwrap();
        assert!(e.contains(field), "{pointer}: {e}");
    }
}
