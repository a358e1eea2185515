//! Driving the loop's state machine by hand, with no runtime and no network: the machine says
//! what it needs next (a `Step`), and the driver, here a plain `loop`, does it and hands what
//! came of it back as an `Input` (`Machine::handle`). This is what `Agent` does with real
//! models and tools (logging each input first), and what a durable execution engine would do
//! step by step (journaling each input).
//!
//! `cargo run -p toolloop --example drive_machine`

use serde_json::json;
use std::sync::Arc;
use toolloop::engine::{HookFlags, Input, Machine, Step};
use toolloop::toolbox::Toolbox;
use toolloop::{LoopConfig, Message, ModelResponse, ToolCall, ToolOutput, tool_fn};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Echo {
    /// What to say back.
    text: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The machine knows the tools by their catalog (names, schemas, metadata); the driver
    // runs them.
    let echo = tool_fn("echo", "Says the text back.", |a: Echo, _ctx| async move {
        Ok::<_, toolloop::ToolError>(ToolOutput::text(a.text))
    });
    let toolbox = Toolbox::new().with(echo)?;
    let mut machine = Machine::new(
        Arc::new(LoopConfig::default()),
        HookFlags::default(),
        toolbox.catalog().clone(),
        vec![Message::user("Say hello twice.")],
    );

    // What "the model" answers, round by round.
    let mut replies = vec![
        ModelResponse::tool_calls(vec![
            ToolCall::new("echo", json!({"text": "hello"})),
            ToolCall::new("echo", json!({"text": "hello again"})),
        ]),
        ModelResponse::text("I said hello twice."),
    ]
    .into_iter();

    loop {
        match machine.next_step() {
            Step::CallModel { round, .. } => {
                println!(
                    "round {round}: call the model with {} messages",
                    machine.messages().len()
                );
                let response = replies.next().ok_or("the script ran out")?;
                machine.handle(Input::ModelResponded {
                    round,
                    response,
                    cost: None,
                    // No approval policy: no call needs its approval subject.
                    subjects: Vec::new(),
                })?;
            }
            Step::RunTools(batches) => {
                let round = machine.round();
                for batch in batches {
                    for index in batch.calls {
                        let call = machine.shared_round_call(index).ok_or("no such call")?;
                        println!("  run {}({})", call.name, call.arguments);
                        let call_id = call.id.clone();
                        machine.handle(Input::ToolStarted {
                            round,
                            index,
                            call_id,
                        })?;
                        let text = call.arguments["text"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string();
                        machine.handle(Input::ToolFinished {
                            round,
                            index,
                            result: Ok(ToolOutput::text(text)),
                            duration_ms: 0,
                            attempts: 1,
                        })?;
                    }
                }
            }
            Step::Finished => break,
            // No hooks are set, so the machine never asks for them.
            other => return Err(format!("unexpected step {other:?}").into()),
        }
    }
    let outcome = machine.into_outcome(0);
    println!(
        "{:?}: {}",
        outcome.stop_reason,
        outcome.text.unwrap_or_default()
    );
    Ok(())
}
