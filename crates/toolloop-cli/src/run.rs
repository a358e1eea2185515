//! `toolloop run`: one agent run on a prompt.

use crate::CliError;
use crate::args::RunArgs;
use crate::cx::Cx;
use crate::progress::Progress;
use crate::setup::{agent_builder_with, attachments, tools};
use crate::spec::model_from_args;
use serde_json::{Value, json};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolloop::Message;
use toolloop::outcome::{Outcome, StopReason};

/// The most bytes a prompt read from stdin may have.
const MAX_STDIN_PROMPT: u64 = 64 * 1024 * 1024;

/// The prompt piped on stdin; an error on a terminal (nothing was piped), for an empty prompt,
/// or for text that is not UTF-8.
fn read_stdin_prompt() -> Result<String, CliError> {
    use std::io::Read;
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(CliError::usage(
            "no prompt: give it as an argument, or pipe it on stdin (`… | toolloop run -`)",
        ));
    }
    let mut bytes = Vec::new();
    stdin
        .lock()
        .take(MAX_STDIN_PROMPT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| CliError::io("cannot read the prompt from stdin", e))?;
    if bytes.len() as u64 > MAX_STDIN_PROMPT {
        return Err(CliError::usage(format!(
            "the prompt on stdin is longer than {} MiB",
            MAX_STDIN_PROMPT / (1024 * 1024)
        )));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        CliError::usage(format!(
            "the prompt on stdin is not UTF-8 (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    if text.trim().is_empty() {
        return Err(CliError::usage("the prompt on stdin is empty"));
    }
    Ok(text)
}

/// 0 answered; 3 a budget or terminal condition stopped the run; 1 other failures.
pub(crate) fn exit_code(reason: StopReason) -> ExitCode {
    match reason {
        StopReason::Answered => ExitCode::SUCCESS,
        StopReason::MaxRounds
        | StopReason::MaxToolCalls
        | StopReason::Timeout
        | StopReason::TerminalSignal
        | StopReason::TooManyInvalidCalls
        | StopReason::OutputTruncated
        | StopReason::ContextExhausted => ExitCode::from(3),
        StopReason::AwaitingApproval => ExitCode::from(crate::approve::EXIT_AWAITING),
        StopReason::Cancelled
        | StopReason::ModelError
        | StopReason::StoreFailed
        | StopReason::EmptyAnswer => ExitCode::FAILURE,
        // A reason added to the engine after this was written: not an answer.
        _ => ExitCode::FAILURE,
    }
}

pub(crate) async fn run(cx: &Cx, mut args: RunArgs) -> Result<ExitCode, CliError> {
    if args.prompt == "-" {
        args.prompt = read_stdin_prompt()?;
    }
    args.agent.prepare(cx)?;
    args.agent.stream_on_terminal(args.json || args.jsonl);
    let cancel = CancellationToken::new();
    let on_ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    run_with(cx, args, cancel).await
}

/// Runs (or resumes) until done or `cancel`; prints the outcome; the exit code.
pub(crate) async fn run_with(
    cx: &Cx,
    args: RunArgs,
    cancel: CancellationToken,
) -> Result<ExitCode, CliError> {
    run_with_note(cx, args, cancel, "toolloop: cancelling").await
}

/// [`run_with`], saying `note` on stderr when `cancel` strikes (after the unfinished reply on
/// the terminal is taken back, so that nothing of it stays on screen).
pub(crate) async fn run_with_note(
    cx: &Cx,
    mut args: RunArgs,
    cancel: CancellationToken,
    note: &'static str,
) -> Result<ExitCode, CliError> {
    args.agent.check()?;
    args.agent.mcp.absolutize()?;
    let images = attachments(&args.attach)?;
    let started = std::time::Instant::now();
    crate::sandbox::protect_store(cx, args.durable.store.store.as_deref());
    let tools = tools(cx, &args.agent).await?;
    let rules = &args.agent.approval;
    let has_rules = [&rules.allow, &rules.ask, &rules.deny]
        .iter()
        .any(|specs| !specs.is_empty());
    if has_rules && !rules.rules_checked {
        // The servers' tools are listed again only when servers are configured.
        let offered = match tools.mcp {
            Some(_) => tools.all().await,
            None => tools.own.clone(),
        };
        let names: Vec<&str> = offered.iter().map(|t| t.name()).collect();
        crate::approve::warn_unoffered(rules, &names);
    }
    let model = model_from_args(cx, &args.agent.provider)?;
    // The time the MCP servers took to list their tools counts against the run's timeout.
    let mut agent_args = args.agent.clone();
    agent_args.timeout = agent_args.timeout.map(|t| {
        t.saturating_sub(started.elapsed())
            .max(Duration::from_millis(1))
    });
    let person_only = crate::approve::person_only(&tools.own);
    let builder = agent_builder_with(cx, &agent_args, model, tools)?;
    let machine_output = args.json || args.jsonl;
    let stream_text = args.agent.stream && !machine_output;
    let progress = Arc::new(Progress::new(
        std::io::stderr().is_terminal() && !machine_output,
        stream_text,
    ));
    let shown = progress.clone();
    let jsonl = args.jsonl;
    let mut builder = builder.on_event(move |e| {
        if jsonl {
            event_line(e);
        } else {
            shown.event(e);
        }
    });
    let watcher = {
        let progress = progress.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            cancel.cancelled().await;
            progress.interrupted(note);
        })
    };
    let _stop_watching = AbortOnDrop(watcher);
    if let Some(ask) = crate::approve::handler(&args.agent.approval, progress.clone(), person_only)
    {
        builder = builder.on_approval(move |p| ask(p));
    }
    let mut durable = crate::durable::Durable::open(cx, &args.durable, &args).await?;
    if let Some(journal) = durable.journal() {
        builder = builder.journal(journal);
    }
    let agent = match builder.build() {
        Ok(a) => a,
        Err(e) => {
            durable.close().await;
            return Err(CliError::usage(e.to_string()));
        }
    };
    progress.set_window(agent.config().context.as_ref().and_then(|c| c.window));
    let prompt = Message::user_with_images(args.prompt.clone(), images);
    let outcome = durable.run(&agent, prompt, cancel).await?;
    progress.finish();
    if args.json {
        outln!("{}", outcome_json(&outcome));
    } else if args.jsonl {
        let mut line = outcome_json(&outcome);
        if let Some(o) = line.as_object_mut() {
            o.insert("type".into(), Value::from("run_finished"));
        }
        outln!("{line}");
    } else {
        if let Some(output) = &outcome.output {
            // The validated answer, as one line of JSON.
            outln!("{output}");
        } else if !progress.streamed()
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
            // The message may quote a server or the model (a traceback, over several lines):
            // escaped, as a diagnostic, and cut short when long.
            let why = outcome
                .error
                .as_ref()
                .map(|e| format!(": {}", crate::terminal::diagnostic(&e.message)))
                .unwrap_or_default();
            let signal = outcome
                .signal
                .as_ref()
                .map(|s| format!(" (signal {})", crate::terminal::escape(s, false)))
                .unwrap_or_default();
            // Escaped already (a diagnostic's lines are indented, so not `warn`).
            eprintln!(
                "toolloop: stopped: {}{signal}{why}",
                serde_json::to_value(outcome.stop_reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            );
            crate::approve::show_pending(&outcome);
        }
    }
    Ok(exit_code(outcome.stop_reason))
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `--jsonl`: one event as a line on stdout. The run's end is written by the caller, with the
/// outcome in the shape `--json` gives it.
fn event_line(event: &toolloop::Event) {
    if matches!(event, toolloop::Event::RunFinished { .. }) {
        return;
    }
    match serde_json::to_string(event) {
        Ok(line) => outln!("{line}"),
        Err(e) => crate::error::warn(format!("cannot write an event as JSON: {e}")),
    }
}

/// The outcome as the `--json` object.
pub(crate) fn outcome_json(o: &Outcome) -> Value {
    let calls: Vec<Value> = o
        .tool_calls
        .iter()
        .map(|c| {
            let result = serde_json::from_str::<Value>(&c.content)
                .unwrap_or_else(|_| Value::String(c.content.clone()));
            let mut call = json!({
                "round": c.round,
                "id": c.call.id,
                "name": c.call.name,
                "arguments": c.call.arguments,
                "success": c.success(),
                "status": c.status,
                "result": result,
                "duration_ms": c.duration_ms,
            });
            if let Some(spent) = &c.spent {
                // A sub-agent's usage and cost (counted in the run's too).
                call["spent"] = json!(spent);
            }
            call
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
    if let Some(output) = &o.output {
        v["output"] = output.clone();
    }
    if let Some(e) = &o.error {
        v["error"] = json!({"code": e.code, "message": e.message});
    }
    if !o.pending_approvals.is_empty() {
        v["pending_approvals"] = json!(o.pending_approvals);
    }
    v
}
