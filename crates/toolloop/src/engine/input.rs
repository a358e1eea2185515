//! The machine's inputs ([`Input`]) and what it knows of the driver's hooks ([`HookFlags`]).

use super::*;

/// An input of the machine: everything that happens outside it, the model's answers, the tool
/// calls' results, the hooks' and the approvals' answers, interruptions. The driver logs an
/// input, then hands it to [`Machine::handle`]; the run log is the list of a run's inputs
/// ([`crate::journal::Record`] is this type), so a replay ([`Machine::replay`]) hands the same
/// inputs to a fresh machine, and a durable-execution engine journals the same values. Each
/// input names the round (and the call) it is for, and the machine refuses one that does not
/// fit ([`PhaseError`]).
///
/// Serialized with a `kind` tag in snake case (`{"kind":"model_responded","round":1,…}`), the
/// form run logs keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Input {
    /// The run began with this conversation: a log's first record, from which
    /// [`Machine::replay`] makes the machine ([`Machine::new`] for a live run). The machine
    /// refuses it afterwards: a run starts once.
    Started {
        /// The conversation at the start (system prompt included).
        messages: Vec<Message>,
        /// The schema the final answer must match, if the run set one (see
        /// [`crate::output`]); a replay holds answers to this one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_schema: Option<OutputSchema>,
    },
    /// The run's tools, for a run whose tools can change while it goes on (an agent with a
    /// [`crate::tool_source::ToolSource`]): given before the run's first model call (round 0)
    /// and whenever they change before a model call ([`Step::CallModel`], before it is made).
    /// That call offers these tools, and the calls it returns are checked against them. Logged
    /// as the catalog's entries.
    ToolsChanged {
        /// The round whose model call offers them first (0: from the run's start).
        round: u32,
        /// The whole catalog.
        tools: Arc<Catalog>,
    },
    /// The `reminders` hook answered ([`Step::GetReminders`]): the round starts with these
    /// strings sent along with its request.
    RemindersGiven {
        /// The round about to start.
        round: u32,
        /// The reminders sent with that round's request.
        reminders: Vec<String>,
    },
    /// `stop_when` answered ([`Step::CheckStop`]), after every call of the round ran: a
    /// signal ends the run after this round.
    StopChecked {
        /// The round.
        round: u32,
        /// The signal that ends the run, if it gave one.
        signal: Option<String>,
    },
    /// The model call of [`Step::CallModel`] is about to be made (it changes nothing; a log
    /// that holds it and no answer shows the call in flight). The driver leaves it out of a
    /// write that holds the call's response (or failure), which implies it.
    ModelRequested {
        /// The round.
        round: u32,
    },
    /// The model answered.
    ModelResponded {
        /// The round.
        round: u32,
        /// The response.
        response: ModelResponse,
        /// Its cost, when known.
        cost: Option<f64>,
        /// The approval subject of each of the response's calls, in order, where the approval
        /// policy weighs it ([`crate::approval::Approvals::weighs_subject`]): the driver takes
        /// them from the tools ([`crate::toolbox::Toolbox::approval_subjects`]), so that the
        /// machine, and a replay, needs no tool. Empty when no call needs one. A response
        /// lacking a subject the policy needs is refused. Each is a
        /// [`crate::approval::Subject`], kept as a plain string when it is one spelling known
        /// for sure (the form earlier logs hold).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        subjects: Vec<Option<Subject>>,
    },
    /// The model call failed (after the adapter's retries).
    ModelFailed {
        /// The round.
        round: u32,
        /// What happened.
        message: String,
    },
    /// A tool call of [`Step::RunTools`] is about to run (its intent): after a crash, a call
    /// that started and has no result was in flight ([`Machine::in_flight`]). The driver
    /// leaves it out of a write that holds the call's result, which implies it.
    ToolStarted {
        /// The round.
        round: u32,
        /// The call's place in the round.
        index: usize,
        /// The call id.
        call_id: String,
    },
    /// A tool call finished (after its retries).
    ToolFinished {
        /// The round.
        round: u32,
        /// The call's place in the round.
        index: usize,
        /// What it returned.
        result: Result<ToolOutput, ToolError>,
        /// How long it took.
        duration_ms: u64,
        /// Attempts made.
        attempts: u32,
    },
    /// A call that was in flight at a crash has side effects and was not run again: it gets
    /// an "outcome unknown" result the model can read.
    ToolUnknown {
        /// The round.
        round: u32,
        /// The call's place in the round.
        index: usize,
    },
    /// A call's approval was decided ([`Step::Approve`]), by a rule or a person (see
    /// [`crate::approval`]). The decision must be bound to the call (its id, tool and
    /// canonical arguments, see [`Decision::binds`]): a decision for another call or for other
    /// arguments is refused, and the call still waits. An approved call runs; a denied one
    /// does not, and its result is `denied: <reason>`.
    ApprovalDecided {
        /// The round.
        round: u32,
        /// The call's place in the round.
        index: usize,
        /// The decision.
        decision: Decision,
    },
    /// `on_round_limit` decided ([`Step::DecideRoundLimit`]).
    RoundLimitDecided {
        /// The decision.
        decision: RoundLimitDecision,
    },
    /// The driver stopped the run: it ends now (a run already finished stays as it is), and
    /// calls still in flight get a synthetic "cancelled" result, so the transcript stays valid.
    Interrupted {
        /// Why.
        why: Interrupt,
    },
    /// The run is over (the driver logs it at the end; the machine has finished by then, and
    /// takes it as a no-op).
    Finished,
    /// The context policy's edits before a round ([`Step::EditContext`]), as the machine gave
    /// them: a replay applies these, whatever the policy is now.
    ContextEdited {
        /// The round about to start.
        round: u32,
        /// The edits.
        edits: ContextEdits,
    },
    /// The summariser answered a [`Step::Compact`]: the view's compacted part is replaced by
    /// the summary. Logged, so a resumed run does not summarise again.
    Compacted {
        /// The compaction's round ([`CompactRequest::round`]).
        round: u32,
        /// The summary and what it cost.
        #[serde(flatten)]
        compaction: Compaction,
    },
    /// The summarising call of a [`Step::Compact`] failed (after the adapter's retries): the
    /// round goes on uncompacted; after a refused call, the run stops with
    /// `context_exhausted`.
    CompactionFailed {
        /// The compaction's round.
        round: u32,
        /// What happened.
        message: String,
    },
    /// The model call of [`Step::CallModel`] was refused for its size
    /// ([`crate::model::ModelError::ContextOverflow`]): with a context policy, the machine
    /// compacts ([`Step::Compact`]) and retries it once; without one, the run stops as for
    /// [`Input::ModelFailed`].
    ContextOverflowed {
        /// The round.
        round: u32,
        /// The provider's refusal.
        overflow: crate::context::ContextOverflow,
    },
}

impl Input {
    /// The input's kind, as in its JSON (`started`, `model_requested`, …), which is also the
    /// [`PhaseError::input`] of a refusal.
    pub fn kind(&self) -> &'static str {
        match self {
            Input::Started { .. } => "started",
            Input::ToolsChanged { .. } => "tools_changed",
            Input::ModelRequested { .. } => "model_requested",
            Input::ModelResponded { .. } => "model_responded",
            Input::ModelFailed { .. } => "model_failed",
            Input::ToolStarted { .. } => "tool_started",
            Input::ToolFinished { .. } => "tool_finished",
            Input::ToolUnknown { .. } => "tool_unknown",
            Input::RemindersGiven { .. } => "reminders_given",
            Input::StopChecked { .. } => "stop_checked",
            Input::RoundLimitDecided { .. } => "round_limit_decided",
            Input::ApprovalDecided { .. } => "approval_decided",
            Input::Interrupted { .. } => "interrupted",
            Input::Finished => "finished",
            Input::ContextEdited { .. } => "context_edited",
            Input::Compacted { .. } => "compacted",
            Input::CompactionFailed { .. } => "compaction_failed",
            Input::ContextOverflowed { .. } => "context_overflowed",
        }
    }
}

/// Which hooks the driver has (see [`Hooks`]). The machine asks for their answers with
/// [`Step`]s; it never holds or calls them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HookFlags {
    /// `stop_when` is set: the machine asks [`Step::CheckStop`] after a round's calls.
    pub stop_when: bool,
    /// `on_round_limit` is set: the machine asks [`Step::DecideRoundLimit`] at the limit
    /// (without it, the run stops there).
    pub on_round_limit: bool,
    /// `reminders` is set: the machine asks [`Step::GetReminders`] before each round.
    pub reminders: bool,
}

impl From<&Hooks> for HookFlags {
    fn from(h: &Hooks) -> Self {
        HookFlags {
            stop_when: h.stop_when.is_some(),
            on_round_limit: h.on_round_limit.is_some(),
            reminders: h.reminders.is_some(),
        }
    }
}
