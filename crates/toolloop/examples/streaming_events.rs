//! Streaming a run's events: rounds, text as it arrives, each tool call as it starts and ends,
//! and the outcome last. Here the mock server (`toolloop-mock`) plays an OpenAI-compatible
//! model that streams its reply in small pieces.
//!
//! `cargo run -p toolloop --example streaming_events`

use futures::StreamExt;
use std::io::Write;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::{Agent, Event, Message, ToolContext, ToolError, ToolOutput, tool_fn};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Lookup {
    /// What to look up.
    topic: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Two rounds of one call each, then an answer, streamed four characters at a time.
    let server = toolloop_mock::start(toolloop_mock::MockOptions::default()).await?;
    let config = OpenAiConfig::new("mock:rounds=2,chunk=4,distinct=true")
        .with_base_url(format!("{}/v1", server.base_url()));
    let lookup = tool_fn(
        "lookup",
        "Looks a topic up.",
        |args: Lookup, _ctx: ToolContext| async move {
            Ok::<_, ToolError>(ToolOutput::text(format!(
                "{} is well documented",
                args.topic
            )))
        },
    );
    let agent = Agent::builder(OpenAiModel::new(config))
        .tool(lookup)
        .stream(true)
        .build()?;

    let mut events = Box::pin(agent.run_stream(vec![Message::user("Tell me about Rust.")]));
    while let Some(event) = events.next().await {
        match event {
            Event::RoundStarted { round, .. } => println!("\n-- round {round}"),
            Event::TextDelta { text, .. } => {
                print!("{text}");
                std::io::stdout().flush()?;
            }
            Event::ToolStarted { name, call_id, .. } => println!("tool {name} ({call_id}) started"),
            Event::ToolFinished {
                name,
                status,
                duration_ms,
                ..
            } => println!("tool {name} finished: {status:?} in {duration_ms} ms"),
            Event::RunFinished { outcome } => {
                println!(
                    "\n-- {:?}, {} tool calls",
                    outcome.stop_reason,
                    outcome.tool_calls.len()
                );
            }
            _ => {}
        }
    }
    server.shutdown().await;
    Ok(())
}
