//! Prompt-based tool calling for a model without native tool support (a small local model
//! behind an OpenAI-compatible server, say): the tool catalog goes into the system prompt in a
//! dialect the model was trained on, and its calls are parsed from the reply's text.
//!
//! Here the mock server plays such a model, writing Hermes-style `<tool_call>` tags. Against a
//! real server, set the base URL to it (llama.cpp, vLLM, Ollama, LM Studio: `http://…/v1`).
//!
//! `cargo run -p toolloop --example prompted_model`

use std::sync::Arc;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::ptk::{Dialect, Prompted};
use toolloop::{Agent, ToolContext, ToolError, ToolOutput, tool_fn};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Weather {
    /// The city.
    city: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = toolloop_mock::start(toolloop_mock::MockOptions::default()).await?;
    let base_url = format!("{}/v1", server.base_url());
    // `text_calls=hermes`: the mock refuses `tools` and writes its calls as text.
    let inner =
        OpenAiModel::new(OpenAiConfig::new("mock:text_calls=hermes").with_base_url(base_url));
    let model = Prompted::new(Arc::new(inner), Dialect::Hermes);

    let weather = tool_fn(
        "weather",
        "Today's weather in a city.",
        |args: Weather, _ctx: ToolContext| async move {
            Ok::<_, ToolError>(ToolOutput::text(format!("sunny in {}", args.city)))
        },
    );
    let agent = Agent::builder(model).tool(weather).build()?;
    let outcome = agent.prompt("What is the weather in Lisbon?").await;
    for call in &outcome.tool_calls {
        println!(
            "the model called {}({})",
            call.call.name, call.call.arguments
        );
    }
    println!("answer: {}", outcome.text.as_deref().unwrap_or("(none)"));
    server.shutdown().await;
    Ok(())
}
