//! The context policy against the mock's context window, on the four wire APIs, streamed and
//! not: long runs finish inside the window (results cleared, the conversation compacted by a
//! summarising call), and a request the provider refuses for its size is compacted and retried.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use toolloop::agent::AgentBuilder;
use toolloop::config::LoopConfig;
use toolloop::context::ContextPolicy;
use toolloop::event::Event;
use toolloop::model::Model;
use toolloop::outcome::StopReason;
use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
use toolloop::providers::gemini::{GeminiConfig, GeminiModel};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::transport::http::{HttpTransport, RetryPolicy};
use toolloop_mock::{MockOptions, start};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Chat,
    Responses,
    Anthropic,
    Gemini,
}

const PROTOS: [Proto; 4] = [
    Proto::Chat,
    Proto::Responses,
    Proto::Anthropic,
    Proto::Gemini,
];

fn transport() -> HttpTransport {
    let mut t = HttpTransport::new();
    t.retry = RetryPolicy {
        max_retries: 2,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(2),
    };
    t
}

fn model(proto: Proto, base: &str, scenario: &str) -> Box<dyn Model> {
    match proto {
        Proto::Chat => {
            let mut c = OpenAiConfig::new(scenario).with_base_url(format!("{base}/v1"));
            c.transport = transport();
            Box::new(OpenAiModel::new(c))
        }
        Proto::Responses => {
            let mut c = ResponsesConfig::new(scenario).with_base_url(format!("{base}/v1"));
            c.transport = transport();
            Box::new(ResponsesModel::new(c))
        }
        Proto::Anthropic => {
            let mut c = AnthropicConfig::new(scenario);
            c.base_url = base.into();
            c.transport = transport();
            Box::new(AnthropicModel::new(c))
        }
        Proto::Gemini => {
            let mut c = GeminiConfig::new(scenario);
            c.base_url = base.into();
            c.transport = transport();
            Box::new(GeminiModel::new(c))
        }
    }
}

/// A tool whose every result is `bytes` long.
fn big_results(bytes: usize) -> impl toolloop::tool::Tool {
    tool_fn(
        "fetch",
        "Fetches a page.",
        move |_: serde_json::Value, ctx: ToolContext| async move {
            let head = format!("page for call {}: ", ctx.call_id);
            Ok::<_, ToolError>(ToolOutput::text(format!(
                "{head}{}",
                &"lorem ipsum ".repeat(bytes / 12 + 1)[..bytes - head.len()]
            )))
        },
    )
}

fn config(rounds: u32, stream: bool) -> LoopConfig {
    LoopConfig {
        max_rounds: rounds + 10,
        max_tool_calls: rounds + 10,
        // The mock calls the one tool with the same arguments every round.
        detect_duplicates: false,
        stream,
        ..LoopConfig::default()
    }
}

/// A run of 300 rounds whose 2 KB results would fill an 8,000-token window about ten times
/// over finishes on every API, streamed and not: no request is refused, old results are
/// cleared, the conversation is compacted by summarising calls (one mock summary each, counted
/// apart in the outcome), and the mock's task count goes on across the summaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_rounds_fit_an_8000_token_window_on_every_api() {
    const ROUNDS: u32 = 300;
    const WINDOW: u64 = 8000;
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let scenario = format!("mock:rounds={ROUNDS},window={WINDOW}");
    for proto in PROTOS {
        for stream in [false, true] {
            let before = server.stats();
            let compactions = Arc::new(Mutex::new(Vec::new()));
            let seen = compactions.clone();
            let agent = AgentBuilder::new(Arc::from(model(proto, &base, &scenario)))
                .tool(big_results(2048))
                .config(config(ROUNDS, stream))
                .context(ContextPolicy {
                    window: Some(WINDOW),
                    // The machine's own stages, on every API (the providers' own are proved
                    // in context_native.rs).
                    native: false,
                    ..ContextPolicy::default()
                })
                .on_event(move |e| {
                    if let Event::ContextCompacted {
                        tokens_before,
                        tokens_after,
                        ..
                    } = e
                    {
                        seen.lock().unwrap().push((*tokens_before, *tokens_after));
                    }
                })
                .build()
                .unwrap();
            let outcome = agent.prompt("Fetch the pages, one per round.").await;
            let label = format!("{proto:?} stream={stream}");
            assert_eq!(
                outcome.stop_reason,
                StopReason::Answered,
                "{label}: {:?}",
                outcome.error
            );
            assert_eq!(outcome.rounds, ROUNDS + 1, "{label}");
            assert_eq!(
                outcome.text.as_deref(),
                Some(format!("Done. I saw {ROUNDS} tool results in {ROUNDS} rounds.").as_str()),
                "{label}"
            );
            // The transcript is whole; what was sent is the compacted view.
            assert_eq!(outcome.tool_calls.len(), ROUNDS as usize, "{label}");
            let full_results = outcome
                .messages
                .iter()
                .filter(|m| matches!(m, toolloop::Message::Tool(r) if r.content.len() > 2048))
                .count();
            assert_eq!(full_results, ROUNDS as usize, "{label}");
            let ctx = outcome.context.as_ref().expect("the policy's report");
            assert!(ctx.view_len() < outcome.messages.len() / 4, "{label}");
            let after = server.stats();
            assert_eq!(
                after.context_refusals - before.context_refusals,
                0,
                "{label}"
            );
            let summaries = after.summaries - before.summaries;
            let compacted = compactions.lock().unwrap().clone();
            assert!(summaries >= 2, "{label}: {summaries} summaries");
            assert_eq!(summaries, u64::from(ctx.compactions), "{label}");
            assert_eq!(compacted.len() as u64, summaries, "{label}");
            for (before, after) in &compacted {
                assert!(
                    *before > WINDOW * 7 / 10 && *after < WINDOW / 2,
                    "{label}: {before} -> {after}"
                );
            }
            // The summariser's tokens are counted apart from the run's.
            let summariser = ctx.usage.expect("the summariser's usage");
            assert!(summariser.input_tokens > 0, "{label}");
            assert_eq!(
                after.requests - before.requests,
                u64::from(ROUNDS) + 1 + summaries,
                "{label}: one request per round and per summary"
            );
        }
    }
    server.shutdown().await;
}

/// With no window known to the policy, nothing is compacted until the provider refuses a
/// request for its size: each refusal is compacted and the call retried once, and the run
/// finishes; a refusal is never retried as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_compacted_and_retried_on_every_api() {
    const ROUNDS: u32 = 40;
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let scenario = format!("mock:rounds={ROUNDS},window=6000");
    for proto in PROTOS {
        for stream in [false, true] {
            let before = server.stats();
            let agent = AgentBuilder::new(Arc::from(model(proto, &base, &scenario)))
                .tool(big_results(2048))
                .config(config(ROUNDS, stream))
                .context(ContextPolicy {
                    keep_rounds: 0,
                    ..ContextPolicy::default()
                })
                .build()
                .unwrap();
            let outcome = agent.prompt("Fetch the pages.").await;
            let label = format!("{proto:?} stream={stream}");
            assert_eq!(
                outcome.stop_reason,
                StopReason::Answered,
                "{label}: {:?}",
                outcome.error
            );
            let after = server.stats();
            let refusals = after.context_refusals - before.context_refusals;
            let summaries = after.summaries - before.summaries;
            assert!(refusals >= 1, "{label}");
            assert_eq!(refusals, summaries, "{label}: one compaction per refusal");
            assert_eq!(
                after.requests - before.requests,
                u64::from(ROUNDS) + 1 + refusals + summaries,
                "{label}: each refused call is made once more, after its compaction"
            );
        }
    }
    server.shutdown().await;
}

/// A request that no compaction can shrink (its one user message is over the window) stops
/// the run with `context_exhausted`, after one refusal, its transcript kept.
#[tokio::test]
async fn a_request_that_cannot_shrink_ends_the_run_as_exhausted() {
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    for proto in PROTOS {
        let before = server.stats();
        let agent = AgentBuilder::new(Arc::from(model(proto, &base, "mock:window=1000")))
            .tool(big_results(100))
            .context(ContextPolicy::default())
            .build()
            .unwrap();
        let outcome = agent.prompt("x".repeat(20_000)).await;
        assert_eq!(
            outcome.stop_reason,
            StopReason::ContextExhausted,
            "{proto:?}"
        );
        assert!(!outcome.success);
        assert_eq!(outcome.messages.len(), 1, "{proto:?}");
        let after = server.stats();
        assert_eq!(after.requests - before.requests, 1, "{proto:?}");
        assert_eq!(
            after.context_refusals - before.context_refusals,
            1,
            "{proto:?}"
        );
    }
    server.shutdown().await;
}
