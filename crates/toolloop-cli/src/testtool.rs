//! A test hook, not part of the command's interface: when `TOOLLOOP_TEST_EFFECTS` names a
//! file, the agent's only tools are `effect_a` to `effect_h`, side-effecting tools that append
//! their idempotency key to that file (their "side effect"), then wait
//! `TOOLLOOP_TEST_EFFECT_MS` milliseconds (default 0) or until the run is cancelled. The crash
//! and Ctrl-C tests count the lines. Eight names, because the mock server calls the offered
//! tools in turn with the same arguments, and the loop does not run a repeated call (the crash
//! test makes 8 calls per run).

use serde_json::json;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use toolloop::tool::{Tool, ToolContext, ToolError, ToolOutput, tool_fn};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct EffectArgs {
    /// Free text.
    #[allow(dead_code)]
    note: Option<String>,
}

/// The tools to offer: `tools`, or the test tool when the hook is set.
pub(crate) fn tools(tools: Vec<Arc<dyn Tool>>) -> Vec<Arc<dyn Tool>> {
    let Some(path) = std::env::var_os("TOOLLOOP_TEST_EFFECTS") else {
        return tools;
    };
    let delay = std::env::var("TOOLLOOP_TEST_EFFECT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    [
        "effect_a", "effect_b", "effect_c", "effect_d", "effect_e", "effect_f", "effect_g",
        "effect_h",
    ]
    .into_iter()
    .map(|name| effect_tool(name, path.clone(), delay))
    .collect()
}

fn effect_tool(name: &str, path: std::ffi::OsString, delay: u64) -> Arc<dyn Tool> {
    let effect = tool_fn(
        name,
        "Changes the world once per call (a test tool).",
        move |_args: EffectArgs, ctx: ToolContext| {
            let path = path.clone();
            async move {
                let line = format!("{}\n", ctx.idempotency_key);
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .and_then(|mut f| f.write_all(line.as_bytes()))
                    .map_err(|e| ToolError::new(format!("cannot record the effect: {e}")))?;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(delay)) => {}
                    _ = ctx.cancel.cancelled() => return Err(ToolError::new("cancelled")),
                }
                Ok::<_, ToolError>(ToolOutput::data(json!({"done": ctx.idempotency_key})))
            }
        },
    )
    .allow_parallel();
    Arc::new(effect)
}
