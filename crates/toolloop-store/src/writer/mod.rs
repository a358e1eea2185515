//! The group writer: one writer per store commits the appends of every run, as many as are
//! waiting, in one transaction (group commit).
//!
//! An append (one run's records of one step) is queued with a channel to answer on. The writer
//! takes the appends waiting when it is free (at most one per run, in the order they came, so a
//! run's records stay in order, and none of a run that was in the transaction just answered:
//! a run's next step never joins the batch right after its own) and commits them together, then
//! answers each: committed, fenced out (the run's lease is held by someone else: nothing of that
//! run was written, the others were), or failed (the transaction failed: nothing of the batch
//! was written, and every append of it fails). While a transaction is under way the next
//! appends gather, so the busier the store, the more runs share a commit; and while many runs
//! share its commits (its recent commits held [`SIBLINGS`] runs' steps or more, on average), the
//! writer waits a moment before each one ([`DEFAULT_COMMIT_DELAY`], set with
//! `Store::with_commit_delay`), as PostgreSQL's `commit_delay` does, so that more steps share
//! it: a commit costs about the same for one step as for thirty.
//!
//! The log (see the migration that makes it) is a table of rows in the order they are written,
//! each naming its run and linking to the run's previous row, and a narrow table of each running
//! run's tail (its last row and its last record's number). An append is one row, whatever its
//! number of records: its records' JSON (one record's object, or an array of them), numbered with
//! the sequence number of its first record (a run's records are numbered 1, 2, … across its
//! rows). So a commit writes its rows one after the other at the end of the log, and its runs'
//! tails, which sit together: few pages, whatever the number of runs. When a run ends, its
//! record count and last row go to its row of the runs table, and its tail is removed.
//!
//! A transaction first takes the leases of the runs that start with the batch (their lease is
//! written with their first records, not on its own) and reads every run's fence (does the
//! append's holder hold the run's lease?; on a SQLite file, not while no other connection has
//! written since the fence was last read) and, unless the writer knows them already, its tail;
//! then it writes the runs that are not fenced out: the new runs and their sessions, every
//! append's row, the tails (or, for runs that end, their run rows), the leases given back, and
//! the commit. Every statement's text is fixed, so it stays prepared. The writer knows a run's
//! tail while one holder writes it ([`Known`]): nobody else can write the run while that
//! holder's lease holds, which the fence checks in every transaction.
//!
//! Where the writer runs:
//! - A SQLite file: on a thread of its own, with a connection of its own, so that a commit is
//!   one hand-off from the run to the writer and one back. SQLite runs in the process, so the
//!   statements go one per append, with the append's values bound as they are (no copy of a
//!   record's JSON); `BEGIN IMMEDIATE` holds the write lock from the first. Another thread
//!   checkpoints the log in the background (see `sqlite`'s `Checkpoints`).
//! - PostgreSQL: tasks (lanes, two by default) that each keep one connection of the pool while
//!   the store lives and commit side by side, a run's appends always through the same one. A
//!   batch is one call of the store's function `toolloop_append_batch`, whose arguments are
//!   arrays with one element per append, between `BEGIN` and `COMMIT` (three round trips
//!   whatever the batch; the commit is sent only once the call has answered, so a process
//!   killed during the call writes nothing). It holds the runs' lease rows (`FOR SHARE`) until
//!   the commit, so a takeover waits for it.
//! - `:memory:` (whose only connection every use shares): a task that takes the connection per
//!   transaction, and runs the SQLite statements one query each.

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(test)]
mod tests;

#[cfg(feature = "sqlite")]
pub(crate) use sqlite::{BUSY_TIMEOUT, File, JOURNAL_SIZE_LIMIT, WAL_AUTOCHECKPOINT};

use crate::Pool;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
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
/// How long the writer waits before a commit, while many runs share its commits, for more
/// steps to join it (see the module docs).
pub(crate) const DEFAULT_COMMIT_DELAY: Duration = Duration::from_millis(1);
/// How many transactions a PostgreSQL store's writer commits side by side (its lanes), each on
/// a connection of its own, unless set otherwise (`Store::with_writers`).
pub(crate) const POSTGRES_LANES: usize = 2;
/// The most lanes a PostgreSQL store's writer has: each keeps one of the pool's connections.
pub(crate) const MAX_LANES: usize = 4;
/// How many runs' steps the writer's recent commits must have held, on average, for it to wait
/// before the next one: below that, few runs write at once, and a wait would only delay them.
pub(crate) const SIBLINGS: f64 = 4.0;

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
    /// Tasks that each keep a connection of the pool (PostgreSQL).
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
    /// What the handle and the writer share: the commit delay and the counts.
    shared: Arc<Shared>,
    /// The writer's lanes: each commits the appends of its runs (a run's lane is fixed by its
    /// id), one transaction at a time, while the others commit theirs.
    lanes: Vec<std::sync::Mutex<Lane>>,
}

/// A lane of the writer.
enum Lane {
    /// Not started yet (or stopped: a task whose runtime ended).
    Idle,
    /// Committing what is queued; `ended` resolves once it has stopped and closed its
    /// connections.
    Running {
        queue: Queue,
        ended: oneshot::Receiver<()>,
    },
    /// Closed: appends are refused.
    Closed,
}

/// What a writer's handle and the writer share.
struct Shared {
    /// How long to wait before a commit while many runs share the writer's commits, in µs
    /// (read by the writer before each commit).
    delay: AtomicU64,
    /// Transactions committed.
    commits: AtomicU64,
    /// Appends committed.
    appends: AtomicU64,
    /// Records committed.
    records: AtomicU64,
    /// Transactions that failed.
    failures: AtomicU64,
}

impl Shared {
    fn new(delay: Duration) -> Self {
        Shared {
            delay: AtomicU64::new(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX)),
            commits: AtomicU64::new(0),
            appends: AtomicU64::new(0),
            records: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }
}

/// What a store's writer has done since the store was opened: how many transactions it
/// committed, and how many appends (one run's records of one step each) and records they held.
/// `appends / commits` is how many steps shared a commit, on average.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct WriterStats {
    /// Transactions committed.
    pub commits: u64,
    /// Appends committed.
    pub appends: u64,
    /// Records committed.
    pub records: u64,
    /// Transactions that failed (none of their appends was written).
    pub failures: u64,
}

/// Where appends are queued for the writer.
enum Queue {
    Task(mpsc::UnboundedSender<Item>),
    #[cfg(feature = "sqlite")]
    Thread(std::sync::mpsc::Sender<Item>),
}

impl Writer {
    pub(crate) fn new(pool: Pool, place: Place) -> Self {
        Self::with_lanes(pool, place, POSTGRES_LANES)
    }

    /// A writer with `lanes` lanes on PostgreSQL (from 1 to [`MAX_LANES`]); SQLite commits one
    /// transaction at a time, so its writer has one.
    fn with_lanes(pool: Pool, place: Place, lanes: usize) -> Self {
        let lanes = match place {
            Place::Pooled => lanes.clamp(1, MAX_LANES),
            _ => 1,
        };
        Writer {
            pool,
            place,
            shared: Arc::new(Shared::new(DEFAULT_COMMIT_DELAY)),
            lanes: (0..lanes)
                .map(|_| std::sync::Mutex::new(Lane::Idle))
                .collect(),
        }
    }

    /// Another writer of the same store (with queues and counts of its own, and the same
    /// commit delay), with `lanes` lanes (see [`Writer::with_lanes`]), or as many as this one.
    pub(crate) fn again(&self, lanes: Option<usize>) -> Self {
        let lanes = lanes.unwrap_or(self.lanes.len());
        let writer = Writer::with_lanes(self.pool.clone(), self.place.clone(), lanes);
        writer.set_delay(self.delay());
        writer
    }

    /// Sets how long the writer waits before a commit while many runs share its commits.
    pub(crate) fn set_delay(&self, wait: Duration) {
        let micros = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay.store(micros, Ordering::Relaxed);
    }

    /// How long the writer waits before a commit while many runs share its commits.
    pub(crate) fn delay(&self) -> Duration {
        Duration::from_micros(self.shared.delay.load(Ordering::Relaxed))
    }

    /// What the writer has done so far.
    pub(crate) fn stats(&self) -> WriterStats {
        Self::stats_of(&self.shared)
    }

    fn stats_of(s: &Shared) -> WriterStats {
        WriterStats {
            commits: s.commits.load(Ordering::Relaxed),
            appends: s.appends.load(Ordering::Relaxed),
            records: s.records.load(Ordering::Relaxed),
            failures: s.failures.load(Ordering::Relaxed),
        }
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
        // A run's lane: its id's last bytes (a run id ends in random digits).
        let lane = item
            .0
            .run_id
            .bytes()
            .rev()
            .take(4)
            .fold(0usize, |h, b| h * 31 + usize::from(b))
            % self.lanes.len();
        let mut lane = self.lanes[lane].lock().unwrap_or_else(|p| p.into_inner());
        let item = match &*lane {
            Lane::Running {
                queue: Queue::Task(tx),
                ..
            } => match tx.send(item) {
                Ok(()) => return,
                // The task is gone (its runtime ended): start another.
                Err(mpsc::error::SendError(back)) => back,
            },
            #[cfg(feature = "sqlite")]
            Lane::Running {
                queue: Queue::Thread(tx),
                ..
            } => match tx.send(item) {
                Ok(()) => return,
                Err(std::sync::mpsc::SendError(back)) => back,
            },
            Lane::Idle => item,
            Lane::Closed => {
                let _ = item.1.send(Written::Failed("the store is closed".into()));
                return;
            }
        };
        let pace = Pace::new(self.shared.clone());
        let (end, ended) = oneshot::channel();
        let started: std::io::Result<Queue> = match &self.place {
            #[cfg(feature = "sqlite")]
            Place::File(file) => {
                let (tx, rx) = std::sync::mpsc::channel();
                let file = file.clone();
                std::thread::Builder::new()
                    .name("toolloop-store-writer".into())
                    .spawn(move || sqlite::serve(file, rx, pace, end))
                    .map(|_| Queue::Thread(tx))
            }
            place => {
                let (tx, rx) = mpsc::unbounded_channel();
                let shared = matches!(place, Place::Shared);
                tokio::spawn(run(self.pool.clone(), shared, rx, pace, end));
                Ok(Queue::Task(tx))
            }
        };
        match started {
            Ok(queue) => {
                let item = match &queue {
                    // The receivers are alive: they were just made.
                    Queue::Task(tx) => tx.send(item).map_err(|e| e.0),
                    #[cfg(feature = "sqlite")]
                    Queue::Thread(tx) => tx.send(item).map_err(|e| e.0),
                };
                if let Err((_, done)) = item {
                    let _ = done.send(Written::Failed("the store's writer stopped".into()));
                }
                *lane = Lane::Running { queue, ended };
            }
            Err(e) => {
                let _ = item.1.send(Written::Failed(StoreFailure::new(e)));
            }
        }
    }

    /// For a SQLite file, the connection that closes last and decides what becomes of the log
    /// (see [`sqlite::LogCloser`]); `None` otherwise.
    #[cfg(feature = "sqlite")]
    pub(crate) fn log_closer(&self) -> Option<sqlite::LogCloser> {
        match &self.place {
            Place::File(file) => sqlite::LogCloser::open(file),
            _ => None,
        }
    }

    /// Closes the writer: what was queued is committed, and every later append is refused.
    /// Returns once each lane has stopped and closed its connections.
    pub(crate) async fn close(&self) {
        let mut ends = Vec::new();
        for lane in &self.lanes {
            let mut lane = lane.lock().unwrap_or_else(|p| p.into_inner());
            // Dropping the queue's sender ends the writer once it has committed what waits.
            if let Lane::Running { ended, .. } = std::mem::replace(&mut *lane, Lane::Closed) {
                ends.push(ended);
            }
        }
        for ended in ends {
            // Resolved when the writer ends, whether it says so or is gone.
            let _ = ended.await;
        }
    }
}

/// When the writer waits before a commit: while its recent commits held [`SIBLINGS`] runs'
/// steps or more on average (many runs write at once), for the store's commit delay, so that
/// more steps share the commit. One run alone, or a few, are never kept waiting: their commits
/// hold one or two steps. It keeps the writer's counts too.
struct Pace {
    /// The commit delay (the store's setting) and the counts.
    shared: Arc<Shared>,
    /// How many appends the recent commits held: a moving average over about eight.
    mean: f64,
}

impl Pace {
    fn new(shared: Arc<Shared>) -> Self {
        Pace { shared, mean: 1.0 }
    }

    /// After a transaction of `appends`: committed or failed.
    fn committed<T, E>(&mut self, appends: &[&Append], result: &Result<T, E>) {
        let n = appends.len();
        self.mean += (n as f64 - self.mean) / 8.0;
        let s = &self.shared;
        if result.is_ok() {
            let records: usize = appends.iter().map(|a| a.count).sum();
            s.commits.fetch_add(1, Ordering::Relaxed);
            s.appends.fetch_add(n as u64, Ordering::Relaxed);
            s.records.fetch_add(records as u64, Ordering::Relaxed);
        } else {
            s.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How long to wait before the next commit, with `waiting` appends waiting (none: commit
    /// at once). Not when as many wait as a commit has held of late: the writer is behind, and
    /// a wait would only hold it back.
    fn wait(&self, waiting: usize) -> Option<Duration> {
        let delay = self.shared.delay.load(Ordering::Relaxed);
        (delay > 0 && self.mean >= SIBLINGS && (waiting as f64) < self.mean)
            .then(|| Duration::from_micros(delay))
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
async fn run(
    pool: Pool,
    shared: bool,
    mut queue: mpsc::UnboundedReceiver<Item>,
    mut pace: Pace,
    end: oneshot::Sender<()>,
) {
    let mut waiting: VecDeque<Item> = VecDeque::new();
    let mut conn: Option<Conn> = None;
    let mut known = Known::default();
    let mut answered = Runs::default();
    loop {
        if waiting.is_empty() {
            match queue.recv().await {
                Some(item) => waiting.push_back(item),
                None => {
                    // Closed: the connection goes back to the pool, then the writer says so.
                    drop(conn);
                    let _ = end.send(());
                    return;
                }
            }
        }
        while let Ok(item) = queue.try_recv() {
            waiting.push_back(item);
        }
        if let Some(wait) = pace.wait(waiting.len()) {
            tokio::time::sleep(wait).await;
            while let Ok(item) = queue.try_recv() {
                waiting.push_back(item);
            }
        }
        let batch = take_batch(&mut waiting, &answered);
        let appends: Vec<&Append> = batch.iter().map(|(a, _)| a).collect();
        let result = commit(&pool, &mut conn, &appends, &mut known).await;
        if shared || result.is_err() {
            // Back to the pool (a connection whose transaction failed is checked there).
            conn = None;
        }
        pace.committed(&appends, &result);
        answered = answer(batch, result);
    }
}

/// A set of run ids.
type Runs = foldhash::HashSet<String>;

/// Answers every append of a batch: how its transaction ended. Returns the batch's runs (none
/// of which may join the next batch).
fn answer(batch: Vec<Item>, result: Result<Runs, StoreFailure>) -> Runs {
    let mut runs = Runs::with_capacity_and_hasher(batch.len(), Default::default());
    match result {
        Ok(fenced) => {
            for (append, done) in batch {
                let written = if fenced.contains(append.run_id.as_str()) {
                    Written::Fenced
                } else {
                    Written::Committed
                };
                let _ = done.send(written);
                runs.insert(append.run_id);
            }
        }
        Err(e) => {
            tracing::warn!(
                runs = batch.len(),
                "a transaction of the run logs failed: {e}"
            );
            for (append, done) in batch {
                let _ = done.send(Written::Failed(e.clone()));
                runs.insert(append.run_id);
            }
        }
    }
    runs
}

/// The next transaction's appends: the waiting ones in order, at most one per run (a run's
/// later append stays, in order, for the next), none of a run of the batch just answered
/// (`answered`; unless nothing else waits, as when one run writes alone), within the limits.
fn take_batch(waiting: &mut VecDeque<Item>, answered: &Runs) -> Vec<Item> {
    let others = waiting
        .iter()
        .any(|(a, _)| !answered.contains(a.run_id.as_str()));
    // Which appends go, chosen first (the run ids are borrowed from the queue, not copied).
    let mut taken = Vec::with_capacity(waiting.len());
    {
        let mut runs: foldhash::HashSet<&str> = foldhash::HashSet::default();
        let (mut records, mut bytes) = (0, 0);
        for (a, _) in waiting.iter() {
            let fits = runs.is_empty()
                || (records + a.count <= MAX_RECORDS
                    && bytes + a.body.len() <= MAX_BYTES
                    && runs.len() < MAX_RUNS);
            if !fits {
                break;
            }
            let run = a.run_id.as_str();
            // Not a second of the run's, nor one of a run just answered (unless alone).
            let waits = runs.contains(run) || (others && answered.contains(run));
            let goes = !waits;
            if goes {
                runs.insert(run);
                records += a.count;
                bytes += a.body.len();
            }
            taken.push(goes);
        }
    }
    let going = taken.iter().filter(|t| **t).count();
    let mut batch = Vec::with_capacity(going);
    let mut rest = VecDeque::with_capacity(waiting.len().saturating_sub(going));
    for (i, item) in waiting.drain(..).enumerate() {
        if taken.get(i).copied().unwrap_or(false) {
            batch.push(item);
        } else {
            rest.push_back(item);
        }
    }
    *waiting = rest;
    batch
}

/// Where a run's log ends: its last record's number (0: none) and its last row in the log
/// (`None`: the run has no row there yet; its rows, if any, are older ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Tail {
    last: i64,
    last_id: Option<i64>,
}

/// One run's state at the start of a transaction, read under the transaction's lock (or known).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Looked {
    /// Whether the run's lease is someone else's (nothing of the run is written).
    fenced: bool,
    /// Where the run's log ends.
    tail: Tail,
}

/// The tail of each run the writer has written for a holder, so that a later append of the
/// run reads only its fence (the lease; another writer can take it) and not its tail as well:
/// while the holder's lease holds, nobody else writes the run. Kept with the holder it was
/// written for (another holder of the run looks it up again), dropped when the run ends or gives
/// its lease back, is fenced out, or is in a batch that failed.
///
/// It keeps too whether the fence still holds without reading it again: a run's fence read (or
/// known) in a transaction holds as long as no other connection has written the database since
/// (SQLite's `data_version` tells the writer thread so; see [`Known::written_elsewhere`]): each
/// entry is of an era, and a write from elsewhere starts the next one.
#[derive(Default)]
struct Known {
    runs: foldhash::HashMap<String, Entry>,
    era: u64,
}

/// What [`Known`] keeps of a run.
struct Entry {
    holder: String,
    tail: Tail,
    /// The era its fence was last known in (SQLite's writer reads it).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    era: u64,
}

/// The most runs [`Known`] keeps (past it, it starts over: a run whose holder went away
/// without giving its lease back stays until then).
const KNOWN_MAX: usize = 100_000;

impl Known {
    fn entry(&self, a: &Append) -> Option<&Entry> {
        let holder = a.holder.as_deref()?;
        self.runs
            .get(a.run_id.as_str())
            .filter(|e| e.holder == holder)
    }

    /// The run's tail, when the writer knows it for the append's holder.
    fn tail(&self, a: &Append) -> Option<Tail> {
        self.entry(a).map(|e| e.tail)
    }

    /// Whether the append's holder still holds its run's lease, as far as the writer knows
    /// without reading it: it did when the writer last wrote the run, and nothing else has
    /// written the database since.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    fn fence_holds(&self, a: &Append) -> bool {
        self.entry(a).is_some_and(|e| e.era == self.era)
    }

    /// Another connection has written the database: no fence is known to hold any more.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    fn written_elsewhere(&mut self) {
        self.era += 1;
    }

    /// After a commit: each append's run as it was (`looked`) and the row it wrote (`ids`).
    fn committed(&mut self, appends: &[&Append], looked: &[Looked], ids: &[Option<i64>]) {
        for ((a, l), id) in appends.iter().zip(looked).zip(ids) {
            let Some(holder) = &a.holder else { continue };
            if l.fenced || a.release || a.finished {
                self.runs.remove(a.run_id.as_str());
                continue;
            }
            if self.runs.len() >= KNOWN_MAX {
                self.runs.clear();
            }
            let entry = Entry {
                holder: holder.clone(),
                tail: Tail {
                    last: l.tail.last + a.count as i64,
                    last_id: id.or(l.tail.last_id),
                },
                era: self.era,
            };
            match self.runs.get_mut(a.run_id.as_str()) {
                Some(known) => *known = entry,
                None => {
                    self.runs.insert(a.run_id.clone(), entry);
                }
            }
        }
    }

    /// After a failed commit.
    fn forget(&mut self, appends: &[&Append]) {
        for a in appends {
            self.runs.remove(a.run_id.as_str());
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The runs fenced out.
fn fenced(appends: &[&Append], looked: &[Looked]) -> Runs {
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
    known: &mut Known,
) -> Result<Runs, StoreFailure> {
    let conn = match conn {
        Some(c) => c,
        None => conn.insert(acquire(pool).await.map_err(StoreFailure::new)?),
    };
    match conn {
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(c) => sqlite::commit(c, appends, now_ms(), known).await,
        #[cfg(feature = "postgres")]
        Conn::Postgres(c) => postgres::commit(c, appends, now_ms(), known)
            .await
            .map_err(StoreFailure::new),
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
