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
//!   checkpoints the log in the background (see [`Checkpoints`]).
//! - PostgreSQL: tasks (lanes, two by default) that each keep one connection of the pool while
//!   the store lives and commit side by side, a run's appends always through the same one. A
//!   batch is one call of the store's function `toolloop_append_batch`, whose arguments are
//!   arrays with one element per append, between `BEGIN` and `COMMIT` (three round trips
//!   whatever the batch; the commit is sent only once the call has answered, so a process
//!   killed during the call writes nothing). It holds the runs' lease rows (`FOR SHARE`) until
//!   the commit, so a takeover waits for it.
//! - `:memory:` (whose only connection every use shares): a task that takes the connection per
//!   transaction, and runs the SQLite statements one query each.

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
    /// The era its fence was last known in.
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
    fn fence_holds(&self, a: &Append) -> bool {
        self.entry(a).is_some_and(|e| e.era == self.era)
    }

    /// Another connection has written the database: no fence is known to hold any more.
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

/// SQLite: statements of one append each, of fixed text (so they stay prepared). The writer
/// thread runs them on its own connection ([`serve`]); the writer task of a `:memory:` store, on
/// the pool's ([`commit`]).
#[cfg(feature = "sqlite")]
mod sqlite {
    use super::{
        Append, Checkpoints, IDLE_CHECKPOINT, Item, Known, Looked, Pace, Runs, StoreFailure, Tail,
        WAL_AUTOCHECKPOINT, answer, fenced, now_ms, take_batch,
    };
    use std::collections::VecDeque;
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

    /// A run's fence (1 when the lease is someone else's, else 0), its last record's number and
    /// its last row in the log: its tail while it goes on; else, for a run that ended, its run
    /// row's, and for a run whose rows are all older than the log, its record count (or its
    /// last older row's number, whichever is greater) and no row. Parameters: the run, and the
    /// holder (`NULL`: not fenced).
    const LOOKUP: &str = "SELECT
  CASE WHEN ?2 IS NULL OR EXISTS (SELECT 1 FROM toolloop_leases l
    WHERE l.run_id = ?1 AND l.holder = ?2) THEN 0 ELSE 1 END,
  COALESCE((SELECT t.last_seq FROM toolloop_log_tails t WHERE t.run_id = ?1),
    MAX(COALESCE((SELECT r.records FROM toolloop_runs r WHERE r.run_id = ?1), 0),
      COALESCE((SELECT MAX(x.seq) FROM toolloop_records x WHERE x.run_id = ?1), 0))),
  COALESCE((SELECT t.last_id FROM toolloop_log_tails t WHERE t.run_id = ?1),
    (SELECT r.last_id FROM toolloop_runs r WHERE r.run_id = ?1))";

    /// A run's fence alone (see [`LOOKUP`]). Parameters: the run, and the holder.
    const FENCE: &str = "SELECT CASE WHEN ?2 IS NULL OR EXISTS (SELECT 1 FROM toolloop_leases l
    WHERE l.run_id = ?1 AND l.holder = ?2) THEN 0 ELSE 1 END";

    /// A starting run's session, unless it exists. Parameters: the name, now.
    const SESSION: &str =
        "INSERT INTO toolloop_sessions (name, messages, message_count, created_ms, updated_ms)
VALUES (?1, '[]', 0, ?2, ?2) ON CONFLICT (name) DO NOTHING";

    /// A starting run. Parameters: the run, its session, metadata, its last record's number
    /// once the append is written, now, and the session's revision it starts from (`NULL`: the
    /// revision now).
    const NEW_RUN: &str = "INSERT INTO toolloop_runs
(run_id, session, meta, records, finished, created_ms, updated_ms, session_revision)
VALUES (?1, ?2, ?3, ?4, FALSE, ?5, ?5,
  COALESCE(?6, (SELECT s.revision FROM toolloop_sessions s WHERE s.name = ?2)))
ON CONFLICT (run_id) DO UPDATE SET records = excluded.records,
  updated_ms = excluded.updated_ms";

    /// An append's row, at the end of the log. Parameters: the run, the sequence number of its
    /// first record, the run's previous row (`NULL`: none in the log), the records' kinds, their
    /// JSON, now.
    const ROW: &str = "INSERT INTO toolloop_log (run_id, seq, prev, kind, body, created_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

    /// The tail of a run that goes on. Parameters: the run, its last row, its last record's
    /// number.
    const TAIL: &str = "INSERT INTO toolloop_log_tails (run_id, last_id, last_seq)
VALUES (?1, ?2, ?3) ON CONFLICT (run_id) DO UPDATE SET last_id = excluded.last_id,
  last_seq = excluded.last_seq";

    /// A run that ends: its record count and last row. Parameters: the run, its last record's
    /// number, its last row, now.
    const ENDED: &str = "UPDATE toolloop_runs SET records = ?2, last_id = ?3, updated_ms = ?4,
  finished = TRUE WHERE run_id = ?1";

    /// The tail of a run that ended. Parameters: the run.
    const DROP_TAIL: &str = "DELETE FROM toolloop_log_tails WHERE run_id = ?1";

    /// A lease given back. Parameters: the run, the holder.
    const RELEASE: &str = "DELETE FROM toolloop_leases WHERE run_id = ?1 AND holder = ?2";

    /// The statements an append writes with.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Stmt {
        TakeLease,
        Session,
        NewRun,
        Row,
        Tail,
        Ended,
        DropTail,
        Release,
    }

    impl Stmt {
        /// How many there are.
        const COUNT: usize = 8;

        fn sql(self) -> &'static str {
            match self {
                Stmt::TakeLease => TAKE_LEASE,
                Stmt::Session => SESSION,
                Stmt::NewRun => NEW_RUN,
                Stmt::Row => ROW,
                Stmt::Tail => TAIL,
                Stmt::Ended => ENDED,
                Stmt::DropTail => DROP_TAIL,
                Stmt::Release => RELEASE,
            }
        }
    }

    /// A statement's parameter.
    #[derive(Clone, Copy)]
    enum Param<'a> {
        Text(&'a str),
        Null,
        Int(i64),
        /// The id of the row the append has just written ([`ROW`], run before).
        Row,
    }

    impl<'a> From<Option<&'a str>> for Param<'a> {
        fn from(s: Option<&'a str>) -> Self {
            s.map_or(Param::Null, Param::Text)
        }
    }

    impl From<Option<i64>> for Param<'_> {
        fn from(i: Option<i64>) -> Self {
            i.map_or(Param::Null, Param::Int)
        }
    }

    /// A statement and its parameters.
    type Statement<'a> = (Stmt, Vec<Param<'a>>);

    /// The parameters with [`Param::Row`] made the row just written (`NULL` when there is
    /// none, which no statement is given).
    fn resolved<'a>(params: Vec<Param<'a>>, row: Option<i64>) -> Vec<Param<'a>> {
        params
            .into_iter()
            .map(|p| match p {
                Param::Row => row.into(),
                p => p,
            })
            .collect()
    }

    /// The statement that takes a starting run's lease, if the append takes one.
    fn take_lease(a: &Append) -> Option<Statement<'_>> {
        let (expires, holder) = (a.take_lease?, a.holder.as_deref()?);
        let me = crate::lease::me();
        Some((
            Stmt::TakeLease,
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

    /// The parameters of [`LOOKUP`] and [`FENCE`] for an append's run.
    fn run_and_holder(a: &Append) -> [Param<'_>; 2] {
        [Param::Text(&a.run_id), a.holder.as_deref().into()]
    }

    /// The statements that write an append that was not fenced out, its run's log ending at
    /// `tail`.
    fn writes(a: &Append, tail: Tail, now: i64) -> Vec<Statement<'_>> {
        let mut out = Vec::with_capacity(4);
        let run = Param::Text(&a.run_id);
        // The run's last record's number once the append is written.
        let last = tail.last + a.count as i64;
        if let Some(start) = &a.start {
            if let Some(session) = &start.session {
                out.push((Stmt::Session, vec![Param::Text(session), Param::Int(now)]));
            }
            out.push((
                Stmt::NewRun,
                vec![
                    run,
                    start.session.as_deref().into(),
                    start.meta.as_deref().into(),
                    Param::Int(last),
                    Param::Int(now),
                    start.session_revision.into(),
                ],
            ));
        }
        if a.count > 0 {
            out.push((
                Stmt::Row,
                vec![
                    run,
                    Param::Int(tail.last + 1),
                    tail.last_id.into(),
                    Param::Text(&a.kind),
                    Param::Text(&a.body),
                    Param::Int(now),
                ],
            ));
        }
        let last_row = if a.count > 0 {
            Param::Row
        } else {
            tail.last_id.into()
        };
        if a.finished {
            out.push((
                Stmt::Ended,
                vec![run, Param::Int(last), last_row, Param::Int(now)],
            ));
            out.push((Stmt::DropTail, vec![run]));
        } else if a.count > 0 {
            out.push((Stmt::Tail, vec![run, last_row, Param::Int(last)]));
        }
        if a.release
            && let Some(holder) = a.holder.as_deref()
        {
            out.push((Stmt::Release, vec![run, Param::Text(holder)]));
        }
        out
    }

    /// Commits a batch on the pool's connection (a `:memory:` store); the runs that were
    /// fenced out. The same statements as the writer thread's, one query each.
    pub(super) async fn commit(
        c: &mut sqlx::SqliteConnection,
        appends: &[&Append],
        now: i64,
        known: &mut Known,
    ) -> Result<Runs, StoreFailure> {
        fn bind<'q>(
            sql: &'static str,
            params: Vec<Param<'q>>,
        ) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
            let mut q = sqlx::query(sql);
            for p in params {
                q = match p {
                    Param::Text(s) => q.bind(s),
                    Param::Null | Param::Row => q.bind(None::<i64>),
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
            for (stmt, params) in appends.iter().filter_map(|a| take_lease(a)) {
                bind(stmt.sql(), params)
                    .execute(&mut *c)
                    .await
                    .map_err(failed)?;
            }
            let mut looked = Vec::with_capacity(appends.len());
            for a in appends {
                let params = run_and_holder(a).to_vec();
                let l = match known.tail(a) {
                    Some(tail) => {
                        let row = bind(FENCE, params)
                            .fetch_one(&mut *c)
                            .await
                            .map_err(failed)?;
                        let fenced: i64 = sqlx::Row::try_get(&row, 0).map_err(failed)?;
                        Looked {
                            fenced: fenced != 0,
                            tail,
                        }
                    }
                    None => {
                        let row = bind(LOOKUP, params)
                            .fetch_one(&mut *c)
                            .await
                            .map_err(failed)?;
                        let fenced: i64 = sqlx::Row::try_get(&row, 0).map_err(failed)?;
                        Looked {
                            fenced: fenced != 0,
                            tail: Tail {
                                last: sqlx::Row::try_get(&row, 1).map_err(failed)?,
                                last_id: sqlx::Row::try_get(&row, 2).map_err(failed)?,
                            },
                        }
                    }
                };
                looked.push(l);
            }
            let mut ids = vec![None; appends.len()];
            for (i, (a, l)) in appends.iter().zip(&looked).enumerate() {
                if l.fenced {
                    continue;
                }
                for (stmt, params) in writes(a, l.tail, now) {
                    let done = bind(stmt.sql(), resolved(params, ids[i]))
                        .execute(&mut *c)
                        .await
                        .map_err(failed)?;
                    if stmt == Stmt::Row {
                        ids[i] = Some(done.last_insert_rowid());
                    }
                }
            }
            sqlx::query("COMMIT")
                .execute(&mut *c)
                .await
                .map_err(failed)?;
            Ok::<_, StoreFailure>((looked, ids))
        }
        .await;
        match ran {
            Ok((looked, ids)) => {
                known.committed(appends, &looked, &ids);
                Ok(fenced(appends, &looked))
            }
            Err(e) => {
                // The transaction may be open (a statement failed before the commit).
                let _ = sqlx::query("ROLLBACK").execute(&mut *c).await;
                known.forget(appends);
                Err(e)
            }
        }
    }

    impl rusqlite::ToSql for Param<'_> {
        fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
            use rusqlite::types::{ToSqlOutput, ValueRef};
            Ok(match *self {
                Param::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
                Param::Null | Param::Row => ToSqlOutput::Borrowed(ValueRef::Null),
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
        known: &mut Thread,
    ) -> Result<Runs, StoreFailure> {
        let failed = StoreFailure::new;
        // Every statement is prepared once (the connection keeps them), and taken from the
        // connection's cache once per batch.
        let mut prepared: [Option<rusqlite::CachedStatement<'_>>; Stmt::COUNT] = Default::default();
        let mut run = |stmt: Stmt, params: Vec<Param<'_>>| {
            let s = match &mut prepared[stmt as usize] {
                Some(s) => s,
                slot => slot.insert(c.prepare_cached(stmt.sql()).map_err(failed)?),
            };
            s.execute(rusqlite::params_from_iter(params))
                .map_err(failed)
        };
        let ran = (|| {
            c.execute_batch("BEGIN IMMEDIATE").map_err(failed)?;
            // Whether another connection has written the database since this one last did
            // (SQLite's `data_version` changes then, and only then; the write lock is held from
            // here to the commit, so nobody writes meanwhile).
            let version: i64 = c
                .prepare_cached("PRAGMA data_version")
                .and_then(|mut s| s.query_row([], |r| r.get(0)))
                .map_err(failed)?;
            if known.version != Some(version) {
                known.version = Some(version);
                known.runs.written_elsewhere();
            }
            for (stmt, params) in appends.iter().filter_map(|a| take_lease(a)) {
                run(stmt, params)?;
            }
            let mut looked = Vec::with_capacity(appends.len());
            {
                let mut find = c.prepare_cached(LOOKUP).map_err(failed)?;
                let mut fence = c.prepare_cached(FENCE).map_err(failed)?;
                for a in appends {
                    let params = run_and_holder(a);
                    let l = match known.runs.tail(a) {
                        // Known to hold: nobody else has written since it was last read.
                        Some(tail) if known.runs.fence_holds(a) => Looked {
                            fenced: false,
                            tail,
                        },
                        // The tail is known; the fence is read.
                        Some(tail) => Looked {
                            fenced: fence
                                .query_row(params, |r| r.get::<_, i64>(0))
                                .map_err(failed)?
                                != 0,
                            tail,
                        },
                        None => find
                            .query_row(params, |r| {
                                Ok(Looked {
                                    fenced: r.get::<_, i64>(0)? != 0,
                                    tail: Tail {
                                        last: r.get(1)?,
                                        last_id: r.get(2)?,
                                    },
                                })
                            })
                            .map_err(failed)?,
                    };
                    looked.push(l);
                }
            }
            let mut ids = vec![None; appends.len()];
            for (i, (a, l)) in appends.iter().zip(&looked).enumerate() {
                if l.fenced {
                    continue;
                }
                for (stmt, params) in writes(a, l.tail, now) {
                    run(stmt, resolved(params, ids[i]))?;
                    if stmt == Stmt::Row {
                        ids[i] = Some(c.last_insert_rowid());
                    }
                }
            }
            c.execute_batch("COMMIT").map_err(failed)?;
            Ok((looked, ids))
        })();
        match ran {
            Ok((looked, ids)) => {
                known.runs.committed(appends, &looked, &ids);
                Ok(fenced(appends, &looked))
            }
            Err(e) => {
                if !c.is_autocommit() {
                    // A statement failed before the commit: nothing of the batch stays.
                    let _ = c.execute_batch("ROLLBACK");
                }
                known.runs.forget(appends);
                // And what was read of the database may be stale.
                known.version = None;
                Err(e)
            }
        }
    }

    /// What the writer thread knows of the runs it writes, and the database's `data_version`
    /// as its connection last read it (`None`: not read yet, or a transaction failed since).
    #[derive(Default)]
    pub(super) struct Thread {
        runs: Known,
        version: Option<i64>,
    }

    /// The writer thread: until every handle is gone, commits whatever is waiting.
    pub(super) fn serve(
        file: File,
        queue: std::sync::mpsc::Receiver<Item>,
        mut pace: Pace,
        end: tokio::sync::oneshot::Sender<()>,
    ) {
        use std::sync::mpsc::RecvTimeoutError;
        let mut waiting: VecDeque<Item> = VecDeque::new();
        let mut conn: Option<rusqlite::Connection> = None;
        let mut checkpoints = Checkpoints::new(file.clone());
        let mut known = Thread::default();
        let mut answered = Runs::default();
        loop {
            if waiting.is_empty() {
                // Idle with records not yet checkpointed: after a while, checkpoint them, so a
                // burst of writes does not leave its log behind.
                let item = if checkpoints.commits > 0 {
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
                    None => break,
                }
            }
            while let Ok(item) = queue.try_recv() {
                waiting.push_back(item);
            }
            if let Some(wait) = pace.wait(waiting.len()) {
                // Asleep, the writer is not woken by each append that comes meanwhile.
                std::thread::sleep(wait);
                while let Ok(item) = queue.try_recv() {
                    waiting.push_back(item);
                }
            }
            let batch = take_batch(&mut waiting, &answered);
            let appends: Vec<&Append> = batch.iter().map(|(a, _)| a).collect();
            let result = match conn.as_mut() {
                Some(c) => Ok(c),
                None => open(&file)
                    .map(|c| conn.insert(c))
                    .map_err(StoreFailure::new),
            }
            .and_then(|c| commit_here(c, &appends, now_ms(), &mut known));
            match &result {
                Ok(_) => checkpoints.committed(appends.iter().map(|a| a.body.len()).sum()),
                // Opened again for the next batch.
                Err(_) => conn = None,
            }
            pace.committed(&appends, &result);
            answered = answer(batch, result);
        }
        // Closed: the checkpoints' connection, then the writer's, close (the last connection to
        // a file to close copies its log into it and removes it), then the writer says so.
        drop(checkpoints);
        drop(conn);
        let _ = end.send(());
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
/// for a passive checkpoint after its first commit and every [`CHECKPOINT_EVERY`] bytes of
/// records or [`CHECKPOINT_COMMITS`] commits, whichever comes first (a commit writes at least
/// a few pages, whatever its records' size), so the log is copied into the database while
/// commits go on (a long log makes every read of a page dearer), and the safety net
/// finds little left to copy when it fires; and once it has been idle for [`IDLE_CHECKPOINT`],
/// so the end of a burst of writes is not left in the log. A checkpoint copies each page the
/// log holds once, however many commits wrote it: the pages that every commit writes (the
/// runs' tails, the log's last pages) are copied once per checkpoint, so checkpoints a few
/// megabytes apart cost little more than the records themselves.
#[cfg(feature = "sqlite")]
struct Checkpoints {
    file: sqlite::File,
    /// Bytes of records committed since the last checkpoint was asked for.
    since: usize,
    /// Commits since then.
    commits: usize,
    /// The checkpoint thread (started with the first checkpoint): at most one checkpoint waits
    /// while another runs.
    thread: Option<(std::sync::mpsc::SyncSender<()>, std::thread::JoinHandle<()>)>,
}

/// Stops the checkpoint thread and waits for it (its connection closed).
#[cfg(feature = "sqlite")]
impl Drop for Checkpoints {
    fn drop(&mut self) {
        if let Some((asked, thread)) = self.thread.take() {
            drop(asked);
            let _ = thread.join();
        }
    }
}

/// How long the writer waits, idle with records not checkpointed yet, before it checkpoints
/// them.
#[cfg(feature = "sqlite")]
const IDLE_CHECKPOINT: std::time::Duration = std::time::Duration::from_secs(1);
/// Bytes of records between two background checkpoints (at most).
#[cfg(feature = "sqlite")]
const CHECKPOINT_EVERY: usize = 4 << 20;
/// Commits between two background checkpoints (at most).
#[cfg(feature = "sqlite")]
const CHECKPOINT_COMMITS: usize = 500;
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
            commits: 0,
            thread: None,
        }
    }

    /// After a commit of `bytes` bytes of records.
    fn committed(&mut self, bytes: usize) {
        self.since += bytes;
        self.commits += 1;
        if self.thread.is_none()
            || self.since >= CHECKPOINT_EVERY
            || self.commits >= CHECKPOINT_COMMITS
        {
            self.start();
        }
    }

    /// Asks for a checkpoint (one already waiting covers it).
    fn start(&mut self) {
        self.since = 0;
        self.commits = 0;
        if self.thread.is_none() {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let file = self.file.clone();
            match std::thread::Builder::new()
                .name("toolloop-store-checkpoint".into())
                .spawn(move || sqlite::checkpoint(file, rx))
            {
                Ok(thread) => self.thread = Some((tx, thread)),
                Err(e) => {
                    tracing::debug!("the run log's checkpoint thread did not start: {e}");
                    return;
                }
            }
        }
        if let Some((tx, _)) = &self.thread {
            let _ = tx.try_send(());
        }
    }
}

/// PostgreSQL: a batch is one call of the store's function `toolloop_append_batch` (see the
/// migration that makes it) in a transaction, so three round trips whatever its size: the batch
/// goes in as arrays, one element per append, that its statements read with `UNNEST`. It holds
/// the runs' lease rows (`FOR SHARE`) until the commit, so a takeover waits for it. The tails
/// the writer knows go with the batch, so the function looks up only the others.
#[cfg(feature = "postgres")]
mod postgres {
    use super::{Append, Known, Looked, Runs, Tail};

    /// The call; its arguments are in the order of the function's.
    const APPEND_BATCH: &str = "SELECT o_fenced, o_last, o_ids FROM toolloop_append_batch(\
         $1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], \
         $7::bigint[], $8::int[], $9::bigint[], $10, $11, $12, $13::int[], $14::text[], \
         $15::text[], $16::bigint[], $17::int[], $18::int[], $19)";

    pub(super) async fn commit(
        c: &mut sqlx::PgConnection,
        appends: &[&Append],
        now: i64,
        known: &mut Known,
    ) -> Result<Runs, sqlx::Error> {
        let done = call(c, appends, now, known).await;
        match done {
            Ok((looked, ids)) => {
                known.committed(appends, &looked, &ids);
                Ok(super::fenced(appends, &looked))
            }
            Err(e) => {
                known.forget(appends);
                Err(e)
            }
        }
    }

    /// Calls the function in a transaction: each append's run as it was, and the row it wrote.
    async fn call(
        c: &mut sqlx::PgConnection,
        appends: &[&Append],
        now: i64,
        known: &Known,
    ) -> Result<(Vec<Looked>, Vec<Option<i64>>), sqlx::Error> {
        let n = appends.len();
        // One array per argument, one element per append; and for what few appends do (take a
        // lease, start a run, end it, give a lease back), their places in the batch (from 1)
        // and what goes with them.
        fn each<'a, T>(appends: &[&'a Append], f: impl Fn(&'a Append) -> T) -> Vec<T> {
            appends.iter().map(|a| f(a)).collect()
        }
        fn places<'a>(appends: &[&'a Append], f: impl Fn(&'a Append) -> bool) -> Vec<i32> {
            (1..)
                .zip(appends)
                .filter(|(_, a)| f(a))
                .map(|(i, _)| i)
                .collect()
        }
        let tails = each(appends, |a| known.tail(a));
        let runs = each(appends, |a| a.run_id.as_str());
        let holders = each(appends, |a| a.holder.as_deref());
        let kinds = each(appends, |a| a.kind.as_str());
        let bodies = each(appends, |a| a.body.as_str());
        let counts = each(appends, |a| a.count as i64);
        let known_seq: Vec<Option<i64>> = tails.iter().map(|t| t.map(|t| t.last)).collect();
        let known_id: Vec<Option<i64>> = tails.iter().map(|t| t.and_then(|t| t.last_id)).collect();
        let finish_at = places(appends, |a| a.finished);
        let take_at = places(appends, |a| a.take_lease.is_some());
        let expiries: Vec<i64> = appends.iter().filter_map(|a| a.take_lease).collect();
        let starts: Vec<&super::Start> = appends.iter().filter_map(|a| a.start.as_ref()).collect();
        let start_at = places(appends, |a| a.start.is_some());
        let sessions: Vec<Option<&str>> = starts.iter().map(|s| s.session.as_deref()).collect();
        let metas: Vec<Option<&str>> = starts.iter().map(|s| s.meta.as_deref()).collect();
        let revisions: Vec<Option<i64>> = starts.iter().map(|s| s.session_revision).collect();
        let release_at = places(appends, |a| a.release);
        let me = crate::lease::me();
        // In a transaction of its own, not alone: a call alone commits in the server even when
        // the process that sent it is killed while it runs, and the run would then appear after
        // its process was seen gone. The commit is a message of its own, sent only once the
        // answer is in.
        let mut tx = sqlx::Connection::begin(c).await?;
        let (fenced, last, ids): (Vec<bool>, Vec<i64>, Vec<Option<i64>>) =
            sqlx::query_as(APPEND_BATCH)
                .bind(runs)
                .bind(holders)
                .bind(kinds)
                .bind(bodies)
                .bind(counts)
                .bind(known_seq)
                .bind(known_id)
                .bind(take_at)
                .bind(expiries)
                .bind(me.host.as_str())
                .bind(me.pid)
                .bind(me.start.as_str())
                .bind(start_at)
                .bind(sessions)
                .bind(metas)
                .bind(revisions)
                .bind(finish_at)
                .bind(release_at)
                .bind(now)
                .fetch_one(&mut *tx)
                .await?;
        if fenced.len() != n || last.len() != n || ids.len() != n {
            return Err(sqlx::Error::Protocol(format!(
                "the batch's answer has {}, {} and {} runs of {n}",
                fenced.len(),
                last.len(),
                ids.len()
            )));
        }
        tx.commit().await?;
        let looked = fenced
            .into_iter()
            .zip(last)
            .zip(&tails)
            .map(|((fenced, last), known)| Looked {
                fenced,
                tail: Tail {
                    last,
                    last_id: known.and_then(|t| t.last_id),
                },
            })
            .collect();
        Ok((looked, ids))
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

    fn none() -> Runs {
        Runs::default()
    }

    fn runs_of(ids: &[&str]) -> Runs {
        ids.iter().map(|s| s.to_string()).collect()
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
        let first = take_batch(&mut waiting, &none());
        assert_eq!(runs(&first), ["a", "b", "c"]);
        // a's later appends wait, in order.
        assert_eq!(
            waiting.iter().map(|(a, _)| a.count).collect::<Vec<_>>(),
            [3, 1]
        );
        assert_eq!(take_batch(&mut waiting, &none()).len(), 1);
        assert_eq!(take_batch(&mut waiting, &none()).len(), 1);
        assert!(waiting.is_empty());

        // The record limit ends a batch (one oversized append still goes alone).
        let mut waiting: VecDeque<Item> = [item("a", MAX_RECORDS + 5), item("b", 1)]
            .into_iter()
            .collect();
        assert_eq!(take_batch(&mut waiting, &none()).len(), 1);
        assert_eq!(take_batch(&mut waiting, &none()).len(), 1);
        let mut waiting: VecDeque<Item> = (0..MAX_RUNS + 3)
            .map(|i| item(&format!("r{i}"), 1))
            .collect();
        assert_eq!(take_batch(&mut waiting, &none()).len(), MAX_RUNS);
        assert_eq!(take_batch(&mut waiting, &none()).len(), 3);
        // And so does the byte limit.
        let big = |run: &str| {
            let mut it = item(run, 1);
            it.0.body = "x".repeat(MAX_BYTES / 2 + 1);
            it
        };
        let mut waiting: VecDeque<Item> = [big("a"), big("b"), item("c", 1)].into_iter().collect();
        assert_eq!(take_batch(&mut waiting, &none()).len(), 1);
        assert_eq!(take_batch(&mut waiting, &none()).len(), 2);
    }

    #[test]
    fn a_run_of_the_batch_just_answered_waits_for_the_one_after_unless_it_is_alone() {
        let runs = |b: &[Item]| b.iter().map(|(a, _)| a.run_id.clone()).collect::<Vec<_>>();
        let answered = runs_of(&["a"]);
        let mut waiting: VecDeque<Item> = [item("a", 1), item("b", 1), item("c", 1)]
            .into_iter()
            .collect();
        let batch = take_batch(&mut waiting, &answered);
        assert_eq!(runs(&batch), ["b", "c"]);
        // The batch after that one is a's.
        let answered = answer(batch, Ok(Runs::default()));
        assert_eq!(answered, runs_of(&["b", "c"]));
        assert_eq!(runs(&take_batch(&mut waiting, &answered)), ["a"]);
        // A run that writes alone is not kept waiting.
        let mut waiting: VecDeque<Item> = [item("a", 1)].into_iter().collect();
        let answered = runs_of(&["a"]);
        assert_eq!(runs(&take_batch(&mut waiting, &answered)), ["a"]);
    }

    #[test]
    fn the_writer_waits_before_a_commit_only_while_many_runs_share_them() {
        let shared = Arc::new(Shared::new(Duration::from_millis(1)));
        let delay = &shared.delay;
        let mut pace = Pace::new(shared.clone());
        let items: Vec<Item> = (0..30).map(|i| item(&format!("r{i}"), 2)).collect();
        let appends: Vec<&Append> = items.iter().map(|(a, _)| a).collect();
        let ok: Result<(), ()> = Ok(());
        // One run, or two, at a time: never.
        for n in [1, 2, 1, 2, 2, 1, 2, 2, 2, 2, 2, 2] {
            pace.committed(&appends[..n], &ok);
            assert_eq!(pace.wait(1), None, "{}", pace.mean);
        }
        // Many: once the recent commits held four or more on average.
        let mut waited = 0;
        for _ in 0..20 {
            pace.committed(&appends, &ok);
            if pace.wait(1).is_some() {
                waited += 1;
                assert_eq!(pace.wait(1), Some(Duration::from_millis(1)));
                // Not when as many wait as commits have held of late: the writer is behind.
                assert_eq!(pace.wait(30), None);
            }
        }
        assert!(waited >= 15, "{waited}");
        // No delay set: never.
        delay.store(0, Ordering::Relaxed);
        assert_eq!(pace.wait(1), None);
        delay.store(1_000, Ordering::Relaxed);
        // And back to one run at a time: it stops waiting.
        for _ in 0..40 {
            pace.committed(&appends[..1], &ok);
        }
        assert_eq!(pace.wait(1), None, "{}", pace.mean);
        // The counts: 12 commits of 1 or 2 (21 appends), 20 of 30, 40 of 1; and a failure.
        pace.committed(&appends[..3], &Err::<(), ()>(()));
        let stats = Writer::stats_of(&shared);
        assert_eq!(stats.commits, 72);
        assert_eq!(stats.appends, 21 + 600 + 40);
        assert_eq!(stats.records, 2 * stats.appends);
        assert_eq!(stats.failures, 1);
    }

    #[test]
    fn the_writer_knows_a_runs_tail_while_one_holder_writes_it() {
        let append = |run: &str, holder: Option<&str>, count: usize| Append {
            holder: holder.map(str::to_string),
            ..item(run, count).0
        };
        let mut known = Known::default();
        let a = append("a", Some("h1"), 2);
        let at = |last, last_id| Looked {
            fenced: false,
            tail: Tail { last, last_id },
        };
        known.committed(&[&a], &[at(3, Some(7))], &[Some(9)]);
        assert_eq!(
            known.tail(&a),
            Some(Tail {
                last: 5,
                last_id: Some(9)
            })
        );
        // Another holder of the run does not know it.
        assert_eq!(known.tail(&append("a", Some("h2"), 1)), None);
        // Nor does an append that is not fenced (no holder).
        assert_eq!(known.tail(&append("a", None, 1)), None);
        // A release of the lease writes no row: the tail stays, and the run is forgotten.
        let mut release = append("a", Some("h1"), 0);
        release.release = true;
        known.committed(&[&release], &[at(5, Some(9))], &[None]);
        assert_eq!(known.tail(&a), None);
        // Fenced out, or in a failed batch: forgotten.
        known.committed(&[&a], &[at(0, None)], &[Some(1)]);
        assert!(known.tail(&a).is_some());
        let fenced = Looked {
            fenced: true,
            tail: Tail::default(),
        };
        known.committed(&[&a], &[fenced], &[None]);
        assert_eq!(known.tail(&a), None);
        known.committed(&[&a], &[at(0, None)], &[Some(1)]);
        known.forget(&[&a]);
        assert_eq!(known.tail(&a), None);

        // A fence holds, unread, until another connection writes the database.
        known.committed(&[&a], &[at(0, None)], &[Some(1)]);
        assert!(known.fence_holds(&a));
        assert!(!known.fence_holds(&append("a", Some("h2"), 1)));
        known.written_elsewhere();
        assert!(!known.fence_holds(&a), "read again once written elsewhere");
        assert!(known.tail(&a).is_some(), "the tail is still known");
        known.committed(&[&a], &[at(1, Some(1))], &[Some(2)]);
        assert!(known.fence_holds(&a), "read (and held) in this era");
    }
}
