//! Runs in the run log: a new run's first records, a resumed run's replay, and a logged run's
//! outcome read back.

use super::{Agent, RunLog, drive::take};
use crate::engine::{Input, Machine};
use crate::journal::{JournalError, new_run_id};
use crate::outcome::Outcome;
use crate::toolbox::Toolbox;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

impl Agent {
    /// Opens the run log for a new run: a fresh id and the `started` record.
    pub(super) async fn start_log(
        &self,
        machine: &Machine,
        run_id: Option<String>,
    ) -> Result<Option<RunLog>, JournalError> {
        let Some(journal) = &self.parts.journal else {
            return Ok(None);
        };
        let log = match run_id {
            Some(id) => {
                let log = RunLog::new(journal.clone(), id);
                log.journal.acquire(&log.run_id, &log.holder).await?;
                log
            }
            // A fresh id is no run's yet: nothing to look up.
            None => {
                let log = RunLog::new(journal.clone(), new_run_id());
                log.journal.acquire_new(&log.run_id, &log.holder).await?;
                log
            }
        };
        let started = Input::Started {
            messages: machine.messages().to_vec(),
            output_schema: machine.output_schema().cloned(),
        };
        if self.has_tool_sources() {
            // Tools that can change are logged, so that a replay judges calls by these (the
            // machine was made with them).
            let tools = Input::ToolsChanged {
                round: 0,
                tools: machine.catalog().clone(),
            };
            log.journal
                .append_all(&log.run_id, &[started, tools])
                .await?;
        } else {
            log.journal.append(&log.run_id, &started).await?;
        }
        Ok(Some(log))
    }

    /// Continues a logged run from its last durable step (after a crash, say). Model calls that
    /// returned are not made again and tool calls that finished are not run again. A call that
    /// was in flight is run again when its tool is read-only or idempotent; for a
    /// side-effecting tool the `on_in_flight` policy decides (default: report "outcome
    /// unknown" to the model). A run that had already finished just gives its outcome.
    ///
    /// Fails when no journal is configured, the run is unknown, its log does not replay, or
    /// another process holds it.
    pub async fn resume(
        &self,
        run_id: &str,
        cancel: CancellationToken,
    ) -> Result<Outcome, JournalError> {
        let journal = self
            .parts
            .journal
            .clone()
            .ok_or_else(|| JournalError::Store("no run log (journal) is configured".into()))?;
        let log = RunLog::new(journal, run_id.to_string());
        let (mut machine, toolbox) = self.take_and_replay(&log).await?;
        let log = Some(log);
        for index in machine.in_flight() {
            let Some(call) = machine.round_call(index).cloned() else {
                continue;
            };
            if !self.retries_in_flight(&toolbox, &call) {
                // Goes with the next durable write: decided again if lost.
                let round = machine.round();
                take(&mut machine, &log, Input::ToolUnknown { round, index });
            }
        }
        Ok(self
            .drive(
                machine,
                toolbox,
                Some(cancel),
                self.parts.on_event.clone(),
                log,
            )
            .await)
    }

    /// The outcome of a logged run as its log holds it, without running or changing anything
    /// (no lease is taken): a finished run's outcome; an unfinished one's so far, as if
    /// cancelled. Its `messages` (or, with a context policy, its `context` view) is the
    /// conversation the run's next model call would have been sent: after a run that failed on
    /// a model error ([`StopReason::ModelError`](crate::outcome::StopReason::ModelError)), a new run started from it goes on where the
    /// failed call left off, with nothing the run did made or run again.
    ///
    /// Fails when no journal is configured, the run is unknown, or its log does not replay.
    pub async fn logged_outcome(&self, run_id: &str) -> Result<Outcome, JournalError> {
        let journal = self
            .parts
            .journal
            .clone()
            .ok_or_else(|| JournalError::Store("no run log (journal) is configured".into()))?;
        let mut records = journal.load(run_id).await?;
        let live = self.tools_now().await;
        crate::journal::upgrade(&mut records, &live, &self.parts.config.approvals);
        let machine = Machine::replay(
            self.parts.config.clone(),
            (&self.parts.hooks).into(),
            live.catalog().clone(),
            records,
        )
        .map_err(|source| JournalError::Corrupt {
            run_id: run_id.to_string(),
            source,
        })?;
        let mut outcome = machine.into_outcome(0);
        outcome.run_id = Some(run_id.to_string());
        Ok(outcome)
    }

    /// Takes the run's lease and rebuilds its machine from its log (the lease is given back on
    /// failure), with the toolbox the run has now: the live tools, judged by the catalog the
    /// log holds last, if it holds one.
    pub(super) async fn take_and_replay(
        &self,
        log: &RunLog,
    ) -> Result<(Machine, Arc<Toolbox>), JournalError> {
        let run_id = log.run_id.as_str();
        log.journal.acquire(run_id, &log.holder).await?;
        let mut records = match log.journal.load(run_id).await {
            Ok(r) => r,
            Err(e) => {
                let _ = log.journal.release(run_id, &log.holder).await;
                return Err(e);
            }
        };
        let live = self.tools_now().await;
        crate::journal::upgrade(&mut records, &live, &self.parts.config.approvals);
        let replayed = Machine::replay(
            self.parts.config.clone(),
            (&self.parts.hooks).into(),
            live.catalog().clone(),
            records,
        );
        match replayed {
            Ok(machine) => {
                let toolbox = if Arc::ptr_eq(machine.catalog(), live.catalog()) {
                    live
                } else {
                    Arc::new(Toolbox::from_catalog(machine.catalog().clone(), &live))
                };
                Ok((machine, toolbox))
            }
            Err(source) => {
                let _ = log.journal.release(run_id, &log.holder).await;
                Err(JournalError::Corrupt {
                    run_id: run_id.to_string(),
                    source,
                })
            }
        }
    }
}
