//! MCP servers for the command: `--mcp-config FILE` (the `mcpServers` JSON of Claude Desktop,
//! Cursor and Claude Code), the root's `.mcp.json` once trusted ([`trust`]), `--tools` /
//! `--no-tools`, and `toolloop mcp list|trust|untrust`. The servers start once per process (a
//! chat's runs share them) and are shut down when the command ends.

use crate::CliError;
use crate::args::McpArgs;
use crate::cx::Cx;
use clap::{Args, Subcommand};
use globset::{Glob, GlobSet, GlobSetBuilder};
use serde_json::{Value, json};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use toolloop::tool::{SideEffect, Tool};
use toolloop::tool_source::{ToolSource, ToolSourceError};
use toolloop::toolbox::Toolbox;
use toolloop_mcp::{McpTools, ServerConfig, Transport};

pub(crate) mod trust;

/// The file read from the root when present (Claude Code's project servers).
pub(crate) const PROJECT_FILE: &str = ".mcp.json";

impl McpArgs {
    /// Makes the config paths absolute (they are saved with the run, and a resume may start
    /// elsewhere), checking that they exist.
    pub(crate) fn absolutize(&mut self) -> Result<(), CliError> {
        for path in &mut self.mcp_config {
            *path = path
                .canonicalize()
                .map_err(|e| CliError::invalid(format!("--mcp-config {}", path.display()), e))?;
        }
        for p in self.tools.iter().chain(&self.no_tools) {
            glob(p)?;
        }
        Ok(())
    }
}

fn glob(pattern: &str) -> Result<Glob, CliError> {
    Glob::new(pattern.trim()).map_err(|e| {
        CliError::usage(format!(
            "--tools/--no-tools `{pattern}` is not a name or glob: {e}"
        ))
    })
}

fn globset(patterns: &[String]) -> Result<Option<GlobSet>, CliError> {
    let patterns: Vec<&String> = patterns.iter().filter(|p| !p.trim().is_empty()).collect();
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        b.add(glob(p)?);
    }
    b.build()
        .map(Some)
        .map_err(|e| CliError::invalid("--tools/--no-tools", e))
}

/// The servers of the flags, and the project file's when they are not started.
#[derive(Default)]
pub(crate) struct Configured {
    /// The servers to start: the --mcp-config files' in order, then the root's .mcp.json's
    /// when that exact file is trusted.
    pub(crate) servers: Vec<ServerConfig>,
    /// The root's .mcp.json when it is not trusted: its servers as written (`${VAR}` not
    /// expanded), not started.
    pub(crate) untrusted: Option<Untrusted>,
}

/// A project file whose servers are not started.
pub(crate) struct Untrusted {
    /// The file (canonical).
    pub(crate) file: PathBuf,
    /// Its servers, as written.
    pub(crate) servers: Vec<ServerConfig>,
    /// Not trusted (undecided) or declined.
    pub(crate) trust: trust::Trust,
}

/// The servers of a file's bytes, `${VAR}` expanded from the environment (`expand`) or left as
/// written; a relative working directory is the file's.
fn parse(
    cx: &Cx,
    bytes: &[u8],
    path: &Path,
    label: &str,
    expand: bool,
) -> Result<Vec<ServerConfig>, CliError> {
    let doc: Value = serde_json::from_slice(bytes)
        .map_err(|e| CliError::usage(format!("{label}: not valid JSON: {e}")))?;
    let lookup = |name: &str| crate::secrets::var(name);
    let servers = if expand {
        toolloop_mcp::parse_mcp_servers(&doc, &lookup)
    } else {
        toolloop_mcp::parse_mcp_servers_verbatim(&doc)
    };
    let mut servers = servers.map_err(|e| CliError::usage(format!("{label}: {e}")))?;
    for s in &mut servers {
        // A sandboxed server cannot read toolloop's own files either.
        if let Some(policy) = &mut s.sandbox {
            policy
                .secret_paths
                .extend(crate::sandbox::toolloop_secrets(cx));
        }
        if let Transport::Stdio { cwd: Some(dir), .. } = &mut s.transport
            && dir.is_relative()
            && let Some(base) = path.parent()
        {
            *dir = base.join(&*dir);
        }
    }
    Ok(servers)
}

fn add(
    out: &mut Vec<ServerConfig>,
    servers: Vec<ServerConfig>,
    label: &str,
) -> Result<(), CliError> {
    for s in servers {
        if out.iter().any(|o| o.name == s.name) {
            return Err(CliError::usage(format!(
                "{label}: an MCP server named `{}` is already configured",
                s.name
            )));
        }
        out.push(s);
    }
    Ok(())
}

/// The servers of the flags: the --mcp-config files in order (the user named them: read as
/// they are), then the root's .mcp.json, only when the user trusted this exact file (see
/// [`trust`]). An undecided file is asked about when `may_ask` and stdin and stderr are a
/// terminal; otherwise its servers are not started, with a note naming the command that
/// trusts it.
pub(crate) async fn server_configs(
    cx: &Cx,
    args: &McpArgs,
    root: &Path,
    may_ask: bool,
) -> Result<Configured, CliError> {
    let mut out = Configured::default();
    for path in &args.mcp_config {
        let label = format!("--mcp-config {}", path.display());
        let bytes = trust::read_config(path).map_err(|e| CliError::invalid(&label, e))?;
        let servers = parse(cx, &bytes, path, &label, true)?;
        add(&mut out.servers, servers, &label)?;
    }
    if args.no_mcp_json {
        return Ok(out);
    }
    let Some(file) = trust::read_project(root)? else {
        return Ok(out);
    };
    // Named with --mcp-config too: read above, as the user's.
    if args
        .mcp_config
        .iter()
        .any(|p| p.canonicalize().is_ok_and(|p| p == file.path))
    {
        return Ok(out);
    }
    let label = file.path.display().to_string();
    let dir = file.path.parent().unwrap_or(root).to_path_buf();
    let written = match parse(cx, &file.bytes, &file.path, &label, false) {
        Ok(s) => s,
        Err(e) => {
            if !trust::note(cx, &file, trust::Trust::Undecided) {
                crate::error::warn(format!(
                    "warning: not starting the MCP servers of {}: {}",
                    escape(&label),
                    escape(&crate::error::chain(&e))
                ));
            }
            return Ok(out);
        }
    };
    let mut decided = trust::trust_of(cx, &file);
    if decided == trust::Trust::Undecided
        && may_ask
        && std::io::stdin().is_terminal()
        && std::io::stderr().is_terminal()
    {
        decided = ask(cx, &file, &written).await;
    }
    if decided == trust::Trust::Trusted {
        let servers = parse(cx, &file.bytes, &file.path, &label, true)?;
        add(&mut out.servers, servers, &label)?;
        return Ok(out);
    }
    if !trust::note(cx, &file, decided) {
        let names: Vec<&str> = written.iter().map(|s| s.name.as_str()).collect();
        let why = if decided == trust::Trust::Declined {
            "you declined this version of the file"
        } else {
            "this version of the file is not trusted (a project's file can run any command \
             and read your keys)"
        };
        crate::error::warn(format!(
            "not starting the MCP servers of {} ({}): {why}; review it, then trust it with \
             `toolloop mcp trust --root {}`",
            escape(&label),
            escape(&names.join(", ")),
            escape(&dir.display().to_string())
        ));
    }
    out.untrusted = Some(Untrusted {
        file: file.path,
        servers: written,
        trust: decided,
    });
    Ok(out)
}

fn escape(text: &str) -> String {
    crate::terminal::escape(text, false).into_owned()
}

/// How a server of a file reads, as written: its command or URL, working directory,
/// variables and headers.
fn describe(server: &ServerConfig) -> String {
    let mut s = format!("{}: ", server.name);
    match &server.transport {
        Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            s.push_str(&format!("runs `{command}"));
            for a in args {
                s.push(' ');
                s.push_str(a);
            }
            s.push('`');
            if let Some(dir) = cwd {
                s.push_str(&format!(" in {}", dir.display()));
            }
            for (k, v) in env {
                s.push_str(&format!(", {k}={v}"));
            }
        }
        Transport::Http { url, headers } => {
            s.push_str(&format!("connects to {url}"));
            for (k, v) in headers {
                s.push_str(&format!(", {k}: {v}"));
            }
        }
    }
    escape(&s)
}

/// Asks on the terminal whether to trust the file; remembers a yes or a no.
async fn ask(cx: &Cx, file: &trust::ProjectFile, servers: &[ServerConfig]) -> trust::Trust {
    let mut text = format!(
        "toolloop: {} names MCP servers you have not trusted yet:\n",
        escape(&file.path.display().to_string())
    );
    for s in servers {
        text.push_str(&format!("  {}\n", describe(s)));
    }
    text.push_str(
        "  Trusting starts them as you, with ${VARIABLES} filled in from your environment.\n",
    );
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::{BufRead, Write};
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{text}");
        loop {
            let _ = write!(
                err,
                "  trust this exact file and start them? [y]es / [n]o: "
            );
            let _ = err.flush();
            let mut line = String::new();
            match std::io::stdin().lock().read_line(&mut line) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            match line.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" => return Some(true),
                "n" | "no" => return Some(false),
                _ => {}
            }
        }
    })
    .await
    .ok()
    .flatten();
    let Some(trusted) = answer else {
        return trust::Trust::Undecided;
    };
    if let Err(e) = trust::record(cx, file, trusted) {
        crate::error::warn(format!(
            "warning: cannot remember the decision: {}",
            crate::error::chain(&e)
        ));
    }
    if trusted {
        trust::Trust::Trusted
    } else {
        trust::Trust::Declined
    }
}

/// The MCP servers the command started: once, shared by the runs of a chat (kept in [`Cx`]).
#[derive(Default)]
pub(crate) struct Servers(Mutex<Option<(String, Arc<McpTools>)>>);

fn servers_for(cx: &Cx, configs: Vec<ServerConfig>) -> Result<Arc<McpTools>, CliError> {
    // A library's log line may repeat what a server sent back: never the configured secrets.
    cx.log_secrets
        .add(configs.iter().flat_map(ServerConfig::secrets));
    let key = format!("{configs:?}");
    let mut slot = cx.servers.0.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((k, tools)) = slot.as_ref()
        && *k == key
    {
        return Ok(tools.clone());
    }
    let tools = Arc::new(McpTools::new(configs).map_err(|e| CliError::usage(e.to_string()))?);
    if let Some((_, old)) = slot.replace((key, tools.clone())) {
        tokio::spawn(async move { old.shutdown().await });
    }
    Ok(tools)
}

/// Stops the process's servers (when the command ends).
pub(crate) async fn shutdown(cx: &Cx) {
    let servers = cx
        .servers
        .0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some((_, servers)) = servers {
        servers.shutdown().await;
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
    /// The servers' tools (recorded in the run's cassette, or, with `--replay-tools`, the
    /// recorded ones).
    servers: Arc<dyn ToolSource>,
    selection: Selection,
    /// The names offered when the run started (a declared agent may list them).
    listed: Vec<String>,
}

impl SelectedMcp {
    /// The names the servers offered when the run started.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.listed.iter().map(String::as_str)
    }

    /// Whether the servers offered a tool of this name when the run started.
    pub(crate) fn offered(&self, name: &str) -> bool {
        self.listed.iter().any(|n| n == name)
    }

    /// These servers' tools of the names in `only`, as a source of their own (for a declared
    /// agent that lists some of them).
    pub(crate) fn only(self: &Arc<Self>, only: Vec<String>) -> Arc<dyn ToolSource> {
        Arc::new(OnlyMcp {
            inner: self.clone(),
            only,
        })
    }
}

/// Some of the MCP servers' tools, by name.
struct OnlyMcp {
    inner: Arc<SelectedMcp>,
    only: Vec<String>,
}

#[async_trait::async_trait]
impl ToolSource for OnlyMcp {
    fn name(&self) -> &str {
        "mcp"
    }

    fn version(&self) -> u64 {
        self.inner.version()
    }

    async fn tools(&self, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
        let tools = self.inner.tools(reserved).await?;
        Ok(tools
            .into_iter()
            .filter(|t| self.only.iter().any(|n| n == t.name()))
            .collect())
    }
}

#[async_trait::async_trait]
impl ToolSource for SelectedMcp {
    fn name(&self) -> &str {
        "mcp"
    }

    fn version(&self) -> u64 {
        self.servers.version()
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
/// or list its tools (each within its own timeout, and before `deadline`, the run's) is an
/// error naming it; a server tool whose schema does not compile is left out with a warning.
/// `may_ask`: whether an untrusted project file may be asked about on the terminal.
pub(crate) async fn assemble(
    cx: &Cx,
    args: &McpArgs,
    root: &Path,
    builtin: Vec<Arc<dyn Tool>>,
    deadline: Option<tokio::time::Instant>,
    may_ask: bool,
) -> Result<RunTools, CliError> {
    let configs = server_configs(cx, args, root, may_ask).await?.servers;
    let selection = Selection::new(args)?;
    let reserved: Vec<String> = builtin.iter().map(|t| t.name().to_string()).collect();
    let mut tools = RunTools {
        own: builtin,
        mcp: None,
    };
    tools.own.retain(|t| selection.offers(t.name()));
    if !configs.is_empty() {
        let servers = servers_for(cx, configs)?;
        let reserved: Vec<&str> = reserved.iter().map(String::as_str).collect();
        // Listed now, so that a server that does not start is reported before the run.
        let listed = servers.tools_by(&reserved, deadline).await?;
        let mut names = Vec::new();
        for t in listed.iter().filter(|t| selection.offers(t.name())) {
            match Toolbox::new().add_arc(t.clone()) {
                Ok(_) => names.push(t.name().to_string()),
                Err(e) => crate::error::warn(format!("warning: MCP tool left out: {e}")),
            }
        }
        let servers: Arc<dyn ToolSource> = match cx.record.cassette() {
            // Their listings and results in the cassette too.
            Some(c) => c.wrap_source(servers),
            None => servers,
        };
        tools.mcp = Some(Arc::new(SelectedMcp {
            servers,
            selection,
            listed: names,
        }));
    } else if let Some(recorded) = crate::record::replayed_mcp_tools(cx) {
        // `--replay-tools`: no server is started; the recorded servers' tools are offered and
        // answered from the cassette.
        let reserved: Vec<&str> = reserved.iter().map(String::as_str).collect();
        let listed = recorded
            .tools(&reserved)
            .await
            .map_err(|e| CliError::failure("the recorded MCP tools", e))?;
        let names = listed
            .iter()
            .filter(|t| selection.offers(t.name()))
            .map(|t| t.name().to_string())
            .collect();
        tools.mcp = Some(Arc::new(SelectedMcp {
            servers: recorded,
            selection,
            listed: names,
        }));
    }
    Ok(tools)
}

/// `--tools` / `--no-tools`: which tools a run offers.
struct Selection {
    only: Option<GlobSet>,
    without: Option<GlobSet>,
}

impl Selection {
    fn new(args: &McpArgs) -> Result<Self, CliError> {
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
    /// Trust the root's .mcp.json as it is now: its servers start from then on, until the file
    /// changes. Prints what it trusts.
    Trust(TrustArgs),
    /// Forget the decision (trusted or declined) about the root's .mcp.json: its servers do not
    /// start until it is trusted again (a run on a terminal asks).
    Untrust(TrustArgs),
}

#[derive(Args, Debug)]
pub(crate) struct TrustArgs {
    /// The directory whose .mcp.json is meant.
    #[arg(long, default_value = ".")]
    root: PathBuf,
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

pub(crate) async fn mcp(cx: &Cx, command: McpCommand) -> Result<ExitCode, CliError> {
    match command {
        McpCommand::List(args) => list(cx, args).await,
        McpCommand::Trust(args) => trust_command(cx, args),
        McpCommand::Untrust(args) => untrust_command(args),
    }
}

/// `toolloop mcp trust`: trusts the root's .mcp.json as it is, printing what that starts.
fn trust_command(cx: &Cx, args: TrustArgs) -> Result<ExitCode, CliError> {
    let Some(file) = trust::read_project(&args.root)? else {
        return Err(CliError::usage(format!(
            "no {PROJECT_FILE} in {}",
            args.root.display()
        )));
    };
    let label = file.path.display().to_string();
    let servers =
        parse(cx, &file.bytes, &file.path, &label, false).map_err(|e| e.context("not trusted"))?;
    let store = trust::record(cx, &file, true)?;
    outln!(
        "trusted {} (sha256 {}); its MCP servers start from now on:",
        escape(&label),
        file.sha256
    );
    for s in &servers {
        outln!("  {}", describe(s));
    }
    if servers.is_empty() {
        outln!("  (none: the file names no servers, or all are disabled)");
    }
    outln!(
        "${{VARIABLES}} are filled in from your environment. A change to the file is asked about \
         again. Remembered in {}; `toolloop mcp untrust --root {}` revokes it.",
        escape(&store.display().to_string()),
        escape(
            &file
                .path
                .parent()
                .unwrap_or(&args.root)
                .display()
                .to_string()
        )
    );
    Ok(ExitCode::SUCCESS)
}

/// `toolloop mcp untrust`: forgets the decision about the root's .mcp.json.
fn untrust_command(args: TrustArgs) -> Result<ExitCode, CliError> {
    let path = args.root.join(PROJECT_FILE);
    // The file may be gone: the decision is by its path.
    let path = match path.canonicalize() {
        Ok(p) => p,
        Err(_) => match args.root.canonicalize() {
            Ok(root) => root.join(PROJECT_FILE),
            Err(e) => {
                return Err(CliError::invalid(
                    format!("--root {}", args.root.display()),
                    e,
                ));
            }
        },
    };
    let label = escape(&path.display().to_string());
    match trust::forget(&path)? {
        Some(d) => {
            let was = if d.trusted { "trusted" } else { "declined" };
            outln!(
                "forgot that {label} was {was}; its MCP servers do not start until it is trusted again"
            );
        }
        None => {
            outln!("nothing was decided about {label}; its MCP servers do not start");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(cx: &Cx, args: ListArgs) -> Result<ExitCode, CliError> {
    let Configured {
        servers: configs,
        untrusted,
    } = server_configs(cx, &args.mcp, &args.root, true).await?;
    if configs.is_empty() && untrusted.is_none() {
        return Err(CliError::usage(format!(
            "no MCP servers: give --mcp-config FILE, or put a {PROJECT_FILE} in the root"
        )));
    }
    let selection = Selection::new(&args.mcp)?;
    let servers = servers_for(cx, configs)?;
    let not_started: Vec<Value> = untrusted
        .iter()
        .flat_map(|u| {
            let state = match u.trust {
                trust::Trust::Declined => "not started: you declined this version of",
                _ => "not started: not trusted:",
            };
            let state = format!(
                "{state} {} (`toolloop mcp trust --root {}` trusts it)",
                u.file.display(),
                u.file.parent().unwrap_or(&args.root).display()
            );
            u.servers.iter().map(move |s| {
                json!({
                    "name": s.name,
                    "transport": transport_text(&s.transport),
                    "state": state,
                    "trusted": false,
                    "tools": [],
                })
            })
        })
        .collect();
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
            "trusted": true,
            "tools": tools,
        }));
    }
    out.extend(not_started);
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
    // Each server that failed says why in its state.
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
