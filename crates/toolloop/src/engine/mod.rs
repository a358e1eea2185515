//! The loop as a state machine with no I/O.
//!
//! In this order:
//! 1. Make the machine: [`Machine::new`] for a new run (the driver logs [`Input::Started`]),
//!    [`Machine::replay`] from a run's log, [`Machine::resume`] from a saved [`Snapshot`].
//!    It is given what it decides by, as data: the configuration, a snapshot of the tools'
//!    metadata ([`Catalog`]) and which hooks exist ([`HookFlags`]). It holds no tool and no
//!    hook, and calls no user code.
//! 2. Ask [`Machine::next_step`] what to do now ([`Step`]): ask the `reminders` hook, call the
//!    model, run these tool calls on this schedule, decide approvals, ask `stop_when`, ask
//!    `on_round_limit`, or nothing more (finished).
//! 3. Do it (the I/O, the hooks, the tools), log what came of it as an [`Input`], and hand the
//!    input to [`Machine::handle`]. Every answer is an input, a model's response like a hook's
//!    answer or a person's decision, so the run log is the list of a run's inputs and a replay
//!    hands them to a fresh machine. An input the machine is not waiting for is refused with a
//!    [`PhaseError`], and changes nothing. The driver computes what needs user code and carries
//!    it in the input: the approval subjects of a response's calls
//!    ([`crate::toolbox::Toolbox::approval_subjects`]). Just before a call the policy weighed
//!    runs, the driver asks its tool again and compares with [`Machine::weighed_subject`]: a
//!    call whose subject changed is not run, and the driver hands in a result that says so
//!    ([`Input::ToolFinished`]; [`crate::agent::Agent::call_tool`] does both).
//! 4. Take the events ([`Machine::take_events`]) and go back to 2, until [`Step::Finished`];
//!    then [`Machine::into_outcome`].
//!
//! [`crate::agent`] is the driver of an [`crate::Agent`]; `toolloop-restate` drives the same
//! machine from Restate's journal. [`Machine::snapshot`] saves the machine's state as a
//! versioned [`Snapshot`], so a run can be saved and rebuilt from it.
//!
//! Where each concern lives (this file holds [`Machine`], its making, [`Machine::next_step`] and
//! [`Machine::handle`], which sends each input to the module that takes it):
//! - `input`: [`Input`], every input in one type, and [`HookFlags`];
//! - `state`: [`LoopState`] and its [`Snapshot`], [`Phase`], [`Slot`], and [`PhaseError`];
//! - `answer`: the answer path, a response's usage and cost, a final answer and its output
//!   schema, and how a run ends ([`Machine::into_outcome`]);
//! - `calls`: call triage and scheduling, a response's calls checked and settled or planned,
//!   [`Batch`]es, the calls' intents and results, `stop_when`, the end of a round;
//! - `approvals`: the approval policy's verdicts and the decisions ([`ApprovalRequest`]);
//! - `delegation`: what sub-agents' calls spent, and a run stopped while a child waits for
//!   approvals ([`Machine::await_child_approvals`]);
//! - `replay`: [`Machine::replay`], a log handed to a fresh machine ([`ReplayError`]).
//!
//! Invariants the machine keeps:
//! - every tool call gets exactly one result, appended in the model's call order, whatever
//!   happens (invalid, duplicate, over budget, cancelled, cut off);
//! - every call of a round runs before any terminal check;
//! - budgets are checked before each model call and before each tool call executes.

use crate::approval::{Action, Decision, PendingApproval, Subject, Verdict};
use crate::config::{
    Hooks, InvalidCallPolicy, LoopConfig, LoopView, ParallelMode, RoundCall, RoundLimitDecision,
    TruncatedCallPolicy,
};
use crate::event::Event;
use crate::message::{AssistantMessage, Message, ToolCall, ToolResult};
use crate::model::{FinishReason, ModelResponse};
use crate::outcome::{CallStatus, ErrorCode, ExecutedCall, Outcome, RunError, StopReason};
use crate::output::{OutputCheck, OutputSchema, OutputSchemaError};
use crate::result;
use crate::tool::{ToolError, ToolOutput};
use crate::toolbox::{Catalog, CatalogEntry};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Records an event, building it only when events are on.
macro_rules! emit {
    ($machine:expr, $event:expr) => {
        if $machine.events_on {
            $machine.events.push($event);
        }
    };
}

mod answer;
mod approvals;
mod calls;
mod context;
mod delegation;
mod input;
mod replay;
mod state;
#[cfg(test)]
mod tests;

pub use approvals::ApprovalRequest;
pub use calls::Batch;
pub use context::{CompactRequest, Compaction, ContextEdits, ContextState};
pub use input::{HookFlags, Input};
pub use replay::ReplayError;
pub use state::{
    ApprovalState, Interrupt, LoopState, Phase, PhaseError, SNAPSHOT_VERSION, Slot, Snapshot,
};

/// What the driver should do next.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Step {
    /// A round is about to start and a `reminders` hook is set: call it with
    /// [`Machine::view`] and report its strings with [`Input::RemindersGiven`].
    GetReminders,
    /// Call the model with the conversation ([`Machine::messages`]), the toolbox's specs, and
    /// these transient reminders.
    CallModel {
        /// The round (1-based).
        round: u32,
        /// Reminders for this request only.
        reminders: Vec<String>,
    },
    /// Run these calls, batch after batch; report each with [`Input::ToolStarted`] before it
    /// runs and [`Input::ToolFinished`] after.
    RunTools(Vec<Batch>),
    /// Every call of the round ran and a `stop_when` hook is set: call it with
    /// [`Machine::round_calls`] and report its answer with [`Input::StopChecked`].
    CheckStop,
    /// `max_rounds` is reached: ask `on_round_limit` and report with
    /// [`Input::RoundLimitDecided`].
    DecideRoundLimit,
    /// Calls of the round wait for their approval, before any call of the round runs: report
    /// a [`Decision`] for each with [`Input::ApprovalDecided`] (by the rule in the verdict,
    /// or by asking the approval handler when the verdict is [`Verdict::Ask`]), or, with no
    /// handler, stop with [`Machine::await_approval`].
    Approve(Vec<ApprovalRequest>),
    /// The context policy edits the conversation it sends before round `round` (see
    /// [`crate::context::policy`]): log [`Input::ContextEdited`] with these edits, unchanged,
    /// and hand it back.
    EditContext {
        /// The round about to start.
        round: u32,
        /// The edits.
        edits: ContextEdits,
    },
    /// The conversation is to be compacted: call the summarising model with the request's
    /// messages (no tools), and report [`Input::Compacted`] with the summary (or
    /// [`Input::CompactionFailed`]).
    Compact(Box<CompactRequest>),
    /// The run is over; take the outcome.
    Finished,
}

/// The loop's state machine.
pub struct Machine {
    config: Arc<LoopConfig>,
    hooks: HookFlags,
    /// What the machine knows of the run's tools (never the tools themselves).
    catalog: Arc<Catalog>,
    state: LoopState,
    events: Vec<Event>,
    events_on: bool,
    /// Fingerprints of the call ids in the conversation (see [`id_key`]), so that checking a new
    /// call's id costs the same however long the conversation is.
    call_ids: foldhash::HashSet<u64>,
    /// The executed calls of `state.calls` as (fingerprint, index), in order, so that checking
    /// a call for a duplicate reads this list instead of the earlier calls themselves (a match
    /// is confirmed on the call); see [`Machine::is_duplicate`].
    executed_prints: Vec<(u64, usize)>,
    /// How many of `state.calls` are in `executed_prints`.
    printed_calls: usize,
    /// The fingerprints of this round's calls, in the order of its slots, taken at triage
    /// while the calls are fresh in memory; the round's end adds its executed calls' to
    /// `executed_prints` from here.
    round_prints: Vec<u64>,
    /// The compiled output schema (`state.output_schema`), or why it does not compile.
    output_check: Option<Result<Arc<OutputCheck>, String>>,
    /// The estimate of the next request's size, with a context policy.
    estimate: context::Estimate,
}

/// The compiled form of a state's output schema.
fn compile_output(schema: Option<&OutputSchema>) -> Option<Result<Arc<OutputCheck>, String>> {
    schema.map(|s| s.compile().map(Arc::new).map_err(|e| e.to_string()))
}

/// A call id's fingerprint for [`Machine`]'s index of ids (a match is confirmed on the
/// conversation itself).
fn id_key(id: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x6361_6c6c_5f69_6473).hash_one(id)
}

/// Fingerprints of every call id and result id in `messages`.
fn conversation_ids(messages: &[Message]) -> foldhash::HashSet<u64> {
    let mut ids = foldhash::HashSet::default();
    for m in messages {
        match m {
            Message::Assistant(a) => ids.extend(a.tool_calls.iter().map(|c| id_key(&c.id))),
            Message::Tool(r) => {
                ids.insert(id_key(&r.call_id));
            }
            _ => {}
        }
    }
    ids
}

impl std::fmt::Debug for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Machine {
    /// A machine for a new run over `messages` (the driver logs them as [`Input::Started`]),
    /// with the run's tools as `catalog` ([`crate::toolbox::Toolbox::catalog`]) and the hooks
    /// the driver has (`(&hooks).into()`): the machine asks for their answers with [`Step`]s,
    /// and the driver calls them.
    pub fn new(
        config: Arc<LoopConfig>,
        hooks: HookFlags,
        catalog: Arc<Catalog>,
        messages: Vec<Message>,
    ) -> Self {
        let round_limit = config.max_rounds;
        let call_ids = conversation_ids(&messages);
        let mut m = Machine {
            config,
            hooks,
            catalog,
            state: LoopState {
                messages,
                round: 0,
                round_limit,
                tool_calls_executed: 0,
                consecutive_invalid: 0,
                usage: None,
                calls_without_usage: 0,
                cost: Some(0.0),
                calls: Vec::new(),
                phase: Phase::Ready,
                pending_approvals: Vec::new(),
                output_schema: None,
                context: None,
            },
            events: Vec::new(),
            events_on: true,
            call_ids,
            executed_prints: Vec::new(),
            printed_calls: 0,
            round_prints: Vec::new(),
            output_check: None,
            estimate: Default::default(),
        };
        m.init_context();
        emit!(
            m,
            Event::RunStarted {
                message_count: m.state.messages.len(),
            }
        );
        m
    }

    /// A machine rebuilt from a saved [`Snapshot`] (see [`Machine::snapshot`]).
    pub fn resume(
        config: Arc<LoopConfig>,
        hooks: HookFlags,
        catalog: Arc<Catalog>,
        snapshot: Snapshot,
    ) -> Self {
        let state = snapshot.into_state();
        let mut m = Machine {
            config,
            hooks,
            catalog,
            call_ids: conversation_ids(&state.messages),
            executed_prints: Vec::new(),
            printed_calls: 0,
            round_prints: Vec::new(),
            output_check: compile_output(state.output_schema.as_ref()),
            state,
            events: Vec::new(),
            events_on: true,
            estimate: Default::default(),
        };
        m.init_context();
        m
    }

    /// Sets the schema the run's final answer must match (`None`: any text is an answer), for a
    /// run that has not started (see [`crate::output`]). A final answer is then parsed as JSON
    /// and validated: a valid one ends the run with its value in [`Outcome::output`]; an
    /// invalid one goes back to the model with the errors, within the invalid-call budget.
    /// Refused, with the machine unchanged, when the schema does not compile.
    pub fn set_output_schema(
        &mut self,
        schema: Option<OutputSchema>,
    ) -> Result<(), OutputSchemaError> {
        self.output_check = match &schema {
            Some(s) => Some(Ok(Arc::new(s.compile()?))),
            None => None,
        };
        self.state.output_schema = schema;
        Ok(())
    }

    /// The schema the final answer must match, if any.
    pub fn output_schema(&self) -> Option<&OutputSchema> {
        self.state.output_schema.as_ref()
    }

    /// Turns event recording on or off (on by default). A driver with no listener turns it off,
    /// so that no event is built for nobody.
    pub fn set_events(&mut self, on: bool) {
        self.events_on = on;
        if !on {
            self.events.clear();
        }
    }

    /// The state.
    pub fn state(&self) -> &LoopState {
        &self.state
    }

    /// The state, saved: give it back to [`Machine::resume`] to go on from here.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::new(self.state.clone())
    }

    /// The transcript so far.
    pub fn messages(&self) -> &[Message] {
        &self.state.messages
    }

    /// What the machine knows of the run's tools: the catalog it was made with, or the last
    /// one an [`Input::ToolsChanged`] gave.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The configuration.
    pub fn config(&self) -> &LoopConfig {
        &self.config
    }

    /// The current round (1-based once the first model call was made).
    pub fn round(&self) -> u32 {
        self.state.round
    }

    /// Events produced since the last call.
    pub fn take_events(&mut self) -> std::vec::Drain<'_, Event> {
        self.events.drain(..)
    }

    /// Call `index` of the current round.
    pub fn round_call(&self, index: usize) -> Option<&ToolCall> {
        match &self.state.phase {
            Phase::Tools { slots, .. } => slots.get(index).map(|s| &*s.call),
            _ => None,
        }
    }

    /// Call `index` of the current round, shared: a driver can hold it while it reports results
    /// to the machine.
    pub fn shared_round_call(&self, index: usize) -> Option<Arc<ToolCall>> {
        match &self.state.phase {
            Phase::Tools { slots, .. } => slots.get(index).map(|s| s.call.clone()),
            _ => None,
        }
    }

    /// A view for hooks.
    pub fn view(&self) -> LoopView<'_> {
        // While the reminders hook is asked, the view is of the round about to run.
        let starting = u32::from(self.state.phase == Phase::Reminders);
        LoopView {
            round: self.state.round + starting,
            tool_calls: self.state.tool_calls_executed,
            usage: self.state.usage,
            last_call: self.state.calls.iter().rev().find(|c| c.status.executed()),
        }
    }

    /// What to do now.
    pub fn next_step(&mut self) -> Step {
        match &self.state.phase {
            Phase::Done { .. } => Step::Finished,
            Phase::RoundLimit => Step::DecideRoundLimit,
            Phase::Reminders => Step::GetReminders,
            Phase::EditingContext { edits } => Step::EditContext {
                round: self.state.round + 1,
                edits: edits.clone(),
            },
            Phase::Compacting { request, .. } => Step::Compact(request.clone()),
            Phase::AwaitingModel { reminders } => Step::CallModel {
                round: self.state.round,
                reminders: reminders.clone(),
            },
            Phase::Tools {
                slots,
                stop_checked,
                ..
            } => {
                let pending: Vec<usize> = slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.run && s.status.is_none())
                    .map(|(i, _)| i)
                    .collect();
                let asking: Vec<ApprovalRequest> = pending
                    .iter()
                    .filter(|&&i| slots[i].approval == Some(ApprovalState::Pending))
                    .map(|&i| self.approval_request(i, &slots[i]))
                    .collect();
                if !asking.is_empty() {
                    return Step::Approve(asking);
                }
                if pending.is_empty() {
                    if self.hooks.stop_when && !*stop_checked && self.stop_when_decides(slots) {
                        return Step::CheckStop;
                    }
                    self.finish_round(None);
                    return self.next_step();
                }
                Step::RunTools(self.schedule(slots, pending))
            }
            Phase::Ready => {
                if self.state.round >= self.state.round_limit {
                    if self.hooks.on_round_limit {
                        self.state.phase = Phase::RoundLimit;
                        return Step::DecideRoundLimit;
                    }
                    self.finish_max_rounds();
                    return Step::Finished;
                }
                if let Some(step) = self.context_step() {
                    return step;
                }
                if self.hooks.reminders {
                    self.state.phase = Phase::Reminders;
                    return Step::GetReminders;
                }
                self.start_round(Vec::new())
            }
        }
    }

    fn start_round(&mut self, reminders: Vec<String>) -> Step {
        self.state.round += 1;
        self.context_round_started(&reminders);
        emit!(
            self,
            Event::RoundStarted {
                round: self.state.round,
                message_count: self.state.messages.len() + reminders.len(),
            }
        );
        self.state.phase = Phase::AwaitingModel {
            reminders: reminders.clone(),
        };
        Step::CallModel {
            round: self.state.round,
            reminders,
        }
    }

    fn phase_error(&self, input: &'static str, detail: String) -> PhaseError {
        PhaseError {
            input,
            phase: self.state.phase.describe(),
            detail,
        }
    }

    /// Refuses a model input unless the model call of round `round` is what the loop waits
    /// for.
    fn awaiting_model(&self, input: &'static str, round: u32) -> Result<(), PhaseError> {
        if !matches!(self.state.phase, Phase::AwaitingModel { .. }) {
            return Err(self.phase_error(input, String::new()));
        }
        if round != self.state.round {
            return Err(self.phase_error(
                input,
                format!(
                    "; it is for round {round}, the model call is round {}",
                    self.state.round
                ),
            ));
        }
        Ok(())
    }

    /// Refuses an input for a round's calls unless it is for the current round.
    fn in_round(&self, input: &'static str, round: u32) -> Result<(), PhaseError> {
        if round != self.state.round {
            return Err(self.phase_error(
                input,
                format!(
                    "; it is for round {round}, the loop is at round {}",
                    self.state.round
                ),
            ));
        }
        Ok(())
    }

    /// [`Input::RemindersGiven`].
    fn reminders_given(&mut self, round: u32, reminders: Vec<String>) -> Result<(), PhaseError> {
        if self.state.phase != Phase::Reminders {
            return Err(self.phase_error("reminders_given", String::new()));
        }
        if round != self.state.round + 1 {
            return Err(self.phase_error(
                "reminders_given",
                format!(
                    "; it is for round {round}, round {} is about to start",
                    self.state.round + 1
                ),
            ));
        }
        self.start_round(reminders);
        Ok(())
    }

    /// Takes an input (see [`Input`]): what the driver did for the [`Step`] it was given, a
    /// hook's or a person's answer, an interruption. An input the machine is not waiting for
    /// (another phase, another round, a call that does not wait for it) is refused with a
    /// [`PhaseError`], and the machine is unchanged.
    pub fn handle(&mut self, input: Input) -> Result<(), PhaseError> {
        let kind = input.kind();
        match input {
            Input::Started { .. } => Err(self.phase_error(kind, "; a run starts once".into())),
            Input::ToolsChanged { round, tools } => self.tools_changed(round, tools),
            Input::RemindersGiven { round, reminders } => self.reminders_given(round, reminders),
            Input::StopChecked { round, signal } => {
                self.in_round(kind, round)?;
                self.stop_checked(signal)
            }
            Input::ModelRequested { round } => self.awaiting_model(kind, round),
            Input::ModelResponded {
                round,
                response,
                cost,
                subjects,
            } => {
                self.awaiting_model(kind, round)?;
                self.model_responded(response, cost, subjects)
            }
            Input::ModelFailed { round, message } => {
                self.awaiting_model(kind, round)?;
                self.model_failed(message);
                Ok(())
            }
            Input::ToolStarted {
                round,
                index,
                call_id,
            } => {
                self.in_round(kind, round)?;
                self.tool_started(index, &call_id)
            }
            Input::ToolFinished {
                round,
                index,
                result,
                duration_ms,
                attempts,
            } => {
                self.in_round(kind, round)?;
                self.tool_finished(index, result, duration_ms, attempts)
            }
            Input::ToolUnknown { round, index } => {
                self.in_round(kind, round)?;
                self.tool_outcome_unknown(index)
            }
            Input::ApprovalDecided {
                round,
                index,
                decision,
            } => {
                self.in_round(kind, round)?;
                self.approval_decided(index, &decision)
            }
            Input::RoundLimitDecided { decision } => self.round_limit_decided(decision),
            Input::Interrupted { why } => {
                self.interrupt(why);
                Ok(())
            }
            // A log written with a context policy, replayed by a machine without one: the
            // view is the transcript, and these change nothing.
            Input::ContextEdited { .. }
            | Input::Compacted { .. }
            | Input::CompactionFailed { .. }
                if self.state.context.is_none() =>
            {
                Ok(())
            }
            Input::ContextEdited { round, edits } => self.context_edited(round, edits),
            Input::Compacted { round, compaction } => self.compacted(round, compaction),
            Input::CompactionFailed { round, message } => self.compaction_failed(round, message),
            Input::ContextOverflowed { round, overflow } => {
                self.awaiting_model(kind, round)?;
                self.context_overflowed(overflow);
                Ok(())
            }
            Input::Finished => Ok(()),
        }
    }
}
