//! `toolloop sessions list|show|rm`, `toolloop runs` and `toolloop resume <run-id>`.

use crate::CliError;
use crate::args::{DurabilityFlag, StoreArgs};
use crate::cx::Cx;
use crate::durable::{format_ms, open_store};
use crate::setup::saved_run;
use clap::{Args, Subcommand};
use serde_json::json;
use std::process::ExitCode;
use toolloop::message::Message;
use toolloop::outcome::StopReason;

#[derive(Subcommand, Debug)]
pub(crate) enum SessionsCommand {
    /// List sessions: name, messages, runs, last update.
    List {
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a session's transcript (repaired if the stored one was not valid) and its runs.
    Show {
        /// The session.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON: the summary, the messages, the repairs and the runs.
        #[arg(long)]
        json: bool,
    },
    /// Remove a session with its runs and their logs.
    Rm {
        /// The session.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Args, Debug)]
pub(crate) struct RunsArgs {
    /// Only the runs of this session.
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ResumeArgs {
    /// The run to continue (`toolloop runs` lists them).
    run_id: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Print the outcome as one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    durability: DurabilityFlag,
    /// The provider's base URL, in place of the one the run started with. Needed when that
    /// one held credentials (user:password@, or a query such as ?key=), which are never stored.
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
}

pub(crate) async fn sessions(cx: &Cx, command: SessionsCommand) -> Result<ExitCode, CliError> {
    match command {
        SessionsCommand::List { store, json } => {
            let store = open_store(cx, &store).await?;
            let list = match store.sessions().await {
                Ok(l) => l,
                Err(e) => return Err(CliError::store(e)),
            };
            if json {
                outln!("{}", json!(list));
            } else if list.is_empty() {
                eprintln!("no sessions in {}", store.location());
            } else {
                outln!(
                    "{:<28} {:>8} {:>5}  {:<19}",
                    "SESSION",
                    "MESSAGES",
                    "RUNS",
                    "UPDATED (UTC)"
                );
                for s in list {
                    outln!(
                        "{:<28} {:>8} {:>5}  {}",
                        s.name,
                        s.message_count,
                        s.runs,
                        format_ms(s.updated_ms)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionsCommand::Show { name, store, json } => {
            let store = open_store(cx, &store).await?;
            let session = match store.session(&name).await {
                Ok(Some(s)) => s,
                Ok(None) => return Err(CliError::usage(format!("no session named `{name}`"))),
                Err(e) => return Err(CliError::store(e)),
            };
            let runs = store.runs(Some(&name)).await.unwrap_or_default();
            let delegated = delegated(&store, &runs).await;
            if json {
                outln!(
                    "{}",
                    json!({
                        "name": session.summary.name,
                        "message_count": session.summary.message_count,
                        "created_ms": session.summary.created_ms,
                        "updated_ms": session.summary.updated_ms,
                        "messages": session.messages,
                        "repairs": session.repairs,
                        "runs": runs,
                        "delegated": delegated,
                    })
                );
                return Ok(ExitCode::SUCCESS);
            }
            outln!(
                "session {} · {} messages · {} runs · updated {} UTC",
                session.summary.name,
                session.summary.message_count,
                session.summary.runs,
                format_ms(session.summary.updated_ms)
            );
            for r in &session.repairs {
                outln!("  (repaired: {r})");
            }
            for m in &session.messages {
                print_message(m);
                // A sub-agent's work, folded under the result it gave.
                if let Message::Tool(r) = m
                    && let Some(d) = delegated.iter().find(|d| d.call_id == r.call_id)
                {
                    out(d.folded());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionsCommand::Rm { name, store } => {
            let store = open_store(cx, &store).await?;
            if !store.remove_session(&name).await.map_err(CliError::store)? {
                return Err(CliError::usage(format!("no session named `{name}`")));
            }
            eprintln!("removed session {name}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Prints a line, ignoring a closed stdout (`| head`); the model's text in it is escaped on a
/// terminal.
fn out(line: String) {
    use std::io::{IsTerminal, Write};
    let stdout = std::io::stdout();
    let line = crate::terminal::for_stdout(&line, stdout.is_terminal());
    let _ = writeln!(stdout.lock(), "{line}");
}

/// A sub-agent's run under a call of a session's run, as `sessions show` folds it.
#[derive(Debug, serde::Serialize)]
struct Delegated {
    /// The parent's call that ran it.
    call_id: String,
    /// Its run (`{parent run id}/{call id}`).
    run_id: String,
    /// Its model calls.
    rounds: usize,
    /// Its tool calls' names, in order (its own sub-agents' among them).
    tool_calls: Vec<String>,
    /// Where it stands (finished, interrupted, …).
    status: toolloop_store::RunStatus,
}

impl Delegated {
    /// One line: what the child did, and where its run is.
    fn folded(&self) -> String {
        let mut names: Vec<(String, usize)> = Vec::new();
        for n in &self.tool_calls {
            match names.iter_mut().find(|(m, _)| m == n) {
                Some((_, k)) => *k += 1,
                None => names.push((n.clone(), 1)),
            }
        }
        let calls = names
            .iter()
            .map(|(n, k)| {
                if *k > 1 {
                    format!("{n} ×{k}")
                } else {
                    n.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        format!(
            "  ▸ delegated: {}, {}{} · run {}",
            plural(self.rounds, "model call", "model calls"),
            plural(self.tool_calls.len(), "tool call", "tool calls"),
            if calls.is_empty() {
                String::new()
            } else {
                format!(" ({calls})")
            },
            self.run_id
        )
    }
}

/// The sub-agents' runs directly under the calls of `runs` (`{run id}/{call id}`), each
/// summed up from its log.
async fn delegated(
    store: &toolloop_store::Store,
    runs: &[toolloop_store::RunSummary],
) -> Vec<Delegated> {
    use toolloop::journal::{Journal, Record};
    if runs.is_empty() {
        return Vec::new();
    }
    let all = store.runs(None).await.unwrap_or_default();
    let mut found = Vec::new();
    for child in all {
        let Some((parent, call_id)) = child.run_id.rsplit_once('/') else {
            continue;
        };
        if !runs.iter().any(|r| r.run_id == parent) {
            continue;
        }
        let records = store.load(&child.run_id).await.unwrap_or_default();
        let mut rounds = 0;
        let mut tool_calls = Vec::new();
        for r in &records {
            if let Record::ModelResponded { response, .. } = r {
                rounds += 1;
                tool_calls.extend(response.tool_calls.iter().map(|c| c.name.clone()));
            }
        }
        found.push(Delegated {
            call_id: call_id.to_string(),
            run_id: child.run_id.clone(),
            rounds,
            tool_calls,
            status: child.status,
        });
    }
    found
}

fn print_message(m: &Message) {
    let one_line = |s: &str| -> String {
        let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
        if flat.chars().count() > 160 {
            format!("{}…", flat.chars().take(160).collect::<String>())
        } else {
            flat
        }
    };
    match m {
        Message::System { content } => out(format!("system: {}", one_line(content))),
        Message::User { content, images } => {
            out(format!("user: {}", one_line(content)));
            for image in images {
                out(format!("user: [image: {}]", one_line(&image.describe())));
            }
        }
        Message::Assistant(a) => {
            if let Some(t) = &a.text
                && !t.is_empty()
            {
                out(format!("assistant: {}", one_line(t)));
            }
            for c in &a.tool_calls {
                out(format!(
                    "assistant → {}({}) [{}]",
                    c.name,
                    one_line(&c.arguments.to_string()),
                    c.id
                ));
            }
        }
        Message::Tool(r) => {
            let mark = if r.is_error { "✗" } else { "✓" };
            out(format!(
                "tool {mark} {} [{}]: {}",
                r.name,
                r.call_id,
                one_line(&r.content)
            ));
            for image in &r.images {
                out(format!(
                    "tool {mark} [image: {}]",
                    one_line(&image.describe())
                ));
            }
        }
    }
}

pub(crate) async fn runs(cx: &Cx, args: RunsArgs) -> Result<ExitCode, CliError> {
    let store = open_store(cx, &args.store).await?;
    let runs = match store.runs(args.session.as_deref()).await {
        Ok(r) => r,
        Err(e) => return Err(CliError::store(e)),
    };
    // Sub-agents' runs (`{parent}/{call id}`) carry no session: they come with their root's.
    let runs = if args.session.is_some() && !runs.is_empty() {
        match store.runs(None).await {
            Ok(all) => {
                let roots: Vec<String> = runs.iter().map(|r| format!("{}/", r.run_id)).collect();
                let mut with_children = runs;
                with_children.extend(
                    all.into_iter()
                        .filter(|r| roots.iter().any(|p| r.run_id.starts_with(p.as_str()))),
                );
                with_children
            }
            Err(e) => return Err(CliError::store(e)),
        }
    } else {
        runs
    };
    let runs = as_tree(runs);
    if args.json {
        outln!("{}", json!(runs));
        return Ok(ExitCode::SUCCESS);
    }
    if runs.is_empty() {
        eprintln!("no runs in {}", store.location());
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:<36} {:<17} {:<17} {:>7}  {:<19}  SESSION",
        "RUN",
        "STATUS",
        "STOP REASON",
        "RECORDS",
        "STARTED (UTC)"
    );
    for r in runs {
        let reason = r
            .stop_reason
            .and_then(|s| serde_json::to_value(s).ok())
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| "-".into());
        // A run that ended without its goal (an error, a limit) did not finish its work.
        let status = match (r.status, r.stop_reason) {
            (toolloop_store::RunStatus::Finished, Some(reason)) if !reason.is_success() => "failed",
            (status, _) => status.as_str(),
        };
        // A sub-agent's run shows under its parent's, by the call that ran it.
        let depth = r.run_id.matches('/').count();
        let shown = match r.run_id.rsplit_once('/') {
            Some((_, call)) => format!("{}└ {call}", "  ".repeat(depth - 1)),
            None => r.run_id.clone(),
        };
        outln!(
            "{:<36} {:<17} {:<17} {:>7}  {:<19}  {}",
            shown,
            status,
            reason,
            r.records,
            format_ms(r.created_ms),
            r.session.as_deref().unwrap_or("-")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs in tree order: each run followed by its sub-agents' runs (`{parent}/{call id}`), in
/// the order they were listed; a child whose parent is not listed stands as a root.
fn as_tree(runs: Vec<toolloop_store::RunSummary>) -> Vec<toolloop_store::RunSummary> {
    let ids: std::collections::HashSet<String> = runs.iter().map(|r| r.run_id.clone()).collect();
    let parent_of = |id: &str| id.rsplit_once('/').map(|(p, _)| p.to_string());
    let (roots, children): (Vec<_>, Vec<_>) = runs
        .into_iter()
        .partition(|r| parent_of(&r.run_id).is_none_or(|p| !ids.contains(&p)));
    let mut children: Vec<Option<toolloop_store::RunSummary>> =
        children.into_iter().map(Some).collect();
    fn place(
        run: toolloop_store::RunSummary,
        children: &mut Vec<Option<toolloop_store::RunSummary>>,
        out: &mut Vec<toolloop_store::RunSummary>,
    ) {
        let prefix = format!("{}/", run.run_id);
        out.push(run);
        for i in 0..children.len() {
            let mine = children[i].as_ref().is_some_and(|c| {
                c.run_id
                    .strip_prefix(&prefix)
                    .is_some_and(|rest| !rest.contains('/'))
            });
            if mine && let Some(child) = children[i].take() {
                place(child, children, out);
            }
        }
    }
    let mut out = Vec::new();
    for root in roots {
        place(root, &mut children, &mut out);
    }
    out
}

/// Rebuilds the run's agent from the configuration kept with it, and continues the run.
pub(crate) async fn resume(cx: &Cx, args: ResumeArgs) -> Result<ExitCode, CliError> {
    let retry = match already_ended(cx, &args).await {
        Some(Ended::Said(code)) => return Ok(code),
        Some(Ended::Retry) => true,
        None => false,
    };
    let mut run_args = saved_run(
        cx,
        &args.run_id,
        args.store,
        args.base_url,
        args.json,
        args.durability.durability,
    )
    .await?;
    if retry {
        // A new run goes on from the failed one's conversation (see `DurableArgs::retry`).
        run_args.durable.retry = run_args.durable.resume.take();
    }
    crate::run::run(cx, run_args).await
}

/// What `toolloop resume` makes of a run that had already ended.
enum Ended {
    /// It said so, and how; the exit code the run's end had.
    Said(ExitCode),
    /// It failed on a model error (a server down or restarting, a refused connection): it is
    /// continued, in a new run from its conversation.
    Retry,
}

/// When the run had already failed (its outcome recorded: an error or a limit), says so and
/// how, with what can be done, instead of replaying its error as if it had just happened; or,
/// when it failed on a model error, says that it is continued ([`Ended::Retry`]).
async fn already_ended(cx: &Cx, args: &ResumeArgs) -> Option<Ended> {
    // A store or run that cannot be read is reported by the resume itself.
    let store = open_store(cx, &args.store).await.ok()?;
    let run = store.run(&args.run_id).await.ok()??;
    // A run that ended as intended is replayed: its outcome is printed as it was (a resume
    // after a crash right at its end gives the answer).
    let reason = match (run.status, run.stop_reason) {
        (toolloop_store::RunStatus::Finished, Some(reason)) if !reason.is_success() => reason,
        _ => return None,
    };
    let name = serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let ended = crate::durable::format_ms(run.updated_ms);
    if reason == StopReason::ModelError {
        crate::error::warn(format!(
            "run {} had failed on a model error ({ended} UTC): continuing it in a new run from \
             its log (its model answers and tool results are kept; nothing is made or run again)",
            run.run_id
        ));
        return Some(Ended::Retry);
    }
    let said = format!(
        "run {} had already ended ({name}, {ended} UTC): there is nothing to resume",
        run.run_id
    );
    if args.json {
        outln!(
            "{}",
            json!({"success": false, "stop_reason": reason, "run_id": run.run_id,
                   "already_ended": true, "session": run.session,
                   "error": {"code": "ALREADY_ENDED", "message": said}})
        );
    }
    crate::error::warn(&said);
    if matches!(reason, StopReason::Timeout | StopReason::EmptyAnswer) {
        let again = match &run.session {
            Some(s) => format!("toolloop run --session {s} \"…\" (or toolloop chat --session {s})"),
            None => "toolloop run \"…\"".to_string(),
        };
        eprintln!(
            "  if the cause has passed (a server that was down or restarting), continue the \
             conversation in a new run: {}",
            crate::terminal::escape(&again, false)
        );
    }
    Some(Ended::Said(crate::run::exit_code(reason)))
}
