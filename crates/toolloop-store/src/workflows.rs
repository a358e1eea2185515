//! Workflow runs: the record a workflow runner keeps, saved and listed.

use crate::{Store, StoreError, db, now_ms, sql};
use serde_json::Value;
use sqlx::Row;

impl Store {
    /// Saves the record of a workflow run (created on first save, replaced after): its
    /// definition, inputs and finished steps, as the workflow runner keeps them (`body`), with
    /// its name and status for listing. The steps' own runs are logged like any run.
    pub async fn save_workflow(
        &self,
        workflow_id: &str,
        name: &str,
        status: &str,
        body: &Value,
    ) -> Result<(), StoreError> {
        let text = serde_json::to_string(body).map_err(|e| StoreError::Corrupt {
            what: format!("the record of workflow run {workflow_id}"),
            message: e.to_string(),
        })?;
        let now = now_ms();
        on_pool!(&self.inner.pool, p => {
            sqlx::query(sql::SAVE_WORKFLOW)
                .bind(workflow_id)
                .bind(name)
                .bind(status)
                .bind(&text)
                .bind(now)
                .execute(p)
                .await
                .map_err(db("saving a workflow run"))?;
        });
        Ok(())
    }

    /// The record of a workflow run saved with [`Store::save_workflow`]; `None` when there is no
    /// such run.
    pub async fn workflow(&self, workflow_id: &str) -> Result<Option<Value>, StoreError> {
        let body: Option<String> = on_pool!(&self.inner.pool, p => {
            sqlx::query_scalar(sql::LOAD_WORKFLOW)
                .bind(workflow_id)
                .fetch_optional(p)
                .await
                .map_err(db("reading a workflow run"))?
        });
        body.map(|b| serde_json::from_str(&b))
            .transpose()
            .map_err(|e| StoreError::Corrupt {
                what: format!("the record of workflow run {workflow_id}"),
                message: e.to_string(),
            })
    }

    /// Every workflow run, oldest first.
    pub async fn workflows(&self) -> Result<Vec<WorkflowSummary>, StoreError> {
        let rows = on_pool!(&self.inner.pool, p => {
            sqlx::query(sql::LIST_WORKFLOWS)
                .fetch_all(p)
                .await
                .map_err(db("listing workflow runs"))?
                .iter()
                .map(|row| -> Result<_, sqlx::Error> {
                    Ok(WorkflowSummary {
                        workflow_id: row.try_get("workflow_id")?,
                        name: row.try_get("name")?,
                        status: row.try_get("status")?,
                        created_ms: row.try_get("created_ms")?,
                        updated_ms: row.try_get("updated_ms")?,
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(db("reading workflow runs"))?
        });
        Ok(rows)
    }
}

/// A workflow run in the list (see [`Store::save_workflow`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkflowSummary {
    /// The workflow run's id.
    pub workflow_id: String,
    /// The workflow's name.
    pub name: String,
    /// Where it stands, as its runner said (`running`, `succeeded`, `failed`, …).
    pub status: String,
    /// When it started (Unix milliseconds).
    pub created_ms: i64,
    /// When it was last saved (Unix milliseconds).
    pub updated_ms: i64,
}
