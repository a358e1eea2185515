//! The group writer: one writer per store commits the appends of every run, as many as are
//! waiting, in one transaction (group commit).
//!
//! An append (one run's records of one step) is queued with a channel to answer on. The writer
//! takes every append waiting when it is free (at most one per run, in the order they came, so
//! a run's records stay in order; a second append of a run waits for the next transaction) and
//! commits them together, then answers each: committed, fenced out (the run's lease is held by
//! someone else: nothing of that run was written, the others were), or failed (the transaction
//! failed: nothing of the batch was written, and every append of it fails). While a transaction
//! is under way the next appends gather, so the busier the store, the more runs share a commit.
//!
//! An append is one row of the run log, whatever its number of records: its records' JSON
//! (one record's object, or an array of them), numbered with the sequence number of its first
//! record (a run's records are numbered 1, 2, … across its rows; the run's `records` counter
//! is its last record's number).
//!
//! A transaction first takes the leases of the runs that start with the batch (their lease is
//! written with their first records, not on its own) and reads every run's fence (does the
//! append's holder hold the run's lease?) and last sequence number; then it writes the runs that
//! are not fenced out: the new runs and their sessions, every append's row, the runs' counters,
//! the leases given back, and the commit. Every statement's text is fixed, so it stays prepared.
//!
//! Where the writer runs:
//! - A SQLite file: on a thread of its own, with a connection of its own, so that a commit is
//!   one hand-off from the run to the writer and one back. SQLite runs in the process, so the
//!   statements go one per append, with the append's values bound as they are (no copy of a
//!   record's JSON); `BEGIN IMMEDIATE` holds the write lock from the first. Another thread
//!   checkpoints the log in the background (see [`Checkpoints`]).
//! - PostgreSQL: a task that keeps one connection of the pool while the store lives. A batch is
//!   one call of the store's function `toolloop_append_batch`, whose arguments are arrays with
//!   one element per append, between `BEGIN` and `COMMIT` (three round trips whatever the
//!   batch; the commit is sent only once the call has answered, so a process killed during the
//!   call writes nothing). It holds the runs' lease rows
//!   (`FOR SHARE`) until the commit, so a takeover waits for it.
//! - `:memory:` (whose only connection every use shares): a task that takes the connection per
//!   transaction, and runs the SQLite statements one query each.

use crate::Pool;
use std::collections::{HashSet, VecDeque};
use tokio::sync::{mpsc, oneshot};
use toolloop::journal::{Record, StoreFailure};

/// The most records in one transaction (with [`MAX_RUNS`], bounds a transaction's size). A
/// larger append is split by the caller.
pub(crate) const MAX_RECORDS: usize = 2_000;
/// The most runs in one transaction.
const MAX_RUNS: usize = 500;
/// The most bytes of records in one transaction: on PostgreSQL a batch's bodies go as one
/// parameter (an array), which the server does not take past a billion bytes. An append larger
/// than this still goes, alone.
const MAX_BYTES: usize = 64 << 20;

/// A run's start, written with its first records.
pub(crate) struct Start {
    /// The session the run belongs to.
    pub session: Option<String>,
    /// The session's revision the run starts from (`None`: the revision now).
    pub session_revision: Option<i64>,
    /// The application's metadata, as JSON.
    pub meta: Option<String>,
}

/// One run's records of one step.
pub(crate) struct Append {
    /// The run.
    pub run_id: String,
    /// The lease holder the append is fenced by (`None`: not fenced).
    pub holder: Option<String>,
    /// The records' kinds, in order, joined by commas (empty when there is no record).
    pub kind: String,
    /// The records' JSON: one record's object, or an array of them, in order (see
    /// [`encode`]).
    pub body: String,
    /// How many records `body` holds (0: the append writes no row).
    pub count: usize,
    /// Set when the records start the run.
    pub start: Option<Start>,
    /// Whether the records end the run.
    pub finished: bool,
    /// Set on the run's first write when its lease is taken with it: the lease's expiry (Unix
    /// ms). The lease is inserted for `holder` unless one exists; either way the append is then
    /// fenced as usual, so of two processes racing to start one run, one writes.
    pub take_lease: Option<i64>,
    /// Whether the append gives the run's lease back (after its records, in its transaction).
    pub release: bool,
}

/// How an append ended.
#[derive(Debug)]
pub(crate) enum Written {
    /// Committed.
    Committed,
    /// Not written: the run's lease is not the append's holder's.
    Fenced,
    /// The transaction failed: nothing of its batch was written.
    Failed(StoreFailure),
}

type Item = (Append, oneshot::Sender<Written>);

/// The answer to come for a queued append.
pub(crate) struct Pending(oneshot::Receiver<Written>);

impl std::future::Future for Pending {
    type Output = Written;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Written> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|answer| {
            answer.unwrap_or_else(|_| Written::Failed("the store's writer stopped".into()))
        })
    }
}

/// Where a store's writer runs (see the module's documentation).
#[derive(Clone)]
pub(crate) enum Place {
    /// A task that takes the pool's one connection, which every use shares, per transaction
    /// (`:memory:`).
    Shared,
    /// A task that keeps a connection of the pool (PostgreSQL).
    Pooled,
    /// A thread of its own with its own connection to a SQLite file.
    #[cfg(feature = "sqlite")]
    File(sqlite::File),
}

/// The handle of a store's writer (started on first use, and again if it stopped: a task whose
/// runtime went).
pub(crate) struct Writer {
    pool: Pool,
    place: Place,
    queue: std::sync::Mutex<Option<Queue>>,
}

/// Where appends are queued for the writer.
enum Queue {
    Task(mpsc::UnboundedSender<Item>),
    #[cfg(feature = "sqlite")]
    Thread(std::sync::mpsc::Sender<Item>),
}

impl Writer {
    pub(crate) fn new(pool: Pool, place: Place) -> Self {
        Writer {
            pool,
            place,
            queue: std::sync::Mutex::new(None),
        }
    }

    /// Another writer of the same store (with a queue of its own).
    pub(crate) fn again(&self) -> Self {
        Writer::new(self.pool.clone(), self.place.clone())
    }

    /// Queues an append and waits until its transaction is over.
    pub(crate) async fn write(&self, append: Append) -> Written {
        self.start(append).await
    }

    /// Queues an append (at once) and returns its answer to come.
    pub(crate) fn start(&self, append: Append) -> Pending {
        let (done, answer) = oneshot::channel();
        self.send((append, done));
        Pending(answer)
    }

    fn send(&self, item: Item) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let item = match queue.as_ref() {
            Some(Queue::Task(tx)) => match tx.send(item) {
                Ok(()) => return,
                // The task is gone (its runtime ended): start another.
                Err(mpsc::error::SendError(back)) => back,
            },
            #[cfg(feature = "sqlite")]
            Some(Queue::Thread(tx)) => match tx.send(item) {
                Ok(()) => return,
                Err(std::sync::mpsc::SendError(back)) => back,
            },
            None => item,
        };
        let started = match &self.place {
            #[cfg(feature = "sqlite")]
            Place::File(file) => {
                let (tx, rx) = std::sync::mpsc::channel();
                let file = file.clone();
                std::thread::Builder::new()
                    .name("toolloop-store-writer".into())
                    .spawn(move || sqlite::serve(file, rx))
                    .map(|_| Queue::Thread(tx))
            }
            place => {
                let (tx, rx) = mpsc::unbounded_channel();
                let shared = matches!(place, Place::Shared);
                tokio::spawn(run(self.pool.clone(), shared, rx));
                Ok(Queue::Task(tx))
            }
        };
        match started {
            Ok(q) => {
                let item = match &q {
                    // The receivers are alive: they were just made.
                    Queue::Task(tx) => tx.send(item).map_err(|e| e.0),
                    #[cfg(feature = "sqlite")]
                    Queue::Thread(tx) => tx.send(item).map_err(|e| e.0),
                };
                if let Err((_, done)) = item {
                    let _ = done.send(Written::Failed("the store's writer stopped".into()));
                }
                *queue = Some(q);
            }
            Err(e) => {
                let _ = item.1.send(Written::Failed(StoreFailure::new(e)));
            }
        }
    }
}

/// A connection the writer task holds.
enum Conn {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
}

async fn acquire(pool: &Pool) -> Result<Conn, sqlx::Error> {
    Ok(match pool {
        #[cfg(feature = "sqlite")]
        Pool::Sqlite(p) => Conn::Sqlite(p.acquire().await?),
        #[cfg(feature = "postgres")]
        Pool::Postgres(p) => Conn::Postgres(p.acquire().await?),
    })
}

/// The writer task: until every handle is gone, commits whatever is waiting.
async fn run(pool: Pool, shared: bool, mut queue: mpsc::UnboundedReceiver<Item>) {
    let mut waiting: VecDeque<Item> = VecDeque::new();
    let mut conn: Option<Conn> = None;
    let mut next: Option<Vec<Item>> = None;
    loop {
        let batch = match next.take() {
            Some(batch) => batch,
            None => {
                if waiting.is_empty() {
                    match queue.recv().await {
                        Some(item) => waiting.push_back(item),
                        None => return,
                    }
                }
                while let Ok(item) = queue.try_recv() {
                    waiting.push_back(item);
                }
                take_batch(&mut waiting)
            }
        };
        let appends: Vec<&Append> = batch.iter().map(|(a, _)| a).collect();
        let result = commit(&pool, &mut conn, &appends).await;
        if shared || result.is_err() {
            // Back to the pool (a connection whose transaction failed is checked there).
            conn = None;
        }
        while let Ok(item) = queue.try_recv() {
            waiting.push_back(item);
        }
        next = take_next(&mut waiting);
        answer(batch, result);
    }
}

/// The batch after the one just committed, taken before that one is answered: what waited
/// while it was committed. So an append that a run makes once answered goes in a later batch
/// (it never joins, say, a batch that is about to fail because of another run's record).
fn take_next(waiting: &mut VecDeque<Item>) -> Option<Vec<Item>> {
    (!waiting.is_empty()).then(|| take_batch(waiting))
}

/// Answers every append of a batch: how its transaction ended.
fn answer(batch: Vec<Item>, result: Result<HashSet<String>, StoreFailure>) {
    match result {
        Ok(fenced) => {
            for (append, done) in batch {
                let written = if fenced.contains(append.run_id.as_str()) {
                    Written::Fenced
                } else {
                    Written::Committed
                };
                let _ = done.send(written);
            }
        }
        Err(e) => {
            tracing::warn!(
                runs = batch.len(),
                "a transaction of the run logs failed: {e}"
            );
            for (_, done) in batch {
                let _ = done.send(Written::Failed(e.clone()));
            }
        }
    }
}

/// The next transaction's appends: the waiting ones in order, at most one per run (a run's
/// later append stays, in order, for the next), within the limits.
fn take_batch(waiting: &mut VecDeque<Item>) -> Vec<Item> {
    let mut batch = Vec::new();
    let mut runs: HashSet<String> = HashSet::new();
    let mut records = 0;
    let mut bytes = 0;
    let mut rest = VecDeque::new();
    while let Some(item) = waiting.pop_front() {
        let n = item.0.count;
        let size = item.0.body.len();
        let fits = batch.is_empty()
            || (records + n <= MAX_RECORDS && bytes + size <= MAX_BYTES && batch.len() < MAX_RUNS);
        if !fits {
            rest.push_back(item);
            rest.extend(waiting.drain(..));
            break;
        }
        if runs.contains(&item.0.run_id) {
            rest.push_back(item);
            continue;
        }
        runs.insert(item.0.run_id.clone());
        records += n;
        bytes += size;
        batch.push(item);
    }
    *waiting = rest;
    batch
}

/// One run's state at the start of a transaction, read under the transaction's lock.
#[cfg(feature = "sqlite")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Looked {
    /// Whether the run's lease is someone else's (nothing of the run is written).
    fenced: bool,
    /// The run's last record's sequence number (0: none).
    last: i64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The appends of a batch that are written (not fenced out), with their runs' last sequence
/// numbers.
#[cfg(feature = "sqlite")]
fn kept<'a>(
    appends: &'a [&'a Append],
    looked: &'a [Looked],
) -> impl Iterator<Item = (&'a Append, i64)> + 'a {
    appends
        .iter()
        .zip(looked)
        .filter(|(_, l)| !l.fenced)
        .map(|(a, l)| (*a, l.last))
}

/// The runs fenced out.
#[cfg(feature = "sqlite")]
fn fenced(appends: &[&Append], looked: &[Looked]) -> HashSet<String> {
    appends
        .iter()
        .zip(looked)
        .filter(|(_, l)| l.fenced)
        .map(|(a, _)| a.run_id.clone())
        .collect()
}

/// Commits a batch on the writer task's connection; the runs that were fenced out.
async fn commit(
    pool: &Pool,
    conn: &mut Option<Conn>,
    appends: &[&Append],
) -> Result<HashSet<String>, StoreFailure> {
    let conn = match conn {
        Some(c) => c,
        None => conn.insert(acquire(pool).await.map_err(StoreFailure::new)?),
    };
    match conn {
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(c) => sqlite::commit(c, appends, now_ms()).await,
        #[cfg(feature = "postgres")]
        Conn::Postgres(c) => postgres::commit(c, appends, now_ms())
            .await
            .map_err(StoreFailure::new),
    }
}

/// SQLite: statements of one append each, of fixed text (so they stay prepared). The writer
/// thread runs them on its own connection ([`serve`]); the writer task of a `:memory:` store, on
/// the pool's ([`commit`]).
#[cfg(feature = "sqlite")]
mod sqlite {
    use super::{
        Append, Checkpoints, IDLE_CHECKPOINT, Item, Looked, StoreFailure, WAL_AUTOCHECKPOINT,
        answer, fenced, kept, now_ms, take_batch, take_next,
    };
    use std::collections::{HashSet, VecDeque};
    use std::path::PathBuf;
    use std::time::Duration;

    /// A SQLite file the writer thread opens.
    #[derive(Clone, Debug)]
    pub(crate) struct File {
        /// The database file.
        pub path: PathBuf,
        /// Whether a commit syncs the log (`synchronous=FULL`, survives a power cut) or not
        /// (`NORMAL`, survives a killed process).
        pub full_sync: bool,
    }

    /// How long a connection waits for another's write lock (as the pool's do).
    pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(15);
    /// The log file's size, in bytes, that it is cut back to when it starts over.
    pub(crate) const JOURNAL_SIZE_LIMIT: i64 = 64 << 20;

    /// Takes a starting run's lease, unless the run has one. Parameters: the run, the holder,
    /// the host, pid and process start of the process taking it, and its expiry.
    const TAKE_LEASE: &str =
        "INSERT INTO toolloop_leases (run_id, holder, host, pid, pid_start, expires_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (run_id) DO NOTHING";

    /// A run's fence (1 when the lease is someone else's, else 0) and last sequence number.
    /// Parameters: the run, and the holder (`NULL`: not fenced).
    const LOOKUP: &str = "SELECT
  CASE WHEN ?2 IS NULL OR EXISTS (SELECT 1 FROM toolloop_leases l
    WHERE l.run_id = ?1 AND l.holder = ?2) THEN 0 ELSE 1 END,
  MAX(COALESCE((SELECT r.records FROM toolloop_runs r WHERE r.run_id = ?1), 0),
    COALESCE((SELECT MAX(x.seq) FROM toolloop_records x WHERE x.run_id = ?1), 0))";

    /// A run's fence alone (see [`LOOKUP`]). Parameters: the run, and the holder.
    const FENCE: &str = "SELECT CASE WHEN ?2 IS NULL OR EXISTS (SELECT 1 FROM toolloop_leases l
    WHERE l.run_id = ?1 AND l.holder = ?2) THEN 0 ELSE 1 END";

    /// A starting run's session, unless it exists. Parameters: the name, now.
    const SESSION: &str =
        "INSERT INTO toolloop_sessions (name, messages, message_count, created_ms, updated_ms)
VALUES (?1, '[]', 0, ?2, ?2) ON CONFLICT (name) DO NOTHING";

    /// A starting run. Parameters: the run, its session, metadata, record count, whether it
    /// ended, now, and the session's revision it starts from (`NULL`: the revision now).
    const NEW_RUN: &str = "INSERT INTO toolloop_runs
(run_id, session, meta, records, finished, created_ms, updated_ms, session_revision)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6,
  COALESCE(?7, (SELECT s.revision FROM toolloop_sessions s WHERE s.name = ?2)))
ON CONFLICT (run_id) DO UPDATE SET records = toolloop_runs.records + excluded.records,
  updated_ms = excluded.updated_ms, finished = (toolloop_runs.finished OR excluded.finished)";

    /// An append's row. Parameters: the run, the sequence number of its first record, the
    /// records' kinds, their JSON, now.
    const ROW: &str = "INSERT INTO toolloop_records (run_id, seq, kind, body, created_ms)
VALUES (?1, ?2, ?3, ?4, ?5)";

    /// The counter of a run that goes on. Parameters: the run, its new records, now, whether
    /// it ended.
    const OLD_RUN: &str = "UPDATE toolloop_runs SET records = records + ?2, updated_ms = ?3,
  finished = (finished OR ?4) WHERE run_id = ?1";

    /// A lease given back. Parameters: the run, the holder.
    const RELEASE: &str = "DELETE FROM toolloop_leases WHERE run_id = ?1 AND holder = ?2";

    /// A statement's parameter.
    #[derive(Clone, Copy)]
    enum Param<'a> {
        Text(&'a str),
        Null,
        Int(i64),
    }

    impl<'a> From<Option<&'a str>> for Param<'a> {
        fn from(s: Option<&'a str>) -> Self {
            s.map_or(Param::Null, Param::Text)
        }
    }

    /// A statement and its parameters.
    type Statement<'a> = (&'static str, Vec<Param<'a>>);

    /// The statement that takes a starting run's lease, if the append takes one.
    fn take_lease(a: &Append) -> Option<Statement<'_>> {
        let (expires, holder) = (a.take_lease?, a.holder.as_deref()?);
        let me = crate::lease::me();
        Some((
            TAKE_LEASE,
            vec![
                Param::Text(&a.run_id),
                Param::Text(holder),
                Param::Text(&me.host),
                Param::Int(me.pid),
                Param::Text(&me.start),
                Param::Int(expires),
            ],
        ))
    }

    /// The lookup of an append's run.
    fn lookup(a: &Append) -> Statement<'_> {
        (
            LOOKUP,
            vec![Param::Text(&a.run_id), a.holder.as_deref().into()],
        )
    }

    /// The statements that write an append that was not fenced out, its run's last sequence
    /// number being `last`.
    fn writes(a: &Append, last: i64, now: i64) -> Vec<Statement<'_>> {
        let mut out = Vec::with_capacity(3);
        let run = Param::Text(&a.run_id);
        if let Some(start) = &a.start {
            if let Some(session) = &start.session {
                out.push((SESSION, vec![Param::Text(session), Param::Int(now)]));
            }
            out.push((
                NEW_RUN,
                vec![
                    run,
                    start.session.as_deref().into(),
                    start.meta.as_deref().into(),
                    Param::Int(a.count as i64),
                    Param::Int(i64::from(a.finished)),
                    Param::Int(now),
                    start.session_revision.map_or(Param::Null, Param::Int),
                ],
            ));
        } else if a.count > 0 {
            out.push((
                OLD_RUN,
                vec![
                    run,
                    Param::Int(a.count as i64),
                    Param::Int(now),
                    Param::Int(i64::from(a.finished)),
                ],
            ));
        }
        if a.count > 0 {
            out.push((
                ROW,
                vec![
                    run,
                    Param::Int(last + 1),
                    Param::Text(&a.kind),
                    Param::Text(&a.body),
                    Param::Int(now),
                ],
            ));
        }
        if a.release
            && let Some(holder) = a.holder.as_deref()
        {
            out.push((RELEASE, vec![run, Param::Text(holder)]));
        }
        out
    }

    /// Commits a batch on the pool's connection (a `:memory:` store); the runs that were
    /// fenced out. The same statements as the writer thread's, one query each.
    pub(super) async fn commit(
        c: &mut sqlx::SqliteConnection,
        appends: &[&Append],
        now: i64,
    ) -> Result<HashSet<String>, StoreFailure> {
        fn bind<'q>(
            sql: &'static str,
            params: Vec<Param<'q>>,
        ) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
            let mut q = sqlx::query(sql);
            for p in params {
                q = match p {
                    Param::Text(s) => q.bind(s),
                    Param::Null => q.bind(None::<i64>),
                    Param::Int(i) => q.bind(i),
                };
            }
            q
        }
        let failed = StoreFailure::new;
        let ran = async {
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut *c)
                .await
                .map_err(failed)?;
            for (sql, params) in appends.iter().filter_map(|a| take_lease(a)) {
                bind(sql, params).execute(&mut *c).await.map_err(failed)?;
            }
            let mut looked = Vec::with_capacity(appends.len());
            for a in appends {
                let (sql, params) = lookup(a);
                let row = bind(sql, params).fetch_one(&mut *c).await.map_err(failed)?;
                let fenced: i64 = sqlx::Row::try_get(&row, 0).map_err(failed)?;
                let last: i64 = sqlx::Row::try_get(&row, 1).map_err(failed)?;
                looked.push(Looked {
                    fenced: fenced != 0,
                    last,
                });
            }
            for (a, last) in kept(appends, &looked) {
                for (sql, params) in writes(a, last, now) {
                    bind(sql, params).execute(&mut *c).await.map_err(failed)?;
                }
            }
            sqlx::query("COMMIT")
                .execute(&mut *c)
                .await
                .map_err(failed)?;
            Ok::<_, StoreFailure>(fenced(appends, &looked))
        }
        .await;
        if ran.is_err() {
            // The transaction may be open (a statement failed before the commit).
            let _ = sqlx::query("ROLLBACK").execute(&mut *c).await;
        }
        ran
    }

    impl rusqlite::ToSql for Param<'_> {
        fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
            use rusqlite::types::{ToSqlOutput, ValueRef};
            Ok(match *self {
                Param::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
                Param::Null => ToSqlOutput::Borrowed(ValueRef::Null),
                Param::Int(i) => ToSqlOutput::from(i),
            })
        }
    }

    /// Opens the writer's (or the checkpoints') connection to the file, set as the pool's are.
    pub(super) fn open(file: &File) -> rusqlite::Result<rusqlite::Connection> {
        use rusqlite::OpenFlags;
        let c = rusqlite::Connection::open_with_flags(
            &file.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        c.busy_timeout(BUSY_TIMEOUT)?;
        c.pragma_update(
            None,
            "synchronous",
            if file.full_sync { "FULL" } else { "NORMAL" },
        )?;
        c.pragma_update(None, "foreign_keys", "ON")?;
        c.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT)?;
        // Answers with the limit set, so it is read as a query.
        c.query_row(
            &format!("PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}"),
            [],
            |_| Ok(()),
        )?;
        Ok(c)
    }

    /// Commits a batch on the writer thread's connection; the runs that were fenced out.
    fn commit_here(
        c: &rusqlite::Connection,
        appends: &[&Append],
        now: i64,
        known: &mut Known,
    ) -> Result<HashSet<String>, StoreFailure> {
        let failed = StoreFailure::new;
        // Every statement is prepared once (the connection keeps them).
        let run = |sql: &str, params: Vec<Param<'_>>| {
            c.prepare_cached(sql)
                .and_then(|mut s| s.execute(rusqlite::params_from_iter(params)))
                .map_err(failed)
        };
        let ran = (|| {
            run("BEGIN IMMEDIATE", vec![])?;
            for (sql, params) in appends.iter().filter_map(|a| take_lease(a)) {
                run(sql, params)?;
            }
            let mut looked = Vec::with_capacity(appends.len());
            {
                let mut find = c.prepare_cached(LOOKUP).map_err(failed)?;
                let mut fence = c.prepare_cached(FENCE).map_err(failed)?;
                for a in appends {
                    let (_, params) = lookup(a);
                    let params = rusqlite::params_from_iter(params);
                    let (fenced, last): (i64, i64) = match known.last(a) {
                        // The fence is read every time; the last sequence number is known.
                        Some(last) => {
                            (fence.query_row(params, |r| r.get(0)).map_err(failed)?, last)
                        }
                        None => find
                            .query_row(params, |r| Ok((r.get(0)?, r.get(1)?)))
                            .map_err(failed)?,
                    };
                    looked.push(Looked {
                        fenced: fenced != 0,
                        last,
                    });
                }
            }
            for (a, last) in kept(appends, &looked) {
                for (sql, params) in writes(a, last, now) {
                    run(sql, params)?;
                }
            }
            run("COMMIT", vec![])?;
            Ok(looked)
        })();
        match ran {
            Ok(looked) => {
                known.committed(appends, &looked);
                Ok(fenced(appends, &looked))
            }
            Err(e) => {
                if !c.is_autocommit() {
                    // A statement failed before the commit: nothing of the batch stays.
                    let _ = c.execute_batch("ROLLBACK");
                }
                known.forget(appends);
                Err(e)
            }
        }
    }

    /// The last sequence number of each run this writer has written for a holder, so that a
    /// later append of the run reads only its fence (the lease; another writer can take it)
    /// and not its last record as well: while the holder's lease holds, nobody else writes the
    /// run. Kept with the holder it was written for (another holder of the run looks it up
    /// again), dropped when the run ends or gives its lease back, is fenced out, or is in a
    /// batch that failed.
    #[derive(Default)]
    pub(super) struct Known(std::collections::HashMap<String, (String, i64)>);

    /// The most runs [`Known`] keeps (past it, it starts over: a run whose holder went away
    /// without giving its lease back stays until then).
    const KNOWN_MAX: usize = 100_000;

    impl Known {
        fn last(&self, a: &Append) -> Option<i64> {
            let holder = a.holder.as_deref()?;
            match self.0.get(a.run_id.as_str()) {
                Some((h, last)) if h == holder => Some(*last),
                _ => None,
            }
        }

        fn committed(&mut self, appends: &[&Append], looked: &[Looked]) {
            for (a, l) in appends.iter().zip(looked) {
                let Some(holder) = &a.holder else { continue };
                if l.fenced || a.release || a.finished {
                    self.0.remove(a.run_id.as_str());
                } else {
                    if self.0.len() >= KNOWN_MAX {
                        self.0.clear();
                    }
                    let last = l.last + a.count as i64;
                    match self.0.get_mut(a.run_id.as_str()) {
                        Some(known) => *known = (holder.clone(), last),
                        None => {
                            self.0.insert(a.run_id.clone(), (holder.clone(), last));
                        }
                    }
                }
            }
        }

        fn forget(&mut self, appends: &[&Append]) {
            for a in appends {
                self.0.remove(a.run_id.as_str());
            }
        }
    }

    /// The writer thread: until every handle is gone, commits whatever is waiting.
    pub(super) fn serve(file: File, queue: std::sync::mpsc::Receiver<Item>) {
        use std::sync::mpsc::RecvTimeoutError;
        let mut waiting: VecDeque<Item> = VecDeque::new();
        let mut conn: Option<rusqlite::Connection> = None;
        let mut checkpoints = Checkpoints::new(file.clone());
        let mut next: Option<Vec<Item>> = None;
        let mut known = Known::default();
        loop {
            if next.is_none() && waiting.is_empty() {
                // Idle with records not yet checkpointed: after a while, checkpoint them, so a
                // burst of writes does not leave its log behind.
                let item = if checkpoints.since > 0 {
                    match queue.recv_timeout(IDLE_CHECKPOINT) {
                        Ok(item) => Some(item),
                        Err(RecvTimeoutError::Timeout) => {
                            checkpoints.start();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => None,
                    }
                } else {
                    queue.recv().ok()
                };
                match item {
                    Some(item) => waiting.push_back(item),
                    None => return,
                }
            }
            while let Ok(item) = queue.try_recv() {
                waiting.push_back(item);
            }
            let batch = match next.take() {
                Some(batch) => batch,
                None => take_batch(&mut waiting),
            };
            let appends: Vec<&Append> = batch.iter().map(|(a, _)| a).collect();
            let result = match conn.as_mut() {
                Some(c) => Ok(c),
                None => open(&file)
                    .map(|c| conn.insert(c))
                    .map_err(StoreFailure::new),
            }
            .and_then(|c| commit_here(c, &appends, now_ms(), &mut known));
            match &result {
                Ok(_) => checkpoints.committed(appends.iter().map(|a| a.count).sum()),
                // Opened again for the next batch.
                Err(_) => conn = None,
            }
            while let Ok(item) = queue.try_recv() {
                waiting.push_back(item);
            }
            next = take_next(&mut waiting);
            answer(batch, result);
        }
    }

    /// Runs the checkpoints it is asked for, one at a time, until the writer is gone.
    pub(super) fn checkpoint(file: File, asked: std::sync::mpsc::Receiver<()>) {
        let mut conn: Option<rusqlite::Connection> = None;
        while asked.recv().is_ok() {
            let c = match conn.as_mut() {
                Some(c) => c,
                None => match open(&file) {
                    Ok(c) => conn.insert(c),
                    Err(e) => {
                        tracing::debug!("a checkpoint of the run log failed: {e}");
                        continue;
                    }
                },
            };
            // Copies what it can without waiting for anyone.
            if let Err(e) = c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::debug!("a checkpoint of the run log failed: {e}");
                conn = None;
            }
        }
    }
}

#[cfg(feature = "sqlite")]
pub(crate) use sqlite::{BUSY_TIMEOUT, File, JOURNAL_SIZE_LIMIT};

/// Checkpoints of a SQLite log (WAL). A connection checkpoints on its own only once the log
/// passes [`WAL_AUTOCHECKPOINT`] pages (SQLite's `wal_autocheckpoint`, a safety net that bounds
/// the log; at SQLite's default of 1,000 it would stall every thousandth page's commit, and with
/// `synchronous=FULL` sync the database file in it). Instead the writer asks a thread of its own
/// for a passive checkpoint after its first commit and every [`CHECKPOINT_EVERY`] records, so
/// the log is copied into the database while commits go on, and the safety net finds little
/// left to copy when it fires; and once it has been idle for [`IDLE_CHECKPOINT`], so the end of
/// a burst of writes is not left in the log.
#[cfg(feature = "sqlite")]
struct Checkpoints {
    file: sqlite::File,
    /// Records committed since the last checkpoint was asked for.
    since: usize,
    /// The checkpoint thread (started with the first checkpoint): at most one checkpoint waits
    /// while another runs.
    thread: Option<std::sync::mpsc::SyncSender<()>>,
}

/// How long the writer waits, idle with records not checkpointed yet, before it checkpoints
/// them.
#[cfg(feature = "sqlite")]
const IDLE_CHECKPOINT: std::time::Duration = std::time::Duration::from_secs(1);
/// Records between two background checkpoints.
#[cfg(feature = "sqlite")]
const CHECKPOINT_EVERY: usize = 1_000;
/// The log's length (in pages) past which the connection that commits checkpoints it, after
/// its commit; the next commit then starts the log over (cut back to `journal_size_limit`).
#[cfg(feature = "sqlite")]
pub(crate) const WAL_AUTOCHECKPOINT: u32 = 16_384;

#[cfg(feature = "sqlite")]
impl Checkpoints {
    fn new(file: sqlite::File) -> Self {
        Checkpoints {
            file,
            since: 0,
            thread: None,
        }
    }

    /// After a commit of `records` records.
    fn committed(&mut self, records: usize) {
        self.since += records;
        if self.thread.is_none() || self.since >= CHECKPOINT_EVERY {
            self.start();
        }
    }

    /// Asks for a checkpoint (one already waiting covers it).
    fn start(&mut self) {
        self.since = 0;
        if self.thread.is_none() {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let file = self.file.clone();
            match std::thread::Builder::new()
                .name("toolloop-store-checkpoint".into())
                .spawn(move || sqlite::checkpoint(file, rx))
            {
                Ok(_) => self.thread = Some(tx),
                Err(e) => {
                    tracing::debug!("the run log's checkpoint thread did not start: {e}");
                    return;
                }
            }
        }
        if let Some(tx) = &self.thread {
            let _ = tx.try_send(());
        }
    }
}

/// PostgreSQL: a batch is one call of the store's function `toolloop_append_batch` (see the
/// migration that makes it) in a transaction, so three round trips whatever its size: the batch
/// goes in as arrays, one element per append, that its statements read with `UNNEST`. It holds
/// the runs' lease rows (`FOR SHARE`) until the commit, so a takeover waits for it.
#[cfg(feature = "postgres")]
mod postgres {
    use super::Append;
    use std::collections::HashSet;

    /// The call; its arguments are in the order of the function's.
    const APPEND_BATCH: &str = "SELECT toolloop_append_batch($1::text[], $2::text[], \
         $3::bool[], $4::bigint[], $5, $6, $7, $8::text[], $9::text[], $10::bigint[], \
         $11::bool[], $12::bool[], $13::bool[], $14::text[], $15::text[], $16::bigint[], $17)";

    pub(super) async fn commit(
        c: &mut sqlx::PgConnection,
        appends: &[&Append],
        now: i64,
    ) -> Result<HashSet<String>, sqlx::Error> {
        let n = appends.len();
        // One array per argument, one element per append.
        fn each<'a, T>(appends: &[&'a Append], f: impl Fn(&'a Append) -> T) -> Vec<T> {
            appends.iter().map(|a| f(a)).collect()
        }
        let runs = each(appends, |a| a.run_id.as_str());
        let holders = each(appends, |a| a.holder.as_deref());
        let take = each(appends, |a| a.take_lease.is_some());
        let expiries = each(appends, |a| a.take_lease.unwrap_or(0));
        let kinds = each(appends, |a| a.kind.as_str());
        let bodies = each(appends, |a| a.body.as_str());
        let counts = each(appends, |a| a.count as i64);
        let finished = each(appends, |a| a.finished);
        let release = each(appends, |a| a.release);
        let starts = each(appends, |a| a.start.is_some());
        let sessions = each(appends, |a| {
            a.start.as_ref().and_then(|s| s.session.as_deref())
        });
        let metas = each(appends, |a| {
            a.start.as_ref().and_then(|s| s.meta.as_deref())
        });
        let revisions = each(appends, |a| {
            a.start.as_ref().and_then(|s| s.session_revision)
        });
        let me = crate::lease::me();
        // In a transaction of its own, not alone: a call alone commits in the server even when
        // the process that sent it is killed while it runs, and the run would then appear after
        // its process was seen gone. The commit is a message of its own, sent only once the
        // answer is in.
        let mut tx = sqlx::Connection::begin(c).await?;
        let answer: Vec<bool> = sqlx::query_scalar(APPEND_BATCH)
            .bind(runs)
            .bind(holders)
            .bind(take)
            .bind(expiries)
            .bind(me.host.as_str())
            .bind(me.pid)
            .bind(me.start.as_str())
            .bind(kinds)
            .bind(bodies)
            .bind(counts)
            .bind(finished)
            .bind(release)
            .bind(starts)
            .bind(sessions)
            .bind(metas)
            .bind(revisions)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
        if answer.len() != n {
            return Err(sqlx::Error::Protocol(format!(
                "the batch's answer has {} runs of {n}",
                answer.len()
            )));
        }
        tx.commit().await?;
        Ok(appends
            .iter()
            .zip(answer)
            .filter(|(_, fenced)| *fenced)
            .map(|(a, _)| a.run_id.clone())
            .collect())
    }
}

/// A step's records as one row: their kinds, joined by commas, and their JSON (one record's
/// object, or an array of them, in order).
pub(crate) fn encode(records: &[Record]) -> Result<(String, String), serde_json::Error> {
    if let [one] = records {
        return Ok((one.kind().to_string(), serde_json::to_string(one)?));
    }
    let mut kind = String::new();
    let mut body = Vec::with_capacity(256 * records.len());
    body.push(b'[');
    for (i, r) in records.iter().enumerate() {
        if i > 0 {
            kind.push(',');
            body.push(b',');
        }
        kind.push_str(r.kind());
        serde_json::to_writer(&mut body, r)?;
    }
    body.push(b']');
    // serde_json writes UTF-8.
    let body = String::from_utf8(body)
        .map_err(|e| <serde_json::Error as serde::ser::Error>::custom(format!("not UTF-8: {e}")))?;
    Ok((kind, body))
}

/// A row's records: those of [`encode`]'s JSON (an array of records, or one record, as every row
/// was before rows held a step's records).
pub(crate) fn decode(body: &str) -> Result<Vec<Record>, serde_json::Error> {
    if body.trim_start().starts_with('[') {
        serde_json::from_str(body)
    } else {
        serde_json::from_str(body).map(|r| vec![r])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(run: &str, n: usize) -> Item {
        let (done, _) = oneshot::channel();
        (
            Append {
                run_id: run.into(),
                holder: None,
                kind: "finished".into(),
                body: "{}".into(),
                count: n,
                start: None,
                finished: false,
                take_lease: None,
                release: false,
            },
            done,
        )
    }

    #[test]
    fn a_batch_takes_one_append_per_run_in_order_within_the_limits() {
        let mut waiting: VecDeque<Item> = [
            item("a", 1),
            item("b", 2),
            item("a", 3),
            item("c", 1),
            item("a", 1),
        ]
        .into_iter()
        .collect();
        let runs = |b: &[Item]| b.iter().map(|(a, _)| a.run_id.clone()).collect::<Vec<_>>();
        let first = take_batch(&mut waiting);
        assert_eq!(runs(&first), ["a", "b", "c"]);
        // a's later appends wait, in order.
        assert_eq!(
            waiting.iter().map(|(a, _)| a.count).collect::<Vec<_>>(),
            [3, 1]
        );
        assert_eq!(take_batch(&mut waiting).len(), 1);
        assert_eq!(take_batch(&mut waiting).len(), 1);
        assert!(waiting.is_empty());

        // The record limit ends a batch (one oversized append still goes alone).
        let mut waiting: VecDeque<Item> = [item("a", MAX_RECORDS + 5), item("b", 1)]
            .into_iter()
            .collect();
        assert_eq!(take_batch(&mut waiting).len(), 1);
        assert_eq!(take_batch(&mut waiting).len(), 1);
        let mut waiting: VecDeque<Item> = (0..MAX_RUNS + 3)
            .map(|i| item(&format!("r{i}"), 1))
            .collect();
        assert_eq!(take_batch(&mut waiting).len(), MAX_RUNS);
        assert_eq!(take_batch(&mut waiting).len(), 3);
        // And so does the byte limit.
        let big = |run: &str| {
            let mut it = item(run, 1);
            it.0.body = "x".repeat(MAX_BYTES / 2 + 1);
            it
        };
        let mut waiting: VecDeque<Item> = [big("a"), big("b"), item("c", 1)].into_iter().collect();
        assert_eq!(take_batch(&mut waiting).len(), 1);
        assert_eq!(take_batch(&mut waiting).len(), 2);
    }
}
