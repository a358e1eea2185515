//! The loop's limits, policies and hooks, with defaults from the original designs (see the glossary).
//!
//! | control | default | also known as |
//! | --- | --- | --- |
//! | [`LoopConfig::max_rounds`] | 10 | `maxIterations`, `maxRounds`, `MaxIterations` |
//! | [`LoopConfig::max_tool_calls`] | 20 | `maxToolCalls` |
//! | [`LoopConfig::timeout`] | none | `timeout` |
//! | [`LoopConfig::detect_duplicates`] / [`LoopConfig::duplicate_window`] | on / 3 | `detectDuplicates` / `duplicateWindow` |
//! | [`LoopConfig::max_parallel`] | 10 | `PARALLEL_TOOL_BATCH_SIZE` |
//! | [`LoopConfig::parallel_mode`] | mixed | the planner loop's all-or-nothing: [`ParallelMode::AllOrNothing`] |
//! | [`LoopConfig::invalid_calls`] | feed back, budget 2 | stopping at the first: [`InvalidCallPolicy::Strict`] |
//! | [`LoopConfig::tool_retries`] | 2 | `retryFailedTools` / `maxToolRetries` |
//! | [`LoopConfig::max_result_chars`] | 4000 | `maxToolResultSize` |
//! | [`LoopConfig::on_truncated_call`] | stop | — |
//! | [`LoopConfig::stream_restarts`] | 2 | — |
//! | [`Hooks::stop_when`] | none | `CheckTerminal` |
//! | [`Hooks::on_round_limit`] | none | `OnIterationLimit` |
//! | [`Hooks::reminders`] | none | `reminderChannel` |

use crate::message::ToolCall;
use crate::tool::{ToolError, ToolOutput};
use crate::usage::Usage;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// How a batch of parallel-safe calls is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParallelMode {
    /// Consecutive parallel-safe calls run together (at most `max_parallel` at once); a call
    /// that is not parallel-safe runs alone, in its place.
    #[default]
    Mixed,
    /// The planner loop's rule: the round runs in parallel only when every call in it is parallel-safe,
    /// else everything runs one at a time.
    AllOrNothing,
}

/// What to do with invalid tool calls (unknown tool, arguments that are not JSON or that fail
/// the schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "policy")]
pub enum InvalidCallPolicy {
    /// Send the error back as the call's result so the model can correct itself; stop the run
    /// when more than `budget` invalid calls come in a row (a valid call resets the count).
    Feedback {
        /// Consecutive invalid calls tolerated.
        budget: u32,
    },
    /// Stop at the first invalid call with the PTK Manager's code (`TOOL_NOT_FOUND`,
    /// `INVALID_TOOL_CALL`).
    Strict,
}

impl Default for InvalidCallPolicy {
    fn default() -> Self {
        InvalidCallPolicy::Feedback { budget: 2 }
    }
}

/// What to do when the output-token limit cut a tool call short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TruncatedCallPolicy {
    /// Stop the run with [`crate::outcome::StopReason::OutputTruncated`]; the partial call is
    /// reported, never executed.
    #[default]
    Stop,
    /// Tell the model its call was cut off and let it try again (counts as an invalid call).
    Continue,
}

/// Limits and policies of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopConfig {
    /// Model calls per run (default 10).
    pub max_rounds: u32,
    /// Tool executions per run, checked before each call executes (default 20).
    pub max_tool_calls: u32,
    /// Wall-clock limit for the run.
    #[serde(default, with = "opt_secs")]
    pub timeout: Option<Duration>,
    /// Limit for one attempt of a tool call; a call that passes it fails with a retryable
    /// error.
    #[serde(default, with = "opt_secs")]
    pub tool_timeout: Option<Duration>,
    /// Skip a call identical (same tool, same canonical arguments) to one of the last
    /// `duplicate_window` executed calls (default on).
    pub detect_duplicates: bool,
    /// How many recent executed calls duplicates are checked against (default 3).
    pub duplicate_window: usize,
    /// The most tool calls running at once (default 10).
    pub max_parallel: usize,
    /// How parallel-safe calls are scheduled.
    pub parallel_mode: ParallelMode,
    /// Invalid-call policy.
    pub invalid_calls: InvalidCallPolicy,
    /// Retries for a tool error marked retryable (default 2).
    pub tool_retries: u32,
    /// First backoff between tool retries; doubles each time (default 200 ms).
    #[serde(with = "millis")]
    pub tool_retry_backoff: Duration,
    /// Cap on a tool result's length in characters, keeping head and tail (default 4000;
    /// 0 = no cap).
    pub max_result_chars: usize,
    /// Policy for a call cut off by the output-token limit.
    pub on_truncated_call: TruncatedCallPolicy,
    /// Stream model responses (text deltas become events). Transcripts are identical either way.
    pub stream: bool,
    /// How often a model call whose stream broke after delivering output is made again from
    /// the same state (default 2). Its partial output is dropped, and a `model_retry` event
    /// tells listeners to discard the text deltas of the broken attempt.
    #[serde(default = "default_stream_restarts")]
    pub stream_restarts: u32,
    /// Which calls run, which wait for a person's approval, which are denied (see
    /// [`crate::approval`]). Default: no rules (each tool's own default).
    #[serde(default, skip_serializing_if = "crate::approval::Approvals::is_empty")]
    pub approvals: crate::approval::Approvals,
    /// What the run does to stay inside the model's context window: spill long results, clear
    /// old ones, compact the conversation (see [`crate::context::policy`]). Default `None`:
    /// the conversation is sent whole. Spilling applies to results as `max_result_chars` left
    /// them: raise that cap (or set it to 0) for results to be spilled rather than cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<crate::context::ContextPolicy>,
}

fn default_stream_restarts() -> u32 {
    2
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            max_rounds: 10,
            max_tool_calls: 20,
            timeout: None,
            tool_timeout: None,
            detect_duplicates: true,
            duplicate_window: 3,
            max_parallel: 10,
            parallel_mode: ParallelMode::Mixed,
            invalid_calls: InvalidCallPolicy::default(),
            tool_retries: 2,
            tool_retry_backoff: Duration::from_millis(200),
            max_result_chars: 4000,
            on_truncated_call: TruncatedCallPolicy::Stop,
            stream: false,
            stream_restarts: default_stream_restarts(),
            approvals: crate::approval::Approvals::default(),
            context: None,
        }
    }
}

/// A snapshot of the loop for hooks.
#[derive(Debug, Clone, Copy)]
pub struct LoopView<'a> {
    /// The round about to run (1-based) or just run.
    pub round: u32,
    /// Tool calls executed so far.
    pub tool_calls: u32,
    /// Usage so far, summed over the model calls that reported it (`None` when none did).
    pub usage: Option<Usage>,
    /// The most recent executed call, if any.
    pub last_call: Option<&'a crate::outcome::ExecutedCall>,
}

/// One call of a round and its result, as the terminal check sees them.
#[derive(Debug, Clone, Copy)]
pub struct RoundCall<'a> {
    /// The call.
    pub call: &'a ToolCall,
    /// What it returned, if it ran (`None` for calls that were skipped as invalid or duplicate).
    pub result: Option<&'a Result<ToolOutput, ToolError>>,
}

/// What `on_round_limit` decides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoundLimitDecision {
    /// Stop with [`crate::outcome::StopReason::MaxRounds`].
    Stop,
    /// Stop with this terminal signal.
    Signal(String),
    /// Allow this many more rounds.
    Extend(u32),
}

/// `stop_when`: examines a round's calls and results after all of them ran; a signal ends the
/// run.
pub type StopWhen = Arc<dyn Fn(&[RoundCall<'_>]) -> Option<String> + Send + Sync>;
/// `on_round_limit`: called when `max_rounds` is reached without a terminal signal.
pub type OnRoundLimit =
    Arc<dyn Fn(LoopView<'_>) -> BoxFuture<'static, RoundLimitDecision> + Send + Sync>;
/// Reminders: strings for the next request only, sent as `<system-reminder>` messages.
pub type Reminders = Arc<dyn Fn(LoopView<'_>) -> Vec<String> + Send + Sync>;

/// The loop's callbacks.
#[derive(Clone, Default)]
pub struct Hooks {
    /// The Go toolloop's CheckTerminal.
    pub stop_when: Option<StopWhen>,
    /// The Go toolloop's OnIterationLimit.
    pub on_round_limit: Option<OnRoundLimit>,
    /// The planner loop's reminderChannel.
    pub reminders: Option<Reminders>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("stop_when", &self.stop_when.is_some())
            .field("on_round_limit", &self.on_round_limit.is_some())
            .field("reminders", &self.reminders.is_some())
            .finish()
    }
}

mod opt_secs {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        d.map(|d| d.as_secs_f64()).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let v = Option::<f64>::deserialize(d)?;
        match v {
            None => Ok(None),
            Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
            Some(s) => Err(serde::de::Error::custom(format!(
                "expected a non-negative number of seconds, got {s}"
            ))),
        }
    }
}

mod millis {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        (d.as_millis() as u64).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}
