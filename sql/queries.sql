-- Runtime queries, one named block each, loaded by pgqctl/sql.py.
--
-- Every value is a psycopg placeholder (%(name)s); nothing is pasted in.
-- Queries are unqualified: the connection's search_path names the schema.

-- Worker ----------------------------------------------------------------------
-- Used by pgqctl/claims.py. Every transition out of 'running' is fenced on
-- (id, the attempt the worker claimed, status = 'running'): a worker whose
-- lease was lost matches no row and changes nothing.

-- name: worker_exchange
-- One round trip of a worker: report the jobs that ended (done, failed: back
-- to pending after a delay, or failed for good when out of attempts or never
-- runnable; handed back: pending now, the interrupted attempt not counted),
-- renew the leases of those still running, and claim up to `limit` due jobs
-- in claim order. Batches come in as JSON arrays of objects. The parts touch
-- disjoint rows (ended, running, pending), so one statement does them all;
-- every row returned says which part it answers.
WITH done AS (
    UPDATE jobs AS j
    SET status = 'done',
        finished_at = now(),
        locked_until = NULL
    FROM jsonb_to_recordset(%(done)s::jsonb) AS r(id bigint, attempt int)
    WHERE j.id = r.id
      AND j.attempts = r.attempt
      AND j.status = 'running'
    RETURNING j.id
), failed AS (
    UPDATE jobs AS j
    SET status = CASE WHEN r.permanent OR j.attempts >= j.max_attempts
                      THEN 'failed' ELSE 'pending' END,
        run_at = CASE WHEN r.permanent OR j.attempts >= j.max_attempts
                      THEN j.run_at ELSE now() + r.delay * interval '1 second' END,
        finished_at = CASE WHEN r.permanent OR j.attempts >= j.max_attempts THEN now() END,
        locked_until = NULL,
        last_error = r.error
    FROM jsonb_to_recordset(%(failed)s::jsonb)
         AS r(id bigint, attempt int, error text, delay float8, permanent bool)
    WHERE j.id = r.id
      AND j.attempts = r.attempt
      AND j.status = 'running'
    RETURNING j.id, j.status, j.run_at
), handed_back AS (
    UPDATE jobs AS j
    SET status = 'pending',
        run_at = now(),
        locked_until = NULL,
        max_attempts = j.max_attempts + 1,
        last_error = %(reason)s
    FROM jsonb_to_recordset(%(handed_back)s::jsonb) AS r(id bigint, attempt int)
    WHERE j.id = r.id
      AND j.attempts = r.attempt
      AND j.status = 'running'
    RETURNING j.id
), renewed AS (
    UPDATE jobs AS j
    SET locked_until = now() + %(lease)s * interval '1 second'
    FROM jsonb_to_recordset(%(renew)s::jsonb) AS r(id bigint, attempt int)
    WHERE j.id = r.id
      AND j.attempts = r.attempt
      AND j.status = 'running'
    RETURNING j.id
), claimed AS (
    UPDATE jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        locked_until = now() + %(lease)s * interval '1 second',
        locked_by = %(worker)s
    FROM (
        SELECT id
        FROM jobs
        WHERE status = 'pending'
          AND run_at <= now()
          AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
          AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
        ORDER BY priority DESC, run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS picked
    WHERE j.id = picked.id
    RETURNING j.id, j.queue, j.kind, j.payload, j.attempts, j.max_attempts
)
SELECT 'claimed' AS part, id, queue, kind, payload::text AS payload, attempts,
       max_attempts, NULL::text AS status, NULL::timestamptz AS run_at
FROM claimed
UNION ALL SELECT 'done', id, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM done
UNION ALL SELECT 'failed', id, NULL, NULL, NULL, NULL, NULL, status, run_at FROM failed
UNION ALL SELECT 'handed_back', id, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM handed_back
UNION ALL SELECT 'renewed', id, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM renewed;

-- name: job_next_due
-- Seconds until the next delayed job a worker may claim is due, or NULL.
SELECT extract(epoch FROM min(run_at) - now())::float8
FROM jobs
WHERE status = 'pending'
  AND run_at > now()
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]));

-- name: job_fence_state
-- Where jobs whose fenced update matched nothing stand now, to say why.
SELECT id, status, attempts
FROM jobs
WHERE id = ANY(%(ids)s::bigint[]);
