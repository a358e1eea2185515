//! The argument types the commands share: the flags of a model (`ProviderArgs`), of an agent
//! (`AgentArgs` and the groups it flattens: approval, MCP, sandbox, context, agents), of a run
//! (`RunArgs`) and of the store, with their value parsers. A run's arguments are saved with it
//! (serde) so that `resume` can rebuild the agent; what they do is in [`crate::setup`].
//!
//! This module depends on no other module of the command, so that every module may use it.

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use toolloop::approval::{Action, Rule};
use toolloop::ptk::Dialect;
use toolloop_tools::sandbox::SandboxMode;

/// Provider flags shared by the commands that call a model.
#[derive(Args, Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct ProviderArgs {
    /// The model, as provider:model: test, scripted:<file>, openai:<model> (Chat Completions),
    /// openai-responses:<model> (the Responses API), anthropic:<model>, gemini:<model>, or
    /// replay:<cassette> (a run recorded with --record, played back offline).
    #[arg(short = 'm', long, env = "TOOLLOOP_MODEL", default_value = "test")]
    pub model: String,
    /// Read the API key from this environment variable instead of the provider's usual one.
    #[arg(long, value_name = "NAME")]
    pub api_key_env: Option<String>,
    /// The provider's base URL (any OpenAI-compatible server for openai:…; a mock or proxy): an
    /// http:// or https:// URL with a host, without a query or fragment.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Extra request fields, as a JSON object merged into every request (`{"top_k": 20}`). It may
    /// not set the fields the run owns (the conversation, the tools, the model, streaming).
    #[arg(long, value_name = "JSON", value_parser = parse_extra)]
    pub extra: Option<Box<Value>>,
    /// How tools are offered: native (the API's tool calling), prompt (the catalog in the
    /// system prompt, calls read from the text, for models without tool support) or auto
    /// (native, switching to prompt for the rest of the run when the server refuses tools).
    #[arg(long, value_enum, value_name = "PROTOCOL", default_value_t = ToolProtocol::Native)]
    pub tool_protocol: ToolProtocol,
    /// The format prompt-based tool calling teaches the model: ptk, hermes, mistral, llama3,
    /// qwen3-coder, json, deepseek, deepseek-v3.1, kimi-k2, glm or pythonic (replies are read
    /// in every format).
    #[arg(long, value_name = "DIALECT", default_value = "ptk", value_parser = parse_dialect)]
    pub dialect: Dialect,
    /// With prompt-based calling: the model's replies begin inside reasoning whose `<think>` its
    /// chat template wrote (DeepSeek R1, Qwen3 thinking models), so the text before a first
    /// `</think>` is reasoning, kept out of the answer.
    #[arg(long)]
    #[serde(default)]
    pub implicit_think: bool,
    /// How long to keep trying a server that refuses connections (a local server restarting,
    /// or still loading its model), with backoff: seconds or a duration (`30s`, `2m`), at most
    /// an hour; `0` gives up after the usual retries. Default 10s.
    #[arg(long, value_name = "DURATION", value_parser = parse_connect_retry)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_retry: Option<std::time::Duration>,
}

/// A `--connect-retry`: `0`, or a duration of at most an hour.
fn parse_connect_retry(s: &str) -> Result<std::time::Duration, String> {
    if s.trim().parse::<f64>().is_ok_and(|n| n == 0.0) {
        return Ok(std::time::Duration::ZERO);
    }
    let d = crate::args::parse_timeout(s)?;
    if d > std::time::Duration::from_secs(3600) {
        return Err(format!("`{s}` is longer than an hour"));
    }
    Ok(d)
}

/// How tools are offered to the model (`--tool-protocol`).
#[derive(
    ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ToolProtocol {
    /// The API's own tool calling.
    #[default]
    Native,
    /// Prompt-based tool calling, whatever the model supports.
    Prompt,
    /// Native, falling back to prompt-based when the server refuses the `tools` parameter.
    Auto,
}

fn parse_dialect(s: &str) -> Result<Dialect, String> {
    s.parse::<Dialect>().map_err(|e| e.to_string())
}

fn parse_extra(s: &str) -> Result<Box<Value>, String> {
    match serde_json::from_str::<Value>(s) {
        Ok(v @ Value::Object(_)) => Ok(Box::new(v)),
        Ok(_) => Err("expected a JSON object, like '{\"top_k\": 20}'".into()),
        Err(e) => Err(format!(
            "not valid JSON ({e}); expected an object like '{{\"top_k\": 20}}'"
        )),
    }
}

/// What a run needs besides its prompt: the model and the loop's settings (shared by `run`
/// and `chat`, and saved with each run so that `resume` can rebuild the agent).
#[derive(Args, Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct AgentArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub provider: ProviderArgs,
    /// Record and replay (this invocation's, not saved with the run).
    #[command(flatten)]
    #[serde(skip)]
    pub record: crate::record::RecordArgs,
    /// A system prompt.
    #[arg(short = 's', long, conflicts_with = "system_file")]
    pub system: Option<String>,
    /// Read the system prompt from this file.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub system_file: Option<PathBuf>,
    /// Model calls per run (at least 1).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rounds: u32,
    /// Tool executions per run (0: the model's tool calls are not run).
    #[arg(long, default_value_t = 20)]
    pub max_tool_calls: u32,
    /// Wall-clock limit for the run: seconds (`90`, `1.5`) or a duration (`90s`, `2m`, `1h`,
    /// `1h 30m`); at most 30 days.
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// The directory the file tools may use.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Offer the write_file tool.
    #[arg(long)]
    pub allow_write: bool,
    /// Stream the model's text as it arrives (the default when stdout is a terminal).
    #[arg(long)]
    pub stream: bool,
    /// Do not stream, even on a terminal: each reply is shown when it is complete.
    #[arg(long, conflicts_with = "stream")]
    #[serde(skip)]
    pub no_stream: bool,
    /// Sampling temperature, 0 to 2 (Anthropic: 0 to 1).
    #[arg(long, value_parser = parse_temperature)]
    pub temperature: Option<f32>,
    /// The most output tokens per model call, 1 to 1000000.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_OUTPUT_TOKENS)))]
    pub max_output_tokens: Option<u32>,
    /// A JSON Schema file the final answer must match: the model is asked for JSON of that
    /// shape (natively where the API can), an answer that does not match goes back to it with
    /// the errors, and the validated JSON is printed (`output` in `--json`).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub output_schema: Option<PathBuf>,
    /// The schema read from `--output-schema` (saved with the run).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<toolloop::OutputSchema>,
    /// Model prices that add to or override the built-in table, from a JSON file:
    /// `{"MODEL": {"input": 1.0, "output": 2.0, "cache_read": 0.1, "cache_write": 1.25}}`, in US
    /// dollars per million tokens (the cache rates are optional).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub prices: Option<PathBuf>,
    /// The entries read from `--prices` (saved with the run, so that resuming needs no file).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_entries: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub approval: crate::args::ApprovalArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub mcp: crate::args::McpArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub context: crate::args::ContextArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub agents: crate::args::AgentsArgs,
}

#[derive(Args, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct RunArgs {
    /// What to ask. `-`, or nothing, reads the prompt from stdin (`cat notes.md | toolloop run -`).
    #[arg(default_value = "-", hide_default_value = true)]
    pub prompt: String,
    /// Attach an image to the prompt: a PNG, JPEG, GIF or WebP file (at most 20 MiB), or an
    /// `http(s)://` or `data:` URL the provider fetches. Repeat for more images.
    #[arg(short = 'a', long = "attach", value_name = "FILE|URL")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attach: Vec<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub agent: AgentArgs,
    /// Print the outcome as one JSON object.
    #[arg(long, conflicts_with = "jsonl")]
    pub json: bool,
    /// Print every event of the run as a JSON line as it happens (`{"type": "round_started",
    /// …}`), ending with a `run_finished` line that holds the outcome as `--json` prints it.
    #[arg(long)]
    #[serde(default)]
    pub jsonl: bool,
    #[command(flatten)]
    #[serde(default)]
    pub durable: crate::args::DurableArgs,
}

/// The longest `--timeout`.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

/// The most `--max-output-tokens` (no model writes nearly that many in one reply).
pub(crate) const MAX_OUTPUT_TOKENS: u32 = 1_000_000;

/// A `--timeout`: a number of seconds, or a duration with units (`90s`, `2m`, `1h 30m`), above
/// zero and at most [`MAX_TIMEOUT`].
pub(crate) fn parse_timeout(s: &str) -> Result<Duration, String> {
    const EXPECTED: &str = "expected seconds (`90`, `1.5`) or a duration (`90s`, `2m`, `1h`)";
    let text = s.trim();
    let duration = match text.parse::<f64>() {
        Ok(secs) if !secs.is_finite() || secs <= 0.0 => {
            return Err(format!("`{s}` is not a positive duration; {EXPECTED}"));
        }
        Ok(secs) if secs > MAX_TIMEOUT.as_secs_f64() => None,
        Ok(secs) => Some(Duration::from_secs_f64(secs)),
        Err(_) => match humantime::parse_duration(text) {
            Ok(d) => Some(d),
            Err(humantime::DurationError::NumberOverflow) => None,
            Err(e) => return Err(format!("`{s}` is not a duration ({e}); {EXPECTED}")),
        },
    };
    match duration {
        Some(d) if d.is_zero() => Err(format!("`{s}` is not a positive duration; {EXPECTED}")),
        Some(d) if d <= MAX_TIMEOUT => Ok(d),
        _ => Err(format!(
            "`{s}` is longer than the longest timeout, 30 days ({}s)",
            MAX_TIMEOUT.as_secs()
        )),
    }
}

/// A `--temperature`: a finite number from 0 to 2.
pub(crate) fn parse_temperature(s: &str) -> Result<f32, String> {
    let t: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number; expected 0 to 2"))?;
    check_temperature(t)
}

pub(crate) fn check_temperature(t: f32) -> Result<f32, String> {
    if t.is_finite() && (0.0..=2.0).contains(&t) {
        Ok(t)
    } else {
        Err(format!(
            "{t} is out of range; expected a number from 0 to 2"
        ))
    }
}

/// The approval flags of `toolloop run` and `chat` (kept with the run for `resume`).
#[derive(Args, Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ApprovalArgs {
    /// Run the calls that match without asking: a tool name glob, then optionally `:` and a
    /// glob over the call's subject (the command line of run_command, the path of a file tool,
    /// the JSON arguments otherwise). `*` matches any text. Repeatable.
    #[arg(long = "allow", value_name = "TOOL[:SUBJECT]", value_parser = allow_rule)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Never run the calls that match (the model reads `denied: …`); wins over --ask and
    /// --allow. Repeatable.
    #[arg(long = "deny", value_name = "TOOL[:SUBJECT]", value_parser = deny_rule)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// Ask before running the calls that match; wins over --allow. Repeatable.
    #[arg(long = "ask", value_name = "TOOL[:SUBJECT]", value_parser = ask_rule)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ask: Vec<String>,
    /// Offer the run_command tool (programs run in --root, in the sandbox of --sandbox, where
    /// they run without asking; outside a sandbox each call is asked about unless a rule
    /// allows it).
    #[arg(long)]
    #[serde(default)]
    pub allow_commands: bool,
    /// Let run_command run shells (`sh -c …`); by default only programs with their arguments.
    #[arg(long, requires = "allow_commands")]
    #[serde(default)]
    pub allow_shell: bool,
    #[command(flatten)]
    #[serde(flatten)]
    pub sandbox: crate::args::SandboxArgs,
    /// The longest one command may run (default 2m): seconds or a duration (`90s`, `5m`).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::parse_timeout)]
    #[serde(default)]
    pub command_timeout: Option<Duration>,
    /// Do not ask: stop the run when a call needs approval (exit code 4); decide with
    /// `toolloop approve|deny <run-id>`, then `toolloop resume <run-id>`.
    #[arg(long)]
    #[serde(default)]
    pub defer_approvals: bool,
    /// Set by `chat`, whose prompt reads the terminal: calls are not asked about there.
    #[arg(skip)]
    #[serde(skip)]
    pub no_prompt: bool,
    /// Set once the rules were checked against the tools offered (by `chat`, after its first
    /// turn), so that the warnings are not repeated.
    #[arg(skip)]
    #[serde(skip)]
    pub rules_checked: bool,
}

fn rule(action: Action, flag: &str, spec: &str) -> Result<String, String> {
    Rule::parse(action, spec)
        .map(|_| spec.to_string())
        .map_err(|e| {
            format!(
                "--{flag} {}: {}; expected TOOL or TOOL:SUBJECT",
                toolloop::result::shorten(spec, 100),
                e.message
            )
        })
}

fn allow_rule(s: &str) -> Result<String, String> {
    rule(Action::Allow, "allow", s)
}

fn deny_rule(s: &str) -> Result<String, String> {
    rule(Action::Deny, "deny", s)
}

fn ask_rule(s: &str) -> Result<String, String> {
    rule(Action::Ask, "ask", s)
}

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
) -> Result<BTreeMap<String, AgentDef>, crate::CliError> {
    let defs: BTreeMap<String, AgentDef> = value
        .try_into()
        .map_err(|e| crate::CliError::invalid(format!("{at}: [agents]"), e))?;
    for (name, def) in &defs {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(crate::CliError::usage(format!(
                "{at}: [agents.{name}]: an agent's name is 1 to 64 letters, digits, `_` or `-`"
            )));
        }
        if def.description.trim().is_empty() {
            return Err(crate::CliError::usage(format!(
                "{at}: [agents.{name}]: `description` is empty"
            )));
        }
        if let Some(t) = &def.timeout {
            parse_timeout(t).map_err(|e| {
                crate::CliError::usage(format!("{at}: [agents.{name}] timeout: {e}"))
            })?;
        }
        if def.max_rounds == Some(0) {
            return Err(crate::CliError::usage(format!(
                "{at}: [agents.{name}] max_rounds: at least 1"
            )));
        }
        if let Some(c) = def.max_cost
            && !(c.is_finite() && c >= 0.0)
        {
            return Err(crate::CliError::usage(format!(
                "{at}: [agents.{name}] max_cost: a number of dollars, 0 or more"
            )));
        }
    }
    Ok(defs)
}

/// How a run stays inside the model's context window.
#[derive(Args, Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct ContextArgs {
    /// The model's context window in tokens (default: the model's, from LiteLLM's dataset; a
    /// mock's `window=`). Without one, the conversation is compacted only when the provider
    /// refuses a request for its size.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// Compact the conversation when the next request is estimated past this share of the
    /// window, above 0 and at most 1 (default 0.8).
    #[arg(long, value_name = "SHARE", value_parser = parse_share)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_at: Option<f64>,
    /// Keep the results of the last K rounds whole; older ones are cut to a one-line stub
    /// (default 8; 0: never).
    #[arg(long, value_name = "K")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_rounds: Option<u32>,
    /// Send a tool result longer than this many bytes as its head and tail, the model reading
    /// the rest with `read_result` (default 16384; 0: never).
    #[arg(long, value_name = "BYTES")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_over: Option<usize>,
    /// The model that writes the summary when the conversation is compacted (provider:model,
    /// or a configured name; default: the run's model).
    #[arg(long, value_name = "SPEC")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_model: Option<String>,
    /// Never compact (results are still cleared and spilled).
    #[arg(long)]
    #[serde(default)]
    pub no_compact: bool,
    /// Clear and compact on this side only, never with the provider's own context management
    /// (Anthropic's clearing of old tool results, the Responses API's compaction), which is
    /// used by default where the API offers it.
    #[arg(long)]
    #[serde(default)]
    pub no_native_context: bool,
}

pub(crate) fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a share of the window; expected a number above 0 and at most 1 (0.8)"
        )),
    }
}

/// The MCP and tool-selection flags (part of a run's saved configuration).
#[derive(Args, Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct McpArgs {
    /// Use the MCP servers of this file: `{"mcpServers": {"name": {"command": …, "args": […],
    /// "env": {…}, "cwd": …} or {"url": …, "headers": {…}}}}` (Claude Desktop, Cursor and
    /// Claude Code's format; `${VAR}` is replaced by the variable). Repeatable. The root's
    /// .mcp.json is read too, unless --no-mcp-json, once that exact file is trusted (asked on a
    /// terminal; `toolloop mcp trust`).
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

/// The sandbox flags of `toolloop run` and `chat` (kept with the run for `resume`).
#[derive(Args, Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct SandboxArgs {
    /// Where run_command runs: `workspace-write` (the default, where the system has a sandbox:
    /// a command may write only in --root and its own TMPDIR, cannot read ~/.ssh, ~/.aws,
    /// ~/.gnupg, ~/.config/gcloud or toolloop's configuration and store, and has no network;
    /// it runs without asking), `read-only` (no writes in --root either), or `off` (commands
    /// have all of your rights and each is asked about). Where the system has no sandbox, a
    /// warning says so and commands are asked about.
    #[arg(long, value_name = "MODE", value_parser = mode)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxMode>,
    /// Let sandboxed commands use the network.
    #[arg(long)]
    #[serde(default)]
    pub sandbox_network: bool,
}

fn mode(s: &str) -> Result<SandboxMode, String> {
    s.parse()
}

/// `--store`, shared by every command that uses the store.
#[derive(Args, Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct StoreArgs {
    /// Where sessions and run logs live: a SQLite file, or a postgres:// URL.
    /// Default: $XDG_DATA_HOME/toolloop/toolloop.db (~/.local/share/toolloop/toolloop.db).
    #[arg(long, env = "TOOLLOOP_STORE", value_name = "PATH|URL")]
    pub store: Option<String>,
}

/// The store flags of `toolloop run`.
#[derive(Args, Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct DurableArgs {
    #[command(flatten)]
    #[serde(default)]
    pub store: StoreArgs,
    /// Continue this conversation (created on first use); its history is kept in the store.
    #[arg(long, value_name = "NAME")]
    #[serde(default)]
    pub session: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub durability: DurabilityFlag,
    /// Write nothing to the store (an ephemeral run that cannot be resumed; the same as
    /// --durability none).
    #[arg(long, conflicts_with = "session")]
    #[serde(default)]
    pub no_store: bool,
    /// Set by `toolloop resume`: the run to continue instead of starting one.
    #[arg(skip)]
    #[serde(default)]
    pub resume: Option<String>,
    /// Set by `toolloop resume` for a run that failed on a model error: a new run (in the same
    /// session) goes on from that run's conversation as its log holds it, so the failed model
    /// call is made again and nothing the run did is made or run again.
    #[arg(skip)]
    #[serde(skip)]
    pub retry: Option<String>,
}

/// `--durability`, the same flag for every command that writes a run's log (`run`, `chat`,
/// `resume`, `workflow run`).
#[derive(Args, Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(crate) struct DurabilityFlag {
    /// How far the run's log survives a crash: `process` (a killed command loses nothing
    /// written; a power cut may lose the last steps), `power` (each step is on disk before the
    /// run acts on it: one fsync per step), or `none` (nothing is written: the run cannot be
    /// resumed; the same as --no-store).
    #[arg(
        long,
        value_enum,
        env = "TOOLLOOP_DURABILITY",
        value_name = "MODE",
        default_value_t = DurabilityArg::Process
    )]
    #[serde(default)]
    pub durability: DurabilityArg,
}

impl DurabilityFlag {
    /// The store's durability; `None` for `none`.
    pub(crate) fn store(self) -> Option<toolloop_store::Durability> {
        self.durability.store()
    }
}

/// `--durability`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DurabilityArg {
    /// Survives the command being killed (SQLite: synchronous=NORMAL).
    #[default]
    Process,
    /// Survives a power cut (SQLite: synchronous=FULL, one fsync per step).
    Power,
    /// Nothing is written.
    None,
}
