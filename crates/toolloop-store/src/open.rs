//! Opening a store: the location (SQLite file, `:memory:`, PostgreSQL URL), its pool and
//! migrations, the group writer, and the settings chosen after opening.

use crate::{
    Durability, Inner, Pool, Store, StoreError, WriterStats, location_secrets, redact, sql, writer,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolloop::journal::StoreFailure;

/// How long opening a PostgreSQL store waits for the server, and the pool for a connection.
#[cfg(feature = "postgres")]
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

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
        // One connection first, made once: a server that refuses the connection (a wrong port,
        // a server not started) or an unknown host is reported at once, where the pool would
        // retry it until its acquire time-out and only then say why. A server that takes the
        // connection and never answers is given the same 15 s as the pool.
        {
            use sqlx::Connection as _;
            let first = tokio::time::timeout(
                CONNECT_TIMEOUT,
                sqlx::postgres::PgConnection::connect_with(&options),
            )
            .await
            .map_err(|_| {
                StoreFailure::from(format!(
                    "the PostgreSQL server did not answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ))
            })?
            .map_err(StoreFailure::new)?;
            // Closing politely is a courtesy to the server; the pool makes its own connections.
            let _ = first.close().await;
        }
        // Six: the writer keeps one.
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(6)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_with(options)
            .await
            .map(Pool::Postgres)
            .map_err(StoreFailure::new)
    }

    #[cfg(not(feature = "postgres"))]
    async fn open_postgres(_url: &str) -> Result<Pool, StoreFailure> {
        Err(
            "this build has no PostgreSQL support: build it with the feature `postgres` (for \
             the command: cargo install toolloop-cli --features postgres)"
                .into(),
        )
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
    /// close, as after a crash); but a log shorter than 1 MiB is left in place, committed, for
    /// the next process to read (well under a millisecond) and write on: copying it in costs
    /// every process that makes a run a few syncs of the disk (see the crate's docs, "Closing").
    /// Every clone of the store is closed with it.
    pub async fn close(&self) {
        if let Ok(held) = self.inner.held.lock() {
            for h in held.values() {
                h.stop();
            }
        }
        // Opened before the others close, and closed after them.
        #[cfg(feature = "sqlite")]
        let closer = self.inner.writer.log_closer();
        self.inner.writer.close().await;
        on_pool!(&self.inner.pool, p => p.close().await);
        #[cfg(feature = "sqlite")]
        if let Some(closer) = closer {
            // A checkpoint may wait on the disk: off the runtime's threads.
            let _ = tokio::task::spawn_blocking(move || closer.finish()).await;
        }
    }

    /// What the store's writer has committed since the store was opened (see [`WriterStats`]).
    pub fn writer_stats(&self) -> WriterStats {
        self.inner.writer.stats()
    }

    /// Where the store is (a PostgreSQL password is hidden).
    pub fn location(&self) -> &str {
        &self.inner.location
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

fn is_postgres(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}
