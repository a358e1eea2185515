//! The workflow log: one record per workflow run (its definition, inputs and the results of
//! the steps that finished), saved after every step, so that a run killed in the middle is
//! resumed where it stood. The steps' own runs go to the run log ([`toolloop::journal`]).

use crate::WorkflowError;
use crate::definition::Workflow;
use crate::result::{StepResult, WorkflowStatus};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use toolloop::outcome::Outcome;

/// A workflow run as the log keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowRecord {
    /// The workflow run's id (`wf_` and a time-ordered UUID).
    pub workflow_id: String,
    /// The definition it runs (as read when it started: a resumed run does not read the file
    /// again).
    pub workflow: Workflow,
    /// The inputs, defaults filled in.
    pub inputs: BTreeMap<String, String>,
    /// What the application needs to run it again (the command's settings, say).
    #[serde(default)]
    pub meta: Value,
    /// Where it stands.
    pub status: WorkflowStatus,
    /// The results of the steps that finished (succeeded, failed or skipped), by step id.
    #[serde(default)]
    pub results: BTreeMap<String, StepResult>,
    /// When it started, in Unix milliseconds.
    pub created_ms: i64,
}

/// Where workflow records go.
#[async_trait]
pub trait WorkflowLog: Send + Sync {
    /// Saves a record (created on first save, replaced after); returns once it is durable.
    async fn save(&self, record: &WorkflowRecord) -> Result<(), WorkflowError>;
    /// The record of a workflow run; `None` when there is none.
    async fn load(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, WorkflowError>;
    /// Called with each step's run outcome when it ends (a store records how the run ended).
    async fn step_finished(&self, run_id: &str, outcome: &Outcome) -> Result<(), WorkflowError> {
        let _ = (run_id, outcome);
        Ok(())
    }
}

/// A workflow log in memory (for tests, and for one process's runs).
#[derive(Debug, Default)]
pub struct MemoryLog {
    records: Mutex<HashMap<String, WorkflowRecord>>,
}

impl MemoryLog {
    /// An empty log.
    pub fn new() -> Self {
        MemoryLog::default()
    }
}

#[async_trait]
impl WorkflowLog for MemoryLog {
    async fn save(&self, record: &WorkflowRecord) -> Result<(), WorkflowError> {
        self.records
            .lock()
            .map_err(|_| WorkflowError::Log("the in-memory log's lock was poisoned".into()))?
            .insert(record.workflow_id.clone(), record.clone());
        Ok(())
    }

    async fn load(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, WorkflowError> {
        Ok(self
            .records
            .lock()
            .map_err(|_| WorkflowError::Log("the in-memory log's lock was poisoned".into()))?
            .get(workflow_id)
            .cloned())
    }
}

/// Workflow records in the toolloop store (SQLite or PostgreSQL), beside the steps' run logs.
#[cfg(feature = "store")]
#[derive(Debug, Clone)]
pub struct StoreLog {
    store: toolloop_store::Store,
}

#[cfg(feature = "store")]
impl StoreLog {
    /// The log in `store`. Give the runner `store.run_journal(…)` as its journal for the steps'
    /// runs.
    pub fn new(store: toolloop_store::Store) -> Self {
        StoreLog { store }
    }
}

#[cfg(feature = "store")]
#[async_trait]
impl WorkflowLog for StoreLog {
    async fn save(&self, record: &WorkflowRecord) -> Result<(), WorkflowError> {
        let body = serde_json::to_value(record).map_err(|e| WorkflowError::Log(e.to_string()))?;
        self.store
            .save_workflow(
                &record.workflow_id,
                &record.workflow.name,
                record.status.as_str(),
                &body,
            )
            .await
            .map_err(|e| WorkflowError::Log(e.to_string()))
    }

    async fn load(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, WorkflowError> {
        let Some(body) = self
            .store
            .workflow(workflow_id)
            .await
            .map_err(|e| WorkflowError::Log(e.to_string()))?
        else {
            return Ok(None);
        };
        serde_json::from_value(body).map(Some).map_err(|e| {
            WorkflowError::Log(format!(
                "the record of workflow run {workflow_id} does not read: {e}"
            ))
        })
    }

    async fn step_finished(&self, run_id: &str, outcome: &Outcome) -> Result<(), WorkflowError> {
        self.store
            .save_outcome(run_id, outcome)
            .await
            .map_err(|e| WorkflowError::Log(e.to_string()))
    }
}
