-- toolloop store, version 6 (PostgreSQL): a run log whose writes touch few pages and few index
-- entries. Before, every step wrote a row of toolloop_records, keyed by (run_id, seq), and
-- rewrote its run's row of toolloop_runs (its record count). From this version:
-- - toolloop_log holds the rows in the order they are written (its key is that order). Each row
--   names its run and links to the run's previous row (prev), and a run's rows are read by
--   following those links from its last one.
-- - toolloop_log_tails holds, for each run that has rows here and has not ended, its last row
--   and last record's number: one narrow row per running run. When the run ends, its last row
--   goes to toolloop_runs (last_id) with its record count, and its tail is removed.
-- toolloop_records keeps the rows written before this version; they are read first, and a run
-- continued from them goes on in toolloop_log.
CREATE TABLE IF NOT EXISTS toolloop_log (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     TEXT COLLATE "C" NOT NULL,
    seq        BIGINT NOT NULL,
    prev       BIGINT,
    kind       TEXT NOT NULL,
    body       TEXT NOT NULL,
    created_ms BIGINT NOT NULL
);
-- A tail is updated at every step of its run: its pages keep room for the new versions (an
-- update that finds room on its page touches no index).
CREATE TABLE IF NOT EXISTS toolloop_log_tails (
    run_id   TEXT COLLATE "C" PRIMARY KEY,
    last_id  BIGINT NOT NULL,
    last_seq BIGINT NOT NULL
) WITH (fillfactor = 50);
ALTER TABLE toolloop_runs ADD COLUMN IF NOT EXISTS last_id BIGINT;

-- A batch of run-log appends in one call: the group writer commits every run's waiting step
-- together, and this function does all of a batch's statements in one round trip. A run has at
-- most one append in a batch. Arguments, one element per append in the batch's order: the runs
-- and their lease holders (NULL: not fenced); each append's record kinds, body (a JSON array of
-- its records, or one record) and record count; its run's last record's number and last row as
-- the caller knows them (NULL number: not known, looked up here; the caller knows them only
-- while its holder holds the run's lease). Then, for the few appends that take their run's
-- lease (the run's first write): their places in the batch (from 1) and the leases' expiries,
-- and the process taking them (host, pid, start); for those that start their run: their
-- places, and the runs' sessions, metadata and session revisions; for those that end their run:
-- their places; for those that give their run's lease back: their places. And now. What no
-- append of the batch does is skipped (a batch of steps that go on runs three statements).
-- Returns, per append in order: whether it was fenced out (its run's lease is someone else's:
-- nothing of that run was written), its run's last record's number before it, and the id of
-- the row it wrote (NULL: none).
DROP FUNCTION IF EXISTS toolloop_append_batch(TEXT[], TEXT[], BOOLEAN[], BIGINT[], TEXT, BIGINT,
    TEXT, TEXT[], TEXT[], BIGINT[], BOOLEAN[], BOOLEAN[], BOOLEAN[], TEXT[], TEXT[], BIGINT[],
    BIGINT);
CREATE OR REPLACE FUNCTION toolloop_append_batch(
    p_runs TEXT[], p_holders TEXT[], p_kinds TEXT[], p_bodies TEXT[], p_counts BIGINT[],
    p_known_seq BIGINT[], p_known_id BIGINT[],
    p_take_at INT[], p_expiries BIGINT[], p_host TEXT, p_pid BIGINT, p_pid_start TEXT,
    p_start_at INT[], p_sessions TEXT[], p_metas TEXT[], p_revisions BIGINT[],
    p_finish_at INT[], p_release_at INT[],
    p_now BIGINT,
    OUT o_fenced BOOLEAN[], OUT o_last BIGINT[], OUT o_ids BIGINT[]
) LANGUAGE plpgsql AS $$
DECLARE
    v_prev BIGINT[];
BEGIN
    -- The leases of the runs that start with this batch (a racer's is kept: it is fenced below).
    IF cardinality(p_take_at) > 0 THEN
        INSERT INTO toolloop_leases (run_id, holder, host, pid, pid_start, expires_ms)
        SELECT p_runs[t.i], p_holders[t.i], p_host, p_pid, p_pid_start, t.e
        FROM UNNEST(p_take_at, p_expiries) AS t(i, e)
        WHERE p_holders[t.i] IS NOT NULL
        ON CONFLICT (run_id) DO NOTHING;
    END IF;
    -- Each run's fence, last record's number and last row (looked up where the caller does not
    -- know them). The lease rows are held (FOR SHARE) until the commit, so a takeover waits for
    -- it; they are read in one pass, not probed per run.
    WITH u AS (
        SELECT * FROM UNNEST(p_runs, p_holders, p_known_seq, p_known_id)
            WITH ORDINALITY AS u(r, h, ks, ki, i)
    ), held AS (
        SELECT l.run_id FROM toolloop_leases l JOIN u ON l.run_id = u.r AND l.holder = u.h
        FOR SHARE OF l
    )
    SELECT
        array_agg(u.h IS NOT NULL AND u.r NOT IN (SELECT run_id FROM held) ORDER BY u.i),
        array_agg(CASE WHEN u.ks IS NOT NULL THEN u.ks ELSE COALESCE(
            (SELECT t.last_seq FROM toolloop_log_tails t WHERE t.run_id = u.r),
            GREATEST(
                COALESCE((SELECT r.records FROM toolloop_runs r WHERE r.run_id = u.r), 0),
                COALESCE((SELECT MAX(x.seq) FROM toolloop_records x WHERE x.run_id = u.r), 0)))
        END ORDER BY u.i),
        array_agg(CASE WHEN u.ks IS NOT NULL THEN u.ki ELSE COALESCE(
            (SELECT t.last_id FROM toolloop_log_tails t WHERE t.run_id = u.r),
            (SELECT r.last_id FROM toolloop_runs r WHERE r.run_id = u.r))
        END ORDER BY u.i)
    INTO o_fenced, o_last, v_prev
    FROM u;
    -- The runs that start, and their sessions.
    IF cardinality(p_start_at) > 0 THEN
        INSERT INTO toolloop_sessions (name, messages, message_count, created_ms, updated_ms)
        SELECT s.s, '[]', 0, p_now, p_now
        FROM UNNEST(p_start_at, p_sessions) AS s(i, s)
        WHERE s.s IS NOT NULL AND NOT o_fenced[s.i]
        ON CONFLICT (name) DO NOTHING;
        INSERT INTO toolloop_runs
            (run_id, session, meta, records, finished, created_ms, updated_ms, session_revision)
        SELECT p_runs[s.i], s.s, s.m, o_last[s.i] + p_counts[s.i], FALSE, p_now, p_now,
            COALESCE(s.v, (SELECT x.revision FROM toolloop_sessions x WHERE x.name = s.s))
        FROM UNNEST(p_start_at, p_sessions, p_metas, p_revisions) AS s(i, s, m, v)
        WHERE NOT o_fenced[s.i]
        ON CONFLICT (run_id) DO UPDATE SET records = excluded.records,
            updated_ms = excluded.updated_ms;
    END IF;
    -- Each append's row, linked to its run's previous one; the ids, per append.
    WITH ins AS (
        INSERT INTO toolloop_log (run_id, seq, prev, kind, body, created_ms)
        SELECT u.r, u.l + 1, u.p, u.k, u.b, p_now
        FROM UNNEST(p_runs, o_last, v_prev, p_kinds, p_bodies, p_counts, o_fenced)
            AS u(r, l, p, k, b, c, f)
        WHERE u.c > 0 AND NOT u.f
        RETURNING id, run_id
    )
    SELECT array_agg(ins.id ORDER BY u.i) INTO o_ids
    FROM UNNEST(p_runs) WITH ORDINALITY AS u(r, i) LEFT JOIN ins ON ins.run_id = u.r;
    -- The tails of the runs that go on.
    INSERT INTO toolloop_log_tails (run_id, last_id, last_seq)
    SELECT u.r, u.id, u.l + u.c
    FROM UNNEST(p_runs, o_ids, o_last, p_counts, o_fenced) WITH ORDINALITY
        AS u(r, id, l, c, f, i)
    WHERE u.c > 0 AND NOT u.f AND u.i <> ALL (p_finish_at)
    ON CONFLICT (run_id) DO UPDATE SET last_id = excluded.last_id, last_seq = excluded.last_seq;
    -- The runs that end: their record count and last row, and their tails removed.
    IF cardinality(p_finish_at) > 0 THEN
        UPDATE toolloop_runs
        SET records = o_last[e.i] + p_counts[e.i], last_id = COALESCE(o_ids[e.i], v_prev[e.i]),
            updated_ms = p_now, finished = TRUE
        FROM UNNEST(p_finish_at) AS e(i)
        WHERE toolloop_runs.run_id = p_runs[e.i] AND NOT o_fenced[e.i];
        DELETE FROM toolloop_log_tails t USING UNNEST(p_finish_at) AS e(i)
        WHERE t.run_id = p_runs[e.i] AND NOT o_fenced[e.i];
    END IF;
    -- The leases given back.
    IF cardinality(p_release_at) > 0 THEN
        DELETE FROM toolloop_leases l USING UNNEST(p_release_at) AS e(i)
        WHERE NOT o_fenced[e.i] AND p_holders[e.i] IS NOT NULL
            AND l.run_id = p_runs[e.i] AND l.holder = p_holders[e.i];
    END IF;
END
$$;
