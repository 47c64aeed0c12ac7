-- The SQL of pgqctl/registry.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: workers_list
-- Every registered worker, by host and pid, with its state (stale: no
-- heartbeat for three of its intervals; dead: a reap took its jobs as a
-- dead worker's, or found it dead, after its last heartbeat) and the ids of the jobs it holds:
-- running in its slots (jobs), and claimed ahead of a free slot (prefetched).
-- The running jobs are read once, through jobs_lease_idx (status =
-- 'running'), and grouped by holder: `locked_by` is host:pid:slot, the
-- worker's id and the slot, or host:pid:prefetch for a prefetched job (see
-- worker_exchange). One row per worker.
WITH held AS (
    SELECT regexp_replace(locked_by, ':([0-9]+|prefetch)$', '') AS worker,
           array_agg(id ORDER BY id) FILTER (WHERE locked_by !~ ':prefetch$') AS jobs,
           array_agg(id ORDER BY id) FILTER (WHERE locked_by ~ ':prefetch$') AS prefetched
    FROM jobs
    WHERE status = 'running' AND locked_by IS NOT NULL
    GROUP BY 1
)
SELECT w.*,
       CASE WHEN w.reaped_at >= w.last_seen THEN 'dead'
            WHEN w.last_seen >= now() - 3 * w.heartbeat_seconds * interval '1 second'
            THEN 'active' ELSE 'stale' END AS state,
       extract(epoch FROM now() - w.last_seen)::float8 AS seen_seconds_ago,
       coalesce(h.jobs, '{}') AS jobs,
       coalesce(h.prefetched, '{}') AS prefetched
FROM workers AS w
LEFT JOIN held AS h ON h.worker = w.id
ORDER BY w.host, w.pid, w.id;

-- name: workers_states
-- What check and metrics need of each worker: its queues (empty: every
-- queue) and whether it is active, as workers_list says. One row per worker.
SELECT queues,
       last_seen >= now() - 3 * heartbeat_seconds * interval '1 second'
           AND NOT coalesce(reaped_at >= last_seen, false) AS active
FROM workers;

-- control: pausing and resuming queues (pgqctl/control.py). The claims skip
-- the queues of paused_queues_now (see the worker section).

-- name: worker_beat
-- Register the worker, or heartbeat: its row, written whole, with last_seen
-- now and its counters. An upsert, so a row someone removed (or that was
-- removed as stale while the worker was cut off) comes back with the next
-- heartbeat, and a row left by an earlier process of the same host:pid (a
-- restarted container) is replaced. started_at NULL registers (now);
-- heartbeats send the started_at that registration returned. Sent at most
-- every --heartbeat, in the pipeline of an exchange when one goes out, alone
-- otherwise. One row: started_at, whether any limit exists (`pgqctl
-- limit`: the worker then claims with worker_claim_limited), and, for a
-- worker that reaps (dead_after not NULL), whether another worker is dead
-- by lease_reap's rule and not yet reaped for it: the worker then reaps at
-- once instead of at its next --reap-every. The workers table holds a row
-- per worker: the look costs nothing a heartbeat would notice.
INSERT INTO workers AS w (id, host, pid, version, queues, kinds, concurrency,
                          heartbeat_seconds, lease_seconds, started_at, last_seen,
                          running, done, failed)
VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(queues)s::text[], %(kinds)s::text[],
        %(concurrency)s, %(heartbeat)s, %(lease)s, coalesce(%(started_at)s, now()), now(),
        %(running)s, %(done)s, %(failed)s)
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version,
    queues = EXCLUDED.queues, kinds = EXCLUDED.kinds, concurrency = EXCLUDED.concurrency,
    heartbeat_seconds = EXCLUDED.heartbeat_seconds, lease_seconds = EXCLUDED.lease_seconds,
    started_at = EXCLUDED.started_at, last_seen = EXCLUDED.last_seen,
    running = EXCLUDED.running, done = EXCLUDED.done, failed = EXCLUDED.failed
RETURNING started_at, EXISTS (SELECT FROM limits) AS limited,
          %(dead_after)s::integer IS NOT NULL AND EXISTS (
              SELECT FROM workers AS d
              WHERE d.id <> %(id)s
                AND greatest(d.last_seen, pg_postmaster_start_time())
                    < now() - %(dead_after)s * d.heartbeat_seconds * interval '1 second'
                AND (d.reaped_at IS NULL OR d.reaped_at < d.last_seen)) AS dead_found;

-- name: worker_unregister
-- A clean stop: the worker's row goes. No rows.
DELETE FROM workers WHERE id = %(id)s;

-- name: workers_forget_stale
-- Rows of workers gone for an hour (and for three of their heartbeats, for
-- a worker whose --heartbeat is longer): killed or cut off for good. Run by
-- every worker with its reap; a worker that was only cut off comes back
-- with its next heartbeat. One row per worker removed: its id.
DELETE FROM workers
WHERE last_seen < now() - greatest(interval '1 hour',
                                   3 * heartbeat_seconds * interval '1 second')
RETURNING id;
