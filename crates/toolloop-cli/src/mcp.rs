//! MCP servers for the command: `--mcp-config FILE` (the `mcpServers` JSON of Claude Desktop,
//! Cursor and Claude Code), the root's `.mcp.json`, `--tools` / `--no-tools`, and
//! `toolloop mcp list`. The servers start once per process (a chat's runs share them) and are
//! shut down when the command ends.

use crate::EXIT_USAGE;
use clap::{Args, Subcommand};
use globset::{Glob, GlobSet, GlobSetBuilder};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use toolloop::tool::{SideEffect, Tool};
use toolloop::tool_source::{ToolSource, ToolSourceError};
use toolloop::toolbox::Toolbox;
use toolloop_mcp::{McpTools, ServerConfig, Transport};

/// The file read from the root when present (Claude Code's project servers).
pub(crate) const PROJECT_FILE: &str = ".mcp.json";

/// The MCP and tool-selection flags (part of a run's saved configuration).
#[derive(Args, Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct McpArgs {
    /// Use the MCP servers of this file: `{"mcpServers": {"name": {"command": …, "args": […],
    /// "env": {…}, "cwd": …} or {"url": …, "headers": {…}}}}` (Claude Desktop, Cursor and
    /// Claude Code's format; `${VAR}` is replaced by the variable). Repeatable. The root's
    /// .mcp.json is read too, unless --no-mcp-json.
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    pub mcp_config: Vec<PathBuf>,
    /// Do not read the MCP servers of the root's .mcp.json.
    #[arg(long)]
    #[serde(default)]
    pub no_mcp_json: bool,
    /// Offer only the tools whose names match: names or globs (`read_*`, `fs__*`), comma
    /// separated; repeatable.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    #[serde(default)]
    pub tools: Vec<String>,
    /// Do not offer the tools whose names match: names or globs, comma separated; repeatable.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    #[serde(default)]
    pub no_tools: Vec<String>,
}

impl McpArgs {
    /// Makes the config paths absolute (they are saved with the run, and a resume may start
    /// elsewhere), checking that they exist.
    pub(crate) fn absolutize(&mut self) -> Result<(), String> {
        for path in &mut self.mcp_config {
            *path = path
                .canonicalize()
                .map_err(|e| format!("--mcp-config {}: {e}", path.display()))?;
        }
        for p in self.tools.iter().chain(&self.no_tools) {
            glob(p)?;
        }
        Ok(())
    }
}

fn glob(pattern: &str) -> Result<Glob, String> {
    Glob::new(pattern.trim())
        .map_err(|e| format!("--tools/--no-tools `{pattern}` is not a name or glob: {e}"))
}

fn globset(patterns: &[String]) -> Result<Option<GlobSet>, String> {
    let patterns: Vec<&String> = patterns.iter().filter(|p| !p.trim().is_empty()).collect();
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        b.add(glob(p)?);
    }
    b.build().map(Some).map_err(|e| e.to_string())
}

/// The servers of the flags: the --mcp-config files in order, then the root's .mcp.json.
pub(crate) fn server_configs(args: &McpArgs, root: &Path) -> Result<Vec<ServerConfig>, String> {
    let mut files: Vec<(PathBuf, String)> = args
        .mcp_config
        .iter()
        .map(|p| (p.clone(), format!("--mcp-config {}", p.display())))
        .collect();
    let project = root.join(PROJECT_FILE);
    if !args.no_mcp_json && project.is_file() {
        files.push((project.clone(), project.display().to_string()));
    }
    let lookup = |name: &str| crate::secrets::var(name);
    let mut out: Vec<ServerConfig> = Vec::new();
    for (path, label) in files {
        let text =
            toolloop::user_file::read_to_string(&path, toolloop::user_file::DEFAULT_MAX_BYTES)
                .map_err(|e| format!("{label}: {e}"))?;
        let doc: Value =
            serde_json::from_str(&text).map_err(|e| format!("{label}: not valid JSON: {e}"))?;
        let servers =
            toolloop_mcp::parse_mcp_servers(&doc, &lookup).map_err(|e| format!("{label}: {e}"))?;
        for mut s in servers {
            if out.iter().any(|o| o.name == s.name) {
                return Err(format!(
                    "{label}: an MCP server named `{}` is already configured",
                    s.name
                ));
            }
            // A sandboxed server cannot read toolloop's own files either.
            if let Some(policy) = &mut s.sandbox {
                policy
                    .secret_paths
                    .extend(crate::sandbox::toolloop_secrets());
            }
            // A relative working directory is the config file's.
            if let Transport::Stdio { cwd: Some(dir), .. } = &mut s.transport
                && dir.is_relative()
                && let Some(base) = path.parent()
            {
                *dir = base.join(&*dir);
            }
            out.push(s);
        }
    }
    Ok(out)
}

/// The process's servers: started once, shared by the runs of a chat.
static SERVERS: Mutex<Option<(String, Arc<McpTools>)>> = Mutex::new(None);

fn servers_for(configs: Vec<ServerConfig>) -> Result<Arc<McpTools>, String> {
    let key = format!("{configs:?}");
    let mut slot = SERVERS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((k, tools)) = slot.as_ref()
        && *k == key
    {
        return Ok(tools.clone());
    }
    let tools = Arc::new(McpTools::new(configs).map_err(|e| e.to_string())?);
    if let Some((_, old)) = slot.replace((key, tools.clone())) {
        tokio::spawn(async move { old.shutdown().await });
    }
    Ok(tools)
}

/// Stops the process's servers (when the command ends).
pub(crate) async fn shutdown() {
    let servers = SERVERS.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some((_, servers)) = servers {
        servers.shutdown().await;
    }
}

/// A failure to assemble the tools: a usage error (a bad flag or file) or a server that failed.
pub(crate) enum ToolsError {
    /// Exit code 2.
    Usage(String),
    /// Exit code 1.
    Failed(String),
}

impl ToolsError {
    /// Says it on stderr; the exit code.
    pub(crate) fn report(self) -> ExitCode {
        match self {
            ToolsError::Usage(m) => {
                eprintln!("toolloop: {m}");
                ExitCode::from(EXIT_USAGE)
            }
            ToolsError::Failed(m) => {
                eprintln!("toolloop: {m}");
                ExitCode::FAILURE
            }
        }
    }
}

/// A run's tools: its own (the built-in ones) and the MCP servers' as a tool source, so that a
/// server's changed tool list reaches a run between rounds.
#[derive(Default)]
pub(crate) struct RunTools {
    /// The built-in tools (selected by `--tools` / `--no-tools`).
    pub(crate) own: Vec<Arc<dyn Tool>>,
    /// The MCP servers' tools, when servers are configured.
    pub(crate) mcp: Option<Arc<SelectedMcp>>,
}

impl RunTools {
    /// Every tool offered now: the own ones, then the servers' as listed last (for what lists
    /// tools once: a workflow's steps).
    pub(crate) async fn all(&self) -> Vec<Arc<dyn Tool>> {
        let mut tools = self.own.clone();
        if let Some(mcp) = &self.mcp {
            let reserved: Vec<&str> = self.own.iter().map(|t| t.name()).collect();
            tools.extend(mcp.tools(&reserved).await.unwrap_or_default());
        }
        tools
    }
}

/// The MCP servers' tools that `--tools` / `--no-tools` select, whose schemas compile.
pub(crate) struct SelectedMcp {
    servers: Arc<McpTools>,
    selection: Selection,
}

#[async_trait::async_trait]
impl ToolSource for SelectedMcp {
    fn name(&self) -> &str {
        "mcp"
    }

    fn version(&self) -> u64 {
        self.servers.tools_version()
    }

    async fn tools(&self, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
        let tools = ToolSource::tools(&*self.servers, reserved).await?;
        Ok(tools
            .into_iter()
            .filter(|t| {
                self.selection.offers(t.name()) && Toolbox::new().add_arc(t.clone()).is_ok()
            })
            .collect())
    }
}

/// The run's tools: the built-in ones, then the MCP servers' (listed afresh when a server said
/// its list changed), each selected by `--tools` / `--no-tools`. A server that cannot start
/// or list its tools is an error naming it; a server tool whose schema does not compile is
/// left out with a warning.
pub(crate) async fn assemble(
    args: &McpArgs,
    root: &Path,
    builtin: Vec<Arc<dyn Tool>>,
) -> Result<RunTools, ToolsError> {
    let configs = server_configs(args, root).map_err(ToolsError::Usage)?;
    let selection = Selection::new(args).map_err(ToolsError::Usage)?;
    let reserved: Vec<String> = builtin.iter().map(|t| t.name().to_string()).collect();
    let mut tools = RunTools {
        own: builtin,
        mcp: None,
    };
    tools.own.retain(|t| selection.offers(t.name()));
    if !configs.is_empty() {
        let servers = servers_for(configs).map_err(ToolsError::Usage)?;
        let reserved: Vec<&str> = reserved.iter().map(String::as_str).collect();
        // Listed now, so that a server that does not start is reported before the run.
        let listed = servers
            .tools(&reserved)
            .await
            .map_err(|e| ToolsError::Failed(e.to_string()))?;
        for t in listed.iter().filter(|t| selection.offers(t.name())) {
            if let Err(e) = Toolbox::new().add_arc(t.clone()) {
                eprintln!("toolloop: warning: MCP tool left out: {e}");
            }
        }
        tools.mcp = Some(Arc::new(SelectedMcp { servers, selection }));
    }
    Ok(tools)
}

/// `--tools` / `--no-tools`: which tools a run offers.
struct Selection {
    only: Option<GlobSet>,
    without: Option<GlobSet>,
}

impl Selection {
    fn new(args: &McpArgs) -> Result<Self, String> {
        Ok(Selection {
            only: globset(&args.tools)?,
            without: globset(&args.no_tools)?,
        })
    }

    /// Whether a run offers the tool of this name.
    fn offers(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|g| g.is_match(name))
            && !self.without.as_ref().is_some_and(|g| g.is_match(name))
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum McpCommand {
    /// Start the configured MCP servers and show each one, its state and its tools with their
    /// annotations; tools that --tools/--no-tools leave out are marked "not offered".
    List(ListArgs),
}

#[derive(Args, Debug)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    mcp: McpArgs,
    /// The root whose .mcp.json is read (and whose file tools' names MCP tools avoid).
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn side_effect_name(s: SideEffect) -> &'static str {
    match s {
        SideEffect::ReadOnly => "read-only",
        SideEffect::Idempotent => "idempotent",
        SideEffect::SideEffecting => "side-effecting",
    }
}

fn transport_text(t: &Transport) -> String {
    match t {
        Transport::Stdio { command, args, .. } => {
            let mut s = format!("stdio: {command}");
            for a in args {
                s.push(' ');
                s.push_str(a);
            }
            s
        }
        // Without the query: it may hold a key.
        Transport::Http { url, .. } => format!("http: {}", url.split('?').next().unwrap_or("")),
    }
}

pub(crate) async fn mcp(command: McpCommand) -> ExitCode {
    match command {
        McpCommand::List(args) => list(args).await,
    }
}

async fn list(args: ListArgs) -> ExitCode {
    let configs = match server_configs(&args.mcp, &args.root) {
        Ok(c) => c,
        Err(e) => return ToolsError::Usage(e).report(),
    };
    if configs.is_empty() {
        eprintln!(
            "toolloop: no MCP servers: give --mcp-config FILE, or put a {PROJECT_FILE} in the root"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let selection = match Selection::new(&args.mcp) {
        Ok(s) => s,
        Err(e) => return ToolsError::Usage(e).report(),
    };
    let servers = match servers_for(configs) {
        Ok(s) => s,
        Err(e) => return ToolsError::Usage(e).report(),
    };
    let reserved: Vec<String> = toolloop_tools::fs::builtin_tools(&args.root, true)
        .map(|t| t.iter().map(|t| t.name().to_string()).collect())
        .unwrap_or_default();
    let reserved: Vec<&str> = reserved.iter().map(String::as_str).collect();
    let catalog = servers.catalog(&reserved).await;
    let mut failed = false;
    let mut out = Vec::new();
    for (server, tools) in &catalog {
        let state = server.state().to_string();
        let tools: Vec<Value> = match tools {
            Ok(tools) => tools
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name(),
                        "server_name": t.remote_name(),
                        "side_effect": side_effect_name(t.side_effect()),
                        "annotations": t.annotations(),
                        "description": t.description(),
                        "offered": selection.offers(t.name()),
                    })
                })
                .collect(),
            Err(_) => {
                failed = true;
                Vec::new()
            }
        };
        out.push(json!({
            "name": server.name(),
            "transport": transport_text(&server.config().transport),
            "state": state,
            "tools": tools,
        }));
    }
    servers.shutdown().await;
    if args.json {
        outln!("{}", Value::Array(out));
    } else {
        for s in &out {
            outln!(
                "{} ({}): {}",
                s["name"].as_str().unwrap_or(""),
                crate::terminal::escape(s["transport"].as_str().unwrap_or(""), false),
                crate::terminal::escape(s["state"].as_str().unwrap_or(""), false)
            );
            for t in s["tools"].as_array().into_iter().flatten() {
                let mut hints = Vec::new();
                if let Some(a) = t["annotations"].as_object() {
                    for (k, v) in a {
                        if k.ends_with("Hint") {
                            hints.push(format!("{k}={v}"));
                        }
                    }
                }
                let mut line = format!(
                    "  {} [{}]",
                    t["name"].as_str().unwrap_or(""),
                    t["side_effect"].as_str().unwrap_or("")
                );
                if t["server_name"] != t["name"] {
                    line.push_str(&format!(
                        " (the server's `{}`)",
                        t["server_name"].as_str().unwrap_or("")
                    ));
                }
                if !hints.is_empty() {
                    line.push_str(&format!(" {}", hints.join(" ")));
                }
                if t["offered"] == false {
                    line.push_str(" (not offered: --tools/--no-tools)");
                }
                let description = t["description"].as_str().unwrap_or("");
                let first = description.lines().next().unwrap_or("");
                line.push_str(&format!(": {first}"));
                outln!("{}", crate::terminal::escape(&line, false));
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
