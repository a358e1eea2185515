//! A durable run killed in the middle and resumed from its log: the run is logged to a SQLite
//! store (`toolloop-store`), a child process runs it and is killed (SIGKILL) while a tool is in
//! flight, and this process resumes it. The call that had finished is not run again; the one in
//! flight is run again because its tool is idempotent (a side-effecting one would be reported
//! to the model as "outcome unknown" instead of being repeated).
//!
//! `cargo run -p toolloop --example durable_resume`

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolloop::providers::scripted::ScriptedModel;
use toolloop::{Agent, SideEffect, Tool, ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop_store::{RunTags, Store};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Step {
    /// Which step.
    name: String,
}

/// The two tools: `record` appends a line to `log` (and so must not run twice), `slow` takes
/// its time and may be repeated.
fn tools(log: std::path::PathBuf) -> Vec<Arc<dyn Tool>> {
    let record = tool_fn(
        "record",
        "Records a step.",
        move |args: Step, ctx: ToolContext| {
            let log = log.clone();
            async move {
                use std::io::Write;
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)?;
                writeln!(file, "{} {}", args.name, ctx.idempotency_key)?;
                Ok::<_, ToolError>(ToolOutput::text("recorded"))
            }
        },
    )
    .with_side_effect(SideEffect::SideEffecting);
    let slow = tool_fn(
        "slow",
        "Takes a while.",
        |_: Step, _ctx: ToolContext| async move {
            println!("slow started");
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Ok::<_, ToolError>(ToolOutput::text("slow done"))
        },
    )
    .with_side_effect(SideEffect::Idempotent);
    vec![Arc::new(record), Arc::new(slow)]
}

/// The first two rounds of the model's part (a real model would be called instead).
const FIRST_ROUNDS: &str = r#"[
    {"tool_calls": [{"name": "record", "arguments": {"name": "one"}}]},
    {"tool_calls": [{"name": "slow", "arguments": {"name": "two"}}]}
]"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return child(&args[2], &args[3]).await;
    }
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("runs.db");
    let log = dir.path().join("effects.log");

    // Start the run in a child process and kill it while `slow` is in flight.
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "child",
            db.to_str().unwrap_or_default(),
            log.to_str().unwrap_or_default(),
        ])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut run_id = None;
    for line in lines.by_ref() {
        let line = line?;
        if let Some(id) = line.strip_prefix("run ") {
            run_id = Some(id.to_string());
        }
        if line == "slow started" {
            break;
        }
    }
    child.kill()?;
    child.wait()?;
    let run_id = run_id.ok_or("the child never started a run")?;
    println!("killed the run {run_id} while `slow` was in flight");

    // Resume it here: only the model's last answer is still to come.
    let store = Store::open(db.to_str().unwrap_or_default()).await?;
    let model = ScriptedModel::from_json(r#"[{"text": "Both steps are done."}]"#)?;
    let agent = Agent::builder(model)
        .tools(tools(log.clone()))
        .journal(store.run_journal(RunTags::default()))
        .build()?;
    let outcome = agent.resume(&run_id, CancellationToken::new()).await?;
    println!(
        "resumed: {:?}: {}",
        outcome.stop_reason,
        outcome.text.unwrap_or_default()
    );
    let effects = std::fs::read_to_string(&log)?;
    println!(
        "`record` ran {} time(s) in all:\n{effects}",
        effects.lines().count()
    );
    Ok(())
}

/// The child: runs the first rounds with the store as its journal, printing the run id.
async fn child(db: &str, log: &str) -> Result<(), Box<dyn std::error::Error>> {
    let store = Store::open(db).await?;
    let tags = RunTags {
        on_started: Some(Arc::new(|id: &str| println!("run {id}"))),
        ..RunTags::default()
    };
    let agent = Agent::builder(ScriptedModel::from_json(FIRST_ROUNDS)?)
        .tools(tools(log.into()))
        .journal(store.run_journal(tags))
        .build()?;
    agent.prompt("Do both steps.").await;
    Ok(())
}
