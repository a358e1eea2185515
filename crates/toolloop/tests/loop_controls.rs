//! Every control of the loop, each with a test that fails if the control is removed.

use crate::recording;
use recording::Recording;

use futures::StreamExt;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolloop::agent::{Agent, AgentBuilder};
use toolloop::config::{InvalidCallPolicy, LoopConfig, ParallelMode, RoundLimitDecision};
use toolloop::event::Event;
use toolloop::message::{Message, ToolCall};
use toolloop::model::{FinishReason, Model, ModelError, ModelRequest, ModelResponse};
use toolloop::outcome::{CallStatus, ErrorCode, Outcome, StopReason};
use toolloop::providers::scripted::ScriptedModel;
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::usage::Usage;

#[derive(Deserialize, JsonSchema)]
struct Args {
    /// A key.
    key: String,
}

/// A tool that counts its calls and echoes its key.
fn counter(name: &str, count: Arc<AtomicU32>) -> impl toolloop::tool::Tool + 'static {
    tool_fn(name, "Counts calls.", move |a: Args, _ctx: ToolContext| {
        let count = count.clone();
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(ToolOutput::text(format!("got {}", a.key)))
        }
    })
}

/// A tool that sleeps and tracks how many of its calls run at once. A call with `after` finishes
/// only once the call of that key has finished (so completion order is set by events, not by
/// how long each call sleeps).
struct Sleeper {
    name: String,
    parallel: bool,
    delay: Duration,
    now: Arc<AtomicU32>,
    peak: Arc<AtomicU32>,
    order: Arc<Mutex<Vec<String>>>,
    finished: Arc<tokio::sync::Notify>,
    schema: Value,
}

#[async_trait::async_trait]
impl toolloop::tool::Tool for Sleeper {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        "Sleeps."
    }
    fn parameters(&self) -> &Value {
        &self.schema
    }
    fn parallel_safe(&self) -> bool {
        self.parallel
    }
    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        if let Some(after) = args["after"].as_str() {
            loop {
                let finished = self.finished.notified();
                if self.order.lock().unwrap().iter().any(|k| k == after) {
                    break;
                }
                finished.await;
            }
        }
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.order
            .lock()
            .unwrap()
            .push(args["key"].as_str().unwrap_or("").to_string());
        self.finished.notify_waiters();
        Ok(ToolOutput::text(format!("slept {}", args["key"])))
    }
}

struct Gauges {
    now: Arc<AtomicU32>,
    peak: Arc<AtomicU32>,
    order: Arc<Mutex<Vec<String>>>,
    finished: Arc<tokio::sync::Notify>,
}

fn sleeper(name: &str, parallel: bool, g: &Gauges) -> Sleeper {
    Sleeper {
        name: name.into(),
        parallel,
        // Calls started together overlap by this much (real time: all of a batch's calls start
        // within microseconds of each other).
        delay: Duration::from_millis(20),
        now: g.now.clone(),
        peak: g.peak.clone(),
        order: g.order.clone(),
        finished: g.finished.clone(),
        schema: json!({"type": "object", "properties": {"key": {"type": "string"}, "after": {"type": "string"}}}),
    }
}

fn gauges() -> Gauges {
    Gauges {
        now: Arc::new(AtomicU32::new(0)),
        peak: Arc::new(AtomicU32::new(0)),
        order: Arc::new(Mutex::new(Vec::new())),
        finished: Arc::new(tokio::sync::Notify::new()),
    }
}

fn call(name: &str, args: Value) -> ToolCall {
    ToolCall::new(name, args)
}

fn calls(list: Vec<ToolCall>) -> ModelResponse {
    ModelResponse::tool_calls(list)
}

fn scripted(steps: Vec<ModelResponse>) -> ScriptedModel {
    ScriptedModel::new(steps)
}

/// Every tool call in the transcript has exactly one result, right after its turn.
fn assert_valid_transcript(messages: &[Message]) {
    let mut i = 0;
    while i < messages.len() {
        if let Message::Assistant(a) = &messages[i] {
            let ids: Vec<&str> = a.tool_calls.iter().map(|c| c.id.as_str()).collect();
            let results: Vec<&str> = messages[i + 1..]
                .iter()
                .take_while(|m| matches!(m, Message::Tool(_)))
                .map(|m| match m {
                    Message::Tool(r) => r.call_id.as_str(),
                    _ => unreachable!(),
                })
                .collect();
            assert_eq!(ids, results, "calls and results differ at message {i}");
            i += 1 + results.len();
        } else {
            assert!(
                !matches!(messages[i], Message::Tool(_)),
                "orphan tool result at {i}"
            );
            i += 1;
        }
    }
}

fn builder(model: impl Model + 'static) -> AgentBuilder {
    Agent::builder(model).system("test")
}

#[tokio::test]
async fn max_rounds_stops_a_model_that_never_answers() {
    let count = Arc::new(AtomicU32::new(0));
    let steps = (0..10)
        .map(|i| calls(vec![call("count", json!({"key": format!("k{i}")}))]))
        .collect();
    let agent = builder(scripted(steps))
        .tool(counter("count", count.clone()))
        .max_rounds(3)
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::MaxRounds);
    assert_eq!(out.rounds, 3);
    assert_eq!(count.load(Ordering::SeqCst), 3);
    assert_eq!(out.error.unwrap().code, ErrorCode::MaxIterationsReached);
    assert!(!out.success);
    assert_valid_transcript(&out.messages);
}

#[tokio::test]
async fn max_tool_calls_is_checked_before_each_call() {
    let count = Arc::new(AtomicU32::new(0));
    let round = |r: u32| {
        calls(
            (0..3)
                .map(|i| call("count", json!({"key": format!("{r}-{i}")})))
                .collect(),
        )
    };
    let agent = builder(scripted(vec![round(1), round(2), round(3)]))
        .tool(counter("count", count.clone()))
        .max_tool_calls(4)
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::MaxToolCalls);
    assert_eq!(count.load(Ordering::SeqCst), 4);
    assert_eq!(out.rounds, 2);
    let statuses: Vec<CallStatus> = out.tool_calls.iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [
            CallStatus::Ok,
            CallStatus::Ok,
            CallStatus::Ok,
            CallStatus::Ok,
            CallStatus::Skipped,
            CallStatus::Skipped
        ]
    );
    assert_eq!(out.error.unwrap().code, ErrorCode::MaxToolCallsReached);
    assert_valid_transcript(&out.messages);
}

#[tokio::test]
async fn timeout_returns_everything_with_a_cancelled_result_for_the_call_in_flight() {
    let g = gauges();
    let mut slow = sleeper("slow", false, &g);
    slow.delay = Duration::from_secs(60);
    let agent = builder(scripted(vec![calls(vec![call(
        "slow",
        json!({"key": "a"}),
    )])]))
    .tool(slow)
    .timeout(Duration::from_millis(50))
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Timeout);
    assert_eq!(out.error.as_ref().unwrap().code, ErrorCode::Timeout);
    assert_eq!(out.tool_calls.len(), 1);
    assert_eq!(out.tool_calls[0].status, CallStatus::Cancelled);
    assert!(out.tool_calls[0].content.contains("Cancelled"));
    assert_valid_transcript(&out.messages);
    assert!(out.duration_ms < 5_000);
}

/// A tool that waits for a minute, and notes when its `ctx.cancel` fires (from a task of its
/// own, which outlives the tool's future when the run drops it).
fn watcher(seen: Arc<tokio::sync::Notify>) -> impl toolloop::tool::Tool + 'static {
    tool_fn("watch", "Waits.", move |_: Args, ctx: ToolContext| {
        let seen = seen.clone();
        async move {
            tokio::spawn(async move {
                ctx.cancel.cancelled().await;
                seen.notify_one();
            });
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, ToolError>(ToolOutput::text("waited"))
        }
    })
}

/// A run's tools are told to stop when it stops, whether it was given a token or not (a run
/// started without one makes its tools' token its own).
#[tokio::test]
async fn a_stopped_run_cancels_its_tools_token_with_or_without_a_callers_token() {
    let script = || scripted(vec![calls(vec![call("watch", json!({"key": "a"}))])]);
    // No token of the caller's: the deadline stops the run.
    let seen = Arc::new(tokio::sync::Notify::new());
    let agent = builder(script())
        .tool(watcher(seen.clone()))
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Timeout);
    tokio::time::timeout(Duration::from_secs(5), seen.notified())
        .await
        .expect("the tool's token is cancelled when a run without a token times out");
    // The caller's token: cancelling it stops the run and the tool.
    let seen = Arc::new(tokio::sync::Notify::new());
    let agent = builder(script())
        .tool(watcher(seen.clone()))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        c2.cancel();
    });
    let out = agent
        .run_cancellable(vec![Message::user("go")], cancel)
        .await;
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    tokio::time::timeout(Duration::from_secs(5), seen.notified())
        .await
        .expect("the tool's token is cancelled with the caller's");
}

#[tokio::test]
async fn cancellation_returns_everything_with_a_cancelled_result() {
    let g = gauges();
    let mut slow = sleeper("slow", true, &g);
    slow.delay = Duration::from_secs(60);
    let count = Arc::new(AtomicU32::new(0));
    let agent = builder(scripted(vec![
        calls(vec![call("count", json!({"key": "a"}))]),
        calls(vec![
            call("slow", json!({"key": "b"})),
            call("slow", json!({"key": "c"})),
        ]),
    ]))
    .tool(slow)
    .tool(counter("count", count.clone()))
    .build()
    .unwrap();
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    // Cancelled once both slow calls of the second round are running, or after 10 s if they
    // never do (the run then fails here at once instead of after the slow tool's minute).
    let running = g.now.clone();
    let both_ran = tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while running.load(Ordering::SeqCst) < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let both = running.load(Ordering::SeqCst) >= 2;
        c2.cancel();
        both
    });
    let out = agent
        .run_cancellable(vec![Message::user("go")], cancel)
        .await;
    assert!(
        both_ran.await.unwrap(),
        "the two slow calls never ran at once: {out:?}"
    );
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_eq!(out.error.as_ref().unwrap().code, ErrorCode::Cancelled);
    assert_eq!(out.rounds, 2);
    assert_eq!(out.tool_calls[0].status, CallStatus::Ok);
    assert_eq!(out.tool_calls[1].status, CallStatus::Cancelled);
    assert_eq!(out.tool_calls[2].status, CallStatus::Cancelled);
    assert_valid_transcript(&out.messages);
}

/// A model that asks for one call of `count`, then never answers: each later request waits
/// for ever (after telling `waiting`).
struct StallsAfterOneRound {
    requests: AtomicU32,
    waiting: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl Model for StallsAfterOneRound {
    fn name(&self) -> &str {
        "stalls"
    }
    async fn complete(&self, _: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        if self.requests.fetch_add(1, Ordering::SeqCst) == 0 {
            return Ok(calls(vec![call("count", json!({"key": "a"}))]));
        }
        self.waiting.notify_one();
        std::future::pending().await
    }
}

/// The run stopped during its second model call, after a whole round: the first round's call
/// and result kept, nothing after them.
fn assert_stopped_in_second_model_call(out: &Outcome, count: &AtomicU32) {
    assert_eq!(out.rounds, 2, "{out:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(out.tool_calls.len(), 1);
    assert_eq!(out.tool_calls[0].status, CallStatus::Ok);
    // The system prompt, the user's, the first answer and its call's result.
    assert_eq!(out.messages.len(), 4, "{:?}", out.messages);
    assert!(matches!(out.messages[2], Message::Assistant(_)));
    assert!(matches!(out.messages[3], Message::Tool(_)));
    assert_valid_transcript(&out.messages);
}

#[tokio::test]
async fn cancellation_during_a_later_model_call_stops_the_run_at_once() {
    // The run's wait on its token is made once, at its start: a cancellation after a whole
    // round (a model call and a tool call, each raced against it) still stops the call in
    // flight.
    let waiting = Arc::new(tokio::sync::Notify::new());
    let count = Arc::new(AtomicU32::new(0));
    let agent = builder(StallsAfterOneRound {
        requests: AtomicU32::new(0),
        waiting: waiting.clone(),
    })
    .tool(counter("count", count.clone()))
    .build()
    .unwrap();
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        waiting.notified().await;
        c2.cancel();
    });
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        agent.run_cancellable(vec![Message::user("go")], cancel),
    )
    .await
    .expect("the cancellation stops the model call");
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_eq!(out.error.as_ref().unwrap().code, ErrorCode::Cancelled);
    assert_stopped_in_second_model_call(&out, &count);
}

#[tokio::test]
async fn the_timeout_stops_a_later_model_call() {
    // As above, for the run's deadline (its timer is set once, at the first step).
    let waiting = Arc::new(tokio::sync::Notify::new());
    let count = Arc::new(AtomicU32::new(0));
    let agent = builder(StallsAfterOneRound {
        requests: AtomicU32::new(0),
        waiting,
    })
    .tool(counter("count", count.clone()))
    .timeout(Duration::from_millis(300))
    .build()
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), agent.prompt("go"))
        .await
        .expect("the run's timeout stops the model call");
    assert_eq!(out.stop_reason, StopReason::Timeout);
    assert_eq!(out.error.as_ref().unwrap().code, ErrorCode::Timeout);
    assert_stopped_in_second_model_call(&out, &count);
    assert!(
        out.duration_ms >= 300 && out.duration_ms < 5_000,
        "{}",
        out.duration_ms
    );
}

#[tokio::test]
async fn duplicate_calls_in_the_window_are_not_run_and_warn_the_model() {
    let count = Arc::new(AtomicU32::new(0));
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let k = |s: &str| call("count", json!({"key": s}));
    let agent = builder(scripted(vec![
        calls(vec![k("a")]),
        calls(vec![k("a")]), // duplicate of the last call
        calls(vec![k("b"), k("c"), k("d")]),
        calls(vec![k("a")]), // outside the window of 3: runs
        ModelResponse::text("done"),
    ]))
    .tool(counter("count", count.clone()))
    .on_event(move |e| {
        if let Event::DuplicateDetected { call, .. } = e {
            ev.lock().unwrap().push(call.arguments.clone());
        }
    })
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(count.load(Ordering::SeqCst), 5);
    assert_eq!(out.tool_calls[1].status, CallStatus::Duplicate);
    assert!(out.tool_calls[1].content.contains("already called"));
    assert_eq!(*events.lock().unwrap(), vec![json!({"key": "a"})]);
    assert_valid_transcript(&out.messages);

    // Off: the same script runs every call.
    let count = Arc::new(AtomicU32::new(0));
    let config = LoopConfig {
        detect_duplicates: false,
        ..LoopConfig::default()
    };
    let agent = builder(scripted(vec![
        calls(vec![k("a")]),
        calls(vec![k("a")]),
        ModelResponse::text("done"),
    ]))
    .config(config)
    .tool(counter("count", count.clone()))
    .build()
    .unwrap();
    agent.prompt("go").await;
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn stop_when_ends_the_run_after_every_call_of_the_round() {
    let count = Arc::new(AtomicU32::new(0));
    let agent = builder(scripted(vec![
        calls(vec![
            call("count", json!({"key": "submit"})),
            call("count", json!({"key": "after"})),
        ]),
        ModelResponse::text("never reached"),
    ]))
    .tool(counter("count", count.clone()))
    .stop_when(|round| {
        round.iter().find_map(|c| {
            (c.call.arguments["key"] == "submit" && matches!(c.result, Some(Ok(_))))
                .then(|| "SUBMITTED".to_string())
        })
    })
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::TerminalSignal);
    assert_eq!(out.signal.as_deref(), Some("SUBMITTED"));
    assert_eq!(
        count.load(Ordering::SeqCst),
        2,
        "the call after the terminal one still ran"
    );
    assert!(out.success);
    assert_valid_transcript(&out.messages);
}

#[tokio::test]
async fn terminal_tools_end_the_run_and_tools_can_give_signals() {
    let count = Arc::new(AtomicU32::new(0));
    let done = tool_fn(
        "finish",
        "Ends the task.",
        |_a: Args, _c: ToolContext| async { Ok::<_, ToolError>(ToolOutput::text("finished")) },
    )
    .make_terminal();
    let agent = builder(scripted(vec![
        calls(vec![
            call("finish", json!({"key": "x"})),
            call("count", json!({"key": "y"})),
        ]),
        ModelResponse::text("never reached"),
    ]))
    .tool(done)
    .tool(counter("count", count.clone()))
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::TerminalSignal);
    assert_eq!(out.signal.as_deref(), Some("finish"));
    assert_eq!(count.load(Ordering::SeqCst), 1);

    let spec = tool_fn(
        "spec_submit",
        "Submits.",
        |_a: Args, _c: ToolContext| async {
            Ok::<_, ToolError>(ToolOutput::text("ok").with_signal("spec-123"))
        },
    );
    let agent = builder(scripted(vec![calls(vec![call(
        "spec_submit",
        json!({"key": "x"}),
    )])]))
    .tool(spec)
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.signal.as_deref(), Some("spec-123"));
}

#[tokio::test]
async fn on_round_limit_can_grant_rounds_or_stop_with_a_signal() {
    let count = Arc::new(AtomicU32::new(0));
    let steps = |n: usize| -> Vec<ModelResponse> {
        (0..n)
            .map(|i| calls(vec![call("count", json!({"key": format!("k{i}")}))]))
            .chain([ModelResponse::text("done")])
            .collect()
    };
    let asked = Arc::new(AtomicU32::new(0));
    let a2 = asked.clone();
    let agent = builder(scripted(steps(3)))
        .tool(counter("count", count.clone()))
        .max_rounds(2)
        .on_round_limit(move |view| {
            a2.fetch_add(1, Ordering::SeqCst);
            assert_eq!(view.round, 2);
            Box::pin(async { RoundLimitDecision::Extend(5) })
        })
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(out.rounds, 4);
    assert_eq!(asked.load(Ordering::SeqCst), 1);

    let agent = builder(scripted(steps(5)))
        .tool(counter("count", Arc::new(AtomicU32::new(0))))
        .max_rounds(2)
        .on_round_limit(|_| Box::pin(async { RoundLimitDecision::Signal("REQUEST_BUDGET".into()) }))
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::TerminalSignal);
    assert_eq!(out.signal.as_deref(), Some("REQUEST_BUDGET"));
    assert_eq!(out.rounds, 2);
}

#[tokio::test]
async fn reminders_go_with_the_next_request_only_and_are_never_stored() {
    // Each request's message count and reminders.
    let model = Recording::new(
        Arc::new(scripted(vec![
            calls(vec![call("count", json!({"key": "a"}))]),
            ModelResponse::text("done"),
        ])),
        |r| (r.messages.len(), r.wrapped_reminders().collect::<Vec<_>>()),
    );
    let seen = model.seen();
    let agent = builder(model)
        .tool(counter("count", Arc::new(AtomicU32::new(0))))
        .reminders(|view| {
            vec![format!(
                "round {} after {} calls, last ok: {}",
                view.round,
                view.tool_calls,
                view.last_call.map(|c| c.success()).unwrap_or(false)
            )]
        })
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen[0].1,
        ["<system-reminder>round 1 after 0 calls, last ok: false</system-reminder>"]
    );
    assert_eq!(
        seen[1].1,
        ["<system-reminder>round 2 after 1 calls, last ok: true</system-reminder>"]
    );
    let all = serde_json::to_string(&out.messages).unwrap();
    assert!(!all.contains("system-reminder"));
}

#[tokio::test]
async fn parallel_safe_calls_run_together_unsafe_ones_alone_results_in_call_order() {
    let g = gauges();
    let p = |k: &str| call("read", json!({"key": k}));
    // Finishes only after `after` has: the three reads can only all finish if they run together.
    let p_after = |k: &str, after: &str| call("read", json!({"key": k, "after": after}));
    let w = |k: &str| call("write", json!({"key": k}));
    let agent = builder(scripted(vec![
        calls(vec![
            p_after("a", "b"),
            p_after("b", "c"),
            p("c"),
            w("d"),
            p("e"),
        ]),
        ModelResponse::text("done"),
    ]))
    .tool(sleeper("read", true, &g))
    .tool(sleeper("write", false, &g))
    .build()
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), agent.prompt("go"))
        .await
        .expect("the reads ran one after another: `a` waits for `b` for ever");
    assert_eq!(g.peak.load(Ordering::SeqCst), 3);
    // completion order: c, b, a (parallel), then d, then e
    assert_eq!(*g.order.lock().unwrap(), ["c", "b", "a", "d", "e"]);
    let result_keys: Vec<String> = out
        .tool_calls
        .iter()
        .map(|c| c.call.arguments["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(result_keys, ["a", "b", "c", "d", "e"]);
    assert_valid_transcript(&out.messages);
}

/// A batch of one or two calls runs without a set of running jobs: two parallel-safe calls still
/// run together, each is settled as it finishes, and one at a time still means one at a time.
#[tokio::test]
async fn a_batch_of_two_runs_together_unless_one_at_a_time_and_settles_each_as_it_finishes() {
    // Either call may be the one that waits for the other: both finish only if both run.
    for (first, second, finish_order) in [
        (
            json!({"key": "a", "after": "b"}),
            json!({"key": "b"}),
            ["b", "a"],
        ),
        (
            json!({"key": "a"}),
            json!({"key": "b", "after": "a"}),
            ["a", "b"],
        ),
    ] {
        let g = gauges();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let agent = builder(scripted(vec![
            calls(vec![call("read", first), call("read", second)]),
            calls(vec![call("read", json!({"key": "c"}))]),
            ModelResponse::text("done"),
        ]))
        .tool(sleeper("read", true, &g))
        .on_event({
            let seen = seen.clone();
            move |e| {
                if let Event::ToolFinished { call_id, .. } = e {
                    seen.lock().unwrap().push(call_id.clone());
                }
            }
        })
        .build()
        .unwrap();
        let out = tokio::time::timeout(Duration::from_secs(30), agent.prompt("go"))
            .await
            .expect("the two calls ran one after the other: one waits for the other for ever");
        assert_eq!(g.peak.load(Ordering::SeqCst), 2);
        assert_eq!(
            *g.order.lock().unwrap(),
            [finish_order[0], finish_order[1], "c"]
        );
        // Each result reached the machine as its call finished, not in call order.
        let by_id = |id: &String| {
            out.tool_calls
                .iter()
                .find(|c| &c.call.id == id)
                .map(|c| c.call.arguments["key"].as_str().unwrap().to_string())
                .unwrap()
        };
        let settled: Vec<String> = seen.lock().unwrap().iter().map(by_id).collect();
        assert_eq!(settled, [finish_order[0], finish_order[1], "c"]);
        // The record and the transcript keep call order.
        let keys: Vec<&str> = out
            .tool_calls
            .iter()
            .map(|c| c.call.arguments["key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_valid_transcript(&out.messages);
    }

    // One at a time: two calls never overlap, and run in call order.
    let g = gauges();
    let config = LoopConfig {
        max_parallel: 1,
        ..LoopConfig::default()
    };
    let agent = builder(scripted(vec![
        calls(vec![
            call("read", json!({"key": "a"})),
            call("read", json!({"key": "b"})),
        ]),
        ModelResponse::text("done"),
    ]))
    .config(config)
    .tool(sleeper("read", true, &g))
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.executed_calls().count(), 2);
    assert_eq!(g.peak.load(Ordering::SeqCst), 1);
    assert_eq!(*g.order.lock().unwrap(), ["a", "b"]);
    assert_valid_transcript(&out.messages);
}

#[tokio::test]
async fn at_most_max_parallel_calls_run_at_once() {
    let g = gauges();
    let many: Vec<ToolCall> = (0..25)
        .map(|i| call("read", json!({"key": format!("k{i}")})))
        .collect();
    let agent = builder(scripted(vec![calls(many), ModelResponse::text("done")]))
        .tool(sleeper("read", true, &g))
        .max_tool_calls(30)
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.executed_calls().count(), 25);
    assert_eq!(g.peak.load(Ordering::SeqCst), 10);
}

#[tokio::test]
async fn all_or_nothing_mode_runs_everything_sequentially_when_one_call_is_unsafe() {
    let g = gauges();
    let config = LoopConfig {
        parallel_mode: ParallelMode::AllOrNothing,
        ..LoopConfig::default()
    };
    let agent = builder(scripted(vec![
        calls(vec![
            call("read", json!({"key": "a"})),
            call("read", json!({"key": "b"})),
            call("write", json!({"key": "c"})),
        ]),
        calls(vec![
            call("read", json!({"key": "d"})),
            call("read", json!({"key": "e"})),
        ]),
        ModelResponse::text("done"),
    ]))
    .config(config)
    .tool(sleeper("read", true, &g))
    .tool(sleeper("write", false, &g))
    .on_event({
        let peak = g.peak.clone();
        move |e| {
            // the first round must never have overlapped
            if let Event::RoundFinished { round: 1, .. } = e {
                assert_eq!(peak.load(Ordering::SeqCst), 1);
            }
        }
    })
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(
        g.peak.load(Ordering::SeqCst),
        2,
        "the all-safe round ran in parallel"
    );
}

#[tokio::test]
async fn invalid_calls_become_results_the_model_can_read() {
    let count = Arc::new(AtomicU32::new(0));
    let agent = builder(scripted(vec![
        calls(vec![call("nope", json!({}))]),
        calls(vec![ToolCall::from_raw_arguments(
            "c2".into(),
            "count".into(),
            "{\"key\": ",
        )]),
        calls(vec![call("count", json!({"key": 5}))]),
        ModelResponse::text("gave up"),
    ]))
    .tool(counter("count", count.clone()))
    .config(LoopConfig {
        invalid_calls: InvalidCallPolicy::Feedback { budget: 3 },
        ..LoopConfig::default()
    })
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(count.load(Ordering::SeqCst), 0);
    let c = |i: usize| &out.tool_calls[i].content;
    assert!(
        c(0).contains("Unknown tool `nope`") && c(0).contains("count"),
        "{}",
        c(0)
    );
    assert!(c(1).contains("not valid JSON"), "{}", c(1));
    assert!(c(2).contains("/key") && c(2).contains("string"), "{}", c(2));
    assert!(
        out.tool_calls
            .iter()
            .all(|c| c.status == CallStatus::Invalid)
    );
    // the invalid argument text is never put back in the transcript's arguments
    assert_valid_transcript(&out.messages);
}

#[tokio::test]
async fn the_invalid_call_budget_stops_the_run_and_a_valid_call_resets_it() {
    let count = Arc::new(AtomicU32::new(0));
    let bad = || calls(vec![call("nope", json!({}))]);
    let good = || calls(vec![call("count", json!({"key": "k"}))]);
    // budget 2: bad, bad, good (reset), bad, bad, bad -> stop on the third in a row
    let agent = builder(scripted(vec![
        bad(),
        bad(),
        good(),
        bad(),
        bad(),
        bad(),
        bad(),
    ]))
    .tool(counter("count", count.clone()))
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::TooManyInvalidCalls);
    assert_eq!(out.rounds, 6);
    assert_eq!(out.error.unwrap().code, ErrorCode::ToolNotFound);
    assert_valid_transcript(&out.messages);
}

#[tokio::test]
async fn strict_policy_stops_at_the_first_invalid_call_with_seed_codes() {
    let count = Arc::new(AtomicU32::new(0));
    let strict = LoopConfig {
        invalid_calls: InvalidCallPolicy::Strict,
        ..LoopConfig::default()
    };
    let agent = builder(scripted(vec![calls(vec![
        call("count", json!({"key": "a"})),
        call("count", json!({"wrong": 1})),
        call("count", json!({"key": "c"})),
    ])]))
    .config(strict.clone())
    .tool(counter("count", count.clone()))
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::TooManyInvalidCalls);
    assert_eq!(out.error.as_ref().unwrap().code, ErrorCode::InvalidToolCall);
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(out.tool_calls[2].status, CallStatus::Skipped);
    assert_valid_transcript(&out.messages);

    let agent = builder(scripted(vec![calls(vec![call("ghost", json!({}))])]))
        .config(strict.clone())
        .tool(counter("count", count.clone()))
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.error.unwrap().code, ErrorCode::ToolNotFound);

    // A call the model wrote but that could not be parsed.
    let mut near_miss = ModelResponse::text("<PTK_CALL>{\"tool\": oops</PTK_CALL>");
    near_miss.malformed_call = Some("Your tool call could not be parsed: expected JSON".into());
    near_miss.finish_reason = FinishReason::MalformedToolCall;
    let agent = builder(scripted(vec![near_miss]))
        .config(strict)
        .tool(counter("count", count.clone()))
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::TooManyInvalidCalls);
    let error = out.error.unwrap();
    assert_eq!(error.code, ErrorCode::ParseError);
    assert!(
        error.message.contains("could not be parsed"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn retryable_tool_errors_are_retried_with_backoff() {
    let attempts = Arc::new(AtomicU32::new(0));
    let a2 = attempts.clone();
    let flaky = tool_fn(
        "flaky",
        "Fails twice.",
        move |_a: Args, ctx: ToolContext| {
            let attempts = a2.clone();
            async move {
                attempts.fetch_add(1, Ordering::SeqCst);
                if ctx.attempt < 3 {
                    Err(ToolError::retryable("busy"))
                } else {
                    Ok(ToolOutput::text("fine"))
                }
            }
        },
    );
    let agent = builder(scripted(vec![
        calls(vec![call("flaky", json!({"key": "a"}))]),
        ModelResponse::text("done"),
    ]))
    .tool(flaky)
    .config(LoopConfig {
        tool_retry_backoff: Duration::from_millis(20),
        ..LoopConfig::default()
    })
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert_eq!(out.tool_calls[0].status, CallStatus::Ok);
    assert_eq!(out.tool_calls[0].attempts, 3);
    assert!(out.tool_calls[0].duration_ms >= 60, "backoff 20 + 40 ms");

    let attempts = Arc::new(AtomicU32::new(0));
    let a3 = attempts.clone();
    let broken = tool_fn(
        "broken",
        "Always fails.",
        move |_a: Args, _c: ToolContext| {
            let attempts = a3.clone();
            async move {
                attempts.fetch_add(1, Ordering::SeqCst);
                Err::<ToolOutput, _>(ToolError::new("no such record"))
            }
        },
    );
    let agent = builder(scripted(vec![
        calls(vec![call("broken", json!({"key": "a"}))]),
        ModelResponse::text("done"),
    ]))
    .tool(broken)
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        1,
        "non-retryable errors are not retried"
    );
    assert_eq!(out.tool_calls[0].status, CallStatus::Failed);
    let v: Value = serde_json::from_str(&out.tool_calls[0].content).unwrap();
    assert_eq!(v, json!({"success": false, "message": "no such record"}));
}

#[tokio::test]
async fn results_are_serialized_as_success_message_data_and_capped() {
    let run = |cap: usize| {
        let big = tool_fn("big", "Big output.", |_a: Args, _c: ToolContext| async {
            Ok::<_, ToolError>(ToolOutput::data(json!("x".repeat(10_000))))
        });
        let agent = builder(scripted(vec![
            calls(vec![call("big", json!({"key": "a"}))]),
            ModelResponse::text("done"),
        ]))
        .tool(big)
        .config(LoopConfig {
            max_result_chars: cap,
            ..LoopConfig::default()
        })
        .build()
        .unwrap();
        async move { agent.prompt("go").await }
    };
    let out = run(4000).await;
    let content = &out.tool_calls[0].content;
    assert!(content.chars().count() <= 4000);
    assert!(content.contains("[truncated"));
    let out = run(0).await;
    let v: Value = serde_json::from_str(&out.tool_calls[0].content).unwrap();
    assert_eq!(v["success"], json!(true));
    assert_eq!(v["message"], json!("ok"));
    assert_eq!(v["data"].as_str().unwrap().len(), 10_000);
}

#[tokio::test]
async fn tool_timeout_fails_a_slow_attempt_with_a_retryable_error() {
    let g = gauges();
    let mut slow = sleeper("slow", false, &g);
    slow.delay = Duration::from_secs(30);
    let agent = builder(scripted(vec![
        calls(vec![call("slow", json!({"key": "a"}))]),
        ModelResponse::text("done"),
    ]))
    .tool(slow)
    .config(LoopConfig {
        tool_timeout: Some(Duration::from_millis(100)),
        tool_retries: 1,
        tool_retry_backoff: Duration::from_millis(10),
        ..LoopConfig::default()
    })
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(out.tool_calls[0].status, CallStatus::Failed);
    assert_eq!(out.tool_calls[0].attempts, 2);
    assert!(
        out.tool_calls[0]
            .content
            .contains("did not finish within 0.1s")
    );
}

#[tokio::test]
async fn the_test_model_calls_each_tool_once_from_its_schema_then_summarizes() {
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Rich {
        #[schemars(extend("default" = "dflt"))]
        a: String,
        #[schemars(extend("examples" = ["ex"]))]
        b: String,
        c: u32,
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let rich = tool_fn("rich", "Rich args.", move |args: Value, _c: ToolContext| {
        let seen = s2.clone();
        async move {
            seen.lock().unwrap().push(args);
            Ok::<_, ToolError>(ToolOutput::text("rich done"))
        }
    });
    let rich_schema = toolloop::tool::schema_of::<Rich>();
    struct WithSchema<T>(T, Value);
    #[async_trait::async_trait]
    impl<T: toolloop::tool::Tool> toolloop::tool::Tool for WithSchema<T> {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn description(&self) -> &str {
            self.0.description()
        }
        fn parameters(&self) -> &Value {
            &self.1
        }
        async fn call(&self, a: Value, c: ToolContext) -> Result<ToolOutput, ToolError> {
            self.0.call(a, c).await
        }
    }
    let count = Arc::new(AtomicU32::new(0));
    let agent = builder(toolloop::providers::test_model::TestModel::new())
        .tool(WithSchema(rich, rich_schema))
        .tool(counter("count", count.clone()))
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(out.rounds, 2);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![json!({"a": "dflt", "b": "ex", "c": 0})]
    );
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let summary: Value = serde_json::from_str(out.text.as_deref().unwrap()).unwrap();
    assert_eq!(summary["rich"]["message"], json!("rich done"));
    assert_eq!(summary["count"]["message"], json!("got a"));
    assert!(out.usage.unwrap().input_tokens > 0);
    assert_eq!(out.cost, None, "the test model has no price");
}

#[tokio::test]
async fn usage_and_cost_are_summed_and_unknown_prices_give_unknown_cost() {
    let with_usage = |mut r: ModelResponse, i: u64, o: u64| {
        r.usage = Some(Usage {
            input_tokens: i,
            output_tokens: o,
            ..Usage::default()
        });
        r
    };
    let steps = || {
        vec![
            with_usage(
                calls(vec![call("count", json!({"key": "a"}))]),
                1_000_000,
                0,
            ),
            with_usage(ModelResponse::text("done"), 1_000_000, 1_000_000),
        ]
    };
    let agent = builder(scripted(steps()).named("gpt-4o"))
        .tool(counter("count", Arc::new(AtomicU32::new(0))))
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.usage.unwrap().input_tokens, 2_000_000);
    assert_eq!(out.usage.unwrap().output_tokens, 1_000_000);
    let cost = out.cost.unwrap();
    assert!((cost - (2.0 * 2.5 + 10.0)).abs() < 1e-9, "{cost}");

    let agent = builder(scripted(steps()).named("my-local-model"))
        .tool(counter("count", Arc::new(AtomicU32::new(0))))
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.cost, None);
    assert_eq!(out.usage.unwrap().input_tokens, 2_000_000);
}

#[tokio::test]
async fn a_failed_model_call_returns_the_transcript_so_far() {
    let model = ScriptedModel::from_json(
        r#"[{"tool_calls": [{"name": "count", "arguments": {"key": "a"}}]}, {"error": "HTTP 503"}]"#,
    )
    .unwrap();
    let agent = builder(model)
        .tool(counter("count", Arc::new(AtomicU32::new(0))))
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::ModelError);
    let err = out.error.unwrap();
    assert_eq!(err.code, ErrorCode::LlmCallFailed);
    assert!(err.message.contains("503"));
    assert_eq!(out.messages.len(), 4, "system, user, assistant, tool");
    assert_valid_transcript(&out.messages);
}

#[tokio::test]
async fn a_call_cut_off_by_the_output_limit_is_reported_not_run() {
    let count = Arc::new(AtomicU32::new(0));
    let mut cut = calls(vec![ToolCall::from_raw_arguments(
        "c1".into(),
        "count".into(),
        "{\"key\": \"lo",
    )]);
    cut.finish_reason = FinishReason::Length;
    let agent = builder(scripted(vec![cut]))
        .tool(counter("count", count.clone()))
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::OutputTruncated);
    assert_eq!(out.error.unwrap().code, ErrorCode::OutputTruncated);
    assert_eq!(out.tool_calls[0].status, CallStatus::Truncated);
    assert_eq!(count.load(Ordering::SeqCst), 0);
    assert_valid_transcript(&out.messages);
}

#[tokio::test]
async fn a_malformed_call_is_not_taken_as_the_answer() {
    let mut near_miss = ModelResponse::text("<PTK_CALL>{\"tool\": oops</PTK_CALL>");
    near_miss.malformed_call = Some("Your tool call could not be parsed: expected JSON".into());
    near_miss.finish_reason = FinishReason::MalformedToolCall;
    let agent = builder(scripted(vec![
        near_miss,
        ModelResponse::text("fixed answer"),
    ]))
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(out.text.as_deref(), Some("fixed answer"));
    assert_eq!(out.rounds, 2);
    assert!(out.messages.iter().any(
        |m| matches!(m, Message::User { content, .. } if content.contains("could not be parsed"))
    ));
}

#[tokio::test]
async fn a_panicking_tool_becomes_an_error_result() {
    let bomb = tool_fn("bomb", "Panics.", |_a: Args, _c: ToolContext| async {
        if true {
            panic!("kaboom");
        }
        Ok::<_, ToolError>(ToolOutput::text("never"))
    });
    let agent = builder(scripted(vec![
        calls(vec![call("bomb", json!({"key": "a"}))]),
        ModelResponse::text("done"),
    ]))
    .tool(bomb)
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.tool_calls[0].status, CallStatus::Failed);
    assert!(out.tool_calls[0].content.contains("kaboom"));
    assert_eq!(out.stop_reason, StopReason::Answered);
}

#[tokio::test]
async fn the_caller_owns_the_conversation_kept_or_fresh() {
    let agent = builder(scripted(vec![
        ModelResponse::text("first"),
        ModelResponse::text("second"),
    ]))
    .build()
    .unwrap();
    let first = agent.prompt("one").await;
    let mut kept = first.messages;
    kept.push(Message::user("two"));
    let second = agent.run(kept).await;
    let texts: Vec<&str> = second.messages.iter().map(|m| m.text()).collect();
    assert_eq!(texts, ["test", "one", "first", "two", "second"]);
}

#[tokio::test]
async fn streamed_and_complete_runs_produce_identical_transcripts() {
    let script = r#"[
      {"text": "Let me look — ünïcode.", "tool_calls": [{"id": "c1", "name": "count", "arguments": {"key": "a"}},
                                                        {"id": "c2", "name": "count", "arguments": {"key": "b"}}]},
      {"text": "All done, with a longer final answer."}
    ]"#;
    let run = |stream: bool| async move {
        let deltas = Arc::new(Mutex::new(String::new()));
        let d2 = deltas.clone();
        let agent = builder(ScriptedModel::from_json(script).unwrap())
            .tool(counter("count", Arc::new(AtomicU32::new(0))))
            .stream(stream)
            .on_event(move |e| {
                if let Event::TextDelta { text, .. } = e {
                    d2.lock().unwrap().push_str(text);
                }
            })
            .build()
            .unwrap();
        let out = agent.prompt("go").await;
        let deltas = deltas.lock().unwrap().clone();
        (out, deltas)
    };
    let (complete, no_deltas) = run(false).await;
    let (streamed, deltas) = run(true).await;
    assert_eq!(complete.messages, streamed.messages);
    assert!(no_deltas.is_empty());
    assert_eq!(
        deltas,
        "Let me look — ünïcode.All done, with a longer final answer."
    );
}

#[tokio::test]
async fn events_cover_the_whole_run_and_run_stream_ends_with_the_outcome() {
    let agent = builder(scripted(vec![
        calls(vec![call("count", json!({"key": "a"}))]),
        ModelResponse::text("done"),
    ]))
    .tool(counter("count", Arc::new(AtomicU32::new(0))))
    .build()
    .unwrap();
    let events: Vec<Event> = agent.run_stream(vec![Message::user("go")]).collect().await;
    let kinds: Vec<String> = events
        .iter()
        .map(|e| {
            serde_json::to_value(e).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "round_started",
            "tool_call_requested",
            "tool_started",
            "tool_finished",
            "round_finished",
            "round_started",
            "round_finished",
            "run_finished"
        ]
    );
    let Some(Event::RunFinished { outcome }) = events.last() else {
        panic!("last event is not run_finished")
    };
    let outcome: &Outcome = outcome;
    assert_eq!(outcome.text.as_deref(), Some("done"));
}

#[tokio::test]
async fn transcripts_round_trip_through_json() {
    let agent = builder(scripted(vec![
        calls(vec![call("count", json!({"key": "a", "f": 0.1 + 0.2}))]),
        ModelResponse::text("done"),
    ]))
    .tool(tool_fn("count", "x", |_a: Value, _c: ToolContext| async {
        Ok::<_, ToolError>(ToolOutput::data(json!({"n": 1.5e300, "s": "é\"\n"})))
    }))
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    let json = serde_json::to_string(&out.messages).unwrap();
    let back: Vec<Message> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, out.messages);
    let outcome_json = serde_json::to_string(&out).unwrap();
    let back: Outcome = serde_json::from_str(&outcome_json).unwrap();
    assert_eq!(back, out);
}

/// A model whose stream breaks after some output on its first `breaks` calls.
struct Breaking {
    breaks: AtomicU32,
}

#[async_trait::async_trait]
impl Model for Breaking {
    fn name(&self) -> &str {
        "breaking"
    }
    async fn complete(&self, _r: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        Ok(ModelResponse::text("whole answer"))
    }
    async fn stream(
        &self,
        _r: &ModelRequest<'_>,
    ) -> Result<toolloop::model::EventStream, ModelError> {
        use toolloop::stream::StreamEvent;
        let broken = self
            .breaks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let events: Vec<Result<StreamEvent, ModelError>> = if broken {
            vec![
                Ok(StreamEvent::TextDelta("partial ".into())),
                Err(ModelError::StreamInterrupted("connection reset".into())),
            ]
        } else {
            vec![
                Ok(StreamEvent::TextDelta("whole answer".into())),
                Ok(StreamEvent::Finish(FinishReason::Stop)),
            ]
        };
        Ok(Box::pin(futures::stream::iter(events)))
    }
}

#[tokio::test]
async fn a_stream_broken_after_output_restarts_the_model_call_within_its_budget() {
    let retries = Arc::new(AtomicU32::new(0));
    let r2 = retries.clone();
    let agent = builder(Breaking {
        breaks: AtomicU32::new(2),
    })
    .stream(true)
    .on_event(move |e| {
        if let Event::ModelRetry { .. } = e {
            r2.fetch_add(1, Ordering::SeqCst);
        }
    })
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(
        out.text.as_deref(),
        Some("whole answer"),
        "no partial text kept"
    );
    assert_eq!(retries.load(Ordering::SeqCst), 2);
    assert_eq!(out.rounds, 1, "a restart is not a new round");

    let agent = builder(Breaking {
        breaks: AtomicU32::new(3),
    })
    .stream(true)
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::ModelError);
    assert!(
        out.error
            .unwrap()
            .message
            .contains("broke after delivering output")
    );
}

#[tokio::test]
async fn every_result_is_capped_and_echoed_names_are_shortened() {
    let huge = "x".repeat(1_000_000);
    let count = Arc::new(AtomicU32::new(0));
    let mut near_miss = ModelResponse::text("<PTK_CALL>oops</PTK_CALL>");
    near_miss.malformed_call = Some(format!("Your tool call could not be read: {huge}"));
    near_miss.finish_reason = FinishReason::MalformedToolCall;
    let reasons = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = reasons.clone();
    let agent = builder(scripted(vec![
        near_miss,
        calls(vec![
            // An unknown tool whose name is a megabyte.
            call(&huge, json!({})),
            // Arguments failing the schema, quoted back by the validator.
            call("count", json!({"key": [huge.clone()]})),
            ToolCall::from_raw_arguments("c3".into(), huge.clone(), &format!("{{\"{huge}")),
        ]),
        ModelResponse::text("done"),
    ]))
    .tool(counter("count", count.clone()))
    .config(LoopConfig {
        max_result_chars: 500,
        invalid_calls: InvalidCallPolicy::Feedback { budget: 10 },
        ..LoopConfig::default()
    })
    .on_event(move |e| {
        if let Event::InvalidToolCall { reason, .. } | Event::MalformedToolCall { reason, .. } = e {
            seen.lock().unwrap().push(reason.clone());
        }
    })
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(out.tool_calls.len(), 3);
    for c in &out.tool_calls {
        assert_eq!(c.status, CallStatus::Invalid);
        assert!(c.content.chars().count() <= 500, "{}", c.content.len());
    }
    assert!(out.tool_calls[0].content.contains("Unknown tool `xxx"));
    for m in &out.messages {
        if let Message::Tool(r) = m {
            assert!(r.content.chars().count() <= 500, "{}", r.content.len());
        }
        if let Message::User { content, .. } = m {
            assert!(content.chars().count() <= 500, "{}", content.len());
        }
    }
    let reasons = reasons.lock().unwrap();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    for r in reasons.iter() {
        assert!(r.chars().count() <= 500, "{}", r.len());
    }
    assert_valid_transcript(&out.messages);
}

#[tokio::test]
async fn an_answer_cut_by_the_output_limit_is_marked_truncated_with_its_text() {
    let mut cut = ModelResponse::text("The three steps are: first, mix; second,");
    cut.finish_reason = FinishReason::Length;
    let agent = builder(scripted(vec![cut])).build().unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::OutputTruncated);
    assert!(!out.success);
    assert_eq!(
        out.text.as_deref(),
        Some("The three steps are: first, mix; second,")
    );
    let err = out.error.unwrap();
    assert_eq!(err.code, ErrorCode::OutputTruncated);
    assert!(
        err.message.contains("output-token limit"),
        "{}",
        err.message
    );
    // A complete answer is still an answer.
    let agent = builder(scripted(vec![ModelResponse::text("whole")]))
        .build()
        .unwrap();
    assert_eq!(agent.prompt("go").await.stop_reason, StopReason::Answered);
}

#[tokio::test]
async fn colliding_call_ids_get_unique_replacements_that_replay_identically() {
    use toolloop::engine::Machine;
    use toolloop::journal::{Journal, MemoryJournal};
    use toolloop::transcript::check_transcript;
    let with_id = |id: &str, key: &str| {
        let mut c = call("count", json!({ "key": key }));
        c.id = id.into();
        c
    };
    let count = Arc::new(AtomicU32::new(0));
    let journal = Arc::new(MemoryJournal::new());
    let replaced = Arc::new(Mutex::new(Vec::new()));
    let seen = replaced.clone();
    let agent = builder(scripted(vec![
        // Twice the same id in one reply.
        calls(vec![
            with_id("call_1", "a"),
            with_id("call_1", "b"),
            with_id("x-2", "c"),
        ]),
        // An id already in the conversation, and a nine-character one used twice.
        calls(vec![
            with_id("call_1", "d"),
            with_id("aB3dE5gH1", "e"),
            with_id("aB3dE5gH1", "f"),
        ]),
        ModelResponse::text("done"),
    ]))
    .tool(counter("count", count.clone()))
    .journal(journal.clone())
    .on_event(move |e| {
        if let Event::CallIdReplaced { original, id, .. } = e {
            seen.lock().unwrap().push((original.clone(), id.clone()));
        }
    })
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(count.load(Ordering::SeqCst), 6, "every call ran");
    let ids: Vec<&str> = out.tool_calls.iter().map(|c| c.call.id.as_str()).collect();
    assert_eq!(ids[0], "call_1");
    assert_eq!(ids[4], "aB3dE5gH1");
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 6, "{ids:?}");
    // The replacements keep the id's shape.
    assert_eq!(ids[1], "call_1_2");
    assert_eq!(ids[5].len(), 9, "{ids:?}");
    assert!(ids[5].bytes().all(|b| b.is_ascii_alphanumeric()), "{ids:?}");
    assert_eq!(
        replaced.lock().unwrap().len(),
        3,
        "{:?}",
        replaced.lock().unwrap()
    );
    assert_valid_transcript(&out.messages);
    // Reloading the transcript drops nothing.
    assert!(check_transcript(&out.messages).is_empty());
    // The run log replays to the same transcript.
    let records = journal.load(out.run_id.as_deref().unwrap()).await.unwrap();
    let machine = Machine::replay(
        Arc::new(agent.config().clone()),
        Default::default(),
        agent.toolbox().catalog().clone(),
        records,
    )
    .unwrap();
    assert_eq!(machine.messages(), &out.messages[..]);
}

#[tokio::test]
async fn usage_a_server_did_not_report_is_unknown_never_zero() {
    let with_usage = |mut r: ModelResponse| {
        r.usage = Some(Usage {
            input_tokens: 100,
            output_tokens: 10,
            ..Usage::default()
        });
        r
    };
    // No call reports usage: usage and cost are unknown, even for a priced model.
    let agent = builder(
        scripted(vec![
            calls(vec![call("count", json!({"key": "a"}))]),
            ModelResponse::text("done"),
        ])
        .named("gpt-4o"),
    )
    .tool(counter("count", Arc::new(AtomicU32::new(0))))
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.usage, None);
    assert_eq!(out.calls_without_usage, 2);
    assert_eq!(out.cost, None);
    let json = serde_json::to_value(&out).unwrap();
    assert_eq!(json["usage"], Value::Null);
    assert_eq!(json["cost"], Value::Null);

    // One of two calls reports: the sum counts what was reported, the cost is unknown.
    let agent = builder(
        scripted(vec![
            with_usage(calls(vec![call("count", json!({"key": "a"}))])),
            ModelResponse::text("done"),
        ])
        .named("gpt-4o"),
    )
    .tool(counter("count", Arc::new(AtomicU32::new(0))))
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.usage.unwrap().input_tokens, 100);
    assert_eq!(out.calls_without_usage, 1);
    assert_eq!(out.cost, None);

    // No model call succeeded: nothing is known, the cost is not 0.
    let model = ScriptedModel::from_json(r#"[{"error": "HTTP 503"}]"#)
        .unwrap()
        .named("gpt-4o");
    let out = builder(model).build().unwrap().prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::ModelError);
    assert_eq!(out.usage, None);
    assert_eq!(out.cost, None);

    // Outcomes written before usage could be unknown still read back.
    let mut old = serde_json::to_value(&out).unwrap();
    old["usage"] = json!({"input_tokens": 3, "output_tokens": 1});
    old.as_object_mut().unwrap().remove("calls_without_usage");
    let back: Outcome = serde_json::from_value(old).unwrap();
    assert_eq!(back.usage.unwrap().input_tokens, 3);
    assert_eq!(back.calls_without_usage, 0);
}

/// A timeout too large to add to the clock is no deadline, never a panic.
#[tokio::test]
async fn a_timeout_beyond_the_clock_is_no_deadline() {
    let count = Arc::new(AtomicU32::new(0));
    let agent = builder(scripted(vec![
        calls(vec![call("count", json!({"key": "a"}))]),
        ModelResponse::text("done"),
    ]))
    .tool(counter("count", count.clone()))
    .timeout(Duration::MAX)
    .build()
    .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// A secret the summarising model repeats in a compaction's summary is redacted, as in an
/// answer: the requests that follow never carry it.
#[tokio::test]
async fn a_secret_in_a_compaction_summary_is_redacted() {
    use toolloop::context::{ContextOverflow, ContextPolicy};
    use toolloop::providers::scripted::ScriptStep;
    const SECRET: &str = "sk-summary-secret-0123456789abcdef";
    let overflow = ContextOverflow::new(400, Some("context_length_exceeded".into()), "too long");
    let mut steps: Vec<ScriptStep> = (0..4)
        .map(|i| ScriptStep::Respond(calls(vec![call("count", json!({"key": format!("k{i}")}))])))
        .collect();
    steps.push(ScriptStep::Fail(ModelError::ContextOverflow(overflow)));
    steps.push(ScriptStep::Respond(ModelResponse::text("done")));
    // The text of every request.
    let model = Recording::new(Arc::new(ScriptedModel::from_steps(steps)), |r| {
        let text = r.messages.iter().map(|m| m.text()).collect::<Vec<_>>();
        text.join("\n")
    });
    let sent = model.seen();
    let summariser = scripted(vec![ModelResponse::text(format!(
        "The task so far; the key is {SECRET}."
    ))]);
    let mut redactor = toolloop::redact::Redactor::new();
    redactor.add_secret(SECRET);
    let agent = builder(model)
        .tool(counter("count", Arc::new(AtomicU32::new(0))))
        .context(ContextPolicy {
            window: None,
            keep_rounds: 0,
            ..ContextPolicy::default()
        })
        .context_model(summariser)
        .redact(redactor)
        .build()
        .unwrap();
    let out = agent.prompt("go").await;
    assert_eq!(out.stop_reason, StopReason::Answered, "{:?}", out.error);
    let sent = sent.lock().unwrap();
    let last = sent.last().unwrap();
    assert!(last.contains("the key is [redacted]"), "{last}");
    assert!(sent.iter().all(|s| !s.contains(SECRET)));
}
