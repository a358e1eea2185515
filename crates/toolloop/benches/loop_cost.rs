//! The loop's own cost per round as history grows (10, 100 and 1000 rounds).
//!
//! An in-process model answers instantly (one tool call per round, then a final answer) and the
//! tool returns at once, so what is measured is the loop itself: the state machine, the driver,
//! result serialization, duplicate detection and transcript bookkeeping. A round must not cost
//! more as the conversation grows: the figure to watch is the per-round cost at 1000 rounds as
//! a ratio to the per-round cost at 10 rounds (the baseline, measured in the same run).
//!
//! Then what a context policy adds per round at 300 rounds (the view kept beside the
//! transcript, the estimate kept up to date, and old results cleared in batches of
//! `keep_rounds`; no compaction, which costs a model call): the per-round cost with the policy
//! against without, best of several runs each (the target is at most 5 % of the loop's own
//! per-round cost).
//!
//! Run: `cargo bench -p toolloop --bench loop_cost`
//!
//! For a profiler, `LOOP_COST_SIDE=with` (or `without`, `view`) runs only that side of the
//! context policy's comparison (300 rounds, `LOOP_COST_RUNS` runs, default 20) and prints its
//! per-round cost: `LOOP_COST_SIDE=with valgrind --tool=callgrind target/release/deps/loop_cost-…`.

use async_trait::async_trait;
use serde_json::{Value, json};
use std::time::Instant;
use toolloop::agent::Agent;
use toolloop::context::ContextPolicy;
use toolloop::message::{Message, ToolCall};
use toolloop::model::{Model, ModelError, ModelRequest, ModelResponse};
use toolloop::tool::{Tool, ToolContext, ToolError, ToolOutput};
use toolloop::usage::Usage;

/// Calls `echo` with a fresh argument every round until `rounds`, then answers.
struct InstantModel {
    rounds: usize,
}

#[async_trait]
impl Model for InstantModel {
    fn name(&self) -> &str {
        "bench"
    }
    async fn complete(&self, r: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        // The round number comes from the tail of the transcript, in O(1).
        let round = r.messages.len() / 2;
        let mut resp = if round < self.rounds {
            ModelResponse::tool_calls(vec![ToolCall {
                id: format!("call_{round}"),
                name: "echo".into(),
                arguments: json!({"n": round}),
                invalid_arguments: None,
                provider_data: None,
            }])
        } else {
            ModelResponse::text("done")
        };
        resp.usage = Some(Usage {
            input_tokens: 10,
            output_tokens: 2,
            ..Usage::default()
        });
        Ok(resp)
    }
}

struct Echo {
    schema: Value,
}

#[async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Echoes n."
    }
    fn parameters(&self) -> &Value {
        &self.schema
    }
    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::data(args))
    }
}

fn per_round_ns(rt: &tokio::runtime::Runtime, rounds: usize, reps: usize) -> f64 {
    per_round_ns_with(rt, rounds, reps, None)
}

fn per_round_ns_with(
    rt: &tokio::runtime::Runtime,
    rounds: usize,
    reps: usize,
    context: Option<ContextPolicy>,
) -> f64 {
    let mut builder = Agent::builder(InstantModel { rounds });
    if let Some(policy) = context {
        builder = builder.context(policy);
    }
    let agent = builder
        .tool(Echo {
            schema: json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        })
        .max_rounds(rounds as u32 + 1)
        .max_tool_calls(rounds as u32)
        .build()
        .expect("one tool");
    let mut best = f64::MAX;
    for _ in 0..reps {
        let start = Instant::now();
        let out = rt.block_on(agent.run(vec![Message::user("go")]));
        let elapsed = start.elapsed().as_nanos() as f64;
        assert_eq!(out.rounds as usize, rounds + 1, "{:?}", out.error);
        best = best.min(elapsed / (rounds + 1) as f64);
    }
    best
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // The context policy's own cost: the view, the estimate, the spill check (nothing is
    // spilled) and the clearing of old results, in batches (every 8 rounds, the 8 rounds
    // before the last 8), with no window (no compaction).
    let policy = ContextPolicy {
        window: None,
        keep_rounds: 8,
        ..ContextPolicy::default()
    };
    // The same without clearing: the view and the estimate alone.
    let view_only = ContextPolicy {
        keep_rounds: 0,
        ..policy.clone()
    };
    if let Ok(side) = std::env::var("LOOP_COST_SIDE") {
        let runs = std::env::var("LOOP_COST_RUNS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(20);
        let context = match side.as_str() {
            "with" => Some(policy),
            "view" => Some(view_only),
            "without" => None,
            other => panic!("LOOP_COST_SIDE is `with`, `view` or `without`, not `{other}`"),
        };
        let ns = per_round_ns_with(&rt, 300, runs, context);
        println!("{side}: {:.2} µs per round at 300 rounds", ns / 1000.0);
        return;
    }
    // warm up
    per_round_ns(&rt, 100, 3);
    let base = per_round_ns(&rt, 10, 200);
    println!("loop cost per round (best of several runs, current-thread runtime)");
    println!(
        "{:>8} {:>14} {:>18}",
        "rounds", "µs per round", "ratio to 10 rounds"
    );
    for (rounds, reps) in [(10usize, 200usize), (100, 50), (1000, 10)] {
        let ns = if rounds == 10 {
            base
        } else {
            per_round_ns(&rt, rounds, reps)
        };
        println!("{rounds:>8} {:>14.2} {:>18.2}", ns / 1000.0, ns / base);
    }
    let (mut without, mut with, mut viewed) = (f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..5 {
        without = without.min(per_round_ns_with(&rt, 300, 20, None));
        with = with.min(per_round_ns_with(&rt, 300, 20, Some(policy.clone())));
        viewed = viewed.min(per_round_ns_with(&rt, 300, 20, Some(view_only.clone())));
    }
    println!("context policy at 300 rounds (keep_rounds 8, no compaction)");
    println!(
        "  without {:.2} µs per round, with {:.2} µs per round: +{:.2} µs ({:+.1} %)",
        without / 1000.0,
        with / 1000.0,
        (with - without) / 1000.0,
        (with - without) * 100.0 / without
    );
    println!(
        "  of which the view and the estimate alone (keep_rounds 0): +{:.2} µs ({:+.1} %)",
        (viewed - without) / 1000.0,
        (viewed - without) * 100.0 / without
    );
}
