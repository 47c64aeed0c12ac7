-- The SQL of pgqctl/control.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: paused_expired_delete
-- Forget pauses that have ended by themselves (the claims ignore them
-- already), so that pausing such a queue again starts a new pause. No rows.
DELETE FROM paused_queues WHERE until <= now();

-- name: paused_upsert
-- Pause each queue, until `seconds` from now (NULL: until resumed). A queue
-- paused already keeps its paused_at, and its reason unless one is given.
-- One row per queue, saying whether it was paused already.
WITH before AS (
    SELECT queue FROM paused_queues WHERE queue = ANY(%(queues)s::text[])
)
INSERT INTO paused_queues AS p (queue, reason, until)
SELECT q, %(reason)s, now() + %(seconds)s * interval '1 second'
FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (queue) DO UPDATE
SET reason = coalesce(EXCLUDED.reason, p.reason),
    until = EXCLUDED.until
RETURNING p.queue, p.reason, p.paused_at, p.until,
          p.queue IN (SELECT queue FROM before) AS updated;

-- name: paused_delete
-- Resume these queues: the pauses in effect that ended. One row per queue
-- that was paused.
DELETE FROM paused_queues
WHERE queue = ANY(%(queues)s::text[]) AND (until IS NULL OR until > now())
RETURNING queue, reason, paused_at, until;

-- name: paused_list
-- The pauses in effect, by queue. One row each.
SELECT queue, reason, paused_at, until FROM paused_queues_now ORDER BY queue;

-- name: queues_known
-- Which of these queues pgqctl knows: one with a pending or running job, a
-- pause, a schedule, or one the table's statistics (ANALYZE's sample of the
-- whole table, history included) have seen. Each test reads an index or a
-- small table, never the finished history: a queue that is not known costs
-- no more than one that is. One row per known queue.
SELECT q AS queue
FROM unnest(%(queues)s::text[]) AS q
WHERE EXISTS (SELECT 1 FROM jobs WHERE status IS NOT DISTINCT FROM 'pending' AND queue = q)
   OR EXISTS (SELECT 1 FROM jobs WHERE status = 'running' AND queue = q)
   OR EXISTS (SELECT 1 FROM paused_queues WHERE queue = q)
   OR EXISTS (SELECT 1 FROM schedules WHERE queue = q)
   OR q IN (
        SELECT unnest(coalesce(most_common_vals::text::text[], '{}')
                      || coalesce(histogram_bounds::text::text[], '{}'))
        FROM pg_stats
        WHERE schemaname = current_schema() AND tablename = 'jobs' AND attname = 'queue'
   );

-- name: queue_names
-- The names of the known queues (as queues_known means it), for a "did you
-- mean": the pending ones by a skip scan of jobs_claim_queue_idx (one index
-- probe per queue, at most 1000 queues), the rest from small tables and the
-- statistics. One row per name.
WITH RECURSIVE pending(queue) AS (
    (SELECT queue FROM jobs WHERE status IS NOT DISTINCT FROM 'pending' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM jobs j
            WHERE j.status IS NOT DISTINCT FROM 'pending' AND j.queue > p.queue
            ORDER BY j.queue LIMIT 1)
    FROM pending p
    WHERE p.queue IS NOT NULL
)
SELECT queue FROM (SELECT queue FROM pending WHERE queue IS NOT NULL LIMIT 1000) AS names
UNION SELECT queue FROM jobs WHERE status = 'running'
UNION SELECT queue FROM paused_queues
UNION SELECT queue FROM schedules
UNION SELECT unnest(coalesce(most_common_vals::text::text[], '{}')
                    || coalesce(histogram_bounds::text::text[], '{}'))
      FROM pg_stats
      WHERE schemaname = current_schema() AND tablename = 'jobs' AND attname = 'queue';

-- schedules: cron and interval schedules (pgqctl/schedules.py). The workers
-- enqueue their ticks (the ticks section).
