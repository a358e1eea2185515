//! The virtual object `toolloop` (keyed by run id) and its driver: the loop's
//! [`Machine`](toolloop::engine::Machine) driven step by step, each step from outside a
//! journaled `ctx.run`.

use restate_sdk::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use toolloop::approval::{Answer, Decision, PendingApproval};
use toolloop::config::RoundLimitDecision;
use toolloop::engine::{Input, Interrupt, Machine, PhaseError, Step};
use toolloop::toolbox::Toolbox;
use toolloop::{Agent, Message, Outcome, SideEffect};

/// The name of the virtual object in Restate (the first segment of the ingress path:
/// `POST /toolloop/{run_id}/run`).
pub const SERVICE: &str = "toolloop";

/// The state key under which a run lists the calls that wait for a person.
const WAITING: &str = "waiting";

/// What a run is asked: a transcript, or a prompt, or both (the prompt goes last, as a user
/// message). The agent's system prompt goes first unless the messages start with one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The conversation so far.
    #[serde(default)]
    pub messages: Vec<Message>,
    /// A user prompt after the messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

impl RunRequest {
    /// A request on these messages.
    pub fn new(messages: Vec<Message>) -> Self {
        RunRequest {
            messages,
            prompt: None,
        }
    }

    fn into_messages(self) -> Vec<Message> {
        let mut messages = self.messages;
        if let Some(prompt) = self.prompt {
            messages.push(Message::user(prompt));
        }
        messages
    }
}

/// A call that waits for a person, with the id of the Restate awakeable that takes the answer
/// (an [`Answer`] as JSON: `{"answer":"approve"}` or `{"answer":"deny","reason":"…"}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitingApproval {
    /// The awakeable to resolve.
    pub awakeable_id: String,
    /// The call.
    #[serde(flatten)]
    pub pending: PendingApproval,
}

/// An agent served as the virtual object [`SERVICE`]: bind it to a Restate endpoint
/// ([`crate::worker::serve`] does).
pub struct RunService {
    agent: Agent,
}

impl RunService {
    /// The service running `agent`.
    pub fn new(agent: Agent) -> Self {
        RunService { agent }
    }
}

#[restate_sdk::object(
    name = "toolloop",
    // A model call may think for minutes without a journal entry.
    inactivity_timeout = "10m",
    invocation_retry_policy(initial_interval = "100ms", max_interval = "2s", factor = 2.0)
)]
impl RunService {
    /// Runs the agent on the request; the key is the run's id. Returns the run's outcome,
    /// also when it stopped early (cancelled, timed out, out of rounds).
    #[handler]
    async fn run(
        &self,
        ctx: ObjectContext<'_>,
        request: Json<RunRequest>,
    ) -> Result<Json<Outcome>, HandlerError> {
        let run_id = ctx.key().to_string();
        drive(&self.agent, &ctx, &run_id, request.into_inner())
            .await
            .map(Json)
    }

    /// The calls of the run that wait for a person, with their awakeables.
    #[handler]
    async fn pending(
        &self,
        ctx: SharedObjectContext<'_>,
    ) -> Result<Json<Vec<WaitingApproval>>, HandlerError> {
        let waiting = ctx.get::<Json<Vec<WaitingApproval>>>(WAITING).await?;
        Ok(Json(waiting.map(Json::into_inner).unwrap_or_default()))
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The run's deadline (milliseconds since the epoch) as a clock instant of this process.
fn instant_of(deadline_ms: Option<u64>) -> Option<tokio::time::Instant> {
    let remaining = deadline_ms?.saturating_sub(now_ms());
    tokio::time::Instant::now().checked_add(Duration::from_millis(remaining))
}

fn fed(result: Result<(), PhaseError>) {
    if let Err(e) = result {
        tracing::error!(error = %e, "the driver fed the loop an input it did not ask for");
    }
}

/// Hands a journaled input to the machine; `None` (the invocation was cancelled) stops the
/// run.
fn take(machine: &mut Machine, input: Option<Input>) {
    let input = input.unwrap_or(Input::Interrupted {
        why: Interrupt::Cancelled,
    });
    fed(machine.handle(input));
}

/// A journaled step's value, or `None` when the invocation was cancelled.
fn journaled<T>(result: Result<T, TerminalError>) -> Result<Option<T>, HandlerError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.code() == 409 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Drives one run to its end. Every input the machine takes is the value of a journaled step
/// (the same [`Input`] a run log holds), so an execution that replays the journal rebuilds the
/// same machine without calling anything.
async fn drive(
    agent: &Agent,
    ctx: &ObjectContext<'_>,
    run_id: &str,
    request: RunRequest,
) -> Result<Outcome, HandlerError> {
    let started = std::time::Instant::now();
    // This execution's mark: an intent journaled with another mark is from an execution that
    // died.
    let mark = toolloop::journal::new_run_id();
    let mut machine = agent.start(request.into_messages());
    // The tools that run the calls (the machine knows their catalog).
    let mut toolbox = agent.toolbox().clone();
    // The deadline is fixed when the run starts, the same for every execution.
    let deadline_ms = match agent.config().timeout {
        Some(t) => {
            let start = ctx.run(|| async { Ok(now_ms()) }).name("started").await;
            journaled(start)?.map(|s| s.saturating_add(t.as_millis() as u64))
        }
        None => None,
    };
    let model = agent.model().session();
    loop {
        match machine.next_step() {
            Step::Finished => break,
            Step::GetReminders => {
                let (m, round) = (&machine, machine.round() + 1);
                let got = ctx
                    .run(|| async move {
                        let reminders = agent.reminders_for(m);
                        Ok(Json(Input::RemindersGiven { round, reminders }))
                    })
                    .name("reminders")
                    .await;
                let input = journaled(got)?.map(Json::into_inner);
                take(&mut machine, input);
            }
            Step::CheckStop => {
                let (m, round) = (&machine, machine.round());
                let got = ctx
                    .run(|| async move {
                        let signal = agent.stop_signal_for(m);
                        Ok(Json(Input::StopChecked { round, signal }))
                    })
                    .name("stop_when")
                    .await;
                let input = journaled(got)?.map(Json::into_inner);
                take(&mut machine, input);
            }
            Step::DecideRoundLimit => {
                let input = if agent.hooks().on_round_limit.is_some() {
                    let m = &machine;
                    let got = ctx
                        .run(|| async move {
                            let decision = agent.round_limit_for(m).await;
                            Ok(Json(Input::RoundLimitDecided { decision }))
                        })
                        .name("on_round_limit")
                        .await;
                    journaled(got)?.map(Json::into_inner)
                } else {
                    Some(Input::RoundLimitDecided {
                        decision: RoundLimitDecision::Stop,
                    })
                };
                take(&mut machine, input);
            }
            Step::CallModel { round, reminders } => {
                if agent.has_tool_sources() {
                    // The catalog is a journaled step when it changed: a replay offers and
                    // judges calls by the tools the run had, and runs them as the sources'
                    // tools run now.
                    let known = machine.catalog().clone();
                    let listed = ctx
                        .run(|| async move {
                            let now = agent.tools_now().await;
                            let changed = now.catalog() != &known;
                            Ok(Json(changed.then(|| Input::ToolsChanged {
                                round,
                                tools: now.catalog().clone(),
                            })))
                        })
                        .name(format!("tools round {round}"))
                        .await;
                    let Some(changed) = journaled(listed)?.map(Json::into_inner) else {
                        take(&mut machine, None);
                        continue;
                    };
                    if let Some(input) = changed {
                        if let Input::ToolsChanged { tools, .. } = &input {
                            let live = agent.tools_now().await;
                            toolbox = if live.catalog() == tools {
                                live
                            } else {
                                Arc::new(Toolbox::from_catalog(tools.clone(), &live))
                            };
                        }
                        fed(machine.handle(input));
                    }
                }
                let (m, model, tools) = (&machine, &*model, &*toolbox);
                let step = ctx
                    .run(|| async move {
                        let call = agent.call_model_for(model, m, round, &reminders, None);
                        let done = match instant_of(deadline_ms) {
                            Some(d) => tokio::time::timeout_at(d, call).await.ok(),
                            None => Some(call.await),
                        };
                        Ok(Json(match done {
                            None => Input::Interrupted {
                                why: Interrupt::Timeout,
                            },
                            // The approval subjects of its calls go with the response.
                            Some(Ok(response)) => agent.response_input(tools, round, response),
                            // A refusal for size starts a compaction, with a context policy.
                            Some(Err(e)) => {
                                toolloop::context::driver::failed_call_input(m, round, e)
                            }
                        }))
                    })
                    .name(format!("model round {round}"))
                    .await;
                let input = journaled(step)?.map(Json::into_inner);
                if let Some(Input::ModelResponded { response, .. }) = &input {
                    tracing::info!(
                        run_id,
                        round,
                        calls = response.tool_calls.len(),
                        "model answered"
                    );
                }
                take(&mut machine, input);
            }
            step @ Step::EditContext { .. } => {
                // The machine's edits follow from the journaled inputs: nothing to journal.
                if let Some(input) = toolloop::context::driver::edits_input(step) {
                    fed(machine.handle(input));
                }
            }
            Step::Compact(request) => {
                // The summary is a journaled step: a replay does not summarise again.
                let (round, req) = (request.round, &*request);
                let step = ctx
                    .run(|| async move { Ok(Json(agent.summarise(agent.settings(), req).await)) })
                    .name(format!("compact round {round}"))
                    .await;
                let input = journaled(step)?.map(Json::into_inner);
                take(&mut machine, input);
            }
            Step::RunTools(batches) => {
                let round = machine.round();
                'batches: for batch in batches {
                    // One call at a time: Restate journals steps in the order they are awaited.
                    for index in batch.calls {
                        let Some(call) = machine.shared_round_call(index) else {
                            continue;
                        };
                        let side_effecting = toolbox
                            .get(&call.name)
                            .is_some_and(|t| t.side_effect() == SideEffect::SideEffecting);
                        // A side-effecting call's intent is durable before it starts.
                        let mut died_running = false;
                        if side_effecting {
                            let mine = mark.clone();
                            let intent = ctx
                                .run(|| async move { Ok(mine) })
                                .name(format!("intent {}", call.id))
                                .await;
                            match journaled(intent)? {
                                Some(theirs) => died_running = theirs != mark,
                                None => {
                                    take(&mut machine, None);
                                    break 'batches;
                                }
                            }
                        }
                        fed(machine.handle(Input::ToolStarted {
                            round,
                            index,
                            call_id: call.id.clone(),
                        }));
                        let retry = !died_running || agent.retries_in_flight(&toolbox, &call);
                        let key = format!("{run_id}/{}", call.id);
                        // The subject the call was weighed by: the tool is asked again just
                        // before it runs, and a call whose subject changed is not run (its
                        // result, journaled with the step, says why).
                        let weighed = machine.weighed_subject(index).cloned();
                        let (c, tools, weighed) = (&*call, &*toolbox, weighed.as_ref());
                        let step = ctx
                            .run(|| async move {
                                if !retry {
                                    return Ok(Json(Input::ToolUnknown { round, index }));
                                }
                                let deadline = instant_of(deadline_ms);
                                let cancel = CancellationToken::new();
                                let running = agent.call_tool(
                                    tools, round, c, weighed, key, &cancel, deadline, None,
                                );
                                let done = match deadline {
                                    Some(d) => tokio::time::timeout_at(d, running).await.ok(),
                                    None => Some(running.await),
                                };
                                Ok(Json(match done {
                                    Some(r) => Input::ToolFinished {
                                        round,
                                        index,
                                        result: r.result,
                                        duration_ms: r.duration_ms,
                                        attempts: r.attempts,
                                    },
                                    None => {
                                        cancel.cancel();
                                        Input::Interrupted {
                                            why: Interrupt::Timeout,
                                        }
                                    }
                                }))
                            })
                            .name(format!("tool {} {}", call.name, call.id))
                            .await;
                        let input = journaled(step)?.map(Json::into_inner);
                        let stops = !matches!(
                            input,
                            Some(Input::ToolFinished { .. } | Input::ToolUnknown { .. })
                        );
                        if let Some(Input::ToolUnknown { .. }) = input {
                            tracing::warn!(run_id, call_id = %call.id, "a side-effecting call was running when a worker died: its outcome is unknown");
                        }
                        take(&mut machine, input);
                        if stops {
                            break 'batches;
                        }
                    }
                }
            }
            Step::Approve(requests) => {
                let mut waiting = Vec::new();
                for r in requests {
                    match Decision::by_rule(&r.pending.call, &r.verdict) {
                        Some(decision) => fed(machine.handle(Input::ApprovalDecided {
                            round: r.pending.round,
                            index: r.pending.index,
                            decision,
                        })),
                        None => {
                            let (awakeable_id, answer) = ctx.awakeable::<Json<Answer>>();
                            waiting.push((
                                WaitingApproval {
                                    awakeable_id,
                                    pending: r.pending,
                                },
                                answer,
                            ));
                        }
                    }
                }
                if waiting.is_empty() {
                    continue;
                }
                let listed: Vec<WaitingApproval> = waiting.iter().map(|(w, _)| w.clone()).collect();
                tracing::info!(run_id, calls = listed.len(), "waiting for approvals");
                ctx.set(WAITING, Json(listed));
                let mut cancelled = false;
                for (w, answer) in waiting {
                    let call = &w.pending.call;
                    let decision = match answer.await {
                        Ok(a) => Decision::by_person(call, a.into_inner()),
                        // Restate's cancel.
                        Err(e) if e.code() == 409 => {
                            cancelled = true;
                            break;
                        }
                        // A rejected awakeable is a denial, for the reason given.
                        Err(e) => Decision::by_person(
                            call,
                            Answer::Deny {
                                reason: Some(e.message().to_string()),
                            },
                        ),
                    };
                    fed(machine.handle(Input::ApprovalDecided {
                        round: w.pending.round,
                        index: w.pending.index,
                        decision,
                    }));
                }
                ctx.clear(WAITING);
                if cancelled {
                    take(&mut machine, None);
                }
            }
            // `Step` grows with the engine; a step this driver was not written for ends the
            // run with an error that names it, rather than a guess.
            other => {
                return Err(TerminalError::new(format!(
                    "toolloop-restate cannot drive the step {other:?}: update toolloop-restate to the toolloop it runs with"
                ))
                .into());
            }
        }
    }
    let mut outcome = machine.into_outcome(started.elapsed().as_millis() as u64);
    outcome.run_id = Some(run_id.to_string());
    tracing::info!(run_id, stop = ?outcome.stop_reason, "run finished");
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_goes_after_the_messages() {
        let r: RunRequest =
            serde_json::from_str(r#"{"messages":[{"role":"user","content":"a"}],"prompt":"b"}"#)
                .unwrap();
        assert_eq!(
            r.into_messages(),
            vec![Message::user("a"), Message::user("b")]
        );
        let r: RunRequest = serde_json::from_str(r#"{"prompt":"hi"}"#).unwrap();
        assert_eq!(r.into_messages(), vec![Message::user("hi")]);
    }

    #[test]
    fn a_deadline_in_the_past_is_now() {
        let at = instant_of(Some(1)).unwrap();
        assert!(at <= tokio::time::Instant::now());
        assert!(instant_of(None).is_none());
    }
}
