//! `toolloop chat`: an interactive session. Each line from stdin is one run in the session;
//! the history is kept in the store.
//!
//! Ctrl-C during a run cancels it cleanly: calls in flight get a "cancelled" result, the
//! transcript stays valid and is saved to the session, and the prompt comes back. A second
//! Ctrl-C within two seconds, or Ctrl-C at the prompt, quits. End of input (Ctrl-D) quits too.

use crate::durable::{DurableArgs, StoreArgs, format_ms};
use crate::run::{AgentArgs, RunArgs};
use clap::Args;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How soon a second Ctrl-C must follow the first to quit.
const QUIT_WINDOW: Duration = Duration::from_secs(2);

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// The session to continue (created on first use). Default: a new one, named by the time.
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    agent: AgentArgs,
}

pub async fn chat(args: ChatArgs) -> ExitCode {
    let session = args.session.clone().unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let stamp: String = format_ms(now)
            .chars()
            .filter(|c| c.is_ascii_digit())
            .collect();
        format!("chat-{stamp}")
    });
    // Fail early on a bad store or model, before the first line.
    if let Err(code) = crate::durable::open_store(&args.store).await {
        return code;
    }
    if let Err(e) = crate::spec::model_from_args(&args.agent.provider) {
        eprintln!("toolloop: {e}");
        return ExitCode::from(crate::EXIT_USAGE);
    }
    let interactive = std::io::stdin().is_terminal();
    eprintln!(
        "toolloop chat · session {session} · Ctrl-C cancels a reply, twice (or at the prompt) quits"
    );

    let (tx, mut interrupts) = tokio::sync::mpsc::unbounded_channel::<()>();
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            if tx.send(()).is_err() {
                break;
            }
        }
    });
    let mut lines = stdin_lines();
    let mut last_interrupt: Option<Instant> = None;
    loop {
        if interactive {
            eprint!("> ");
        }
        let line = tokio::select! {
            line = lines.recv() => line.transpose(),
            _ = interrupts.recv() => {
                eprintln!();
                // Right after a cancelling Ctrl-C, this is the second one: quit as interrupted.
                if last_interrupt.is_some_and(|t| t.elapsed() < QUIT_WINDOW) {
                    return ExitCode::from(130);
                }
                return ExitCode::SUCCESS;
            }
        };
        let line = match line {
            Ok(Some(l)) => l,
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("toolloop: cannot read stdin: {e}");
                return ExitCode::FAILURE;
            }
        };
        let prompt = line.trim();
        if prompt.is_empty() {
            continue;
        }
        if prompt == "/exit" || prompt == "/quit" {
            return ExitCode::SUCCESS;
        }
        let run_args = RunArgs {
            prompt: prompt.to_string(),
            agent: {
                // The chat's own prompt reads the terminal: calls are not asked about there.
                let mut agent = args.agent.clone();
                agent.approval.no_prompt = true;
                agent
            },
            json: false,
            durable: DurableArgs {
                store: args.store.clone(),
                session: Some(session.clone()),
                ..DurableArgs::default()
            },
        };
        let cancel = CancellationToken::new();
        let run = crate::run::run_with(run_args, cancel.clone());
        tokio::pin!(run);
        let mut cancelled_at: Option<Instant> = None;
        last_interrupt = None;
        loop {
            tokio::select! {
                _ = &mut run => break,
                Some(()) = interrupts.recv() => {
                    if cancelled_at.is_some_and(|t| t.elapsed() < QUIT_WINDOW) {
                        eprintln!("\ntoolloop chat: quit; `toolloop runs --session {session}` lists the unfinished run");
                        std::process::exit(130);
                    }
                    eprintln!("\ntoolloop chat: cancelling (Ctrl-C again to quit)");
                    cancel.cancel();
                    cancelled_at = Some(Instant::now());
                    last_interrupt = cancelled_at;
                }
            }
        }
    }
}

/// Lines of stdin, read on a thread of their own: a blocking read on the runtime's blocking
/// pool would keep the runtime from shutting down when the chat quits at the prompt.
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<std::io::Result<String>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines() {
            let stop = line.is_err();
            if tx.send(line).is_err() || stop {
                break;
            }
        }
    });
    rx
}
