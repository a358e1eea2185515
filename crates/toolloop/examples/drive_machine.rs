//! Driving the loop's state machine by hand, with no runtime and no network: the machine says
//! what it needs next (a `Step`), and the driver, here a plain `loop`, does it and feeds the
//! answer back. This is what `Agent` does with real models and tools, and what a durable
//! execution engine would do step by step.
//!
//! `cargo run -p toolloop --example drive_machine`

use serde_json::json;
use std::sync::Arc;
use toolloop::config::Hooks;
use toolloop::engine::{Machine, Step};
use toolloop::toolbox::Toolbox;
use toolloop::{LoopConfig, Message, ModelResponse, ToolCall, ToolOutput, tool_fn};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Echo {
    /// What to say back.
    text: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The toolbox only describes the tools to the machine; the driver runs them.
    let echo = tool_fn("echo", "Says the text back.", |a: Echo, _ctx| async move {
        Ok::<_, toolloop::ToolError>(ToolOutput::text(a.text))
    });
    let toolbox = Arc::new(Toolbox::new().with(echo)?);
    let mut machine = Machine::new(
        Arc::new(LoopConfig::default()),
        Hooks::default(),
        toolbox,
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
                let reply = replies.next().ok_or("the script ran out")?;
                machine.model_responded(reply, None)?;
            }
            Step::RunTools(batches) => {
                for batch in batches {
                    for index in batch.calls {
                        let call = machine.round_call(index).ok_or("no such call")?;
                        println!("  run {}({})", call.name, call.arguments);
                        let text = call.arguments["text"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string();
                        machine.tool_finished(index, Ok(ToolOutput::text(text)), 0, 1)?;
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
