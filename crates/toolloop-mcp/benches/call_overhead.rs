//! What the loop adds to an MCP call: one `echo` call to `server-everything` over stdio,
//! made (a) by a bare rmcp client, (b) by a whole agent run whose (in-process, instant) model
//! calls the tool once, the tool given to the agent as it was listed, and (c) the same run with
//! the servers as the agent's tool source (listed when each run starts and checked before each
//! model call, as the `toolloop` command uses them), all against the same kind of server in the
//! same process, interleaved in rounds. Prints the medians and their ratios to (a).
//!
//! `cargo bench -p toolloop-mcp --bench call_overhead -- [calls per round] [rounds]`
//! (needs node and `scripts/npm-install`; says so and exits when they are missing).

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolloop::agent::Agent;
use toolloop::providers::test_model::TestModel;
use toolloop::tool::Tool;
use toolloop::tool_source::{ToolSource, ToolSourceError};
use toolloop_mcp::{McpTools, ServerConfig};

/// The servers' `echo` tool alone, as a tool source.
struct EchoOnly(Arc<McpTools>);

#[async_trait::async_trait]
impl ToolSource for EchoOnly {
    fn name(&self) -> &str {
        "echo only"
    }
    fn version(&self) -> u64 {
        self.0.tools_version()
    }
    async fn tools(&self, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
        let tools = ToolSource::tools(&*self.0, reserved).await?;
        Ok(tools.into_iter().filter(|t| t.name() == "echo").collect())
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let calls: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(200);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let entry = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !entry.is_file()
        || std::process::Command::new("node")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!(
            "call_overhead: node or {} is missing (scripts/npm-install); nothing measured",
            entry.display()
        );
        return;
    }
    let entry = entry.to_string_lossy().into_owned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // (a) a bare rmcp client.
        let mut cmd = tokio::process::Command::new("node");
        cmd.arg(&entry).arg("stdio");
        let bare = ().serve(rmcp::transport::TokioChildProcess::new(cmd).unwrap()).await.unwrap();
        let mut args = serde_json::Map::new();
        args.insert("message".into(), "a".into());
        // (b) the loop: an agent whose only tool is the server's echo.
        let mcp = Arc::new(McpTools::new(vec![ServerConfig::stdio("e", "node", [entry.clone(), "stdio".into()])]).unwrap());
        let tools = mcp.tools(&[]).await.unwrap();
        let echo: Vec<_> = tools.into_iter().filter(|t| t.name() == "echo").collect();
        let agent = Agent::builder(TestModel::new()).tools(echo).build().unwrap();
        // (c) the loop with the server as its tool source (its own server).
        let sourced_mcp = Arc::new(McpTools::new(vec![ServerConfig::stdio("e", "node", [entry.clone(), "stdio".into()])]).unwrap());
        let sourced = Agent::builder(TestModel::new())
            .tool_source(EchoOnly(sourced_mcp.clone()))
            .build()
            .unwrap();
        // Warm up all three.
        for _ in 0..20 {
            bare.call_tool(CallToolRequestParams::new("echo").with_arguments(args.clone())).await.unwrap();
            assert!(agent.prompt("go").await.success);
            assert!(sourced.prompt("go").await.success);
        }
        let (mut bare_t, mut loop_t, mut sourced_t) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..calls {
                let r = bare.call_tool(CallToolRequestParams::new("echo").with_arguments(args.clone())).await.unwrap();
                assert_ne!(r.is_error, Some(true));
            }
            bare_t.push(t.elapsed() / calls as u32);
            let t = Instant::now();
            for _ in 0..calls {
                let o = agent.prompt("go").await;
                assert!(o.success && o.tool_calls.len() == 1 && o.tool_calls[0].success());
            }
            loop_t.push(t.elapsed() / calls as u32);
            let t = Instant::now();
            for _ in 0..calls {
                let o = sourced.prompt("go").await;
                assert!(o.success && o.tool_calls.len() == 1 && o.tool_calls[0].success());
            }
            sourced_t.push(t.elapsed() / calls as u32);
        }
        let (b, l, s) = (median(bare_t), median(loop_t), median(sourced_t));
        println!(
            "one echo call over stdio ({calls} calls x {rounds} rounds, medians): bare rmcp client {:.1} µs; \
             agent run (2 model turns + the call) {:.1} µs, ratio {:.2}x; \
             the same with the server as a tool source {:.1} µs, ratio {:.2}x",
            b.as_secs_f64() * 1e6,
            l.as_secs_f64() * 1e6,
            l.as_secs_f64() / b.as_secs_f64(),
            s.as_secs_f64() * 1e6,
            s.as_secs_f64() / b.as_secs_f64()
        );
        let _ = bare.cancel().await;
        mcp.shutdown().await;
        sourced_mcp.shutdown().await;
    });
}
