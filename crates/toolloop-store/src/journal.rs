//! The store as a run log ([`Journal`]): appends through the group writer, loads, and the
//! tagged journals of [`Store::run_journal`].

use crate::{Held, RunTags, Store, StoreError, db, now_ms, sql, writer};
use async_trait::async_trait;
use serde_json::Value;
use std::sync::Arc;
use toolloop::engine::ReplayError;
use toolloop::journal::{Journal, JournalError, Record, StoreFailure};

impl Store {
    /// A journal over this store that tags the runs it starts (session, application metadata)
    /// and reports their ids. The store itself is a journal with no tags.
    pub fn run_journal(&self, tags: RunTags) -> Arc<dyn Journal> {
        Arc::new(RunJournal {
            store: self.clone(),
            tags: Arc::new(tags),
        })
    }

    /// Appends through the store's group writer (see the module docs): the append completes
    /// even when the caller is not polled meanwhile, and shares its transaction with the other
    /// runs' appends waiting at the time. An append of more than [`writer::MAX_RECORDS`]
    /// records (never a step of the driver's) is committed in parts, in order.
    async fn append_tagged(
        &self,
        run_id: &str,
        records: &[Record],
        tags: &Arc<RunTags>,
    ) -> Result<(), JournalError> {
        let started = matches!(records.first(), Some(Record::Started { .. }));
        let lease = self.holder_of(run_id);
        for (part, records) in records.chunks(writer::MAX_RECORDS).enumerate() {
            let (written, took_lease) =
                self.start_part(run_id, records, part == 0, tags, &lease)?;
            let holder = lease.as_ref().map(|(h, _)| h.as_str());
            self.part_written(run_id, holder, took_lease, written.await)
                .await?;
        }
        if started && let Some(f) = &tags.on_started {
            f(run_id);
        }
        Ok(())
    }

    /// Like [`Store::append_tagged`], handing the records to the writer before it returns (see
    /// [`Journal::append_behind`]).
    fn append_tagged_behind(
        &self,
        run_id: &str,
        records: Vec<Record>,
        tags: Arc<RunTags>,
    ) -> futures::future::BoxFuture<'static, Result<(), JournalError>> {
        let store = self.clone();
        let run_id = run_id.to_string();
        if records.len() > writer::MAX_RECORDS {
            // In parts, one after the other: a task of its own writes them.
            let task =
                tokio::spawn(async move { store.append_tagged(&run_id, &records, &tags).await });
            return Box::pin(async move {
                task.await
                    .unwrap_or_else(|e| Err(JournalError::Store(StoreFailure::new(e))))
            });
        }
        let started = matches!(records.first(), Some(Record::Started { .. }));
        let lease = self.holder_of(&run_id);
        let sent = self.start_part(&run_id, &records, true, &tags, &lease);
        Box::pin(async move {
            let (written, took_lease) = sent?;
            let holder = lease.as_ref().map(|(h, _)| h.as_str());
            store
                .part_written(&run_id, holder, took_lease, written.await)
                .await?;
            if started && let Some(f) = &tags.on_started {
                f(&run_id);
            }
            Ok(())
        })
    }

    /// Hands part of a run's records to the writer (`first`: the part that starts the run when
    /// the records do, and takes a pending lease); its commit to come, and whether it takes the
    /// run's lease.
    fn start_part(
        &self,
        run_id: &str,
        records: &[Record],
        first: bool,
        tags: &RunTags,
        lease: &Option<(String, bool)>,
    ) -> Result<(writer::Pending, bool), JournalError> {
        let (kind, body) =
            writer::encode(records).map_err(|e| JournalError::Store(StoreFailure::new(e)))?;
        let started = first && matches!(records.first(), Some(Record::Started { .. }));
        let start = started.then(|| writer::Start {
            session: tags.session.clone(),
            session_revision: tags.session_revision,
            meta: tags.meta.as_ref().map(Value::to_string),
        });
        let pending = first && lease.as_ref().is_some_and(|(_, pending)| *pending);
        let take_lease = pending.then(|| now_ms() + self.inner.lease_ttl.as_millis() as i64);
        let append = writer::Append {
            run_id: run_id.to_string(),
            holder: lease.as_ref().map(|(h, _)| h.clone()),
            finished: records.iter().any(|r| matches!(r, Record::Finished)),
            kind,
            body,
            count: records.len(),
            start,
            take_lease,
            release: false,
        };
        Ok((self.inner.writer.start(append), take_lease.is_some()))
    }

    /// What the writer answered for part of a run's records.
    async fn part_written(
        &self,
        run_id: &str,
        holder: Option<&str>,
        took_lease: bool,
        written: writer::Written,
    ) -> Result<(), JournalError> {
        match written {
            writer::Written::Committed => {
                if took_lease && let Some(holder) = holder {
                    // The lease is in the store now: renew it from here on.
                    self.start_heartbeat(run_id, holder);
                }
                Ok(())
            }
            writer::Written::Fenced => {
                if let Some(holder) = holder {
                    self.forget_lease(run_id, holder);
                }
                let holder = self
                    .current_holder(run_id)
                    .await
                    .unwrap_or_else(|| "nobody".into());
                Err(JournalError::Locked {
                    run_id: run_id.to_string(),
                    holder: format!("{holder}; this process lost its lease and stopped writing"),
                })
            }
            writer::Written::Failed(message) => Err(StoreError::Database {
                doing: "committing run-log records".into(),
                source: message,
            }
            .into()),
        }
    }
}

#[async_trait]
impl Journal for Store {
    async fn append(&self, run_id: &str, record: &Record) -> Result<(), JournalError> {
        self.append_all(run_id, std::slice::from_ref(record)).await
    }

    async fn append_all(&self, run_id: &str, records: &[Record]) -> Result<(), JournalError> {
        self.append_tagged(run_id, records, no_tags()).await
    }

    fn append_behind(
        self: Arc<Self>,
        run_id: &str,
        records: Vec<Record>,
    ) -> futures::future::BoxFuture<'static, Result<(), JournalError>>
    where
        Self: 'static,
    {
        self.append_tagged_behind(run_id, records, no_tags().clone())
    }

    async fn load(&self, run_id: &str) -> Result<Vec<Record>, JournalError> {
        let rows: Vec<(i64, String)> = on_pool!(&self.inner.pool, p => {
            sqlx::query_as(sql::LOAD_ROWS)
                .bind(run_id)
                .fetch_all(p)
                .await
                .map_err(db("loading a run log"))?
        });
        if rows.is_empty() {
            return Err(JournalError::NotFound(run_id.to_string()));
        }
        // A row holds a step's records (or, written by earlier versions, one record), numbered
        // with its first record's number: the rows follow each other without a gap.
        let mut records = Vec::with_capacity(rows.len() * 2);
        for (seq, body) in &rows {
            let unreadable = |message: String| JournalError::Corrupt {
                run_id: run_id.to_string(),
                source: ReplayError::Unreadable {
                    record: records.len(),
                    message,
                },
            };
            if *seq != records.len() as i64 + 1 {
                return Err(unreadable(format!(
                    "the log goes from record {} to record {seq}",
                    records.len()
                )));
            }
            let row = writer::decode(body).map_err(|e| unreadable(e.to_string()))?;
            records.extend(row);
        }
        Ok(records)
    }

    async fn acquire(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        // A run this process holds but has not written yet.
        if let Some((other, true)) = self.holder_of(run_id) {
            if other == holder {
                return Ok(());
            }
            return Err(JournalError::Locked {
                run_id: run_id.to_string(),
                holder: format!("{other} in this process"),
            });
        }
        // A new run: its lease is written with its first records (a racer for the same run id
        // is refused there), which saves a commit per run.
        let seen = on_pool!(&self.inner.pool, p => {
            sqlx::query(sql::RUN_SEEN)
                .bind(run_id)
                .fetch_optional(p)
                .await
                .map_err(db("reading a run"))?
                .is_some()
        });
        if !seen {
            return self.acquire_new(run_id, holder).await;
        }
        match self.try_acquire(run_id, holder).await? {
            None => {
                self.start_heartbeat(run_id, holder);
                Ok(())
            }
            Some(other) => Err(JournalError::Locked {
                run_id: run_id.to_string(),
                holder: other,
            }),
        }
    }

    async fn acquire_new(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(other) = held.get(run_id) {
            if other.holder == holder {
                return Ok(());
            }
            return Err(JournalError::Locked {
                run_id: run_id.to_string(),
                holder: format!("{} in this process", other.holder),
            });
        }
        // Its lease is written with its first records (a racer for the same id is refused
        // there), which saves a commit per run, and a lookup.
        held.insert(
            run_id.to_string(),
            Held {
                holder: holder.to_string(),
                heartbeat: None,
                pending: true,
            },
        );
        Ok(())
    }

    async fn release(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        Ok(self.release_lease(run_id, holder).await?)
    }
}

/// A journal over a [`Store`] that tags the runs it starts; see [`Store::run_journal`].
struct RunJournal {
    store: Store,
    tags: Arc<RunTags>,
}

#[async_trait]
impl Journal for RunJournal {
    async fn append(&self, run_id: &str, record: &Record) -> Result<(), JournalError> {
        self.append_all(run_id, std::slice::from_ref(record)).await
    }
    async fn append_all(&self, run_id: &str, records: &[Record]) -> Result<(), JournalError> {
        self.store.append_tagged(run_id, records, &self.tags).await
    }
    fn append_behind(
        self: Arc<Self>,
        run_id: &str,
        records: Vec<Record>,
    ) -> futures::future::BoxFuture<'static, Result<(), JournalError>>
    where
        Self: 'static,
    {
        self.store
            .append_tagged_behind(run_id, records, self.tags.clone())
    }
    async fn load(&self, run_id: &str) -> Result<Vec<Record>, JournalError> {
        self.store.load(run_id).await
    }
    async fn acquire(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        self.store.acquire(run_id, holder).await
    }
    async fn acquire_new(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        self.store.acquire_new(run_id, holder).await
    }
    async fn release(&self, run_id: &str, holder: &str) -> Result<(), JournalError> {
        self.store.release(run_id, holder).await
    }
}

/// The tags of a run logged without any (no session, no metadata).
fn no_tags() -> &'static Arc<RunTags> {
    static NO_TAGS: std::sync::OnceLock<Arc<RunTags>> = std::sync::OnceLock::new();
    NO_TAGS.get_or_init(Default::default)
}
