-- toolloop store, version 3: workflow runs. One row per run of a workflow: its definition,
-- inputs and the results of the steps that finished, as one JSON document (the steps' own runs
-- are ordinary runs, logged in toolloop_runs and toolloop_records).
CREATE TABLE IF NOT EXISTS toolloop_workflows (
    workflow_id TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    status      TEXT NOT NULL,
    body        TEXT NOT NULL,
    created_ms  BIGINT NOT NULL,
    updated_ms  BIGINT NOT NULL
);
