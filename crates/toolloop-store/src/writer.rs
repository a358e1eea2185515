//! The group writer: one task per store commits the appends of every run, as many as are
//! waiting, in one transaction (group commit).
//!
//! An append (one run's records of one step) is queued with a channel to answer on. The task
//! takes every append waiting when it is free (at most one per run, in the order they came, so
//! a run's records stay in order; a second append of a run waits for the next transaction) and
//! commits them together, then answers each: committed, fenced out (the run's lease is held by
//! someone else: nothing of that run was written, the others were), or failed (the transaction
//! failed: nothing of the batch was written, and every append of it fails). While a transaction
//! is under way the next appends gather, so the busier the store, the more runs share a commit.
//!
//! A transaction is two round trips whatever the batch's size. The first takes the leases of
//! the runs that start with it (their lease is written with their first records, not on its
//! own) and reads every run's fence (does the append's holder hold the run's lease?) and last
//! sequence number. The second writes the runs that are not fenced out: the new runs and their
//! sessions, every record (one multi-row insert, each with its sequence number), the
//! runs' counters, the leases given back, and the commit. On SQLite a round trip is one query
//! to the connection's worker thread (`BEGIN IMMEDIATE` holds the write lock from the first);
//! on PostgreSQL the statements go one by one in a transaction, the lookup holding the runs'
//! lease rows (`FOR SHARE`) until the commit, so a takeover waits for it. The writer keeps one
//! connection of the pool while the store lives (for `:memory:`, whose only connection is
//! shared, it takes it per transaction).

use crate::Pool;
use std::collections::{HashMap, HashSet, VecDeque};
use tokio::sync::{mpsc, oneshot};
use toolloop::journal::StoreFailure;

/// The most records in one transaction (with [`MAX_RUNS`], bounds a transaction's bind
/// parameters: two per record and at most 18 per run, under SQLite's 32,766 and PostgreSQL's
/// 65,535). A larger append is split by the caller.
pub(crate) const MAX_RECORDS: usize = 2_000;
/// The most runs in one transaction.
const MAX_RUNS: usize = 500;

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
    /// Each record's kind and JSON body, in order.
    pub records: Vec<(&'static str, String)>,
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

/// The handle of a store's writer task (started on first use, and again if its runtime went).
pub(crate) struct Writer {
    pool: Pool,
    /// One pooled connection that every use shares (`:memory:`): taken per transaction.
    shared: bool,
    queue: std::sync::Mutex<Option<mpsc::UnboundedSender<Item>>>,
}

impl Writer {
    pub(crate) fn new(pool: Pool, shared: bool) -> Self {
        Writer {
            pool,
            shared,
            queue: std::sync::Mutex::new(None),
        }
    }

    /// Whether every use shares one connection.
    pub(crate) fn shared(&self) -> bool {
        self.shared
    }

    /// Queues an append and waits until its transaction is over.
    pub(crate) async fn write(&self, append: Append) -> Written {
        let (done, answer) = oneshot::channel();
        self.send((append, done));
        answer
            .await
            .unwrap_or_else(|_| Written::Failed("the store's writer stopped".into()))
    }

    fn send(&self, item: Item) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let item = match queue.as_ref() {
            Some(tx) => match tx.send(item) {
                Ok(()) => return,
                // The task is gone (its runtime ended): start another.
                Err(mpsc::error::SendError(back)) => back,
            },
            None => item,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(self.pool.clone(), self.shared, rx));
        // The receiver is alive: it was just made.
        let _ = tx.send(item);
        *queue = Some(tx);
    }
}

/// A connection the writer holds.
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
    #[cfg(feature = "sqlite")]
    let mut checkpoints = match &pool {
        Pool::Sqlite(p) if !shared => Some(Checkpoints::new(p.clone())),
        _ => None,
    };
    loop {
        if waiting.is_empty() {
            #[cfg(feature = "sqlite")]
            let next = match checkpoints.as_mut() {
                // Idle with records not yet checkpointed: after a while, checkpoint them, so a
                // burst of writes does not leave its log behind.
                Some(c) if c.since > 0 => {
                    match tokio::time::timeout(IDLE_CHECKPOINT, queue.recv()).await {
                        Ok(next) => next,
                        Err(_) => {
                            c.idle();
                            continue;
                        }
                    }
                }
                _ => queue.recv().await,
            };
            #[cfg(not(feature = "sqlite"))]
            let next = queue.recv().await;
            match next {
                Some(item) => waiting.push_back(item),
                None => return,
            }
        }
        while let Ok(item) = queue.try_recv() {
            waiting.push_back(item);
        }
        let batch = take_batch(&mut waiting);
        let appends: Vec<&Append> = batch.iter().map(|(a, _)| a).collect();
        let result = commit(&pool, &mut conn, &appends).await;
        #[cfg(feature = "sqlite")]
        if result.is_ok()
            && let Some(checkpoints) = checkpoints.as_mut()
        {
            checkpoints.committed(appends.iter().map(|a| a.records.len()).sum());
        }
        if shared || result.is_err() {
            // Back to the pool (a connection whose transaction failed is checked there).
            conn = None;
        }
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
                let e = StoreFailure::new(e);
                for (_, done) in batch {
                    let _ = done.send(Written::Failed(e.clone()));
                }
            }
        }
    }
}

/// Checkpoints of a SQLite log (WAL). A connection checkpoints on its own only once the log
/// passes [`WAL_AUTOCHECKPOINT`] pages (SQLite's `wal_autocheckpoint`, a safety net that bounds
/// the log; at SQLite's default of 1,000 it would stall every thousandth page's commit, and with
/// `synchronous=FULL` sync the database file in it). Instead the writer starts a passive
/// checkpoint on another connection after its first commit and every [`CHECKPOINT_EVERY`]
/// records, so the log is copied into the database while commits go on, and the safety net
/// finds little left to copy when it fires; and once it has been idle for [`IDLE_CHECKPOINT`],
/// so the end of a burst of writes is not left in the log.
#[cfg(feature = "sqlite")]
struct Checkpoints {
    pool: sqlx::SqlitePool,
    /// Records committed since the last checkpoint started.
    since: usize,
    /// Whether any checkpoint started.
    started: bool,
    /// The checkpoint under way.
    running: Option<tokio::task::JoinHandle<()>>,
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
    fn new(pool: sqlx::SqlitePool) -> Self {
        Checkpoints {
            pool,
            since: 0,
            started: false,
            running: None,
        }
    }

    /// After a commit of `records` records.
    fn committed(&mut self, records: usize) {
        self.since += records;
        if self.running.as_ref().is_some_and(|r| r.is_finished()) {
            self.running = None;
        }
        if self.running.is_none() && (!self.started || self.since >= CHECKPOINT_EVERY) {
            self.start(None);
        }
    }

    /// The writer has been idle for [`IDLE_CHECKPOINT`] with records not checkpointed yet: a
    /// checkpoint of them starts (after the one under way, if any).
    fn idle(&mut self) {
        let before = self.running.take();
        self.start(before);
    }

    /// Starts a checkpoint, after `before` has ended.
    fn start(&mut self, before: Option<tokio::task::JoinHandle<()>>) {
        self.started = true;
        self.since = 0;
        let pool = self.pool.clone();
        self.running = Some(tokio::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            let Ok(mut c) = pool.acquire().await else {
                return;
            };
            // Copies what it can without waiting for anyone.
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&mut *c)
                .await
            {
                tracing::debug!("a checkpoint of the run log failed: {e}");
            }
        }));
    }
}

/// The next transaction's appends: the waiting ones in order, at most one per run (a run's
/// later append stays, in order, for the next), within the limits.
fn take_batch(waiting: &mut VecDeque<Item>) -> Vec<Item> {
    let mut batch = Vec::new();
    let mut runs: HashSet<String> = HashSet::new();
    let mut records = 0;
    let mut rest = VecDeque::new();
    while let Some(item) = waiting.pop_front() {
        let n = item.0.records.len();
        let fits = batch.is_empty() || (records + n <= MAX_RECORDS && batch.len() < MAX_RUNS);
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
        batch.push(item);
    }
    *waiting = rest;
    batch
}

/// A bind parameter.
#[derive(Clone, Copy)]
enum Arg<'a> {
    Text(&'a str),
    MaybeText(Option<&'a str>),
    Int(i64),
    MaybeInt(Option<i64>),
    Bool(bool),
}

/// Statement text and its parameters (`$1`, `$2`, … in the order pushed).
#[derive(Default)]
struct Sql<'a> {
    text: String,
    args: Vec<Arg<'a>>,
}

impl<'a> Sql<'a> {
    /// Adds a parameter; its placeholder.
    fn arg(&mut self, a: Arg<'a>) -> String {
        self.args.push(a);
        format!("${}", self.args.len())
    }

    /// The same statements with anonymous `?` placeholders, and the parameters repeated in the
    /// order their placeholders appear. SQLite takes `$1` for a parameter named "$1", and finds
    /// a named (or numbered) parameter by a linear scan at each use and at each bind, so a batch
    /// of thousands of them costs quadratic time in the parameters; anonymous ones are bound by
    /// position. (The statement text holds no `$` but its placeholders.)
    fn anonymous(&self) -> Sql<'a> {
        let mut text = String::with_capacity(self.text.len());
        let mut args = Vec::with_capacity(self.args.len() * 2);
        let mut rest = self.text.as_str();
        while let Some(i) = rest.find('$') {
            text.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            let arg = after[..digits]
                .parse::<usize>()
                .ok()
                .and_then(|k| self.args.get(k.checked_sub(1)?));
            match arg {
                Some(a) => {
                    args.push(*a);
                    text.push('?');
                }
                None => text.push_str(&rest[i..i + 1 + digits]),
            }
            rest = &after[digits..];
        }
        text.push_str(rest);
        Sql { text, args }
    }
}

/// Binds a [`Sql`]'s parameters to a query (one text for both drivers).
macro_rules! bound {
    ($sql:expr, $db:ty) => {{
        let mut q = sqlx::query::<$db>(&$sql.text);
        for a in &$sql.args {
            q = match a {
                Arg::Text(s) => q.bind(*s),
                Arg::MaybeText(s) => q.bind(*s),
                Arg::Int(i) => q.bind(*i),
                Arg::MaybeInt(i) => q.bind(*i),
                Arg::Bool(b) => q.bind(*b),
            };
        }
        q
    }};
}

/// A statement of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Sessions,
    NewRuns,
    Records,
    OldRuns,
    Releases,
}

/// One run's state at the start of a transaction, read under the transaction's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Looked {
    /// Whether the run's lease is someone else's (nothing of the run is written).
    fenced: bool,
    /// The run's last record's sequence number (0: none).
    last: i64,
}

/// A transaction in two round trips. The first takes the leases of the runs that start
/// ([`Append::take_lease`]) and reads, for every run of the batch, whether its holder holds its
/// lease and its last sequence number ([`Plan::lookup`]); the second writes the runs that are
/// not fenced out, numbering their records after the runs' last ([`Plan::build`]).
struct Plan<'a> {
    appends: &'a [&'a Append],
    /// What the lookup found, by position in `appends`.
    looked: Vec<Looked>,
    now: i64,
}

impl<'a> Plan<'a> {
    fn new(appends: &'a [&'a Append], now: i64) -> Self {
        Plan {
            appends,
            looked: Vec::new(),
            now,
        }
    }

    /// Takes the leases of the runs that start with this transaction: a lease already there
    /// (another holder's) is left alone, and the lookup then finds the run fenced.
    fn take_leases(&self, s: &mut Sql<'a>) -> bool {
        let me = crate::lease::me();
        let mut rows = Vec::new();
        for a in self.appends {
            if let (Some(expires), Some(holder)) = (a.take_lease, a.holder.as_deref()) {
                let run = s.arg(Arg::Text(&a.run_id));
                let holder = s.arg(Arg::Text(holder));
                let host = s.arg(Arg::Text(&me.host));
                let pid = s.arg(Arg::Int(me.pid));
                let start = s.arg(Arg::Text(&me.start));
                let expires = s.arg(Arg::Int(expires));
                rows.push(format!(
                    "({run}, {holder}, {host}, {pid}, {start}, {expires})"
                ));
            }
        }
        if rows.is_empty() {
            return false;
        }
        s.text.push_str(&format!(
            "INSERT INTO toolloop_leases (run_id, holder, host, pid, pid_start, expires_ms) \
             VALUES {} ON CONFLICT (run_id) DO NOTHING",
            rows.join(", ")
        ));
        true
    }

    /// `SELECT` of every run of the batch, in order: its id, 1 when its holder does not hold
    /// its lease (else 0), and its last sequence number. On PostgreSQL the lease rows read are
    /// locked (`FOR SHARE`) until the commit, so a lease cannot change hands under the
    /// transaction (SQLite's `BEGIN IMMEDIATE` already holds the only write lock).
    fn lookup(&self, s: &mut Sql<'a>, pg: bool) {
        let mut rows = Vec::new();
        for a in self.appends {
            let run = s.arg(Arg::Text(&a.run_id));
            let holder = s.arg(Arg::MaybeText(a.holder.as_deref()));
            rows.push(format!("({run}, {holder})"));
        }
        let lock = if pg { " FOR SHARE" } else { "" };
        s.text.push_str(&format!(
            "SELECT v.column1, CAST(CASE WHEN v.column2 IS NULL OR EXISTS (SELECT 1 FROM \
             toolloop_leases l WHERE l.run_id = v.column1 AND l.holder = v.column2{lock}) \
             THEN 0 ELSE 1 END AS BIGINT), CAST(COALESCE((SELECT MAX(r.seq) FROM \
             toolloop_records r WHERE r.run_id = v.column1), 0) AS BIGINT) \
             FROM (VALUES {}) AS v",
            rows.join(", ")
        ));
    }

    /// Takes the lookup's rows (one per append, in order).
    fn looked<R: sqlx::Row>(&mut self, rows: &[R]) -> Result<(), sqlx::Error>
    where
        usize: sqlx::ColumnIndex<R>,
        String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        let mut by_run = HashMap::with_capacity(rows.len());
        for r in rows {
            let run: String = r.try_get(0usize)?;
            let fenced: i64 = r.try_get(1usize)?;
            let last: i64 = r.try_get(2usize)?;
            by_run.insert(
                run,
                Looked {
                    fenced: fenced != 0,
                    last,
                },
            );
        }
        self.looked = self
            .appends
            .iter()
            .map(|a| {
                by_run.get(a.run_id.as_str()).cloned().ok_or_else(|| {
                    sqlx::Error::Protocol(format!("the lookup left out run {}", a.run_id))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// The runs fenced out.
    fn fenced(&self) -> HashSet<String> {
        self.appends
            .iter()
            .zip(&self.looked)
            .filter(|(_, l)| l.fenced)
            .map(|(a, _)| a.run_id.clone())
            .collect()
    }

    /// The appends that are written, with their runs' last sequence numbers.
    fn kept(&self) -> impl Iterator<Item = (&'a Append, i64)> + '_ {
        self.appends
            .iter()
            .zip(&self.looked)
            .filter(|(_, l)| !l.fenced)
            .map(|(a, l)| (*a, l.last))
    }

    fn starts(&self) -> impl Iterator<Item = (&'a Append, &'a Start)> + '_ {
        self.kept()
            .filter_map(|(a, _)| a.start.as_ref().map(|s| (a, s)))
    }

    /// Creates the sessions of the runs that start (when missing).
    fn sessions(&self, s: &mut Sql<'a>) {
        let now = s.arg(Arg::Int(self.now));
        let mut rows = Vec::new();
        for (_, start) in self.starts() {
            if let Some(session) = &start.session {
                let name = s.arg(Arg::Text(session));
                rows.push(format!("({name}, '[]', 0, {now}, {now})"));
            }
        }
        s.text.push_str(&format!(
            "INSERT INTO toolloop_sessions (name, messages, message_count, created_ms, updated_ms) \
             VALUES {} ON CONFLICT (name) DO NOTHING",
            rows.join(", ")
        ));
    }

    /// Records the runs that start, with their record counts.
    fn new_runs(&self, s: &mut Sql<'a>) {
        let now = s.arg(Arg::Int(self.now));
        let mut rows = Vec::new();
        for (a, start) in self.starts() {
            let run = s.arg(Arg::Text(&a.run_id));
            let session = s.arg(Arg::MaybeText(start.session.as_deref()));
            let meta = s.arg(Arg::MaybeText(start.meta.as_deref()));
            let count = s.arg(Arg::Int(a.records.len() as i64));
            let finished = s.arg(Arg::Bool(a.finished));
            let revision = s.arg(Arg::MaybeInt(start.session_revision));
            rows.push(format!(
                "({run}, {session}, {meta}, {count}, {finished}, {revision})"
            ));
        }
        // `WHERE TRUE`: SQLite reads `ON CONFLICT` after a bare `FROM` as a join's.
        s.text.push_str(&format!(
            "INSERT INTO toolloop_runs \
             (run_id, session, meta, records, finished, created_ms, updated_ms, session_revision) \
             SELECT v.column1, v.column2, v.column3, v.column4, v.column5, {now}, {now}, \
             COALESCE(v.column6, (SELECT s.revision FROM toolloop_sessions s \
             WHERE s.name = v.column2)) \
             FROM (VALUES {}) AS v WHERE TRUE \
             ON CONFLICT (run_id) DO UPDATE SET records = toolloop_runs.records + excluded.records, \
             updated_ms = excluded.updated_ms, \
             finished = (toolloop_runs.finished OR excluded.finished)",
            rows.join(", ")
        ));
    }

    /// Every record, numbered after its run's last.
    fn records(&self, s: &mut Sql<'a>) {
        let now = s.arg(Arg::Int(self.now));
        let mut rows = Vec::new();
        for (a, last) in self.kept() {
            if a.records.is_empty() {
                continue;
            }
            let run = s.arg(Arg::Text(&a.run_id));
            for (i, (kind, body)) in a.records.iter().enumerate() {
                // Bound, not written out: a statement's text then recurs, and stays prepared.
                let seq = s.arg(Arg::Int(last + 1 + i as i64));
                let kind = s.arg(Arg::Text(kind));
                let body = s.arg(Arg::Text(body));
                rows.push(format!("({run}, {seq}, {kind}, {body}, {now})"));
            }
        }
        s.text.push_str(&format!(
            "INSERT INTO toolloop_records (run_id, seq, kind, body, created_ms) VALUES {}",
            rows.join(", ")
        ));
    }

    /// Counts the records of the runs that go on, and marks the finished ones.
    fn old_runs(&self, s: &mut Sql<'a>) {
        let now = s.arg(Arg::Int(self.now));
        let mut rows = Vec::new();
        for (a, _) in self.kept().filter(|(a, _)| a.start.is_none()) {
            if a.records.is_empty() {
                continue;
            }
            let run = s.arg(Arg::Text(&a.run_id));
            let count = s.arg(Arg::Int(a.records.len() as i64));
            let finished = s.arg(Arg::Bool(a.finished));
            rows.push(format!("({run}, {count}, {finished})"));
        }
        s.text.push_str(&format!(
            "UPDATE toolloop_runs SET records = toolloop_runs.records + v.column2, \
             updated_ms = {now}, finished = (toolloop_runs.finished OR v.column3) \
             FROM (VALUES {}) AS v WHERE toolloop_runs.run_id = v.column1",
            rows.join(", ")
        ));
    }

    /// Ends the leases given back with this transaction.
    fn releases(&self, s: &mut Sql<'a>) {
        let mut rows = Vec::new();
        for (a, _) in self.kept().filter(|(a, _)| a.release) {
            if let Some(holder) = a.holder.as_deref() {
                let run = s.arg(Arg::Text(&a.run_id));
                let holder = s.arg(Arg::Text(holder));
                rows.push(format!("({run}, {holder})"));
            }
        }
        s.text.push_str(&format!(
            "DELETE FROM toolloop_leases WHERE (run_id, holder) IN (VALUES {})",
            rows.join(", ")
        ));
    }

    /// The second round trip's statements, in order (none when every run is fenced out).
    fn parts(&self) -> Vec<Part> {
        let mut parts = Vec::new();
        if self.starts().any(|(_, s)| s.session.is_some()) {
            parts.push(Part::Sessions);
        }
        if self.starts().next().is_some() {
            parts.push(Part::NewRuns);
        }
        if self.kept().any(|(a, _)| !a.records.is_empty()) {
            parts.push(Part::Records);
        }
        if self
            .kept()
            .any(|(a, _)| a.start.is_none() && !a.records.is_empty())
        {
            parts.push(Part::OldRuns);
        }
        if self.kept().any(|(a, _)| a.release && a.holder.is_some()) {
            parts.push(Part::Releases);
        }
        parts
    }

    /// Writes statement `part` onto `s`.
    fn build(&self, part: Part, s: &mut Sql<'a>) {
        match part {
            Part::Sessions => self.sessions(s),
            Part::NewRuns => self.new_runs(s),
            Part::Records => self.records(s),
            Part::OldRuns => self.old_runs(s),
            Part::Releases => self.releases(s),
        }
    }

    /// Whether the statements' text is worth keeping prepared (small batches, whose shapes
    /// recur; a large batch's text is rarely seen twice).
    fn recurs(&self) -> bool {
        self.appends.len() <= 2 && self.appends.iter().all(|a| a.records.len() <= 8)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Commits a batch; the runs that were fenced out.
async fn commit(
    pool: &Pool,
    conn: &mut Option<Conn>,
    appends: &[&Append],
) -> Result<HashSet<String>, sqlx::Error> {
    let conn = match conn {
        Some(c) => c,
        None => conn.insert(acquire(pool).await?),
    };
    let mut plan = Plan::new(appends, now_ms());
    let recurs = plan.recurs();
    match conn {
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(c) => {
            // One query per round trip: the connection's worker thread runs it whole.
            let mut first = Sql::default();
            first.text.push_str("BEGIN IMMEDIATE;\n");
            if plan.take_leases(&mut first) {
                first.text.push_str(";\n");
            }
            plan.lookup(&mut first, false);
            let first = first.anonymous();
            let ran = async {
                let rows = bound!(first, sqlx::Sqlite)
                    .persistent(recurs)
                    .fetch_all(&mut **c)
                    .await?;
                plan.looked(&rows)?;
                let mut second = Sql::default();
                for part in plan.parts() {
                    plan.build(part, &mut second);
                    second.text.push_str(";\n");
                }
                second.text.push_str("COMMIT");
                let second = second.anonymous();
                bound!(second, sqlx::Sqlite)
                    .persistent(recurs)
                    .execute(&mut **c)
                    .await
            }
            .await;
            match ran {
                Ok(_) => Ok(plan.fenced()),
                Err(e) => {
                    // The transaction may be open (a statement failed before the commit).
                    let _ = sqlx::query("ROLLBACK").execute(&mut **c).await;
                    Err(e)
                }
            }
        }
        #[cfg(feature = "postgres")]
        Conn::Postgres(c) => {
            let mut tx = sqlx::Connection::begin(&mut **c).await?;
            let mut leases = Sql::default();
            if plan.take_leases(&mut leases) {
                bound!(leases, sqlx::Postgres)
                    .persistent(recurs)
                    .execute(&mut *tx)
                    .await?;
            }
            let mut lookup = Sql::default();
            plan.lookup(&mut lookup, true);
            let rows = bound!(lookup, sqlx::Postgres)
                .persistent(recurs)
                .fetch_all(&mut *tx)
                .await?;
            plan.looked(&rows)?;
            for part in plan.parts() {
                let mut sql = Sql::default();
                plan.build(part, &mut sql);
                bound!(sql, sqlx::Postgres)
                    .persistent(recurs)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(plan.fenced())
        }
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
                records: vec![("finished", "{}".into()); n],
                start: None,
                finished: false,
                take_lease: None,
                release: false,
            },
            done,
        )
    }

    #[test]
    fn anonymous_placeholders_repeat_the_parameters_in_textual_order() {
        let mut sql = Sql::default();
        let a = sql.arg(Arg::Text("a"));
        let b = sql.arg(Arg::Int(2));
        let c = sql.arg(Arg::Bool(true));
        sql.text = format!("SELECT {b}, {a}; INSERT x VALUES ({a}, {c}, {b}) -- $ $99");
        let anon = sql.anonymous();
        assert_eq!(anon.text, "SELECT ?, ?; INSERT x VALUES (?, ?, ?) -- $ $99");
        let shown: Vec<String> = anon
            .args
            .iter()
            .map(|a| match a {
                Arg::Text(s) => (*s).to_string(),
                Arg::Int(i) => i.to_string(),
                Arg::Bool(b) => b.to_string(),
                _ => "?".into(),
            })
            .collect();
        assert_eq!(shown, ["2", "a", "a", "true", "2"]);
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
            waiting
                .iter()
                .map(|(a, _)| a.records.len())
                .collect::<Vec<_>>(),
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
    }
}
