-- Runtime queries, one named block each, loaded by pgqctl/sql.py.
--
-- Every value is a psycopg placeholder (%(name)s); nothing is pasted in.
-- Queries are unqualified: the connection's search_path names the schema.

-- ---------------------------------------------------------------------------
-- Operator commands: stats, leases, list, show, reap, requeue, purge.
-- Used by pgqctl/queue.py. Each status is read through its own partial index
-- (claim, lease, finished), so none of these scans the done history unless
-- asked to (`stats --exact`, `purge`, `list` without --status).
-- ---------------------------------------------------------------------------

-- name: stats_counts
-- Per queue: exact pending, running, failed, expired leases and oldest due
-- pending job, one arm per status so each reads its own partial index. Done
-- jobs are counted among at most `bound` of them (NULL: all of them, exact),
-- so a long history is never read unless asked for.
SELECT queue,
       count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'done') AS done,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'running'
                          AND (locked_until < now() OR locked_until IS NULL)) AS expired_leases,
       extract(epoch FROM now() - min(run_at) FILTER (
           WHERE status = 'pending' AND run_at <= now()))::float8 AS oldest_pending_age_seconds
FROM (
    SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'pending'
    UNION ALL
    SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'running'
    UNION ALL
    SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'failed'
    UNION ALL
    (SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'done'
     LIMIT %(bound)s)
) AS counted
GROUP BY queue;

-- name: stats_table_estimate
-- What the planner knows, from catalogs only: the live rows in the table
-- (the statistics counter, else the last ANALYZE's count) and the most
-- common queues with their share of rows.
SELECT coalesce(nullif(pg_stat_get_live_tuples(c.oid), 0),
                greatest(c.reltuples, 0)::bigint) AS rows,
       st.null_frac,
       st.n_distinct,
       st.most_common_vals::text::text[] AS common_queues,
       st.most_common_freqs AS common_shares,
       st.attname IS NOT NULL AS analyzed
FROM pg_class AS c
LEFT JOIN pg_stats AS st
       ON st.schemaname = current_schema() AND st.tablename = 'jobs'
      AND st.attname = 'queue' AND NOT st.inherited
WHERE c.oid = 'jobs'::regclass;

-- name: lease_list
-- Running jobs, soonest lease end first (jobs_lease_idx order). A running job
-- without a lease (only plain SQL makes one) counts as expired, here, in
-- stats and for reap: nobody holds it, so nothing else would ever free it.
SELECT *,
       locked_until < now() OR locked_until IS NULL AS expired,
       round(extract(epoch FROM locked_until - now())::numeric, 3) AS seconds_left
FROM jobs
WHERE status = 'running'
  AND (locked_until < now() OR locked_until IS NULL OR NOT %(expired_only)s)
ORDER BY locked_until NULLS FIRST, id;

-- name: lease_reap_preview
-- What lease_reap would do now, without locking or writing anything.
SELECT *,
       CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'pending' END AS reaped_status,
       locked_by AS held_by
FROM jobs
WHERE status = 'running' AND (locked_until < now() OR locked_until IS NULL)
ORDER BY locked_until NULLS FIRST, id;

-- name: lease_reap
-- The seed's reclaim in one statement. SKIP LOCKED: rows a worker is updating
-- right now (renewal, report) are left for the next run instead of waited on,
-- and two reaps at once never take the same row.
UPDATE jobs
SET status = CASE WHEN jobs.attempts >= jobs.max_attempts THEN 'failed' ELSE 'pending' END,
    finished_at = CASE WHEN jobs.attempts >= jobs.max_attempts THEN now() END,
    last_error = CASE
        WHEN expired.locked_until IS NULL
        THEN format('running without a lease (held by %%s)',
                    coalesce(expired.locked_by, 'an unnamed worker'))
        ELSE format('lease expired at %%s (held by %%s)',
                    expired.locked_until, coalesce(expired.locked_by, 'an unnamed worker'))
    END,
    locked_until = NULL  -- locked_by stays: the worker that last held it
FROM (
    SELECT id, locked_by, locked_until
    FROM jobs
    WHERE status = 'running' AND (locked_until < now() OR locked_until IS NULL)
    FOR UPDATE SKIP LOCKED
) AS expired
WHERE jobs.id = expired.id
RETURNING jobs.*, expired.locked_by AS held_by;

-- name: workers_notify
-- Wake listening workers; delivered when the surrounding transaction commits.
SELECT pg_notify('pgqctl_jobs', current_schema());

-- name: job_list
SELECT *
FROM jobs
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
-- Newest first. The CASE folds to a constant (and drops out) for done or no
-- status: the primary key is walked backwards. For pending, running and
-- failed it forces a sort of the matching rows, which come from their small
-- partial index, instead of a backward walk through the done history that
-- the planner may pick when those rows are old.
ORDER BY CASE WHEN %(status)s::text <> 'done' THEN -id END, id DESC
LIMIT %(limit)s;

-- name: job_get
SELECT * FROM jobs WHERE id = %(id)s;

-- name: job_failed_select
-- Failed jobs matching a requeue selection (each filter optional).
SELECT *
FROM jobs
WHERE status = 'failed'
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(since)s::interval IS NULL OR finished_at >= now() - %(since)s::interval)
ORDER BY id;

-- name: job_requeue
-- Failed -> pending, due now, with `more` new tries. attempts is the
-- fencing token and never goes down: max_attempts goes up instead. The status
-- guard skips a job someone else requeued or purged since it was selected.
UPDATE jobs
SET status = 'pending',
    run_at = now(),
    max_attempts = attempts + %(more)s,
    finished_at = NULL,
    locked_until = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'failed'
RETURNING *;

-- name: job_purge_cutoff
-- Purge deletes rows finished before this instant, fixed when it starts, so
-- it ends even while workers keep finishing jobs.
SELECT now() - %(older_than)s::interval AS cutoff;

-- name: job_purge_count
SELECT count(*)
FROM jobs
WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(cutoff)s;

-- name: job_purge_batch
-- One short transaction per batch; SKIP LOCKED so it never waits on a row
-- someone is updating (a requeue), and workers never wait on more than this.
-- ARRAY(...) makes the delete a primary-key lookup of the batch's ids, never a
-- join the planner might run as a scan of the whole table.
DELETE FROM jobs
WHERE id = ANY(ARRAY(
    SELECT id
    FROM jobs
    WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(cutoff)s
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
));
-- ---- enqueue (pgqctl/enqueue.py) -------------------------------------------
-- These blocks write {jobs} for the table: the enqueue API composes it with
-- psycopg.sql.Identifier, schema-qualified when its caller names a schema and
-- bare (the search_path) otherwise. A job is due at run_at when given, else at
-- the transaction's now() plus delay seconds. ORDER BY n hands out ids in
-- input order, so the returned ids line up with the jobs given.

-- name: jobs_insert_arrays
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay))
FROM unnest(%(kind)s::text[], %(payload)s::jsonb[], %(queue)s::text[],
            %(priority)s::integer[], %(max_attempts)s::integer[],
            %(run_at)s::timestamptz[], %(delay)s::float8[])
     WITH ORDINALITY AS t (kind, payload, queue, priority, max_attempts, run_at, delay, n)
ORDER BY n
RETURNING id;

-- name: jobs_load_create
CREATE TEMPORARY TABLE pgqctl_enqueue_load (
    n            bigint,
    kind         text,
    payload      jsonb,
    queue        text,
    priority     integer,
    max_attempts integer,
    run_at       timestamptz,
    delay        float8
) ON COMMIT DROP;

-- name: jobs_load_copy
COPY pg_temp.pgqctl_enqueue_load (n, kind, payload, queue, priority, max_attempts, run_at, delay)
FROM STDIN;

-- name: jobs_insert_loaded
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay))
FROM pg_temp.pgqctl_enqueue_load
ORDER BY n
RETURNING id;

-- name: jobs_load_truncate
TRUNCATE pg_temp.pgqctl_enqueue_load;

-- name: jobs_load_drop
DROP TABLE pg_temp.pgqctl_enqueue_load;
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
--
-- The worker runs this statement thousands of times a second, so it must run
-- on one cached (generic) plan: planning it afresh costs more than running
-- it. Every part therefore finds its rows through the primary key (`id =
-- ANY(ARRAY(...))`), a plan that stays right whatever the parameters and the
-- table's statistics say; a join on the batch could turn into a scan of every
-- running job, or of the whole table, when the planner cannot see the batch.
-- The fence on status is spelled `IS NOT DISTINCT FROM 'running'`, not `=`, so
-- that the planner cannot use the partial lease index (WHERE status =
-- 'running') instead: a plan cached while few jobs ran believes that index
-- empty, and would then scan every running job for each report. The text
-- must stay under psycopg's 4 kB limit for caching its parse (comment lines
-- are not sent; tests/unit/test_sql.py checks).
WITH done AS (
    UPDATE jobs AS j
    SET status = 'done',
        finished_at = now(),
        locked_until = NULL
    FROM jsonb_to_recordset(%(done)s::jsonb) AS r(id bigint, attempt int)
    WHERE j.id = ANY(ARRAY(SELECT (e ->> 'id')::bigint
                           FROM jsonb_array_elements(%(done)s::jsonb) AS e))
      AND j.id = r.id
      AND j.attempts = r.attempt
      AND j.status IS NOT DISTINCT FROM 'running'
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
    WHERE j.id = ANY(ARRAY(SELECT (e ->> 'id')::bigint
                           FROM jsonb_array_elements(%(failed)s::jsonb) AS e))
      AND j.id = r.id
      AND j.attempts = r.attempt
      AND j.status IS NOT DISTINCT FROM 'running'
    RETURNING j.id, j.status, j.run_at
), handed_back AS (
    UPDATE jobs AS j
    SET status = 'pending',
        run_at = now(),
        locked_until = NULL,
        max_attempts = j.max_attempts + 1,
        last_error = %(reason)s
    FROM jsonb_to_recordset(%(handed_back)s::jsonb) AS r(id bigint, attempt int)
    WHERE j.id = ANY(ARRAY(SELECT (e ->> 'id')::bigint
                           FROM jsonb_array_elements(%(handed_back)s::jsonb) AS e))
      AND j.id = r.id
      AND j.attempts = r.attempt
      AND j.status IS NOT DISTINCT FROM 'running'
    RETURNING j.id
), renewed AS (
    UPDATE jobs AS j
    SET locked_until = now() + %(lease)s * interval '1 second'
    FROM jsonb_to_recordset(%(renew)s::jsonb) AS r(id bigint, attempt int)
    WHERE j.id = ANY(ARRAY(SELECT (e ->> 'id')::bigint
                           FROM jsonb_array_elements(%(renew)s::jsonb) AS e))
      AND j.id = r.id
      AND j.attempts = r.attempt
      AND j.status IS NOT DISTINCT FROM 'running'
    RETURNING j.id
), picked AS MATERIALIZED (
    SELECT ARRAY(
        SELECT id
        FROM jobs
        WHERE status = 'pending'
          AND run_at <= now()
          AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
          AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
        ORDER BY priority DESC, run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS ids
), claimed AS (
    UPDATE jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        locked_until = now() + %(lease)s * interval '1 second',
        locked_by = %(worker)s || COALESCE(
            ':' || (%(slots)s::int[])[array_position((SELECT ids FROM picked), j.id)], '')
    WHERE j.id = ANY((SELECT ids FROM picked)::bigint[])
    RETURNING j.id, j.queue, j.kind, j.payload, j.attempts, j.max_attempts,
              j.priority, j.run_at
)
-- The arms are read in order, and each part runs when first read: reports and
-- renewals first, the claim last. A claim's SKIP LOCKED recheck can keep a
-- lock on a row another worker just claimed; were the claim first, that
-- worker's report could wait on us while ours waited on it (a deadlock). With
-- the claim last, a statement holds no claim locks while it waits to report.
SELECT 'done' AS part, id, NULL::text AS queue, NULL::text AS kind, NULL::text AS payload,
       NULL::int AS attempts, NULL::int AS max_attempts, NULL::text AS status,
       NULL::timestamptz AS run_at
FROM done
UNION ALL SELECT 'failed', id, NULL, NULL, NULL, NULL, NULL, status, run_at FROM failed
UNION ALL SELECT 'handed_back', id, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM handed_back
UNION ALL SELECT 'renewed', id, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM renewed
-- Claimed jobs come last, in claim order: the worker starts them in that order.
UNION ALL (SELECT 'claimed', id, queue, kind, payload::text, attempts, max_attempts, NULL, NULL
           FROM claimed
           ORDER BY priority DESC, run_at, id);

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
