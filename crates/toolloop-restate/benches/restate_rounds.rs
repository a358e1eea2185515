//! Rounds/s of N concurrent runs through Restate (a real server, one worker in this process,
//! runs invoked on the HTTP ingress) against the same runs in one process ([`Agent::run`]),
//! measured in the same run, as a ratio. A round is one model call; the model is the mock
//! server on 127.0.0.1 (`mock:rounds=R`), the tool a read-only lookup (one journaled step per
//! model call and one per tool call). With `effects` after N and R, the tool is
//! side-effecting (one more journaled step per call: its intent).
//!
//! Run: `cargo bench -p toolloop-restate --bench restate_rounds -- [N] [R] [effects]` (after
//! `scripts/npm-install`; the Restate server is the npm package's binary).

#[path = "../tests/common/mod.rs"]
mod common;

use serde_json::json;
use std::time::{Duration, Instant};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::tool::{SideEffect, ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::{Agent, Message, StopReason};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct LookupArgs {
    /// What to look up.
    #[allow(dead_code)]
    key: Option<String>,
}

const TRIALS: usize = 3;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(50);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(4);
    let effects = args.get(2).is_some_and(|a| a == "effects");
    let Some(binary) = common::server_binary() else {
        eprintln!("restate_rounds: the Restate server is not installed (scripts/npm-install)");
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .unwrap();
    let server = common::RestateServer::start(&binary);
    let side_effect = if effects {
        SideEffect::SideEffecting
    } else {
        SideEffect::ReadOnly
    };
    let lookup = tool_fn(
        "lookup",
        "Looks a key up.",
        |_a: LookupArgs, _ctx: ToolContext| async move {
            Ok::<_, ToolError>(ToolOutput::data(json!({"value": 42})))
        },
    )
    .with_side_effect(side_effect);
    let model = OpenAiModel::new(
        OpenAiConfig::new(format!("mock:rounds={rounds}"))
            .with_base_url(format!("{}/v1", mock.base_url())),
    );
    let agent = Agent::builder(model)
        .tool(lookup)
        .max_rounds(rounds as u32 + 1)
        .build()
        .unwrap();
    // Bound inside the runtime, which the listener registers with.
    let worker = {
        let _entered = rt.enter();
        toolloop_restate::Worker::bind("127.0.0.1:0".parse().unwrap()).unwrap()
    };
    let addr = worker.local_addr().unwrap();
    rt.spawn(worker.serve(agent.clone(), std::future::pending::<()>()));
    rt.block_on(toolloop_restate::register(
        &server.admin,
        &format!("http://{addr}"),
        Duration::from_secs(30),
    ))
    .unwrap();
    let per_run = (rounds + 1) as f64;
    let in_process = |trial: usize| -> f64 {
        let agent = agent.clone();
        rt.block_on(async move {
            let t = Instant::now();
            let runs = (0..n).map(|i| {
                let agent = agent.clone();
                tokio::spawn(async move {
                    agent
                        .run(vec![Message::user(format!("trial {trial} run {i}"))])
                        .await
                })
            });
            for o in futures::future::join_all(runs).await {
                assert_eq!(o.unwrap().stop_reason, StopReason::Answered);
            }
            n as f64 * per_run / t.elapsed().as_secs_f64()
        })
    };
    let ingress = server.ingress.clone();
    let through_restate = |trial: usize| -> f64 {
        let ingress = ingress.clone();
        rt.block_on(async move {
            let t = Instant::now();
            let runs = (0..n).map(|i| {
                let ingress = ingress.clone();
                tokio::spawn(async move {
                    toolloop_restate::invoke(
                        &ingress,
                        &format!("bench-{trial}-{i}"),
                        vec![Message::user(format!("trial {trial} run {i}"))],
                    )
                    .await
                })
            });
            for o in futures::future::join_all(runs).await {
                assert_eq!(o.unwrap().unwrap().stop_reason, StopReason::Answered);
            }
            n as f64 * per_run / t.elapsed().as_secs_f64()
        })
    };
    // Warm-up: connections, the deployment, the partitions' leaders.
    in_process(0);
    through_restate(0);
    let mut pairs = Vec::new();
    for trial in 1..=TRIALS {
        let local = in_process(trial);
        let restate = through_restate(trial);
        pairs.push((restate / local, local, restate));
    }
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (ratio, local, restate) = pairs[TRIALS / 2];
    println!(
        "N={n} runs of {} rounds ({} tool): in one process {local:.0} rounds/s; through Restate \
         {restate:.0} rounds/s; ratio {ratio:.4} (median of {TRIALS} pairs, range {:.4}..{:.4})",
        rounds + 1,
        if effects {
            "side-effecting"
        } else {
            "read-only"
        },
        pairs[0].0,
        pairs[TRIALS - 1].0,
    );
}
