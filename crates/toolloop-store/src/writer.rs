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
//! Every statement's text is fixed (it stays prepared), whatever the batch's size: the batch
//! goes in as parameters that hold every run's values (SQLite: JSON arrays read with
//! `json_each`; PostgreSQL: arrays read with `UNNEST`). The first statements take the leases of
//! the runs that start with the batch (their lease is written with their first records, not on
//! its own) and read every run's fence (does the append's holder hold the run's lease?) and last
//! sequence number; the next write the runs that are not fenced out: the new runs and their
//! sessions, every append's row, the runs' counters, the leases given back, and the commit.
//!
//! Where the writer runs:
//! - A SQLite file: on a thread of its own, with a connection of its own, so that a commit is
//!   one hand-off from the run to the writer and one back, whatever its number of statements
//!   (`BEGIN IMMEDIATE` holds the write lock from the first). Another thread checkpoints the
//!   log in the background (see [`Checkpoints`]).
//! - PostgreSQL: a task that keeps one connection of the pool while the store lives. The lookup
//!   holds the runs' lease rows (`FOR SHARE`) until the commit, so a takeover waits for it.
//! - `:memory:` (whose only connection every use shares): a task that takes the connection per
//!   transaction.

use crate::Pool;
use std::collections::{HashSet, VecDeque};
use tokio::sync::{mpsc, oneshot};
use toolloop::journal::{Record, StoreFailure};

/// The most records in one transaction (with [`MAX_RUNS`], bounds a transaction's size). A
/// larger append is split by the caller.
pub(crate) const MAX_RECORDS: usize = 2_000;
/// The most runs in one transaction.
const MAX_RUNS: usize = 500;
/// The most bytes of records in one transaction: a batch's bodies go to the database as one
/// parameter (SQLite: a blob; PostgreSQL: an array), and neither database takes one past a
/// billion bytes. An append larger than this still goes, alone.
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

/// SQLite. Each statement is of fixed text (so it stays prepared), whatever the batch: the
/// batch goes in as JSON arrays, one per statement, that the statements read with `json_each`.
/// The writer thread runs them on its own connection ([`serve`]); the writer task of a
/// `:memory:` store, on the pool's ([`commit`]).
#[cfg(feature = "sqlite")]
mod sqlite {
    use super::{
        Append, Checkpoints, IDLE_CHECKPOINT, Item, Looked, StoreFailure, WAL_AUTOCHECKPOINT,
        answer, fenced, kept, now_ms, take_batch, take_next,
    };
    use std::collections::{HashSet, VecDeque};
    use std::fmt::Write as _;
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

    /// Parameters: host, pid and process start (of the leases taken), and the leases to take
    /// (`[run, holder, expiry]`). `WHERE TRUE`: SQLite reads `ON CONFLICT` after a bare `FROM`
    /// as a join's.
    const TAKE_LEASES: &str =
        "INSERT INTO toolloop_leases (run_id, holder, host, pid, pid_start, expires_ms)
SELECT j.value ->> 0, j.value ->> 1, ?, ?, ?, j.value ->> 2 FROM json_each(?) AS j WHERE TRUE
ON CONFLICT (run_id) DO NOTHING";

    /// Parameter: the batch (`[run, holder]`, holder `null` when not fenced). One row: a JSON
    /// array of `[fenced, last]`, in the batch's order.
    const LOOKUP: &str = "SELECT json_group_array(json_array(
  CASE WHEN j.value ->> 1 IS NULL OR EXISTS (SELECT 1 FROM toolloop_leases l
    WHERE l.run_id = j.value ->> 0 AND l.holder = j.value ->> 1) THEN 0 ELSE 1 END,
  MAX(COALESCE((SELECT r.records FROM toolloop_runs r WHERE r.run_id = j.value ->> 0), 0),
    COALESCE((SELECT MAX(x.seq) FROM toolloop_records x WHERE x.run_id = j.value ->> 0), 0))))
FROM json_each(?) AS j";

    /// Parameters: now twice, and the sessions of the runs that start (`[name]`).
    const SESSIONS: &str =
        "INSERT INTO toolloop_sessions (name, messages, message_count, created_ms, updated_ms)
SELECT j.value ->> 0, '[]', 0, ?, ? FROM json_each(?) AS j WHERE TRUE
ON CONFLICT (name) DO NOTHING";

    /// Parameters: now twice, and the runs that start (`[run, session, meta, records,
    /// finished, revision]`).
    const NEW_RUNS: &str = "INSERT INTO toolloop_runs
(run_id, session, meta, records, finished, created_ms, updated_ms, session_revision)
SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4, ?, ?,
  COALESCE(j.value ->> 5, (SELECT s.revision FROM toolloop_sessions s WHERE s.name = j.value ->> 1))
FROM json_each(?) AS j WHERE TRUE
ON CONFLICT (run_id) DO UPDATE SET records = toolloop_runs.records + excluded.records,
  updated_ms = excluded.updated_ms, finished = (toolloop_runs.finished OR excluded.finished)";

    /// Parameters: the rows' bodies, one after the other (a blob: a body is taken out by its
    /// place, in bytes, with neither escaping nor parsing), now, and the rows (`[run, seq, kind,
    /// place of the body, its length]`).
    const ROWS: &str = "INSERT INTO toolloop_records (run_id, seq, kind, body, created_ms)
SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2,
  CAST(substr(?, j.value ->> 3, j.value ->> 4) AS TEXT), ? FROM json_each(?) AS j";

    /// Parameters: now, and the runs that go on (`[run, records, finished]`).
    const OLD_RUNS: &str =
        "UPDATE toolloop_runs SET records = toolloop_runs.records + (j.value ->> 1), updated_ms = ?,
  finished = (toolloop_runs.finished OR (j.value ->> 2))
FROM json_each(?) AS j WHERE toolloop_runs.run_id = j.value ->> 0";

    /// Parameter: the leases given back (`[run, holder]`).
    const RELEASES: &str = "DELETE FROM toolloop_leases WHERE (run_id, holder) IN
  (SELECT j.value ->> 0, j.value ->> 1 FROM json_each(?) AS j)";

    /// A statement's parameter.
    enum Param {
        Text(String),
        Int(i64),
        Blob(Vec<u8>),
    }

    /// The statements of a transaction's first part (before its lookup is read), and the
    /// lookup's parameter.
    fn first(appends: &[&Append]) -> (Option<Vec<Param>>, String) {
        let me = crate::lease::me();
        let mut leases = Rows::new(0);
        let mut batch = Rows::new(appends.len() * 80);
        for a in appends {
            if let (Some(expires), Some(holder)) = (a.take_lease, a.holder.as_deref()) {
                leases
                    .row()
                    .text(&a.run_id)
                    .text(holder)
                    .int(expires)
                    .end_row();
            }
            batch
                .row()
                .text(&a.run_id)
                .maybe_text(a.holder.as_deref())
                .end_row();
        }
        let take = leases.done().map(|leases| {
            vec![
                Param::Text(me.host.clone()),
                Param::Int(me.pid),
                Param::Text(me.start.clone()),
                Param::Text(leases),
            ]
        });
        (take, batch.done().unwrap_or_else(|| "[]".into()))
    }

    /// The statements that write the batch's kept appends, with their parameters (a statement
    /// with nothing to write is left out).
    fn second(appends: &[&Append], looked: &[Looked], now: i64) -> Vec<(&'static str, Vec<Param>)> {
        let mut sessions = Rows::new(0);
        let mut starts = Rows::new(0);
        let mut rows = Rows::new(appends.len() * 100);
        let mut bodies: Vec<u8> = Vec::with_capacity(appends.iter().map(|a| a.body.len()).sum());
        let mut counts = Rows::new(0);
        let mut releases = Rows::new(0);
        for (a, last) in kept(appends, looked) {
            if let Some(start) = &a.start {
                if let Some(session) = &start.session {
                    sessions.row().text(session).end_row();
                }
                starts
                    .row()
                    .text(&a.run_id)
                    .maybe_text(start.session.as_deref())
                    .maybe_text(start.meta.as_deref())
                    .int(a.count as i64)
                    .int(i64::from(a.finished))
                    .maybe_int(start.session_revision)
                    .end_row();
            } else if a.count > 0 {
                counts
                    .row()
                    .text(&a.run_id)
                    .int(a.count as i64)
                    .int(i64::from(a.finished))
                    .end_row();
            }
            if a.count > 0 {
                rows.row()
                    .text(&a.run_id)
                    .int(last + 1)
                    .text(&a.kind)
                    .int(bodies.len() as i64 + 1)
                    .int(a.body.len() as i64)
                    .end_row();
                bodies.extend_from_slice(a.body.as_bytes());
            }
            if a.release
                && let Some(holder) = a.holder.as_deref()
            {
                releases.row().text(&a.run_id).text(holder).end_row();
            }
        }
        let mut out = Vec::new();
        if let Some(s) = sessions.done() {
            out.push((
                SESSIONS,
                vec![Param::Int(now), Param::Int(now), Param::Text(s)],
            ));
        }
        if let Some(s) = starts.done() {
            out.push((
                NEW_RUNS,
                vec![Param::Int(now), Param::Int(now), Param::Text(s)],
            ));
        }
        if let Some(r) = rows.done() {
            out.push((
                ROWS,
                vec![Param::Blob(bodies), Param::Int(now), Param::Text(r)],
            ));
        }
        if let Some(c) = counts.done() {
            out.push((OLD_RUNS, vec![Param::Int(now), Param::Text(c)]));
        }
        if let Some(r) = releases.done() {
            out.push((RELEASES, vec![Param::Text(r)]));
        }
        out
    }

    /// Builds one JSON array of rows.
    struct Rows {
        text: String,
        any: bool,
    }

    impl Rows {
        fn new(capacity: usize) -> Self {
            let mut text = String::with_capacity(capacity + 2);
            text.push('[');
            Rows { text, any: false }
        }
        /// Starts a row.
        fn row(&mut self) -> &mut Self {
            if self.any {
                self.text.push(',');
            }
            self.any = true;
            self.text.push('[');
            self
        }
        fn sep(&mut self) {
            if !self.text.ends_with('[') {
                self.text.push(',');
            }
        }
        fn text(&mut self, s: &str) -> &mut Self {
            self.sep();
            super::push_json_str(&mut self.text, s);
            self
        }
        fn maybe_text(&mut self, s: Option<&str>) -> &mut Self {
            match s {
                Some(s) => self.text(s),
                None => {
                    self.sep();
                    self.text.push_str("null");
                    self
                }
            }
        }
        fn int(&mut self, i: i64) -> &mut Self {
            self.sep();
            let _ = write!(self.text, "{i}");
            self
        }
        fn maybe_int(&mut self, i: Option<i64>) -> &mut Self {
            match i {
                Some(i) => self.int(i),
                None => {
                    self.sep();
                    self.text.push_str("null");
                    self
                }
            }
        }
        fn end_row(&mut self) {
            self.text.push(']');
        }
        /// The array, unless it has no row.
        fn done(mut self) -> Option<String> {
            self.text.push(']');
            self.any.then_some(self.text)
        }
    }

    /// The lookup's answer: `[fenced, last]` per append, in order.
    fn decode(text: &str, n: usize) -> Result<Vec<Looked>, StoreFailure> {
        let pairs: Vec<(i64, i64)> = serde_json::from_str(text)
            .map_err(|e| StoreFailure::from(format!("the lookup's answer: {e}")))?;
        if pairs.len() != n {
            return Err(format!("the lookup answered for {} runs of {n}", pairs.len()).into());
        }
        Ok(pairs
            .into_iter()
            .map(|(fenced, last)| Looked {
                fenced: fenced != 0,
                last,
            })
            .collect())
    }

    /// Commits a batch on the pool's connection (a `:memory:` store); the runs that were
    /// fenced out.
    pub(super) async fn commit(
        c: &mut sqlx::SqliteConnection,
        appends: &[&Append],
        now: i64,
    ) -> Result<HashSet<String>, StoreFailure> {
        fn bind<'q>(
            mut q: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
            params: Vec<Param>,
        ) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
            for p in params {
                q = match p {
                    Param::Text(s) => q.bind(s),
                    Param::Int(i) => q.bind(i),
                    Param::Blob(b) => q.bind(b),
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
            let (take, batch) = first(appends);
            if let Some(params) = take {
                bind(sqlx::query(TAKE_LEASES), params)
                    .execute(&mut *c)
                    .await
                    .map_err(failed)?;
            }
            let looked: String = sqlx::query_scalar(LOOKUP)
                .bind(batch)
                .fetch_one(&mut *c)
                .await
                .map_err(failed)?;
            let looked = decode(&looked, appends.len())?;
            for (sql, params) in second(appends, &looked, now) {
                bind(sqlx::query(sql), params)
                    .execute(&mut *c)
                    .await
                    .map_err(failed)?;
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

    impl rusqlite::ToSql for Param {
        fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
            use rusqlite::types::{ToSqlOutput, ValueRef};
            Ok(ToSqlOutput::Borrowed(match self {
                Param::Text(s) => ValueRef::Text(s.as_bytes()),
                Param::Int(i) => return Ok(ToSqlOutput::from(*i)),
                Param::Blob(b) => ValueRef::Blob(b),
            }))
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
        c: &mut rusqlite::Connection,
        appends: &[&Append],
        now: i64,
    ) -> Result<HashSet<String>, StoreFailure> {
        let failed = StoreFailure::new;
        let ran = (|| {
            // Prepared once, like every statement here.
            c.prepare_cached("BEGIN IMMEDIATE")
                .and_then(|mut s| s.execute([]))
                .map_err(failed)?;
            let fenced = write_here(c, appends, now)?;
            c.prepare_cached("COMMIT")
                .and_then(|mut s| s.execute([]))
                .map_err(failed)?;
            Ok(fenced)
        })();
        if ran.is_err() && !c.is_autocommit() {
            // A statement failed before the commit: nothing of the batch stays.
            let _ = c.execute_batch("ROLLBACK");
        }
        ran
    }

    /// The statements of a commit, in its transaction.
    fn write_here(
        tx: &rusqlite::Connection,
        appends: &[&Append],
        now: i64,
    ) -> Result<HashSet<String>, StoreFailure> {
        let failed = StoreFailure::new;
        let (take, batch) = first(appends);
        if let Some(params) = take {
            tx.prepare_cached(TAKE_LEASES)
                .and_then(|mut s| s.execute(rusqlite::params_from_iter(params)))
                .map_err(failed)?;
        }
        let looked: String = tx
            .prepare_cached(LOOKUP)
            .and_then(|mut s| s.query_row([batch], |r| r.get(0)))
            .map_err(failed)?;
        let looked = decode(&looked, appends.len())?;
        for (sql, params) in second(appends, &looked, now) {
            tx.prepare_cached(sql)
                .and_then(|mut s| s.execute(rusqlite::params_from_iter(params)))
                .map_err(failed)?;
        }
        Ok(fenced(appends, &looked))
    }

    /// The writer thread: until every handle is gone, commits whatever is waiting.
    pub(super) fn serve(file: File, queue: std::sync::mpsc::Receiver<Item>) {
        use std::sync::mpsc::RecvTimeoutError;
        let mut waiting: VecDeque<Item> = VecDeque::new();
        let mut conn: Option<rusqlite::Connection> = None;
        let mut checkpoints = Checkpoints::new(file.clone());
        let mut next: Option<Vec<Item>> = None;
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
            .and_then(|c| commit_here(c, &appends, now_ms()));
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
/// migration that makes it), so one round trip and, called alone, one transaction: the batch
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
        let (mut runs, mut holders, mut take, mut expiries) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut kinds, mut bodies, mut counts) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut finished, mut release, mut start) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut sessions, mut metas, mut revisions) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for a in appends {
            runs.push(a.run_id.as_str());
            holders.push(a.holder.as_deref());
            take.push(a.take_lease.is_some());
            expiries.push(a.take_lease.unwrap_or(0));
            kinds.push(a.kind.as_str());
            bodies.push(a.body.as_str());
            counts.push(a.count as i64);
            finished.push(a.finished);
            release.push(a.release);
            start.push(a.start.is_some());
            sessions.push(a.start.as_ref().and_then(|s| s.session.as_deref()));
            metas.push(a.start.as_ref().and_then(|s| s.meta.as_deref()));
            revisions.push(a.start.as_ref().and_then(|s| s.session_revision));
        }
        let me = crate::lease::me();
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
            .bind(start)
            .bind(sessions)
            .bind(metas)
            .bind(revisions)
            .bind(now)
            .fetch_one(&mut *c)
            .await?;
        if answer.len() != n {
            return Err(sqlx::Error::Protocol(format!(
                "the batch's answer has {} runs of {n}",
                answer.len()
            )));
        }
        Ok(appends
            .iter()
            .zip(answer)
            .filter(|(_, fenced)| *fenced)
            .map(|(a, _)| a.run_id.clone())
            .collect())
    }
}

/// Writes `s` as a JSON string.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
fn push_json_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let bytes = s.as_bytes();
    let mut from = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[from..i]);
        if escape.is_empty() {
            use std::fmt::Write as _;
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escape);
        }
        from = i + 1;
    }
    out.push_str(&s[from..]);
    out.push('"');
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
