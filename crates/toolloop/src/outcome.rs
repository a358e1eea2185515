//! How a run ended: the stop reason, the answer, every call, the transcript, usage and cost.

use crate::message::{Message, ToolCall};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopReason {
    /// The model answered without calling a tool.
    Answered,
    /// `max_rounds` model calls were made.
    MaxRounds,
    /// `max_tool_calls` tool calls were executed and the model asked for more.
    MaxToolCalls,
    /// The run's timeout passed.
    Timeout,
    /// The run was cancelled.
    Cancelled,
    /// A terminal tool, `stop_when` or `on_round_limit` gave a signal.
    TerminalSignal,
    /// Too many invalid tool calls, or final answers that fail the output schema, in a row (or
    /// one, under the strict policy).
    TooManyInvalidCalls,
    /// The output-token limit cut the model's turn short: a tool call (never run), or the
    /// answer (its text is kept in [`Outcome::text`], but it is incomplete).
    OutputTruncated,
    /// The model call failed.
    ModelError,
    /// The model answered with nothing: no text (or only whitespace) and no tool call. Not an
    /// answer: a server or proxy that swallowed an error, or a request it could not use, often
    /// replies this way.
    EmptyAnswer,
    /// The run log could not be written, so the run stopped before acting.
    StoreFailed,
    /// Calls wait for a person's approval and no approval handler was set: the calls are in
    /// [`Outcome::pending_approvals`]; decide them and resume the run (see
    /// [`crate::approval`]).
    AwaitingApproval,
    /// The request did not fit the model's context window, even after the context policy
    /// compacted the conversation (see [`crate::context::policy`]); the transcript is kept.
    ContextExhausted,
}

impl StopReason {
    /// Whether the run ended as intended: an answer or a terminal signal.
    pub fn is_success(self) -> bool {
        matches!(self, StopReason::Answered | StopReason::TerminalSignal)
    }
}

/// Error codes (the PTK Manager's `PTKErrorCode`, plus timeout and cancellation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The model called a tool that does not exist.
    ToolNotFound,
    /// The model's call was invalid (arguments not JSON, or failing the schema).
    InvalidToolCall,
    /// `max_rounds` was reached.
    MaxIterationsReached,
    /// `max_tool_calls` was reached.
    MaxToolCallsReached,
    /// The model call failed.
    LlmCallFailed,
    /// The model wrote a tool call that could not be parsed.
    ParseError,
    /// The run timed out.
    Timeout,
    /// The run was cancelled.
    Cancelled,
    /// The run log could not be written.
    StoreFailed,
    /// The output-token limit cut the model's answer short.
    OutputTruncated,
    /// The run stopped to wait for approvals.
    AwaitingApproval,
    /// The model's final answers kept failing the output schema (see [`crate::output`]); the
    /// message names the validation errors of the last one.
    InvalidOutput,
    /// The model answered with no text and no tool call.
    EmptyAnswer,
    /// The request did not fit the model's context window, even after compacting.
    ContextExhausted,
}

impl ErrorCode {
    /// How a run that failed with this code stopped: the error is the source of a failed run's
    /// [`StopReason`] (and that of [`Outcome::success`]), so the two never disagree.
    pub fn stop_reason(self) -> StopReason {
        match self {
            ErrorCode::ToolNotFound
            | ErrorCode::InvalidToolCall
            | ErrorCode::ParseError
            | ErrorCode::InvalidOutput => StopReason::TooManyInvalidCalls,
            ErrorCode::MaxIterationsReached => StopReason::MaxRounds,
            ErrorCode::MaxToolCallsReached => StopReason::MaxToolCalls,
            ErrorCode::LlmCallFailed => StopReason::ModelError,
            ErrorCode::Timeout => StopReason::Timeout,
            ErrorCode::Cancelled => StopReason::Cancelled,
            ErrorCode::StoreFailed => StopReason::StoreFailed,
            ErrorCode::OutputTruncated => StopReason::OutputTruncated,
            ErrorCode::AwaitingApproval => StopReason::AwaitingApproval,
            ErrorCode::EmptyAnswer => StopReason::EmptyAnswer,
            ErrorCode::ContextExhausted => StopReason::ContextExhausted,
        }
    }
}

/// A failed run's error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunError {
    /// The code.
    pub code: ErrorCode,
    /// What happened.
    pub message: String,
}

/// What happened to one tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// The tool ran and succeeded.
    Ok,
    /// The tool ran and failed.
    Failed,
    /// Not run: unknown tool, or arguments not JSON or failing the schema.
    Invalid,
    /// Not run: identical to a recent call.
    Duplicate,
    /// Not run: the tool-call budget was spent, or the run stopped first.
    Skipped,
    /// Interrupted by cancellation or timeout.
    Cancelled,
    /// Cut off by the output-token limit; not run.
    Truncated,
    /// It was in flight when the run stopped (a crash), and it changes the world, so it was not
    /// run again: it may or may not have taken effect.
    Unknown,
    /// Not run: the approval policy or a person denied it (the model reads `denied: …`).
    Denied,
}

impl CallStatus {
    /// Whether the tool's handler ran.
    pub fn executed(self) -> bool {
        matches!(self, CallStatus::Ok | CallStatus::Failed)
    }
}

/// One tool call of a run, and what came of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutedCall {
    /// The round (1-based).
    pub round: u32,
    /// The call.
    pub call: ToolCall,
    /// What happened.
    pub status: CallStatus,
    /// The result content the model read.
    pub content: String,
    /// How long it took, in milliseconds (0 when not run).
    pub duration_ms: u64,
    /// How many attempts were made (retries included).
    pub attempts: u32,
    /// What the call spent on model calls of its own: a sub-agent's usage and cost, already
    /// counted in the run's ([`Outcome::usage`], [`Outcome::cost`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Box<crate::usage::Spent>>,
}

impl ExecutedCall {
    /// Whether the call succeeded.
    pub fn success(&self) -> bool {
        self.status == CallStatus::Ok
    }
}

/// Everything a run gathered, whatever way it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Whether the run ended as intended (answered or terminal signal).
    pub success: bool,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// The final answer (the last assistant text when the model answered).
    pub text: Option<String>,
    /// The final answer as a JSON value validated against the output schema, when one was set
    /// (see [`crate::output`]) and the run answered; [`Outcome::parse`] gives it as a Rust type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Value>,
    /// The terminal signal, if any.
    pub signal: Option<String>,
    /// Model calls made.
    pub rounds: u32,
    /// Every tool call, in order.
    pub tool_calls: Vec<ExecutedCall>,
    /// The whole transcript (the caller's messages plus what this run added).
    pub messages: Vec<Message>,
    /// Usage summed over the model calls whose server reported it; `None` (JSON `null`) when
    /// none did, or no model call returned. See [`Outcome::calls_without_usage`].
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Model calls that returned without a usage report. When it is not 0, `usage` leaves
    /// their tokens out (it is a lower bound) and `cost` is unknown.
    #[serde(default)]
    pub calls_without_usage: u32,
    /// Cost in US dollars; `None` (unknown, never 0) when the model has no price, when a model
    /// call reported no usage, or when no model call returned.
    pub cost: Option<f64>,
    /// Wall-clock duration in milliseconds.
    pub duration_ms: u64,
    /// When the run failed, why: `None` exactly when [`Outcome::success`]; its code gives the
    /// [`Outcome::stop_reason`] ([`ErrorCode::stop_reason`]).
    pub error: Option<RunError>,
    /// The run's id in the run log, when the run was logged (see [`crate::journal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The calls waiting for approval when the run stopped with
    /// [`StopReason::AwaitingApproval`] (their round has no results yet); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_approvals: Vec<crate::approval::PendingApproval>,
    /// With a context policy: the conversation as last sent (compacted, results cleared and
    /// spilled), kept as edits over [`Outcome::messages`] and read with [`Outcome::view`]
    /// (pass [`Outcome::continuation`] to a next run to continue from it), and what the
    /// policy did, the summariser's usage and cost apart from the run's (see
    /// [`crate::context::policy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Box<crate::engine::ContextState>>,
}

/// Why [`Outcome::parse`] gave no value.
#[derive(Debug, thiserror::Error)]
pub enum ParseOutputError {
    /// The run gave no validated answer: it set no output schema, or it did not answer (its
    /// stop reason and error say why).
    #[error("the run gave no validated output (it stopped with {stop_reason:?}{})", .error.as_ref().map(|e| format!(": {}", e.message)).unwrap_or_default())]
    NoOutput {
        /// How the run stopped.
        stop_reason: StopReason,
        /// The run's error, if it failed.
        error: Option<RunError>,
    },
    /// The validated value does not deserialize into the type (the schema allows values the
    /// type does not).
    #[error("the output does not fit the type: {0}")]
    Type(#[from] serde_json::Error),
}

impl Outcome {
    /// The conversation as the run last sent it: with a context policy, its view (compacted,
    /// results cleared and spilled; see [`crate::context::policy`]), read over
    /// [`Outcome::messages`] ([`crate::engine::ContextState::view`]); without one, the
    /// transcript.
    pub fn view(&self) -> crate::message::Messages<'_> {
        match self.context.as_deref() {
            Some(context) => context.view(&self.messages),
            None => crate::message::Messages::from(self.messages.as_slice()),
        }
    }

    /// The conversation a next run (a session's next turn) goes on from: without a context
    /// policy, the transcript; with one, the conversation as last sent (compacted, old results
    /// cleared), its spilled results whole again, so that they survive with the session: the
    /// next run spills them anew (the same preview under the same handle), and its
    /// `read_result` reads them whole. A cleared result stays a stub.
    pub fn continuation(&self) -> std::borrow::Cow<'_, [Message]> {
        use std::borrow::Cow;
        let Some(context) = self.context.as_deref() else {
            return Cow::Borrowed(&self.messages);
        };
        let view = context.view(&self.messages);
        if context.spilled == 0 {
            return match view.as_slice() {
                Some(whole) => Cow::Borrowed(whole),
                None => Cow::Owned(view.to_vec()),
            };
        }
        let whole: std::collections::HashMap<&str, &crate::message::ToolResult> = self
            .messages
            .iter()
            .filter_map(|m| match m {
                Message::Tool(r) if r.name != crate::context::policy::READ_RESULT => {
                    Some((r.call_id.as_str(), r))
                }
                _ => None,
            })
            .collect();
        let mut view = view.to_vec();
        for m in &mut view {
            if let Message::Tool(r) = m
                && let Some(original) = whole.get(r.call_id.as_str())
                && r.content != original.content
                && r.content
                    != crate::context::policy::cleared_stub(
                        &original.name,
                        &original.call_id,
                        original.content.len(),
                    )
            {
                r.content.clone_from(&original.content);
                r.images.clone_from(&original.images);
            }
        }
        Cow::Owned(view)
    }

    /// The validated final answer as a `T` (the type whose schema the run used, typically:
    /// see [`crate::AgentBuilder::output_type`]).
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, ParseOutputError> {
        match &self.output {
            Some(v) => Ok(T::deserialize(v)?),
            None => Err(ParseOutputError::NoOutput {
                stop_reason: self.stop_reason,
                error: self.error.clone(),
            }),
        }
    }

    /// Tool calls whose handler ran.
    pub fn executed_calls(&self) -> impl Iterator<Item = &ExecutedCall> {
        self.tool_calls.iter().filter(|c| c.status.executed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_code_tells_a_failed_stop() {
        use ErrorCode::*;
        for code in [
            ToolNotFound,
            InvalidToolCall,
            MaxIterationsReached,
            MaxToolCallsReached,
            LlmCallFailed,
            ParseError,
            Timeout,
            Cancelled,
            StoreFailed,
            OutputTruncated,
            InvalidOutput,
        ] {
            assert!(!code.stop_reason().is_success(), "{code:?}");
        }
    }
}
