//! One event stream for everything that happens in a run.
//!
//! The PTK Manager's callbacks and the AI controller's status stages are a `match` away:
//!
//! ```
//! use toolloop::event::Event;
//!
//! // onIteration, onToolCall, onError, onDuplicateDetected:
//! fn ptk_manager_callbacks(event: &Event) {
//!     match event {
//!         Event::RoundStarted { round, .. } => println!("iteration {round}"),
//!         Event::ToolCallRequested { call, .. } => println!("tool call {}", call.name),
//!         Event::DuplicateDetected { call, .. } => println!("duplicate {}", call.name),
//!         Event::RunFinished { outcome } if outcome.error.is_some() => {
//!             println!("error: {}", outcome.error.as_ref().unwrap().message)
//!         }
//!         _ => {}
//!     }
//! }
//!
//! // the AI controller's stages: submitted → streaming → executing → processing → complete / error.
//! fn stage(event: &Event) -> Option<&'static str> {
//!     Some(match event {
//!         Event::RunStarted { .. } => "submitted",
//!         Event::RoundStarted { round: 1, .. } | Event::TextDelta { .. } => "streaming",
//!         Event::RoundStarted { .. } => "processing",
//!         Event::ToolStarted { .. } => "executing",
//!         Event::RunFinished { outcome } if outcome.success => "complete",
//!         Event::RunFinished { .. } => "error",
//!         _ => return None,
//!     })
//! }
//! # ptk_manager_callbacks(&Event::RunStarted { message_count: 1 });
//! # assert_eq!(stage(&Event::RunStarted { message_count: 1 }), Some("submitted"));
//! ```

use crate::message::ToolCall;
use crate::model::FinishReason;
use crate::outcome::{CallStatus, Outcome};
use crate::usage::Usage;
use serde::Serialize;

/// Something that happened in a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// The run began.
    RunStarted {
        /// Messages in the conversation at the start.
        message_count: usize,
    },
    /// A model call is about to be made (the AI controller's `ai-turn-start`).
    RoundStarted {
        /// The round (1-based).
        round: u32,
        /// Messages sent.
        message_count: usize,
    },
    /// The tools changed before this round's model call (a tool source listed others; see
    /// [`crate::tool_source`]): the call offers the new catalog.
    ToolsChanged {
        /// The round whose model call offers them.
        round: u32,
        /// Tools offered now that were not before.
        added: Vec<String>,
        /// Tools no longer offered.
        removed: Vec<String>,
        /// Tools still offered whose description, schema or side effects changed.
        changed: Vec<String>,
    },
    /// A model call's stream broke after delivering output and the call is made again; the
    /// text deltas of the broken attempt are void.
    ModelRetry {
        /// The round.
        round: u32,
        /// The attempt about to be made (2 for the first restart).
        attempt: u32,
        /// What broke.
        reason: String,
    },
    /// Streamed text.
    TextDelta {
        /// The round.
        round: u32,
        /// The text.
        text: String,
    },
    /// The model asked for a tool call.
    ToolCallRequested {
        /// The round.
        round: u32,
        /// The call.
        call: ToolCall,
    },
    /// The model gave a call an id that another call already has (in the same reply, or
    /// earlier in the conversation) or no id at all; the call got a fresh one, which its result
    /// carries too. Sent before the call's `tool_call_requested`.
    CallIdReplaced {
        /// The round.
        round: u32,
        /// The id the model gave (shortened when long).
        original: String,
        /// The id the call has now.
        id: String,
    },
    /// A call was identical to a recent one and was not run.
    DuplicateDetected {
        /// The round.
        round: u32,
        /// The call.
        call: ToolCall,
    },
    /// A call was invalid (unknown tool, bad arguments, cut off) and was not run.
    InvalidToolCall {
        /// The round.
        round: u32,
        /// The call.
        call: ToolCall,
        /// What was wrong.
        reason: String,
    },
    /// A call was parsed from text that needed repair (prompt-based calling).
    ToolCallRepaired {
        /// The round.
        round: u32,
        /// The call.
        call: ToolCall,
    },
    /// The model's final answer did not match the output schema (see [`crate::output`]); the
    /// errors went back to the model.
    InvalidOutput {
        /// The round.
        round: u32,
        /// What was wrong (each schema error with its JSON path).
        errors: String,
    },
    /// The model's reply attempted a call that could not be parsed; the explanation went back.
    MalformedToolCall {
        /// The round.
        round: u32,
        /// What was wrong.
        reason: String,
    },
    /// A tool began running.
    ToolStarted {
        /// The round.
        round: u32,
        /// The call id.
        call_id: String,
        /// The tool.
        name: String,
        /// 1 for the first attempt, 2 for the first retry, …
        attempt: u32,
    },
    /// A tool call got its result.
    ToolFinished {
        /// The round.
        round: u32,
        /// The call id.
        call_id: String,
        /// The tool.
        name: String,
        /// Whether it succeeded.
        success: bool,
        /// What happened.
        status: CallStatus,
        /// How long it took, in milliseconds.
        duration_ms: u64,
    },
    /// A call waits for a person's approval: the approval handler is asked, or, with none,
    /// the run stops awaiting approval (see [`crate::approval`]).
    ApprovalRequested {
        /// The round.
        round: u32,
        /// The call, exactly as it would run.
        call: ToolCall,
        /// What the approval rules match against (a command line, a path, the arguments).
        subject: String,
    },
    /// A call's approval was decided (by a rule or a person); a denied call does not run.
    ApprovalDecided {
        /// The round.
        round: u32,
        /// The call id.
        call_id: String,
        /// The tool.
        name: String,
        /// Whether it runs.
        approved: bool,
        /// Who decided (`person`, or the rule in words).
        by: String,
    },
    /// A round ended: the model answered and its calls (if any) got results
    /// (the AI controller's `ai-processing-tool-results`).
    RoundFinished {
        /// The round.
        round: u32,
        /// Why the model stopped.
        finish_reason: FinishReason,
        /// This round's usage; `None` when the server did not report it.
        usage: Option<Usage>,
        /// Usage so far.
        total_usage: Option<Usage>,
    },
    /// A tool result was too long for the context policy ([`crate::context::policy`]): the model
    /// is sent its head and tail, and reads the rest with `read_result`; the whole result is
    /// kept in the transcript.
    ResultSpilled {
        /// The round about to start.
        round: u32,
        /// The call whose result it is (the handle of `read_result`).
        call_id: String,
        /// Its size, in bytes.
        bytes: usize,
        /// The size of what the model is sent instead.
        shown: usize,
    },
    /// The older part of the conversation was replaced by a summary (see
    /// [`crate::context::policy`]).
    ContextCompacted {
        /// The round it was made for.
        round: u32,
        /// The estimated input tokens of the next request before.
        tokens_before: u64,
        /// And after.
        tokens_after: u64,
        /// The messages the summary replaced.
        messages_summarised: usize,
        /// The summariser's usage (counted apart from the run's).
        usage: Option<Usage>,
    },
    /// The provider edited the request's context itself (cleared old tool results, or
    /// compacted the conversation; see [`crate::context::native`]), as it reported with its
    /// response.
    ContextEditedByProvider {
        /// The round whose request it edited.
        round: u32,
        /// What it reported.
        report: crate::context::NativeReport,
    },
    /// The run ended.
    RunFinished {
        /// Everything it gathered.
        outcome: Box<Outcome>,
    },
    /// Something happened in a sub-agent's run (see [`crate::subagent`]): a parent's tool
    /// call that runs another agent. A grandchild's events come as one `Child` event with the
    /// whole path, not nested twice.
    Child {
        /// The agents' names from the run that emits the event down to the one where it
        /// happened (`["reviewer"]`, `["planner", "reviewer"]`).
        path: Vec<String>,
        /// The parent's call that runs the child (its id, in the run one level up).
        call_id: String,
        /// What happened in the child's run.
        event: Box<Event>,
    },
}
