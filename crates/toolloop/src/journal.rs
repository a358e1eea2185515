//! The run log: every step of a run is written before it is acted on, so that a run killed at
//! any point can be rebuilt and continued.
//!
//! The driver records a [`Record`] for the model's responses, each tool call's intent before it
//! starts and its result after it finishes, every hook's answer (`reminders`, `stop_when`,
//! `on_round_limit`), the run's tool catalog when its tools can change (see
//! [`crate::tool_source`]), and every interruption. Replaying the records into a fresh
//! [`crate::engine::Machine`] rebuilds the loop's state exactly: the machine is deterministic
//! given its inputs, and a hook's answer is an input, so replaying never calls the hooks again
//! (a hook that answers differently the second time cannot make a log look corrupt).
//!
//! Only what must be durable before the driver acts is waited for, and a step's records are
//! written together ([`Journal::append_all`], one transaction in the store): the run's start;
//! before a batch of tool calls runs, the model's response and the calls' intents (with the
//! request record and the hooks' answers before them); after the round's calls, their results,
//! written while the next model call goes on (the next write waits for them, and a response is
//! taken only once they are durable); and the run's end. A model call needs no durable record
//! before it is made: a crash during it leaves the round without a response, and the call is
//! made again on resume (a crash before the results are written leaves the calls in flight, as a
//! crash just after they finished would). On resume, model calls that already returned are
//! not made again and tool calls that already finished are not run again; a call that was in
//! flight is run again when its tool is read-only or idempotent, and reported as "outcome
//! unknown" when it has side effects (unless a resume policy says otherwise).
//!
//! [`MemoryJournal`] keeps records in memory (tests, single-process use); the `store` module
//! keeps them in SQLite or PostgreSQL.

use crate::config::RoundLimitDecision;
use crate::engine::Interrupt;
use crate::message::Message;
use crate::model::ModelResponse;
use crate::tool::{ToolError, ToolOutput};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One durable step of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// The run began with this conversation.
    Started {
        /// The conversation at the start (system prompt included).
        messages: Vec<Message>,
        /// The schema the final answer must match, if the run set one (see
        /// [`crate::output`]); a replay holds answers to this one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_schema: Option<crate::output::OutputSchema>,
    },
    /// The run's tools, for a run whose tools can change while it goes on (an agent with a
    /// [`crate::tool_source::ToolSource`]): logged with `started` (round 0) and whenever they
    /// change before a model call. From there on the run offers and judges calls by this
    /// catalog, so a replay does too, whatever is offered by then.
    ToolsChanged {
        /// The round whose model call offers them first (0: from the run's start).
        round: u32,
        /// The whole catalog.
        tools: Vec<crate::toolbox::CatalogEntry>,
    },
    /// The `reminders` hook answered, for the round about to start.
    RemindersGiven {
        /// The round about to start.
        round: u32,
        /// The reminders sent with that round's request.
        reminders: Vec<String>,
    },
    /// `stop_when` answered after every call of the round ran.
    StopChecked {
        /// The round.
        round: u32,
        /// The signal that ends the run, if it gave one.
        signal: Option<String>,
    },
    /// A model call is about to be made. The driver leaves it out of a write that holds the
    /// call's response (or failure), which implies it; replay takes either form.
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
    },
    /// The model call failed.
    ModelFailed {
        /// The round.
        round: u32,
        /// What happened.
        message: String,
    },
    /// A tool call is about to run (its intent). The driver leaves it out of a write that holds
    /// the call's result, which implies it: only an intent durable before its result says
    /// anything (that the call may have run).
    ToolStarted {
        /// The round.
        round: u32,
        /// The call's place in the round.
        index: usize,
        /// The call id.
        call_id: String,
    },
    /// A tool call finished.
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
    /// A side-effecting call was in flight at a crash and was not run again.
    ToolUnknown {
        /// The round.
        round: u32,
        /// The call's place in the round.
        index: usize,
    },
    /// A call's approval was decided, by a rule or a person (see [`crate::approval`]). The
    /// decision is bound to the call's id, tool and canonical arguments; replay applies it
    /// only to that exact call.
    ApprovalDecided {
        /// The round.
        round: u32,
        /// The call's place in the round.
        index: usize,
        /// The decision.
        decision: crate::approval::Decision,
    },
    /// `on_round_limit` decided.
    RoundLimitDecided {
        /// The decision.
        decision: RoundLimitDecision,
    },
    /// The run was interrupted.
    Interrupted {
        /// Why.
        why: Interrupt,
    },
    /// The run is over.
    Finished,
}

impl Record {
    /// The record's kind, as in its JSON (`started`, `model_requested`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Started { .. } => "started",
            Record::ToolsChanged { .. } => "tools_changed",
            Record::ModelRequested { .. } => "model_requested",
            Record::ModelResponded { .. } => "model_responded",
            Record::ModelFailed { .. } => "model_failed",
            Record::ToolStarted { .. } => "tool_started",
            Record::ToolFinished { .. } => "tool_finished",
            Record::ToolUnknown { .. } => "tool_unknown",
            Record::RemindersGiven { .. } => "reminders_given",
            Record::StopChecked { .. } => "stop_checked",
            Record::RoundLimitDecided { .. } => "round_limit_decided",
            Record::ApprovalDecided { .. } => "approval_decided",
            Record::Interrupted { .. } => "interrupted",
            Record::Finished => "finished",
        }
    }
}

/// A store's own failure (a database error, a full disk, …), kept with its causes so that
/// [`std::error::Error::source`] reaches them. Made from any error, or from a message:
/// `JournalError::Store("disk full".into())`.
#[derive(Debug, Clone)]
pub struct StoreFailure(Arc<dyn std::error::Error + Send + Sync>);

impl StoreFailure {
    /// The failure of an error, which stays reachable as the source.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreFailure(Arc::new(error))
    }
}

impl std::fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for StoreFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Failures are equal when they say the same.
impl PartialEq for StoreFailure {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

/// A failure with only a message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct FailureMessage(String);

impl From<String> for StoreFailure {
    fn from(message: String) -> Self {
        StoreFailure::new(FailureMessage(message))
    }
}

impl From<&str> for StoreFailure {
    fn from(message: &str) -> Self {
        StoreFailure::from(message.to_string())
    }
}

/// Why the run log failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JournalError {
    /// The store failed.
    #[error("run log error: {0}")]
    Store(#[source] StoreFailure),
    /// Another process holds the run.
    #[error("run {run_id} is held by another process ({holder}); try again when it has stopped")]
    Locked {
        /// The run.
        run_id: String,
        /// Who holds it.
        holder: String,
    },
    /// No such run.
    #[error("no run with id {0}")]
    NotFound(String),
    /// The records do not replay.
    #[error("the run log of {run_id} does not replay: {source}")]
    Corrupt {
        /// The run.
        run_id: String,
        /// What did not fit.
        #[source]
        source: crate::engine::ReplayError,
    },
}

/// Where run records go.
#[async_trait]
pub trait Journal: Send + Sync {
    /// Appends a record; returns once it is durable.
    async fn append(&self, run_id: &str, record: &Record) -> Result<(), JournalError>;
    /// Appends records in order; returns once all are durable. The driver writes a step's
    /// records together through this (see the module docs); a journal that can make them
    /// durable at once (one transaction) should. The default appends them one by one.
    async fn append_all(&self, run_id: &str, records: &[Record]) -> Result<(), JournalError> {
        for r in records {
            self.append(run_id, r).await?;
        }
        Ok(())
    }
    /// Starts appending records in order and returns at once; the future it returns resolves
    /// once they are durable. The write goes on whether or not that future is polled meanwhile
    /// (the driver overlaps it with the next model call, and awaits it before it acts). The
    /// default spawns a task that calls [`Journal::append_all`]; a journal that hands its writes
    /// to a writer of its own should start the write in the call instead.
    fn append_behind(
        self: Arc<Self>,
        run_id: &str,
        records: Vec<Record>,
    ) -> futures::future::BoxFuture<'static, Result<(), JournalError>>
    where
        Self: 'static,
    {
        let run_id = run_id.to_string();
        let task = tokio::spawn(async move { self.append_all(&run_id, &records).await });
        Box::pin(async move {
            task.await
                .unwrap_or_else(|e| Err(JournalError::Store(StoreFailure::new(e))))
        })
    }
    /// Every record of a run, in order.
    async fn load(&self, run_id: &str) -> Result<Vec<Record>, JournalError>;
    /// Takes the run for `holder`; fails with [`JournalError::Locked`] while another live holder
    /// has it.
    async fn acquire(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        let _ = (run_id, holder);
        Ok(())
    }
    /// Takes a run whose id no run has had yet (one [`new_run_id`] just made) for `holder`. A
    /// journal may skip looking the id up: a store writes the lease with the run's first
    /// records, and refuses them there if another holder took the id in the meantime. The
    /// default is [`Journal::acquire`].
    async fn acquire_new(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        self.acquire(run_id, holder).await
    }
    /// Gives the run back.
    async fn release(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        let _ = (run_id, holder);
        Ok(())
    }
}

/// A journal in memory.
#[derive(Debug, Default)]
pub struct MemoryJournal {
    runs: Mutex<HashMap<String, Vec<Record>>>,
    holders: Mutex<HashMap<String, String>>,
}

impl MemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        MemoryJournal::default()
    }

    /// The ids of the runs it holds.
    pub fn run_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .runs
            .lock()
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default();
        ids.sort();
        ids
    }

    /// Keeps only the first `n` records of a run (to simulate a crash in tests; with the
    /// `testing` feature).
    #[cfg(any(test, feature = "testing"))]
    pub fn truncate(&self, run_id: &str, n: usize) {
        if let Ok(mut runs) = self.runs.lock()
            && let Some(r) = runs.get_mut(run_id)
        {
            r.truncate(n);
        }
    }
}

fn poisoned<T>(_: T) -> JournalError {
    JournalError::Store("the in-memory journal's lock was poisoned".into())
}

#[async_trait]
impl Journal for MemoryJournal {
    async fn append(&self, run_id: &str, record: &Record) -> Result<(), JournalError> {
        self.runs
            .lock()
            .map_err(poisoned)?
            .entry(run_id.to_string())
            .or_default()
            .push(record.clone());
        Ok(())
    }

    async fn load(&self, run_id: &str) -> Result<Vec<Record>, JournalError> {
        self.runs
            .lock()
            .map_err(poisoned)?
            .get(run_id)
            .cloned()
            .ok_or_else(|| JournalError::NotFound(run_id.to_string()))
    }

    async fn acquire(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        let mut holders = self.holders.lock().map_err(poisoned)?;
        match holders.get(run_id) {
            Some(h) if h != holder => Err(JournalError::Locked {
                run_id: run_id.to_string(),
                holder: h.clone(),
            }),
            _ => {
                holders.insert(run_id.to_string(), holder.to_string());
                Ok(())
            }
        }
    }

    async fn release(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        let mut holders = self.holders.lock().map_err(poisoned)?;
        if holders.get(run_id).map(String::as_str) == Some(holder) {
            holders.remove(run_id);
        }
        Ok(())
    }
}

/// Drops from one write the records that a later record of the same write implies: a model
/// call's request ([`Record::ModelRequested`]) when its response or failure is there, and a
/// tool call's intent ([`Record::ToolStarted`]) when its result is. Such a record matters only
/// when it is durable before what it announces (a crash then finds the call in flight); written
/// in the same commit it says nothing more, and replay takes the response (the result) alone.
pub(crate) fn drop_implied(records: &mut Vec<Record>) {
    let answered: Vec<u32> = records
        .iter()
        .filter_map(|r| match r {
            Record::ModelResponded { round, .. } | Record::ModelFailed { round, .. } => {
                Some(*round)
            }
            _ => None,
        })
        .collect();
    let ended: Vec<(u32, usize)> = records
        .iter()
        .filter_map(|r| match r {
            Record::ToolFinished { round, index, .. } | Record::ToolUnknown { round, index } => {
                Some((*round, *index))
            }
            _ => None,
        })
        .collect();
    if answered.is_empty() && ended.is_empty() {
        return;
    }
    records.retain(|r| match r {
        Record::ModelRequested { round } => !answered.contains(round),
        Record::ToolStarted { round, index, .. } => !ended.contains(&(*round, *index)),
        _ => true,
    });
}

/// A fresh run id: `run_` and a UUID version 7 (48 bits of Unix milliseconds, then 74 random
/// bits), in 32 hex digits. Ids are unique across processes and machines without coordination,
/// and sort by creation time.
pub fn new_run_id() -> String {
    format!("run_{}", uuid::Uuid::now_v7().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_leaves_out_the_requests_and_intents_it_answers() {
        let finished = |index| Record::ToolFinished {
            round: 1,
            index,
            result: Ok(crate::tool::ToolOutput::text("ok")),
            duration_ms: 1,
            attempts: 1,
        };
        let started = |round, index: usize| Record::ToolStarted {
            round,
            index,
            call_id: format!("c{index}"),
        };
        let mut write = vec![
            Record::ModelRequested { round: 1 },
            Record::ModelResponded {
                round: 1,
                response: crate::model::ModelResponse::text("hi"),
                cost: None,
            },
            started(1, 0),
            started(1, 1),
            finished(0),
            // Another round's intent with the same index is not this result's.
            started(2, 0),
        ];
        drop_implied(&mut write);
        let kinds: Vec<&str> = write.iter().map(Record::kind).collect();
        assert_eq!(
            kinds,
            [
                "model_responded",
                "tool_started",
                "tool_finished",
                "tool_started"
            ]
        );
        assert!(matches!(write[1], Record::ToolStarted { index: 1, .. }));
        assert!(matches!(write[3], Record::ToolStarted { round: 2, .. }));
        // A request with no answer in the write stays: the call was in flight.
        let mut write = vec![
            Record::ModelRequested { round: 3 },
            Record::Interrupted {
                why: crate::engine::Interrupt::Cancelled,
            },
        ];
        drop_implied(&mut write);
        assert_eq!(write.len(), 2);
    }

    #[test]
    fn run_ids_are_time_ordered_uuids_unique_across_threads() {
        let ids: Vec<String> = (0..8)
            .map(|_| std::thread::spawn(|| (0..2000).map(|_| new_run_id()).collect::<Vec<_>>()))
            .flat_map(|t| t.join().unwrap())
            .collect();
        let unique: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());
        for id in &ids {
            let hex = id.strip_prefix("run_").unwrap();
            let uuid = uuid::Uuid::parse_str(hex).unwrap();
            assert_eq!(uuid.get_version_num(), 7, "{id}");
        }
        let a = new_run_id();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(new_run_id() > a, "later ids sort after");
    }
}
