-- toolloop store, version 2: sessions count their saves, and each run remembers the save it
-- started from, so that a run never overwrites turns saved after it began.
ALTER TABLE toolloop_sessions ADD COLUMN revision BIGINT NOT NULL DEFAULT 0;
ALTER TABLE toolloop_runs ADD COLUMN session_revision BIGINT;
