//! Approvals in the command: the `--allow`, `--deny` and `--ask` rules, `--allow-commands`
//! (the `run_command` tool), the question on the terminal, `--defer-approvals`, and
//! `toolloop approve|deny <run-id>`.
//!
//! A call the rules do not settle is asked about on the terminal: yes, no, or always (yes, and
//! to every later call of the same tool on the same approval subject in this run: the same
//! command line, the same file whatever the content, the same arguments for other tools; the
//! question says so). Without a terminal it is denied, with a message that says which
//! flag would allow it; with `--defer-approvals` the run stops instead (exit code 4), to be
//! decided with `toolloop approve|deny` and continued with `toolloop resume`.

use crate::CliError;
use crate::args::ApprovalArgs;
use crate::args::{DurabilityArg, StoreArgs};
use crate::cx::Cx;
use crate::durable::open_store;
use crate::progress::Progress;
use crate::terminal::escape;
use clap::Args;
use futures::FutureExt;
use futures::future::BoxFuture;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use toolloop::approval::{Action, Answer, PendingApproval, Rule};
use toolloop::outcome::Outcome;
use toolloop::tool::Tool;

/// Exit code of a run that stopped to wait for approvals.
pub(crate) const EXIT_AWAITING: u8 = 4;

/// Warns, on stderr, about each rule whose tool glob names none of the tools `offered` (a
/// rule for `run_command` without `--allow-commands` does nothing), saying which flag offers
/// the tool. Returns the warnings.
pub(crate) fn warn_unoffered(args: &ApprovalArgs, offered: &[&str]) -> Vec<String> {
    let mut warnings = Vec::new();
    for (action, flag, specs) in [
        (Action::Allow, "allow", &args.allow),
        (Action::Ask, "ask", &args.ask),
        (Action::Deny, "deny", &args.deny),
    ] {
        for spec in specs {
            let Ok(rule) = Rule::parse(action, spec) else {
                continue;
            };
            if offered.iter().any(|name| rule.names_tool(name)) {
                continue;
            }
            let hint = if rule.names_tool("run_command") {
                "; run_command is offered with --allow-commands".to_string()
            } else if rule.names_tool("write_file") {
                "; write_file is offered with --allow-write".to_string()
            } else {
                format!("; the tools offered: {}", offered.join(", "))
            };
            let warning = format!(
                "toolloop: warning: --{flag} '{}' does nothing: it names no tool this run \
                 offers{}",
                escape(spec, false),
                escape(&hint, false)
            );
            eprintln!("{warning}");
            warnings.push(warning);
        }
    }
    warnings
}

/// Answers a call that waits for approval.
pub(crate) type Ask = Arc<dyn Fn(&PendingApproval) -> BoxFuture<'static, Answer> + Send + Sync>;

/// Whether only a person may approve a call ([`Tool::approval_required`]: `run_command` asked
/// to leave its sandbox), whatever the rules say.
pub(crate) type PersonOnly = Arc<dyn Fn(&toolloop::ToolCall) -> bool + Send + Sync>;

/// [`PersonOnly`] for the calls of `tools`.
pub(crate) fn person_only(tools: &[Arc<dyn Tool>]) -> PersonOnly {
    let tools = tools.to_vec();
    Arc::new(move |call| {
        tools
            .iter()
            .any(|t| t.name() == call.name && t.approval_required(&call.arguments))
    })
}

/// How the run answers calls that need approval: `None` with --defer-approvals (the run stops
/// for them); a question on the terminal when stdin and stderr are one; otherwise a denial
/// that names what would allow the call: a rule, or, for a call only a person may approve
/// (`person_only`), a person at a terminal (or `--sandbox off` for commands).
pub(crate) fn handler(
    args: &ApprovalArgs,
    progress: Arc<Progress>,
    person_only: PersonOnly,
) -> Option<Ask> {
    if args.defer_approvals {
        return None;
    }
    if !args.no_prompt && std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        let always: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        return Some(Arc::new(move |p: &PendingApproval| {
            let p = p.clone();
            let always = always.clone();
            let progress = progress.clone();
            async move {
                let key = (p.call.name.clone(), p.subject.clone());
                if always.lock().map(|a| a.contains(&key)).unwrap_or(false) {
                    return Answer::Approve;
                }
                let asked =
                    tokio::task::spawn_blocking(move || progress.suspend(|| ask_on_terminal(&p)))
                        .await
                        .unwrap_or(Reply::No);
                match asked {
                    Reply::Yes => Answer::Approve,
                    Reply::Always => {
                        if let Ok(mut a) = always.lock() {
                            a.push(key);
                        }
                        Answer::Approve
                    }
                    Reply::No => Answer::Deny {
                        reason: Some("the user said no".into()),
                    },
                }
            }
            .boxed()
        }));
    }
    Some(Arc::new(move |p: &PendingApproval| {
        let reason = if person_only(&p.call) {
            // No rule can allow it: naming one would send the user on a useless errand.
            let (what, sandbox_off) = if p.call.name == "run_command" {
                (
                    "it asks to run outside the sandbox, which only a person can approve",
                    "; to run commands without the sandbox at all, start the run with --sandbox off",
                )
            } else {
                ("only a person can approve it", "")
            };
            eprintln!(
                "toolloop: denied {} `{}`: {what} (no --allow rule can), and there is no \
                 terminal to ask on (chat does not ask); run toolloop on a terminal to be asked, \
                 or stop for a person's decision with --defer-approvals and `toolloop \
                 approve`{sandbox_off}",
                escape(&p.call.name, false),
                escape(&p.subject, false),
            );
            "only a person may approve this call, and there is no one to ask"
        } else {
            let flag = format!("--allow '{}:{}'", p.call.name, p.subject.replace('\'', "?"));
            eprintln!(
                "toolloop: denied {} `{}`: no rule allows it and there is no terminal to ask on \
                 (chat does not ask); allow it with {}, or stop for a later decision with \
                 --defer-approvals",
                escape(&p.call.name, false),
                escape(&p.subject, false),
                escape(&flag, false),
            );
            "no rule allows this call and there is no one to approve it"
        };
        async move {
            Answer::Deny {
                reason: Some(reason.into()),
            }
        }
        .boxed()
    }))
}

enum Reply {
    Yes,
    No,
    Always,
}

/// Shows the exact call (escaped) and reads the answer from the terminal.
fn ask_on_terminal(p: &PendingApproval) -> Reply {
    let mut err = std::io::stderr().lock();
    let name = escape(&p.call.name, false);
    let subject = escape(&p.subject, false);
    let arguments = p.call.canonical_arguments();
    let _ = writeln!(
        err,
        "toolloop: {name} wants to run (call {}):",
        escape(&p.call.id, false)
    );
    let _ = writeln!(err, "  {subject}");
    if arguments != p.subject {
        let _ = writeln!(err, "  arguments: {}", escape(&arguments, false));
    }
    loop {
        let _ = write!(
            err,
            "  allow? [y]es / [n]o / [a]lways: yes, and to every later `{name}` call on \
             `{subject}` in this run{}: ",
            always_scope(&p.call.name)
        );
        let _ = err.flush();
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => return Reply::No,
            Ok(_) => {}
        }
        match line.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => return Reply::Yes,
            "n" | "no" => return Reply::No,
            "a" | "always" => return Reply::Always,
            _ => {}
        }
    }
}

/// What "always" covers besides the subject, in words, for the tools whose subject leaves
/// part of the call out.
fn always_scope(tool: &str) -> &'static str {
    match tool {
        "write_file" => " (whatever the content)",
        "run_command" => " (whatever the timeout)",
        _ => "",
    }
}

/// After a run that stopped awaiting approval: the calls, and what to do next (stderr).
pub(crate) fn show_pending(outcome: &Outcome) {
    if outcome.pending_approvals.is_empty() {
        return;
    }
    for p in &outcome.pending_approvals {
        eprintln!(
            "  waiting: {} {}{} {}",
            escape(&p.call.id, false),
            where_(p),
            escape(&p.call.name, false),
            escape(&p.subject, false)
        );
    }
    if let Some(id) = &outcome.run_id {
        crate::error::warn(format!(
            "decide with `toolloop approve {id} <call-id>|--all` or `toolloop deny {id} \
             <call-id>|--all [--reason …]`, then `toolloop resume {id}`"
        ));
    }
}

/// Which sub-agent's call it is (`reviewer: `), empty for the run's own calls.
fn where_(p: &PendingApproval) -> String {
    if p.path.is_empty() {
        String::new()
    } else {
        format!("{}: ", escape(&p.path.join("/"), false))
    }
}

/// `toolloop approve` and `toolloop deny`.
#[derive(Args, Debug)]
pub(crate) struct DecideArgs {
    /// The run (`toolloop runs` lists them).
    run_id: String,
    /// The calls to decide, by id; with none (and no --all), the waiting calls are listed.
    calls: Vec<String>,
    /// Every waiting call.
    #[arg(long, conflicts_with = "calls")]
    all: bool,
    #[command(flatten)]
    store: StoreArgs,
    /// The provider's base URL, when the run started with one holding credentials (see
    /// `toolloop resume --help`).
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `toolloop deny`.
#[derive(Args, Debug)]
pub(crate) struct DenyArgs {
    #[command(flatten)]
    decide: DecideArgs,
    /// Why, for the model (it reads `denied: <reason>`).
    #[arg(long)]
    reason: Option<String>,
}

/// Records a decision on the waiting calls of a run (or lists them).
pub(crate) async fn decide(
    cx: &Cx,
    args: DecideArgs,
    approve: bool,
    reason: Option<String>,
) -> Result<ExitCode, CliError> {
    let run_args = crate::setup::saved_run(
        cx,
        &args.run_id,
        args.store.clone(),
        args.base_url.clone(),
        args.json,
        DurabilityArg::Process,
    )
    .await?;
    let store = open_store(cx, &args.store).await?;
    // The log is replayed, never continued: no model is called.
    let placeholder = Arc::new(toolloop::providers::scripted::ScriptedModel::new(Vec::new()));
    let tools = crate::setup::tools(cx, &run_args.agent).await?;
    let does_not_load = || {
        format!(
            "the saved configuration of run {} does not load",
            args.run_id
        )
    };
    let agent = crate::setup::agent_builder_with(cx, &run_args.agent, placeholder, tools)
        .map_err(|e| CliError::failure(does_not_load(), e))?
        .journal(Arc::new(store))
        .build()
        .map_err(|e| CliError::failure(does_not_load(), e))?;
    let listing = args.calls.is_empty() && !args.all;
    let answer = match (listing, approve) {
        (true, _) => None,
        (false, true) => Some(Answer::Approve),
        (false, false) => Some(Answer::Deny { reason }),
    };
    let calls = (!args.all).then_some(args.calls.as_slice());
    let decided = agent
        .decide_approvals(&args.run_id, calls, answer)
        .await
        .map_err(|e| CliError::failure("", e))?;
    if args.json {
        crate::outln!("{}", serde_json::json!(decided));
        return Ok(ExitCode::SUCCESS);
    }
    if decided.is_empty() {
        let none = format!("no call of run {} waits for approval", args.run_id);
        if !listing {
            return Err(CliError::failed(none));
        }
        crate::error::warn(none);
        return Ok(ExitCode::SUCCESS);
    }
    let verb = match (listing, approve) {
        (true, _) => "waiting",
        (false, true) => "approved",
        (false, false) => "denied",
    };
    for p in &decided {
        crate::outln!(
            "{verb}: {} {}{} {}",
            escape(&p.call.id, false),
            where_(p),
            escape(&p.call.name, false),
            escape(&p.subject, false)
        );
    }
    if !listing {
        crate::error::warn(format!(
            "continue the run with `toolloop resume {}`",
            args.run_id
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// `toolloop deny`.
pub(crate) async fn deny(cx: &Cx, args: DenyArgs) -> Result<ExitCode, CliError> {
    decide(cx, args.decide, false, args.reason).await
}
