//! The store: sessions and durable runs in SQLite (the embedded default) or PostgreSQL (for
//! several machines), one implementation over both (sqlx), migrations included.
//!
//! Features: `sqlite` and `postgres` (either or both).
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use toolloop::agent::Agent;
//! use toolloop::message::Message;
//! use toolloop::providers::test_model::TestModel;
//! use toolloop_store::{RunTags, Store};
//!
//! let store = Store::open("/tmp/toolloop.db").await?; // or "postgres://user@host/db"
//! // One run of the session at a time, across processes.
//! store.lock_session("demo", "worker 1").await?;
//! let session = store.session("demo").await?; // checked and repaired
//! let (mut messages, revision) = session
//!     .map(|s| (s.messages, Some(s.summary.revision)))
//!     .unwrap_or_default();
//! messages.push(Message::user("What changed?"));
//! let tags = RunTags { session_revision: revision, ..RunTags::session("demo") };
//! let agent = Agent::builder(TestModel::new())
//!     .journal(store.run_journal(tags))
//!     .build()?;
//! let outcome = agent.run(messages).await;
//! // The transcript goes back to the session; a crashed run is continued with
//! // `agent.resume(run_id, cancel)` and saved the same way.
//! store.save_outcome(outcome.run_id.as_deref().unwrap_or_default(), &outcome).await?;
//! store.unlock_session("demo", "worker 1").await?;
//! store.close().await; // before the process ends
//! # Ok(())
//! # }
//! ```
//!
//! # What is stored
//!
//! - **Runs and their log.** [`Store`] implements [`Journal`]: the records a step writes
//!   together ([`Journal::append_all`]) go in one transaction, committed when the call returns.
//!   Runs share their store's commits (group commit): one writer per store takes every append
//!   waiting when it is free, from every run, and commits them in one transaction (on a SQLite
//!   file the writer is a thread of its own with its own connection; on PostgreSQL the
//!   transaction is one call of a function the store's migrations make, and two go side by
//!   side: [`Store::with_writers`]); each append returns when its transaction has committed.
//!   While many runs write at once, the writer waits a moment before each commit so that more
//!   steps share it ([`Store::with_commit_delay`]); [`Store::writer_stats`] counts what it did.
//!   When that transaction fails, every append in it fails and nothing of it is written (the
//!   driver then stops each of those runs with `StopReason::StoreFailed` before it acts); a run
//!   whose lease was taken over is refused alone, the others are committed.
//!
//!   A step is one row of the log. Rows are kept in the order they are written, each naming
//!   its run and linking to the run's previous row, and each running run's last row and record
//!   number are kept in a narrow table of their own: a commit of many runs' steps writes its rows
//!   one after the other and its runs' tails, which sit together, and nothing else per run. A
//!   run's log is read by following the links back from its last row; logs written by earlier
//!   versions (a table keyed by run and number) still load, and continue in the new one.
//!
//!   How far a commit survives is the store's [`Durability`]: with
//!   [`Durability::Process`] (the default) a killed process loses nothing committed, and a
//!   power cut or an operating-system crash may lose the last commits; with
//!   [`Durability::PowerCut`] a commit is on disk when it returns. On SQLite (WAL mode) these are
//!   `synchronous=NORMAL` (no fsync per commit; the log is synced at checkpoints) and
//!   `synchronous=FULL` (one fsync per commit). PostgreSQL commits are as durable as the
//!   server's settings make them (by default on disk) in both modes. A record lost to a power
//!   cut after its tool ran is a side effect repeated on resume: choose
//!   [`Durability::PowerCut`] for tools whose effects must never repeat after a machine crash.
//! - **Closing.** [`Store::close`] commits what was handed to the writer and closes the
//!   connections, for a process about to end. On a SQLite file whose log (WAL) has grown past
//!   1 MiB, the last connection to close copies the log into the database and removes it, so
//!   the next process opens it at once. A shorter log is left in place: its commits are as
//!   durable there, every connection reads them, and the next process reads it through once
//!   (well under a millisecond) and appends to it. Copying it in at every close would cost a
//!   process that makes one run (one `toolloop run`) two syncs of the disk at its end and two
//!   more at its first commit (a new log, its header and its directory synced), which on a busy
//!   disk is most of what the store costs it. (A copy of the store made with `cp` while no
//!   process has it open takes the `-wal` file with the database.)
//! - **Leases.** [`Journal::acquire`] takes a run for a holder: the lease names the holder's
//!   host, process and process start time, and has an expiry the store renews in the background
//!   (every third of [`Store::with_lease_ttl`], 30 s by default) while the run goes on. Another
//!   process gets [`JournalError::Locked`] while the holder lives; once the lease expires, or at
//!   once when the holder is provably dead (same host and boot, process gone), the run can be
//!   taken over. Appends are fenced: a holder whose lease was taken over cannot write another
//!   record. A run that has written nothing yet (a new run id) costs no commit of its own: its
//!   lease is written with its first records, in their transaction, and two processes racing
//!   to start the same run id both get it from `acquire`, but only the first to write keeps it
//!   (the other's first append is refused with [`JournalError::Locked`]). Leases are given back
//!   through the group writer.
//! - **Checkpoints** (SQLite). The group writer checkpoints the log in the background (every
//!   4 MiB of records or 500 commits, and after a second without writes); a connection
//!   checkpoints it on its own only once it passes 16,384 pages (64 MiB), which bounds it.
//! - **Sessions.** A session is a named conversation: [`Store::session`] loads its
//!   transcript (checked and repaired with [`toolloop::transcript::repair_transcript`], so the
//!   next request is valid for every provider) and its revision, [`Store::save_outcome`]
//!   saves it after a run. Runs tagged with a session (see [`Store::run_journal`]) are listed
//!   with it. A turn is never dropped: a run saves its transcript only while the session is
//!   still at the revision the run started from, and fails with [`StoreError::SessionMoved`]
//!   otherwise (its turn stays in its log); [`Store::check_resume`] tells before a run is
//!   continued. [`Store::lock_session`] makes runs of a session go one at a time.
//!
//! # Where
//!
//! [`Store::open`] takes a path (SQLite; `sqlite:` prefix optional; parent directories are
//! created) or a `postgres://` / `postgresql://` URL. [`Store::default_location`] is
//! `$XDG_DATA_HOME/toolloop/toolloop.db`, else `~/.local/share/toolloop/toolloop.db`.
//!
//! # Where each part lives
//!
//! This file holds the types; the store's methods are split by concern: `open` (locations,
//! pools, migrations, settings), `sessions`, `runs` (runs, their leases and outcomes),
//! `workflows`, and `journal` (the store as a run log). `writer` is the group writer, with its
//! SQLite and PostgreSQL commits in `writer/sqlite.rs` and `writer/postgres.rs`; `lease` tells
//! whether a lease's holder is gone; `sql` holds every SQL statement but the writer's.
//!
//! [`Journal`]: toolloop::journal::Journal
//! [`Journal::append_all`]: toolloop::journal::Journal::append_all
//! [`Journal::acquire`]: toolloop::journal::Journal::acquire

#![forbid(unsafe_code)]

mod lease;
mod sql;
mod writer;

pub use workflows::WorkflowSummary;
pub use writer::WriterStats;

use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolloop::journal::{JournalError, StoreFailure};
use toolloop::message::Message;
use toolloop::outcome::StopReason;

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("the store needs the `sqlite` or the `postgres` feature");

/// How far a store's commits survive (see the module docs).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// A commit survives the process being killed; a power cut or an operating-system crash
    /// may lose the last ones. SQLite: WAL with `synchronous=NORMAL`.
    #[default]
    Process,
    /// A commit is on disk when it returns: it survives a power cut too. SQLite: WAL with
    /// `synchronous=FULL` (one fsync per commit).
    PowerCut,
}

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// The store could not be opened (bad location, unreachable server, failed migration).
    #[error("cannot open the store {location}: {source}")]
    Open {
        /// The location (a PostgreSQL password is hidden).
        location: String,
        /// What went wrong.
        #[source]
        source: StoreFailure,
    },
    /// A query failed.
    #[error("store error while {doing}: {source}")]
    Database {
        /// What the store was doing.
        doing: String,
        /// The database's error.
        #[source]
        source: StoreFailure,
    },
    /// Another live process holds the session (see [`Store::lock_session`]).
    #[error("session `{session}` is in use by {holder}; try again when that run has finished")]
    SessionBusy {
        /// The session.
        session: String,
        /// Who holds it (process id and host).
        holder: String,
    },
    /// The session has had turns saved since the run started from it: saving the run's
    /// transcript, or continuing the run, would drop them.
    #[error(
        "session `{session}` has had turns saved since run {run_id} started from it; the run's \
         turn is not saved to the session, so as not to drop those later turns (it stays in the \
         run's log)"
    )]
    SessionMoved {
        /// The session.
        session: String,
        /// The run.
        run_id: String,
    },
    /// Stored data did not parse.
    #[error("stored data is damaged ({what}): {message}")]
    Corrupt {
        /// What was read.
        what: String,
        /// What did not fit.
        message: String,
    },
}

impl From<StoreError> for JournalError {
    fn from(e: StoreError) -> Self {
        JournalError::Store(StoreFailure::new(e))
    }
}

fn db(doing: impl Into<String>) -> impl FnOnce(sqlx::Error) -> StoreError {
    let doing = doing.into();
    move |e| StoreError::Database {
        doing,
        source: StoreFailure::new(e),
    }
}

/// What the store knows of a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunSummary {
    /// The run id.
    pub run_id: String,
    /// The session it belongs to.
    pub session: Option<String>,
    /// The session's revision (see [`SessionSummary::revision`]) the run started from.
    pub session_revision: Option<i64>,
    /// Where it stands.
    pub status: RunStatus,
    /// How it ended, once [`Store::save_outcome`] recorded it.
    pub stop_reason: Option<StopReason>,
    /// Records in its log.
    pub records: i64,
    /// When it started (Unix milliseconds).
    pub created_ms: i64,
    /// When its last record was written (Unix milliseconds).
    pub updated_ms: i64,
    /// Who holds it, while someone does.
    pub holder: Option<String>,
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Its log ends with the run's end.
    Finished,
    /// A live process holds it.
    Running,
    /// It stopped before its end (a crash): it can be resumed.
    Interrupted,
    /// It stopped to wait for decisions on its calls ([`StopReason::AwaitingApproval`], as
    /// [`Store::save_outcome`] recorded it) and nothing was logged since: decide, then resume.
    AwaitingApproval,
}

impl RunStatus {
    /// `finished`, `running`, `interrupted` or `awaiting_approval`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Finished => "finished",
            RunStatus::Running => "running",
            RunStatus::Interrupted => "interrupted",
            RunStatus::AwaitingApproval => "awaiting_approval",
        }
    }
}

/// A session in the list.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SessionSummary {
    /// Its name.
    pub name: String,
    /// Messages in its transcript.
    pub message_count: i64,
    /// Runs made in it.
    pub runs: i64,
    /// How many times its transcript was saved: a run saves its turn only while the session is
    /// still at the revision the run started from.
    pub revision: i64,
    /// When it was created (Unix milliseconds).
    pub created_ms: i64,
    /// When its transcript was last saved (Unix milliseconds).
    pub updated_ms: i64,
}

/// A session with its transcript.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Session {
    /// Name, counts and times.
    pub summary: SessionSummary,
    /// The transcript, repaired.
    pub messages: Vec<Message>,
    /// What the repair changed (empty when the stored transcript was valid).
    pub repairs: Vec<String>,
}

/// Called with a run id once the run's first record is durable.
pub type OnStarted = Arc<dyn Fn(&str) + Send + Sync>;

/// What a journal made by [`Store::run_journal`] attaches to the runs it starts.
#[derive(Clone, Default)]
pub struct RunTags {
    /// The session the run belongs to.
    pub session: Option<String>,
    /// The session's revision the run starts from: the one read with its transcript
    /// ([`Store::session`]). When `None`, the revision at the run's first record is used.
    /// [`Store::save_outcome`] saves the run's transcript only while the session is still at
    /// that revision.
    pub session_revision: Option<i64>,
    /// Anything the application needs to resume the run (its configuration, say), as JSON.
    pub meta: Option<Value>,
    /// Called with the run id once the run's first record is durable.
    pub on_started: Option<OnStarted>,
}

impl RunTags {
    /// Tags for a run in `session`.
    pub fn session(name: impl Into<String>) -> Self {
        RunTags {
            session: Some(name.into()),
            ..RunTags::default()
        }
    }
}

impl std::fmt::Debug for RunTags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunTags")
            .field("session", &self.session)
            .field("session_revision", &self.session_revision)
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
enum Pool {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

/// Runs `$body` with `$p` bound to the concrete pool: one text, two drivers.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            #[cfg(feature = "sqlite")]
            $crate::Pool::Sqlite($p) => $body,
            #[cfg(feature = "postgres")]
            $crate::Pool::Postgres($p) => $body,
        }
    };
}

/// The statement that begins a transaction which reads before it writes. On SQLite it takes
/// the write lock at once (`BEGIN IMMEDIATE`), waiting for another process's writes within the
/// busy timeout: a deferred transaction that has read cannot wait for the lock when it comes
/// to write, and SQLite fails it at once ("database is locked") whenever another connection
/// (another `toolloop` on the same file) holds the lock or wrote since it read.
trait WriteTransaction {
    const BEGIN: &'static str;
}

#[cfg(feature = "sqlite")]
impl WriteTransaction for sqlx::SqlitePool {
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
}

#[cfg(feature = "postgres")]
impl WriteTransaction for sqlx::PgPool {
    const BEGIN: &'static str = "BEGIN";
}

/// [`WriteTransaction::BEGIN`] for `pool`'s driver (in an `on_pool!` body).
fn begin_write<P: WriteTransaction>(_pool: &P) -> &'static str {
    P::BEGIN
}

// After `on_pool!`, which they use.
mod journal;
mod open;
mod runs;
mod sessions;
mod workflows;

/// A lease this process holds.
struct Held {
    holder: String,
    /// Renews the lease; `None` while it is pending.
    heartbeat: Option<tokio::task::AbortHandle>,
    /// Taken for a run that has no record and no lease in the store yet: the lease row is
    /// written with the run's first records (in their transaction), not on its own.
    pending: bool,
}

impl Held {
    fn stop(&self) {
        if let Some(h) = &self.heartbeat {
            h.abort();
        }
    }
}

struct Inner {
    pool: Pool,
    location: String,
    lease_ttl: Duration,
    held: Mutex<HashMap<String, Held>>,
    /// Commits the appends of every run (group commit).
    writer: writer::Writer,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(held) = self.held.lock() {
            for h in held.values() {
                h.stop();
            }
        }
    }
}

/// Sessions and run logs in SQLite or PostgreSQL. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("location", &self.inner.location)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A location as it may be shown: a URL's credentials (`user:password@`, `?password=…` and
/// the other query parameters that carry keys) replaced by `[redacted]`.
fn redact(location: &str) -> String {
    toolloop::redact::redact_url_credentials(location)
}

/// The secrets written in a location (a URL's password, its `password` query parameter), to
/// take out of the messages of errors that may quote them.
fn location_secrets(location: &str) -> toolloop::redact::Redactor {
    let mut r = toolloop::redact::Redactor::new();
    let Some((_, rest)) = location.split_once("://") else {
        return r;
    };
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if let Some((userinfo, _)) = authority.rsplit_once('@')
        && let Some((_, password)) = userinfo.split_once(':')
    {
        r.add_secret(password);
    }
    if let Some((_, query)) = rest.split_once('?') {
        for pair in query.split(['&', '#']) {
            if let Some((name, value)) = pair.split_once('=')
                && (name.eq_ignore_ascii_case("password") || name.eq_ignore_ascii_case("passfile"))
            {
                r.add_secret(value);
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn durability_sets_how_sqlite_syncs() {
        let dir = tempfile::tempdir().unwrap();
        for (durability, expect) in [(Durability::Process, 1), (Durability::PowerCut, 2)] {
            let path = dir.path().join(format!("{durability:?}.db"));
            let store = Store::open_with(path.to_str().unwrap(), durability)
                .await
                .unwrap();
            #[allow(irrefutable_let_patterns)]
            let Pool::Sqlite(pool) = &store.inner.pool else {
                unreachable!()
            };
            // Every connection of the pool: 1 is NORMAL, 2 is FULL.
            let mut conns = Vec::new();
            for _ in 0..3 {
                conns.push(pool.acquire().await.unwrap());
            }
            for c in &mut conns {
                let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
                    .fetch_one(&mut **c)
                    .await
                    .unwrap();
                assert_eq!(level, expect, "{durability:?}");
                // The log is bounded: a connection checkpoints past this many pages.
                let pages: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
                    .fetch_one(&mut **c)
                    .await
                    .unwrap();
                assert_eq!(pages, i64::from(writer::WAL_AUTOCHECKPOINT));
            }
        }
    }

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redact("postgres://me:secret@db:5432/x"),
            "postgres://[redacted]@db:5432/x"
        );
        assert_eq!(
            redact("postgres://db:5432/x?user=me&password=secret"),
            "postgres://db:5432/x?user=me&password=[redacted]"
        );
        let r = location_secrets("postgresql://me:s3cr3t@db/x?password=other-pass");
        assert_eq!(
            redact(&r.redact("bad url postgresql://me:s3cr3t@db/x: s3cr3t other-pass")),
            "bad url postgresql://[redacted]@db/x: [redacted] [redacted]"
        );
        assert_eq!(redact("postgres://me@db/x"), "postgres://[redacted]@db/x");
        assert_eq!(redact("/tmp/a.db"), "/tmp/a.db");
    }
}
