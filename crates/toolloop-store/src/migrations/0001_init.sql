-- toolloop store, version 1. Portable SQL: the same text runs on SQLite and PostgreSQL.
-- Times are Unix milliseconds; JSON is kept as text.

-- One row per logged run.
CREATE TABLE IF NOT EXISTS toolloop_runs (
    run_id      TEXT PRIMARY KEY,
    session     TEXT,
    meta        TEXT,
    records     BIGINT NOT NULL DEFAULT 0,
    finished    BOOLEAN NOT NULL DEFAULT FALSE,
    stop_reason TEXT,
    created_ms  BIGINT NOT NULL,
    updated_ms  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS toolloop_runs_by_session ON toolloop_runs (session, created_ms);

-- The run log: every step of a run, in order.
CREATE TABLE IF NOT EXISTS toolloop_records (
    run_id     TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    body       TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- Who is driving a run: a holder, its process, and a heartbeat-renewed expiry.
CREATE TABLE IF NOT EXISTS toolloop_leases (
    run_id     TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        BIGINT NOT NULL,
    pid_start  TEXT NOT NULL,
    expires_ms BIGINT NOT NULL
);

-- Named conversations: the transcript saved after each run.
CREATE TABLE IF NOT EXISTS toolloop_sessions (
    name          TEXT PRIMARY KEY,
    messages      TEXT NOT NULL,
    message_count BIGINT NOT NULL,
    created_ms    BIGINT NOT NULL,
    updated_ms    BIGINT NOT NULL
);
