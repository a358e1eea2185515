//! `toolloop`: a command-line agent on the toolloop engine.

mod run;
mod spec;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

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
        match cli.command {
            Command::Run(args) => run::run(args).await,
        }
    })
}
