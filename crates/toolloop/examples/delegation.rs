//! Delegation: a planner hands work to two sub-agents, each with its own model, system prompt,
//! tools and budget. The two readers only read, so they run at the same time; the child's
//! events come nested, and its usage counts in the planner's.
//!
//! Runs offline on scripted models: `cargo run -p toolloop --example delegation`.

use toolloop::providers::scripted::ScriptedModel;
use toolloop::subagent::Delegation;
use toolloop::{Agent, Event, SideEffect, ToolContext, ToolError, tool_fn};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Read {
    /// The file to read.
    path: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let read_file = tool_fn(
        "read_file",
        "Reads a file.",
        |a: Read, _ctx: ToolContext| async move {
            Ok::<_, ToolError>(format!("(the text of {})", a.path))
        },
    )
    .with_side_effect(SideEffect::ReadOnly)
    .allow_parallel();
    let read_file = std::sync::Arc::new(read_file);

    // Two children: each would be its own (cheaper) model in a real program.
    let reviewer = Agent::builder(ScriptedModel::from_json(
        r#"[
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "src/lib.rs"}}],
             "usage": {"input_tokens": 120, "output_tokens": 10}},
            {"text": "src/lib.rs: no bug found.", "usage": {"input_tokens": 150, "output_tokens": 8}}
        ]"#,
    )?)
    .system("You review code. Report bugs only.")
    .tool_arc(read_file.clone())
    .max_rounds(4)
    .build()?;
    let summarizer = Agent::builder(ScriptedModel::from_json(
        r#"[{"text": "The README explains the command.", "usage": {"input_tokens": 90, "output_tokens": 7}}]"#,
    )?)
    .system("You summarize documents in one sentence.")
    .tool_arc(read_file)
    .build()?;

    let planner = Agent::builder(ScriptedModel::from_json(
        r#"[
            {"tool_calls": [
                {"name": "reviewer", "arguments": {"task": "Review src/lib.rs for bugs."}},
                {"name": "summarizer", "arguments": {"task": "Summarize README.md."}}
            ], "usage": {"input_tokens": 200, "output_tokens": 30}},
            {"text": "No bug in src/lib.rs; the README explains the command.",
             "usage": {"input_tokens": 260, "output_tokens": 15}}
        ]"#,
    )?)
    .tool(
        reviewer
            .as_tool("reviewer", "Reviews code; say which files.")?
            .max_tokens(5_000),
    )
    .tool(summarizer.as_tool("summarizer", "Summarizes a document.")?)
    .delegation(Delegation {
        max_depth: 1,
        max_children: 2,
    })
    .on_event(|e| {
        // `└ reviewer: read_file`: which agent works on what.
        if let Event::Child { path, event, .. } = e
            && let Event::ToolStarted { name, .. } = &**event
        {
            println!("  └ {}: {name}", path.join("/"));
        }
    })
    .build()?;

    let outcome = planner.prompt("Check the project.").await;
    println!("answer: {}", outcome.text.as_deref().unwrap_or("-"));
    for call in &outcome.tool_calls {
        if let Some(spent) = &call.spent {
            println!(
                "{}: {} rounds, {} tokens",
                call.call.name,
                spent.rounds,
                spent.usage.map_or(0, |u| u.total_tokens())
            );
        }
    }
    println!(
        "total tokens (planner and children): {}",
        outcome.usage.map_or(0, |u| u.total_tokens())
    );
    Ok(())
}
