//! Sessions: named transcripts, saved and loaded whole, and locked while a run uses one.

use crate::{Session, SessionSummary, Store, StoreError, db, now_ms, sql};
use sqlx::Row;
use toolloop::message::Message;
use toolloop::transcript::repair_transcript;

impl Store {
    /// Loads a session's transcript, checked and repaired (see [`toolloop::transcript`]); empty
    /// when there is no such session.
    pub async fn session_messages(&self, name: &str) -> Result<Vec<Message>, StoreError> {
        Ok(self
            .load_session_messages(name)
            .await?
            .map(|(m, _, _)| m)
            .unwrap_or_default())
    }

    /// The transcript (repaired), the repairs and the revision.
    async fn load_session_messages(
        &self,
        name: &str,
    ) -> Result<Option<(Vec<Message>, Vec<String>, i64)>, StoreError> {
        let row: Option<(String, i64)> = on_pool!(&self.inner.pool, p => {
            sqlx::query_as(sql::SESSION_MESSAGES)
                .bind(name)
                .fetch_optional(p)
                .await
                .map_err(db("loading a session"))?
        });
        let Some((text, revision)) = row else {
            return Ok(None);
        };
        let mut messages: Vec<Message> =
            serde_json::from_str(&text).map_err(|e| StoreError::Corrupt {
                what: format!("the transcript of session `{name}`"),
                message: e.to_string(),
            })?;
        let repairs = repair_transcript(&mut messages);
        for r in &repairs {
            tracing::warn!(session = name, "repaired the stored transcript: {r}");
        }
        Ok(Some((messages, repairs, revision)))
    }

    /// Saves a session's transcript (creating the session), replacing what was there, whatever
    /// was saved meanwhile. A run's transcript goes through [`Store::save_outcome`] instead,
    /// which never drops a turn saved after the run started.
    pub async fn save_session(&self, name: &str, messages: &[Message]) -> Result<(), StoreError> {
        let text = encode_transcript(messages)?;
        let now = now_ms();
        on_pool!(&self.inner.pool, p => {
            sqlx::query(sql::SAVE_SESSION)
                .bind(name)
                .bind(&text)
                .bind(messages.len() as i64)
                .bind(now)
                .execute(p)
                .await
                .map_err(db("saving a session"))?;
        });
        Ok(())
    }

    /// Takes session `name` for `holder`, so that its runs go one at a time, across processes
    /// and (on PostgreSQL) machines: another holder gets [`StoreError::SessionBusy`] while this
    /// one lives. The lease is renewed in the background and ends with
    /// [`Store::unlock_session`], when its expiry passes without renewal, or at once when the
    /// holder is provably dead (see the module docs on leases).
    pub async fn lock_session(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        let key = session_lease_key(name);
        match self.try_acquire(&key, holder).await? {
            None => {
                self.start_heartbeat(&key, holder);
                Ok(())
            }
            Some(other) => Err(StoreError::SessionBusy {
                session: name.to_string(),
                holder: other,
            }),
        }
    }

    /// Gives back a session taken with [`Store::lock_session`].
    pub async fn unlock_session(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        self.release_lease(&session_lease_key(name), holder).await
    }

    /// Every session, most recently updated first.
    pub async fn sessions(&self) -> Result<Vec<SessionSummary>, StoreError> {
        let rows = on_pool!(&self.inner.pool, p => {
            sqlx::query(&sql::list_sessions())
                .fetch_all(p)
                .await
                .map_err(db("listing sessions"))?
                .iter()
                .map(session_summary)
                .collect::<Result<Vec<_>, _>>()
                .map_err(db("reading sessions"))?
        });
        Ok(rows)
    }

    /// One session with its transcript (repaired), or `None`.
    pub async fn session(&self, name: &str) -> Result<Option<Session>, StoreError> {
        let summary = on_pool!(&self.inner.pool, p => {
            sqlx::query(&sql::one_session())
                .bind(name)
                .fetch_optional(p)
                .await
                .map_err(db("reading a session"))?
                .as_ref()
                .map(session_summary)
                .transpose()
                .map_err(db("reading a session"))?
        });
        let Some(mut summary) = summary else {
            return Ok(None);
        };
        let (messages, repairs, revision) =
            self.load_session_messages(name).await?.unwrap_or_default();
        // The revision the transcript was read at (a save may have come in between).
        summary.revision = revision;
        summary.message_count = messages.len() as i64;
        Ok(Some(Session {
            summary,
            messages,
            repairs,
        }))
    }

    /// Removes a session with its runs and their logs. Returns whether it existed.
    pub async fn remove_session(&self, name: &str) -> Result<bool, StoreError> {
        let existed = on_pool!(&self.inner.pool, p => {
            let mut tx = p.begin().await.map_err(db("starting a transaction"))?;
            let mut n = 0;
            for q in sql::DELETE_SESSION {
                n += sqlx::query(q)
                    .bind(name)
                    .execute(&mut *tx)
                    .await
                    .map_err(db("removing a session"))?
                    .rows_affected();
            }
            tx.commit().await.map_err(db("removing a session"))?;
            n > 0
        });
        Ok(existed)
    }
}

/// A session's key in the lease table (run ids never contain a colon).
fn session_lease_key(name: &str) -> String {
    format!("session:{name}")
}

pub(crate) fn encode_transcript(messages: &[Message]) -> Result<String, StoreError> {
    serde_json::to_string(messages).map_err(|e| StoreError::Corrupt {
        what: "a transcript to save".into(),
        message: e.to_string(),
    })
}

fn session_summary<R: Row>(row: &R) -> Result<SessionSummary, sqlx::Error>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(SessionSummary {
        name: row.try_get("name")?,
        message_count: row.try_get("message_count")?,
        runs: row.try_get("runs")?,
        revision: row.try_get("revision")?,
        created_ms: row.try_get("created_ms")?,
        updated_ms: row.try_get("updated_ms")?,
    })
}
