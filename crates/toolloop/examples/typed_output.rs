//! A typed final answer: the run's answer must be a `Forecast`. Its JSON Schema goes with every
//! request (natively where the API can), the loop validates the answer, sends an invalid one
//! back with the errors, and gives the value as a Rust type.
//!
//! Runs offline on a scripted model: `cargo run -p toolloop --example typed_output`.

use toolloop::providers::scripted::ScriptedModel;
use toolloop::{Agent, ToolContext, ToolError, ToolOutput, tool_fn};

/// The answer; doc comments become the schema's descriptions.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Forecast {
    /// The city.
    city: String,
    /// The expected high, in degrees Celsius.
    high_celsius: f64,
    /// Whether to take an umbrella.
    umbrella: bool,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    /// The city's name.
    name: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let weather = tool_fn(
        "weather",
        "Tomorrow's weather in a city.",
        |args: City, _ctx: ToolContext| async move {
            Ok::<_, ToolError>(ToolOutput::text(format!(
                "{}: 18 °C, showers in the afternoon",
                args.name
            )))
        },
    );
    // A real model would decide this; the script makes the example run anywhere. Its first
    // answer misses a field, so the loop sends the errors back and the model corrects itself.
    let model = ScriptedModel::from_json(
        r#"[
            {"tool_calls": [{"name": "weather", "arguments": {"name": "Lyon"}}]},
            {"text": "{\"city\": \"Lyon\", \"high_celsius\": 18}"},
            {"text": "```json\n{\"city\": \"Lyon\", \"high_celsius\": 18, \"umbrella\": true}\n```"}
        ]"#,
    )?;
    let agent = Agent::builder(model)
        .tool(weather)
        .output_type::<Forecast>()
        .build()?;

    let outcome = agent
        .prompt("Do I need an umbrella in Lyon tomorrow?")
        .await;
    for m in &outcome.messages {
        if let toolloop::Message::User { content, .. } = m {
            println!("user: {content}");
        }
    }
    let forecast: Forecast = outcome.parse()?;
    println!(
        "{}: high of {} °C, umbrella: {}",
        forecast.city, forecast.high_celsius, forecast.umbrella
    );
    println!(
        "stopped: {:?} after {} rounds",
        outcome.stop_reason, outcome.rounds
    );
    Ok(())
}
