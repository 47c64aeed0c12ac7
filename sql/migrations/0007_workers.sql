-- compatibility: additive
-- The workers that run: each registers itself when it starts, heartbeats
-- (last_seen and its live counters) on its own exchanges, and removes its
-- row when it stops cleanly. A worker killed or cut off leaves its row
-- behind: `pgqctl workers` shows it stale once three heartbeat intervals
-- pass without one, and any worker removes it an hour later.
--
-- id is the worker's identity as `locked_by` names it before the slot
-- (host:pid), so a running job's holder is found here. One row per worker,
-- rewritten by each heartbeat: no column but id is indexed, so the rewrite
-- is a HOT update that leaves the index alone.

-- step: transaction
CREATE TABLE workers (
    id                text PRIMARY KEY,
    host              text NOT NULL,
    pid               integer NOT NULL,
    version           text NOT NULL,
    -- What it claims from: empty means every queue (every kind).
    queues            text[] NOT NULL DEFAULT '{}',
    kinds             text[] NOT NULL DEFAULT '{}',
    concurrency       integer NOT NULL,
    -- Its --heartbeat and --lease: stale after three heartbeats missed.
    heartbeat_seconds float8 NOT NULL,
    lease_seconds     float8 NOT NULL,
    started_at        timestamptz NOT NULL DEFAULT now(),
    last_seen         timestamptz NOT NULL DEFAULT now(),
    -- As of the last heartbeat: jobs running, and attempts reported done
    -- and failed (retried or not) since it started.
    running           integer NOT NULL DEFAULT 0,
    done              bigint NOT NULL DEFAULT 0,
    failed            bigint NOT NULL DEFAULT 0
);
