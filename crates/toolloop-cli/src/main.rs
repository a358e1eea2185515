//! `toolloop`: a command-line agent on the toolloop engine.

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

mod chat;
mod durable;
mod mcp;
mod progress;
mod run;
mod sessions;
mod spec;
mod terminal;
#[cfg(feature = "test-hooks")]
mod testtool;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// mimalloc: many concurrent loops allocate from many threads, where it beats the system
/// allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code for bad usage or configuration.
pub const EXIT_USAGE: u8 = 2;

#[derive(Parser)]
#[command(
    name = "toolloop",
    version,
    about = "Run LLM tool-calling loops from the command line"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent on a prompt and print the answer.
    Run(run::RunArgs),
    /// Chat in a session: each line is a run; the history is kept in the store.
    Chat(chat::ChatArgs),
    /// List, show or remove sessions (named conversations kept in the store).
    #[command(subcommand)]
    Sessions(sessions::SessionsCommand),
    /// List logged runs and where they stand (finished, running, interrupted).
    Runs(sessions::RunsArgs),
    /// Continue a run that stopped before its end (a crash, a kill), from its last durable step.
    Resume(sessions::ResumeArgs),
    /// Serve the mock LLM provider (OpenAI, Anthropic and Gemini APIs) on 127.0.0.1.
    Mock(MockArgs),
    /// MCP servers: `toolloop mcp list` shows each configured server, its state and its tools.
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("toolloop: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let code = match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Chat(args) => chat::chat(args).await,
            Command::Sessions(command) => sessions::sessions(command).await,
            Command::Runs(args) => sessions::runs(args).await,
            Command::Resume(args) => sessions::resume(args).await,
            Command::Mcp(command) => mcp::mcp(command).await,
            Command::Mock(args) => {
                let options = toolloop_mock::MockOptions {
                    port: args.port,
                    default_latency: args.latency.map(std::time::Duration::from_millis),
                    ..Default::default()
                };
                match toolloop_mock::serve(options).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("toolloop mock: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
        };
        // The MCP servers the command started stop with it.
        mcp::shutdown().await;
        code
    })
}
