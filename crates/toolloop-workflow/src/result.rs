//! What a workflow run gives: each step's result (the design's `StepResult`) and the
//! workflow's outcome.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolloop::outcome::{Outcome, StopReason};

/// Where a step stands at the end of a workflow run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// It ran and answered (with valid output, for a step with an output schema).
    Succeeded,
    /// It ran, or tried to, and failed.
    Failed,
    /// Its `when` condition was false.
    Skipped,
    /// It never started: an earlier step failed and stopped the workflow, or the run was
    /// cancelled.
    NotRun,
}

/// The figures of a step's run (the design's `metadata`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetadata {
    /// Model calls made (the design's `iterations`).
    pub rounds: u32,
    /// Tool calls made (the design's `toolCalls`).
    pub tool_calls: u32,
    /// Input plus output tokens (the design's `totalTokens`); `None` when the server reported
    /// no usage.
    pub total_tokens: Option<u64>,
    /// Cost in US dollars, when the model has a price.
    pub cost: Option<f64>,
    /// Wall-clock time of the step, in milliseconds (for a resumed step, the run's own time).
    pub duration_ms: u64,
    /// When the step started, in Unix milliseconds (this process's start for a resumed one).
    pub started_ms: i64,
    /// When it ended, in Unix milliseconds.
    pub finished_ms: i64,
}

/// One step's result (the design's `{stepId, success, output, metadata}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    /// The step's id (the design's `stepId`).
    pub step_id: String,
    /// Where it stands.
    pub status: StepStatus,
    /// Whether it succeeded.
    pub success: bool,
    /// Whether its `when` condition skipped it.
    pub skipped: bool,
    /// Its output: the final text (a JSON string), or the validated JSON value for a step with
    /// an output schema; `null` when it was skipped, failed or did not run.
    pub output: Value,
    /// The final text of its run, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How its run stopped (`None` when no run was made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    /// Its run's id in the run log (`WORKFLOW_ID.STEP_ID`), when runs are logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Its figures.
    pub metadata: StepMetadata,
}

impl StepResult {
    /// A result without a run (skipped, not run, or failed before its model call).
    pub(crate) fn without_run(step_id: &str, status: StepStatus, error: Option<String>) -> Self {
        StepResult {
            step_id: step_id.to_string(),
            status,
            success: false,
            skipped: status == StepStatus::Skipped,
            output: Value::Null,
            text: None,
            error,
            stop_reason: None,
            run_id: None,
            metadata: StepMetadata::default(),
        }
    }

    /// A step's result from its run's outcome and the output read from it.
    pub(crate) fn from_outcome(
        step_id: &str,
        outcome: &Outcome,
        output: Result<Value, String>,
    ) -> Self {
        let (status, output, error) = match (outcome.success, output) {
            (true, Ok(v)) => (StepStatus::Succeeded, v, None),
            (true, Err(e)) => (StepStatus::Failed, Value::Null, Some(e)),
            (false, _) => (
                StepStatus::Failed,
                Value::Null,
                Some(
                    outcome
                        .error
                        .as_ref()
                        .map(|e| e.message.clone())
                        .unwrap_or_else(|| format!("stopped: {:?}", outcome.stop_reason)),
                ),
            ),
        };
        StepResult {
            step_id: step_id.to_string(),
            status,
            success: status == StepStatus::Succeeded,
            skipped: false,
            output,
            text: outcome.text.clone(),
            error,
            stop_reason: Some(outcome.stop_reason),
            run_id: outcome.run_id.clone(),
            metadata: StepMetadata {
                rounds: outcome.rounds,
                tool_calls: outcome.tool_calls.len() as u32,
                total_tokens: outcome.usage.map(|u| u.total_tokens()),
                cost: outcome.cost,
                duration_ms: outcome.duration_ms,
                started_ms: 0,
                finished_ms: 0,
            },
        }
    }

    /// What templates of later steps see as `steps.ID`.
    pub(crate) fn template_value(&self) -> Value {
        serde_json::json!({
            "output": self.output,
            "text": self.text,
            "success": self.success,
            "skipped": self.skipped,
            "error": self.error,
            "metadata": self.metadata,
        })
    }
}

/// How a workflow run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowStatus {
    /// It is going on (or its process died: it can be resumed).
    Running,
    /// Every step succeeded, was skipped, or failed with `continue_on_error`.
    Succeeded,
    /// A step failed and stopped it.
    Failed,
    /// It was cancelled; resuming it continues where it stopped.
    Cancelled,
}

impl WorkflowStatus {
    /// `running`, `succeeded`, `failed` or `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowStatus::Running => "running",
            WorkflowStatus::Succeeded => "succeeded",
            WorkflowStatus::Failed => "failed",
            WorkflowStatus::Cancelled => "cancelled",
        }
    }
}

/// Everything a workflow run gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowOutcome {
    /// The workflow run's id (its record in the workflow log, and the prefix of its steps'
    /// run ids).
    pub workflow_id: String,
    /// The workflow's name.
    pub name: String,
    /// Whether it succeeded.
    pub success: bool,
    /// How it ended.
    pub status: WorkflowStatus,
    /// The step that stopped it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<String>,
    /// Every step's result, in file order.
    pub steps: Vec<StepResult>,
    /// Tokens over every step (`None` when no step's server reported usage).
    pub total_tokens: Option<u64>,
    /// Cost over every step, when every step that ran has one.
    pub cost: Option<f64>,
    /// Wall-clock time of this process's part, in milliseconds.
    pub duration_ms: u64,
}

impl WorkflowOutcome {
    /// The result of a step.
    pub fn step(&self, id: &str) -> Option<&StepResult> {
        self.steps.iter().find(|s| s.step_id == id)
    }

    /// How the step that stopped the workflow stopped: what an exit code follows.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.failed_step
            .as_deref()
            .and_then(|id| self.step(id))
            .and_then(|s| s.stop_reason)
    }
}
