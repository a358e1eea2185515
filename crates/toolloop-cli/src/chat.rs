//! `toolloop chat`: an interactive session. Each line from stdin is one run in the session;
//! the history is kept in the store.
//!
//! Ctrl-C during a run cancels it cleanly: calls in flight get a "cancelled" result, the
//! transcript stays valid and is saved to the session, and the prompt comes back. A second
//! Ctrl-C within two seconds, or Ctrl-C at the prompt, quits. End of input (Ctrl-D) quits too.
//!
//! On a terminal, lines are edited with history (kept in the data directory); a few commands
//! start with `/`: `/model`, `/tools`, `/context`, `/compact`, `/clear`, `/exit`, `/help`.

use crate::CliError;
use crate::args::{AgentArgs, DurableArgs, RunArgs, StoreArgs};
use crate::cx::Cx;
use crate::durable::format_ms;
use clap::Args;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How soon a second Ctrl-C must follow the first to quit.
const QUIT_WINDOW: Duration = Duration::from_secs(2);

#[derive(Args, Debug)]
pub(crate) struct ChatArgs {
    /// The session to continue (created on first use). Default: a new one, named by the time.
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    agent: AgentArgs,
    /// Attach an image to the first message (a PNG, JPEG, GIF or WebP file, or an http(s) URL);
    /// `/attach FILE|URL` attaches one to the next message. Repeatable.
    #[arg(short = 'a', long = "attach", value_name = "FILE|URL")]
    attach: Vec<String>,
}

pub(crate) async fn chat(cx: &Cx, mut args: ChatArgs) -> Result<ExitCode, CliError> {
    args.agent.prepare(cx)?;
    let session = args.session.clone().unwrap_or_else(new_session_name);
    crate::sandbox::protect_store(cx, args.store.store.as_deref());
    // Fail early on a bad store or model, before the first line.
    crate::durable::open_store(cx, &args.store).await?;
    crate::spec::model_from_args(cx, &args.agent.provider)?;
    // The root's .mcp.json is asked about now, before the prompt reads the terminal (the runs
    // do not ask); an error in the configuration is reported by the first run.
    let _ = crate::mcp::server_configs(cx, &args.agent.mcp, &args.agent.root, true).await;
    let interactive = std::io::stdin().is_terminal();
    eprintln!(
        "toolloop chat · session {session} · /help for commands · Ctrl-C cancels a reply, twice (or at the prompt) quits"
    );

    // Listening starts here, before the line editor exists (which handles only window resizes
    // itself): no Ctrl-C is missed, whenever it comes.
    let (tx, mut interrupts) = tokio::sync::mpsc::unbounded_channel::<()>();
    #[cfg(unix)]
    let mut sigint = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
    {
        Ok(s) => s,
        Err(e) => return Err(CliError::io("chat: cannot listen for Ctrl-C", e)),
    };
    tokio::spawn(async move {
        loop {
            #[cfg(unix)]
            let heard = sigint.recv().await.is_some();
            #[cfg(not(unix))]
            let heard = tokio::signal::ctrl_c().await.is_ok();
            if !heard || tx.send(()).is_err() {
                break;
            }
        }
    });
    let mut lines = if interactive {
        LineSource::editor()
    } else {
        LineSource::stdin()
    };
    let mut session = session;
    let mut last_interrupt: Option<Instant> = None;
    loop {
        let line = tokio::select! {
            line = lines.next() => line,
            _ = interrupts.recv() => {
                eprintln!();
                // Right after a cancelling Ctrl-C, this is the second one: quit as interrupted.
                if last_interrupt.is_some_and(|t| t.elapsed() < QUIT_WINDOW) {
                    return Ok(ExitCode::from(130));
                }
                return Ok(ExitCode::SUCCESS);
            }
        };
        let line = match line {
            Input::Line(l) => l,
            Input::End => return Ok(ExitCode::SUCCESS),
            Input::Interrupted => {
                if last_interrupt.is_some_and(|t| t.elapsed() < QUIT_WINDOW) {
                    return Ok(ExitCode::from(130));
                }
                return Ok(ExitCode::SUCCESS);
            }
            Input::Failed(e) => return Err(CliError::failed(format!("cannot read stdin: {e}"))),
        };
        let prompt = line.trim();
        if prompt.is_empty() {
            continue;
        }
        let prompt = if let Some(text) = prompt.strip_prefix("//") {
            format!("/{text}")
        } else if let Some(command) = prompt.strip_prefix('/') {
            match slash(cx, command, &mut args, &mut session).await {
                Slash::Continue => continue,
                Slash::Quit => return Ok(ExitCode::SUCCESS),
            }
        } else {
            prompt.to_string()
        };
        let run_args = RunArgs {
            prompt,
            attach: std::mem::take(&mut args.attach),
            agent: {
                // The chat's own prompt reads the terminal: calls are not asked about there.
                let mut agent = args.agent.clone();
                agent.approval.no_prompt = true;
                agent.stream_on_terminal(false);
                agent
            },
            json: false,
            jsonl: false,
            durable: DurableArgs {
                store: args.store.clone(),
                session: Some(session.clone()),
                ..DurableArgs::default()
            },
        };
        // The rules are checked against the tools offered once, at the first turn.
        args.agent.approval.rules_checked = true;
        let cancel = CancellationToken::new();
        let run = crate::run::run_with_note(
            cx,
            run_args,
            cancel.clone(),
            "toolloop chat: cancelling (Ctrl-C again to quit)",
        );
        tokio::pin!(run);
        let mut cancelled_at: Option<Instant> = None;
        last_interrupt = None;
        loop {
            tokio::select! {
                result = &mut run => {
                    // A turn that could not run is said; the chat goes on.
                    if let Err(e) = result {
                        crate::error::report(&e);
                    }
                    break;
                }
                Some(()) = interrupts.recv() => {
                    if cancelled_at.is_some_and(|t| t.elapsed() < QUIT_WINDOW) {
                        eprintln!("\ntoolloop chat: quit; `toolloop runs --session {session}` lists the unfinished run");
                        std::process::exit(130);
                    }
                    // The run takes its unfinished reply back from the terminal, then says it
                    // is cancelling.
                    cancel.cancel();
                    cancelled_at = Some(Instant::now());
                    last_interrupt = cancelled_at;
                }
            }
        }
    }
}

/// What a `/command` line asks for.
enum Slash {
    /// Done; read the next line.
    Continue,
    /// Leave the chat.
    Quit,
}

const HELP: &str = "/model [SPEC]  show or switch the model (provider:model or a configured name)
/tools [NAME]  list the tools the agent has, one line each; with a name, its whole description
/attach FILE   attach an image (a file or an http(s) URL) to the next message
/clear         start a new session (the old one stays in the store)
/context       show the session's token use by part (system, tools, history, results)
/compact [FOCUS]  summarise the session's conversation now (keeping FOCUS above all)
/exit, /quit   leave (so do Ctrl-D and Ctrl-C at the prompt)
/help          this list";

/// Runs a chat command. Unknown commands are said, not sent to the model; `//text` sends
/// `/text`.
async fn slash(cx: &Cx, command: &str, args: &mut ChatArgs, session: &mut String) -> Slash {
    let (name, rest) = command
        .split_once(char::is_whitespace)
        .map_or((command, ""), |(n, r)| (n, r.trim()));
    match name {
        "exit" | "quit" => Slash::Quit,
        "help" | "?" => {
            eprintln!("{HELP}");
            Slash::Continue
        }
        "context" => {
            crate::context::show(cx, &args.agent, &args.store, session).await;
            Slash::Continue
        }
        "compact" => {
            crate::context::compact(cx, &args.agent, &args.store, session, rest).await;
            Slash::Continue
        }
        "clear" => {
            *session = new_session_name();
            eprintln!("toolloop chat: new session {session}");
            Slash::Continue
        }
        "model" if rest.is_empty() => {
            eprintln!(
                "model: {}",
                crate::terminal::escape(&args.agent.provider.model, false)
            );
            Slash::Continue
        }
        "model" => {
            let mut agent = args.agent.clone();
            agent.provider.model = rest.to_string();
            let checked = cx
                .config
                .resolve_model(&mut agent.provider)
                .and_then(|()| crate::spec::model_from_args(cx, &agent.provider).map(|_| ()));
            match checked {
                Ok(()) => {
                    args.agent = agent;
                    eprintln!(
                        "model: {}",
                        crate::terminal::escape(&args.agent.provider.model, false)
                    );
                }
                Err(e) => crate::error::warn(crate::error::chain(&e)),
            }
            Slash::Continue
        }
        "attach" if rest.is_empty() => {
            for item in &args.attach {
                eprintln!("attached: {}", crate::terminal::escape(item, false));
            }
            if args.attach.is_empty() {
                eprintln!(
                    "nothing attached; /attach FILE|URL attaches an image to the next message"
                );
            }
            Slash::Continue
        }
        "attach" => {
            let item = rest.to_string();
            match crate::setup::attachments(std::slice::from_ref(&item)) {
                Ok(images) => {
                    for image in images {
                        eprintln!(
                            "attached {} to the next message",
                            crate::terminal::escape(&image.describe(), false)
                        );
                    }
                    args.attach.push(item);
                }
                Err(e) => crate::error::warn(crate::error::chain(&e)),
            }
            Slash::Continue
        }
        "tools" => {
            // The tools the next run offers: built-in, `run_command` when allowed, and the MCP
            // servers' as they list them now, as selected by --tools / --no-tools.
            match crate::setup::tools(cx, &args.agent).await {
                Ok(tools) => {
                    let all = tools.all().await;
                    if rest.is_empty() {
                        let width = all.iter().map(|t| t.name().chars().count()).max();
                        for t in &all {
                            eprintln!(
                                "{:<width$}  {}",
                                crate::terminal::escape(t.name(), false),
                                crate::terminal::escape(&first_sentence(t.description()), false),
                                width = width.unwrap_or(0).min(32)
                            );
                        }
                    } else {
                        match all.iter().find(|t| t.name() == rest) {
                            Some(t) => eprintln!(
                                "{}\n\n{}\n\nparameters: {}",
                                crate::terminal::escape(t.name(), false),
                                crate::terminal::escape(t.description().trim(), true),
                                crate::terminal::escape(&t.parameters().to_string(), false)
                            ),
                            None => eprintln!(
                                "toolloop chat: no tool named {}; /tools lists them",
                                crate::terminal::escape(rest, false)
                            ),
                        }
                    }
                }
                Err(e) => crate::error::warn(crate::error::chain(&e)),
            }
            Slash::Continue
        }
        _ => {
            eprintln!(
                "toolloop chat: unknown command /{}; /help lists them (start a line with // to send it as text)",
                crate::terminal::escape(name, false)
            );
            Slash::Continue
        }
    }
}

/// The first sentence of a description (up to the first `. ` or line break), at most 100
/// characters, for a one-line listing.
fn first_sentence(description: &str) -> String {
    let text = description.trim();
    let line = text.lines().next().unwrap_or_default();
    let sentence = match line.find(". ") {
        Some(at) => &line[..=at],
        None => line,
    };
    match sentence.char_indices().nth(100) {
        Some((at, _)) => format!("{}…", &sentence[..at]),
        None => sentence.to_string(),
    }
}

/// A new session's name, from the time.
fn new_session_name() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let stamp: String = format_ms(now)
        .chars()
        .filter(|c| c.is_ascii_digit())
        .collect();
    format!("chat-{stamp}")
}

/// One read from the user.
enum Input {
    Line(String),
    /// End of input (Ctrl-D).
    End,
    /// Ctrl-C at the prompt.
    Interrupted,
    Failed(String),
}

/// Where lines come from: a line editor with history on a terminal, plain lines otherwise.
/// Both read on a thread of their own: a blocking read on the runtime's blocking pool would
/// keep the runtime from shutting down when the chat quits at the prompt.
struct LineSource {
    lines: tokio::sync::mpsc::UnboundedReceiver<Input>,
    /// Asks the editor for the next line (it shows the prompt only when asked, so that the
    /// prompt never cuts into a reply).
    ready: Option<std::sync::mpsc::Sender<()>>,
}

impl LineSource {
    fn stdin() -> Self {
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::stdin().lock().lines() {
                let (input, stop) = match line {
                    Ok(l) => (Input::Line(l), false),
                    Err(e) => (Input::Failed(e.to_string()), true),
                };
                if tx.send(input).is_err() || stop {
                    return;
                }
            }
            let _ = tx.send(Input::End);
        });
        LineSource { lines, ready: None }
    }

    fn editor() -> Self {
        let mut editor = match rustyline::DefaultEditor::new() {
            Ok(e) => e,
            Err(e) => {
                eprintln!("toolloop chat: no line editing ({e})");
                return LineSource::stdin();
            }
        };
        let history = history_path();
        if let Some(path) = &history {
            let _ = editor.load_history(path);
        }
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        let (ready, asked) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            while asked.recv().is_ok() {
                let input = match editor.readline("> ") {
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            let _ = editor.add_history_entry(line.as_str());
                            if let Some(path) = &history {
                                save_history(&mut editor, path);
                            }
                        }
                        Input::Line(line)
                    }
                    Err(rustyline::error::ReadlineError::Eof) => Input::End,
                    Err(rustyline::error::ReadlineError::Interrupted) => Input::Interrupted,
                    Err(e) => Input::Failed(e.to_string()),
                };
                if tx.send(input).is_err() {
                    return;
                }
            }
        });
        LineSource {
            lines,
            ready: Some(ready),
        }
    }

    async fn next(&mut self) -> Input {
        if let Some(ready) = &self.ready {
            let _ = ready.send(());
        }
        self.lines.recv().await.unwrap_or(Input::End)
    }
}

/// Where the chat's line history is kept: beside the default store, in the data directory.
fn history_path() -> Option<std::path::PathBuf> {
    use etcetera::BaseStrategy;
    let dir = etcetera::choose_base_strategy()
        .ok()?
        .data_dir()
        .join("toolloop");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir.join("chat_history"))
}

/// Saves the history, readable by its owner only (prompts can hold private text).
fn save_history(editor: &mut rustyline::DefaultEditor, path: &std::path::Path) {
    if editor.save_history(path).is_ok() {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
    }
}
