//! `toolloop run`: one agent run on a prompt.

use crate::EXIT_USAGE;
use crate::progress::Progress;
use crate::spec::{ProviderArgs, model_from_args};
use clap::Args;
use serde_json::{Value, json};
use std::io::{IsTerminal, Write};
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
    /// Model calls per run (at least 1).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rounds: u32,
    /// Tool executions per run (0: the model's tool calls are not run).
    #[arg(long, default_value_t = 20)]
    pub max_tool_calls: u32,
    /// Wall-clock limit for the run: seconds (`90`, `1.5`) or a duration (`90s`, `2m`, `1h`,
    /// `1h 30m`); at most 30 days.
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
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
    /// Sampling temperature, 0 to 2 (Anthropic: 0 to 1).
    #[arg(long, value_parser = parse_temperature)]
    pub temperature: Option<f32>,
    /// The most output tokens per model call, 1 to 1000000.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_OUTPUT_TOKENS)))]
    pub max_output_tokens: Option<u32>,
    #[command(flatten)]
    #[serde(flatten)]
    pub mcp: crate::mcp::McpArgs,
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

/// The longest `--timeout`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);
/// The most `--max-output-tokens` (no model writes nearly that many in one reply).
pub const MAX_OUTPUT_TOKENS: u32 = 1_000_000;

/// A `--timeout`: a number of seconds, or a duration with units (`90s`, `2m`, `1h 30m`), above
/// zero and at most [`MAX_TIMEOUT`].
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    const EXPECTED: &str = "expected seconds (`90`, `1.5`) or a duration (`90s`, `2m`, `1h`)";
    let text = s.trim();
    let duration = match text.parse::<f64>() {
        Ok(secs) if !secs.is_finite() || secs <= 0.0 => {
            return Err(format!("`{s}` is not a positive duration; {EXPECTED}"));
        }
        Ok(secs) if secs > MAX_TIMEOUT.as_secs_f64() => None,
        Ok(secs) => Some(Duration::from_secs_f64(secs)),
        Err(_) => match humantime::parse_duration(text) {
            Ok(d) => Some(d),
            Err(humantime::DurationError::NumberOverflow) => None,
            Err(e) => return Err(format!("`{s}` is not a duration ({e}); {EXPECTED}")),
        },
    };
    match duration {
        Some(d) if d.is_zero() => Err(format!("`{s}` is not a positive duration; {EXPECTED}")),
        Some(d) if d <= MAX_TIMEOUT => Ok(d),
        _ => Err(format!(
            "`{s}` is longer than the longest timeout, 30 days ({}s)",
            MAX_TIMEOUT.as_secs()
        )),
    }
}

/// A `--temperature`: a finite number from 0 to 2.
pub fn parse_temperature(s: &str) -> Result<f32, String> {
    let t: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number; expected 0 to 2"))?;
    check_temperature(t)
}

fn check_temperature(t: f32) -> Result<f32, String> {
    if t.is_finite() && (0.0..=2.0).contains(&t) {
        Ok(t)
    } else {
        Err(format!(
            "{t} is out of range; expected a number from 0 to 2"
        ))
    }
}

impl AgentArgs {
    /// Checks what the flags' parsers check (for a configuration that did not come through
    /// them: one saved with a run), and what depends on the provider. A saved timeout beyond
    /// [`MAX_TIMEOUT`] (from an older version that accepted one) is brought down to it, with a
    /// note on stderr, so that the run can still be resumed.
    pub fn check(&mut self) -> Result<(), String> {
        if self.max_rounds == 0 {
            return Err("--max-rounds 0: a run needs at least 1 round".into());
        }
        if let Some(n) = self.max_output_tokens
            && !(1..=MAX_OUTPUT_TOKENS).contains(&n)
        {
            return Err(format!(
                "--max-output-tokens {n}: expected 1 to {MAX_OUTPUT_TOKENS}"
            ));
        }
        if let Some(t) = self.temperature {
            check_temperature(t).map_err(|e| format!("--temperature: {e}"))?;
            if t > 1.0 && self.provider.model.trim().starts_with("anthropic:") {
                return Err(format!(
                    "--temperature {t}: Anthropic accepts a temperature from 0 to 1"
                ));
            }
        }
        match self.timeout {
            Some(t) if t.is_zero() => {
                return Err("--timeout 0: expected a positive duration".into());
            }
            Some(t) if t > MAX_TIMEOUT => {
                eprintln!(
                    "toolloop: the saved timeout ({}s) is beyond the longest, 30 days: using 30 days",
                    t.as_secs()
                );
                self.timeout = Some(MAX_TIMEOUT);
            }
            _ => {}
        }
        Ok(())
    }
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
pub async fn run_with(mut args: RunArgs, cancel: CancellationToken) -> ExitCode {
    if let Err(e) = args.agent.check() {
        return usage_error(e);
    }
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
    if let Err(e) = args.agent.mcp.absolutize() {
        return usage_error(e);
    }
    let tools = match crate::mcp::assemble(&args.agent.mcp, &args.agent.root, tools).await {
        Ok(t) => t,
        Err(e) => return e.report(),
    };
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
        outln!("{}", outcome_json(&outcome));
    } else {
        if !progress.streamed()
            && let Some(text) = &outcome.text
        {
            // Written once final: the exact bytes to a pipe or a file, escaped on a terminal.
            let stdout = std::io::stdout();
            let text = crate::terminal::for_stdout(text, stdout.is_terminal());
            let mut out = stdout.lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
        if outcome.stop_reason != StopReason::Answered {
            // The message may quote a server or the model: escaped, as a diagnostic.
            let why = outcome
                .error
                .as_ref()
                .map(|e| format!(": {}", crate::terminal::escape(&e.message, false)))
                .unwrap_or_default();
            let signal = outcome
                .signal
                .as_ref()
                .map(|s| format!(" (signal {})", crate::terminal::escape(s, false)))
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
