//! `toolloop serve`: the agent the flags describe, served to other programs.
//!
//! - `--restate ADDR`: a worker that runs the agent as a durable service on Restate (see the
//!   `toolloop-restate` crate): the Restate server calls it over HTTP/2 for each run, invoked on
//!   Restate's ingress.
//! - `--openai ADDR`: an OpenAI-compatible API ([`openai`]): the agents as models
//!   (`agent:NAME`), and a gateway (`gateway:SPEC`) that gives native tool calls to any model
//!   through prompt-based calling ([`gateway`]).
//! - `--mcp` (stdio) or `--mcp ADDR` (streamable HTTP): the agents as MCP tools ([`mcp`]).

mod gateway;
mod mcp;
mod openai;
mod wire;

use crate::CliError;
use crate::args::AgentArgs;
use crate::args::StoreArgs;
use crate::cx::Cx;
use crate::setup::{agent_builder_with, tools};
use crate::spec::model_from_args;
use clap::Args;
use sha2::Digest;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolloop::agent::{Agent, EventHandler, OnApproval};
use toolloop::journal::{Journal, JournalError};
use toolloop::message::Message;
use toolloop::outcome::Outcome;
use toolloop_store::{RunTags, Store};

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["restate", "openai", "mcp"])))]
pub(crate) struct ServeArgs {
    /// Serve the agent to a Restate server: listen on this address (`127.0.0.1:9080`) for the
    /// server's calls. Several workers may share one address. Needs the command built with the
    /// `restate` feature (not a default one: `cargo install toolloop-cli --features restate`).
    #[arg(long, value_name = "ADDR")]
    pub restate: Option<SocketAddr>,
    /// Register this worker with Restate's admin API at this URL (`http://127.0.0.1:9070`).
    #[arg(long, value_name = "URL", requires = "restate")]
    pub admin_url: Option<String>,
    /// The URL the Restate server reaches this worker at, when registering (default:
    /// `http://` and the listening address).
    #[arg(long, value_name = "URL", requires = "admin_url")]
    pub advertise: Option<String>,
    /// Serve an OpenAI-compatible API on this address (`127.0.0.1:8080`):
    /// `POST /v1/chat/completions` and `/v1/responses` with `model: "agent:NAME"` run an agent
    /// (`agent:default`, the one these flags describe, or one of `[agents.NAME]` / --agents)
    /// and answer with its final text;
    /// `model: "gateway:SPEC"` offers the request's own tools to the model SPEC
    /// (`openai:qwen3` behind `--base-url`) through prompt-based tool calling and answers with
    /// standard `tool_calls` (nothing runs on the server; a call written wrong is sent back
    /// to SPEC to correct). `GET /v1/models` lists them,
    /// `GET /v1/runs/{id}` shows a run. Any address but loopback needs --auth-token.
    #[arg(long, value_name = "ADDR")]
    pub openai: Option<SocketAddr>,
    /// Serve the agent as an MCP server: on stdin and stdout with no address, or over
    /// streamable HTTP at `http://ADDR/mcp` (`--mcp 127.0.0.1:8090`). Each agent (`default`,
    /// and each of `[agents.NAME]` / --agents) is a tool that takes the task and answers with
    /// the final text (structured content with --output-schema).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "stdio")]
    pub mcp: Option<String>,
    /// With --mcp: offer this workflow file as a tool too (repeatable): named after the
    /// workflow, its inputs the tool's arguments, its result the last step's output.
    #[arg(long = "workflow", value_name = "FILE", requires = "mcp")]
    pub workflows: Vec<PathBuf>,
    #[command(flatten)]
    pub workflow_files: crate::workflow::FilesArgs,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// The flags of the serving modes (`--openai`, `--mcp`; --max-runs and --grace hold for MCP over
/// stdio too).
#[derive(Args, Debug, Clone)]
pub(crate) struct HttpArgs {
    /// A token clients must send (`Authorization: Bearer TOKEN`; an OpenAI client's API
    /// key), compared in constant time. Required to listen on anything but loopback. Repeat it
    /// to let several clients in: then each sees only the runs it started (`GET
    /// /v1/runs/{id}`, `Idempotency-Key`). Prefer --auth-token-file or the variable: a command
    /// line is visible to other users.
    #[arg(
        long,
        env = "TOOLLOOP_AUTH_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub auth_token: Vec<String>,
    /// Read the tokens from this file: one a line (blank lines and lines starting with `#`
    /// are skipped); several tokens are several clients, as with a repeated --auth-token.
    #[arg(long, value_name = "FILE", conflicts_with = "auth_token")]
    pub auth_token_file: Option<PathBuf>,
    /// The largest request body, in bytes; a larger one gets 413.
    #[arg(long, value_name = "BYTES", default_value_t = 4 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1024..=1024 * 1024 * 1024))]
    pub max_body: u64,
    /// Runs at once (agents, gateway requests, workflows over MCP); one more gets 429 (over
    /// MCP, a tool error saying so).
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_runs: u32,
    /// A run whose client disconnects goes on to its end (its outcome is kept in the store,
    /// and a retry with the same `Idempotency-Key` gets it) instead of being cancelled.
    #[arg(long)]
    pub keep_on_disconnect: bool,
    /// On SIGTERM or Ctrl-C: how long runs in progress may take to finish before the server
    /// exits; the runs still going are left in the store, resumable (`toolloop resume`, or a
    /// retry with the same `Idempotency-Key`).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::args::parse_timeout)]
    pub grace: Duration,
}

impl HttpArgs {
    /// The tokens the flags give, read from their file when one is named; none: no token is
    /// asked for.
    fn tokens(&self) -> Result<Vec<String>, CliError> {
        if let Some(path) = &self.auth_token_file {
            let text = toolloop::user_file::read_to_string(path, 64 * 1024).map_err(|e| {
                CliError::invalid(format!("--auth-token-file {}", path.display()), e)
            })?;
            let tokens: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_string)
                .collect();
            if tokens.is_empty() {
                return Err(CliError::usage(format!(
                    "--auth-token-file {}: the file holds no token",
                    path.display()
                )));
            }
            return Ok(tokens);
        }
        let mut tokens = Vec::new();
        for t in &self.auth_token {
            if t.trim().is_empty() {
                return Err(CliError::usage("--auth-token: the token is empty"));
            }
            tokens.push(t.trim().to_string());
        }
        Ok(tokens)
    }
}

pub(crate) async fn serve(cx: &Arc<Cx>, mut args: ServeArgs) -> Result<ExitCode, CliError> {
    // A command built without the `restate` feature says so before anything else is read (the
    // configuration, the files the flags name) or said (the model's warnings).
    if let Some(addr) = args.restate {
        return serve_restate(cx, args, addr).await;
    }
    prepare_agent(cx, &mut args)?;
    if args.admin_url.is_some() || args.advertise.is_some() {
        return Err(CliError::usage(
            "--admin-url and --advertise go with --restate",
        ));
    }
    if !args.workflows.is_empty() && args.mcp.is_none() {
        return Err(CliError::usage(
            "--workflow: workflows are served over MCP only (add --mcp)",
        ));
    }
    let tokens = args.http.tokens()?;
    // Nothing asks a person on a terminal: a call that needs approval is denied, or, with
    // --defer-approvals, the run stops and waits (the modes' own handlers decide).
    args.agent.approval.no_prompt = true;
    let agents = Arc::new(Agents::open(cx, &args).await?);
    if let Some(addr) = args.openai {
        if !addr.ip().is_loopback() && tokens.is_empty() {
            return Err(CliError::usage(format!(
                "--openai {addr}: listening beyond loopback needs --auth-token or \
                 --auth-token-file (clients send it as their API key)"
            )));
        }
        return openai::serve(addr, agents, args.agent.provider.clone(), args.http, tokens).await;
    }
    match args.mcp.as_deref() {
        Some("stdio") | None => mcp::serve_stdio(agents, &args.http).await,
        Some(addr) => {
            let addr: SocketAddr = match addr.parse() {
                Ok(a) => a,
                Err(_) => {
                    return Err(CliError::usage(format!(
                        "--mcp {addr}: expected an address like 127.0.0.1:8090 (or no value \
                         for stdio)"
                    )));
                }
            };
            if !addr.ip().is_loopback() && tokens.is_empty() {
                return Err(CliError::usage(format!(
                    "--mcp {addr}: listening beyond loopback needs --auth-token or \
                     --auth-token-file"
                )));
            }
            mcp::serve_http(addr, agents, args.http, tokens).await
        }
    }
}

/// Reads the agent's configuration and the files its flags name, and checks them.
fn prepare_agent(cx: &Cx, args: &mut ServeArgs) -> Result<(), CliError> {
    args.agent.prepare(cx)?;
    args.agent.check()?;
    args.agent.mcp.absolutize()
}

#[cfg(feature = "restate")]
async fn serve_restate(
    cx: &Cx,
    mut args: ServeArgs,
    listen: SocketAddr,
) -> Result<ExitCode, CliError> {
    prepare_agent(cx, &mut args)?;
    let tools = tools(cx, &args.agent).await?;
    let model = model_from_args(cx, &args.agent.provider)?;
    let agent = agent_builder_with(cx, &args.agent, model, tools)?
        .build()
        .map_err(|e| CliError::usage(e.to_string()))?;
    let worker =
        toolloop_restate::Worker::bind(listen).map_err(|e| CliError::failure("--restate", e))?;
    let addr = worker
        .local_addr()
        .map_err(|e| CliError::failure(format!("--restate {listen}"), e))?;
    crate::error::warn(format!("serving the agent to Restate on {addr}"));
    let serving = tokio::spawn(worker.serve(agent, async {
        let _ = tokio::signal::ctrl_c().await;
    }));
    if let Some(admin) = &args.admin_url {
        let endpoint = args
            .advertise
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"));
        match toolloop_restate::register(admin, &endpoint, Duration::from_secs(60)).await {
            Ok(()) => crate::error::warn(format!("registered {endpoint} with {admin}")),
            Err(e) => {
                serving.abort();
                return Err(CliError::failure("--admin-url", e));
            }
        }
    }
    serving
        .await
        .map_err(|e| CliError::failure("the worker stopped", e))?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "restate"))]
async fn serve_restate(
    _cx: &Cx,
    _args: ServeArgs,
    _listen: SocketAddr,
) -> Result<ExitCode, CliError> {
    Err(CliError::usage(
        "--restate: this toolloop was built without the `restate` feature, which is not a default \
         one (cargo install toolloop-cli --features restate)",
    ))
}

/// A command built without the `restate` feature (`cargo test -p toolloop-cli` with the
/// default features; the `test-hooks` feature turns `restate` on).
#[cfg(all(test, not(feature = "restate")))]
mod without_restate {
    use super::*;
    use clap::Parser;

    /// `serve --restate ADDR` is refused as a usage error that names the feature and how to
    /// get it, before anything else is read: here a `--system-file` that does not exist.
    #[tokio::test]
    async fn serve_restate_names_the_missing_feature() {
        let cli = crate::Cli::try_parse_from([
            "toolloop",
            "serve",
            "--restate",
            "127.0.0.1:9080",
            "--system-file",
            "/nonexistent/system.md",
        ])
        .unwrap();
        let crate::Command::Serve(args) = cli.command else {
            panic!("not the serve command");
        };
        let e = serve(&Arc::new(Cx::default()), args).await.unwrap_err();
        let said = e.to_string();
        assert!(
            said.starts_with("--restate: this toolloop was built without the `restate` feature")
                && said.contains("cargo install toolloop-cli --features restate"),
            "{said}"
        );
        assert_eq!(e.exit_code(), ExitCode::from(2));
    }
}

/// The agents a server offers, each built afresh for every run (with that run's event and
/// approval handlers) from what is set up once: the model, the tools (the MCP servers started
/// once), the store's run log.
///
/// `default` is the agent the command's flags describe (with `--agent NAME`, that agent); each
/// declared agent (`[agents.NAME]` of the configuration file, `--agents FILE`) is served under
/// its name too, as `--agent NAME` would run it.
pub(crate) struct Agents {
    cx: Arc<Cx>,
    agents: Vec<AgentSpec>,
    workflows: Vec<WorkflowSpec>,
    store: Option<Store>,
}

/// A workflow the server offers (over MCP).
pub(crate) struct WorkflowSpec {
    /// The workflow, as read from its file.
    pub workflow: toolloop_workflow::Workflow,
    /// The settings its steps start from (the command's).
    pub args: AgentArgs,
}

/// One agent of the server.
pub(crate) struct AgentSpec {
    /// Its name (`agent:NAME` as a model, the tool's name over MCP).
    pub name: String,
    /// What it is for (the MCP tool's description).
    pub description: String,
    args: AgentArgs,
    cx: Arc<Cx>,
    model: Arc<dyn toolloop::model::Model>,
    own: Vec<Arc<dyn toolloop::tool::Tool>>,
    mcp: Option<Arc<crate::mcp::SelectedMcp>>,
    journal: Option<Arc<dyn Journal>>,
}

/// What a run gets from the mode that starts it.
#[derive(Default)]
pub(crate) struct RunHooks {
    /// Streams the model's text.
    pub stream: bool,
    /// Sees every event.
    pub on_event: Option<EventHandler>,
    /// Decides the calls that need a person; `None`: denied, or with --defer-approvals the
    /// run stops and waits.
    pub on_approval: Option<OnApproval>,
}

/// Why a run could not start.
#[derive(Debug)]
pub(crate) enum RunError {
    /// Another request with the same idempotency key holds the run.
    Busy(String),
    /// Anything else.
    Failed(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Busy(m) | RunError::Failed(m) => f.write_str(m),
        }
    }
}

impl Agents {
    async fn open(cx: &Arc<Cx>, args: &ServeArgs) -> Result<Agents, CliError> {
        crate::sandbox::protect_store(cx, args.store.store.as_deref());
        let store = crate::durable::open_store(cx, &args.store).await?;
        let tools = tools(cx, &args.agent).await?;
        let model = model_from_args(cx, &args.agent.provider)?;
        let meta = crate::durable::run_meta(&args.agent);
        let journal = store.run_journal(RunTags {
            meta: Some(meta),
            ..RunTags::default()
        });
        let spec = AgentSpec {
            name: "default".into(),
            description: "Runs the agent on a task (with its tools) and answers with the \
                          result."
                .into(),
            args: args.agent.clone(),
            cx: cx.clone(),
            model,
            own: tools.own.clone(),
            mcp: tools.mcp.clone(),
            journal: Some(journal),
        };
        // Checked once, so that a bad flag is a usage error at start, not a failed request.
        spec.build(RunHooks::default()).map_err(CliError::Usage)?;
        let mut agents = vec![spec];
        // The declared agents (`[agents.NAME]`, `--agents FILE`), each as `--agent NAME` runs
        // it: its model, system prompt, tools and limits.
        for (name, def) in &args.agent.agents.agent_defs {
            if agents.iter().any(|a| &a.name == name) {
                crate::error::warn(format!(
                    "the agent `{name}` is not served: `default` names the agent \
                     the flags describe"
                ));
                continue;
            }
            let mut settings = args.agent.clone();
            settings.agents.agent_name = Some(name.clone());
            settings
                .take_direct_agent()
                .and_then(|()| cx.config.resolve_model(&mut settings.provider))
                .map_err(|e| e.context(format!("[agents.{name}]")))?;
            let model = model_from_args(cx, &settings.provider)
                .map_err(|e| e.context(format!("[agents.{name}]")))?;
            let journal = store.run_journal(RunTags {
                meta: Some(crate::durable::run_meta(&settings)),
                ..RunTags::default()
            });
            let spec = AgentSpec {
                name: name.clone(),
                description: def.description.clone(),
                args: settings,
                cx: cx.clone(),
                model,
                own: tools.own.clone(),
                mcp: tools.mcp.clone(),
                journal: Some(journal),
            };
            spec.build(RunHooks::default())
                .map_err(|e| CliError::usage(format!("[agents.{name}]: {e}")))?;
            agents.push(spec);
        }
        let mut workflows: Vec<WorkflowSpec> = Vec::new();
        for file in &args.workflows {
            let workflow = crate::workflow::load(cx, file, args.workflow_files, &args.agent)?;
            if agents.iter().any(|a| a.name == workflow.name)
                || workflows.iter().any(|w| w.workflow.name == workflow.name)
            {
                return Err(CliError::usage(format!(
                    "--workflow {}: the name `{}` is taken (by the agent or another workflow)",
                    file.display(),
                    workflow.name
                )));
            }
            workflows.push(WorkflowSpec {
                workflow,
                args: args.agent.clone(),
            });
        }
        Ok(Agents {
            cx: cx.clone(),
            agents,
            workflows,
            store: Some(store),
        })
    }

    /// What the command shares.
    pub(crate) fn cx(&self) -> &Arc<Cx> {
        &self.cx
    }

    /// Every agent.
    pub(crate) fn all(&self) -> &[AgentSpec] {
        &self.agents
    }

    /// Every workflow.
    pub(crate) fn workflows(&self) -> &[WorkflowSpec] {
        &self.workflows
    }

    /// The store runs are logged in.
    pub(crate) fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }
}

impl AgentSpec {
    /// The agent, with a run's hooks.
    pub(crate) fn build(&self, hooks: RunHooks) -> Result<Agent, String> {
        let mut args = self.args.clone();
        args.stream = hooks.stream;
        let tools = crate::mcp::RunTools {
            own: self.own.clone(),
            mcp: self.mcp.clone(),
        };
        let mut builder = agent_builder_with(&self.cx, &args, self.model.clone(), tools)
            .map_err(|e| crate::error::chain(&e))?;
        if let Some(journal) = &self.journal {
            builder = builder.journal(journal.clone());
        }
        if let Some(f) = hooks.on_event {
            builder = builder.on_event(move |e| f(e));
        }
        match hooks.on_approval {
            Some(ask) => builder = builder.on_approval(move |p| ask(p)),
            None if !args.approval.defer_approvals => {
                builder = builder.on_approval(|_| {
                    Box::pin(async {
                        toolloop::approval::Answer::Deny {
                            reason: Some(
                                "this call needs a person's approval, and no one can be asked \
                                 on this server"
                                    .into(),
                            ),
                        }
                    })
                });
            }
            None => {}
        }
        builder.build().map_err(|e| e.to_string())
    }

    /// Whether a call that needs a person stops the run to wait (`--defer-approvals`).
    pub(crate) fn defers_approvals(&self) -> bool {
        self.args.approval.defer_approvals
    }

    /// The JSON Schema of the agent's typed answer (`--output-schema`), if it has one.
    pub(crate) fn output_schema(&self) -> Option<&serde_json::Value> {
        self.args.output.as_ref().map(|o| &o.schema)
    }

    /// The id the run of a request of `client` gets (see [`Client::run_id`]).
    pub(crate) fn run_id(&self, client: &Client, idempotency_key: Option<&str>) -> RunId {
        client.run_id(&format!("agent:{}", self.name), idempotency_key)
    }
}

/// The id a request's run is logged under, known before it starts (a Responses API answer's id
/// is its run's, from its first event).
#[derive(Clone, Debug)]
pub(crate) enum RunId {
    /// An idempotency key's: the run it started, if there is one, else a new run.
    Keyed(String),
    /// A new run's.
    Fresh(String),
}

impl RunId {
    /// The id.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            RunId::Keyed(id) | RunId::Fresh(id) => id,
        }
    }
}

/// Who sent a request, when the server tells its clients apart (it has several tokens): a tag
/// made from the client's token (a digest: the token itself is never kept). A client's runs
/// carry its tag in their ids, so that it sees only those (`GET /v1/runs/{id}`), and the same
/// `Idempotency-Key` from two clients names two runs. With one token (or none), every request
/// is the same client, `Client(None)`, and run ids are as they always were.
#[derive(Clone, Debug, Default)]
pub(crate) struct Client(pub Option<String>);

impl Client {
    /// The client whose token has this SHA-256 digest.
    pub(crate) fn from_token_digest(digest: &[u8; 32]) -> Client {
        let mut h = sha2::Sha256::new();
        h.update(b"toolloop serve client\0");
        h.update(digest);
        let tag = h.finalize();
        let hex: String = tag[..8].iter().map(|b| format!("{b:02x}")).collect();
        Client(Some(format!("c{hex}")))
    }

    /// Whether run `run_id` is this client's (any run is, when clients are not told apart).
    pub(crate) fn owns(&self, run_id: &str) -> bool {
        match &self.0 {
            None => true,
            Some(tag) => run_id
                .strip_prefix("run_")
                .and_then(|r| r.strip_prefix(tag.as_str()))
                .is_some_and(|r| r.starts_with('_')),
        }
    }

    /// The id of the run of a request of this client to `scope` (an agent, a gateway
    /// backend): the key's when it has one, else a new id (with the client's tag when clients
    /// are told apart).
    pub(crate) fn run_id(&self, scope: &str, idempotency_key: Option<&str>) -> RunId {
        if let Some(key) = idempotency_key {
            return RunId::Keyed(self.keyed_run_id(scope, key));
        }
        let id = toolloop::journal::new_run_id();
        RunId::Fresh(match &self.0 {
            None => id,
            Some(tag) => format!("run_{tag}_{}", id.trim_start_matches("run_")),
        })
    }

    /// The run id an idempotency key stands for, per `scope` (an agent, a gateway backend)
    /// and per client: a digest, so that the key itself is not stored.
    pub(crate) fn keyed_run_id(&self, scope: &str, key: &str) -> String {
        let mut h = sha2::Sha256::new();
        h.update(b"toolloop serve idempotency\0");
        // The agents' ids are as they were before the gateway shared the scheme.
        h.update(scope.strip_prefix("agent:").unwrap_or(scope).as_bytes());
        h.update(b"\0");
        h.update(key.as_bytes());
        if let Some(tag) = &self.0 {
            h.update(b"\0");
            h.update(tag.as_bytes());
        }
        let digest = h.finalize();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        match &self.0 {
            None => format!("run_idem_{hex}"),
            Some(tag) => format!("run_{tag}_idem_{hex}"),
        }
    }
}

/// Runs `messages` with `agent` under `run_id`: a key's names the run it started, continued
/// from its last durable step when it was cut short, its outcome when it had finished (409
/// while another request holds it); a fresh id, a new run. The outcome is saved in the store.
pub(crate) async fn run_keyed(
    agent: &Agent,
    store: Option<&Store>,
    messages: Vec<Message>,
    run_id: RunId,
    cancel: CancellationToken,
) -> Result<Outcome, RunError> {
    let busy = |run_id: &str| {
        RunError::Busy(format!(
            "a request with this Idempotency-Key is still running (run {run_id})"
        ))
    };
    let outcome = match (run_id, store) {
        (RunId::Keyed(run_id), Some(store)) => {
            let known = store
                .run(&run_id)
                .await
                .map_err(|e| RunError::Failed(e.to_string()))?;
            if known.is_some() {
                agent.resume(&run_id, cancel).await.map_err(|e| match e {
                    JournalError::Locked { .. } => busy(&run_id),
                    other => RunError::Failed(other.to_string()),
                })?
            } else {
                let outcome = agent.run_with_id(&run_id, messages, cancel).await;
                if outcome.stop_reason == toolloop::outcome::StopReason::StoreFailed
                    && outcome
                        .error
                        .as_ref()
                        .is_some_and(|e| e.message.contains("is held by"))
                {
                    return Err(busy(&run_id));
                }
                outcome
            }
        }
        (RunId::Fresh(id), Some(_)) => agent.run_with_id(&id, messages, cancel).await,
        (_, None) => agent.run_cancellable(messages, cancel).await,
    };
    if let (Some(run_id), Some(store)) = (&outcome.run_id, store)
        && let Err(e) = store.save_outcome(run_id, &outcome).await
    {
        tracing::warn!("the run {run_id} finished, but saving its outcome failed: {e}");
    }
    Ok(outcome)
}

/// Serves `app` on `listener` until the process is asked to stop ([`shutdown_signal`]), then
/// cancels `stop`, which ends the server's accepting of connections. The server's task is
/// returned, to wait for the connections still open.
pub(crate) async fn serve_until_signal(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stop: &tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let server = {
        let stop = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        })
    };
    shutdown_signal().await;
    stop.cancel();
    server
}

/// Resolves when the process is asked to stop: SIGTERM, or Ctrl-C (SIGINT).
pub(crate) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
