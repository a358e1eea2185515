-- toolloop store, version 5 (PostgreSQL): a batch of run-log appends in one call.
-- The group writer commits every run's waiting step together; this function does all of a
-- batch's statements in one round trip (and, called alone, one transaction), instead of one
-- round trip per statement. Arguments, one element per append in the batch's order unless said:
-- the runs and their lease holders (NULL: not fenced); whether the append takes its run's lease
-- (the run's first write) and the lease's expiry; the process taking leases (host, pid, start;
-- single values); each append's record kinds, body (a JSON array of its records, or one record)
-- and record count; whether it ends the run, gives its lease back, starts the run; the session,
-- metadata and session revision of a run that starts; and now (a single value).
-- Returns, per append in order, whether it was fenced out (its run's lease is someone else's:
-- nothing of that run was written).
CREATE OR REPLACE FUNCTION toolloop_append_batch(
    p_runs TEXT[], p_holders TEXT[], p_take BOOLEAN[], p_expiries BIGINT[],
    p_host TEXT, p_pid BIGINT, p_pid_start TEXT,
    p_kinds TEXT[], p_bodies TEXT[], p_counts BIGINT[],
    p_finished BOOLEAN[], p_release BOOLEAN[], p_start BOOLEAN[],
    p_sessions TEXT[], p_metas TEXT[], p_revisions BIGINT[],
    p_now BIGINT
) RETURNS BOOLEAN[] LANGUAGE plpgsql AS $$
DECLARE
    v_fenced BOOLEAN[];
    v_last BIGINT[];
BEGIN
    -- The leases of the runs that start with this batch (a racer's is kept: it is fenced below).
    INSERT INTO toolloop_leases (run_id, holder, host, pid, pid_start, expires_ms)
    SELECT u.r, u.h, p_host, p_pid, p_pid_start, u.e
    FROM UNNEST(p_runs, p_holders, p_take, p_expiries) AS u(r, h, t, e)
    WHERE u.t AND u.h IS NOT NULL
    ON CONFLICT (run_id) DO NOTHING;
    -- Each run's fence and last sequence number. The lease rows are held (FOR SHARE) until the
    -- commit, so a takeover waits for it; they are read in one pass, not probed per run.
    WITH u AS (
        SELECT * FROM UNNEST(p_runs, p_holders) WITH ORDINALITY AS u(r, h, i)
    ), held AS (
        SELECT l.run_id FROM toolloop_leases l JOIN u ON l.run_id = u.r AND l.holder = u.h
        FOR SHARE OF l
    )
    SELECT
        array_agg(u.h IS NOT NULL AND u.r NOT IN (SELECT run_id FROM held) ORDER BY u.i),
        array_agg(GREATEST(
            COALESCE((SELECT r.records FROM toolloop_runs r WHERE r.run_id = u.r), 0),
            COALESCE((SELECT MAX(x.seq) FROM toolloop_records x WHERE x.run_id = u.r), 0)
        ) ORDER BY u.i)
    INTO v_fenced, v_last
    FROM u;
    -- The sessions of the runs that start.
    INSERT INTO toolloop_sessions (name, messages, message_count, created_ms, updated_ms)
    SELECT u.s, '[]', 0, p_now, p_now
    FROM UNNEST(p_sessions, p_start, v_fenced) AS u(s, st, f)
    WHERE u.st AND NOT u.f AND u.s IS NOT NULL
    ON CONFLICT (name) DO NOTHING;
    -- The runs that start.
    INSERT INTO toolloop_runs
        (run_id, session, meta, records, finished, created_ms, updated_ms, session_revision)
    SELECT u.r, u.s, u.m, u.c, u.fi, p_now, p_now,
        COALESCE(u.v, (SELECT s.revision FROM toolloop_sessions s WHERE s.name = u.s))
    FROM UNNEST(p_runs, p_sessions, p_metas, p_counts, p_finished, p_revisions, p_start, v_fenced)
        AS u(r, s, m, c, fi, v, st, f)
    WHERE u.st AND NOT u.f
    ON CONFLICT (run_id) DO UPDATE SET records = toolloop_runs.records + excluded.records,
        updated_ms = excluded.updated_ms,
        finished = (toolloop_runs.finished OR excluded.finished);
    -- Each append's row.
    INSERT INTO toolloop_records (run_id, seq, kind, body, created_ms)
    SELECT u.r, u.l + 1, u.k, u.b, p_now
    FROM UNNEST(p_runs, v_last, p_kinds, p_bodies, p_counts, v_fenced) AS u(r, l, k, b, c, f)
    WHERE u.c > 0 AND NOT u.f;
    -- The counters of the runs that go on.
    UPDATE toolloop_runs SET records = toolloop_runs.records + u.c, updated_ms = p_now,
        finished = (toolloop_runs.finished OR u.fi)
    FROM UNNEST(p_runs, p_counts, p_finished, p_start, v_fenced) AS u(r, c, fi, st, f)
    WHERE toolloop_runs.run_id = u.r AND NOT u.st AND u.c > 0 AND NOT u.f;
    -- The leases given back.
    DELETE FROM toolloop_leases l
    USING UNNEST(p_runs, p_holders, p_release, v_fenced) AS u(r, h, rel, f)
    WHERE u.rel AND NOT u.f AND u.h IS NOT NULL AND l.run_id = u.r AND l.holder = u.h;
    RETURN v_fenced;
END
$$;
