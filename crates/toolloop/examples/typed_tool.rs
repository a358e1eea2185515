//! A tool from a Rust type: the arguments' JSON Schema comes from the struct, the model's
//! arguments are validated against it and deserialized before the function runs.
//!
//! Runs offline on a scripted model: `cargo run -p toolloop --example typed_tool`.

use toolloop::providers::scripted::ScriptedModel;
use toolloop::{Agent, ToolContext, ToolError, ToolOutput, tool_fn};

/// The arguments of `convert`; doc comments become the schema's descriptions.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Convert {
    /// The temperature in degrees Celsius.
    celsius: f64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let convert = tool_fn(
        "convert",
        "Converts a temperature from Celsius to Fahrenheit.",
        |args: Convert, _ctx: ToolContext| async move {
            if !args.celsius.is_finite() {
                return Err(ToolError::new("celsius must be a finite number"));
            }
            Ok::<_, ToolError>(ToolOutput::json(&(args.celsius * 9.0 / 5.0 + 32.0)))
        },
    );
    // A real model would decide this; the script makes the example run anywhere.
    let model = ScriptedModel::from_json(
        r#"[
            {"tool_calls": [{"name": "convert", "arguments": {"celsius": 21.5}}]},
            {"text": "21.5 °C is 70.7 °F."}
        ]"#,
    )?;
    let agent = Agent::builder(model).tool(convert).build()?;
    println!("schema: {}", agent.toolbox().specs()[0].parameters);

    let outcome = agent.prompt("How warm is 21.5 °C in Fahrenheit?").await;
    for call in &outcome.tool_calls {
        println!(
            "{}({}) -> {}",
            call.call.name, call.call.arguments, call.content
        );
    }
    println!("answer: {}", outcome.text.as_deref().unwrap_or("(none)"));
    println!(
        "stopped: {:?} after {} rounds",
        outcome.stop_reason, outcome.rounds
    );
    Ok(())
}
