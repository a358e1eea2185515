//! Every SQL statement of the store, in one place, but the run log's writes (see the `writer`
//! module). The same text runs on SQLite and PostgreSQL:
//! `$n` parameters, `ON CONFLICT`, `BIGINT` milliseconds, JSON as `TEXT`.

use sqlx::migrate::{Migration, MigrationSource, MigrationType};
use std::borrow::Cow;

/// The migrations, embedded in the binary. Their text is the same on both databases but for
/// what only PostgreSQL has (collations, a table's fill factor).
#[derive(Debug)]
pub(super) struct Migrations {
    /// Whether they are PostgreSQL's.
    pub postgres: bool,
}

impl MigrationSource<'static> for Migrations {
    fn resolve(
        self,
    ) -> futures::future::BoxFuture<'static, Result<Vec<Migration>, sqlx::error::BoxDynError>> {
        let (room, batch, log) = if self.postgres {
            (
                include_str!("migrations/0004_run_keys.postgres.sql"),
                include_str!("migrations/0005_append_batch.postgres.sql"),
                include_str!("migrations/0006_run_log.postgres.sql"),
            )
        } else {
            (
                include_str!("migrations/0004_run_keys.sqlite.sql"),
                include_str!("migrations/0005_append_batch.sqlite.sql"),
                include_str!("migrations/0006_run_log.sqlite.sql"),
            )
        };
        Box::pin(async move {
            Ok(vec![
                Migration::new(
                    1,
                    Cow::Borrowed("toolloop runs, records, leases and sessions"),
                    MigrationType::Simple,
                    Cow::Borrowed(include_str!("migrations/0001_init.sql")),
                    false,
                ),
                Migration::new(
                    2,
                    Cow::Borrowed("session revisions"),
                    MigrationType::Simple,
                    Cow::Borrowed(include_str!("migrations/0002_session_revisions.sql")),
                    false,
                ),
                Migration::new(
                    3,
                    Cow::Borrowed("workflow runs"),
                    MigrationType::Simple,
                    Cow::Borrowed(include_str!("migrations/0003_workflows.sql")),
                    false,
                ),
                Migration::new(
                    4,
                    Cow::Borrowed("cheaper run-log writes on PostgreSQL"),
                    MigrationType::Simple,
                    Cow::Borrowed(room),
                    false,
                ),
                Migration::new(
                    5,
                    Cow::Borrowed("a batch of run-log appends in one call on PostgreSQL"),
                    MigrationType::Simple,
                    Cow::Borrowed(batch),
                    false,
                ),
                Migration::new(
                    6,
                    Cow::Borrowed("a run log written in order, each run's rows linked"),
                    MigrationType::Simple,
                    Cow::Borrowed(log),
                    false,
                ),
            ])
        })
    }
}

// ---- runs and records ----

/// A run's rows, in order (`$1` run id): its sequence number and body. First those written
/// before the run log was `toolloop_log` (keyed by run and number), then those of
/// `toolloop_log`, found by following each row's link to the run's previous one from the run's
/// last row (its tail while it goes on, else the one its run row names). A link is followed only
/// to an earlier row of the same run, so a damaged link ends the chain (and the gap it leaves is
/// found by the reader) rather than wandering into another run's rows.
pub(super) const LOAD_ROWS: &str = "WITH RECURSIVE chain(id, seq, prev, body) AS (
    SELECT l.id, l.seq, l.prev, l.body FROM toolloop_log l
    WHERE l.run_id = $1 AND l.id = COALESCE(
        (SELECT t.last_id FROM toolloop_log_tails t WHERE t.run_id = $1),
        (SELECT r.last_id FROM toolloop_runs r WHERE r.run_id = $1))
    UNION ALL
    SELECT l.id, l.seq, l.prev, l.body FROM toolloop_log l JOIN chain c ON l.id = c.prev
    WHERE l.run_id = $1 AND l.id < c.id
)
SELECT seq, body FROM toolloop_records WHERE run_id = $1
UNION ALL
SELECT seq, body FROM chain
ORDER BY seq";

/// `$1` run id, `$2` stop reason, `$3` now.
pub(super) const SET_STOP_REASON: &str =
    "UPDATE toolloop_runs SET stop_reason = $2, updated_ms = $3 WHERE run_id = $1";

/// A run's summary. A run that goes on counts its records, and dates its last write, by its
/// tail (its run row is written when it starts and when it ends).
const RUN_COLUMNS: &str = "SELECT r.run_id, r.session, r.session_revision, \
     COALESCE(t.last_seq, r.records) AS records, r.finished, r.stop_reason, r.created_ms, \
     COALESCE((SELECT g.created_ms FROM toolloop_log g WHERE g.id = t.last_id), r.updated_ms) \
     AS updated_ms, r.updated_ms AS row_updated_ms, l.holder, l.host, l.pid, l.pid_start, \
     l.expires_ms \
     FROM toolloop_runs r LEFT JOIN toolloop_leases l ON l.run_id = r.run_id \
     LEFT JOIN toolloop_log_tails t ON t.run_id = r.run_id";

/// `$1` session, or NULL for every run.
pub(super) fn list_runs() -> String {
    format!("{RUN_COLUMNS} WHERE ($1 IS NULL OR r.session = $1) ORDER BY r.created_ms, r.run_id")
}

/// `$1` run id.
pub(super) fn one_run() -> String {
    format!("{RUN_COLUMNS} WHERE r.run_id = $1")
}

/// `$1` run id.
pub(super) const RUN_META: &str =
    "SELECT session, meta, session_revision, stop_reason FROM toolloop_runs WHERE run_id = $1";

// ---- leases ----

/// `$1` run id, `$2` holder, `$3` host, `$4` pid, `$5` pid start, `$6` expiry.
pub(super) const INSERT_LEASE: &str = "INSERT INTO toolloop_leases \
     (run_id, holder, host, pid, pid_start, expires_ms) VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (run_id) DO NOTHING";

/// `$1` run id.
pub(super) const SELECT_LEASE: &str =
    "SELECT holder, host, pid, pid_start, expires_ms FROM toolloop_leases WHERE run_id = $1";

/// Takes a lease over, only if it is still the one that was read (`$7` holder, `$8` expiry):
/// of two processes racing for a dead holder's run, one wins.
pub(super) const TAKE_OVER_LEASE: &str = "UPDATE toolloop_leases \
     SET holder = $2, host = $3, pid = $4, pid_start = $5, expires_ms = $6 \
     WHERE run_id = $1 AND holder = $7 AND expires_ms = $8";

/// `$1` run id, `$2` holder, `$3` new expiry.
pub(super) const RENEW_LEASE: &str =
    "UPDATE toolloop_leases SET expires_ms = $3 WHERE run_id = $1 AND holder = $2";

/// A row when run `$1` has a record or a lease (a run id is unused otherwise).
pub(super) const RUN_SEEN: &str = "SELECT run_id FROM toolloop_runs WHERE run_id = $1 \
     UNION ALL SELECT run_id FROM toolloop_leases WHERE run_id = $1 LIMIT 1";

// ---- sessions ----

/// `$1` name, `$2` messages, `$3` count, `$4` now. Each save is a new revision.
pub(super) const SAVE_SESSION: &str = "INSERT INTO toolloop_sessions \
     (name, messages, message_count, created_ms, updated_ms, revision) \
     VALUES ($1, $2, $3, $4, $4, 1) \
     ON CONFLICT (name) DO UPDATE SET messages = excluded.messages, \
     message_count = excluded.message_count, updated_ms = excluded.updated_ms, \
     revision = toolloop_sessions.revision + 1";

/// Like [`SAVE_SESSION`] on an existing session, only while it is still at revision `$5`.
pub(super) const SAVE_SESSION_AT: &str = "UPDATE toolloop_sessions \
     SET messages = $2, message_count = $3, updated_ms = $4, revision = revision + 1 \
     WHERE name = $1 AND revision = $5";

/// `$1` name.
pub(super) const SESSION_REVISION: &str = "SELECT revision FROM toolloop_sessions WHERE name = $1";

const SESSION_COLUMNS: &str = "SELECT s.name, s.message_count, s.revision, s.created_ms, \
     s.updated_ms, \
     (SELECT COUNT(*) FROM toolloop_runs r WHERE r.session = s.name) AS runs \
     FROM toolloop_sessions s";

/// Every session, most recently updated first.
pub(super) fn list_sessions() -> String {
    format!("{SESSION_COLUMNS} ORDER BY s.updated_ms DESC, s.name")
}

/// `$1` name.
pub(super) fn one_session() -> String {
    format!("{SESSION_COLUMNS} WHERE s.name = $1")
}

/// `$1` name.
pub(super) const SESSION_MESSAGES: &str =
    "SELECT messages, revision FROM toolloop_sessions WHERE name = $1";

/// `$1` name: the session's run log (the rows of `toolloop_log`, found by following each
/// run's links from its last row, as [`LOAD_ROWS`] does, then the tails, then the rows written
/// before `toolloop_log`), leases, runs, then the session.
pub(super) const DELETE_SESSION: [&str; 6] = [
    "WITH RECURSIVE chain(id, prev, run_id) AS (
    SELECT l.id, l.prev, l.run_id FROM toolloop_runs r JOIN toolloop_log l
        ON l.run_id = r.run_id AND l.id = COALESCE(
            (SELECT t.last_id FROM toolloop_log_tails t WHERE t.run_id = r.run_id), r.last_id)
    WHERE r.session = $1
    UNION ALL
    SELECT l.id, l.prev, l.run_id FROM toolloop_log l JOIN chain c ON l.id = c.prev
    WHERE l.run_id = c.run_id AND l.id < c.id
)
DELETE FROM toolloop_log WHERE id IN (SELECT id FROM chain)",
    "DELETE FROM toolloop_log_tails WHERE run_id IN \
     (SELECT run_id FROM toolloop_runs WHERE session = $1)",
    "DELETE FROM toolloop_records WHERE run_id IN \
     (SELECT run_id FROM toolloop_runs WHERE session = $1)",
    "DELETE FROM toolloop_leases WHERE run_id IN \
     (SELECT run_id FROM toolloop_runs WHERE session = $1)",
    "DELETE FROM toolloop_runs WHERE session = $1",
    "DELETE FROM toolloop_sessions WHERE name = $1",
];

// ---- workflow runs ----

/// `$1` id, `$2` name, `$3` status, `$4` body, `$5` now.
pub(super) const SAVE_WORKFLOW: &str = "INSERT INTO toolloop_workflows \
     (workflow_id, name, status, body, created_ms, updated_ms) VALUES ($1, $2, $3, $4, $5, $5) \
     ON CONFLICT (workflow_id) DO UPDATE SET name = excluded.name, status = excluded.status, \
     body = excluded.body, updated_ms = excluded.updated_ms";

/// `$1` id.
pub(super) const LOAD_WORKFLOW: &str = "SELECT body FROM toolloop_workflows WHERE workflow_id = $1";

/// Every workflow run, oldest first.
pub(super) const LIST_WORKFLOWS: &str = "SELECT workflow_id, name, status, created_ms, \
     updated_ms FROM toolloop_workflows ORDER BY created_ms, workflow_id";
