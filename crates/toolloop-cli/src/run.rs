//! `toolloop run`: one agent run on a prompt.

use crate::EXIT_USAGE;
use crate::progress::Progress;
use crate::spec::{ProviderArgs, model_from_args};
use clap::Args;
use serde_json::{Value, json};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolloop::agent::AgentBuilder;
use toolloop::outcome::{Outcome, StopReason};

/// What a run needs besides its prompt: the model and the loop's settings (shared by `run`
/// and `chat`, and saved with each run so that `resume` can rebuild the agent).
#[derive(Args, Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AgentArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub provider: ProviderArgs,
    /// A system prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Model calls per run.
    #[arg(long, default_value_t = 10)]
    pub max_rounds: u32,
    /// Tool executions per run.
    #[arg(long, default_value_t = 20)]
    pub max_tool_calls: u32,
    /// Wall-clock limit for the run, in seconds.
    #[arg(long, value_parser = parse_seconds)]
    pub timeout: Option<Duration>,
    /// The directory the file tools may use.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Offer the write_file tool.
    #[arg(long)]
    pub allow_write: bool,
    /// Stream the model's text as it arrives.
    #[arg(long)]
    pub stream: bool,
    /// Sampling temperature.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// The most output tokens per model call.
    #[arg(long)]
    pub max_output_tokens: Option<u32>,
}

#[derive(Args, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunArgs {
    /// What to ask.
    pub prompt: String,
    #[command(flatten)]
    #[serde(flatten)]
    pub agent: AgentArgs,
    /// Print the outcome as one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    #[serde(default)]
    pub durable: crate::durable::DurableArgs,
}

pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("expected a positive number of seconds, got `{s}`"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("toolloop: {message}");
    ExitCode::from(EXIT_USAGE)
}

/// 0 answered; 3 a budget or terminal condition stopped the run; 1 other failures.
pub fn exit_code(reason: StopReason) -> ExitCode {
    match reason {
        StopReason::Answered => ExitCode::SUCCESS,
        StopReason::MaxRounds
        | StopReason::MaxToolCalls
        | StopReason::Timeout
        | StopReason::TerminalSignal
        | StopReason::TooManyInvalidCalls
        | StopReason::OutputTruncated => ExitCode::from(3),
        StopReason::Cancelled | StopReason::ModelError | StopReason::StoreFailed => {
            ExitCode::FAILURE
        }
    }
}

pub async fn run(args: RunArgs) -> ExitCode {
    let cancel = CancellationToken::new();
    let on_ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    run_with(args, cancel).await
}

/// Runs (or resumes) until done or `cancel`; prints the outcome; the exit code.
pub async fn run_with(args: RunArgs, cancel: CancellationToken) -> ExitCode {
    let model = match model_from_args(&args.agent.provider) {
        Ok(m) => m,
        Err(e) => return usage_error(e),
    };
    let tools = match toolloop_tools::fs::builtin_tools(&args.agent.root, args.agent.allow_write) {
        Ok(t) => t,
        Err(e) => return usage_error(format!("--root {}: {e}", args.agent.root.display())),
    };
    #[cfg(feature = "test-hooks")]
    let tools = crate::testtool::tools(tools);
    let stream_text = args.agent.stream && !args.json;
    let progress = Arc::new(Progress::new(
        std::io::stderr().is_terminal() && !args.json,
        stream_text,
    ));
    let shown = progress.clone();
    let mut builder = AgentBuilder::new(model)
        .tools(tools)
        .max_rounds(args.agent.max_rounds)
        .max_tool_calls(args.agent.max_tool_calls)
        .stream(args.agent.stream)
        .on_event(move |e| shown.event(e));
    if let Some(system) = &args.agent.system {
        builder = builder.system(system.clone());
    }
    if let Some(t) = args.agent.timeout {
        builder = builder.timeout(t);
    }
    if let Some(t) = args.agent.temperature {
        builder = builder.temperature(t);
    }
    if let Some(n) = args.agent.max_output_tokens {
        builder = builder.max_output_tokens(n);
    }
    let mut durable = match crate::durable::Durable::open(&args.durable, &args).await {
        Ok(d) => d,
        Err(code) => return code,
    };
    if let Some(journal) = durable.journal() {
        builder = builder.journal(journal);
    }
    let agent = match builder.build() {
        Ok(a) => a,
        Err(e) => {
            durable.close().await;
            return usage_error(e);
        }
    };
    let outcome = match durable.run(&agent, args.prompt.clone(), cancel).await {
        Ok(o) => o,
        Err(code) => return code,
    };
    progress.finish();
    if args.json {
        println!("{}", outcome_json(&outcome));
    } else {
        if stream_text {
            println!();
        } else if let Some(text) = &outcome.text {
            println!("{text}");
        }
        if outcome.stop_reason != StopReason::Answered {
            let why = outcome
                .error
                .as_ref()
                .map(|e| format!(": {}", e.message))
                .unwrap_or_default();
            let signal = outcome
                .signal
                .as_ref()
                .map(|s| format!(" (signal {s})"))
                .unwrap_or_default();
            eprintln!(
                "toolloop: stopped: {}{signal}{why}",
                serde_json::to_value(outcome.stop_reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            );
        }
    }
    exit_code(outcome.stop_reason)
}

/// The outcome as the `--json` object.
pub fn outcome_json(o: &Outcome) -> Value {
    let calls: Vec<Value> = o
        .tool_calls
        .iter()
        .map(|c| {
            let result = serde_json::from_str::<Value>(&c.content)
                .unwrap_or_else(|_| Value::String(c.content.clone()));
            json!({
                "round": c.round,
                "id": c.call.id,
                "name": c.call.name,
                "arguments": c.call.arguments,
                "success": c.success(),
                "status": c.status,
                "result": result,
                "duration_ms": c.duration_ms,
            })
        })
        .collect();
    let mut v = json!({
        "success": o.success,
        "stop_reason": o.stop_reason,
        "text": o.text,
        "signal": o.signal,
        "rounds": o.rounds,
        "tool_calls": calls,
        "usage": o.usage,
        "calls_without_usage": o.calls_without_usage,
        "cost": o.cost,
        "duration_ms": o.duration_ms,
        "run_id": o.run_id,
    });
    if let Some(e) = &o.error {
        v["error"] = json!({"code": e.code, "message": e.message});
    }
    v
}
