//! Step workflows for toolloop (the PTK Manager design's Execution Manager): named steps, each a
//! tool-calling run with its own prompt template, system prompt, model, tools and limits (5
//! rounds by default), chained by their outputs, run in file order or as a graph, durable and
//! resumable.
//!
//! - [`Workflow`] is the definition, read from TOML ([`Workflow::from_file`]); its JSON
//!   Schema is [`Workflow::json_schema`] (`docs/workflow.schema.json` in the repository).
//! - Templates (minijinja) read `{{ inputs.NAME }}`, `{{ steps.ID.output }}` and, for a step
//!   with an `output_schema`, the fields of its JSON output (`{{ steps.extract.output.title }}`).
//!   A step's `when` is an expression over the same values; false skips the step.
//! - [`Runner::check`] names every problem before anything runs: an undefined variable, a step
//!   read before it has run, an unknown step in `depends_on`, a cycle, a missing tool or model.
//! - [`Runner::run`] runs the steps: a step without `depends_on` after the one before it,
//!   one with `depends_on` once those are done, independent steps at once (at most
//!   `max_parallel`). A failed step stops the workflow unless it has `continue_on_error`.
//! - With a journal ([`Runner::journal`]) and a log ([`Runner::log`]; [`StoreLog`] keeps it in
//!   the toolloop store, feature `store`), each step's run is logged under
//!   `WORKFLOW_ID.STEP_ID` and the workflow's record lists the finished steps:
//!   [`Runner::resume`] continues a killed workflow at the step it was in, without running a
//!   finished step, a model call or a finished tool call again.
//! - [`WorkflowOutcome`] holds every step's [`StepResult`] (the design's `{stepId, success,
//!   output, metadata: {iterations, toolCalls, totalTokens}}`, with cost, duration and
//!   skipped); [`WorkflowEvent`]s tell the steps' starts and ends around their runs' events.
//!
//! ```toml
//! name = "article"
//!
//! [inputs.text]
//! description = "The text to work on"
//!
//! [[steps]]
//! id = "summarise"
//! prompt = "Summarise in three sentences:\n{{ inputs.text }}"
//!
//! [[steps]]
//! id = "extract"
//! prompt = "Give the title and the keywords of this summary:\n{{ steps.summarise.output }}"
//! output_schema = { type = "object", required = ["title", "keywords"], properties = { title = { type = "string" }, keywords = { type = "array", items = { type = "string" } } } }
//!
//! [[steps]]
//! id = "translate"
//! prompt = "Translate into French: {{ steps.extract.output.title }}"
//! ```

#![forbid(unsafe_code)]

mod check;
mod definition;
mod event;
mod output;
pub mod record;
mod result;
mod runner;
mod template;

pub use check::RESULT_FIELDS;
pub use definition::{
    DEFAULT_MAX_PARALLEL, DEFAULT_MAX_ROUNDS, DEFAULT_MAX_TOOL_CALLS, Defaults, FileAccess, Input,
    MAX_FILE_BYTES, MAX_SCHEMA_FILE_BYTES, Step, Workflow,
};
pub use event::WorkflowEvent;
#[cfg(feature = "store")]
pub use record::StoreLog;
pub use record::{MemoryLog, WorkflowLog, WorkflowRecord};
pub use result::{StepMetadata, StepResult, StepStatus, WorkflowOutcome, WorkflowStatus};
pub use runner::{
    Configure, ModelResolver, Runner, WorkflowEventHandler, new_workflow_id, step_run_id,
};

use std::path::PathBuf;

/// Why a workflow could not be read, checked, started or resumed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkflowError {
    /// The file could not be read or is not a workflow.
    #[error("{}{message}", path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default())]
    Parse {
        /// The file.
        path: Option<PathBuf>,
        /// What was wrong.
        message: String,
    },
    /// The workflow does not check: every problem found.
    #[error("the workflow does not check:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
    /// Inputs are missing or unknown.
    #[error("{}", .0.join("; "))]
    Inputs(Vec<String>),
    /// No workflow run with this id.
    #[error("no workflow run with id {0}")]
    NotFound(String),
    /// The workflow log failed.
    #[error("workflow log: {0}")]
    Log(String),
}
