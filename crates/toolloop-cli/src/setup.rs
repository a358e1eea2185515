//! The agent set-up: from the arguments of [`crate::args`] to an agent ready to run. The
//! settings are made self-contained (`AgentArgs::prepare`), the tools gathered ([`tools`]),
//! the approval policy made ([`approvals`]), the agents the main agent delegates to attached,
//! and the builder made ([`agent_builder_with`]); a saved run's arguments are loaded back
//! ([`saved_run`]).
//!
//! Agents the main agent delegates to are `[agents.NAME]` tables of the configuration file or
//! of an `--agents FILE`, each offered to the main agent as a tool (see `toolloop::subagent`),
//! or run directly with `--agent NAME`:
//!
//! ```toml
//! [agents.reviewer]
//! description = "Reviews a change for bugs; give it the files to read."
//! model = "fast"                  # a model of [models], or provider:model; default: the run's
//! system = "You review code. Report bugs only."
//! tools = ["read_file", "list_dir"] # the run's tools and other agents; default: the run's tools
//! max_rounds = 6
//! max_tool_calls = 12
//! timeout = "2m"
//! max_tokens = 50000
//! max_cost = 0.25
//! ```

use crate::CliError;
use crate::args::{
    AgentArgs, AgentDef, AgentsArgs, ApprovalArgs, DurabilityArg, DurableArgs, MAX_OUTPUT_TOKENS,
    MAX_TIMEOUT, RunArgs, StoreArgs, check_temperature, parse_defs, parse_timeout,
};
use crate::cx::Cx;
use crate::durable::open_store;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use toolloop::agent::AgentBuilder;
use toolloop::approval::{Action, Approvals, Rule};
use toolloop::image::Image;
use toolloop::subagent::{SubAgent, check_graph};
use toolloop::tool::Tool;
use toolloop::tool_source::ToolSource;

/// The images `--attach` names: files are read (and checked to be images); URLs (anything with
/// `://`, and `data:` URLs) are checked.
pub(crate) fn attachments(items: &[String]) -> Result<Vec<Image>, CliError> {
    items
        .iter()
        .map(|item| {
            let is_url = item.contains("://") || item.to_ascii_lowercase().starts_with("data:");
            let image = if is_url {
                Image::from_url(item)
            } else {
                Image::from_file(item)
            };
            image.map_err(|e| CliError::invalid("--attach", e))
        })
        .collect()
}

impl AgentArgs {
    /// Makes the settings self-contained before a run: a named model of the configuration
    /// file is replaced by its settings, and what the flags name in files (`--system-file`) is
    /// read in, so that the run's saved configuration needs neither. Says on stderr when no
    /// model was chosen anywhere (the offline test model answers).
    pub(crate) fn prepare(&mut self, cx: &Cx) -> Result<(), CliError> {
        self.agents.prepare(cx)?;
        self.take_direct_agent()?;
        cx.config.resolve_model(&mut self.provider)?;
        if self.provider.model.trim() == "test" && !cx.config.model_chosen() {
            crate::error::warn(
                "no model configured: the offline test model answers. Choose one with --model \
                 provider:model (e.g. openai:gpt-4.1-mini), TOOLLOOP_MODEL, or `model` in the \
                 configuration file (`toolloop config path`).",
            );
        }
        self.read_files(cx)
    }

    /// `--agent NAME`: the run becomes that agent's (its model, system prompt and limits).
    pub(crate) fn take_direct_agent(&mut self) -> Result<(), CliError> {
        if let Some(def) = self.agents.direct().cloned() {
            // `--agent NAME`: the run is that agent's.
            if let Some(model) = def.model {
                self.provider.model = model;
            }
            if def.system.is_some() {
                self.system = def.system;
                self.system_file = None;
            }
            if let Some(n) = def.max_rounds {
                self.max_rounds = n;
            }
            if let Some(n) = def.max_tool_calls {
                self.max_tool_calls = n;
            }
            if let Some(t) = &def.timeout {
                self.timeout = Some(parse_timeout(t).map_err(CliError::Usage)?);
            }
        }
        Ok(())
    }

    /// Reads in what the flags name in files (`--system-file`, `--output-schema`, `--prices`).
    fn read_files(&mut self, cx: &Cx) -> Result<(), CliError> {
        if let Some(path) = self.system_file.take() {
            let text = toolloop::user_file::read_to_string(&path, MAX_SYSTEM_FILE_BYTES)
                .map_err(|e| CliError::invalid(format!("--system-file {}", path.display()), e))?;
            self.system = Some(text);
        }
        if let Some(path) = self.output_schema.take() {
            self.output = Some(read_output_schema(&path)?);
        }
        if let Some(path) = self.prices.take() {
            let text = toolloop::user_file::read_to_string(&path, MAX_PRICES_BYTES)
                .map_err(|e| CliError::invalid(format!("--prices {}", path.display()), e))?;
            price_table(Some(&text))
                .map_err(|e| e.context(format!("--prices {}", path.display())))?;
            self.price_entries = Some(text);
        }
        // The cassette, once the settings are whole (they are recorded with it).
        crate::record::note_fallback(cx, &self.record);
        let mut settings = serde_json::to_value(&*self)
            .map_err(|e| CliError::failed(format!("cannot write the settings as JSON: {e}")))?;
        if let Some(o) = settings.as_object_mut() {
            o.insert(
                "toolloop_version".into(),
                Value::from(env!("CARGO_PKG_VERSION")),
            );
        }
        crate::record::setup(cx, &self.record, &self.provider.model, settings)?;
        if self.record.replay_tools {
            // Nothing is run: not even the MCP servers (the cassette holds their tools and
            // results).
            if !self.mcp.mcp_config.is_empty() {
                crate::error::warn(
                    "--replay-tools: the MCP servers of --mcp-config are not started; their \
                     tools are answered from the cassette",
                );
            }
            self.mcp.mcp_config.clear();
            self.mcp.no_mcp_json = true;
        }
        Ok(())
    }

    /// Streams on a terminal: the text is shown as it comes unless `--no-stream` is given, a
    /// program reads the output (`machine_output`), or the answer is the validated JSON (printed
    /// once it is known).
    pub(crate) fn stream_on_terminal(&mut self, machine_output: bool) {
        if !self.no_stream
            && !machine_output
            && self.output.is_none()
            && std::io::stdout().is_terminal()
        {
            self.stream = true;
        }
    }

    /// Checks what the flags' parsers check (for a configuration that did not come through
    /// them: one saved with a run), and what depends on the provider. A saved timeout beyond
    /// [`MAX_TIMEOUT`] (from an older version that accepted one) is brought down to it, with a
    /// note on stderr, so that the run can still be resumed.
    pub(crate) fn check(&mut self) -> Result<(), CliError> {
        self.agents.check()?;
        if self.max_rounds == 0 {
            return Err(CliError::usage(
                "--max-rounds 0: a run needs at least 1 round",
            ));
        }
        if let Some(n) = self.max_output_tokens
            && !(1..=MAX_OUTPUT_TOKENS).contains(&n)
        {
            return Err(CliError::usage(format!(
                "--max-output-tokens {n}: expected 1 to {MAX_OUTPUT_TOKENS}"
            )));
        }
        if let Some(t) = self.temperature {
            check_temperature(t).map_err(|e| CliError::usage(format!("--temperature: {e}")))?;
            if t > 1.0 && self.provider.model.trim().starts_with("anthropic:") {
                return Err(CliError::usage(format!(
                    "--temperature {t}: Anthropic accepts a temperature from 0 to 1"
                )));
            }
        }
        match self.timeout {
            Some(t) if t.is_zero() => {
                return Err(CliError::usage("--timeout 0: expected a positive duration"));
            }
            Some(t) if t > MAX_TIMEOUT => {
                crate::error::warn(format!(
                    "the saved timeout ({}s) is beyond the longest, 30 days: using 30 days",
                    t.as_secs()
                ));
                self.timeout = Some(MAX_TIMEOUT);
            }
            _ => {}
        }
        Ok(())
    }
}

/// The largest `--output-schema` file.
const MAX_SCHEMA_BYTES: u64 = 1024 * 1024;

/// The largest `--system-file`.
const MAX_SYSTEM_FILE_BYTES: u64 = 1024 * 1024;

/// The largest `--prices` file.
const MAX_PRICES_BYTES: u64 = 1024 * 1024;

/// Reads an `--output-schema` file: a JSON Schema (an object), named after its `title`, else
/// after the file. The errors name the flag and the file.
pub(crate) fn read_output_schema(
    path: &std::path::Path,
) -> Result<toolloop::OutputSchema, CliError> {
    let at = || format!("--output-schema {}", path.display());
    let text = toolloop::user_file::read_to_string(path, MAX_SCHEMA_BYTES)
        .map_err(|e| CliError::invalid(at(), format!("{e}; expected a JSON Schema")))?;
    let schema: Value = serde_json::from_str(&text).map_err(|e| {
        CliError::invalid(
            at(),
            format!("not JSON ({e}); expected a JSON Schema object"),
        )
    })?;
    if !schema.is_object() {
        return Err(CliError::usage(format!(
            "{}: expected a JSON Schema object (`{{\"type\": \"object\", …}}`)",
            at()
        )));
    }
    let name = schema
        .get("title")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            path.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split('.').next())
                .map(str::to_string)
        })
        .unwrap_or_default();
    let output = toolloop::OutputSchema::new(name, schema);
    output.compile().map_err(|e| {
        CliError::usage(format!("{}: not a valid JSON Schema: {}", at(), e.message))
    })?;
    Ok(output)
}

/// The tools `agent` offers: the file tools, `run_command` when allowed, and the tools of the
/// MCP servers configured, as selected by `--tools` / `--no-tools`.
pub(crate) async fn tools(cx: &Cx, agent: &AgentArgs) -> Result<crate::mcp::RunTools, CliError> {
    let mut tools = toolloop_tools::fs::builtin_tools(&agent.root, agent.allow_write)
        .map_err(|e| CliError::invalid(format!("--root {}", agent.root.display()), e))?;
    tools.extend(crate::setup::command_tools(
        cx,
        &agent.root,
        &agent.approval,
    )?);
    #[cfg(feature = "test-hooks")]
    let tools = crate::testtool::tools(tools);
    // Recorded in the cassette, or answered from it (`--replay-tools`).
    let tools = crate::record::wrap_tools(cx, tools);
    // The servers list their tools before the run: within its timeout too.
    let deadline = agent.timeout.map(|t| tokio::time::Instant::now() + t);
    // Chat's prompt reads the terminal: it asks about a project's servers before it starts.
    let may_ask = !agent.approval.no_prompt;
    crate::mcp::assemble(cx, &agent.mcp, &agent.root, tools, deadline, may_ask).await
}

/// The agent `agent` describes around `model` and `tools`: its limits and approval rules (no
/// event handler, no approval handler, no journal).
pub(crate) fn agent_builder_with(
    cx: &Cx,
    agent: &AgentArgs,
    model: Arc<dyn toolloop::model::Model>,
    tools: crate::mcp::RunTools,
) -> Result<AgentBuilder, CliError> {
    crate::setup::attach(cx, agent, agent_builder_base(cx, agent, model)?, tools)
}

/// The agent `agent` describes around `model`, without tools: its limits, approval rules,
/// system prompt, model settings and prices.
pub(crate) fn agent_builder_base(
    cx: &Cx,
    agent: &AgentArgs,
    model: Arc<dyn toolloop::model::Model>,
) -> Result<AgentBuilder, CliError> {
    let mut builder = AgentBuilder::new(model)
        .max_rounds(agent.max_rounds)
        .max_tool_calls(agent.max_tool_calls)
        .stream(agent.stream)
        .redact(crate::secrets::redactor(cx))
        .approvals(crate::setup::approvals(&agent.approval)?);
    builder = model_settings(agent, builder);
    if let Some(t) = agent.timeout {
        builder = builder.timeout(t);
    }
    if let Some(output) = &agent.output {
        builder = builder.output_schema(output.clone());
    }
    if agent.price_entries.is_some() {
        let table =
            price_table(agent.price_entries.as_deref()).map_err(|e| e.context("--prices"))?;
        builder = builder.prices(table);
    }
    agent.context.apply(cx, &agent.provider, builder)
}

/// `agent`'s system prompt and model settings (temperature, most output tokens) on `builder`.
pub(crate) fn model_settings(agent: &AgentArgs, mut builder: AgentBuilder) -> AgentBuilder {
    if let Some(system) = &agent.system {
        builder = builder.system(system.clone());
    }
    if let Some(t) = agent.temperature {
        builder = builder.temperature(t);
    }
    if let Some(n) = agent.max_output_tokens {
        builder = builder.max_output_tokens(n);
    }
    builder
}

/// The built-in price table with the entries of a `--prices` file.
fn price_table(entries: Option<&str>) -> Result<toolloop::price::PriceTable, CliError> {
    let mut table = toolloop::price::PriceTable::builtin();
    if let Some(text) = entries {
        table.extend_from_json(text).map_err(|e| {
            CliError::usage(format!(
                "not a prices file: {e}; expected a JSON object like \
                 {{\"MODEL\": {{\"input\": 1.0, \"output\": 2.0}}}} (US dollars per million tokens)"
            ))
        })?;
    }
    Ok(table)
}

/// The run's approval policy from the flags.
pub(crate) fn approvals(args: &ApprovalArgs) -> Result<Approvals, CliError> {
    let mut policy = Approvals::default();
    for (action, flag, specs) in [
        (Action::Deny, "deny", &args.deny),
        (Action::Ask, "ask", &args.ask),
        (Action::Allow, "allow", &args.allow),
    ] {
        for spec in specs {
            let r = Rule::parse(action, spec).map_err(|e| {
                CliError::usage(format!(
                    "--{flag} {}: {}",
                    toolloop::result::shorten(spec, 100),
                    e.message
                ))
            })?;
            policy = policy.rule(r);
        }
    }
    Ok(policy)
}

/// The tools the approval flags offer: run_command with --allow-commands.
pub(crate) fn command_tools(
    cx: &Cx,
    root: &Path,
    args: &ApprovalArgs,
) -> Result<Vec<Arc<dyn Tool>>, CliError> {
    if !args.allow_commands {
        return Ok(Vec::new());
    }
    let mut config = toolloop_tools::command::CommandConfig::new(root);
    config.allow_shell = args.allow_shell;
    if let Some(t) = args.command_timeout {
        config.timeout = t;
    }
    config.sandbox = crate::sandbox::policy(cx, &args.sandbox);
    let policy = config.sandbox.clone();
    let tool = toolloop_tools::command::RunCommand::new(config)
        .map_err(|e| CliError::invalid(format!("--root {}", root.display()), e))?;
    crate::sandbox::warn(cx, &tool, &policy, root);
    Ok(vec![Arc::new(tool)])
}

impl AgentsArgs {
    /// Gathers the agents of the configuration file and `--agents`, checks them (no agent
    /// lists itself, at any depth; `--agent` names one), and keeps them for the run.
    pub(crate) fn prepare(&mut self, cx: &Cx) -> Result<(), CliError> {
        let mut defs = cx.config.file.agents.clone();
        if let Some(path) = self.agents.take() {
            let at = format!("--agents {}", path.display());
            let text = std::fs::read_to_string(&path).map_err(|e| CliError::invalid(&at, e))?;
            let mut table: toml::Table =
                toml::from_str(&text).map_err(|e| CliError::invalid(&at, e))?;
            let agents = table
                .remove("agents")
                .ok_or_else(|| CliError::usage(format!("{at}: no [agents.NAME] table")))?;
            if let Some(key) = table.keys().next() {
                return Err(CliError::usage(format!(
                    "{at}: unknown key `{key}` (only [agents.NAME] tables)"
                )));
            }
            defs.extend(parse_defs(agents, &at)?);
        }
        if !defs.is_empty() {
            self.agent_defs = defs;
        }
        self.check()
    }

    /// Checks the agents kept (saved with a run, too).
    pub(crate) fn check(&self) -> Result<(), CliError> {
        let defs = &self.agent_defs;
        check_graph(defs.iter().map(|(name, d)| {
            let tools = d.tools.iter().flatten().map(String::as_str).collect();
            (name.as_str(), tools)
        }))
        .map_err(|e| CliError::usage(format!("[agents]: {e}")))?;
        if let Some(name) = &self.agent_name
            && !defs.contains_key(name)
        {
            let known: Vec<&str> = defs.keys().map(String::as_str).collect();
            return Err(CliError::usage(format!(
                "--agent {name}: no such agent; agents: {}",
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            )));
        }
        Ok(())
    }

    /// The definition `--agent` names, if any.
    pub(crate) fn direct(&self) -> Option<&AgentDef> {
        self.agent_name
            .as_ref()
            .and_then(|n| self.agent_defs.get(n))
    }
}

/// Gives the main agent its tools and sub-agents: with `--agent NAME`, that agent's tool
/// subset (and its sub-agents); otherwise the run's tools, its MCP servers' tools and every
/// agent declared.
pub(crate) fn attach(
    cx: &Cx,
    args: &AgentArgs,
    builder: AgentBuilder,
    tools: crate::mcp::RunTools,
) -> Result<AgentBuilder, CliError> {
    let defs = &args.agents.agent_defs;
    let mut made = BTreeMap::new();
    let run = Offered {
        own: &tools.own,
        mcp: tools.mcp.as_ref(),
    };
    let (own, source) = match args.agents.direct() {
        Some(def) => {
            let name = args.agents.agent_name.as_deref().unwrap_or_default();
            select(cx, args, name, def, &run, &mut made)?
        }
        None => {
            let mut all = tools.own.clone();
            for name in defs.keys() {
                all.push(sub_agent(cx, args, name, &run, &mut made)?);
            }
            let source = tools.mcp.clone().map(|m| m as Arc<dyn ToolSource>);
            (all, source)
        }
    };
    let builder = builder.tools(own);
    Ok(match source {
        Some(source) => builder.tool_source_arc(source),
        None => builder,
    })
}

/// The tools a run offers, from which a declared agent's are chosen: the built-in ones, and
/// its MCP servers' (listed afresh as they change).
struct Offered<'a> {
    own: &'a [Arc<dyn Tool>],
    mcp: Option<&'a Arc<crate::mcp::SelectedMcp>>,
}

/// Every declared agent as a tool, for workflow steps to choose by name (beside `tools`, the
/// run's tools the agents may use).
pub(crate) fn agent_tools(
    cx: &Cx,
    args: &AgentArgs,
    tools: &[Arc<dyn Tool>],
) -> Result<Vec<Arc<dyn Tool>>, CliError> {
    let mut made = BTreeMap::new();
    let run = Offered {
        own: tools,
        mcp: None,
    };
    args.agents
        .agent_defs
        .keys()
        .map(|name| sub_agent(cx, args, name, &run, &mut made))
        .collect()
}

/// An agent's tools: its own, and a source of MCP servers' tools.
type Chosen = (Vec<Arc<dyn Tool>>, Option<Arc<dyn ToolSource>>);

/// The tools `def` lists (the run's tools, its MCP servers' tools and other agents), or the
/// run's tools; the MCP servers' as a source of their own, so that they follow the servers.
fn select(
    cx: &Cx,
    args: &AgentArgs,
    name: &str,
    def: &AgentDef,
    run: &Offered,
    made: &mut BTreeMap<String, Arc<dyn Tool>>,
) -> Result<Chosen, CliError> {
    let Some(list) = &def.tools else {
        let source = run.mcp.map(|m| m.clone() as Arc<dyn ToolSource>);
        return Ok((run.own.to_vec(), source));
    };
    let mut chosen = Vec::new();
    let mut from_servers = Vec::new();
    for wanted in list {
        if args.agents.agent_defs.contains_key(wanted) {
            chosen.push(sub_agent(cx, args, wanted, run, made)?);
        } else if let Some(t) = run.own.iter().find(|t| t.name() == wanted) {
            chosen.push(t.clone());
        } else if run.mcp.is_some_and(|m| m.offered(wanted)) {
            from_servers.push(wanted.clone());
        } else {
            let known: Vec<&str> = run
                .own
                .iter()
                .map(|t| t.name())
                .chain(run.mcp.iter().flat_map(|m| m.names()))
                .chain(args.agents.agent_defs.keys().map(String::as_str))
                .collect();
            return Err(CliError::usage(format!(
                "[agents.{name}] tools: no tool or agent `{wanted}`; there are: {}",
                known.join(", ")
            )));
        }
    }
    let source = match run.mcp {
        Some(m) if !from_servers.is_empty() => Some(m.only(from_servers)),
        _ => None,
    };
    Ok((chosen, source))
}

/// The agent `name` as a tool (made once; the graph has no cycle, checked before).
fn sub_agent(
    cx: &Cx,
    args: &AgentArgs,
    name: &str,
    run: &Offered,
    made: &mut BTreeMap<String, Arc<dyn Tool>>,
) -> Result<Arc<dyn Tool>, CliError> {
    if let Some(t) = made.get(name) {
        return Ok(t.clone());
    }
    let def = args
        .agents
        .agent_defs
        .get(name)
        .ok_or_else(|| CliError::usage(format!("no agent `{name}`")))?;
    let (own, source) = select(cx, args, name, def, run, made)?;
    let mut child_args = args.clone();
    if let Some(spec) = &def.model {
        // The agent's own model, and the context policy of that model: the window the run's
        // `--context-window` gives is the run's model's.
        child_args.provider.model = spec.clone();
        cx.config
            .resolve_model(&mut child_args.provider)
            .map_err(|e| e.context(format!("[agents.{name}] model")))?;
        child_args.context.context_window = None;
    }
    let model = crate::spec::model_from_args(cx, &child_args.provider)
        .map_err(|e| e.context(format!("[agents.{name}] model")))?;
    child_args.system = def.system.clone();
    child_args.max_rounds = def.max_rounds.unwrap_or(args.max_rounds);
    child_args.max_tool_calls = def.max_tool_calls.unwrap_or(args.max_tool_calls);
    child_args.timeout = match &def.timeout {
        Some(t) => Some(
            parse_timeout(t)
                .map_err(|e| CliError::usage(format!("[agents.{name}] timeout: {e}")))?,
        ),
        None => None,
    };
    // The child's output is its answer to the parent, never the run's schema.
    child_args.output = None;
    child_args.stream = false;
    let mut builder = crate::setup::agent_builder_base(cx, &child_args, model)?.tools(own);
    if let Some(source) = source {
        builder = builder.tool_source_arc(source);
    }
    let agent = builder
        .build()
        .map_err(|e| CliError::usage(format!("[agents.{name}]: {e}")))?;
    let mut tool = SubAgent::new(name, def.description.clone(), agent)
        .map_err(|e| CliError::usage(format!("[agents.{name}]: {e}")))?;
    if let Some(n) = def.max_tokens {
        tool = tool.max_tokens(n);
    }
    if let Some(c) = def.max_cost {
        tool = tool
            .max_cost(c)
            .map_err(|e| CliError::usage(format!("[agents.{name}] max_cost: {e}")))?;
    }
    let tool: Arc<dyn Tool> = Arc::new(tool);
    made.insert(name.to_string(), tool.clone());
    Ok(tool)
}

/// The configuration of run `run_id` as kept with it, set to resume the run (`base_url`
/// replaces the saved one).
pub(crate) async fn saved_run(
    cx: &Cx,
    run_id: &str,
    store_args: StoreArgs,
    base_url: Option<String>,
    json: bool,
    durability: DurabilityArg,
) -> Result<RunArgs, CliError> {
    let store = open_store(cx, &store_args).await?;
    let (session, meta) = match store.run_tags(run_id).await {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Err(CliError::usage(format!(
                "no run with id {} in {}",
                run_id,
                store.location()
            )));
        }
        Err(e) => return Err(CliError::store(e)),
    };
    let Some(Value::Object(mut config)) = meta else {
        return Err(CliError::usage(format!(
            "run {} was not started by the toolloop command (it has no saved configuration); \
             resume it from the program that started it",
            run_id
        )));
    };
    // Credentials were not stored with the run: they must be given again.
    let removed = restore_credentials(&mut config, base_url.as_deref());
    if !removed.is_empty() {
        let flags: Vec<String> = removed
            .iter()
            .map(|f| format!("--{}", f.replace('_', "-")))
            .collect();
        return Err(CliError::usage(format!(
            "run {id} was started with credentials in {flags} (a user name or password, or \
                 query parameters such as ?key=), which are never stored; give the full value \
                 again: toolloop resume {id} {example}",
            id = run_id,
            flags = flags.join(", "),
            example = flags
                .iter()
                .map(|f| format!("{f} <URL>"))
                .collect::<Vec<_>>()
                .join(" "),
        )));
    }
    config.insert("prompt".into(), Value::String(String::new()));
    config.insert("json".into(), Value::Bool(json));
    let durable = DurableArgs {
        store: store_args,
        session,
        durability: crate::args::DurabilityFlag { durability },
        no_store: false,
        resume: Some(run_id.to_string()),
        retry: None,
    };
    config.insert("durable".into(), json!(durable));
    let run_args: RunArgs = match serde_json::from_value(Value::Object(config)) {
        Ok(a) => a,
        Err(e) => {
            return Err(CliError::failed(format!(
                "the saved configuration of run {} does not load: {e}",
                run_id
            )));
        }
    };
    Ok(run_args)
}
/// A run's saved settings made whole for a resume: the credentials they were saved without
/// (see [`crate::durable::CREDENTIALS_REMOVED`]) given again, `base_url` when given. The names
/// of the fields still missing theirs; empty when none is.
pub(crate) fn restore_credentials(
    config: &mut serde_json::Map<String, Value>,
    base_url: Option<&str>,
) -> Vec<String> {
    let mut removed: Vec<String> = match config.remove(crate::durable::CREDENTIALS_REMOVED) {
        Some(Value::Array(fields)) => fields
            .iter()
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    if let Some(url) = base_url {
        config.insert("base_url".into(), Value::String(url.to_string()));
        removed.retain(|f| f != "base_url");
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        agent: AgentArgs,
    }

    /// A declared agent keeps the run's approval rules and limits, and takes the context
    /// policy of its own model: a window the run's flag gives is the run's model's.
    #[test]
    fn an_agent_has_the_context_window_of_its_own_model() {
        let cx = &Cx::default();
        let mut args = Cli::try_parse_from([
            "toolloop",
            "--model",
            "openai:mock:rounds=1",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--context-window",
            "100000",
        ])
        .unwrap()
        .agent;
        let def = |model: Option<&str>| AgentDef {
            description: "Reads.".into(),
            model: model.map(str::to_string),
            system: None,
            tools: None,
            max_rounds: None,
            max_tool_calls: None,
            timeout: None,
            max_tokens: None,
            max_cost: None,
        };
        args.agents.agent_defs.insert(
            "small".into(),
            def(Some("openai:mock:rounds=1,window=8000")),
        );
        args.agents.agent_defs.insert("same".into(), def(None));
        let window = |name: &str| {
            let tool = sub_agent(
                cx,
                &args,
                name,
                &Offered {
                    own: &[],
                    mcp: None,
                },
                &mut BTreeMap::new(),
            )
            .unwrap();
            let sub = tool.sub_agent().unwrap();
            sub.agent().config().context.as_ref().and_then(|c| c.window)
        };
        assert_eq!(window("small"), Some(8000));
        assert_eq!(window("same"), Some(100_000));
    }
}
