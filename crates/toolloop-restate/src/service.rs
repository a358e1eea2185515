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
use toolloop::subagent::SubAgent;
use toolloop::toolbox::Toolbox;
use toolloop::{Agent, Message, Outcome, SideEffect, ToolError};

/// The name of the virtual object in Restate (the first segment of the ingress path:
/// `POST /toolloop/{run_id}/run`).
pub const SERVICE: &str = "toolloop";

/// The state key under which a run lists the calls that wait for a person.
const WAITING: &str = "waiting";

/// The state key under which a run lists its sub-agents' runs in progress (their keys and
/// names), whose waiting calls its `pending` handler lists too.
const CHILDREN: &str = "children";

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
    /// For a sub-agent's run (a child invocation, keyed `{parent run id}/{call id}`): which
    /// agent runs and what bounds it. `None` for a run of the served agent itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRun>,
}

/// What a sub-agent's run (see [`toolloop::subagent`]) takes from the run that called it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ParentRun {
    /// The sub-agents' names from the served agent down to this one (`["reviewer"]`): each a
    /// [`SubAgent`] among the tools of the one before.
    pub path: Vec<String>,
    /// The parent's deadline (milliseconds since the epoch), which bounds the child's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// The sub-agent's token budget ([`SubAgent::max_tokens`]): the run stops, as cancelled,
    /// after the model call that passes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The sub-agent's cost budget in US dollars ([`SubAgent::max_cost`]), likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
}

impl ParentRun {
    /// Whether the run has spent more than its budget allows (decided from journaled values
    /// alone, so a replay decides the same).
    fn over_budget(&self, machine: &Machine) -> bool {
        let cost = machine.state().cost().unwrap_or(0.0);
        self.max_tokens
            .is_some_and(|max| spent_tokens(machine) > max)
            || self.max_cost.is_some_and(|max| cost > max)
    }

    /// The tokens and dollars the run's budget has left (`None`: no limit).
    fn left(&self, machine: &Machine) -> (Option<u64>, Option<f64>) {
        let cost = machine.state().cost().unwrap_or(0.0);
        (
            self.max_tokens
                .map(|max| max.saturating_sub(spent_tokens(machine))),
            self.max_cost.map(|max| (max - cost).max(0.0)),
        )
    }
}

/// The tokens a run spent (its children's included).
fn spent_tokens(machine: &Machine) -> u64 {
    machine.state().usage().map_or(0, |u| u.total_tokens())
}

/// The tighter of two limits (`None`: no limit).
fn tighter<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b < a { b } else { a }),
        (a, b) => a.or(b),
    }
}

impl RunRequest {
    /// A request on these messages.
    pub fn new(messages: Vec<Message>) -> Self {
        RunRequest {
            messages,
            prompt: None,
            parent: None,
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
        let request = request.into_inner();
        let path = request
            .parent
            .as_ref()
            .map(|p| p.path.clone())
            .unwrap_or_default();
        let agent = sub_agent_at(&self.agent, &path)?;
        let max_depth = self.agent.delegation().max_depth;
        drive(agent, &ctx, &run_id, request, max_depth)
            .await
            .map(Json)
    }

    /// The calls of the run that wait for a person, with their awakeables.
    #[handler]
    async fn pending(
        &self,
        ctx: SharedObjectContext<'_>,
    ) -> Result<Json<Vec<WaitingApproval>>, HandlerError> {
        let mut waiting = ctx
            .get::<Json<Vec<WaitingApproval>>>(WAITING)
            .await?
            .map(Json::into_inner)
            .unwrap_or_default();
        // A sub-agent's calls that wait, with the path to it and the run that holds them.
        let children = ctx
            .get::<Json<Vec<(String, String)>>>(CHILDREN)
            .await?
            .map(Json::into_inner)
            .unwrap_or_default();
        for (key, name) in children {
            let theirs = ctx
                .object_client::<RunServiceClient>(key.clone())
                .pending()
                .call()
                .await?
                .into_inner();
            waiting.extend(theirs.into_iter().map(|mut w| {
                w.pending.path.insert(0, name.clone());
                w.pending.run_id.get_or_insert_with(|| key.clone());
                w
            }));
        }
        Ok(Json(waiting))
    }
}

/// The agent at `path` below `root`: each name a [`SubAgent`] among the tools of the one
/// before (the empty path is `root`).
fn sub_agent_at<'a>(root: &'a Agent, path: &[String]) -> Result<&'a Agent, TerminalError> {
    let mut agent = root;
    for name in path {
        agent = agent
            .toolbox()
            .get(name)
            .and_then(|t| t.sub_agent())
            .map(SubAgent::agent)
            .ok_or_else(|| {
                TerminalError::new(format!(
                    "no sub-agent `{name}` on the path {} of the served agent",
                    path.join("/")
                ))
            })?;
    }
    Ok(agent)
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
    max_depth: u32,
) -> Result<Outcome, HandlerError> {
    let started = std::time::Instant::now();
    // This execution's mark: an intent journaled with another mark is from an execution that
    // died.
    let mark = toolloop::journal::new_run_id();
    let parent = request.parent.clone().unwrap_or_default();
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
    // A sub-agent's run ends by its parent's deadline too.
    let deadline_ms = match (deadline_ms, parent.deadline_ms) {
        (Some(own), Some(theirs)) => Some(own.min(theirs)),
        (own, theirs) => own.or(theirs),
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
                if parent.over_budget(&machine) {
                    fed(machine.handle(Input::Interrupted {
                        why: Interrupt::Cancelled,
                    }));
                }
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
                        if let Some(sub) = toolbox.get(&call.name).and_then(|t| t.sub_agent()) {
                            // A sub-agent's run is a child invocation, journaled as this run's
                            // call: a replay takes its result, and a child that was running
                            // goes on in its own invocation, from its own journal.
                            fed(machine.handle(Input::ToolStarted {
                                round,
                                index,
                                call_id: call.id.clone(),
                            }));
                            let child = Child {
                                run_id,
                                parent: &parent,
                                deadline_ms,
                                max_depth,
                                left: parent.left(&machine),
                            };
                            let input = child.run(ctx, sub, &call, round, index).await?;
                            let stops = !matches!(input, Some(Input::ToolFinished { .. }));
                            take(&mut machine, input);
                            if stops {
                                break 'batches;
                            }
                            continue;
                        }
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

/// Where a run that calls a sub-agent stands: what the child's run inherits.
struct Child<'a> {
    run_id: &'a str,
    parent: &'a ParentRun,
    deadline_ms: Option<u64>,
    max_depth: u32,
    /// What the calling run's budget has left, which bounds the child's.
    left: (Option<u64>, Option<f64>),
}

impl Child<'_> {
    /// Runs the sub-agent `sub` for `call` as a child invocation (keyed
    /// `{run id}/{call id}`), and gives the call's result; `None` when the run was cancelled.
    async fn run(
        &self,
        ctx: &ObjectContext<'_>,
        sub: &SubAgent,
        call: &toolloop::ToolCall,
        round: u32,
        index: usize,
    ) -> Result<Option<Input>, HandlerError> {
        let name = sub.name();
        let mut path = self.parent.path.clone();
        path.push(name.to_string());
        let finished = |result, duration_ms| {
            Some(Input::ToolFinished {
                round,
                index,
                result,
                duration_ms,
                attempts: 1,
            })
        };
        let depth = path.len() as u32;
        if depth > self.max_depth {
            // Decided from the journaled call alone: a replay decides the same.
            let why = format!(
                "the agent `{name}` was not run: delegation would go {depth} levels deep, and \
                 the limit is {}; do this part yourself",
                self.max_depth
            );
            return Ok(finished(Err(ToolError::new(why)), 0));
        }
        let (own_tokens, own_cost) = sub.budget();
        let max_tokens = tighter(own_tokens, self.left.0);
        let max_cost = tighter(own_cost, self.left.1);
        if max_tokens == Some(0) || max_cost.is_some_and(|c| c <= 0.0) {
            let why = format!("the agent `{name}` was not run: nothing is left in the budget");
            return Ok(finished(Err(ToolError::new(why)), 0));
        }
        let key = SubAgent::child_run_id(self.run_id, &call.id);
        let mut children = ctx
            .get::<Json<Vec<(String, String)>>>(CHILDREN)
            .await?
            .map(Json::into_inner)
            .unwrap_or_default();
        children.push((key.clone(), name.to_string()));
        ctx.set(CHILDREN, Json(children.clone()));
        let request = RunRequest {
            messages: sub.child_messages(&call.arguments),
            prompt: None,
            parent: Some(ParentRun {
                path,
                deadline_ms: self.deadline_ms,
                max_tokens,
                max_cost,
            }),
        };
        tracing::info!(run_id = self.run_id, child = %key, "sub-agent {name} runs");
        let done = ctx
            .object_client::<RunServiceClient>(key.clone())
            .run(Json(request))
            .call()
            .await;
        children.retain(|(k, _)| k != &key);
        if children.is_empty() {
            ctx.clear(CHILDREN);
        } else {
            ctx.set(CHILDREN, Json(children));
        }
        Ok(match done {
            Ok(outcome) => {
                let mut outcome = outcome.into_inner();
                outcome.run_id.get_or_insert(key);
                let duration_ms = outcome.duration_ms;
                finished(sub.result_of(outcome), duration_ms)
            }
            // Restate's cancel (it reaches the child too).
            Err(e) if e.code() == 409 => None,
            Err(e) => finished(
                Err(ToolError::new(format!(
                    "the agent `{name}` failed: {}",
                    e.message()
                ))),
                0,
            ),
        })
    }
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
