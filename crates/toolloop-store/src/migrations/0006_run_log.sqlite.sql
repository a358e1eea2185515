-- toolloop store, version 6 (SQLite): a run log whose writes touch few pages.
-- Before, every step wrote a row of toolloop_records, keyed by (run_id, seq): each run's rows sit
-- in their own place of that key's index, and every step also rewrote its run's row of
-- toolloop_runs (its record count), so a commit of many runs' steps dirtied about two pages per
-- step. From this version:
-- - toolloop_log holds the rows in the order they are written (its key is that order), so the
--   rows of one commit share the last pages. Each row names its run and links to the run's
--   previous row (prev), and a run's rows are read by following those links from its last one.
-- - toolloop_log_tails holds, for each run that has rows here and has not ended, its last row
--   and last record's number: one narrow row per running run, so the tails of the runs of a
--   commit share a few pages. When the run ends, its last row goes to toolloop_runs (last_id)
--   with its record count, and its tail is removed.
-- toolloop_records keeps the rows written before this version; they are read first, and a run
-- continued from them goes on in toolloop_log.
CREATE TABLE IF NOT EXISTS toolloop_log (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    prev       BIGINT,
    kind       TEXT NOT NULL,
    body       TEXT NOT NULL,
    created_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS toolloop_log_tails (
    run_id   TEXT PRIMARY KEY,
    last_id  BIGINT NOT NULL,
    last_seq BIGINT NOT NULL
) WITHOUT ROWID;
ALTER TABLE toolloop_runs ADD COLUMN last_id BIGINT;
