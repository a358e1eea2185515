//! `toolloop workflow`: run, check, resume and list step workflows (see the
//! `toolloop-workflow` crate for the format).

use crate::CliError;
use crate::args::{AgentArgs, DurabilityFlag, StoreArgs};
use crate::cx::Cx;
use crate::durable::open_store_with;
use crate::progress::Progress;
use crate::run::exit_code;
use crate::setup::tools;
use crate::spec::model_from_args_named;
use clap::{Args, Subcommand};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use toolloop_workflow::{
    Runner, StepStatus, StoreLog, Workflow, WorkflowError, WorkflowEvent, WorkflowOutcome,
    WorkflowStatus,
};

/// `toolloop workflow …`.
#[derive(Subcommand, Debug)]
pub(crate) enum WorkflowCommand {
    /// Run a workflow file: its steps in order (or as a graph with depends_on), each a run.
    Run(WorkflowRunArgs),
    /// Check a workflow file without running it: templates, step order (unknown steps,
    /// cycles), tools and models.
    Check(WorkflowCheckArgs),
    /// Continue a workflow run that stopped before its end (a crash, a kill): finished steps
    /// are not run again, the step that was running continues from its log.
    Resume(WorkflowResumeArgs),
    /// List the workflow runs in the store.
    List(WorkflowListArgs),
}

/// Where the files a workflow names may be.
#[derive(Args, Debug, Clone, Copy, Default)]
pub(crate) struct FilesArgs {
    /// Let the workflow name files (`output_schema_file`) anywhere: by default they must be in
    /// the workflow file's directory or below it, symbolic links resolved (what a workflow
    /// names is read and sent to the model, and a workflow may come with a project).
    #[arg(long)]
    pub workflow_files_anywhere: bool,
}

impl FilesArgs {
    fn access(self) -> toolloop_workflow::FileAccess {
        if self.workflow_files_anywhere {
            toolloop_workflow::FileAccess::Anywhere
        } else {
            toolloop_workflow::FileAccess::Confined
        }
    }
}

/// `toolloop workflow run`.
#[derive(Args, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct WorkflowRunArgs {
    /// The workflow file (TOML).
    #[serde(skip)]
    #[arg(required_unless_present = "resume")]
    pub file: Option<PathBuf>,
    /// An input: NAME=VALUE (repeatable).
    #[arg(short = 'i', long = "input", value_name = "NAME=VALUE", value_parser = parse_input)]
    #[serde(skip)]
    pub inputs: Vec<(String, String)>,
    /// Continue this workflow run instead of starting one (the same as `toolloop workflow
    /// resume ID`).
    #[arg(long, value_name = "ID", conflicts_with_all = ["file", "inputs"])]
    #[serde(skip)]
    pub resume: Option<String>,
    #[command(flatten)]
    #[serde(skip)]
    pub files: FilesArgs,
    /// The settings every step starts from: the default model, approvals, the file tools'
    /// root, MCP servers. --max-rounds, --max-tool-calls and --timeout, when given, are the
    /// limits of the steps that the workflow leaves unset (otherwise 5 rounds, 20 tool calls).
    #[command(flatten)]
    #[serde(flatten)]
    pub agent: AgentArgs,
    /// Print the outcome as one JSON object.
    #[arg(long, conflicts_with = "jsonl")]
    #[serde(skip)]
    pub json: bool,
    /// Print every event as a JSON line as it happens (`step_started`, `step_event`,
    /// `step_finished`), ending with a `workflow_finished` line holding the outcome.
    #[arg(long)]
    #[serde(skip)]
    pub jsonl: bool,
    #[command(flatten)]
    #[serde(skip)]
    pub store: StoreArgs,
    #[command(flatten)]
    #[serde(skip)]
    pub durability: DurabilityFlag,
    /// Write nothing to the store (the workflow cannot be resumed).
    #[arg(long)]
    #[serde(skip)]
    pub no_store: bool,
}

/// `toolloop workflow check`.
#[derive(Args, Debug)]
pub(crate) struct WorkflowCheckArgs {
    /// The workflow file (TOML).
    pub file: PathBuf,
    #[command(flatten)]
    pub files: FilesArgs,
    /// Inputs to check as given: NAME=VALUE (repeatable); without any, only the definition
    /// is checked.
    #[arg(short = 'i', long = "input", value_name = "NAME=VALUE", value_parser = parse_input)]
    pub inputs: Vec<(String, String)>,
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// `toolloop workflow resume`.
#[derive(Args, Debug)]
pub(crate) struct WorkflowResumeArgs {
    /// The workflow run to continue (`toolloop workflow list` shows them).
    pub id: String,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Print the outcome as one JSON object.
    #[arg(long, conflicts_with = "jsonl")]
    pub json: bool,
    /// Print every event as a JSON line.
    #[arg(long)]
    pub jsonl: bool,
    /// The provider's base URL, in place of the one the run started with (needed when that one
    /// held credentials, which are never stored).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
}

/// `toolloop workflow list`.
#[derive(Args, Debug)]
pub(crate) struct WorkflowListArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_input(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("`{s}`: expected NAME=VALUE")),
    }
}

/// `toolloop workflow …`.
pub(crate) async fn workflow(cx: &Arc<Cx>, command: WorkflowCommand) -> Result<ExitCode, CliError> {
    match command {
        WorkflowCommand::Run(args) => run(cx, args).await,
        WorkflowCommand::Check(args) => check(cx, args).await,
        WorkflowCommand::Resume(args) => resume(cx, args).await,
        WorkflowCommand::List(args) => list(cx, args).await,
    }
}

/// Reads the file, with the command's explicit limits as the defaults of the steps.
pub(crate) fn load(
    cx: &Cx,
    file: &std::path::Path,
    files: FilesArgs,
    agent: &AgentArgs,
) -> Result<Workflow, CliError> {
    let mut workflow = Workflow::from_file_with(file, files.access())?;
    let d = &mut workflow.defaults;
    if d.max_rounds.is_none() && cx.config.is_set("max_rounds") {
        d.max_rounds = Some(agent.max_rounds);
    }
    if d.max_tool_calls.is_none() && cx.config.is_set("max_tool_calls") {
        d.max_tool_calls = Some(agent.max_tool_calls);
    }
    if d.timeout.is_none()
        && let Some(t) = agent.timeout
    {
        d.timeout = Some(format!("{}ms", t.as_millis()));
    }
    Ok(workflow)
}

/// The runner for `agent`'s settings: its model as the default, steps' models built like
/// `--model`, its tools, its approval rules.
pub(crate) async fn runner(cx: &Arc<Cx>, agent: &mut AgentArgs) -> Result<Runner, CliError> {
    agent.check()?;
    agent.mcp.absolutize()?;
    // A workflow's steps take the MCP servers' tools as listed when it starts.
    let mut tools = tools(cx, agent).await?.all().await;
    // The declared agents, as tools steps may name.
    let agents = crate::setup::agent_tools(cx, agent, &tools)?;
    tools.extend(agents);
    let model = model_from_args_named(cx, &agent.provider, None)?;
    let provider = agent.provider.clone();
    let settings = agent.clone();
    // Check the approval rules once; each step's agent gets them.
    crate::setup::agent_builder_base(cx, agent, model.clone())?;
    Ok(Runner::new(model)
        .tools(tools)
        .models({
            let cx = cx.clone();
            move |name| {
                model_from_args_named(&cx, &provider, Some(name))
                    .map_err(|e| crate::error::chain(&e))
            }
        })
        .configure({
            let cx = cx.clone();
            move |b| {
                let mut b = b
                    .stream(settings.stream)
                    .redact(crate::secrets::redactor(&cx));
                if let Ok(approvals) = crate::setup::approvals(&settings.approval) {
                    b = b.approvals(approvals);
                }
                crate::setup::model_settings(&settings, b)
            }
        }))
}

/// Where events go: JSON lines, or the progress display on a terminal.
fn events(runner: Runner, jsonl: bool, progress: Arc<Progress>) -> Runner {
    runner.on_event(move |e| {
        if jsonl {
            if matches!(e, WorkflowEvent::WorkflowFinished { .. }) {
                return;
            }
            match serde_json::to_string(e) {
                Ok(line) => outln!("{line}"),
                Err(e) => crate::error::warn(format!("cannot write an event as JSON: {e}")),
            }
            return;
        }
        match e {
            WorkflowEvent::WorkflowStarted {
                workflow_id,
                name,
                resumed,
            } => eprintln!(
                "toolloop: workflow {name}: {} {workflow_id} (toolloop workflow resume \
                 {workflow_id} continues it if it stops)",
                if *resumed { "resuming" } else { "run" }
            ),
            WorkflowEvent::StepStarted { step, resumed, .. } => {
                progress.finish();
                eprintln!(
                    "toolloop: step {step}{}",
                    if *resumed { " (resumed)" } else { "" }
                );
            }
            WorkflowEvent::StepEvent { event, .. } => progress.event(event),
            WorkflowEvent::StepFinished { result } => {
                progress.finish();
                let what = match result.status {
                    StepStatus::Succeeded => "done".to_string(),
                    StepStatus::Skipped => "skipped".to_string(),
                    StepStatus::NotRun => "not run".to_string(),
                    StepStatus::Failed => format!(
                        "failed: {}",
                        crate::terminal::escape(result.error.as_deref().unwrap_or(""), false)
                    ),
                };
                eprintln!("toolloop: step {} {what}", result.step_id);
            }
            WorkflowEvent::WorkflowFinished { .. } => {}
        }
    })
}

async fn run(cx: &Arc<Cx>, mut args: WorkflowRunArgs) -> Result<ExitCode, CliError> {
    if let Some(id) = args.resume.take() {
        return resume(
            cx,
            WorkflowResumeArgs {
                id,
                store: args.store,
                json: args.json,
                jsonl: args.jsonl,
                base_url: None,
            },
        )
        .await;
    }
    let Some(file) = args.file.clone() else {
        return Err(CliError::usage(
            "workflow run: give the workflow file (or --resume ID)",
        ));
    };
    args.agent.prepare(cx)?;
    let workflow = load(cx, &file, args.files, &args.agent)?;
    let inputs: BTreeMap<String, String> = args.inputs.iter().cloned().collect();
    let mut runner = runner(cx, &mut args.agent).await?;
    let progress = Arc::new(Progress::new(
        std::io::stderr().is_terminal() && !args.json && !args.jsonl,
        false,
    ));
    runner = events(runner, args.jsonl, progress.clone());
    let durability = match args.durability.store() {
        Some(d) if !args.no_store => Some(d),
        _ => None,
    };
    if let Some(durability) = durability {
        let store = open_store_with(cx, &args.store, durability).await?;
        runner = runner
            .journal(store.run_journal(toolloop_store::RunTags::default()))
            .log(Arc::new(StoreLog::new(store)));
    }
    let meta = crate::durable::run_meta(&args);
    let cancel = ctrl_c();
    let outcome = runner.run_tagged(&workflow, &inputs, meta, cancel).await;
    finish(outcome, args.json, args.jsonl, &progress)
}

async fn resume(cx: &Arc<Cx>, args: WorkflowResumeArgs) -> Result<ExitCode, CliError> {
    let store = open_store_with(cx, &args.store, toolloop_store::Durability::default()).await?;
    let log = Arc::new(StoreLog::new(store.clone()));
    let record = match toolloop_workflow::WorkflowLog::load(log.as_ref(), &args.id).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return Err(CliError::usage(format!(
                "no workflow run with id {} in {} (`toolloop workflow list` shows them)",
                args.id,
                store.location()
            )));
        }
        Err(e) => return Err(CliError::failure("", e)),
    };
    let Value::Object(mut config) = record.meta.clone() else {
        return Err(CliError::usage(format!(
            "workflow run {} was not started by the toolloop command (it has no saved \
             settings); resume it from the program that started it",
            args.id
        )));
    };
    let removed = crate::setup::restore_credentials(&mut config, args.base_url.as_deref());
    if !removed.is_empty() {
        return Err(CliError::usage(format!(
            "workflow run {} was started with credentials in --{}, which are never stored; give \
             the full value again with --base-url <URL>",
            args.id,
            removed.join(", --").replace('_', "-")
        )));
    }
    let mut agent: AgentArgs = serde_json::from_value(Value::Object(config)).map_err(|e| {
        CliError::failure(
            format!("the saved settings of workflow run {} do not load", args.id),
            e,
        )
    })?;
    let mut runner = runner(cx, &mut agent).await?;
    let progress = Arc::new(Progress::new(
        std::io::stderr().is_terminal() && !args.json && !args.jsonl,
        false,
    ));
    runner = events(runner, args.jsonl, progress.clone())
        .journal(store.run_journal(toolloop_store::RunTags::default()))
        .log(log);
    let outcome = runner.resume(&args.id, ctrl_c()).await;
    finish(outcome, args.json, args.jsonl, &progress)
}

/// How a workflow run ended, for messages: its id and status, and the step that failed.
pub(crate) fn how_it_ended(outcome: &WorkflowOutcome) -> String {
    format!(
        "{} {}{}",
        outcome.workflow_id,
        outcome.status.as_str(),
        outcome
            .failed_step
            .as_ref()
            .map(|s| format!(" at step {s}"))
            .unwrap_or_default()
    )
}

fn ctrl_c() -> CancellationToken {
    let cancel = CancellationToken::new();
    let on_ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    cancel
}

/// Prints the outcome; the exit code: 0 when the workflow succeeded, that of the step that
/// stopped it otherwise (as for `toolloop run`), 2 when it did not start.
fn finish(
    outcome: Result<WorkflowOutcome, WorkflowError>,
    json: bool,
    jsonl: bool,
    progress: &Progress,
) -> Result<ExitCode, CliError> {
    progress.finish();
    // Exit code 1 for a failed log or an unknown run, 2 for the rest (see `CliError`).
    let outcome = outcome?;
    let value = serde_json::to_value(&outcome).unwrap_or(Value::Null);
    if json {
        outln!("{value}");
    } else if jsonl {
        let mut line = value;
        if let Some(o) = line.as_object_mut() {
            o.insert("type".into(), Value::from("workflow_finished"));
        }
        outln!("{line}");
    } else {
        // The last step's output on stdout, as `toolloop run` prints its answer.
        if let Some(last) = outcome
            .steps
            .iter()
            .rev()
            .find(|s| s.status == StepStatus::Succeeded)
            && outcome.success
        {
            let text = match &last.output {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let stdout = std::io::stdout();
            let text = crate::terminal::for_stdout(&text, stdout.is_terminal());
            outln!("{text}");
        }
        if !outcome.success {
            eprintln!("toolloop: workflow {}", how_it_ended(&outcome));
        }
    }
    Ok(match outcome.status {
        WorkflowStatus::Succeeded => ExitCode::SUCCESS,
        WorkflowStatus::Cancelled | WorkflowStatus::Running => ExitCode::FAILURE,
        WorkflowStatus::Failed => match outcome.stop_reason() {
            Some(reason) => exit_code(reason),
            None => ExitCode::FAILURE,
        },
    })
}

async fn check(cx: &Arc<Cx>, mut args: WorkflowCheckArgs) -> Result<ExitCode, CliError> {
    args.agent.prepare(cx)?;
    let workflow = load(cx, &args.file, args.files, &args.agent)?;
    let runner = runner(cx, &mut args.agent).await?;
    runner.check(&workflow)?;
    if !args.inputs.is_empty() {
        let inputs: BTreeMap<String, String> = args.inputs.iter().cloned().collect();
        workflow.resolve_inputs(&inputs)?;
    }
    outln!(
        "{}: workflow {} checks: {} steps, {} inputs",
        args.file.display(),
        workflow.name,
        workflow.steps.len(),
        workflow.inputs.len()
    );
    Ok(ExitCode::SUCCESS)
}

async fn list(cx: &Cx, args: WorkflowListArgs) -> Result<ExitCode, CliError> {
    let store = crate::durable::open_store(cx, &args.store).await?;
    let runs = store.workflows().await.map_err(CliError::store)?;
    if args.json {
        outln!("{}", serde_json::to_value(&runs).unwrap_or(Value::Null));
        return Ok(ExitCode::SUCCESS);
    }
    for r in runs {
        outln!(
            "{}  {}  {:<9}  {}",
            r.workflow_id,
            crate::durable::format_ms(r.created_ms),
            r.status,
            crate::terminal::escape(&r.name, false)
        );
    }
    Ok(ExitCode::SUCCESS)
}
