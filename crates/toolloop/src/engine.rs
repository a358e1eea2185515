//! The loop as a state machine with no I/O.
//!
//! [`Machine::next_step`] says what to do now ([`Step`]): ask the `reminders` hook, call the
//! model, run these tool calls on this schedule, ask `stop_when`, ask `on_round_limit`, or
//! nothing more (finished). A driver (see [`crate::agent`]) does the I/O, calls the hooks, and
//! reports back with [`Machine::reminders_given`], [`Machine::model_responded`],
//! [`Machine::model_failed`], [`Machine::tool_finished`], [`Machine::stop_checked`],
//! [`Machine::round_limit_decided`] or [`Machine::interrupt`]. The machine never calls user
//! code: a hook's answer is an input like a model's response, so the run log records it and a
//! replay uses the recorded answer. An input the machine is not waiting for is refused with a
//! [`PhaseError`]. The machine's [`LoopState`] is a plain serializable value, so a run can be
//! saved and rebuilt from it.
//!
//! Invariants the machine keeps:
//! - every tool call gets exactly one result, appended in the model's call order, whatever
//!   happens (invalid, duplicate, over budget, cancelled, cut off);
//! - every call of a round runs before any terminal check;
//! - budgets are checked before each model call and before each tool call executes.

use crate::approval::{Decision, PendingApproval, Verdict};
use crate::config::{
    Hooks, InvalidCallPolicy, LoopConfig, LoopView, ParallelMode, RoundCall, RoundLimitDecision,
    TruncatedCallPolicy,
};
use crate::event::Event;
use crate::journal::Record;
use crate::message::{AssistantMessage, Message, ToolCall, ToolResult};
use crate::model::{FinishReason, ModelError, ModelResponse};
use crate::outcome::{CallStatus, ErrorCode, ExecutedCall, Outcome, RunError, StopReason};
use crate::output::{OutputCheck, OutputSchema, OutputSchemaError};
use crate::result;
use crate::tool::{ToolError, ToolOutput};
use crate::toolbox::{CatalogEntry, Toolbox};
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

/// What the driver should do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A round is about to start and a `reminders` hook is set: call it with
    /// [`Machine::view`] and report its strings with [`Machine::reminders_given`].
    GetReminders,
    /// Call the model with the conversation ([`Machine::messages`]), the toolbox's specs, and
    /// these transient reminders.
    CallModel {
        /// The round (1-based).
        round: u32,
        /// Reminders for this request only.
        reminders: Vec<String>,
    },
    /// Run these calls, batch after batch; report each with [`Machine::tool_finished`].
    RunTools(Vec<Batch>),
    /// Every call of the round ran and a `stop_when` hook is set: call it with
    /// [`Machine::round_calls`] and report its answer with [`Machine::stop_checked`].
    CheckStop,
    /// `max_rounds` is reached: ask `on_round_limit` and report with
    /// [`Machine::round_limit_decided`].
    DecideRoundLimit,
    /// Calls of the round wait for their approval, before any call of the round runs: report
    /// a [`Decision`] for each with [`Machine::approval_decided`] (by the rule in the verdict,
    /// or by asking the approval handler when the verdict is [`Verdict::Ask`]), or, with no
    /// handler, stop with [`Machine::await_approval`].
    Approve(Vec<ApprovalRequest>),
    /// The run is over; take the outcome.
    Finished,
}

/// A call waiting for its approval, and what the policy says of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    /// The call.
    pub pending: PendingApproval,
    /// The policy's verdict: a rule decides, or a person is asked.
    pub verdict: Verdict,
}

/// Where a call stands with its approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// It waits for a decision and does not run before one.
    Pending,
    /// It was approved.
    Approved,
}

/// Calls that run together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Whether the calls run at the same time (at most `max_parallel` at once).
    pub parallel: bool,
    /// Indices of the calls in the round (see [`Machine::round_call`]).
    pub calls: Vec<usize>,
}

/// Why the driver interrupted the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interrupt {
    /// The caller cancelled.
    Cancelled,
    /// The run's timeout passed.
    Timeout,
    /// The run log could not be written, so the run cannot safely go on.
    StoreFailed,
}

/// One call of the current round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    /// The call (shared with the driver while it runs).
    pub call: Arc<ToolCall>,
    /// Whether it is to run (`false`: it was settled without running).
    pub run: bool,
    /// Whether it may run alongside other parallel-safe calls.
    pub parallel_safe: bool,
    /// What happened, once known.
    pub status: Option<CallStatus>,
    /// The result content, once known.
    pub content: Option<String>,
    /// The tool's own result, when it ran.
    pub output: Option<Result<ToolOutput, ToolError>>,
    /// How long it ran, in milliseconds.
    pub duration_ms: u64,
    /// Attempts made.
    pub attempts: u32,
    /// Whether this call spent the tool-call budget's last place (it was refused for that).
    pub over_budget: bool,
    /// Its approval, when the policy does not simply allow it (see [`crate::approval`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalState>,
}

/// Where the machine is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// Ready for the next model call.
    Ready,
    /// Waiting for the `reminders` hook, before the next round starts.
    Reminders,
    /// A model call is in flight (resuming repeats it with the same reminders).
    AwaitingModel {
        /// The reminders sent with it.
        reminders: Vec<String>,
    },
    /// Waiting for `on_round_limit`.
    RoundLimit,
    /// Tool calls of a round are running.
    Tools {
        /// Why the model stopped.
        finish_reason: FinishReason,
        /// This round's usage; `None` when the server did not report it.
        usage: Option<Usage>,
        /// The calls.
        slots: Vec<Slot>,
        /// Whether `stop_when` answered for this round.
        #[serde(default)]
        stop_checked: bool,
        /// `stop_when`'s signal, when it gave one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop_signal: Option<String>,
    },
    /// The run is over.
    Done {
        /// Why.
        stop_reason: StopReason,
        /// The terminal signal.
        signal: Option<String>,
        /// The final answer.
        text: Option<String>,
        /// The final answer's validated JSON value, when an output schema was set.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<serde_json::Value>,
        /// The error of a failed run.
        error: Option<RunError>,
    },
}

impl Phase {
    /// What the machine is doing, in words.
    fn describe(&self) -> &'static str {
        match self {
            Phase::Ready => "ready for the next round",
            Phase::Reminders => "waiting for the reminders hook",
            Phase::AwaitingModel { .. } => "waiting for the model",
            Phase::RoundLimit => "waiting for on_round_limit",
            Phase::Tools { .. } => "running the round's tool calls",
            Phase::Done { .. } => "finished",
        }
    }
}

/// An input the machine was not waiting for (a driver's mistake, or a run log that does not fit
/// the run). The machine's state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` does not fit here: the loop is {phase}{detail}")]
pub struct PhaseError {
    /// The input given (`model_responded`, `tool_finished`, …).
    pub input: &'static str,
    /// What the machine was doing.
    pub phase: &'static str,
    /// More about the mismatch (which call, say); empty or starting with `; `.
    pub detail: String,
}

/// Why a run's records do not replay onto the run (see [`Machine::replay`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The log is empty or does not begin with [`Record::Started`].
    #[error("the first record is not `started`")]
    NotStarted,
    /// A stored record does not parse (damaged, or written by an incompatible version).
    #[error("record {record} does not parse: {message}")]
    Unreadable {
        /// The record's position in the log (0 is `started`).
        record: usize,
        /// The parser's message.
        message: String,
    },
    /// A record came where the loop could not take it.
    #[error("record {record}: {source}")]
    Unfit {
        /// The record's position in the log (0 is `started`).
        record: usize,
        /// The input the record stands for, and what the loop was doing.
        #[source]
        source: PhaseError,
    },
}

/// Which hooks the driver has. The machine asks for their answers; it never calls them.
#[derive(Debug, Clone, Copy, Default)]
struct HookSet {
    stop_when: bool,
    on_round_limit: bool,
    reminders: bool,
}

impl From<&Hooks> for HookSet {
    fn from(h: &Hooks) -> Self {
        HookSet {
            stop_when: h.stop_when.is_some(),
            on_round_limit: h.on_round_limit.is_some(),
            reminders: h.reminders.is_some(),
        }
    }
}

/// The machine's whole state: serializable, so a run can be saved and rebuilt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    /// The transcript.
    pub messages: Vec<Message>,
    /// Model calls made.
    pub round: u32,
    /// The round limit in force (`max_rounds` plus extensions).
    pub round_limit: u32,
    /// Tool calls executed.
    pub tool_calls_executed: u32,
    /// Invalid calls in a row.
    pub consecutive_invalid: u32,
    /// Usage summed over the model calls whose server reported it; `None` until one did.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Model calls that returned without reporting usage (their tokens are not in `usage`).
    #[serde(default)]
    pub calls_without_usage: u32,
    /// Cost so far, while every model call's cost was known.
    pub cost: Option<f64>,
    /// Every settled call.
    pub calls: Vec<ExecutedCall>,
    /// Where the machine is.
    pub phase: Phase,
    /// The calls that wait for approval, when the run stopped for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_approvals: Vec<PendingApproval>,
    /// The schema the final answer must match, if any (see [`crate::output`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<OutputSchema>,
}

/// The loop's state machine.
pub struct Machine {
    config: Arc<LoopConfig>,
    hooks: HookSet,
    toolbox: Arc<Toolbox>,
    state: LoopState,
    events: Vec<Event>,
    events_on: bool,
    /// Fingerprints of the call ids in the conversation (see [`id_key`]), so that checking a new
    /// call's id costs the same however long the conversation is.
    call_ids: foldhash::HashSet<u64>,
    /// The compiled output schema (`state.output_schema`), or why it does not compile.
    output_check: Option<Result<Arc<OutputCheck>, String>>,
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

fn duplicate_warning(name: &str) -> String {
    let name = result::shorten(name, result::ECHO_CHARS);
    result::error_content(&format!(
        "Not run: `{name}` was already called with these same arguments, and its result is \
         above. Repeating the call looks like a loop: try a different approach, or give your \
         final answer if you have enough information."
    ))
}

/// Candidate `n` (from 2) for replacing the call id `original`, in its shape: an id of letters
/// and digits only (some servers accept nothing else, in a fixed length) stays letters and
/// digits of the same length, its end replaced by `n` in base 36; any other id gets `_n`
/// appended (`toolu_01A` becomes `toolu_01A_2`); no id at all becomes `call_n`. An id longer
/// than 64 characters is cut to its first 64 first.
fn replacement_id(original: &str, n: u64) -> String {
    let mut suffix = Vec::new();
    let mut k = n;
    while k > 0 {
        suffix.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(k % 36) as usize]);
        k /= 36;
    }
    suffix.reverse();
    let suffix = String::from_utf8(suffix).unwrap_or_default();
    let head: String = original.chars().take(64).collect();
    if head.is_empty() {
        return format!("call_{suffix}");
    }
    if head.bytes().all(|b| b.is_ascii_alphanumeric()) && head.len() > suffix.len() {
        return format!("{}{suffix}", &head[..head.len() - suffix.len()]);
    }
    format!("{head}_{suffix}")
}

impl Machine {
    /// A machine for a new run over `messages`. Of `hooks`, only which ones are set matters:
    /// the machine asks for their answers with [`Step`]s, and the driver calls them.
    pub fn new(
        config: Arc<LoopConfig>,
        hooks: Hooks,
        toolbox: Arc<Toolbox>,
        messages: Vec<Message>,
    ) -> Self {
        let round_limit = config.max_rounds;
        let call_ids = conversation_ids(&messages);
        let mut m = Machine {
            config,
            hooks: HookSet::from(&hooks),
            toolbox,
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
            },
            events: Vec::new(),
            events_on: true,
            call_ids,
            output_check: None,
        };
        emit!(
            m,
            Event::RunStarted {
                message_count: m.state.messages.len(),
            }
        );
        m
    }

    /// A machine rebuilt from a saved state.
    pub fn resume(
        config: Arc<LoopConfig>,
        hooks: Hooks,
        toolbox: Arc<Toolbox>,
        state: LoopState,
    ) -> Self {
        Machine {
            config,
            hooks: HookSet::from(&hooks),
            toolbox,
            call_ids: conversation_ids(&state.messages),
            output_check: compile_output(state.output_schema.as_ref()),
            state,
            events: Vec::new(),
            events_on: true,
        }
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

    /// The transcript so far.
    pub fn messages(&self) -> &[Message] {
        &self.state.messages
    }

    /// The toolbox.
    pub fn toolbox(&self) -> &Arc<Toolbox> {
        &self.toolbox
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
                    let limit = self.state.round_limit;
                    self.finish(
                        StopReason::MaxRounds,
                        None,
                        Some(RunError {
                            code: ErrorCode::MaxIterationsReached,
                            message: format!(
                                "max rounds reached ({limit}) before the model gave a final answer"
                            ),
                        }),
                    );
                    return Step::Finished;
                }
                if self.hooks.reminders {
                    self.state.phase = Phase::Reminders;
                    return Step::GetReminders;
                }
                self.start_round(Vec::new())
            }
        }
    }

    /// What the policy says of a call of the round: its approval subject and verdict.
    fn weigh(&self, call: &ToolCall) -> (String, Verdict) {
        let (subject, default, required) = match self.toolbox.get(&call.name) {
            Some(tool) => (
                tool.approval_subject(&call.arguments),
                tool.default_approval(),
                tool.approval_required(&call.arguments),
            ),
            None => (
                call.canonical_arguments(),
                crate::approval::Action::Allow,
                false,
            ),
        };
        let verdict = match self.config.approvals.verdict(&call.name, &subject, default) {
            // Only a person approves such a call (Tool::approval_required).
            Verdict::Allow { .. } if required => Verdict::Ask,
            v => v,
        };
        (subject, verdict)
    }

    fn approval_request(&self, index: usize, slot: &Slot) -> ApprovalRequest {
        let (subject, verdict) = self.weigh(&slot.call);
        ApprovalRequest {
            pending: PendingApproval {
                round: self.state.round,
                index,
                call: (*slot.call).clone(),
                subject,
            },
            verdict,
        }
    }

    /// A call's approval was decided ([`Step::Approve`]). The decision must be bound to the
    /// call (its id, tool and canonical arguments, see [`Decision::binds`]): a decision for
    /// another call or for other arguments is refused, and the call still waits. An approved
    /// call runs; a denied one does not, and its result is `denied: <reason>`.
    pub fn approval_decided(
        &mut self,
        index: usize,
        decision: &Decision,
    ) -> Result<(), PhaseError> {
        let round = self.state.round;
        let slot = Self::pending_slot(&mut self.state.phase, "approval_decided", index, true)?;
        if slot.approval != Some(ApprovalState::Pending) {
            return Err(PhaseError {
                input: "approval_decided",
                phase: "running the round's tool calls",
                detail: format!("; call {index} does not wait for an approval"),
            });
        }
        if !decision.binds(&slot.call) {
            return Err(PhaseError {
                input: "approval_decided",
                phase: "running the round's tool calls",
                detail: format!(
                    "; the decision is for another call or other arguments than call {index}: \
                     an approval holds only for the exact call"
                ),
            });
        }
        if decision.approved {
            slot.approval = Some(ApprovalState::Approved);
        } else {
            slot.approval = None;
            slot.run = false;
            slot.status = Some(CallStatus::Denied);
            slot.content = Some(result::error_content(&decision.denial()));
        }
        let by = match &decision.by {
            crate::approval::DecidedBy::Rule { rule } => rule.clone(),
            crate::approval::DecidedBy::Person => "person".to_string(),
        };
        let (call_id, name) = (slot.call.id.clone(), slot.call.name.clone());
        emit!(
            self,
            Event::ApprovalDecided {
                round,
                call_id,
                name,
                approved: decision.approved,
                by,
            }
        );
        Ok(())
    }

    /// No approval handler: the run stops with [`StopReason::AwaitingApproval`], listing the
    /// calls still waiting ([`Outcome::pending_approvals`]). Nothing of the round has run. The
    /// run log holds the round, so the run continues from here on resume, once decisions are
    /// recorded (or asked).
    pub fn await_approval(&mut self) -> Result<(), PhaseError> {
        let waiting: Vec<PendingApproval> = match &self.state.phase {
            Phase::Tools { slots, .. } => slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.status.is_none() && s.approval == Some(ApprovalState::Pending))
                .map(|(i, s)| self.approval_request(i, s).pending)
                .collect(),
            _ => Vec::new(),
        };
        if waiting.is_empty() {
            return Err(self.phase_error(
                "await_approval",
                "; no call of the round waits for an approval".into(),
            ));
        }
        let n = waiting.len();
        let names: Vec<String> = waiting
            .iter()
            .map(|p| result::shorten(&p.call.name, result::ECHO_CHARS).into_owned())
            .collect();
        self.state.pending_approvals = waiting;
        self.finish(
            StopReason::AwaitingApproval,
            None,
            Some(RunError {
                code: ErrorCode::AwaitingApproval,
                message: format!(
                    "{n} tool call(s) wait for approval ({}); approve or deny them, then resume \
                     the run",
                    names.join(", ")
                ),
            }),
        );
        Ok(())
    }

    fn start_round(&mut self, reminders: Vec<String>) -> Step {
        self.state.round += 1;
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

    /// The tools changed (see [`crate::tool_source`]): before the run's first model call, or
    /// while a model call waits to be made ([`Step::CallModel`], before it is made). That call
    /// offers `toolbox`'s tools, and the calls it returns are checked and run against them.
    /// Emits [`Event::ToolsChanged`] when the catalog differs (a toolbox with the same catalog
    /// just takes the old one's place).
    pub fn tools_changed(&mut self, toolbox: Arc<Toolbox>) -> Result<(), PhaseError> {
        let before_first = self.state.round == 0 && self.state.phase == Phase::Ready;
        if !before_first && !matches!(self.state.phase, Phase::AwaitingModel { .. }) {
            return Err(self.phase_error("tools_changed", String::new()));
        }
        if self.events_on && !self.toolbox.same_catalog(&toolbox) {
            let old = self.toolbox.catalog();
            let new = toolbox.catalog();
            let named = |list: &[CatalogEntry], name: &str| list.iter().any(|e| e.name == name);
            let added = new
                .iter()
                .filter(|e| !named(&old, &e.name))
                .map(|e| e.name.clone())
                .collect();
            let removed = old
                .iter()
                .filter(|e| !named(&new, &e.name))
                .map(|e| e.name.clone())
                .collect();
            let changed = new
                .iter()
                .filter(|e| old.iter().any(|o| o.name == e.name && o != *e))
                .map(|e| e.name.clone())
                .collect();
            self.events.push(Event::ToolsChanged {
                round: self.state.round,
                added,
                removed,
                changed,
            });
        }
        self.toolbox = toolbox;
        Ok(())
    }

    /// The `reminders` hook answered ([`Step::GetReminders`]): the round starts with these
    /// strings sent along with its request.
    pub fn reminders_given(&mut self, reminders: Vec<String>) -> Result<(), PhaseError> {
        if self.state.phase != Phase::Reminders {
            return Err(self.phase_error("reminders_given", String::new()));
        }
        self.start_round(reminders);
        Ok(())
    }

    /// The calls of the current round and what they returned, for `stop_when`
    /// ([`Step::CheckStop`]); empty outside a round.
    pub fn round_calls(&self) -> Vec<RoundCall<'_>> {
        match &self.state.phase {
            Phase::Tools { slots, .. } => slots
                .iter()
                .map(|s| RoundCall {
                    call: &s.call,
                    result: s.output.as_ref(),
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// `stop_when` answered ([`Step::CheckStop`]): a signal ends the run after this round.
    pub fn stop_checked(&mut self, signal: Option<String>) -> Result<(), PhaseError> {
        let asked = match &self.state.phase {
            Phase::Tools {
                slots,
                stop_checked,
                ..
            } => {
                self.hooks.stop_when
                    && !*stop_checked
                    && slots.iter().all(|s| !s.run || s.status.is_some())
                    && self.stop_when_decides(slots)
            }
            _ => false,
        };
        if !asked {
            return Err(self.phase_error(
                "stop_checked",
                "; stop_when is asked once, after every call of the round ran".into(),
            ));
        }
        if let Phase::Tools {
            stop_checked,
            stop_signal,
            ..
        } = &mut self.state.phase
        {
            *stop_checked = true;
            *stop_signal = signal;
        }
        Ok(())
    }

    /// Whether `stop_when`'s answer can matter for this round: nothing ends the run before it
    /// (the strict policy's invalid call, a terminal tool's signal).
    fn stop_when_decides(&self, slots: &[Slot]) -> bool {
        let strict = self.config.invalid_calls == InvalidCallPolicy::Strict
            && slots.iter().any(|s| s.status == Some(CallStatus::Invalid));
        !strict && self.terminal_signal(slots).is_none()
    }

    fn schedule(&self, slots: &[Slot], pending: Vec<usize>) -> Vec<Batch> {
        let max_parallel = self.config.max_parallel.max(1);
        if max_parallel == 1 {
            return pending
                .iter()
                .map(|&i| Batch {
                    parallel: false,
                    calls: vec![i],
                })
                .collect();
        }
        match self.config.parallel_mode {
            ParallelMode::AllOrNothing => {
                if pending.len() > 1 && pending.iter().all(|&i| slots[i].parallel_safe) {
                    vec![Batch {
                        parallel: true,
                        calls: pending,
                    }]
                } else {
                    pending
                        .iter()
                        .map(|&i| Batch {
                            parallel: false,
                            calls: vec![i],
                        })
                        .collect()
                }
            }
            ParallelMode::Mixed => {
                if pending.len() > 1 && pending.iter().all(|&i| slots[i].parallel_safe) {
                    // One batch of them all, as the loop below would make.
                    return vec![Batch {
                        parallel: true,
                        calls: pending,
                    }];
                }
                let mut batches: Vec<Batch> = Vec::new();
                for i in pending {
                    let safe = slots[i].parallel_safe;
                    match batches.last_mut() {
                        Some(b) if safe && b.parallel => b.calls.push(i),
                        _ => batches.push(Batch {
                            parallel: safe,
                            calls: vec![i],
                        }),
                    }
                }
                for b in &mut batches {
                    if b.calls.len() == 1 {
                        b.parallel = false;
                    }
                }
                batches
            }
        }
    }

    fn add_cost(&mut self, cost: Option<f64>) {
        self.state.cost = match (self.state.cost, cost) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
    }

    /// The model answered. `cost` is this call's cost, `None` when unknown.
    pub fn model_responded(
        &mut self,
        response: ModelResponse,
        cost: Option<f64>,
    ) -> Result<(), PhaseError> {
        if !matches!(self.state.phase, Phase::AwaitingModel { .. }) {
            return Err(self.phase_error("model_responded", String::new()));
        }
        let round = self.state.round;
        let usage = response.usage;
        match usage {
            Some(u) => *self.state.usage.get_or_insert_with(Usage::default) += u,
            None => self.state.calls_without_usage += 1,
        }
        self.add_cost(if usage.is_some() { cost } else { None });
        let ModelResponse {
            text,
            mut tool_calls,
            finish_reason,
            parts,
            malformed_call,
            ..
        } = response;
        self.unique_call_ids(&mut tool_calls);

        if tool_calls.is_empty() {
            self.state
                .messages
                .push(Message::Assistant(AssistantMessage {
                    text: text.clone(),
                    tool_calls: Vec::new(),
                    parts,
                }));
            self.round_finished_event(finish_reason, usage);
            if let Some(reason) = malformed_call {
                // The explanation may quote the server or the model at any length.
                let reason = result::cap(reason, self.config.max_result_chars);
                emit!(
                    self,
                    Event::MalformedToolCall {
                        round,
                        reason: reason.clone(),
                    }
                );
                self.state.messages.push(Message::user(reason.clone()));
                self.state.consecutive_invalid += 1;
                self.state.phase = Phase::Ready;
                self.check_invalid_budget(ErrorCode::ParseError, &reason);
                return Ok(());
            }
            if finish_reason == FinishReason::Length {
                // An answer the output-token limit cut short is kept, but it is not an answer.
                self.finish(
                    StopReason::OutputTruncated,
                    text,
                    Some(RunError {
                        code: ErrorCode::OutputTruncated,
                        message: "the output-token limit cut the answer short; the partial text \
                                  is kept. Raise the output limit or ask for a shorter answer"
                            .into(),
                    }),
                );
                return Ok(());
            }
            if let Some(check) = &self.output_check {
                let checked = match check {
                    Ok(check) => check.check(text.as_deref().unwrap_or_default()),
                    Err(e) => Err(crate::output::InvalidOutput(vec![format!(
                        "the output schema cannot be used ({e})"
                    )])),
                };
                match checked {
                    Ok(value) => {
                        self.finish(StopReason::Answered, text, None);
                        if let Phase::Done { output, .. } = &mut self.state.phase {
                            *output = Some(value);
                        }
                    }
                    Err(invalid) => self.invalid_output(round, invalid),
                }
                return Ok(());
            }
            self.finish(StopReason::Answered, text, None);
            return Ok(());
        }

        let mut slots = Vec::with_capacity(tool_calls.len());
        let mut planned = 0u32;
        let mut strict_stop = false;
        let truncated = finish_reason == FinishReason::Length;
        for call in &tool_calls {
            emit!(
                self,
                Event::ToolCallRequested {
                    round,
                    call: call.clone(),
                }
            );
            if call
                .provider_data
                .as_ref()
                .and_then(|d| d.get("repaired"))
                .and_then(|v| v.as_bool())
                == Some(true)
            {
                emit!(
                    self,
                    Event::ToolCallRepaired {
                        round,
                        call: call.clone(),
                    }
                );
            }
            let mut slot = Slot {
                call: Arc::new(call.clone()),
                run: false,
                parallel_safe: false,
                status: None,
                content: None,
                output: None,
                duration_ms: 0,
                attempts: 0,
                over_budget: false,
                approval: None,
            };
            let settle = |slot: &mut Slot, status: CallStatus, content: String| {
                slot.status = Some(status);
                slot.content = Some(content);
            };
            if strict_stop {
                settle(
                    &mut slot,
                    CallStatus::Skipped,
                    result::error_content(
                        "Not run: the run stopped at an earlier invalid call in this turn.",
                    ),
                );
                slots.push(slot);
                continue;
            }
            if truncated && call.invalid_arguments.is_some() {
                let why = format!(
                    "Not run: the output-token limit cut this call to `{}` short before its \
                     arguments were complete. Make the call again with shorter arguments.",
                    result::shorten(&call.name, result::ECHO_CHARS)
                );
                emit!(
                    self,
                    Event::InvalidToolCall {
                        round,
                        call: call.clone(),
                        reason: why.clone(),
                    }
                );
                settle(
                    &mut slot,
                    CallStatus::Truncated,
                    result::error_content(&why),
                );
                slots.push(slot);
                continue;
            }
            if let Some(reason) = self.invalid_reason(call) {
                emit!(
                    self,
                    Event::InvalidToolCall {
                        round,
                        call: call.clone(),
                        reason: reason.clone(),
                    }
                );
                settle(
                    &mut slot,
                    CallStatus::Invalid,
                    result::error_content(&reason),
                );
                if self.config.invalid_calls == InvalidCallPolicy::Strict {
                    strict_stop = true;
                }
                slots.push(slot);
                continue;
            }
            if self.config.detect_duplicates && self.is_duplicate(call, &slots) {
                emit!(
                    self,
                    Event::DuplicateDetected {
                        round,
                        call: call.clone(),
                    }
                );
                settle(
                    &mut slot,
                    CallStatus::Duplicate,
                    duplicate_warning(&call.name),
                );
                slots.push(slot);
                continue;
            }
            if self.state.tool_calls_executed + planned >= self.config.max_tool_calls {
                let max = self.config.max_tool_calls;
                settle(
                    &mut slot,
                    CallStatus::Skipped,
                    result::error_content(&format!(
                        "Not run: the tool-call budget of this run ({max}) is spent."
                    )),
                );
                slot.over_budget = true;
                slots.push(slot);
                continue;
            }
            planned += 1;
            slot.run = true;
            if !matches!(self.weigh(call).1, Verdict::Allow { rule: None }) {
                slot.approval = Some(ApprovalState::Pending);
            }
            slot.parallel_safe = self
                .toolbox
                .get(&call.name)
                .is_some_and(|t| t.parallel_safe());
            slots.push(slot);
        }
        self.state
            .messages
            .push(Message::Assistant(AssistantMessage {
                text,
                tool_calls,
                parts,
            }));
        self.state.phase = Phase::Tools {
            finish_reason,
            usage,
            slots,
            stop_checked: false,
            stop_signal: None,
        };
        Ok(())
    }

    /// Why a call cannot run, if it cannot: in words for the model, the call's name shortened
    /// and the whole capped at the result limit (the reason becomes the call's result, and an
    /// argument error may quote the arguments).
    /// Gives each call an id that no other call of the conversation has: a call whose id is
    /// empty, repeats an earlier call's id in the same reply, or is already in the conversation
    /// gets a fresh id made from it (see [`replacement_id`]), and its result will carry that id.
    /// Every provider's responses come through here, so no transcript ever holds two calls with
    /// one id (which repairing a reloaded transcript would have to drop). The new ids depend on
    /// the response and the conversation only, so replaying a run log gives the same ones.
    ///
    /// No provider needs the model's own id back once the call and its result carry the same
    /// new one: the OpenAI and Anthropic APIs match a result to its call within the request
    /// (Anthropic only asks for `[a-zA-Z0-9_-]` ids, and some OpenAI-compatible servers for
    /// nine letters and digits: [`replacement_id`] keeps an id's shape), and Gemini's own call
    /// id is kept apart in the call's provider data and sent back as it came.
    fn unique_call_ids(&mut self, calls: &mut [ToolCall]) {
        let index = &self.call_ids;
        let in_conversation = |messages: &[Message], id: &str| {
            index.contains(&id_key(id))
                && messages.iter().any(|m| match m {
                    Message::Assistant(a) => a.tool_calls.iter().any(|c| c.id == id),
                    Message::Tool(r) => r.call_id == id,
                    _ => false,
                })
        };
        let clash = |calls: &[ToolCall], i: usize, messages: &[Message]| {
            let id = &calls[i].id;
            id.is_empty() || calls[..i].iter().any(|c| &c.id == id) || in_conversation(messages, id)
        };
        let mut replaced = Vec::new();
        for i in 0..calls.len() {
            if !clash(calls, i, &self.state.messages) {
                continue;
            }
            let original = std::mem::take(&mut calls[i].id);
            // The first candidate free of the conversation and of every id of this reply (the
            // later calls' own ids included, so that they keep theirs).
            let fresh = (2u64..)
                .map(|n| replacement_id(&original, n))
                .find(|id| {
                    !calls.iter().any(|c| &c.id == id) && !in_conversation(&self.state.messages, id)
                })
                .unwrap_or_default();
            replaced.push((original, fresh.clone()));
            calls[i].id = fresh;
        }
        self.call_ids.extend(calls.iter().map(|c| id_key(&c.id)));
        for (original, id) in replaced {
            emit!(
                self,
                Event::CallIdReplaced {
                    round: self.state.round,
                    original: result::shorten(&original, result::ECHO_CHARS).into_owned(),
                    id,
                }
            );
        }
    }

    fn invalid_reason(&self, call: &ToolCall) -> Option<String> {
        let reason = self.invalid_reason_uncapped(call)?;
        Some(result::cap(reason, self.config.max_result_chars))
    }

    fn invalid_reason_uncapped(&self, call: &ToolCall) -> Option<String> {
        let name = result::shorten(&call.name, result::ECHO_CHARS);
        if self.toolbox.get(&call.name).is_none() {
            let names: Vec<&str> = self.toolbox.names().collect();
            let available = if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            };
            return Some(format!(
                "Unknown tool `{name}`. The tools that exist are: {available}."
            ));
        }
        if let Some(raw) = &call.invalid_arguments {
            let err = serde_json::from_str::<serde_json::Value>(raw)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_else(|| "not a JSON object".into());
            return Some(format!(
                "The arguments for `{name}` are not valid JSON ({err}). Send the arguments as \
                 one JSON object that matches the tool's schema."
            ));
        }
        if let Err(e) = self.toolbox.validate(&call.name, &call.arguments) {
            return Some(format!(
                "Invalid arguments for `{name}`: {e}. Fix them to match the tool's schema."
            ));
        }
        None
    }

    fn is_duplicate(&self, call: &ToolCall, this_round: &[Slot]) -> bool {
        let window = self.config.duplicate_window;
        if window == 0 {
            return false;
        }
        let same = |c: &ToolCall| c.name == call.name && c.same_arguments(call);
        this_round
            .iter()
            .rev()
            .filter(|s| s.run)
            .map(|s| &*s.call)
            .chain(
                self.state
                    .calls
                    .iter()
                    .rev()
                    .filter(|c| c.status.executed())
                    .map(|c| &c.call),
            )
            .take(window)
            .any(same)
    }

    /// A tool call finished (after its retries). `index` is its place in the round.
    pub fn tool_finished(
        &mut self,
        index: usize,
        outcome: Result<ToolOutput, ToolError>,
        duration_ms: u64,
        attempts: u32,
    ) -> Result<(), PhaseError> {
        let round = self.state.round;
        let max_chars = self.config.max_result_chars;
        let slot = Self::pending_slot(&mut self.state.phase, "tool_finished", index, false)?;
        let status = if outcome.is_ok() {
            CallStatus::Ok
        } else {
            CallStatus::Failed
        };
        slot.content = Some(result::cap(result::serialize(&outcome), max_chars));
        slot.status = Some(status);
        slot.output = Some(outcome);
        slot.duration_ms = duration_ms;
        slot.attempts = attempts;
        self.state.tool_calls_executed += 1;
        emit!(
            self,
            Event::ToolFinished {
                round,
                call_id: slot.call.id.clone(),
                name: slot.call.name.clone(),
                success: status == CallStatus::Ok,
                status,
                duration_ms,
            }
        );
        Ok(())
    }

    /// Call `index` of the round, when it is to run and has no result yet.
    fn pending_slot<'a>(
        phase: &'a mut Phase,
        input: &'static str,
        index: usize,
        unapproved: bool,
    ) -> Result<&'a mut Slot, PhaseError> {
        let described = phase.describe();
        let error = |detail: String| PhaseError {
            input,
            phase: described,
            detail,
        };
        let Phase::Tools { slots, .. } = phase else {
            return Err(error(format!(
                "; no round's calls are running (call {index})"
            )));
        };
        let count = slots.len();
        match slots.get_mut(index) {
            None => Err(error(format!(
                "; the round has {count} calls, there is no call {index}"
            ))),
            Some(s) if !s.run => Err(error(format!("; call {index} was settled without running"))),
            Some(s) if s.status.is_some() => {
                Err(error(format!("; call {index} already has its result")))
            }
            Some(s) if !unapproved && s.approval == Some(ApprovalState::Pending) => Err(error(
                format!("; call {index} waits for its approval and cannot run before it"),
            )),
            Some(s) => Ok(s),
        }
    }

    /// A call that was in flight at a crash has side effects and is not run again: it gets an
    /// "outcome unknown" result the model can read.
    pub fn tool_outcome_unknown(&mut self, index: usize) -> Result<(), PhaseError> {
        let round = self.state.round;
        let slot = Self::pending_slot(&mut self.state.phase, "tool_outcome_unknown", index, false)?;
        slot.status = Some(CallStatus::Unknown);
        slot.content = Some(result::error_content(
            "Outcome unknown: the run stopped while this call was in flight, and the call \
             changes the world, so it was not run again. It may or may not have taken effect; \
             check before calling it again.",
        ));
        emit!(
            self,
            Event::ToolFinished {
                round,
                call_id: slot.call.id.clone(),
                name: slot.call.name.clone(),
                success: false,
                status: CallStatus::Unknown,
                duration_ms: 0,
            }
        );
        Ok(())
    }

    /// Rebuilds a machine from a run's records (see [`crate::journal`]). Returns the machine and
    /// the calls of the current round that were started but never finished (in flight at a
    /// crash).
    ///
    /// No hook is called: the answers of `reminders`, `stop_when` and `on_round_limit` are
    /// taken from their records. (Logs written before `reminders` and `stop_when` answers were
    /// recorded replay as if they gave no reminders and no signal, which is what a run that
    /// went on did see from `stop_when`.) A record that does not fit the run is an error.
    pub fn replay(
        config: Arc<LoopConfig>,
        hooks: Hooks,
        toolbox: Arc<Toolbox>,
        records: &[Record],
    ) -> Result<(Machine, Vec<usize>), ReplayError> {
        let mut iter = records.iter();
        let Some(Record::Started {
            messages,
            output_schema,
        }) = iter.next()
        else {
            return Err(ReplayError::NotStarted);
        };
        // The tools that run calls now (a logged catalog judges calls by its own entries).
        let live = toolbox.clone();
        let mut m = Machine::new(config, hooks, toolbox, messages.clone());
        // The schema the run was started with, even if the agent's has changed since.
        m.state.output_schema = output_schema.clone();
        m.output_check = compile_output(output_schema.as_ref());
        let mut in_flight: Vec<usize> = Vec::new();
        for (i, record) in iter.enumerate() {
            let unfit = |source: PhaseError| ReplayError::Unfit {
                record: i + 1,
                source,
            };
            let phase = m.state.phase.describe();
            let out_of_place = |input: &'static str, detail: String| {
                unfit(PhaseError {
                    input,
                    phase,
                    detail,
                })
            };
            match record {
                Record::Started { .. } => {
                    return Err(out_of_place("started", "; a run starts once".into()));
                }
                Record::ToolsChanged { round, tools } => {
                    // Before the first model call (round 0), or before the round's call.
                    if *round > 0 {
                        m.model_call_at(*round, "tools_changed")
                            .map_err(|(e, detail)| {
                                e.map_or_else(unfit, |i| out_of_place(i, detail))
                            })?;
                    }
                    let logged = Toolbox::from_catalog(tools, &live).map_err(|e| {
                        ReplayError::Unreadable {
                            record: i + 1,
                            message: e.to_string(),
                        }
                    })?;
                    m.tools_changed(Arc::new(logged)).map_err(unfit)?;
                }
                Record::RemindersGiven { reminders, .. } => {
                    m.settle_unrecorded(false).map_err(unfit)?;
                    m.reminders_given(reminders.clone()).map_err(unfit)?;
                }
                Record::StopChecked { signal, .. } => {
                    m.stop_checked(signal.clone()).map_err(unfit)?;
                }
                Record::ModelRequested { round } => {
                    m.model_call_at(*round, "model_requested")
                        .map_err(|(e, detail)| e.map_or_else(unfit, |i| out_of_place(i, detail)))?;
                }
                // The request's record is left out when it was written with the response.
                Record::ModelResponded {
                    round,
                    response,
                    cost,
                } => {
                    m.model_call_at(*round, "model_responded")
                        .map_err(|(e, detail)| e.map_or_else(unfit, |i| out_of_place(i, detail)))?;
                    m.model_responded(response.clone(), *cost).map_err(unfit)?
                }
                Record::ModelFailed { round, message } => {
                    m.model_call_at(*round, "model_failed")
                        .map_err(|(e, detail)| e.map_or_else(unfit, |i| out_of_place(i, detail)))?;
                    m.model_failed(&ModelError::Other(message.clone()))
                        .map_err(unfit)?
                }
                Record::ToolStarted { index, .. } => {
                    // Only a call that is to run and has no result yet can start. One that
                    // started was allowed then (a policy that differs now does not change
                    // what happened).
                    let slot = Self::pending_slot(&mut m.state.phase, "tool_started", *index, true)
                        .map_err(unfit)?;
                    if slot.approval == Some(ApprovalState::Pending) {
                        slot.approval = Some(ApprovalState::Approved);
                    }
                    if !in_flight.contains(index) {
                        in_flight.push(*index);
                    }
                }
                Record::ToolFinished {
                    index,
                    result,
                    duration_ms,
                    attempts,
                    ..
                } => {
                    m.ran_in_history(*index);
                    m.tool_finished(*index, result.clone(), *duration_ms, *attempts)
                        .map_err(unfit)?;
                    in_flight.retain(|i| i != index);
                }
                Record::ToolUnknown { index, .. } => {
                    m.ran_in_history(*index);
                    m.tool_outcome_unknown(*index).map_err(unfit)?;
                    in_flight.retain(|i| i != index);
                }
                Record::RoundLimitDecided { decision } => {
                    m.settle_unrecorded(false).map_err(unfit)?;
                    if m.next_step() != Step::DecideRoundLimit {
                        return Err(out_of_place(
                            "round_limit_decided",
                            "; the round limit was not reached".into(),
                        ));
                    }
                    m.round_limit_decided(decision.clone()).map_err(unfit)?;
                }
                Record::ApprovalDecided {
                    index, decision, ..
                } => {
                    // A decision that does not fit the call (other arguments) is not applied:
                    // the call is asked about again.
                    let _ = m.approval_decided(*index, decision);
                }
                Record::Interrupted { why } => m.interrupt(*why),
                Record::Finished => {}
            }
        }
        m.events.clear();
        Ok((m, in_flight))
    }

    /// During replay, before a model call's record: brings the loop to that call (past the
    /// hooks' answers the log does not hold) and checks it is the loop's next step, round
    /// `round`. On failure, either the machine's refusal or the input and what was wrong.
    fn model_call_at(
        &mut self,
        round: u32,
        input: &'static str,
    ) -> Result<(), (Result<&'static str, PhaseError>, String)> {
        self.settle_unrecorded(true)
            .map_err(|e| (Err(e), String::new()))?;
        match self.next_step() {
            Step::CallModel { round: r, .. } if r == round => Ok(()),
            other => Err((
                Ok(input),
                format!("; round {round} requested, but the loop was at {other:?}"),
            )),
        }
    }

    /// During replay: a call the log shows running was allowed when it ran.
    fn ran_in_history(&mut self, index: usize) {
        if let Phase::Tools { slots, .. } = &mut self.state.phase
            && let Some(slot) = slots.get_mut(index)
            && slot.approval == Some(ApprovalState::Pending)
        {
            slot.approval = Some(ApprovalState::Approved);
        }
    }

    /// During replay, before a record that comes after a hook's answer: a `stop_when` (and,
    /// with `reminders_too`, a `reminders`) answer the log does not hold was given by a run
    /// that did not record them; it is taken as no signal (no reminders).
    fn settle_unrecorded(&mut self, reminders_too: bool) -> Result<(), PhaseError> {
        loop {
            match self.next_step() {
                Step::CheckStop => self.stop_checked(None)?,
                Step::GetReminders if reminders_too => self.reminders_given(Vec::new())?,
                _ => return Ok(()),
            }
        }
    }

    /// The model call failed (after the adapter's retries).
    pub fn model_failed(&mut self, error: &ModelError) -> Result<(), PhaseError> {
        if !matches!(self.state.phase, Phase::AwaitingModel { .. }) {
            return Err(self.phase_error("model_failed", String::new()));
        }
        self.finish(
            StopReason::ModelError,
            None,
            Some(RunError {
                code: ErrorCode::LlmCallFailed,
                message: error.to_string(),
            }),
        );
        Ok(())
    }

    /// `on_round_limit` decided ([`Step::DecideRoundLimit`]).
    pub fn round_limit_decided(&mut self, decision: RoundLimitDecision) -> Result<(), PhaseError> {
        if self.state.phase != Phase::RoundLimit {
            return Err(self.phase_error("round_limit_decided", String::new()));
        }
        match decision {
            RoundLimitDecision::Extend(n) if n > 0 => {
                self.state.round_limit += n;
                self.state.phase = Phase::Ready;
            }
            RoundLimitDecision::Signal(signal) => {
                self.finish(StopReason::TerminalSignal, None, None);
                self.set_signal(signal);
            }
            _ => {
                let limit = self.state.round_limit;
                self.finish(
                    StopReason::MaxRounds,
                    None,
                    Some(RunError {
                        code: ErrorCode::MaxIterationsReached,
                        message: format!(
                            "max rounds reached ({limit}) before the model gave a final answer"
                        ),
                    }),
                );
            }
        }
        Ok(())
    }

    /// Stops the run now (a run already finished stays as it is). Calls still in flight get a synthetic "cancelled" result, so the
    /// transcript stays valid.
    pub fn interrupt(&mut self, why: Interrupt) {
        if matches!(self.state.phase, Phase::Done { .. }) {
            return;
        }
        let (reason, code, message) = match why {
            Interrupt::Cancelled => (
                StopReason::Cancelled,
                ErrorCode::Cancelled,
                "the run was cancelled",
            ),
            Interrupt::Timeout => (
                StopReason::Timeout,
                ErrorCode::Timeout,
                "the run's timeout passed",
            ),
            Interrupt::StoreFailed => (
                StopReason::StoreFailed,
                ErrorCode::StoreFailed,
                "the run log could not be written",
            ),
        };
        if let Phase::Tools { slots, .. } = &mut self.state.phase {
            for slot in slots.iter_mut().filter(|s| s.status.is_none()) {
                slot.status = Some(CallStatus::Cancelled);
                slot.content = Some(result::error_content(&format!(
                    "Cancelled: {message} before this call finished."
                )));
            }
            self.finish_round(Some(()));
        }
        self.finish(
            reason,
            None,
            Some(RunError {
                code,
                message: message.to_string(),
            }),
        );
    }

    fn round_finished_event(&mut self, finish_reason: FinishReason, usage: Option<Usage>) {
        emit!(
            self,
            Event::RoundFinished {
                round: self.state.round,
                finish_reason,
                usage,
                total_usage: self.state.usage,
            }
        );
    }

    /// Appends the round's results in call order, records the calls, and runs the terminal
    /// checks (unless `interrupted`).
    fn finish_round(&mut self, interrupted: Option<()>) {
        let Phase::Tools {
            finish_reason,
            usage,
            slots,
            stop_signal,
            ..
        } = std::mem::replace(&mut self.state.phase, Phase::Ready)
        else {
            return;
        };
        // Every result the model reads is capped here, whatever settled it: a tool's output, an
        // error that quotes the model's input, a notice.
        let max_chars = self.config.max_result_chars;
        let mut slots = slots;
        for slot in &mut slots {
            if let Some(content) = slot.content.take() {
                slot.content = Some(result::cap(content, max_chars));
            }
        }
        let round = self.state.round;
        let mut invalid_code = None;
        let mut truncated = false;
        let mut over_budget = false;
        for slot in &slots {
            match slot.status.unwrap_or(CallStatus::Cancelled) {
                CallStatus::Ok | CallStatus::Failed => self.state.consecutive_invalid = 0,
                CallStatus::Invalid => {
                    self.state.consecutive_invalid += 1;
                    invalid_code = Some(if self.toolbox.get(&slot.call.name).is_none() {
                        ErrorCode::ToolNotFound
                    } else {
                        ErrorCode::InvalidToolCall
                    });
                }
                CallStatus::Truncated => {
                    truncated = true;
                    if self.config.on_truncated_call == TruncatedCallPolicy::Continue {
                        self.state.consecutive_invalid += 1;
                    }
                }
                _ => {}
            }
            over_budget |= slot.over_budget;
        }
        // What ends the run, decided while the round's calls are at hand: the strict policy's
        // first invalid call, then a terminal tool's signal, then `stop_when`.
        let strict = match (invalid_code, self.config.invalid_calls) {
            (Some(code), InvalidCallPolicy::Strict) if interrupted.is_none() => {
                let message = slots
                    .iter()
                    .find(|s| s.status == Some(CallStatus::Invalid))
                    .and_then(|s| s.content.clone())
                    .unwrap_or_default();
                Some(RunError { code, message })
            }
            _ => None,
        };
        let signal = if interrupted.is_none() && strict.is_none() {
            self.terminal_signal(&slots).or(stop_signal)
        } else {
            None
        };
        // The calls move into the history; each result goes to the transcript and the history.
        for slot in slots {
            let status = slot.status.unwrap_or(CallStatus::Cancelled);
            let content = slot
                .content
                .unwrap_or_else(|| result::error_content("Not run."));
            let images = match slot.output {
                Some(Ok(output)) => output.images,
                _ => Vec::new(),
            };
            self.state.messages.push(Message::Tool(ToolResult {
                call_id: slot.call.id.clone(),
                name: slot.call.name.clone(),
                is_error: status != CallStatus::Ok,
                content: content.clone(),
                images,
            }));
            self.state.calls.push(ExecutedCall {
                round,
                call: Arc::unwrap_or_clone(slot.call),
                status,
                content,
                duration_ms: slot.duration_ms,
                attempts: slot.attempts,
            });
        }
        self.round_finished_event(finish_reason, usage);
        if interrupted.is_some() {
            return;
        }
        if let Some(error) = strict {
            self.finish(StopReason::TooManyInvalidCalls, None, Some(error));
            return;
        }
        if let Some(signal) = signal {
            self.finish(StopReason::TerminalSignal, None, None);
            self.set_signal(signal);
            return;
        }
        if truncated && self.config.on_truncated_call == TruncatedCallPolicy::Stop {
            self.finish(
                StopReason::OutputTruncated,
                None,
                Some(RunError {
                    code: ErrorCode::OutputTruncated,
                    message: "the output-token limit cut a tool call short; raise the output \
                              limit or ask for smaller steps"
                        .into(),
                }),
            );
            return;
        }
        if over_budget {
            let max = self.config.max_tool_calls;
            self.finish(
                StopReason::MaxToolCalls,
                None,
                Some(RunError {
                    code: ErrorCode::MaxToolCallsReached,
                    message: format!(
                        "max tool calls reached ({max}) and the model asked for more; possible \
                         infinite loop"
                    ),
                }),
            );
            return;
        }
        let code = invalid_code.unwrap_or(ErrorCode::InvalidToolCall);
        self.check_invalid_budget(code, "the model kept making invalid tool calls");
    }

    /// A terminal tool's signal in this round, if any (it ends the run before `stop_when` is
    /// asked).
    fn terminal_signal(&self, slots: &[Slot]) -> Option<String> {
        slots.iter().find_map(|s| match &s.output {
            Some(Ok(out)) => out.signal.clone().or_else(|| {
                self.toolbox
                    .get(&s.call.name)
                    .filter(|t| t.terminal())
                    .map(|_| s.call.name.clone())
            }),
            _ => None,
        })
    }

    fn check_invalid_budget(&mut self, code: ErrorCode, what: &str) {
        let over = match self.config.invalid_calls {
            InvalidCallPolicy::Strict => self.state.consecutive_invalid > 0,
            InvalidCallPolicy::Feedback { budget } => self.state.consecutive_invalid > budget,
        };
        if over {
            let n = self.state.consecutive_invalid;
            let message = if code == ErrorCode::InvalidOutput {
                format!(
                    "{n} invalid tool calls or final answers in a row; the last answer does not \
                     match the output schema: {what}"
                )
            } else {
                format!("{n} invalid tool calls in a row: {what}")
            };
            self.finish(
                StopReason::TooManyInvalidCalls,
                None,
                Some(RunError { code, message }),
            );
        }
    }

    /// A final answer failed the output schema: the errors go back to the model as a user
    /// message, and the answer counts as an invalid call.
    fn invalid_output(&mut self, round: u32, invalid: crate::output::InvalidOutput) {
        let errors = invalid.to_string();
        let name = self
            .state
            .output_schema
            .as_ref()
            .map(|s| result::shorten(&s.name, result::ECHO_CHARS).into_owned())
            .unwrap_or_default();
        let feedback = result::cap(
            format!(
                "Your final answer does not match the required output schema `{name}`: {errors}. \
                 Reply again with only a JSON value that matches the schema (or call a tool if \
                 you need more information)."
            ),
            self.config.max_result_chars,
        );
        emit!(
            self,
            Event::InvalidOutput {
                round,
                errors: errors.clone(),
            }
        );
        self.state.messages.push(Message::user(feedback));
        self.state.consecutive_invalid += 1;
        self.state.phase = Phase::Ready;
        let errors = result::cap(errors, self.config.max_result_chars);
        self.check_invalid_budget(ErrorCode::InvalidOutput, &errors);
    }

    fn set_signal(&mut self, signal: String) {
        if let Phase::Done { signal: s, .. } = &mut self.state.phase {
            *s = Some(signal);
        }
    }

    fn finish(&mut self, stop_reason: StopReason, text: Option<String>, error: Option<RunError>) {
        // A failed run's error tells how it stopped; a run with no error succeeded.
        let stop_reason = match &error {
            Some(e) => e.code.stop_reason(),
            None => stop_reason,
        };
        debug_assert_eq!(error.is_none(), stop_reason.is_success(), "{stop_reason:?}");
        self.state.phase = Phase::Done {
            stop_reason,
            signal: None,
            text,
            output: None,
            error,
        };
    }

    /// Whether the run is over.
    pub fn is_finished(&self) -> bool {
        matches!(self.state.phase, Phase::Done { .. })
    }

    /// The outcome of a finished run (an unfinished one reads as cancelled).
    pub fn into_outcome(mut self, duration_ms: u64) -> Outcome {
        if !self.is_finished() {
            self.interrupt(Interrupt::Cancelled);
        }
        let LoopState {
            messages,
            round,
            usage,
            calls_without_usage,
            cost,
            calls,
            phase,
            pending_approvals,
            ..
        } = self.state;
        // With no reported usage there is nothing to price: the cost is unknown, not zero.
        let cost = if usage.is_some() { cost } else { None };
        let Phase::Done {
            stop_reason,
            signal,
            text,
            output,
            error,
        } = phase
        else {
            unreachable!("interrupt always finishes the run")
        };
        // A run that did not answer still shows the last thing the model wrote.
        let text = if stop_reason == StopReason::Answered {
            text
        } else {
            text.or_else(|| {
                messages.iter().rev().find_map(|m| match m {
                    Message::Assistant(a) => a.text.clone().filter(|t| !t.is_empty()),
                    _ => None,
                })
            })
        };
        Outcome {
            success: stop_reason.is_success(),
            stop_reason,
            text,
            output,
            signal,
            rounds: round,
            tool_calls: calls,
            messages,
            usage,
            calls_without_usage,
            cost,
            duration_ms,
            error,
            run_id: None,
            pending_approvals,
        }
    }
}

/// The machine driven by hand, with no runtime and no I/O: each test feeds model responses, tool
/// results and hook answers, and checks the steps the machine asks for.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::{ToolContext, tool_fn};
    use serde_json::{Value, json};

    /// A machine over one tool, `echo`, and a conversation of one user message.
    struct Harness {
        m: Machine,
    }

    /// Hooks that are set but must never be called: the machine only asks for their answers.
    fn hooks_never_called() -> Hooks {
        fn stop_when(_: &[RoundCall<'_>]) -> Option<String> {
            panic!("the machine called stop_when")
        }
        fn on_round_limit(
            _: LoopView<'_>,
        ) -> futures::future::BoxFuture<'static, RoundLimitDecision> {
            panic!("the machine called on_round_limit")
        }
        fn reminders(_: LoopView<'_>) -> Vec<String> {
            panic!("the machine called reminders")
        }
        Hooks {
            stop_when: Some(Arc::new(stop_when)),
            on_round_limit: Some(Arc::new(on_round_limit)),
            reminders: Some(Arc::new(reminders)),
        }
    }

    impl Harness {
        fn new(config: LoopConfig, hooks: Hooks, messages: Vec<Message>) -> Self {
            let mut toolbox = Toolbox::new();
            toolbox
                .add(tool_fn(
                    "echo",
                    "Echoes.",
                    |a: Value, _: ToolContext| async move {
                        Ok::<_, ToolError>(ToolOutput::text(a.to_string()))
                    },
                ))
                .unwrap();
            let m = Machine::new(Arc::new(config), hooks, Arc::new(toolbox), messages);
            Harness { m }
        }

        fn plain() -> Self {
            Harness::new(
                LoopConfig::default(),
                Hooks::default(),
                vec![Message::user("go")],
            )
        }

        fn expect_call_model(&mut self) -> (u32, Vec<String>) {
            match self.m.next_step() {
                Step::CallModel { round, reminders } => (round, reminders),
                other => panic!("expected a model call, got {other:?}"),
            }
        }

        fn respond(&mut self, response: ModelResponse) {
            self.m.model_responded(response, None).unwrap();
        }

        fn expect_tools(&mut self) -> Vec<usize> {
            match self.m.next_step() {
                Step::RunTools(batches) => batches.into_iter().flat_map(|b| b.calls).collect(),
                other => panic!("expected tool calls, got {other:?}"),
            }
        }

        fn finish_tools(&mut self) {
            for i in self.expect_tools() {
                self.m
                    .tool_finished(i, Ok(ToolOutput::text("ok")), 1, 1)
                    .unwrap();
            }
        }
    }

    fn echo(id: &str, n: i64) -> ToolCall {
        let mut c = ToolCall::new("echo", json!({ "n": n }));
        c.id = id.into();
        c
    }

    #[test]
    fn hooks_are_steps_the_driver_answers_and_the_machine_never_calls() {
        let mut h = Harness::new(
            LoopConfig::default(),
            hooks_never_called(),
            vec![Message::user("go")],
        );
        assert_eq!(h.m.next_step(), Step::GetReminders);
        assert_eq!(h.m.view().round, 1, "the view is of the round about to run");
        h.m.reminders_given(vec!["be brief".into()]).unwrap();
        assert_eq!(h.expect_call_model(), (1, vec!["be brief".to_string()]));
        h.respond(ModelResponse::tool_calls(vec![echo("a", 1)]));
        h.finish_tools();
        assert_eq!(h.m.next_step(), Step::CheckStop);
        let calls = h.m.round_calls();
        assert_eq!(calls.len(), 1);
        assert!(matches!(calls[0].result, Some(Ok(_))));
        h.m.stop_checked(Some("enough".into())).unwrap();
        assert_eq!(h.m.next_step(), Step::Finished);
        let out = h.m.into_outcome(0);
        assert_eq!(out.stop_reason, StopReason::TerminalSignal);
        assert_eq!(out.signal.as_deref(), Some("enough"));
    }

    #[test]
    fn stop_when_without_a_signal_lets_the_run_go_on_and_is_asked_once() {
        let mut h = Harness::new(
            LoopConfig::default(),
            Hooks {
                reminders: None,
                ..hooks_never_called()
            },
            vec![Message::user("go")],
        );
        h.expect_call_model();
        h.respond(ModelResponse::tool_calls(vec![echo("a", 1)]));
        h.finish_tools();
        assert_eq!(h.m.next_step(), Step::CheckStop);
        h.m.stop_checked(None).unwrap();
        assert!(h.m.stop_checked(None).is_err(), "asked once");
        assert_eq!(h.expect_call_model().0, 2);
    }

    #[test]
    fn inputs_in_the_wrong_phase_are_refused_and_change_nothing() {
        let mut h = Harness::plain();
        let refused = |h: &mut Harness, f: &dyn Fn(&mut Machine) -> Result<(), PhaseError>| {
            let before = h.m.state().clone();
            let e = f(&mut h.m).expect_err("refused");
            assert_eq!(h.m.state(), &before, "{e}");
            e
        };
        let e = refused(&mut h, &|m| {
            m.model_responded(ModelResponse::text("x"), None)
        });
        assert_eq!(e.input, "model_responded");
        assert!(e.to_string().contains("ready for the next round"), "{e}");
        refused(&mut h, &|m| {
            m.tool_finished(0, Ok(ToolOutput::text("x")), 0, 1)
        });
        refused(&mut h, &|m| m.model_failed(&ModelError::Other("x".into())));

        h.expect_call_model();
        refused(&mut h, &|m| m.reminders_given(vec![]));
        refused(&mut h, &|m| m.stop_checked(None));
        refused(&mut h, &|m| m.round_limit_decided(RoundLimitDecision::Stop));
        refused(&mut h, &|m| m.tool_outcome_unknown(0));
        h.respond(ModelResponse::tool_calls(vec![echo("a", 1)]));
        refused(&mut h, &|m| {
            m.model_responded(ModelResponse::text("x"), None)
        });
        // The tools change only before a model call, never under a round's calls.
        let e = refused(&mut h, &|m| m.tools_changed(Arc::new(Toolbox::new())));
        assert_eq!(e.input, "tools_changed");
        let e = refused(&mut h, &|m| {
            m.tool_finished(5, Ok(ToolOutput::text("x")), 0, 1)
        });
        assert!(e.to_string().contains("no call 5"), "{e}");
        h.m.tool_finished(0, Ok(ToolOutput::text("x")), 0, 1)
            .unwrap();
        let e = refused(&mut h, &|m| {
            m.tool_finished(0, Ok(ToolOutput::text("y")), 0, 1)
        });
        assert!(e.to_string().contains("already has its result"), "{e}");
        // No stop_when hook: nothing to answer.
        refused(&mut h, &|m| m.stop_checked(None));
        h.expect_call_model();
        // While the model call waits to be made, it takes the new tools.
        h.m.tools_changed(Arc::new(Toolbox::new())).unwrap();
        assert!(h.m.toolbox().is_empty());
        h.respond(ModelResponse::text("done"));
        refused(&mut h, &|m| {
            m.model_responded(ModelResponse::text("x"), None)
        });
        refused(&mut h, &|m| m.tools_changed(Arc::new(Toolbox::new())));
        assert_eq!(h.m.next_step(), Step::Finished);
    }

    #[test]
    fn call_ids_are_made_unique_on_arrival() {
        // An id from the conversation the run starts with, an id repeated in the reply, and no
        // id at all.
        let earlier = Message::Assistant(AssistantMessage {
            text: None,
            tool_calls: vec![echo("x", 0)],
            parts: vec![],
        });
        let result = Message::Tool(ToolResult {
            call_id: "x".into(),
            name: "echo".into(),
            content: "{}".into(),
            is_error: false,
            images: Vec::new(),
        });
        let mut h = Harness::new(
            LoopConfig::default(),
            Hooks::default(),
            vec![Message::user("go"), earlier, result],
        );
        h.expect_call_model();
        h.respond(ModelResponse::tool_calls(vec![
            echo("x", 1),
            echo("y", 2),
            echo("y", 3),
            echo("", 4),
            echo("x_2", 5),
        ]));
        let ids: Vec<String> = (0..5)
            .map(|i| h.m.round_call(i).unwrap().id.clone())
            .collect();
        // `x_2` is the reply's own id, so the first `x` gets the next free one.
        assert_eq!(ids, ["x_3", "y", "y_2", "call_2", "x_2"]);
        let replaced: Vec<(String, String)> =
            h.m.take_events()
                .filter_map(|e| match e {
                    Event::CallIdReplaced { original, id, .. } => Some((original, id)),
                    _ => None,
                })
                .collect();
        assert_eq!(replaced.len(), 3, "{replaced:?}");
        h.finish_tools();
        h.expect_call_model();
        h.respond(ModelResponse::text("done"));
        let out = h.m.into_outcome(0);
        assert!(crate::transcript::check_transcript(&out.messages).is_empty());
    }

    #[test]
    fn replacement_ids_keep_their_shape() {
        assert_eq!(replacement_id("toolu_01A", 2), "toolu_01A_2");
        assert_eq!(replacement_id("aB3dE5gH1", 2), "aB3dE5gH2");
        assert_eq!(replacement_id("aB3dE5gH1", 40), "aB3dE5g14");
        assert_eq!(replacement_id("", 3), "call_3");
        assert_eq!(replacement_id(&"z".repeat(1000), 2).len(), 64);
    }

    fn city_schema() -> OutputSchema {
        OutputSchema::new(
            "City",
            json!({"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}),
        )
    }

    #[test]
    fn a_final_answer_is_validated_against_the_output_schema() {
        let mut h = Harness::plain();
        h.m.set_output_schema(Some(city_schema())).unwrap();
        h.expect_call_model();
        // Tool calls still work while a schema is set.
        h.respond(ModelResponse::tool_calls(vec![echo("a", 1)]));
        h.finish_tools();
        h.expect_call_model();
        h.respond(ModelResponse::text("```json\n{\"name\": \"Lyon\"}\n```"));
        assert_eq!(h.m.next_step(), Step::Finished);
        let out = h.m.into_outcome(0);
        assert_eq!(out.stop_reason, StopReason::Answered);
        assert_eq!(out.output, Some(json!({"name": "Lyon"})));
        #[derive(serde::Deserialize)]
        struct City {
            name: String,
        }
        assert_eq!(out.parse::<City>().unwrap().name, "Lyon");
    }

    #[test]
    fn an_invalid_answer_goes_back_with_the_errors_and_a_corrected_one_is_taken() {
        let mut h = Harness::plain();
        h.m.set_output_schema(Some(city_schema())).unwrap();
        h.expect_call_model();
        h.respond(ModelResponse::text("{\"name\": 7}"));
        let invalid: Vec<String> =
            h.m.take_events()
                .filter_map(|e| match e {
                    Event::InvalidOutput { errors, .. } => Some(errors),
                    _ => None,
                })
                .collect();
        assert_eq!(invalid.len(), 1);
        assert!(invalid[0].contains("/name"), "{invalid:?}");
        // The answer stays in the transcript, followed by the errors for the model.
        match h.m.messages().last() {
            Some(Message::User { content, .. }) => {
                assert!(
                    content.contains("`City`") && content.contains("/name"),
                    "{content}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(h.expect_call_model().0, 2);
        h.respond(ModelResponse::text("{\"name\": \"Lyon\"}"));
        let out = h.m.into_outcome(0);
        assert!(out.success);
        assert_eq!(out.output, Some(json!({"name": "Lyon"})));
        assert_eq!(out.text.as_deref(), Some("{\"name\": \"Lyon\"}"));
    }

    #[test]
    fn answers_that_keep_failing_the_schema_stop_the_run_over_the_budget() {
        let mut h = Harness::new(
            LoopConfig {
                invalid_calls: InvalidCallPolicy::Feedback { budget: 1 },
                ..LoopConfig::default()
            },
            Hooks::default(),
            vec![Message::user("go")],
        );
        h.m.set_output_schema(Some(city_schema())).unwrap();
        h.expect_call_model();
        h.respond(ModelResponse::text("Lyon"));
        h.expect_call_model();
        h.respond(ModelResponse::text("{}"));
        assert_eq!(h.m.next_step(), Step::Finished);
        let out = h.m.into_outcome(0);
        assert_eq!(out.stop_reason, StopReason::TooManyInvalidCalls);
        let error = out.error.clone().unwrap();
        assert_eq!(error.code, ErrorCode::InvalidOutput);
        assert!(
            error.message.contains("2 invalid") && error.message.contains("required"),
            "{}",
            error.message
        );
        assert_eq!(out.output, None);
        assert!(out.parse::<Value>().is_err());
        // Both answers and both errors are in the transcript.
        assert_eq!(out.messages.len(), 5, "{:?}", out.messages);
        assert_eq!(out.text.as_deref(), Some("{}"));
    }

    #[test]
    fn the_strict_policy_stops_at_the_first_invalid_answer() {
        let mut h = Harness::new(
            LoopConfig {
                invalid_calls: InvalidCallPolicy::Strict,
                ..LoopConfig::default()
            },
            Hooks::default(),
            vec![Message::user("go")],
        );
        h.m.set_output_schema(Some(city_schema())).unwrap();
        h.expect_call_model();
        h.respond(ModelResponse::text("not json"));
        let out = h.m.into_outcome(0);
        assert_eq!(out.error.unwrap().code, ErrorCode::InvalidOutput);
    }

    #[test]
    fn a_schema_that_does_not_compile_is_refused() {
        let mut h = Harness::plain();
        let bad = OutputSchema::new("bad", json!({"type": 12}));
        assert!(h.m.set_output_schema(Some(bad)).is_err());
        assert!(h.m.output_schema().is_none());
        // Without a schema any text is the answer.
        h.expect_call_model();
        h.respond(ModelResponse::text("anything"));
        let out = h.m.into_outcome(0);
        assert!(out.success && out.output.is_none());
    }

    #[test]
    fn a_mixed_round_runs_parallel_safe_calls_together_and_others_alone() {
        let mut h = Harness::plain();
        h.expect_call_model();
        h.respond(ModelResponse::tool_calls(vec![echo("a", 1), echo("b", 2)]));
        // `echo` is not marked parallel-safe: one batch per call, in the model's order.
        match h.m.next_step() {
            Step::RunTools(batches) => {
                assert_eq!(batches.len(), 2);
                assert!(batches.iter().all(|b| !b.parallel && b.calls.len() == 1));
                assert_eq!(batches[0].calls, [0]);
            }
            other => panic!("{other:?}"),
        }
    }
}
