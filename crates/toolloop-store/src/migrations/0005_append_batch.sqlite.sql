-- toolloop store, version 5 (SQLite): nothing to change. On PostgreSQL, a function writes a batch
-- of run-log appends in one round trip; SQLite runs in the process, where a round trip costs
-- nothing.
SELECT 1;
