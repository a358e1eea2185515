//! The machine's state: a plain serializable value ([`LoopState`]), where the loop is
//! ([`Phase`]) and the calls of the current round ([`Slot`]); and the error of an input that does
//! not fit it ([`PhaseError`]).

use super::*;

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
    /// The conversation as sent and what the context policy did, when one is set (see
    /// [`crate::context::policy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Box<ContextState>>,
}

/// Where the machine is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
#[non_exhaustive]
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
    /// Waiting for the context policy's edits to be logged ([`Input::ContextEdited`]).
    EditingContext {
        /// The edits.
        edits: ContextEdits,
    },
    /// Waiting for a summary ([`Input::Compacted`]).
    Compacting {
        /// What to summarise.
        request: Box<CompactRequest>,
        /// For a compaction after a refused call: the call's reminders (it is retried).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry: Option<Vec<String>>,
    },
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
    pub(super) fn describe(&self) -> &'static str {
        match self {
            Phase::Ready => "ready for the next round",
            Phase::Reminders => "waiting for the reminders hook",
            Phase::AwaitingModel { .. } => "waiting for the model",
            Phase::RoundLimit => "waiting for on_round_limit",
            Phase::EditingContext { .. } => "editing the context",
            Phase::Compacting { .. } => "compacting the context",
            Phase::Tools { .. } => "running the round's tool calls",
            Phase::Done { .. } => "finished",
        }
    }
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
    /// Its approval subject, as the driver gave it with the response, where the policy weighs
    /// it ([`Input::ModelResponded`]): the rules weighed the call by it, and a person asked
    /// about it is shown it. Before the call runs, the driver checks that its tool would still
    /// touch the same (a call of the round before it may have changed a link), see
    /// [`Machine::weighed_subject`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Subject>,
    /// Whether it started ([`Input::ToolStarted`]): a call that started and has no result is
    /// in flight ([`Machine::in_flight`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub started: bool,
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
