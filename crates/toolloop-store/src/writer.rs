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
//! A transaction is a handful of statements whatever the batch's size: the runs' fence check
//! (one query), the new runs and their sessions, every record (one multi-row insert, each
//! record's sequence number computed from its run's last), and the runs' counters. On SQLite
//! the whole transaction is one round trip to the connection's worker thread (`BEGIN IMMEDIATE;
//! …; COMMIT` in one query); on PostgreSQL the statements go one by one in a transaction, the
//! fence holding the runs' lease rows (`FOR SHARE`) until the commit, so a takeover waits for
//! it. The writer keeps one connection of the pool while the store lives (for `:memory:`, whose
//! only connection is shared, it takes it per transaction).

use crate::Pool;
use std::collections::{HashSet, VecDeque};
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
    loop {
        if waiting.is_empty() {
            match queue.recv().await {
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

/// Whether the holder `holder` (an expression, NULL: not fenced) holds run `run`'s lease; on
/// PostgreSQL the lease row is locked (`FOR SHARE`) until the commit, so it cannot change
/// hands under the transaction (SQLite's `BEGIN IMMEDIATE` already holds the only write lock).
fn fence(run: &str, holder: &str, pg: bool) -> String {
    let lock = if pg { " FOR SHARE" } else { "" };
    format!(
        "({holder} IS NULL OR EXISTS (SELECT 1 FROM toolloop_leases l \
         WHERE l.run_id = {run} AND l.holder = {holder}{lock}))"
    )
}

/// A statement of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Returns the runs that are fenced out.
    Fence,
    Sessions,
    NewRuns,
    Records,
    OldRuns,
}

/// The statements of one transaction (one [`Sql`] for all on SQLite, which sends them as one
/// query; one each on PostgreSQL).
struct Plan<'a> {
    appends: &'a [&'a Append],
    now: i64,
    pg: bool,
}

impl<'a> Plan<'a> {
    /// Whether any append is fenced (then the first statement is the fence check).
    fn has_fence(&self) -> bool {
        self.appends.iter().any(|a| a.holder.is_some())
    }

    /// `SELECT` of the runs whose holder does not hold their lease.
    fn fence_check(&self, s: &mut Sql<'a>) {
        let mut rows = Vec::new();
        for a in self.appends.iter().filter(|a| a.holder.is_some()) {
            let run = s.arg(Arg::Text(&a.run_id));
            let holder = s.arg(Arg::MaybeText(a.holder.as_deref()));
            rows.push(format!("({run}, {holder})"));
        }
        let lock = if self.pg { " FOR SHARE" } else { "" };
        s.text.push_str(&format!(
            "SELECT v.column1 FROM (VALUES {}) AS v WHERE NOT EXISTS (SELECT 1 FROM \
             toolloop_leases l WHERE l.run_id = v.column1 AND l.holder = v.column2{lock})",
            rows.join(", ")
        ));
    }

    fn starts(&self) -> impl Iterator<Item = (&'a Append, &'a Start)> + 'a {
        self.appends
            .iter()
            .filter_map(|a| a.start.as_ref().map(|s| (*a, s)))
    }

    fn has_sessions(&self) -> bool {
        self.starts().any(|(_, s)| s.session.is_some())
    }

    /// Creates the sessions of the runs that start (when missing).
    fn sessions(&self, s: &mut Sql<'a>) {
        let now = s.arg(Arg::Int(self.now));
        let mut rows = Vec::new();
        for (a, start) in self.starts() {
            let Some(session) = &start.session else {
                continue;
            };
            let name = s.arg(Arg::Text(session));
            let run = s.arg(Arg::Text(&a.run_id));
            let holder = s.arg(Arg::MaybeText(a.holder.as_deref()));
            rows.push(format!("({name}, {run}, {holder})"));
        }
        s.text.push_str(&format!(
            "INSERT INTO toolloop_sessions (name, messages, message_count, created_ms, updated_ms) \
             SELECT v.column1, '[]', 0, {now}, {now} FROM (VALUES {}) AS v WHERE {} \
             ON CONFLICT (name) DO NOTHING",
            rows.join(", "),
            fence("v.column2", "v.column3", self.pg)
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
            let holder = s.arg(Arg::MaybeText(a.holder.as_deref()));
            rows.push(format!(
                "({run}, {session}, {meta}, {count}, {finished}, {revision}, {holder})"
            ));
        }
        s.text.push_str(&format!(
            "INSERT INTO toolloop_runs \
             (run_id, session, meta, records, finished, created_ms, updated_ms, session_revision) \
             SELECT v.column1, v.column2, v.column3, v.column4, v.column5, {now}, {now}, \
             COALESCE(v.column6, (SELECT s.revision FROM toolloop_sessions s \
             WHERE s.name = v.column2)) \
             FROM (VALUES {}) AS v WHERE {} \
             ON CONFLICT (run_id) DO UPDATE SET records = toolloop_runs.records + excluded.records, \
             updated_ms = excluded.updated_ms, \
             finished = (toolloop_runs.finished OR excluded.finished)",
            rows.join(", "),
            fence("v.column1", "v.column7", self.pg)
        ));
    }

    /// Every record, numbered after its run's last.
    fn records(&self, s: &mut Sql<'a>) {
        let now = s.arg(Arg::Int(self.now));
        let mut rows = Vec::new();
        for a in self.appends {
            let run = s.arg(Arg::Text(&a.run_id));
            let holder = s.arg(Arg::MaybeText(a.holder.as_deref()));
            for (i, (kind, body)) in a.records.iter().enumerate() {
                let kind = s.arg(Arg::Text(kind));
                let body = s.arg(Arg::Text(body));
                rows.push(format!("({run}, {}, {kind}, {body}, {holder})", i + 1));
            }
        }
        // The sequence numbers come from each run's last record before this statement (both
        // databases evaluate the SELECT before inserting its rows).
        s.text.push_str(&format!(
            "INSERT INTO toolloop_records (run_id, seq, kind, body, created_ms) \
             SELECT v.column1, COALESCE((SELECT MAX(r.seq) FROM toolloop_records r \
             WHERE r.run_id = v.column1), 0) + v.column2, v.column3, v.column4, {now} \
             FROM (VALUES {}) AS v WHERE {}",
            rows.join(", "),
            fence("v.column1", "v.column5", self.pg)
        ));
    }

    fn has_old_runs(&self) -> bool {
        self.appends.iter().any(|a| a.start.is_none())
    }

    /// Counts the records of the runs that go on, and marks the finished ones.
    fn old_runs(&self, s: &mut Sql<'a>) {
        let now = s.arg(Arg::Int(self.now));
        let mut rows = Vec::new();
        for a in self.appends.iter().filter(|a| a.start.is_none()) {
            let run = s.arg(Arg::Text(&a.run_id));
            let count = s.arg(Arg::Int(a.records.len() as i64));
            let finished = s.arg(Arg::Bool(a.finished));
            let holder = s.arg(Arg::MaybeText(a.holder.as_deref()));
            rows.push(format!("({run}, {count}, {finished}, {holder})"));
        }
        s.text.push_str(&format!(
            "UPDATE toolloop_runs SET records = toolloop_runs.records + v.column2, \
             updated_ms = {now}, finished = (toolloop_runs.finished OR v.column3) \
             FROM (VALUES {}) AS v WHERE toolloop_runs.run_id = v.column1 AND {}",
            rows.join(", "),
            fence("v.column1", "v.column4", self.pg)
        ));
    }

    /// The transaction's statements, in order.
    fn parts(&self) -> Vec<Part> {
        let mut parts = Vec::new();
        if self.has_fence() {
            parts.push(Part::Fence);
        }
        if self.has_sessions() {
            parts.push(Part::Sessions);
        }
        if self.starts().next().is_some() {
            parts.push(Part::NewRuns);
        }
        parts.push(Part::Records);
        if self.has_old_runs() {
            parts.push(Part::OldRuns);
        }
        parts
    }

    /// Writes statement `part` onto `s`.
    fn build(&self, part: Part, s: &mut Sql<'a>) {
        match part {
            Part::Fence => self.fence_check(s),
            Part::Sessions => self.sessions(s),
            Part::NewRuns => self.new_runs(s),
            Part::Records => self.records(s),
            Part::OldRuns => self.old_runs(s),
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
    let now = now_ms();
    match conn {
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(c) => {
            let plan = Plan {
                appends,
                now,
                pg: false,
            };
            let mut sql = Sql::default();
            sql.text.push_str("BEGIN IMMEDIATE");
            for part in plan.parts() {
                sql.text.push_str(";\n");
                plan.build(part, &mut sql);
            }
            sql.text.push_str(";\nCOMMIT");
            let sql = sql.anonymous();
            let ran = bound!(sql, sqlx::Sqlite)
                .persistent(plan.recurs())
                .fetch_all(&mut **c)
                .await;
            match ran {
                Ok(rows) => fenced_runs(&rows),
                Err(e) => {
                    // The transaction may be open (a statement failed before the commit).
                    let _ = sqlx::query("ROLLBACK").execute(&mut **c).await;
                    Err(e)
                }
            }
        }
        #[cfg(feature = "postgres")]
        Conn::Postgres(c) => {
            let plan = Plan {
                appends,
                now,
                pg: true,
            };
            let statements: Vec<(Part, Sql<'_>)> = plan
                .parts()
                .into_iter()
                .map(|part| {
                    let mut sql = Sql::default();
                    plan.build(part, &mut sql);
                    (part, sql)
                })
                .collect();
            let recurs = plan.recurs();
            let mut tx = sqlx::Connection::begin(&mut **c).await?;
            let mut fenced = HashSet::new();
            for (part, sql) in &statements {
                let q = bound!(sql, sqlx::Postgres).persistent(recurs);
                if *part == Part::Fence {
                    let rows = q.fetch_all(&mut *tx).await?;
                    fenced = fenced_runs(&rows)?;
                } else {
                    q.execute(&mut *tx).await?;
                }
            }
            tx.commit().await?;
            Ok(fenced)
        }
    }
}

fn fenced_runs<R: sqlx::Row>(rows: &[R]) -> Result<HashSet<String>, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    rows.iter()
        .map(|r| r.try_get::<String, _>(0usize))
        .collect()
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
