//! SQLite: statements of one append each, of fixed text (so they stay prepared). The writer
//! thread runs them on its own connection ([`serve`]); the writer task of a `:memory:` store, on
//! the pool's ([`super::commit`]).

use super::{
    Append, Item, Known, Looked, Pace, Runs, StoreFailure, Tail, answer, fenced, now_ms, take_batch,
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

/// The statements that write a batch's appends, in order, each with the index of its append:
/// those of the appends that `looked` found fenced out are left out.
fn batch_writes<'s, 'a: 's>(
    appends: &'s [&'a Append],
    looked: &'s [Looked],
    now: i64,
) -> impl Iterator<Item = (usize, Statement<'a>)> + 's {
    appends
        .iter()
        .zip(looked)
        .enumerate()
        .filter(|(_, (_, l))| !l.fenced)
        .flat_map(move |(i, (a, l))| writes(a, l.tail, now).into_iter().map(move |w| (i, w)))
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
            // A known tail needs only the fence read; otherwise the tail is read with it.
            let tail = known.tail(a);
            let row = bind(if tail.is_some() { FENCE } else { LOOKUP }, params)
                .fetch_one(&mut *c)
                .await
                .map_err(failed)?;
            let fenced: i64 = sqlx::Row::try_get(&row, 0).map_err(failed)?;
            let tail = match tail {
                Some(tail) => tail,
                None => Tail {
                    last: sqlx::Row::try_get(&row, 1).map_err(failed)?,
                    last_id: sqlx::Row::try_get(&row, 2).map_err(failed)?,
                },
            };
            looked.push(Looked {
                fenced: fenced != 0,
                tail,
            });
        }
        let mut ids = vec![None; appends.len()];
        for (i, (stmt, params)) in batch_writes(appends, &looked, now) {
            let done = bind(stmt.sql(), resolved(params, ids[i]))
                .execute(&mut *c)
                .await
                .map_err(failed)?;
            if stmt == Stmt::Row {
                ids[i] = Some(done.last_insert_rowid());
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
        for (i, (stmt, params)) in batch_writes(appends, &looked, now) {
            run(stmt, resolved(params, ids[i]))?;
            if stmt == Stmt::Row {
                ids[i] = Some(c.last_insert_rowid());
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

/// The log's length, in bytes, below which closing the store leaves the log in place (see
/// [`LogCloser`]). The next process to open the store reads a log this long through once, in
/// well under a millisecond per MiB from the page cache.
pub(crate) const KEEP_LOG_BELOW: u64 = 1 << 20;

/// For [`crate::Store::close`]: a connection to the file opened before the store's other
/// connections close, and closed after them, so that what happens to the log (WAL) at the end
/// does not depend on which of the others happens to close last.
///
/// When the log is shorter than [`KEEP_LOG_BELOW`], it closes without copying the log into the
/// database (`SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`). The commits in the log are as durable there as
/// in the database file (the store's [`crate::Durability`] says how far), and every connection
/// reads them; what is saved is the checkpoint's syncs of the log and of the database at every
/// close, the removal of the log, and, at the next process's first commit, the creation of a new
/// log with the syncs of its header and of its directory: for a process that makes one run, most
/// of the store's cost on a busy disk.
///
/// A longer log is copied in and cut to nothing ([`LogCloser::finish`]), then removed by the
/// last connection to close (this one, or a pool connection that sqlx finishes closing a
/// moment after the pool's `close` returned), which bounds what the next process reads when it
/// opens the store. Without this, that late connection could find the log still whole and
/// leave it for the next process.
pub(crate) struct LogCloser {
    conn: rusqlite::Connection,
    keep: bool,
}

impl LogCloser {
    /// Opens it, or `None` when the file cannot be opened (then the last of the store's own
    /// connections to close copies the log in, as SQLite does by default).
    pub(crate) fn open(file: &File) -> Option<LogCloser> {
        use rusqlite::OpenFlags;
        use rusqlite::config::DbConfig;
        let mut log = file.path.clone().into_os_string();
        log.push("-wal");
        let keep = std::fs::metadata(&log).ok()?.len() < KEEP_LOG_BELOW;
        let conn = rusqlite::Connection::open_with_flags(
            &file.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .ok()?;
        if keep {
            conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
                .ok()?;
        }
        // A read opens the log and takes the shared lock that a closing connection checks for
        // before it checkpoints (it does only when it is the last).
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))
            .ok()?;
        Some(LogCloser { conn, keep })
    }

    /// Once the store's other connections are closed: a long log is copied into the database
    /// and cut to nothing, then this connection closes, the last, and removes it; a short one
    /// is left as it is. Such a checkpoint holds back other processes' commits while it waits
    /// for their readers to leave the log, so it waits briefly (long enough for the store's own
    /// connections still closing); when another process keeps reading, the log is left to the
    /// last connection to close, as SQLite does by default.
    pub(crate) fn finish(self) {
        if !self.keep {
            let _ = self
                .conn
                .busy_timeout(std::time::Duration::from_millis(250));
            if let Err(e) = self
                .conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            {
                tracing::debug!("copying the run log into the database at close failed: {e}");
            }
        }
        drop(self.conn);
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

/// Checkpoints of a SQLite log (WAL). A connection checkpoints on its own only once the log
/// passes [`WAL_AUTOCHECKPOINT`] pages (SQLite's `wal_autocheckpoint`, a safety net that bounds
/// the log; at SQLite's default of 1,000 it would stall every thousandth page's commit, and with
/// `synchronous=FULL` sync the database file in it). Instead the writer asks a thread of its own
/// for a passive checkpoint every [`CHECKPOINT_EVERY`] bytes of records or
/// [`CHECKPOINT_COMMITS`] commits, whichever comes first (a commit writes at least
/// a few pages, whatever its records' size), so the log is copied into the database while
/// commits go on (a long log makes every read of a page dearer), and the safety net
/// finds little left to copy when it fires; and once it has been idle for [`IDLE_CHECKPOINT`],
/// so the end of a burst of writes is not left in the log. (Not after the first commit: a
/// short-lived process, such as one `toolloop run`, would pay a connection and two syncs for
/// it, and the log it leaves is kept or copied when the store closes: see [`LogCloser`].) A
/// checkpoint copies each page the
/// log holds once, however many commits wrote it: the pages that every commit writes (the
/// runs' tails, the log's last pages) are copied once per checkpoint, so checkpoints a few
/// megabytes apart cost little more than the records themselves.
struct Checkpoints {
    file: File,
    /// Bytes of records committed since the last checkpoint was asked for.
    since: usize,
    /// Commits since then.
    commits: usize,
    /// The checkpoint thread (started with the first checkpoint): at most one checkpoint waits
    /// while another runs.
    thread: Option<(std::sync::mpsc::SyncSender<()>, std::thread::JoinHandle<()>)>,
}

/// Stops the checkpoint thread and waits for it (its connection closed).
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
const IDLE_CHECKPOINT: std::time::Duration = std::time::Duration::from_secs(1);
/// Bytes of records between two background checkpoints (at most).
const CHECKPOINT_EVERY: usize = 4 << 20;
/// Commits between two background checkpoints (at most).
const CHECKPOINT_COMMITS: usize = 500;
/// The log's length (in pages) past which the connection that commits checkpoints it, after
/// its commit; the next commit then starts the log over (cut back to `journal_size_limit`).
pub(crate) const WAL_AUTOCHECKPOINT: u32 = 16_384;

impl Checkpoints {
    fn new(file: File) -> Self {
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
        if self.since >= CHECKPOINT_EVERY || self.commits >= CHECKPOINT_COMMITS {
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
                .spawn(move || checkpoint(file, rx))
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
