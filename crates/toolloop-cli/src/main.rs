//! `toolloop`: a command-line agent on the toolloop engine.

// `unsafe` here is limited to `secrets` (the environment changed while the process has one
// thread, a descriptor taken over) and `eval` (a run killed when the eval dies, set between
// fork and exec); each block says why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

/// `println!` for stdout that never panics: a reader that went away (`toolloop … | head`) is
/// not an error of ours, so a broken pipe is ignored; any other failure is said on stderr.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*)
            && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            eprintln!("toolloop: cannot write to stdout: {e}");
        }
    }};
}

mod approve;
mod args;
mod catalog_check;
mod chat;
mod config;
mod context;
mod cx;
mod durable;
mod error;
mod eval;
mod eval_report;
mod logging;
mod mcp;
mod progress;
mod record;
mod run;
mod sandbox;
mod secrets;
mod serve;
mod sessions;
mod setup;
mod spec;
mod terminal;
#[cfg(feature = "test-hooks")]
mod testtool;
mod workflow;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

/// mimalloc: many concurrent loops allocate from many threads, where it beats the system
/// allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub(crate) use error::CliError;

/// The largest `toolloop mock --script` or `--answers` file.
const MOCK_FILE_MAX_BYTES: u64 = toolloop::providers::scripted::SCRIPT_MAX_BYTES;

#[derive(Parser)]
#[command(
    name = "toolloop",
    version,
    about = "Run LLM tool-calling loops from the command line"
)]
struct Cli {
    /// Log what happens on stderr: -v for steps and retries, -vv for details, -vvv for
    /// everything (`RUST_LOG` sets the filter exactly, e.g. `RUST_LOG=toolloop=debug`).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(flatten)]
    traces: logging::TraceArgs,
    /// Log every model request and response (bodies, status, headers, timings, each retry) as
    /// JSON lines, keys redacted: to FILE, or to stderr with no FILE or `-`. `DEBUG_LLM=1` does
    /// the same on stderr.
    #[arg(long, global = true, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    debug_requests: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent on a prompt and print the answer.
    Run(args::RunArgs),
    /// Chat in a session: each line is a run; the history is kept in the store.
    Chat(chat::ChatArgs),
    /// List, show or remove sessions (named conversations kept in the store).
    #[command(subcommand)]
    Sessions(sessions::SessionsCommand),
    /// List logged runs and where they stand (finished, running, interrupted).
    Runs(sessions::RunsArgs),
    /// Continue a run that stopped before its end (a crash, a kill), from its last durable step;
    /// or one that failed on a model error, in a new run from its conversation.
    Resume(sessions::ResumeArgs),
    /// Approve calls of a run that stopped awaiting approval (lists them with no call id).
    Approve(approve::DecideArgs),
    /// Deny calls of a run that stopped awaiting approval (the model reads `denied: …`).
    Deny(approve::DenyArgs),
    /// Serve the agent to other programs: an OpenAI-compatible API (`--openai ADDR`: agents as
    /// models, and native tool calls for any model through the gateway), an MCP server
    /// (`--mcp`, stdio, or `--mcp ADDR`, streamable HTTP), or a durable service on Restate
    /// (`--restate ADDR`).
    Serve(serve::ServeArgs),
    /// Serve the mock LLM provider (OpenAI, Anthropic and Gemini APIs) on 127.0.0.1.
    Mock(MockArgs),
    /// Show where the configuration file is, or what it sets.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Print a shell completion script (`toolloop completions bash > …`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), or write one page per command into a directory.
    Man {
        /// Write `toolloop.1`, `toolloop-run.1`, … into this directory instead.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<std::path::PathBuf>,
    },
    /// MCP servers: `toolloop mcp list` shows each configured server, its state and its tools.
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// Step workflows: `run` a workflow file, `check` it, `resume` a stopped run, `list` runs.
    #[command(subcommand)]
    Workflow(workflow::WorkflowCommand),
    /// Run a suite of cases (TOML: prompts, conversations, workflows) against models and system
    /// prompts, check each run's trajectory, answer, files and budget (and an LLM judge's
    /// verdict), and print the pass rates; exit 1 if a case failed. `eval compare A.json B.json`
    /// shows what got better or worse.
    Eval(eval::EvalArgs),
}

#[derive(clap::Args)]
struct MockArgs {
    /// The port (0 picks a free one).
    #[arg(long, default_value_t = 8089)]
    port: u16,
    /// Latency added to every response, in milliseconds (at most 600000, ten minutes), unless
    /// the scenario sets its own.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=600_000))]
    latency: Option<u64>,
    /// Exact calls to make, round by round, from a JSON file: `[[{"name": …, "arguments":
    /// {…}}, …], …]` (one array of calls per round); the answer follows the last round.
    #[arg(long, value_name = "FILE")]
    script: Option<std::path::PathBuf>,
    /// Canned final answers, from a JSON file: `[{"when": "text of the prompt", "text":
    /// "the answer"}, …]`: a task whose first user message contains `when` is answered `text`
    /// (OpenAI API).
    #[arg(long, value_name = "FILE")]
    answers: Option<std::path::PathBuf>,
}

/// Parses the command line over the configuration file's defaults. Also returns the variables
/// that hold keys by choice (`--api-key-env`, and the `api_key_env` of the configuration file's
/// models), and the configuration the command runs with.
fn parse() -> Result<(Cli, Vec<String>, config::Loaded), CliError> {
    // `toolloop config …` works with a broken file, to find and show it.
    let configuring = std::env::args_os().nth(1).is_some_and(|a| a == "config");
    let file = match config::load() {
        Ok(f) => f,
        Err(e) if configuring => {
            error::warn(error::chain(&e));
            config::ConfigFile::default()
        }
        Err(e) => return Err(e),
    };
    let command = config::apply(Cli::command(), &file)?;
    let matches = command.get_matches();
    let loaded = config::Loaded {
        file,
        explicit: config::explicit_flags(&matches),
    };
    // The matches are the command's own: this does not fail (clap said any error and exited).
    let cli = Cli::from_arg_matches(&matches).map_err(|e| CliError::usage(e.to_string()))?;
    let mut key_vars: Vec<String> = loaded
        .file
        .models
        .values()
        .filter_map(|m| m.api_key_env.clone())
        .collect();
    let mut m = Some(&matches);
    while let Some(current) = m {
        if let Ok(Some(name)) = current.try_get_one::<String>("api_key_env") {
            key_vars.push(name.clone());
        }
        m = current.subcommand().map(|(_, sub)| sub);
    }
    Ok((cli, key_vars, loaded))
}

fn main() -> ExitCode {
    // Keys are taken out of the environment before any thread exists (see `secrets`); a
    // process that started itself again without them gets them back here first.
    let inherited = secrets::inherit();
    let (cli, key_vars, config) = match parse() {
        Ok(c) => c,
        Err(e) => return error::report(&e),
    };
    secrets::seal(&key_vars, inherited);
    // Every model call in flight holds a connection and so a file descriptor: many loops at
    // once (`toolloop serve`, `toolloop mock`) need more than the 1,024 that many systems give a
    // program to start with. The soft limit goes up to the hard one, which the administrator
    // sets (README: "Many loops in one process"); a failure leaves the limit as it was.
    #[cfg(unix)]
    let _ = toolloop::transport::raise_open_files_limit();
    // One TLS crypto provider for every HTTP client of the process (MCP servers, the trace
    // exporter): ring, chosen here once.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let log_secrets = logging::LogSecrets::default();
    let _traces = logging::init(cli.verbose, &cli.traces, &log_secrets);
    let debug_requests = cli.debug_requests.clone().or_else(|| {
        std::env::var("DEBUG_LLM")
            .is_ok_and(|v| matches!(v.trim(), "1" | "true"))
            .then(|| "-".to_string())
    });
    let debug_log = match debug_requests.map(|target| spec::debug_log(&target)) {
        None => None,
        Some(Ok(log)) => Some(log),
        Some(Err(e)) => return error::report(&e),
    };
    let cx = std::sync::Arc::new(cx::Cx {
        config,
        debug_log,
        log_secrets,
        ..cx::Cx::default()
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return error::report(&CliError::io("cannot start the async runtime", e)),
    };
    runtime.block_on(async {
        let code = command(&cx, cli.command)
            .await
            .unwrap_or_else(|e| error::report(&e));
        // The MCP servers the command started stop with it, and its stores close.
        mcp::shutdown(&cx).await;
        durable::close_stores(&cx).await;
        code
    })
}

/// Runs the subcommand: the exit code of its outcome, or why it failed (said by `main`).
async fn command(cx: &std::sync::Arc<cx::Cx>, command: Command) -> Result<ExitCode, CliError> {
    match command {
        Command::Run(args) => run::run(cx, args).await,
        Command::Chat(args) => chat::chat(cx, args).await,
        Command::Sessions(command) => sessions::sessions(cx, command).await,
        Command::Runs(args) => sessions::runs(cx, args).await,
        Command::Resume(args) => sessions::resume(cx, args).await,
        Command::Approve(args) => approve::decide(cx, args, true, None).await,
        Command::Deny(args) => approve::deny(cx, args).await,
        Command::Config(command) => config::config_command(cx, command),
        Command::Serve(args) => serve::serve(cx, args).await,
        Command::Completions { shell } => {
            let mut command = Cli::command();
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut command, "toolloop", &mut out);
            outln!("{}", String::from_utf8_lossy(&out).trim_end());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { out_dir } => man(out_dir.as_deref()),
        Command::Mcp(command) => mcp::mcp(cx, command).await,
        Command::Workflow(command) => workflow::workflow(cx, command).await,
        Command::Eval(args) => eval::eval(args).await,
        Command::Mock(args) => mock(args).await,
    }
}

/// A `toolloop mock --script` or `--answers` file: JSON of the shape `expected` says.
fn mock_file<T: serde::de::DeserializeOwned>(
    flag: &str,
    path: &std::path::Path,
    expected: &str,
) -> Result<T, CliError> {
    let what = || format!("{flag} {}", path.display());
    let text = toolloop::user_file::read_to_string(path, MOCK_FILE_MAX_BYTES)
        .map_err(|e| CliError::invalid(what(), format!("{e}; expected {expected}")))?;
    serde_json::from_str(&text)
        .map_err(|e| CliError::invalid(what(), format!("{e}; expected {expected}")))
}

/// `toolloop mock`: the mock provider until the command is stopped.
async fn mock(args: MockArgs) -> Result<ExitCode, CliError> {
    let script = match &args.script {
        None => Vec::new(),
        Some(path) => mock_file(
            "--script",
            path,
            "a JSON array of rounds, each an array of {\"name\": …, \"arguments\": {…}}",
        )?,
    };
    let answers = match &args.answers {
        None => Vec::new(),
        Some(path) => mock_file(
            "--answers",
            path,
            "a JSON array of {\"when\": …, \"text\": …}",
        )?,
    };
    let options = toolloop_mock::MockOptions {
        answers_by_prompt: answers,
        port: args.port,
        default_latency: args.latency.map(std::time::Duration::from_millis),
        script,
        ..Default::default()
    };
    toolloop_mock::serve(options)
        .await
        .map_err(|e| CliError::io("mock", e))?;
    Ok(ExitCode::SUCCESS)
}

/// `toolloop man`: the manual page on stdout, or every command's page in a directory.
fn man(out_dir: Option<&std::path::Path>) -> Result<ExitCode, CliError> {
    let command = Cli::command();
    let Some(dir) = out_dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(command)
            .render(&mut out)
            .map_err(|e| CliError::io("cannot render the manual page", e))?;
        outln!("{}", String::from_utf8_lossy(&out).trim_end());
        return Ok(ExitCode::SUCCESS);
    };
    clap_mangen::generate_to(command, dir).map_err(|e| {
        CliError::io(
            format!("cannot write the manual pages to {}", dir.display()),
            e,
        )
    })?;
    Ok(ExitCode::SUCCESS)
}
