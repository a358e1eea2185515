//! [`RunLog`]: where a logged run's records are queued and made durable, in order, with no gap.

use crate::engine::Input;
use crate::journal::{Journal, JournalError, new_run_id};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::sync::Arc;

/// Who holds a run's lease: this process, and an id of its own.
fn holder_id() -> String {
    format!("pid {} ({})", std::process::id(), new_run_id())
}

/// Where a logged run writes its records: queued by [`RunLog::soon`], made durable together by
/// [`RunLog::flush`] (waited for: before the run acts on them) or [`RunLog::flush_behind`]
/// (written while the run goes on; the next flush waits for it first). Flushes of one run go one
/// at a time and in order; a record queued while another flush is under way goes with the next
/// one, and a flush finds its records already written when an earlier flush took them. After a
/// failed flush every later one fails: nothing queued after a lost record is reported durable,
/// and nothing is written after it (the log never has a gap).
pub(super) struct RunLog {
    pub(super) journal: Arc<dyn Journal>,
    pub(super) run_id: String,
    pub(super) holder: String,
    queued: std::sync::Mutex<Vec<Input>>,
    flushing: tokio::sync::Mutex<Flushing>,
}

/// The state of a run's flushes.
#[derive(Default)]
struct Flushing {
    /// Set by the first failed flush.
    failed: Option<JournalError>,
    /// A flush still being written ([`RunLog::flush_behind`]).
    behind: Option<BoxFuture<'static, Result<(), JournalError>>>,
    /// How the flush being written ended, when it was found over without being awaited.
    behind_done: Option<Result<(), JournalError>>,
}

impl Flushing {
    /// Waits for the flush being written, if any; the first failure, if any.
    async fn settle(&mut self) -> Result<(), JournalError> {
        let written = match (self.behind_done.take(), self.behind.take()) {
            (Some(done), _) => Some(done),
            (None, Some(behind)) => Some(behind.await),
            (None, None) => None,
        };
        if let Some(Err(e)) = written {
            self.failed = Some(e);
        }
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl RunLog {
    pub(super) fn new(journal: Arc<dyn Journal>, run_id: String) -> Self {
        RunLog {
            journal,
            run_id,
            holder: holder_id(),
            queued: std::sync::Mutex::new(Vec::new()),
            flushing: tokio::sync::Mutex::new(Flushing::default()),
        }
    }

    /// Queues a record for the next flush.
    pub(super) fn soon(&self, record: Input) {
        self.queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record);
    }

    /// The queued records, without those the others imply.
    fn take_queued(&self) -> Vec<Input> {
        let mut records =
            std::mem::take(&mut *self.queued.lock().unwrap_or_else(|p| p.into_inner()));
        crate::journal::drop_implied(&mut records);
        records
    }

    /// Makes every queued record durable (after any flush still being written).
    pub(super) async fn flush(&self) -> Result<(), JournalError> {
        let mut state = self.flushing.lock().await;
        state.settle().await?;
        let records = self.take_queued();
        if records.is_empty() {
            return Ok(());
        }
        let written = self.journal.append_all(&self.run_id, &records).await;
        if let Err(e) = &written {
            state.failed = Some(e.clone());
        }
        written
    }

    /// Starts writing every queued record and returns at once: for records the run does not
    /// act on, so that their commit overlaps what the run does next (a model call); the next
    /// flush waits for it first. Fails only when an earlier flush failed.
    pub(super) async fn flush_behind(&self) -> Result<(), JournalError> {
        let mut state = self.flushing.lock().await;
        if let Some(behind) = state.behind.as_mut()
            && let Some(done) = behind.now_or_never()
        {
            state.behind = None;
            state.behind_done = Some(done);
        }
        if state.behind_done.is_some() || state.failed.is_some() {
            state.settle().await?;
        }
        let records = self.take_queued();
        if records.is_empty() {
            return Ok(());
        }
        // One at a time: a flush still being written is waited for (it has had a whole step).
        state.settle().await?;
        let mut behind = self.journal.clone().append_behind(&self.run_id, records);
        // A write that is over at once (a journal in memory) is not kept waiting.
        match (&mut behind).now_or_never() {
            Some(done) => state.behind_done = Some(done),
            None => state.behind = Some(behind),
        }
        Ok(())
    }

    /// Waits for a flush still being written; fails when it (or an earlier one) failed.
    pub(super) async fn settle(&self) -> Result<(), JournalError> {
        self.flushing.lock().await.settle().await
    }

    /// Queues a record and makes it durable, with everything queued before it.
    pub(super) async fn now(&self, record: Input) -> Result<(), JournalError> {
        self.soon(record);
        self.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{MemoryJournal, Record, StoreFailure};
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// A journal in memory whose writes can be held back (until `gate` opens) or fail once.
    struct Held {
        inner: MemoryJournal,
        gate: tokio::sync::Semaphore,
        hold: AtomicBool,
        fail_next: AtomicBool,
        /// Writes that reached the gate.
        held: std::sync::atomic::AtomicUsize,
    }

    impl Default for Held {
        fn default() -> Self {
            Held {
                inner: MemoryJournal::new(),
                gate: tokio::sync::Semaphore::new(0),
                hold: AtomicBool::new(false),
                fail_next: AtomicBool::new(false),
                held: Default::default(),
            }
        }
    }

    #[async_trait]
    impl Journal for Held {
        async fn append(&self, run_id: &str, record: &Record) -> Result<(), JournalError> {
            self.append_all(run_id, std::slice::from_ref(record)).await
        }
        async fn append_all(&self, run_id: &str, records: &[Record]) -> Result<(), JournalError> {
            if self.hold.load(Ordering::SeqCst) {
                self.held.fetch_add(1, Ordering::SeqCst);
                let _ = self.gate.acquire().await.map_err(StoreFailure::new);
            }
            if self.fail_next.swap(false, Ordering::SeqCst) {
                return Err(JournalError::Store(StoreFailure::new(
                    std::io::Error::other("disk full"),
                )));
            }
            self.inner.append_all(run_id, records).await
        }
        async fn load(&self, run_id: &str) -> Result<Vec<Record>, JournalError> {
            self.inner.load(run_id).await
        }
    }

    fn log_on(journal: &Arc<Held>) -> RunLog {
        RunLog::new(journal.clone(), "run-1".into())
    }

    fn written(journal: &Held) -> Vec<Record> {
        futures::executor::block_on(journal.load("run-1")).unwrap_or_default()
    }

    #[tokio::test]
    async fn a_flush_writes_what_was_queued_in_order_without_the_records_others_imply() {
        let journal = Arc::new(Held::default());
        let log = log_on(&journal);
        log.soon(Input::ModelRequested { round: 1 });
        log.soon(Input::ToolStarted {
            round: 1,
            index: 0,
            call_id: "a".into(),
        });
        log.soon(Input::ToolUnknown { round: 1, index: 0 });
        log.soon(Input::Finished);
        assert!(written(&journal).is_empty(), "queued is not written");
        log.flush().await.unwrap();
        // The intent is implied by the call's end; the model request stays (no answer).
        assert_eq!(
            written(&journal),
            vec![
                Input::ModelRequested { round: 1 },
                Input::ToolUnknown { round: 1, index: 0 },
                Input::Finished,
            ]
        );
        // Nothing is written twice.
        log.flush().await.unwrap();
        assert_eq!(written(&journal).len(), 3);
    }

    #[tokio::test]
    async fn after_a_failed_flush_nothing_more_is_written_or_reported_durable() {
        let journal = Arc::new(Held::default());
        let log = log_on(&journal);
        journal.fail_next.store(true, Ordering::SeqCst);
        let failed = log.now(Input::ModelRequested { round: 1 }).await;
        assert!(matches!(failed, Err(JournalError::Store(_))), "{failed:?}");
        // The journal works again, but the log would have a gap: every later write fails.
        let later = log.now(Input::Finished).await;
        assert!(
            later.is_err(),
            "a write after a lost one was reported durable"
        );
        assert!(log.flush_behind().await.is_err());
        assert!(log.settle().await.is_err());
        assert!(written(&journal).is_empty());
    }

    #[tokio::test]
    async fn a_flush_behind_returns_at_once_and_the_next_flush_waits_for_it() {
        let journal = Arc::new(Held::default());
        journal.hold.store(true, Ordering::SeqCst);
        let log = log_on(&journal);
        log.soon(Input::ModelRequested { round: 1 });
        // Returns while the write is held.
        tokio::time::timeout(Duration::from_secs(5), log.flush_behind())
            .await
            .expect("flush_behind waited for the write")
            .unwrap();
        while journal.held.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // Later writes are not held: a flush that did not wait would write at once.
        journal.hold.store(false, Ordering::SeqCst);
        log.soon(Input::Finished);
        let mut flush = Box::pin(log.flush());
        assert!(
            futures::poll!(&mut flush).is_pending(),
            "a flush went ahead of the one being written"
        );
        journal.gate.add_permits(1);
        flush.await.unwrap();
        assert_eq!(
            written(&journal),
            vec![Input::ModelRequested { round: 1 }, Input::Finished]
        );
    }

    #[tokio::test]
    async fn a_failed_flush_behind_is_reported_by_the_next_settle() {
        let journal = Arc::new(Held::default());
        journal.hold.store(true, Ordering::SeqCst);
        journal.fail_next.store(true, Ordering::SeqCst);
        let log = log_on(&journal);
        log.soon(Input::ModelRequested { round: 1 });
        log.flush_behind().await.unwrap();
        journal.gate.add_permits(1);
        assert!(log.settle().await.is_err());
        assert!(log.flush().await.is_err());
    }
}
