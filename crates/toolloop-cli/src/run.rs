//! `toolloop run`: one agent run on a prompt.

use crate::EXIT_USAGE;
use crate::progress::Progress;
use crate::spec::{ProviderArgs, model_from_args};
use clap::Args;
use serde_json::{Value, json};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolloop::Message;
use toolloop::agent::AgentBuilder;
use toolloop::image::Image;
use toolloop::outcome::{Outcome, StopReason};

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
    pub approval: crate::approve::ApprovalArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub mcp: crate::mcp::McpArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub context: crate::context::ContextArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub agents: crate::agents::AgentsArgs,
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
    pub durable: crate::durable::DurableArgs,
}

/// The images `--attach` names: files are read (and checked to be images); URLs (anything with
/// `://`, and `data:` URLs) are checked.
pub(crate) fn attachments(items: &[String]) -> Result<Vec<Image>, String> {
    items
        .iter()
        .map(|item| {
            let is_url = item.contains("://") || item.to_ascii_lowercase().starts_with("data:");
            let image = if is_url {
                Image::from_url(item)
            } else {
                Image::from_file(item)
            };
            image
                .map_err(|e| crate::terminal::escape(&format!("--attach: {e}"), false).into_owned())
        })
        .collect()
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

fn check_temperature(t: f32) -> Result<f32, String> {
    if t.is_finite() && (0.0..=2.0).contains(&t) {
        Ok(t)
    } else {
        Err(format!(
            "{t} is out of range; expected a number from 0 to 2"
        ))
    }
}

impl AgentArgs {
    /// Makes the settings self-contained before a run: a named model of the configuration
    /// file is replaced by its settings, and what the flags name in files (`--system-file`) is
    /// read in, so that the run's saved configuration needs neither. Says on stderr when no
    /// model was chosen anywhere (the offline test model answers).
    pub(crate) fn prepare(&mut self) -> Result<(), String> {
        self.agents.prepare()?;
        self.take_direct_agent()?;
        crate::config::resolve_model(&mut self.provider)?;
        if self.provider.model.trim() == "test" && !crate::config::model_chosen() {
            eprintln!(
                "toolloop: no model configured: the offline test model answers. Choose one with \
                 --model provider:model (e.g. openai:gpt-4.1-mini), TOOLLOOP_MODEL, or `model` in \
                 the configuration file (`toolloop config path`)."
            );
        }
        self.read_files()
    }

    /// `--agent NAME`: the run becomes that agent's (its model, system prompt and limits).
    pub(crate) fn take_direct_agent(&mut self) -> Result<(), String> {
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
                self.timeout = Some(parse_timeout(t)?);
            }
        }
        Ok(())
    }

    /// Reads in what the flags name in files (`--system-file`, `--output-schema`, `--prices`).
    fn read_files(&mut self) -> Result<(), String> {
        if let Some(path) = self.system_file.take() {
            let text = toolloop::user_file::read_to_string(&path, MAX_SYSTEM_FILE_BYTES)
                .map_err(|e| format!("--system-file {}: {e}", path.display()))?;
            self.system = Some(text);
        }
        if let Some(path) = self.output_schema.take() {
            self.output = Some(read_output_schema(&path)?);
        }
        if let Some(path) = self.prices.take() {
            let text = toolloop::user_file::read_to_string(&path, MAX_PRICES_BYTES)
                .map_err(|e| format!("--prices {}: {e}", path.display()))?;
            price_table(Some(&text)).map_err(|e| format!("--prices {}: {e}", path.display()))?;
            self.price_entries = Some(text);
        }
        // The cassette, once the settings are whole (they are recorded with it).
        crate::record::note_fallback(&self.record);
        let mut settings = serde_json::to_value(&*self).map_err(|e| e.to_string())?;
        if let Some(o) = settings.as_object_mut() {
            o.insert(
                "toolloop_version".into(),
                Value::from(env!("CARGO_PKG_VERSION")),
            );
        }
        crate::record::setup(&self.record, &self.provider.model, settings)?;
        if self.record.replay_tools {
            // Nothing is run: not even the MCP servers (their tools are not in the cassette).
            if !self.mcp.mcp_config.is_empty() {
                eprintln!(
                    "toolloop: --replay-tools: the MCP servers of --mcp-config are not started"
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
    pub(crate) fn check(&mut self) -> Result<(), String> {
        self.agents.check()?;
        if self.max_rounds == 0 {
            return Err("--max-rounds 0: a run needs at least 1 round".into());
        }
        if let Some(n) = self.max_output_tokens
            && !(1..=MAX_OUTPUT_TOKENS).contains(&n)
        {
            return Err(format!(
                "--max-output-tokens {n}: expected 1 to {MAX_OUTPUT_TOKENS}"
            ));
        }
        if let Some(t) = self.temperature {
            check_temperature(t).map_err(|e| format!("--temperature: {e}"))?;
            if t > 1.0 && self.provider.model.trim().starts_with("anthropic:") {
                return Err(format!(
                    "--temperature {t}: Anthropic accepts a temperature from 0 to 1"
                ));
            }
        }
        match self.timeout {
            Some(t) if t.is_zero() => {
                return Err("--timeout 0: expected a positive duration".into());
            }
            Some(t) if t > MAX_TIMEOUT => {
                eprintln!(
                    "toolloop: the saved timeout ({}s) is beyond the longest, 30 days: using 30 days",
                    t.as_secs()
                );
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
pub(crate) fn read_output_schema(path: &std::path::Path) -> Result<toolloop::OutputSchema, String> {
    let at = || format!("--output-schema {}", path.display());
    let text = toolloop::user_file::read_to_string(path, MAX_SCHEMA_BYTES)
        .map_err(|e| format!("{}: {e}; expected a JSON Schema", at()))?;
    let schema: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not JSON ({e}); expected a JSON Schema object", at()))?;
    if !schema.is_object() {
        return Err(format!(
            "{}: expected a JSON Schema object (`{{\"type\": \"object\", …}}`)",
            at()
        ));
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
    output
        .compile()
        .map_err(|e| format!("{}: not a valid JSON Schema: {}", at(), e.message))?;
    Ok(output)
}

/// The most bytes a prompt read from stdin may have.
const MAX_STDIN_PROMPT: u64 = 64 * 1024 * 1024;

/// The prompt piped on stdin; an error on a terminal (nothing was piped), for an empty prompt,
/// or for text that is not UTF-8.
fn read_stdin_prompt() -> Result<String, String> {
    use std::io::Read;
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(
            "no prompt: give it as an argument, or pipe it on stdin (`… | toolloop run -`)".into(),
        );
    }
    let mut bytes = Vec::new();
    stdin
        .lock()
        .take(MAX_STDIN_PROMPT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the prompt from stdin: {e}"))?;
    if bytes.len() as u64 > MAX_STDIN_PROMPT {
        return Err(format!(
            "the prompt on stdin is longer than {} MiB",
            MAX_STDIN_PROMPT / (1024 * 1024)
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        format!(
            "the prompt on stdin is not UTF-8 (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })?;
    if text.trim().is_empty() {
        return Err("the prompt on stdin is empty".into());
    }
    Ok(text)
}

pub(crate) fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("toolloop: {message}");
    ExitCode::from(EXIT_USAGE)
}

/// 0 answered; 3 a budget or terminal condition stopped the run; 1 other failures.
pub(crate) fn exit_code(reason: StopReason) -> ExitCode {
    match reason {
        StopReason::Answered => ExitCode::SUCCESS,
        StopReason::MaxRounds
        | StopReason::MaxToolCalls
        | StopReason::Timeout
        | StopReason::TerminalSignal
        | StopReason::TooManyInvalidCalls
        | StopReason::OutputTruncated
        | StopReason::ContextExhausted => ExitCode::from(3),
        StopReason::AwaitingApproval => ExitCode::from(crate::approve::EXIT_AWAITING),
        StopReason::Cancelled
        | StopReason::ModelError
        | StopReason::StoreFailed
        | StopReason::EmptyAnswer => ExitCode::FAILURE,
        // A reason added to the engine after this was written: not an answer.
        _ => ExitCode::FAILURE,
    }
}

pub(crate) async fn run(mut args: RunArgs) -> ExitCode {
    if args.prompt == "-" {
        match read_stdin_prompt() {
            Ok(p) => args.prompt = p,
            Err(e) => return usage_error(e),
        }
    }
    if let Err(e) = args.agent.prepare() {
        return usage_error(e);
    }
    args.agent.stream_on_terminal(args.json || args.jsonl);
    let cancel = CancellationToken::new();
    let on_ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    run_with(args, cancel).await
}

/// Runs (or resumes) until done or `cancel`; prints the outcome; the exit code.
pub(crate) async fn run_with(args: RunArgs, cancel: CancellationToken) -> ExitCode {
    run_with_note(args, cancel, "toolloop: cancelling").await
}

/// [`run_with`], saying `note` on stderr when `cancel` strikes (after the unfinished reply on
/// the terminal is taken back, so that nothing of it stays on screen).
pub(crate) async fn run_with_note(
    mut args: RunArgs,
    cancel: CancellationToken,
    note: &'static str,
) -> ExitCode {
    if let Err(e) = args.agent.check() {
        return usage_error(e);
    }
    if let Err(e) = args.agent.mcp.absolutize() {
        return usage_error(e);
    }
    let images = match attachments(&args.attach) {
        Ok(images) => images,
        Err(e) => return usage_error(e),
    };
    let started = std::time::Instant::now();
    crate::sandbox::protect_store(args.durable.store.store.as_deref());
    let tools = match tools(&args.agent).await {
        Ok(t) => t,
        Err(e) => return e.report(),
    };
    let rules = &args.agent.approval;
    let has_rules = [&rules.allow, &rules.ask, &rules.deny]
        .iter()
        .any(|specs| !specs.is_empty());
    if has_rules && !rules.rules_checked {
        // The servers' tools are listed again only when servers are configured.
        let offered = match tools.mcp {
            Some(_) => tools.all().await,
            None => tools.own.clone(),
        };
        let names: Vec<&str> = offered.iter().map(|t| t.name()).collect();
        crate::approve::warn_unoffered(rules, &names);
    }
    let model = match model_from_args(&args.agent.provider) {
        Ok(m) => m,
        Err(e) => return usage_error(e),
    };
    // The time the MCP servers took to list their tools counts against the run's timeout.
    let mut agent_args = args.agent.clone();
    agent_args.timeout = agent_args.timeout.map(|t| {
        t.saturating_sub(started.elapsed())
            .max(Duration::from_millis(1))
    });
    let person_only = crate::approve::person_only(&tools.own);
    let builder = match agent_builder_with(&agent_args, model, tools) {
        Ok(b) => b,
        Err(e) => return usage_error(e),
    };
    let machine_output = args.json || args.jsonl;
    let stream_text = args.agent.stream && !machine_output;
    let progress = Arc::new(Progress::new(
        std::io::stderr().is_terminal() && !machine_output,
        stream_text,
    ));
    let shown = progress.clone();
    let jsonl = args.jsonl;
    let mut builder = builder.on_event(move |e| {
        if jsonl {
            event_line(e);
        } else {
            shown.event(e);
        }
    });
    let watcher = {
        let progress = progress.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            cancel.cancelled().await;
            progress.interrupted(note);
        })
    };
    let _stop_watching = AbortOnDrop(watcher);
    if let Some(ask) = crate::approve::handler(&args.agent.approval, progress.clone(), person_only)
    {
        builder = builder.on_approval(move |p| ask(p));
    }
    let mut durable = match crate::durable::Durable::open(&args.durable, &args).await {
        Ok(d) => d,
        Err(code) => return code,
    };
    if let Some(journal) = durable.journal() {
        builder = builder.journal(journal);
    }
    let agent = match builder.build() {
        Ok(a) => a,
        Err(e) => {
            durable.close().await;
            return usage_error(e);
        }
    };
    progress.set_window(agent.config().context.as_ref().and_then(|c| c.window));
    let prompt = Message::user_with_images(args.prompt.clone(), images);
    let outcome = match durable.run(&agent, prompt, cancel).await {
        Ok(o) => o,
        Err(code) => return code,
    };
    progress.finish();
    if args.json {
        outln!("{}", outcome_json(&outcome));
    } else if args.jsonl {
        let mut line = outcome_json(&outcome);
        if let Some(o) = line.as_object_mut() {
            o.insert("type".into(), Value::from("run_finished"));
        }
        outln!("{line}");
    } else {
        if let Some(output) = &outcome.output {
            // The validated answer, as one line of JSON.
            outln!("{output}");
        } else if !progress.streamed()
            && let Some(text) = &outcome.text
        {
            // Written once final: the exact bytes to a pipe or a file, escaped on a terminal.
            let stdout = std::io::stdout();
            let text = crate::terminal::for_stdout(text, stdout.is_terminal());
            let mut out = stdout.lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
        if outcome.stop_reason != StopReason::Answered {
            // The message may quote a server or the model (a traceback, over several lines):
            // escaped, as a diagnostic, and cut short when long.
            let why = outcome
                .error
                .as_ref()
                .map(|e| format!(": {}", crate::terminal::diagnostic(&e.message)))
                .unwrap_or_default();
            let signal = outcome
                .signal
                .as_ref()
                .map(|s| format!(" (signal {})", crate::terminal::escape(s, false)))
                .unwrap_or_default();
            eprintln!(
                "toolloop: stopped: {}{signal}{why}",
                serde_json::to_value(outcome.stop_reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            );
            crate::approve::show_pending(&outcome);
        }
    }
    exit_code(outcome.stop_reason)
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The tools `agent` offers: the file tools, `run_command` when allowed, and the tools of the
/// MCP servers configured, as selected by `--tools` / `--no-tools`.
pub(crate) async fn tools(
    agent: &AgentArgs,
) -> Result<crate::mcp::RunTools, crate::mcp::ToolsError> {
    use crate::mcp::ToolsError;
    let mut tools = toolloop_tools::fs::builtin_tools(&agent.root, agent.allow_write)
        .map_err(|e| ToolsError::Usage(format!("--root {}: {e}", agent.root.display())))?;
    tools.extend(
        crate::approve::command_tools(&agent.root, &agent.approval).map_err(ToolsError::Usage)?,
    );
    #[cfg(feature = "test-hooks")]
    let tools = crate::testtool::tools(tools);
    // Recorded in the cassette, or answered from it (`--replay-tools`).
    let tools = crate::record::wrap_tools(tools);
    // The servers list their tools before the run: within its timeout too.
    let deadline = agent.timeout.map(|t| tokio::time::Instant::now() + t);
    // Chat's prompt reads the terminal: it asks about a project's servers before it starts.
    let may_ask = !agent.approval.no_prompt;
    crate::mcp::assemble(&agent.mcp, &agent.root, tools, deadline, may_ask).await
}

/// The agent `agent` describes around `model` and `tools`: its limits and approval rules (no
/// event handler, no approval handler, no journal).
pub(crate) fn agent_builder_with(
    agent: &AgentArgs,
    model: Arc<dyn toolloop::model::Model>,
    tools: crate::mcp::RunTools,
) -> Result<AgentBuilder, String> {
    let mut builder = crate::agents::attach(agent, agent_builder_base(agent, model)?, tools.own)?;
    if let Some(mcp) = tools.mcp {
        builder = builder.tool_source_arc(mcp);
    }
    Ok(builder)
}

/// The agent `agent` describes around `model`, without tools: its limits, approval rules,
/// system prompt, model settings and prices.
pub(crate) fn agent_builder_base(
    agent: &AgentArgs,
    model: Arc<dyn toolloop::model::Model>,
) -> Result<AgentBuilder, String> {
    let mut builder = AgentBuilder::new(model)
        .max_rounds(agent.max_rounds)
        .max_tool_calls(agent.max_tool_calls)
        .stream(agent.stream)
        .redact(crate::secrets::redactor())
        .approvals(crate::approve::approvals(&agent.approval)?);
    if let Some(system) = &agent.system {
        builder = builder.system(system.clone());
    }
    if let Some(t) = agent.timeout {
        builder = builder.timeout(t);
    }
    if let Some(t) = agent.temperature {
        builder = builder.temperature(t);
    }
    if let Some(n) = agent.max_output_tokens {
        builder = builder.max_output_tokens(n);
    }
    if let Some(output) = &agent.output {
        builder = builder.output_schema(output.clone());
    }
    if agent.price_entries.is_some() {
        let table =
            price_table(agent.price_entries.as_deref()).map_err(|e| format!("--prices: {e}"))?;
        builder = builder.prices(table);
    }
    agent.context.apply(&agent.provider, builder)
}

/// The built-in price table with the entries of a `--prices` file.
fn price_table(entries: Option<&str>) -> Result<toolloop::price::PriceTable, String> {
    let mut table = toolloop::price::PriceTable::builtin();
    if let Some(text) = entries {
        table.extend_from_json(text).map_err(|e| {
            format!(
                "not a prices file: {e}; expected a JSON object like \
                 {{\"MODEL\": {{\"input\": 1.0, \"output\": 2.0}}}} (US dollars per million tokens)"
            )
        })?;
    }
    Ok(table)
}

/// `--jsonl`: one event as a line on stdout. The run's end is written by the caller, with the
/// outcome in the shape `--json` gives it.
fn event_line(event: &toolloop::Event) {
    if matches!(event, toolloop::Event::RunFinished { .. }) {
        return;
    }
    match serde_json::to_string(event) {
        Ok(line) => outln!("{line}"),
        Err(e) => eprintln!("toolloop: cannot write an event as JSON: {e}"),
    }
}

/// The outcome as the `--json` object.
pub(crate) fn outcome_json(o: &Outcome) -> Value {
    let calls: Vec<Value> = o
        .tool_calls
        .iter()
        .map(|c| {
            let result = serde_json::from_str::<Value>(&c.content)
                .unwrap_or_else(|_| Value::String(c.content.clone()));
            let mut call = json!({
                "round": c.round,
                "id": c.call.id,
                "name": c.call.name,
                "arguments": c.call.arguments,
                "success": c.success(),
                "status": c.status,
                "result": result,
                "duration_ms": c.duration_ms,
            });
            if let Some(spent) = &c.spent {
                // A sub-agent's usage and cost (counted in the run's too).
                call["spent"] = json!(spent);
            }
            call
        })
        .collect();
    let mut v = json!({
        "success": o.success,
        "stop_reason": o.stop_reason,
        "text": o.text,
        "signal": o.signal,
        "rounds": o.rounds,
        "tool_calls": calls,
        "usage": o.usage,
        "calls_without_usage": o.calls_without_usage,
        "cost": o.cost,
        "duration_ms": o.duration_ms,
        "run_id": o.run_id,
    });
    if let Some(output) = &o.output {
        v["output"] = output.clone();
    }
    if let Some(e) = &o.error {
        v["error"] = json!({"code": e.code, "message": e.message});
    }
    if !o.pending_approvals.is_empty() {
        v["pending_approvals"] = json!(o.pending_approvals);
    }
    v
}
