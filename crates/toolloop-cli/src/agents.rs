//! Agents the main agent delegates to: `[agents.NAME]` tables of the configuration file or of
//! an `--agents FILE`, each offered to the main agent as a tool (see `toolloop::subagent`), or
//! run directly with `--agent NAME`.
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

use crate::run::{AgentArgs, parse_timeout};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use toolloop::agent::AgentBuilder;
use toolloop::subagent::{SubAgent, check_graph};
use toolloop::tool::Tool;

/// One agent: `[agents.NAME]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentDef {
    /// What the agent does, for the model that delegates to it.
    pub description: String,
    /// `provider:model` or a model of `[models]`; default: the run's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Its system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Its tools, by name: the run's tools and other agents; default: the run's own tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Model calls per run (default: the run's `--max-rounds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rounds: Option<u32>,
    /// Tool executions per run (default: the run's `--max-tool-calls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    /// Wall-clock limit, as `--timeout` takes it; the run's time left bounds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Token budget (input plus output, its own children's included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Cost budget in US dollars (its model's price must be known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
}

/// The flags that declare and choose agents.
#[derive(Args, Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct AgentsArgs {
    /// A TOML file of agents the main agent may delegate to, as `[agents.NAME]` tables
    /// (`description`, `model`, `system`, `tools`, `max_rounds`, `max_tool_calls`, `timeout`,
    /// `max_tokens`, `max_cost`); they add to (and override) the configuration file's.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub agents: Option<PathBuf>,
    /// Run the agent NAME (of `--agents` or the configuration file) directly, as the main
    /// agent: its model, system prompt, tools and limits.
    #[arg(long = "agent", value_name = "NAME")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
    /// The agents declared (saved with the run, so that resuming needs no file).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agent_defs: BTreeMap<String, AgentDef>,
}

/// Reads `[agents.NAME]` tables from a TOML value (`at` names where, in errors).
pub(crate) fn parse_defs(
    value: toml::Value,
    at: &str,
) -> Result<BTreeMap<String, AgentDef>, String> {
    let defs: BTreeMap<String, AgentDef> = value
        .try_into()
        .map_err(|e| format!("{at}: [agents]: {e}"))?;
    for (name, def) in &defs {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(format!(
                "{at}: [agents.{name}]: an agent's name is 1 to 64 letters, digits, `_` or `-`"
            ));
        }
        if def.description.trim().is_empty() {
            return Err(format!("{at}: [agents.{name}]: `description` is empty"));
        }
        if let Some(t) = &def.timeout {
            parse_timeout(t).map_err(|e| format!("{at}: [agents.{name}] timeout: {e}"))?;
        }
        if def.max_rounds == Some(0) {
            return Err(format!("{at}: [agents.{name}] max_rounds: at least 1"));
        }
        if let Some(c) = def.max_cost
            && !(c.is_finite() && c >= 0.0)
        {
            return Err(format!(
                "{at}: [agents.{name}] max_cost: a number of dollars, 0 or more"
            ));
        }
    }
    Ok(defs)
}

impl AgentsArgs {
    /// Gathers the agents of the configuration file and `--agents`, checks them (no agent
    /// lists itself, at any depth; `--agent` names one), and keeps them for the run.
    pub(crate) fn prepare(&mut self) -> Result<(), String> {
        let mut defs = crate::config::loaded().agents.clone();
        if let Some(path) = self.agents.take() {
            let at = format!("--agents {}", path.display());
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{at}: {e}"))?;
            let mut table: toml::Table = toml::from_str(&text).map_err(|e| format!("{at}: {e}"))?;
            let agents = table
                .remove("agents")
                .ok_or_else(|| format!("{at}: no [agents.NAME] table"))?;
            if let Some(key) = table.keys().next() {
                return Err(format!(
                    "{at}: unknown key `{key}` (only [agents.NAME] tables)"
                ));
            }
            defs.extend(parse_defs(agents, &at)?);
        }
        if !defs.is_empty() {
            self.agent_defs = defs;
        }
        self.check()
    }

    /// Checks the agents kept (saved with a run, too).
    pub(crate) fn check(&self) -> Result<(), String> {
        let defs = &self.agent_defs;
        check_graph(defs.iter().map(|(name, d)| {
            let tools = d.tools.iter().flatten().map(String::as_str).collect();
            (name.as_str(), tools)
        }))
        .map_err(|e| format!("[agents]: {e}"))?;
        if let Some(name) = &self.agent_name
            && !defs.contains_key(name)
        {
            let known: Vec<&str> = defs.keys().map(String::as_str).collect();
            return Err(format!(
                "--agent {name}: no such agent; agents: {}",
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ));
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
/// subset (and its sub-agents); otherwise the run's tools and every agent declared.
pub(crate) fn attach(
    args: &AgentArgs,
    builder: AgentBuilder,
    tools: Vec<Arc<dyn Tool>>,
) -> Result<AgentBuilder, String> {
    let defs = &args.agents.agent_defs;
    let mut made = BTreeMap::new();
    match args.agents.direct() {
        Some(def) => {
            let name = args.agents.agent_name.as_deref().unwrap_or_default();
            let own = select(args, name, def, &tools, &mut made)?;
            Ok(builder.tools(own))
        }
        None => {
            let mut all = tools.clone();
            for name in defs.keys() {
                all.push(sub_agent(args, name, &tools, &mut made)?);
            }
            Ok(builder.tools(all))
        }
    }
}

/// Every declared agent as a tool, for workflow steps to choose by name (beside `tools`, the
/// run's tools the agents may use).
pub(crate) fn agent_tools(
    args: &AgentArgs,
    tools: &[Arc<dyn Tool>],
) -> Result<Vec<Arc<dyn Tool>>, String> {
    let mut made = BTreeMap::new();
    args.agents
        .agent_defs
        .keys()
        .map(|name| sub_agent(args, name, tools, &mut made))
        .collect()
}

/// The tools `def` lists (the run's tools and other agents), or the run's tools.
fn select(
    args: &AgentArgs,
    name: &str,
    def: &AgentDef,
    tools: &[Arc<dyn Tool>],
    made: &mut BTreeMap<String, Arc<dyn Tool>>,
) -> Result<Vec<Arc<dyn Tool>>, String> {
    let Some(list) = &def.tools else {
        return Ok(tools.to_vec());
    };
    let mut chosen = Vec::new();
    for wanted in list {
        if args.agents.agent_defs.contains_key(wanted) {
            chosen.push(sub_agent(args, wanted, tools, made)?);
        } else if let Some(t) = tools.iter().find(|t| t.name() == wanted) {
            chosen.push(t.clone());
        } else {
            let known: Vec<&str> = tools
                .iter()
                .map(|t| t.name())
                .chain(args.agents.agent_defs.keys().map(String::as_str))
                .collect();
            return Err(format!(
                "[agents.{name}] tools: no tool or agent `{wanted}`; there are: {}",
                known.join(", ")
            ));
        }
    }
    Ok(chosen)
}

/// The agent `name` as a tool (made once; the graph has no cycle, checked before).
fn sub_agent(
    args: &AgentArgs,
    name: &str,
    tools: &[Arc<dyn Tool>],
    made: &mut BTreeMap<String, Arc<dyn Tool>>,
) -> Result<Arc<dyn Tool>, String> {
    if let Some(t) = made.get(name) {
        return Ok(t.clone());
    }
    let def = args
        .agents
        .agent_defs
        .get(name)
        .ok_or_else(|| format!("no agent `{name}`"))?;
    let own = select(args, name, def, tools, made)?;
    let mut child_args = args.clone();
    if let Some(spec) = &def.model {
        // The agent's own model, and the context policy of that model: the window the run's
        // `--context-window` gives is the run's model's.
        child_args.provider.model = spec.clone();
        crate::config::resolve_model(&mut child_args.provider)
            .map_err(|e| format!("[agents.{name}] model: {e}"))?;
        child_args.context.context_window = None;
    }
    let model = crate::spec::model_from_args(&child_args.provider)
        .map_err(|e| format!("[agents.{name}] model: {e}"))?;
    child_args.system = def.system.clone();
    child_args.max_rounds = def.max_rounds.unwrap_or(args.max_rounds);
    child_args.max_tool_calls = def.max_tool_calls.unwrap_or(args.max_tool_calls);
    child_args.timeout = match &def.timeout {
        Some(t) => Some(parse_timeout(t).map_err(|e| format!("[agents.{name}] timeout: {e}"))?),
        None => None,
    };
    // The child's output is its answer to the parent, never the run's schema.
    child_args.output = None;
    child_args.stream = false;
    let agent = crate::run::agent_builder_base(&child_args, model)?
        .tools(own)
        .build()
        .map_err(|e| format!("[agents.{name}]: {e}"))?;
    let mut tool = SubAgent::new(name, def.description.clone(), agent)
        .map_err(|e| format!("[agents.{name}]: {e}"))?;
    if let Some(n) = def.max_tokens {
        tool = tool.max_tokens(n);
    }
    if let Some(c) = def.max_cost {
        tool = tool
            .max_cost(c)
            .map_err(|e| format!("[agents.{name}] max_cost: {e}"))?;
    }
    let tool: Arc<dyn Tool> = Arc::new(tool);
    made.insert(name.to_string(), tool.clone());
    Ok(tool)
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
            let tool = sub_agent(&args, name, &[], &mut BTreeMap::new()).unwrap();
            let sub = tool.sub_agent().unwrap();
            sub.agent().config().context.as_ref().and_then(|c| c.window)
        };
        assert_eq!(window("small"), Some(8000));
        assert_eq!(window("same"), Some(100_000));
    }
}
