//! What delegation costs: the same work done inline and by a sub-agent, against the mock
//! server on loopback (OpenAI adapter, real HTTP).
//!
//! Inline: one agent makes R rounds of an `echo` call, then answers (R + 1 model calls).
//! Delegated: a parent calls a sub-agent once; the sub-agent makes the same R rounds and
//! answers; the parent answers (R + 3 model calls: the parent's two are the delegation's own).
//! Runs repeat one after another on one thread, inline and delegated alternating, after a
//! warm-up. Reported, each as the median of the trials:
//! - the client's own cost per model call (client time minus the server's processing time,
//!   over the requests), inline and delegated, and their ratio: what a call costs the engine
//!   inside a child run against outside one (the target: at most 1.10);
//! - the whole run's time, and its ratio, which includes the parent's two extra model calls.
//!
//! Run: `cargo bench -p toolloop --bench delegation --features http` (add `-- R TRIALS`).

use async_trait::async_trait;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use toolloop::agent::Agent;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};
use toolloop_mock::{MockOptions, MockServer, start};

struct Echo {
    schema: Value,
}

#[async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Echoes its input."
    }
    fn parameters(&self) -> &Value {
        &self.schema
    }
    fn side_effect(&self) -> SideEffect {
        SideEffect::ReadOnly
    }
    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::data(args))
    }
}

fn echo() -> Echo {
    Echo {
        schema: json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
    }
}

fn model(base_url: &str, scenario: &str) -> OpenAiModel {
    let mut config = OpenAiConfig::new(scenario).with_base_url(base_url);
    config.transport.retry.max_retries = 0;
    OpenAiModel::new(config)
}

/// `distinct=true`: every call's arguments differ, so no call is skipped as a duplicate.
fn inline(base_url: &str, rounds: usize) -> Agent {
    Agent::builder(model(
        base_url,
        &format!("mock:rounds={rounds},distinct=true"),
    ))
    .tool(echo())
    .max_rounds(rounds as u32 + 1)
    .max_tool_calls(rounds as u32)
    .build()
    .unwrap()
}

fn delegated(base_url: &str, rounds: usize) -> Agent {
    let child = inline(base_url, rounds);
    Agent::builder(model(base_url, "mock:rounds=1"))
        .tool(child.as_tool("worker", "Does the work.").unwrap())
        .max_rounds(2)
        .build()
        .unwrap()
}

/// Client time per run and the client's own cost per model call, over `runs` runs.
async fn measure(agent: &Agent, server: &MockServer, runs: usize) -> (Duration, Duration) {
    let before = server.stats();
    let started = Instant::now();
    for _ in 0..runs {
        let outcome = agent.prompt("go").await;
        assert!(outcome.success, "{:?}", outcome.error);
    }
    let wall = started.elapsed();
    let after = server.stats();
    let requests = (after.requests - before.requests) as u32;
    let server_time = after.processing - before.processing;
    (
        wall / runs as u32,
        wall.saturating_sub(server_time) / requests.max(1),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let rounds: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(20);
    let trials: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(7);
    let runs = 20;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = start(MockOptions {
            default_latency: Some(Duration::ZERO),
            ..MockOptions::default()
        })
        .await
        .unwrap();
        let url = format!("{}/v1", server.base_url());
        let (a, b) = (inline(&url, rounds), delegated(&url, rounds));
        measure(&a, &server, runs).await;
        measure(&b, &server, runs).await;
        let (mut per_call, mut whole) = (Vec::new(), Vec::new());
        let (mut inline_call, mut child_call) = (Vec::new(), Vec::new());
        for _ in 0..trials {
            let (ia, ca) = measure(&a, &server, runs).await;
            let (ib, cb) = measure(&b, &server, runs).await;
            per_call.push(cb.as_secs_f64() / ca.as_secs_f64());
            whole.push(ib.as_secs_f64() / ia.as_secs_f64());
            inline_call.push(ca.as_secs_f64() * 1e6);
            child_call.push(cb.as_secs_f64() * 1e6);
        }
        println!(
            "delegation, {rounds} rounds of work, {trials} trials of {runs} runs each (medians):"
        );
        println!(
            "  engine cost per model call: inline {:.1} µs, delegated {:.1} µs, ratio {:.3} (target ≤ 1.10)",
            median(inline_call),
            median(child_call),
            median(per_call)
        );
        println!(
            "  whole run: delegated / inline = {:.3} (with the parent's 2 extra model calls of {})",
            median(whole),
            rounds + 3
        );
        server.shutdown().await;
    });
}
