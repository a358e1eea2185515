//! Runs: their leases (taken, renewed, given back, taken over from a holder that is gone),
//! outcomes, and the lists of runs.

use crate::sessions::encode_transcript;
use crate::{Held, RunStatus, RunSummary, Store, StoreError, db, lease, now_ms, sql, writer};
use serde_json::Value;
use sqlx::Row;
use toolloop::outcome::{Outcome, StopReason};

/// Binds a lease's first parameters, as [`sql::INSERT_LEASE`] and [`sql::TAKE_OVER_LEASE`]
/// take them: the run, the holder, this process (host, pid and start) and the expiry.
macro_rules! bind_lease {
    ($query:expr, $run_id:expr, $holder:expr, $me:expr, $until:expr) => {
        $query
            .bind($run_id)
            .bind($holder)
            .bind(&$me.host)
            .bind($me.pid)
            .bind(&$me.start)
            .bind($until)
    };
}

impl Store {
    /// The holder of a lease this process holds, and whether that lease is pending.
    pub(crate) fn holder_of(&self, run_id: &str) -> Option<(String, bool)> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .map(|h| (h.holder.clone(), h.pending))
    }

    /// Forgets a lease this process held (taken over, or given back).
    pub(crate) fn forget_lease(&self, run_id: &str, holder: &str) {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.get(run_id).is_some_and(|h| h.holder == holder)
            && let Some(h) = held.remove(run_id)
        {
            h.stop();
        }
    }

    pub(crate) async fn current_holder(&self, run_id: &str) -> Option<String> {
        on_pool!(&self.inner.pool, p => {
            sqlx::query(sql::SELECT_LEASE)
                .bind(run_id)
                .fetch_optional(p)
                .await
                .ok()
                .flatten()
                .and_then(|row| row.try_get::<String, _>("holder").ok())
        })
    }

    /// Takes the lease, or finds who holds it. `Ok(None)`: taken.
    pub(crate) async fn try_acquire(
        &self,
        run_id: &str,
        holder: &str,
    ) -> Result<Option<String>, StoreError> {
        let me = lease::me();
        let ttl = self.inner.lease_ttl.as_millis() as i64;
        for _ in 0..8 {
            let now = now_ms();
            let taken = on_pool!(&self.inner.pool, p => {
                bind_lease!(sqlx::query(sql::INSERT_LEASE), run_id, holder, me, now + ttl)
                    .execute(p)
                    .await
                    .map_err(db("taking a lease"))?
                    .rows_affected()
            });
            if taken == 1 {
                return Ok(None);
            }
            let row = on_pool!(&self.inner.pool, p => {
                sqlx::query(sql::SELECT_LEASE)
                    .bind(run_id)
                    .fetch_optional(p)
                    .await
                    .map_err(db("reading a lease"))?
                    .map(|row| -> Result<_, sqlx::Error> {
                        Ok((
                            row.try_get::<String, _>("holder")?,
                            row.try_get::<String, _>("host")?,
                            row.try_get::<i64, _>("pid")?,
                            row.try_get::<String, _>("pid_start")?,
                            row.try_get::<i64, _>("expires_ms")?,
                        ))
                    })
                    .transpose()
                    .map_err(db("reading a lease"))?
            });
            let Some((old_holder, host, pid, start, expires)) = row else {
                continue; // released meanwhile
            };
            let ours = old_holder == holder;
            let free = expires <= now || lease::is_gone(&host, pid, &start);
            if !ours && !free {
                let host_name = host.split('/').next().unwrap_or(&host).to_string();
                return Ok(Some(format!("{old_holder} on {host_name}")));
            }
            let moved = on_pool!(&self.inner.pool, p => {
                bind_lease!(sqlx::query(sql::TAKE_OVER_LEASE), run_id, holder, me, now + ttl)
                    .bind(&old_holder)
                    .bind(expires)
                    .execute(p)
                    .await
                    .map_err(db("taking over a lease"))?
                    .rows_affected()
            });
            if moved == 1 {
                if !ours {
                    tracing::info!(run_id, previous = %old_holder, "took over the lease of a stopped holder");
                }
                return Ok(None);
            }
        }
        Err(StoreError::Database {
            doing: "taking a lease".into(),
            source: "the lease kept changing hands; try again".into(),
        })
    }

    pub(crate) fn start_heartbeat(&self, run_id: &str, holder: &str) {
        let pool = self.inner.pool.clone();
        let ttl = self.inner.lease_ttl;
        let (run, who) = (run_id.to_string(), holder.to_string());
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                let expires = now_ms() + ttl.as_millis() as i64;
                let renewed: Result<u64, sqlx::Error> = on_pool!(&pool, p => {
                    sqlx::query(sql::RENEW_LEASE)
                        .bind(&run)
                        .bind(&who)
                        .bind(expires)
                        .execute(p)
                        .await
                        .map(|r| r.rows_affected())
                });
                match renewed {
                    Ok(0) => {
                        tracing::warn!(run_id = %run, "the run's lease was taken over");
                        break;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(run_id = %run, "cannot renew the lease: {e}"),
                }
            }
        });
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = held.insert(
            run_id.to_string(),
            Held {
                holder: holder.to_string(),
                heartbeat: Some(task.abort_handle()),
                pending: false,
            },
        ) {
            old.stop();
        }
    }

    /// Records how a run ended and, when the run belongs to a session, saves its transcript
    /// there (with a context policy, the conversation as the run last sent it:
    /// [`Outcome::context`]), in one transaction.
    ///
    /// The transcript is saved only while the session is at the revision the run started from
    /// (see [`RunTags::session_revision`](crate::RunTags::session_revision)): when another run saved a turn meanwhile, nothing is
    /// written and the error is [`StoreError::SessionMoved`] (the run's turn stays in its log).
    /// A run's outcome is recorded once: called again for a run already recorded (a finished
    /// run resumed, say), it changes nothing. A run that stopped awaiting approval
    /// ([`StopReason::AwaitingApproval`]) is not over: only its stop reason is recorded (it is
    /// [`RunStatus::AwaitingApproval`] until more is logged), and its outcome is recorded when
    /// it ends.
    pub async fn save_outcome(&self, run_id: &str, outcome: &Outcome) -> Result<(), StoreError> {
        let awaiting = outcome.stop_reason == StopReason::AwaitingApproval;
        let reason = serde_json::to_value(outcome.stop_reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string));
        // With a context policy, the session goes on from the conversation as last sent
        // (compacted, old results cleared, spilled results kept whole), not from the whole
        // transcript.
        let messages = outcome.continuation();
        let messages = &messages[..];
        let text = encode_transcript(messages)?;
        let count = messages.len() as i64;
        let now = now_ms();
        on_pool!(&self.inner.pool, p => {
            let mut tx = p
                .begin_with(crate::begin_write(p))
                .await
                .map_err(db("starting a transaction"))?;
            let row = sqlx::query(sql::RUN_META)
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db("reading a run"))?
                .map(|row| -> Result<_, sqlx::Error> {
                    Ok((
                        row.try_get::<Option<String>, _>("session")?,
                        row.try_get::<Option<i64>, _>("session_revision")?,
                        row.try_get::<Option<String>, _>("stop_reason")?,
                    ))
                })
                .transpose()
                .map_err(db("reading a run"))?;
            let Some((session, base, recorded)) = row else {
                return Ok(());
            };
            if recorded.is_some() && recorded.as_deref() != Some(AWAITING) {
                return Ok(());
            }
            sqlx::query(sql::SET_STOP_REASON)
                .bind(run_id)
                .bind(reason)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db("recording a run's outcome"))?;
            if let Some(session) = session.filter(|_| !awaiting) {
                let saved = match base {
                    Some(base) => sqlx::query(sql::SAVE_SESSION_AT)
                        .bind(&session)
                        .bind(&text)
                        .bind(count)
                        .bind(now)
                        .bind(base)
                        .execute(&mut *tx)
                        .await
                        .map_err(db("saving a session"))?
                        .rows_affected(),
                    None => 0,
                };
                if saved == 0 {
                    let exists: Option<i64> = sqlx::query_scalar(sql::SESSION_REVISION)
                        .bind(&session)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db("reading a session"))?;
                    if exists.is_some() && base.is_some() {
                        return Err(StoreError::SessionMoved {
                            session,
                            run_id: run_id.to_string(),
                        });
                    }
                    // A run from before session revisions, or a session removed meanwhile.
                    sqlx::query(sql::SAVE_SESSION)
                        .bind(&session)
                        .bind(&text)
                        .bind(count)
                        .bind(now)
                        .execute(&mut *tx)
                        .await
                        .map_err(db("saving a session"))?;
                }
            }
            tx.commit().await.map_err(db("saving a run's outcome"))?;
        });
        Ok(())
    }

    /// Checks that continuing run `run_id` cannot drop turns of its session: fails with
    /// [`StoreError::SessionMoved`] when the run's turn is not saved yet and its session has had
    /// other turns saved since the run started. Unknown runs and runs without a session pass.
    pub async fn check_resume(&self, run_id: &str) -> Result<(), StoreError> {
        let Some(run) = self.run(run_id).await? else {
            return Ok(());
        };
        let Some(session) = &run.session else {
            return Ok(());
        };
        // A run that stopped awaiting approval has not saved its turn yet.
        let saved = |r: &RunSummary| {
            r.stop_reason
                .is_some_and(|reason| reason != StopReason::AwaitingApproval)
        };
        if saved(&run) {
            return Ok(());
        }
        let current: Option<i64> = on_pool!(&self.inner.pool, p => {
            sqlx::query_scalar(sql::SESSION_REVISION)
                .bind(session)
                .fetch_optional(p)
                .await
                .map_err(db("reading a session"))?
        });
        let moved = match (run.session_revision, current) {
            (_, None) => false,
            (Some(base), Some(now)) => now != base,
            // A run from before session revisions: a later run saved its turn.
            (None, Some(_)) => self
                .runs(Some(session))
                .await?
                .iter()
                .any(|r| r.run_id != run.run_id && r.created_ms >= run.created_ms && saved(r)),
        };
        if moved {
            return Err(StoreError::SessionMoved {
                session: session.clone(),
                run_id: run_id.to_string(),
            });
        }
        Ok(())
    }

    /// Runs, oldest first: all of them, or those of one session.
    pub async fn runs(&self, session: Option<&str>) -> Result<Vec<RunSummary>, StoreError> {
        self.summaries(&sql::list_runs(), session, "listing runs")
            .await
    }

    /// One run, or `None`.
    pub async fn run(&self, run_id: &str) -> Result<Option<RunSummary>, StoreError> {
        let found = self
            .summaries(&sql::one_run(), Some(run_id), "reading a run")
            .await?;
        Ok(found.into_iter().next())
    }

    /// The runs `query` selects, with `key` as its `$1`, read as of now; `doing` says what the
    /// reading was for when it fails.
    async fn summaries(
        &self,
        query: &str,
        key: Option<&str>,
        doing: &str,
    ) -> Result<Vec<RunSummary>, StoreError> {
        let now = now_ms();
        let rows = on_pool!(&self.inner.pool, p => {
            sqlx::query(query)
                .bind(key)
                .fetch_all(p)
                .await
                .map_err(db(doing))?
                .iter()
                .map(|r| run_summary(r, now))
                .collect::<Result<Vec<_>, _>>()
                .map_err(db(doing))?
        });
        Ok(rows)
    }

    /// A run's session and application metadata (see [`RunTags`](crate::RunTags)); `None` when there is no
    /// such run.
    pub async fn run_tags(
        &self,
        run_id: &str,
    ) -> Result<Option<(Option<String>, Option<Value>)>, StoreError> {
        let row = on_pool!(&self.inner.pool, p => {
            sqlx::query(sql::RUN_META)
                .bind(run_id)
                .fetch_optional(p)
                .await
                .map_err(db("reading a run"))?
                .map(|row| -> Result<_, sqlx::Error> {
                    Ok((
                        row.try_get::<Option<String>, _>("session")?,
                        row.try_get::<Option<String>, _>("meta")?,
                    ))
                })
                .transpose()
                .map_err(db("reading a run"))?
        });
        let Some((session, meta)) = row else {
            return Ok(None);
        };
        let meta = meta
            .map(|m| serde_json::from_str::<Value>(&m))
            .transpose()
            .map_err(|e| StoreError::Corrupt {
                what: format!("the metadata of run {run_id}"),
                message: e.to_string(),
            })?;
        Ok(Some((session, meta)))
    }
    /// Ends a lease this process holds (a run's, or a session's), through the group writer
    /// (it shares a commit with the other runs' appends). A pending lease was never written:
    /// nothing is.
    pub(crate) async fn release_lease(&self, run_id: &str, holder: &str) -> Result<(), StoreError> {
        let pending = self
            .holder_of(run_id)
            .is_some_and(|(h, pending)| pending && h == holder);
        self.forget_lease(run_id, holder);
        if pending {
            return Ok(());
        }
        let append = writer::Append {
            run_id: run_id.to_string(),
            holder: Some(holder.to_string()),
            kind: String::new(),
            body: String::new(),
            count: 0,
            start: None,
            finished: false,
            take_lease: None,
            release: true,
        };
        match self.inner.writer.write(append).await {
            // Fenced: the lease is someone else's, so not this holder's to end.
            writer::Written::Committed | writer::Written::Fenced => Ok(()),
            writer::Written::Failed(source) => Err(StoreError::Database {
                doing: "releasing a lease".into(),
                source,
            }),
        }
    }
}

/// The stop reason of a run that waits for approvals, as stored.
const AWAITING: &str = "awaiting_approval";

fn run_summary<R: Row>(row: &R, now: i64) -> Result<RunSummary, sqlx::Error>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let finished: bool = row.try_get("finished")?;
    let holder: Option<String> = row.try_get("holder")?;
    let host: Option<String> = row.try_get("host")?;
    let pid: Option<i64> = row.try_get("pid")?;
    let start: Option<String> = row.try_get("pid_start")?;
    let expires: Option<i64> = row.try_get("expires_ms")?;
    let live = match (&holder, &host, pid, &start, expires) {
        (Some(_), Some(host), Some(pid), Some(start), Some(expires)) => {
            expires > now && !lease::is_gone(host, pid, start)
        }
        _ => false,
    };
    let stop_reason: Option<String> = row.try_get("stop_reason")?;
    // Stopped awaiting approval, and nothing logged since (a resume that then crashed is
    // interrupted).
    let awaiting = stop_reason.as_deref() == Some(AWAITING)
        && row.try_get::<i64, _>("updated_ms")? <= row.try_get::<i64, _>("row_updated_ms")?;
    let status = if finished {
        RunStatus::Finished
    } else if live {
        RunStatus::Running
    } else if awaiting {
        RunStatus::AwaitingApproval
    } else {
        RunStatus::Interrupted
    };
    Ok(RunSummary {
        run_id: row.try_get("run_id")?,
        session: row.try_get("session")?,
        session_revision: row.try_get("session_revision")?,
        status,
        stop_reason: stop_reason.and_then(|s| serde_json::from_value(Value::String(s)).ok()),
        records: row.try_get("records")?,
        created_ms: row.try_get("created_ms")?,
        updated_ms: row.try_get("updated_ms")?,
        holder: if live { holder } else { None },
    })
}
