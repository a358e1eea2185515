//! The workflow's event stream: the steps' starts and ends around the events of their runs
//! (the agent's [`toolloop::Event`]s, each tagged with its step).

use crate::result::{StepResult, WorkflowOutcome};
use serde::Serialize;
use toolloop::event::Event;

/// Something that happened in a workflow run. As JSON (`--jsonl`), `{"type": "step_started",
/// …}`; a step's own events are `{"type": "step_event", "step": ID, "event": {…}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkflowEvent {
    /// The workflow run began (or was resumed).
    WorkflowStarted {
        /// The workflow run's id.
        workflow_id: String,
        /// The workflow's name.
        name: String,
        /// Whether it continues an earlier run.
        resumed: bool,
    },
    /// A step began: its `when` is evaluated, its templates rendered, its run made or resumed.
    StepStarted {
        /// The step.
        step: String,
        /// Its run's id, when runs are logged.
        run_id: Option<String>,
        /// Whether its run continues one that a killed process left.
        resumed: bool,
        /// When, in Unix milliseconds.
        at_ms: i64,
    },
    /// An event of a step's run (round started, tool call, …).
    StepEvent {
        /// The step.
        step: String,
        /// The run's event.
        event: Event,
    },
    /// A step ended (succeeded, failed or skipped): its result.
    StepFinished {
        /// Its result.
        result: Box<StepResult>,
    },
    /// The workflow run ended.
    WorkflowFinished {
        /// Everything it gave.
        outcome: Box<WorkflowOutcome>,
    },
}
