-- The SQL of pgqctl/flow.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: flow_upsert
-- Set a queue's or a kind's limit, replacing what it held. A bucket starts
-- full; a rate changed keeps the tokens it has, up to the new burst. One
-- row: the limit's id and whether it existed.
INSERT INTO limits AS l (scope, name, concurrency, per_key, rate, period_seconds, burst,
                         tokens, refilled_at)
VALUES (%(scope)s, %(name)s, %(concurrency)s::integer, %(per_key)s::integer,
        %(rate)s::integer, %(period)s::float8, %(burst)s::integer, %(burst)s::float8,
        clock_timestamp())
ON CONFLICT (scope, name) DO UPDATE
SET concurrency = EXCLUDED.concurrency, per_key = EXCLUDED.per_key, rate = EXCLUDED.rate,
    period_seconds = EXCLUDED.period_seconds, burst = EXCLUDED.burst,
    tokens = least(coalesce(l.tokens, EXCLUDED.burst), EXCLUDED.burst),
    refilled_at = coalesce(l.refilled_at, EXCLUDED.refilled_at),
    updated_at = now()
RETURNING l.id, NOT (l.xmax = 0) AS existed;

-- name: flow_seats_fit
-- Give a concurrency limit its seats 1..concurrency, and drop its free
-- seats beyond (a taken one goes when its job ends: the limit holds from
-- then). Per-key seats beyond per_key that are free go too. No rows.
WITH added AS (
    INSERT INTO limit_seats (limit_id, key, seat)
    SELECT %(id)s, '', n FROM generate_series(1, coalesce(%(concurrency)s::integer, 0)) AS n
    ON CONFLICT DO NOTHING
)
DELETE FROM limit_seats
WHERE limit_id = %(id)s AND job_id IS NULL
  AND CASE WHEN key = '' THEN seat > coalesce(%(concurrency)s::integer, 0)
           ELSE seat > coalesce(%(per_key)s::integer, 0) END;

-- name: flow_seat_running
-- The jobs of the limit's queue or kind running when it is set hold its
-- seats, as many as there are free, longest running first: a new limit
-- counts what runs already. The rows are locked, so none of them leaves
-- running (and would leave its seat taken) before this commits. The rest
-- run on; the limit holds for new claims until they end. One row per job
-- seated.
WITH locked AS (
    SELECT j.id, j.attempts, j.claimed_at
    FROM jobs AS j
    WHERE j.status = 'running'
      AND CASE WHEN %(scope)s::text = 'queue' THEN j.queue ELSE j.kind END = %(name)s::text
      AND NOT EXISTS (SELECT FROM limit_seats AS s
                      WHERE s.limit_id = %(id)s AND s.job_id = j.id)
    FOR NO KEY UPDATE OF j
), running AS (
    SELECT id, attempts, row_number() OVER (ORDER BY claimed_at, id) AS n FROM locked
), free AS (
    SELECT s.seat, row_number() OVER (ORDER BY s.seat) AS n
    FROM limit_seats AS s
    WHERE s.limit_id = %(id)s AND s.key = '' AND s.seat <= %(concurrency)s::integer AND s.job_id IS NULL
), taken AS (
    UPDATE limit_seats AS s
    SET job_id = r.id, claim = r.attempts, taken_at = now()
    FROM running AS r JOIN free AS f USING (n)
    WHERE s.limit_id = %(id)s AND s.key = '' AND s.seat = f.seat
    RETURNING s.job_id
)
UPDATE jobs SET seated = true WHERE id IN (SELECT job_id FROM taken) RETURNING id;

-- name: flow_delete
-- Remove a limit (its seats go with it). One row if it existed.
DELETE FROM limits WHERE scope = %(scope)s AND name = %(name)s RETURNING id;

-- name: flow_notify
-- Tell listening workers that limits changed: they claim as limits require
-- (or, with none left, as before) from their next claim. Sent at commit.
SELECT pg_notify('pgqctl_limits', current_schema());

-- name: flow_list
-- Every limit with how it stands now: the jobs of its queue or kind
-- running, the seats taken, the due jobs it holds back (all of its due
-- jobs while it is full or out of tokens; those of full keys with
-- --per-key), the tokens in its bucket and how long the oldest job it holds
-- back has been due. Running and due jobs are counted through the partial
-- indexes of the live jobs, never the history.
SELECT l.scope, l.name, l.concurrency, l.per_key, l.rate, l.period_seconds, l.burst,
       r.running, seats.taken AS seats_taken, bucket.tokens,
       CASE WHEN full_now THEN due.n ELSE coalesce(keyed.n, 0) END AS held_back,
       extract(epoch FROM now() - CASE WHEN full_now THEN due.oldest ELSE keyed.oldest END)
           AS held_back_seconds,
       full_keys.n AS full_keys,
       l.created_at, l.updated_at
FROM limits AS l
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE s.key = '' AND s.job_id IS NOT NULL) AS taken,
           count(*) FILTER (WHERE s.key = '' AND s.job_id IS NULL
                            AND s.seat <= l.concurrency) AS free
    FROM limit_seats AS s WHERE s.limit_id = l.id
) AS seats
CROSS JOIN LATERAL (
    SELECT CASE WHEN l.rate IS NULL THEN NULL
                ELSE least(l.burst::float8, coalesce(l.tokens, l.burst)
                     + extract(epoch FROM clock_timestamp() - coalesce(l.refilled_at, now()))
                       * l.rate / l.period_seconds) END AS tokens
) AS bucket
CROSS JOIN LATERAL (
    SELECT (l.concurrency IS NOT NULL AND seats.free = 0)
           OR coalesce(bucket.tokens < 1, false) AS full_now
) AS f
CROSS JOIN LATERAL (
    SELECT count(*) AS running FROM jobs AS j
    WHERE j.status = 'running'
      AND CASE WHEN l.scope = 'queue' THEN j.queue ELSE j.kind END = l.name
) AS r
CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(j.run_at) AS oldest FROM jobs AS j
    WHERE j.status = 'pending' AND j.run_at <= now()
      AND CASE WHEN l.scope = 'queue' THEN j.queue ELSE j.kind END = l.name
) AS due
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT s.key FROM limit_seats AS s
        WHERE s.limit_id = l.id AND s.key <> '' AND s.seat <= l.per_key
        GROUP BY s.key HAVING count(s.job_id) >= l.per_key
    ) AS k
) AS full_keys
LEFT JOIN LATERAL (
    SELECT count(*) AS n, min(j.run_at) AS oldest FROM jobs AS j
    WHERE NOT f.full_now AND l.per_key IS NOT NULL
      AND j.status = 'pending' AND j.run_at <= now()
      AND CASE WHEN l.scope = 'queue' THEN j.queue ELSE j.kind END = l.name
      AND j.limit_key IN (SELECT s.key FROM limit_seats AS s
                          WHERE s.limit_id = l.id AND s.key <> '' AND s.seat <= l.per_key
                          GROUP BY s.key HAVING count(s.job_id) >= l.per_key)
) AS keyed ON true
ORDER BY l.scope, l.name;

-- name: flow_holding
-- The limits that hold a pending job back now, as flow_list judges them:
-- its queue's or kind's limit while full or out of tokens, or the seats of
-- its key full. One row per limit.
SELECT l.scope, l.name,
       CASE WHEN l.concurrency IS NOT NULL AND NOT EXISTS (
                     SELECT FROM limit_seats AS s
                     WHERE s.limit_id = l.id AND s.key = '' AND s.seat <= l.concurrency
                       AND s.job_id IS NULL)
                THEN 'concurrency'
            WHEN l.rate IS NOT NULL AND least(l.burst::float8, coalesce(l.tokens, l.burst)
                     + extract(epoch FROM clock_timestamp() - coalesce(l.refilled_at, now()))
                       * l.rate / l.period_seconds) < 1
                THEN 'rate'
            WHEN l.per_key IS NOT NULL AND j.limit_key IS NOT NULL AND (
                     SELECT count(s.job_id) FROM limit_seats AS s
                     WHERE s.limit_id = l.id AND s.key = j.limit_key
                       AND s.seat <= l.per_key) >= l.per_key
                THEN 'per_key'
       END AS holding,
       l.concurrency, l.per_key, l.rate, l.period_seconds, l.burst, j.limit_key
FROM jobs AS j
JOIN limits AS l ON (l.scope = 'queue' AND l.name = j.queue) OR (l.scope = 'kind' AND l.name = j.kind)
WHERE j.id = %(id)s
ORDER BY l.id;

-- name: flow_seats_lost_lock
-- Seats taken by a job that does not run under that claim any more, which
-- only a path around the jobs table's trigger leaves behind (TRUNCATE,
-- triggers disabled): locked, the rows other transactions hold passed over.
-- Only a candidate: a claim that committed after this statement's snapshot
-- may hold one of them rightly, so flow_seats_lost_free checks again. One
-- row per seat.
SELECT s.limit_id, s.key, s.seat
FROM limit_seats AS s
WHERE s.job_id IS NOT NULL
  AND NOT EXISTS (SELECT FROM jobs AS j
                  WHERE j.id = s.job_id AND j.status = 'running' AND j.attempts = s.claim)
FOR UPDATE SKIP LOCKED;

-- name: flow_seats_lost_free
-- Free those of the locked seats that are still lost, seen from a snapshot
-- taken after their locks: whatever claim took one before has committed.
-- One row per seat freed.
UPDATE limit_seats AS s
SET job_id = NULL, claim = NULL, taken_at = NULL
FROM unnest(%(limit_ids)s::integer[], %(keys)s::text[], %(seats)s::integer[])
     AS lost(limit_id, key, seat)
WHERE (s.limit_id, s.key, s.seat) = (lost.limit_id, lost.key, lost.seat)
  AND s.job_id IS NOT NULL
  AND NOT EXISTS (SELECT FROM jobs AS j
                  WHERE j.id = s.job_id AND j.status = 'running' AND j.attempts = s.claim)
RETURNING s.limit_id;
