//! The run log: every step of a run is written before it is acted on, so that a run killed at
//! any point can be rebuilt and continued.
//!
//! A run's log is the list of its machine's inputs ([`Record`] is [`crate::engine::Input`]):
//! the driver logs each input, then hands it to the machine. They are the model's responses
//! (with the approval subjects of their calls), each tool call's intent before it starts and
//! its result after it finishes, every hook's answer (`reminders`, `stop_when`,
//! `on_round_limit`), every approval decision, the run's tool catalog when its tools can change
//! (see [`crate::tool_source`]), and every interruption. Replaying the records into a fresh
//! [`crate::engine::Machine`] ([`crate::engine::Machine::replay`]) rebuilds the loop's state
//! exactly: the machine is deterministic given its inputs, and a hook's answer is an input, so
//! replaying never calls the hooks again (a hook that answers differently the second time
//! cannot make a log look corrupt), nor any tool. Logs written by toolloop 0.1 load as they
//! are; [`upgrade`] fills in what 0.1 did not log.
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

use crate::approval::{Action, Approvals};
pub use crate::engine::Input;
use crate::toolbox::{Catalog, Toolbox};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One durable step of a run: the run log holds the machine's inputs
/// ([`crate::engine::Input`]), in the order the driver gave them, so replaying a log is handing
/// its records to a fresh machine. Logs written by toolloop 0.1 load as they are and are
/// brought up to date by [`upgrade`].
pub type Record = Input;

/// Brings the records of a log written by toolloop 0.1 up to this version's, with the run's
/// live tools: a response's approval subjects, which 0.1 did not log
/// ([`Input::ModelResponded`]'s `subjects`), are taken from the tools, where `approvals` weighs
/// them; and a logged catalog's default approvals, which 0.1 did not log either
/// ([`crate::toolbox::CatalogEntry::default_approval`]), from the live tool of each name (allow
/// for a tool that is gone). This is what 0.1 did as it replayed, so the log replays to the
/// state 0.1 rebuilt. Records of this version are left as they are. [`crate::Agent::resume`]
/// does this before it replays a log.
pub fn upgrade(records: &mut [Record], live: &Toolbox, approvals: &Approvals) {
    for record in records {
        match record {
            Input::ModelResponded {
                response, subjects, ..
            } if subjects.is_empty() && !response.tool_calls.is_empty() => {
                *subjects = live.approval_subjects(approvals, &response.tool_calls);
            }
            Input::ToolsChanged { tools, .. }
                if tools.entries().iter().any(|e| e.default_approval.is_none()) =>
            {
                let filled = tools
                    .entries()
                    .iter()
                    .cloned()
                    .map(|mut e| {
                        if e.default_approval.is_none() {
                            e.default_approval = Some(
                                live.get(&e.name)
                                    .map_or(Action::Allow, |t| t.default_approval()),
                            );
                        }
                        e
                    })
                    .collect();
                // The entries were a catalog already: only their default approvals changed.
                if let Ok(catalog) = Catalog::new(filled) {
                    *tools = Arc::new(catalog);
                }
            }
            _ => {}
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
/// call's request ([`Input::ModelRequested`]) when its response or failure is there, and a
/// tool call's intent ([`Input::ToolStarted`]) when its result is. Such a record matters only
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
                subjects: Vec::new(),
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
