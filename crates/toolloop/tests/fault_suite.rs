//! The fault suite: many loops at once against the mock over real HTTP, in all four protocols (OpenAI
//! Chat Completions and Responses, Anthropic, Gemini),
//! streamed and not, with a fifth of the responses faults of every kind (rate limits with
//! `Retry-After`, 500, 503, 529, connection resets before and during the body, streams cut in
//! the middle of a tool call, malformed JSON, a slow first byte). Every loop must end with the
//! right answer and a valid transcript, and no tool call may run twice.
#![cfg(feature = "http")]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Deserialize;
use toolloop::agent::Agent;
use toolloop::config::LoopConfig;
use toolloop::event::Event;
use toolloop::message::Message;
use toolloop::model::Model;
use toolloop::outcome::Outcome;
use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
use toolloop::providers::gemini::{GeminiConfig, GeminiModel};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::transport::http::{HttpTransport, RetryPolicy};
use toolloop_mock::{FaultKind, MockOptions, start};

/// The protocols, by the number `loop_agent` takes.
const PROTOCOLS: [&str; 4] = ["openai", "anthropic", "gemini", "openai-responses"];
/// Loops run at once (a multiple of 8: four protocols, streamed and not).
const LOOPS: usize = 208;
const ROUNDS: usize = 3;
const PARALLEL: usize = 2;
/// The whole suite must end within this.
const BOUND: Duration = Duration::from_secs(120);

#[derive(Deserialize, JsonSchema)]
struct Query {
    /// What to look up.
    q: String,
}

/// What the suite counts while the loops run.
#[derive(Default)]
struct Counters {
    /// Executions per call id, over every loop.
    executions: Mutex<HashMap<String, u32>>,
    /// Model calls whose stream broke after output and were started again.
    restarts: AtomicU64,
}

fn transport() -> HttpTransport {
    let mut t = HttpTransport::new();
    // Small waits and enough retries: at a 20 % fault rate, ten faults in a row on one request
    // happen about once in ten million.
    t.retry = RetryPolicy {
        max_retries: 10,
        base_delay: Duration::from_millis(2),
        max_delay: Duration::from_millis(20),
    };
    // Shorter than the mock's slow_delay: a slow first byte times out and is retried, as often
    // as any other fault.
    t.first_byte_timeout = Duration::from_millis(400);
    t.first_byte_retries = 10;
    t
}

fn loop_agent(
    protocol: usize,
    base: &str,
    scenario: &str,
    stream: bool,
    counters: &Arc<Counters>,
) -> Agent {
    match protocol {
        0 => {
            let mut c = OpenAiConfig::new(scenario).with_base_url(format!("{base}/v1"));
            c.api_key = Some("test".into());
            c.transport = transport();
            agent(OpenAiModel::new(c), stream, counters)
        }
        1 => {
            let mut c = AnthropicConfig::new(scenario);
            c.base_url = base.to_string();
            c.api_key = Some("test".into());
            c.transport = transport();
            agent(AnthropicModel::new(c), stream, counters)
        }
        2 => {
            let mut c = GeminiConfig::new(scenario);
            c.base_url = base.to_string();
            c.api_key = Some("test".into());
            c.transport = transport();
            agent(GeminiModel::new(c), stream, counters)
        }
        _ => {
            let mut c = ResponsesConfig::new(scenario).with_base_url(format!("{base}/v1"));
            c.api_key = Some("test".into());
            c.transport = transport();
            // A reasoning model: the mock refuses a round whose reasoning item was not sent back.
            c.reasoning = Some(serde_json::json!({"effort": "low"}));
            agent(ResponsesModel::new(c), stream, counters)
        }
    }
}

fn agent(model: impl Model + 'static, stream: bool, counters: &Arc<Counters>) -> Agent {
    let tool = |name: &'static str| {
        let counters = counters.clone();
        tool_fn(
            name,
            "Looks something up.",
            move |query: Query, ctx: ToolContext| {
                let counters = counters.clone();
                async move {
                    *counters
                        .executions
                        .lock()
                        .unwrap()
                        .entry(ctx.call_id.clone())
                        .or_insert(0) += 1;
                    Ok::<_, ToolError>(ToolOutput::text(format!("{name}: {} found", query.q)))
                }
            },
        )
    };
    let config = LoopConfig {
        stream,
        // The mock asks for the same calls every round; they are not the loop's concern here.
        detect_duplicates: false,
        // A stream that broke after output is started again; at this fault rate, more than
        // twice in a row on one call is rare but possible.
        stream_restarts: 5,
        ..LoopConfig::default()
    };
    Agent::builder(model)
        .tool(tool("lookup"))
        .tool(tool("fetch"))
        .config(config)
        .on_event({
            let counters = counters.clone();
            move |event| {
                if matches!(event, Event::ModelRetry { .. }) {
                    counters.restarts.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .build()
        .expect("agent builds")
}

/// Every tool call of an assistant turn has exactly one result, in the messages right after
/// that turn and before anything else; no result answers a call that was not made.
fn check_transcript(messages: &[Message]) -> Result<(), String> {
    let mut open: Option<HashSet<&str>> = None;
    for (i, message) in messages.iter().enumerate() {
        match message {
            Message::Tool(result) => {
                let Some(waiting) = open.as_mut() else {
                    return Err(format!("message {i}: a result with no call before it"));
                };
                if !waiting.remove(result.call_id.as_str()) {
                    return Err(format!(
                        "message {i}: result for `{}`, which is not an unanswered call of the \
                         turn before",
                        result.call_id
                    ));
                }
            }
            other => {
                if let Some(waiting) = open.take()
                    && !waiting.is_empty()
                {
                    return Err(format!(
                        "message {i}: calls left without results: {waiting:?}"
                    ));
                }
                if let Message::Assistant(turn) = other
                    && !turn.tool_calls.is_empty()
                {
                    open = Some(turn.tool_calls.iter().map(|c| c.id.as_str()).collect());
                }
            }
        }
    }
    match open {
        Some(waiting) if !waiting.is_empty() => Err(format!(
            "the transcript ends with calls left without results: {waiting:?}"
        )),
        _ => Ok(()),
    }
}

fn check_outcome(outcome: &Outcome) -> Result<(), String> {
    let want = format!(
        "Done. I saw {} tool results in {ROUNDS} rounds.",
        ROUNDS * PARALLEL
    );
    if outcome.text.as_deref() != Some(want.as_str()) {
        return Err(format!(
            "answer {:?} (stop {:?}, error {:?}), expected {want:?}",
            outcome.text, outcome.stop_reason, outcome.error
        ));
    }
    check_transcript(&outcome.messages)?;
    let executed = outcome.executed_calls().count();
    if executed != ROUNDS * PARALLEL {
        return Err(format!(
            "{executed} calls executed, expected {}",
            ROUNDS * PARALLEL
        ));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loops_survive_a_fifth_of_faults() {
    let started = Instant::now();
    let server = start(MockOptions::default()).await.expect("mock starts");
    let base = server.base_url();
    let scenario = format!(
        "mock:rounds={ROUNDS},parallel={PARALLEL},faults=0.2,seed=7,retry_after=5ms,\
         slow_delay=1s"
    );
    let counters = Arc::new(Counters::default());

    let loops = (0..LOOPS).map(|i| {
        let protocol = i % PROTOCOLS.len();
        let stream = (i / PROTOCOLS.len()) % 2 == 1;
        let agent = loop_agent(protocol, &base, &scenario, stream, &counters);
        async move {
            // A prompt of its own gives each loop its own fault draws.
            let outcome = agent
                .prompt(format!("Loop {i}: look up what you need, then answer."))
                .await;
            (i, protocol, stream, outcome)
        }
    });
    let results = tokio::time::timeout(BOUND, futures::future::join_all(loops))
        .await
        .expect("the suite ends in time");

    let stats = server.stats();
    let elapsed = started.elapsed();
    let counts = counters.executions.lock().unwrap().clone();
    let restarts = counters.restarts.load(Ordering::Relaxed);
    println!(
        "fault suite: {LOOPS} loops ({} requests) in {elapsed:.2?}; {} faults injected ({:.1} % \
         of requests): {}; {restarts} streamed model calls restarted after output",
        stats.requests,
        stats.faults.total(),
        100.0 * stats.faults.total() as f64 / stats.requests.max(1) as f64,
        stats.faults
    );

    let failures: Vec<String> = results
        .iter()
        .filter_map(|(i, protocol, stream, outcome)| {
            check_outcome(outcome)
                .err()
                .map(|e| format!("loop {i} ({}, stream {stream}): {e}", PROTOCOLS[*protocol]))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {LOOPS} loops failed:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );

    // No tool call ran twice, and every executed call was counted.
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "calls run more than once: {twice:?}");
    assert_eq!(counts.len(), LOOPS * ROUNDS * PARALLEL);

    // The faults really happened: every kind, at about the asked share.
    assert_eq!(stats.rejected, 0, "no request was malformed");
    for kind in FaultKind::ALL {
        assert!(
            stats.faults.get(kind) > 0,
            "no `{kind}` fault was injected: {}",
            stats.faults
        );
    }
    let share = stats.faults.total() as f64 / stats.requests as f64;
    assert!((0.12..0.30).contains(&share), "fault share {share}");
    assert!(restarts > 0, "no stream broke after output");
    assert!(elapsed < BOUND);
    server.shutdown().await;
}
