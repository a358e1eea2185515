//! MCP servers as toolloop tools, on [rmcp](https://docs.rs/rmcp), the official Rust SDK.
//!
//! A server is a child process speaking MCP on stdio (`command`, `args`, `env`, `cwd`) or a
//! streamable HTTP endpoint (`url`, `headers`; feature `http`, on by default). [`McpTools`]
//! holds the servers of a process: each starts once, on first use, and [`McpTools::shutdown`]
//! stops them (a child is waited for, and killed after a grace period: no zombies). Their tools
//! become [`toolloop::tool::Tool`]s:
//!
//! - **Names**: a tool keeps its server's name for it, unless that name collides with another
//!   server's tool or with a name passed as reserved (the built-in tools); then it is
//!   `<server>__<tool>`. [`ServerConfig::prefix`] names every tool of a server
//!   `<prefix>__<tool>`. Characters providers refuse become `_`; names are cut to 64.
//! - **Side effects** come from the annotations ([`tool::side_effect_of`]): `readOnlyHint` is
//!   read-only (parallel-safe, run again on resume), `idempotentHint` idempotent, anything else
//!   side-effecting (reported "outcome unknown" on resume, never repeated).
//! - **Calls** carry the call's idempotency key in `_meta` ([`server::IDEMPOTENCY_KEY_META`]).
//!   The run's cancellation or deadline, and the server's `call_timeout`, reach the server as
//!   `notifications/cancelled`.
//! - **Results** ([`tool::to_output`]): text parts are the message, structured content the
//!   data; images (PNG, JPEG, GIF or WebP) go to the model with the result
//!   ([`toolloop::tool::ToolOutput::images`]); audio, other binary resources and other images
//!   become a line describing them; `isError` is a failed call the model reads.
//! - **Waits**: starting a server, and listing its tools, are each bounded by
//!   [`ServerConfig::startup_timeout`], and by a deadline when one is given
//!   ([`McpTools::tools_by`]); a call by [`ServerConfig::call_timeout`] (by default
//!   [`config::DEFAULT_CALL_TIMEOUT`]) and the run's cancellation. An answer rmcp cannot read
//!   (over 16 MiB, nested deeper than 128 levels, not JSON), over stdio or HTTP (a body or an
//!   SSE event), fails its request at once, naming the server ([`guard`]), instead of leaving
//!   it waiting.
//! - **Secrets**: what toolloop says about a server (errors, its state, its stderr) never
//!   repeats the secrets of its configuration ([`ServerConfig::secrets`]): a server that echoes
//!   its `Authorization` header in a 401 is reported with `[redacted]` in its place.
//! - **Faults**: a server that dies during a call fails that call ("went away during the call;
//!   the outcome is unknown") and is started again for the next one, at most
//!   [`ServerConfig::max_restarts`] times; a server that does not start is an error naming it,
//!   with the end of its stderr.
//! - **Environment**: a child gets this process's environment without the variables that may
//!   hold a credential, by the one rule of [`toolloop::redact::is_secret_env`] (names containing
//!   `KEY`, `TOKEN`, `SECRET`, `PASSWORD`, …, names marked secret such as the command's
//!   `--api-key-env`, values holding a URL with credentials); a secret a server needs must be
//!   listed in its `env`.
//! - **Changing tool lists**: after `notifications/tools/list_changed`, the next
//!   [`McpTools::tools`] lists the server's tools again. Given to an agent as a tool source
//!   (`AgentBuilder::tool_source`, as below), the servers' tools follow such changes during a
//!   run: before each model call, a server that said its list changed is listed again and the
//!   call offers the new catalog (logged, so a resumed run judges its calls by the tools it
//!   had). Tools passed with `AgentBuilder::tools` instead stay as they were listed; a tool the
//!   server dropped fails with the server's error.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use toolloop_mcp::{McpTools, ServerConfig};
//! let mcp = McpTools::new(vec![
//!     ServerConfig::stdio("fs", "npx", ["-y", "@modelcontextprotocol/server-filesystem", "."]),
//!     ServerConfig::http("web", "http://127.0.0.1:3001/mcp")
//!         .header("Authorization", format!("Bearer {}", std::env::var("WEB_TOKEN")?)),
//! ])?;
//! let mcp = std::sync::Arc::new(mcp);
//! # let model = toolloop::providers::test_model::TestModel::new();
//! // The servers' tools, after the agent's own (their names avoid the agent's).
//! let agent = toolloop::agent::Agent::builder(model)
//!     .tool_source_arc(mcp.clone())
//!     .build()?;
//! let outcome = agent.prompt("List the files").await;
//! mcp.shutdown().await;
//! # let _ = outcome; Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod config;
pub mod guard;
#[cfg(feature = "http")]
mod http;
pub mod server;
#[cfg(feature = "test-server")]
pub mod test_server;
pub mod tool;

pub use config::{
    ConfigError, ServerConfig, Transport, parse_mcp_servers, parse_mcp_servers_verbatim,
};
pub use server::{McpError, McpServer, ServerState};
pub use tool::McpTool;

use std::collections::HashMap;
use std::sync::Arc;
use toolloop::tool::Tool;
use toolloop::tool_source::{ToolSource, ToolSourceError};

/// The separator of prefixed tool names: `<server>__<tool>`.
pub const PREFIX_SEPARATOR: &str = "__";

/// The MCP servers of a process and their tools.
#[derive(Debug)]
pub struct McpTools {
    servers: Vec<Arc<McpServer>>,
}

impl McpTools {
    /// The servers (none started yet). Two servers with one name are refused.
    pub fn new(configs: Vec<ServerConfig>) -> Result<Self, ConfigError> {
        let mut seen = std::collections::HashSet::new();
        for c in &configs {
            if !seen.insert(c.name.clone()) {
                return Err(ConfigError {
                    message: format!("two MCP servers are named `{}`", c.name),
                });
            }
        }
        Ok(McpTools {
            servers: configs.into_iter().map(McpServer::new).collect(),
        })
    }

    /// The servers.
    pub fn servers(&self) -> &[Arc<McpServer>] {
        &self.servers
    }

    /// Whether any server said its tool list changed since it was last listed.
    pub fn tools_changed(&self) -> bool {
        self.servers.iter().any(|s| s.tools_changed())
    }

    /// A number that moves each time a server's tool list may have changed (see
    /// [`McpServer::tools_version`]).
    pub fn tools_version(&self) -> u64 {
        self.servers
            .iter()
            .fold(0u64, |v, s| v.wrapping_add(s.tools_version()))
    }

    /// Every server's tools, named (see the crate docs) so that none collides with another or
    /// with `reserved`. Starts the servers that are not running; fails naming the first server
    /// that cannot start or list its tools.
    pub async fn tools(&self, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, McpError> {
        self.tools_by(reserved, None).await
    }

    /// [`McpTools::tools`], each server given up at `deadline` too (a run's timeout): the error
    /// names the first server without a list by then.
    pub async fn tools_by(
        &self,
        reserved: &[&str],
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Vec<Arc<dyn Tool>>, McpError> {
        let mut out = Vec::new();
        for (_, tools) in self.catalog_by(reserved, deadline).await {
            out.extend(tools?.into_iter().map(|t| t as Arc<dyn Tool>));
        }
        Ok(out)
    }

    /// Each server with its tools (named as [`McpTools::tools`] names them, among the servers
    /// that answered), or why it has none.
    pub async fn catalog(
        &self,
        reserved: &[&str],
    ) -> Vec<(Arc<McpServer>, Result<Vec<Arc<McpTool>>, McpError>)> {
        self.catalog_by(reserved, None).await
    }

    /// [`McpTools::catalog`], each server given up at `deadline` too.
    pub async fn catalog_by(
        &self,
        reserved: &[&str],
        deadline: Option<tokio::time::Instant>,
    ) -> Vec<(Arc<McpServer>, Result<Vec<Arc<McpTool>>, McpError>)> {
        let listed =
            futures::future::join_all(self.servers.iter().map(|s| s.list_tools_by(deadline))).await;
        let mut keys: Vec<(&str, Option<&str>, &str)> = Vec::new();
        for (server, tools) in self.servers.iter().zip(&listed) {
            if let Ok(tools) = tools {
                for t in tools.iter() {
                    keys.push((
                        server.name(),
                        server.config().prefix.as_deref(),
                        t.name.as_ref(),
                    ));
                }
            }
        }
        let mut names = assign_names(&keys, reserved).into_iter();
        self.servers
            .iter()
            .zip(listed)
            .map(|(server, tools)| {
                let tools = tools.map(|tools| {
                    tools
                        .iter()
                        .zip(names.by_ref())
                        .map(|(t, name)| Arc::new(McpTool::new(server.clone(), t, name)))
                        .collect()
                });
                (server.clone(), tools)
            })
            .collect()
    }

    /// Stops every server (see [`McpServer::shutdown`]).
    pub async fn shutdown(&self) {
        futures::future::join_all(self.servers.iter().map(|s| s.shutdown())).await;
    }
}

/// The servers as a tool source of an agent ([`toolloop::AgentBuilder::tool_source`]): a run
/// offers their tools, and lists them again before a model call after a server said its list
/// changed (or was started again), so a tool a server adds during a run is offered from the
/// next round on.
#[async_trait::async_trait]
impl ToolSource for McpTools {
    fn name(&self) -> &str {
        "mcp"
    }

    fn version(&self) -> u64 {
        self.tools_version()
    }

    async fn tools(&self, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
        McpTools::tools(self, reserved)
            .await
            .map_err(|e| ToolSourceError {
                source_name: e.server,
                message: e.message,
            })
    }
}

/// A tool name providers accept: characters other than `A-Z a-z 0-9 _ - .` become `_`; at most
/// 64 characters.
fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() { "_".into() } else { s }
}

fn cut(name: String) -> String {
    if name.len() <= 64 {
        name
    } else {
        name[..64].to_string()
    }
}

/// The names tools are offered under, for `(server, prefix, tool)` entries: see the crate docs.
/// Names still equal after that get `_2`, `_3`, ….
pub fn assign_names(entries: &[(&str, Option<&str>, &str)], reserved: &[&str]) -> Vec<String> {
    let base: Vec<String> = entries
        .iter()
        .map(|(_, prefix, tool)| match prefix {
            Some(p) => format!("{}{PREFIX_SEPARATOR}{}", sanitize(p), sanitize(tool)),
            None => sanitize(tool),
        })
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for b in &base {
        *counts.entry(b.as_str()).or_default() += 1;
    }
    let named: Vec<String> = entries
        .iter()
        .zip(&base)
        .map(|((server, prefix, tool), b)| {
            let collides = counts[b.as_str()] > 1 || reserved.contains(&b.as_str());
            if collides && prefix.is_none() {
                cut(format!(
                    "{}{PREFIX_SEPARATOR}{}",
                    sanitize(server),
                    sanitize(tool)
                ))
            } else {
                cut(b.clone())
            }
        })
        .collect();
    let mut taken: std::collections::HashSet<String> =
        reserved.iter().map(|s| s.to_string()).collect();
    named
        .into_iter()
        .map(|n| {
            if taken.insert(n.clone()) {
                return n;
            }
            let mut i = 2;
            loop {
                let suffix = format!("_{i}");
                let mut candidate = n.clone();
                candidate.truncate(64 - suffix.len());
                candidate.push_str(&suffix);
                if taken.insert(candidate.clone()) {
                    return candidate;
                }
                i += 1;
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_collide_into_server_prefixes() {
        let names = assign_names(
            &[
                ("a", None, "search"),
                ("b", None, "search"),
                ("a", None, "read_file"),
                ("a", None, "only a"),
                ("c", Some("gh"), "issues"),
                ("c", Some("gh"), "search"),
            ],
            &["read_file"],
        );
        assert_eq!(
            names,
            [
                "a__search",
                "b__search",
                "a__read_file",
                "only_a",
                "gh__issues",
                "gh__search"
            ]
        );
        let long = "x".repeat(80);
        let names = assign_names(&[("a", None, &long), ("b", None, &long)], &[]);
        assert_eq!(names[0].len(), 64);
        assert_ne!(names[0], names[1]);
    }
}
