-- toolloop store, version 4 (PostgreSQL): cheaper writes of the run log.
-- Run ids are compared byte by byte (collation "C"): they are ASCII, every index holds them, and a
-- byte comparison costs a fraction of a locale's (the same equality; the same order for run ids).
-- The indexes on them are rebuilt; the tables are not rewritten.
ALTER TABLE toolloop_runs ALTER COLUMN run_id TYPE TEXT COLLATE "C";
ALTER TABLE toolloop_records ALTER COLUMN run_id TYPE TEXT COLLATE "C";
ALTER TABLE toolloop_leases ALTER COLUMN run_id TYPE TEXT COLLATE "C";
-- A run's row is updated at every step it writes (its record count), so its pages keep room for
-- the new versions: an update that finds room on its page touches no index (a heap-only tuple),
-- and the page's dead versions are reclaimed in place. Pages written from now on are half filled.
ALTER TABLE toolloop_runs SET (fillfactor = 50);
