//! The machine's state: a plain serializable value ([`LoopState`]), where the loop is
//! ([`Phase`]) and the calls of the current round ([`Slot`]); and the error of an input that does
//! not fit it ([`PhaseError`]).

use super::*;

/// The machine's whole state, read through its methods. It is saved and given back as a
/// [`Snapshot`] ([`Machine::snapshot`], [`Machine::resume`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    /// The transcript.
    pub(crate) messages: Vec<Message>,
    /// Model calls made.
    pub(crate) round: u32,
    /// The round limit in force (`max_rounds` plus extensions).
    pub(crate) round_limit: u32,
    /// Tool calls executed.
    pub(crate) tool_calls_executed: u32,
    /// Invalid calls in a row.
    pub(crate) consecutive_invalid: u32,
    /// Usage summed over the model calls whose server reported it; `None` until one did.
    #[serde(default)]
    pub(crate) usage: Option<Usage>,
    /// Model calls that returned without reporting usage (their tokens are not in `usage`).
    #[serde(default)]
    pub(crate) calls_without_usage: u32,
    /// Cost so far, while every model call's cost was known.
    pub(crate) cost: Option<f64>,
    /// Every settled call.
    pub(crate) calls: Vec<ExecutedCall>,
    /// Where the machine is.
    pub(crate) phase: Phase,
    /// The calls that wait for approval, when the run stopped for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) pending_approvals: Vec<PendingApproval>,
    /// The schema the final answer must match, if any (see [`crate::output`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) output_schema: Option<OutputSchema>,
    /// The conversation as sent and what the context policy did, when one is set (see
    /// [`crate::context::policy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) context: Option<Box<ContextState>>,
}

impl LoopState {
    /// The transcript.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Model calls made.
    pub fn round(&self) -> u32 {
        self.round
    }

    /// The round limit in force (`max_rounds` plus extensions).
    pub fn round_limit(&self) -> u32 {
        self.round_limit
    }

    /// Tool calls executed.
    pub fn tool_calls_executed(&self) -> u32 {
        self.tool_calls_executed
    }

    /// Invalid calls in a row.
    pub fn consecutive_invalid(&self) -> u32 {
        self.consecutive_invalid
    }

    /// Usage summed over the model calls whose server reported it; `None` until one did.
    pub fn usage(&self) -> Option<&Usage> {
        self.usage.as_ref()
    }

    /// Model calls that returned without reporting usage (their tokens are not in
    /// [`usage`](Self::usage)).
    pub fn calls_without_usage(&self) -> u32 {
        self.calls_without_usage
    }

    /// Cost so far, while every model call's cost was known.
    pub fn cost(&self) -> Option<f64> {
        self.cost
    }

    /// Every settled call.
    pub fn calls(&self) -> &[ExecutedCall] {
        &self.calls
    }

    /// Where the machine is.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The calls that wait for approval, when the run stopped for them.
    pub fn pending_approvals(&self) -> &[PendingApproval] {
        &self.pending_approvals
    }

    /// The schema the final answer must match, if any.
    pub fn output_schema(&self) -> Option<&OutputSchema> {
        self.output_schema.as_ref()
    }

    /// The conversation as sent and what the context policy did, when one is set.
    pub fn context(&self) -> Option<&ContextState> {
        self.context.as_deref()
    }
}

/// The version of the [`Snapshot`]s this build writes. A snapshot of a later version is refused
/// when it is read; earlier ones are read as they were written.
pub const SNAPSHOT_VERSION: u32 = 1;

/// A saved machine: an opaque value to store (it serializes with serde, as
/// `{"version": 1, "state": {…}}`) and give back to [`Machine::resume`]
/// (or [`crate::Agent::continue_from`]). Its version is checked when it is read: a snapshot
/// written by a later toolloop is refused, with a message that says so.
///
/// ```
/// # use toolloop::engine::{Machine, HookFlags, Snapshot};
/// # use toolloop::config::LoopConfig;
/// # use std::sync::Arc;
/// let machine = Machine::new(Arc::new(LoopConfig::default()), HookFlags::default(),
///     Default::default(), vec![toolloop::message::Message::user("hi")]);
/// let saved = serde_json::to_string(&machine.snapshot()).unwrap();
/// let snapshot: Snapshot = serde_json::from_str(&saved).unwrap();
/// let again = Machine::resume(Arc::new(LoopConfig::default()), HookFlags::default(),
///     Default::default(), snapshot);
/// assert_eq!(again.messages(), machine.messages());
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "SnapshotRepr")]
pub struct Snapshot {
    state: LoopState,
}

impl Snapshot {
    pub(crate) fn new(state: LoopState) -> Self {
        Snapshot { state }
    }

    pub(crate) fn into_state(self) -> LoopState {
        self.state
    }

    /// The saved state.
    pub fn state(&self) -> &LoopState {
        &self.state
    }
}

impl Serialize for Snapshot {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Repr<'a> {
            version: u32,
            state: &'a LoopState,
        }
        Repr {
            version: SNAPSHOT_VERSION,
            state: &self.state,
        }
        .serialize(serializer)
    }
}

/// A snapshot as it is written.
#[derive(Deserialize)]
struct SnapshotRepr {
    version: u32,
    state: serde_json::Value,
}

impl TryFrom<SnapshotRepr> for Snapshot {
    type Error = String;

    fn try_from(r: SnapshotRepr) -> Result<Self, String> {
        if r.version > SNAPSHOT_VERSION {
            return Err(format!(
                "this snapshot is of version {}, written by a later toolloop; this one reads versions up to {SNAPSHOT_VERSION}",
                r.version
            ));
        }
        let state: LoopState = serde_json::from_value(r.state).map_err(|e| {
            format!(
                "the state of a version {} snapshot does not read: {e}",
                r.version
            )
        })?;
        state.check().map_err(|e| {
            format!(
                "the state of a version {} snapshot is not one a run leaves: {e}",
                r.version
            )
        })?;
        Ok(Snapshot { state })
    }
}

impl LoopState {
    /// Whether the indices the state holds are within what it holds: the context state's
    /// within its view and the transcript ([`ContextState`]), a compaction in flight within
    /// the view. (What is checked as inputs arrive, such as a call's index, is not.)
    fn check(&self) -> Result<(), String> {
        let Some(c) = &self.context else {
            return Ok(());
        };
        c.check(self.messages.len())?;
        if let Phase::Compacting { request, .. } = &self.phase {
            let len = c.view_len();
            if request.lead >= request.cut || request.cut > len {
                return Err(format!(
                    "the compaction it waits for replaces the view's messages from `lead` {} \
                     to `cut` {}, of the {len} it holds",
                    request.lead, request.cut
                ));
            }
        }
        Ok(())
    }
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
