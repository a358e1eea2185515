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
//!   connections, for a process about to end: on a SQLite file the last connection to close
//!   copies the log into the database and removes it, so the next process opens it at once.
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

#![forbid(unsafe_code)]

mod lease;
mod sql;
mod writer;

pub use writer::WriterStats;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::Row;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolloop::engine::ReplayError;
use toolloop::journal::{Journal, JournalError, Record, StoreFailure};
use toolloop::message::Message;
use toolloop::outcome::{Outcome, StopReason};
use toolloop::transcript::repair_transcript;

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

/// A store's directory that could not be made.
#[cfg(feature = "sqlite")]
#[derive(Debug, thiserror::Error)]
#[error("cannot create the directory {}: {source}", dir.display())]
struct CreateDirError {
    dir: PathBuf,
    source: std::io::Error,
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
            Pool::Sqlite($p) => $body,
            #[cfg(feature = "postgres")]
            Pool::Postgres($p) => $body,
        }
    };
}

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

/// A session's key in the lease table (run ids never contain a colon).
fn session_lease_key(name: &str) -> String {
    format!("session:{name}")
}

fn encode_transcript(messages: &[Message]) -> Result<String, StoreError> {
    serde_json::to_string(messages).map_err(|e| StoreError::Corrupt {
        what: "a transcript to save".into(),
        message: e.to_string(),
    })
}

fn is_postgres(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

impl Store {
    /// The default SQLite file: `$XDG_DATA_HOME/toolloop/toolloop.db`, else
    /// `$HOME/.local/share/toolloop/toolloop.db`; `None` when neither variable is set.
    pub fn default_location() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_DATA_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| PathBuf::from(h).join(".local").join("share"))
            })?;
        Some(base.join("toolloop").join("toolloop.db"))
    }

    /// Opens (and creates, and migrates) the store at `location`: a SQLite path, optionally
    /// prefixed with `sqlite:`, `:memory:` (one process's store, gone when it ends), or a
    /// `postgres://` URL. Commits survive a killed process ([`Durability::Process`]).
    pub async fn open(location: &str) -> Result<Store, StoreError> {
        Self::open_with(location, Durability::default()).await
    }

    /// Like [`Store::open`], with the durability of commits chosen.
    pub async fn open_with(location: &str, durability: Durability) -> Result<Store, StoreError> {
        let shown = redact(location);
        let secrets = location_secrets(location);
        let open_err = |source: StoreFailure| {
            // The driver's message may quote the URL, password included.
            let text = source.to_string();
            let redacted = redact(&secrets.redact(&text));
            StoreError::Open {
                location: shown.clone(),
                source: if redacted == text {
                    source
                } else {
                    StoreFailure::from(redacted)
                },
            }
        };
        // Where the writer runs: `:memory:` is one connection that every use shares (the
        // writer included).
        let (pool, place) = if is_postgres(location) {
            let pool = Self::open_postgres(location).await.map_err(open_err)?;
            (pool, writer::Place::Pooled)
        } else {
            let path = location.strip_prefix("sqlite:").unwrap_or(location);
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.trim().is_empty() {
                return Err(open_err(
                    "empty path: expected a file path or a postgres:// URL".into(),
                ));
            }
            let pool = Self::open_sqlite(PathBuf::from(path), durability)
                .await
                .map_err(open_err)?;
            let place = if path == ":memory:" {
                writer::Place::Shared
            } else {
                Self::sqlite_writer(PathBuf::from(path), durability)
            };
            (pool, place)
        };
        // Several processes may open a new store at once; a migration that lost the race is
        // tried again and then finds the tables in place.
        let migrator = sqlx::migrate::Migrator::new(sql::Migrations {
            postgres: is_postgres(location),
        })
        .await
        .map_err(|e| open_err(StoreFailure::new(e)))?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ran = on_pool!(&pool, p => migrator.run(p).await);
            match ran {
                Ok(()) => break,
                Err(_) if attempt < 4 => {
                    tokio::time::sleep(Duration::from_millis(50 * attempt)).await
                }
                Err(e) => return Err(open_err(StoreFailure::new(e))),
            }
        }
        Ok(Store {
            inner: Arc::new(Inner {
                location: shown,
                lease_ttl: Duration::from_secs(30),
                held: Mutex::new(HashMap::new()),
                writer: writer::Writer::new(pool.clone(), place),
                pool,
            }),
        })
    }

    #[cfg(feature = "sqlite")]
    async fn open_sqlite(path: PathBuf, durability: Durability) -> Result<Pool, StoreFailure> {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
        if path.as_os_str() == ":memory:" {
            // One connection that never closes: every connection to `:memory:` is a database
            // of its own, and the database goes when its connection does.
            let options = SqliteConnectOptions::new()
                .in_memory(true)
                .foreign_keys(true);
            return sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .test_before_acquire(false)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(options)
                .await
                .map(Pool::Sqlite)
                .map_err(StoreFailure::new);
        }
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(|source| {
                StoreFailure::new(CreateDirError {
                    dir: dir.to_path_buf(),
                    source,
                })
            })?;
        }
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match durability {
                Durability::Process => SqliteSynchronous::Normal,
                Durability::PowerCut => SqliteSynchronous::Full,
            })
            .busy_timeout(writer::BUSY_TIMEOUT)
            .foreign_keys(true)
            // The group writer checkpoints in the background; a connection checkpoints on its
            // own only past this many pages (see the `writer` module), and the log file is cut
            // back to 64 MiB when it starts over.
            .pragma("wal_autocheckpoint", writer::WAL_AUTOCHECKPOINT.to_string())
            .pragma("journal_size_limit", writer::JOURNAL_SIZE_LIMIT.to_string());
        let mut attempt = 0;
        loop {
            attempt += 1;
            // Five: the writer keeps one. A local file's connection needs no test before use.
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(5)
                .test_before_acquire(false)
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(options.clone())
                .await;
            match pool {
                Ok(p) => return Ok(Pool::Sqlite(p)),
                // Switching a new file to WAL needs a lock that is not waited for.
                Err(_) if attempt < 5 => {
                    tokio::time::sleep(Duration::from_millis(40 * attempt)).await
                }
                Err(e) => return Err(StoreFailure::new(e)),
            }
        }
    }

    /// The writer of a SQLite file: a thread of its own.
    #[cfg(feature = "sqlite")]
    fn sqlite_writer(path: PathBuf, durability: Durability) -> writer::Place {
        writer::Place::File(writer::File {
            path,
            full_sync: durability == Durability::PowerCut,
        })
    }

    #[cfg(not(feature = "sqlite"))]
    fn sqlite_writer(_path: PathBuf, _durability: Durability) -> writer::Place {
        writer::Place::Shared
    }

    #[cfg(not(feature = "sqlite"))]
    async fn open_sqlite(_path: PathBuf, _durability: Durability) -> Result<Pool, StoreFailure> {
        Err("this build has no SQLite support (feature `sqlite`); use a postgres:// URL".into())
    }

    #[cfg(feature = "postgres")]
    async fn open_postgres(url: &str) -> Result<Pool, StoreFailure> {
        // Every table is read by key. The lease table is small but churns (a row per live
        // run, deleted at its end), so its statistics often say "one page", and the planner
        // would then scan it, dead rows and all, for each lookup of a lease (or keep such a
        // plan for a prepared statement long after the table grew): scans are left for what no
        // index serves.
        let options = url
            .parse::<sqlx::postgres::PgConnectOptions>()
            .map_err(StoreFailure::new)?
            .options([("enable_seqscan", "off")]);
        // Six: the writer keeps one.
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(6)
            .acquire_timeout(Duration::from_secs(15))
            .connect_with(options)
            .await
            .map(Pool::Postgres)
            .map_err(StoreFailure::new)
    }

    #[cfg(not(feature = "postgres"))]
    async fn open_postgres(_url: &str) -> Result<Pool, StoreFailure> {
        Err("this build has no PostgreSQL support (feature `postgres`)".into())
    }

    /// Sets how long a lease lasts without renewal (default 30 s; renewed every third of it).
    /// A holder that dies on another host blocks its run for at most this long.
    pub fn with_lease_ttl(self, ttl: Duration) -> Store {
        let ttl = ttl.max(Duration::from_millis(300));
        self.rebuilt(ttl, None)
    }

    /// Sets how many transactions of run-log appends a PostgreSQL store commits side by side,
    /// each on a connection of its own (2 by default, at most 4: the store's pool has six
    /// connections). A run's steps always go through the same one, in order; the others commit
    /// other runs' steps meanwhile, so that while one transaction waits on the server (its
    /// round trips, its commit's flush to disk), another is under way. A SQLite file commits one
    /// transaction at a time: there, this changes nothing. Call it before the store is used
    /// (a store shared meanwhile gets a writer of its own, as [`Store::with_lease_ttl`] does).
    pub fn with_writers(self, writers: usize) -> Store {
        let ttl = self.inner.lease_ttl;
        self.rebuilt(ttl, Some(writers))
    }

    /// The store with a lease time of `lease_ttl` and, when `writers` is given, a writer of
    /// that many lanes: changed in place when no clone shares it, else a store of its own (the
    /// same pool, a writer of its own, no lease held yet).
    fn rebuilt(self, lease_ttl: Duration, writers: Option<usize>) -> Store {
        let inner = match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                inner.lease_ttl = lease_ttl;
                if writers.is_some() {
                    inner.writer = inner.writer.again(writers);
                }
                inner
            }
            Err(inner) => Inner {
                pool: inner.pool.clone(),
                location: inner.location.clone(),
                lease_ttl,
                held: Mutex::new(HashMap::new()),
                writer: inner.writer.again(writers),
            },
        };
        Store {
            inner: Arc::new(inner),
        }
    }

    /// Sets how long the store's writer waits before a commit, while many runs share its
    /// commits, for more steps to join it (1 ms by default; zero: never). It waits only while
    /// its recent commits held four runs' steps or more on average: a run alone, or a few, are
    /// never kept waiting, and with many a commit of thirty steps costs about what a commit of
    /// one does (see the module docs). The setting is the writer's, which the store's clones
    /// share.
    pub fn with_commit_delay(self, wait: Duration) -> Store {
        self.inner.writer.set_delay(wait);
        self
    }

    /// Finishes the store's writes and closes its connections, for a process that is about to
    /// end: what was handed to the writer is committed, later appends fail ("the store is
    /// closed"), the leases' renewals stop (the leases stay, for their holders to give back or
    /// for another process to take over once they expire or their process is gone), and the
    /// connections close. On a SQLite file the last connection to close copies the log into
    /// the database and removes it, so the next process to open the store starts at once
    /// instead of reading the log through first (which it must do after a process that did not
    /// close, as after a crash). Every clone of the store is closed with it.
    pub async fn close(&self) {
        if let Ok(held) = self.inner.held.lock() {
            for h in held.values() {
                h.stop();
            }
        }
        self.inner.writer.close().await;
        on_pool!(&self.inner.pool, p => p.close().await);
    }

    /// What the store's writer has committed since the store was opened (see [`WriterStats`]).
    pub fn writer_stats(&self) -> WriterStats {
        self.inner.writer.stats()
    }

    /// Where the store is (a PostgreSQL password is hidden).
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    /// A journal over this store that tags the runs it starts (session, application metadata)
    /// and reports their ids. The store itself is a journal with no tags.
    pub fn run_journal(&self, tags: RunTags) -> Arc<dyn Journal> {
        Arc::new(RunJournal {
            store: self.clone(),
            tags: Arc::new(tags),
        })
    }

    /// The holder of a lease this process holds, and whether that lease is pending.
    fn holder_of(&self, run_id: &str) -> Option<(String, bool)> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .map(|h| (h.holder.clone(), h.pending))
    }

    /// Forgets a lease this process held (taken over, or given back).
    fn forget_lease(&self, run_id: &str, holder: &str) {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.get(run_id).is_some_and(|h| h.holder == holder)
            && let Some(h) = held.remove(run_id)
        {
            h.stop();
        }
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

    async fn current_holder(&self, run_id: &str) -> Option<String> {
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
    async fn try_acquire(&self, run_id: &str, holder: &str) -> Result<Option<String>, StoreError> {
        let me = lease::me();
        let ttl = self.inner.lease_ttl.as_millis() as i64;
        for _ in 0..8 {
            let now = now_ms();
            let taken = on_pool!(&self.inner.pool, p => {
                sqlx::query(sql::INSERT_LEASE)
                    .bind(run_id)
                    .bind(holder)
                    .bind(&me.host)
                    .bind(me.pid)
                    .bind(&me.start)
                    .bind(now + ttl)
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
                sqlx::query(sql::TAKE_OVER_LEASE)
                    .bind(run_id)
                    .bind(holder)
                    .bind(&me.host)
                    .bind(me.pid)
                    .bind(&me.start)
                    .bind(now + ttl)
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

    fn start_heartbeat(&self, run_id: &str, holder: &str) {
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

    /// Records how a run ended and, when the run belongs to a session, saves its transcript
    /// there (with a context policy, the conversation as the run last sent it:
    /// [`Outcome::context`]), in one transaction.
    ///
    /// The transcript is saved only while the session is at the revision the run started from
    /// (see [`RunTags::session_revision`]): when another run saved a turn meanwhile, nothing is
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
        // (compacted, old results cleared), not from the whole transcript.
        let messages = outcome
            .context
            .as_deref()
            .map_or(&outcome.messages[..], |c| &c.view[..]);
        let text = encode_transcript(messages)?;
        let count = messages.len() as i64;
        let now = now_ms();
        on_pool!(&self.inner.pool, p => {
            let mut tx = p.begin().await.map_err(db("starting a transaction"))?;
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

    /// Runs, oldest first: all of them, or those of one session.
    pub async fn runs(&self, session: Option<&str>) -> Result<Vec<RunSummary>, StoreError> {
        let now = now_ms();
        let rows = on_pool!(&self.inner.pool, p => {
            sqlx::query(&sql::list_runs())
                .bind(session)
                .fetch_all(p)
                .await
                .map_err(db("listing runs"))?
                .iter()
                .map(|r| run_summary(r, now))
                .collect::<Result<Vec<_>, _>>()
                .map_err(db("reading runs"))?
        });
        Ok(rows)
    }

    /// One run, or `None`.
    pub async fn run(&self, run_id: &str) -> Result<Option<RunSummary>, StoreError> {
        let now = now_ms();
        let row = on_pool!(&self.inner.pool, p => {
            sqlx::query(&sql::one_run())
                .bind(run_id)
                .fetch_optional(p)
                .await
                .map_err(db("reading a run"))?
                .as_ref()
                .map(|r| run_summary(r, now))
                .transpose()
                .map_err(db("reading a run"))?
        });
        Ok(row)
    }

    /// A run's session and application metadata (see [`RunTags`]); `None` when there is no
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

impl Store {
    /// Ends a lease this process holds (a run's, or a session's), through the group writer
    /// (it shares a commit with the other runs' appends). A pending lease was never written:
    /// nothing is.
    async fn release_lease(&self, run_id: &str, holder: &str) -> Result<(), StoreError> {
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
