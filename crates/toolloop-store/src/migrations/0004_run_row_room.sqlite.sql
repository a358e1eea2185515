-- toolloop store, version 4 (SQLite): nothing to change. On PostgreSQL, a run's pages keep room
-- for the updates of its row (a fill factor), which SQLite, updating rows in place, does not need.
SELECT 1;
