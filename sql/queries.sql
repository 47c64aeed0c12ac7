-- Runtime queries, one named block each, loaded by pgqctl/sql.py.
--
-- Every value is a psycopg placeholder (%(name)s); nothing is pasted in.
-- Queries are unqualified: the connection's search_path names the schema.

-- Worker ----------------------------------------------------------------------
-- Used by pgqctl/claims.py. Every transition out of 'running' is fenced on
-- (id, the attempt the worker claimed, status = 'running'): a worker whose
-- lease was lost matches no row and changes nothing. Batches come in as
-- parallel arrays read with unnest.

-- name: job_claim
-- Up to `limit` due jobs, in claim order, for one worker; commits at once.
WITH picked AS (
    SELECT id
    FROM jobs
    WHERE status = 'pending'
      AND run_at <= now()
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs AS j
SET status = 'running',
    attempts = j.attempts + 1,
    locked_until = now() + %(lease)s * interval '1 second',
    locked_by = %(worker)s
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.queue, j.kind, j.payload, j.attempts, j.max_attempts;

-- name: job_complete
UPDATE jobs AS j
SET status = 'done',
    finished_at = now(),
    locked_until = NULL
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS r(id, attempt)
WHERE j.id = r.id
  AND j.attempts = r.attempt
  AND j.status = 'running'
RETURNING j.id;

-- name: job_fail
-- Back to pending after a delay, or failed for good when the job is out of
-- attempts or can never run (permanent).
UPDATE jobs AS j
SET status = CASE WHEN r.permanent OR j.attempts >= j.max_attempts
                  THEN 'failed' ELSE 'pending' END,
    run_at = CASE WHEN r.permanent OR j.attempts >= j.max_attempts
                  THEN j.run_at ELSE now() + r.delay * interval '1 second' END,
    finished_at = CASE WHEN r.permanent OR j.attempts >= j.max_attempts THEN now() END,
    locked_until = NULL,
    last_error = r.error
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[],
            %(delays)s::float8[], %(permanent)s::bool[])
     AS r(id, attempt, error, delay, permanent)
WHERE j.id = r.id
  AND j.attempts = r.attempt
  AND j.status = 'running'
RETURNING j.id, j.status, j.run_at;

-- name: job_hand_back
-- A worker stopping hands unfinished jobs back, due now; the interrupted
-- attempt does not count against the job (max_attempts grows by one).
UPDATE jobs AS j
SET status = 'pending',
    run_at = now(),
    locked_until = NULL,
    max_attempts = j.max_attempts + 1,
    last_error = %(reason)s
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS r(id, attempt)
WHERE j.id = r.id
  AND j.attempts = r.attempt
  AND j.status = 'running'
RETURNING j.id;

-- name: lease_renew
UPDATE jobs AS j
SET locked_until = now() + %(lease)s * interval '1 second'
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS r(id, attempt)
WHERE j.id = r.id
  AND j.attempts = r.attempt
  AND j.status = 'running'
RETURNING j.id;

-- name: job_next_due
-- Seconds until the next delayed job this worker may claim is due, or NULL.
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
