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
//! per-round cost). The echoed results (`{"n":…}`) are shorter than a cleared result's stub,
//! so clearing checks them and replaces none; the last line is the same comparison with
//! results of 2 KB, each replaced by its stub once it is old.
//!
//! Run: `cargo bench -p toolloop --bench loop_cost`
//!
//! For a profiler, `LOOP_COST_SIDE=with` (or `without`, `view`, `with-2k`, `without-2k`) runs
//! only that side of the context policy's comparison (300 rounds, `LOOP_COST_RUNS` runs,
//! default 20) and prints its per-round cost:
//! `LOOP_COST_SIDE=with valgrind --tool=callgrind target/release/deps/loop_cost-…`.

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
    /// The bytes of each result; 0: the arguments echoed (`{"n":…}`, shorter than a cleared
    /// result's stub, so clearing replaces none).
    result_bytes: usize,
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
        if self.result_bytes == 0 {
            return Ok(ToolOutput::data(args));
        }
        Ok(ToolOutput::text("r".repeat(self.result_bytes)))
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
    per_round_ns_of(rt, rounds, reps, context, 0)
}

fn per_round_ns_of(
    rt: &tokio::runtime::Runtime,
    rounds: usize,
    reps: usize,
    context: Option<ContextPolicy>,
    result_bytes: usize,
) -> f64 {
    let mut builder = Agent::builder(InstantModel { rounds });
    if let Some(policy) = context {
        builder = builder.context(policy);
    }
    let agent = builder
        .tool(Echo {
            schema: json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
            result_bytes,
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
        let (context, bytes) = match side.as_str() {
            "with" => (Some(policy), 0),
            "view" => (Some(view_only), 0),
            "without" => (None, 0),
            "with-2k" => (Some(policy), RESULT_BYTES),
            "without-2k" => (None, RESULT_BYTES),
            other => panic!(
                "LOOP_COST_SIDE is `with`, `view`, `without`, `with-2k` or `without-2k`, not \
                 `{other}`"
            ),
        };
        let ns = per_round_ns_of(&rt, 300, runs, context, bytes);
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
    let (mut without_2k, mut with_2k) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        without = without.min(per_round_ns_with(&rt, 300, 20, None));
        with = with.min(per_round_ns_with(&rt, 300, 20, Some(policy.clone())));
        viewed = viewed.min(per_round_ns_with(&rt, 300, 20, Some(view_only.clone())));
        without_2k = without_2k.min(per_round_ns_of(&rt, 300, 20, None, RESULT_BYTES));
        with_2k = with_2k.min(per_round_ns_of(
            &rt,
            300,
            20,
            Some(policy.clone()),
            RESULT_BYTES,
        ));
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
    println!(
        "  with results of {RESULT_BYTES} bytes (each old one cleared to a stub): without {:.2} µs \
         per round, with {:.2} µs per round: +{:.2} µs ({:+.1} %)",
        without_2k / 1000.0,
        with_2k / 1000.0,
        (with_2k - without_2k) / 1000.0,
        (with_2k - without_2k) * 100.0 / without_2k
    );
}

/// The bytes of each result in the comparison where clearing replaces old results with stubs.
const RESULT_BYTES: usize = 2048;
