-- toolloop store, version 4 (SQLite): nothing to change. On PostgreSQL, run ids are compared byte
-- by byte (SQLite's default already) and a run's pages keep room for the updates of its row
-- (SQLite updates rows in place).
SELECT 1;
