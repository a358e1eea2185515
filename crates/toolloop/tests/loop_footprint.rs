//! What one run in flight costs a process that holds thousands of them: every run waiting on
//! its model holds its whole future (the state of the loop's nested steps, sized by the largest
//! step), so that future is kept small. The steps only some runs take (listing tool sources,
//! opening a run log, approvals, compaction, the round limit hook, the run's end) and the state
//! of a streamed reply are boxed, a step's future is pinned once rather than moved into
//! `guard`, the public entry points hand their arguments straight to the one future, and no
//! value is held twice (an `async fn` taking it by `mut` value, or a local borrowed before an
//! await and moved before the next, keeps a slot of its own all run long).

use serde_json::{Value, json};
use toolloop::agent::Agent;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};

/// The largest a run's future may be in this (unoptimised) test build, in bytes. Measured at
/// 2,296 when the bound was set, where the build before made it 8,792 (release builds gave the
/// same sizes). At 10,000 runs in flight, every kilobyte here is 10 MB of heap.
const RUN_FUTURE_BOUND: usize = 3_000;

#[tokio::test]
async fn a_run_in_flight_holds_a_small_future_and_finishes() {
    let server = toolloop_mock::start(toolloop_mock::MockOptions::default())
        .await
        .expect("mock starts");
    let config = OpenAiConfig::new("mock:rounds=2,parallel=2,distinct=true")
        .with_base_url(format!("{}/v1", server.base_url()));
    let agent =
        Agent::builder(OpenAiModel::new(config))
            .tool(
                tool_fn(
                    "echo",
                    "Echoes its input.",
                    |args: Value, _: ToolContext| async move {
                        Ok::<_, ToolError>(ToolOutput::data(args))
                    },
                )
                .with_parameters(json!({
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"]
                })),
            )
            .build()
            .expect("one tool");

    let run = agent.prompt("go");
    let size = std::mem::size_of_val(&run);
    assert!(
        size <= RUN_FUTURE_BOUND,
        "a run's future is {size} bytes, over the {RUN_FUTURE_BOUND} allowed: box the step that grew"
    );
    // The very future measured is the run: it finishes, its calls answered.
    let outcome = run.await;
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.rounds, 3);
    assert_eq!(outcome.tool_calls.len(), 4);
    assert!(outcome.tool_calls.iter().all(|c| c.success()));
    server.shutdown().await;
}
