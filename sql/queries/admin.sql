-- The SQL of pgqctl/admin.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: stats_counts
-- Per queue: exact pending, running, failed and cancelled counts, expired
-- leases and the oldest due pending job, one arm per status so each reads its own partial index. Done
-- jobs are counted among at most `bound` of them (NULL: all of them, exact),
-- so a long history is never read unless asked for: the most recently
-- finished (jobs_finished_idx, backwards), which find the queues that worked
-- since the statistics were last gathered. The CASE folds away for NULL:
-- an exact count sorts nothing. {done_from} is all_jobs, or jobs when no
-- done job is counted (`bound` 0: check, metrics): the history's days are
-- then neither planned nor opened. `newer_than` (a value, or NULL) leaves
-- out the days before it, done jobs finished before (see admin.newest_first).
SELECT queue,
       count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS due,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'done') AS done,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE status = 'running'
                          AND (locked_until < now() OR locked_until IS NULL)) AS expired_leases,
       -- A run_at of '-infinity' (plain SQL) cannot be subtracted from: each
       -- is bounded first to the years a Python datetime holds
       -- (pgqctl/fartime.py); run_at is never NULL.
       extract(epoch FROM now() - min(greatest(run_at, '0001-01-01Z')) FILTER (
           WHERE status = 'pending' AND run_at <= now()))::float8 AS oldest_pending_age_seconds
FROM (
    SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'pending'
    UNION ALL
    SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'running'
    UNION ALL
    SELECT queue, status, run_at, locked_until FROM all_jobs WHERE status = 'failed'
    UNION ALL
    SELECT queue, status, run_at, locked_until FROM all_jobs WHERE status = 'cancelled'
    UNION ALL
    (SELECT queue, status, run_at, locked_until FROM {done_from} WHERE status = 'done'
       AND (%(newer_than)s::timestamptz IS NULL OR finished_at >= %(newer_than)s::timestamptz)
     ORDER BY CASE WHEN %(bound)s::bigint IS NOT NULL THEN finished_at END DESC
     LIMIT %(bound)s)
) AS counted
GROUP BY queue;

-- name: stats_table_estimate
-- What the planner knows, from catalogs only: the live rows in the table
-- (the statistics counter, else the last ANALYZE's count), the most common
-- queues with their share of rows at the last ANALYZE, how many rows were
-- inserted, updated or deleted since (how stale those shares may be), and
-- the queue column's statistics target (ANALYZE samples 300 rows per unit),
-- and the rows of the history. One row.
SELECT coalesce(nullif(pg_stat_get_live_tuples(c.oid), 0),
                greatest(c.reltuples, 0)::bigint) AS rows,
       pg_stat_get_mod_since_analyze(c.oid) AS changed,
       coalesce(nullif(a.attstattarget, -1),
                current_setting('default_statistics_target')::int) AS target,
       st.null_frac,
       st.n_distinct,
       st.most_common_vals::text::text[] AS common_queues,
       st.most_common_freqs AS common_shares,
       st.attname IS NOT NULL AS analyzed,
       -- The history's rows, each of its days counted the same way.
       (SELECT coalesce(sum(coalesce(nullif(pg_stat_get_live_tuples(t.relid), 0),
                                     greatest(h.reltuples, 0)::bigint)), 0)
        FROM pg_partition_tree('jobs_history') AS t
        JOIN pg_class AS h ON h.oid = t.relid
        WHERE t.isleaf)::bigint AS history_rows
FROM pg_class AS c
JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attname = 'queue'
LEFT JOIN pg_stats AS st
       ON st.schemaname = current_schema() AND st.tablename = 'jobs'
      AND st.attname = 'queue' AND NOT st.inherited
WHERE c.oid = 'jobs'::regclass;

-- name: workers_notify
-- Wake listening workers; delivered when the surrounding transaction commits.
SELECT pg_notify('pgqctl_jobs', current_schema());

-- The filters of `list`, the same in job_list, job_list_next and job_count:
-- each a list of values (NULL: any), every one given narrows. Statuses get
-- one arm each, folded to true or false by the parameters, so that the jobs
-- of each status given are read through their own partial index and `list
-- --status pending --status failed` never reads the done history (a
-- `status = ANY(...)` would: no partial index answers it). A new status
-- needs its arm in each (tests/unit/test_admin_sql.py checks).

-- name: job_list
-- Jobs matching the filters, newest first, at most `limit` (NULL: all),
-- below the id `before` when given.
SELECT {job}
FROM all_jobs AS jobs
WHERE (%(statuses)s::text[] IS NULL
       OR (status = 'pending' AND 'pending' = ANY(%(statuses)s::text[]))
       OR (status = 'running' AND 'running' = ANY(%(statuses)s::text[]))
       OR (status = 'done' AND 'done' = ANY(%(statuses)s::text[]))
       OR (status = 'failed' AND 'failed' = ANY(%(statuses)s::text[]))
       OR (status = 'cancelled' AND 'cancelled' = ANY(%(statuses)s::text[])))
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(since)s::interval IS NULL OR created_at >= now() - %(since)s::interval)
  -- A job finishes after it is created: the history's days before the
  -- window hold none of it, and are left out (a backward walk of each day's
  -- ids would read it whole, finding nothing). `since_at` is the window's
  -- start as a value (db.window_start), so they are left out of the plan.
  AND (%(since_at)s::timestamptz IS NULL OR finished_at IS NULL
       OR finished_at >= %(since_at)s::timestamptz)
  -- The newest days first (admin.newest_first): NULL reads them all.
  AND (%(newer_than)s::timestamptz IS NULL OR finished_at IS NULL
       OR finished_at >= %(newer_than)s::timestamptz)
  AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
  -- A page after the first (keyset paging): the jobs below the last id shown.
  AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
  -- A search bounded to the ids from `floor` (the web page's: see pages.py).
  AND (%(floor)s::bigint IS NULL OR id >= %(floor)s::bigint)
-- Newest first. The CASE folds to a constant (and drops out) when done jobs
-- may match: the primary key is walked backwards. When only pending,
-- running or failed jobs may, it forces a sort of the matching rows, which
-- come from their small partial indexes, instead of a backward walk through
-- the done history that the planner may pick when those rows are old.
ORDER BY CASE WHEN NOT ('done' = ANY(coalesce(%(statuses)s::text[], '{done}')))
              THEN -id END,
         id DESC
LIMIT %(limit)s;

-- name: job_list_next
-- Pending jobs matching the filters in the order workers claim them
-- (priority DESC, run_at, id: jobs_claim_idx, walked in order), at most
-- `limit` (NULL: all). Jobs not due yet are listed where they will stand.
SELECT {job}
FROM jobs
WHERE status = 'pending'
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(since)s::interval IS NULL OR created_at >= now() - %(since)s::interval)
  AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
ORDER BY priority DESC, run_at, id
LIMIT %(limit)s;

-- name: job_count
-- How many jobs match job_list's filters, counting at most `bound` of them
-- (NULL: every one). One row.
SELECT count(*)
FROM (
    SELECT 1
    FROM all_jobs AS jobs
    WHERE (%(statuses)s::text[] IS NULL
           OR (status = 'pending' AND 'pending' = ANY(%(statuses)s::text[]))
           OR (status = 'running' AND 'running' = ANY(%(statuses)s::text[]))
           OR (status = 'done' AND 'done' = ANY(%(statuses)s::text[]))
           OR (status = 'failed' AND 'failed' = ANY(%(statuses)s::text[]))
           OR (status = 'cancelled' AND 'cancelled' = ANY(%(statuses)s::text[])))
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
      AND (%(since)s::interval IS NULL OR created_at >= now() - %(since)s::interval)
      AND (%(since_at)s::timestamptz IS NULL OR finished_at IS NULL
           OR finished_at >= %(since_at)s::timestamptz)  -- as in job_list
      AND (%(newer_than)s::timestamptz IS NULL OR finished_at IS NULL
           OR finished_at >= %(newer_than)s::timestamptz)
      AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
    LIMIT %(bound)s
) AS matched;

-- name: job_get
SELECT {job} FROM all_jobs AS jobs WHERE id = %(id)s;

-- Requeue: job_requeue_preview (--dry-run) and job_requeue share the
-- selection of job_requeue_pick, put in place of {picked}, so the preview
-- shows exactly what the change would do; and both compute a job's new
-- values with the same expressions (tests compare the two).

-- name: job_requeue_pick
-- The CTEs that pick the jobs of a requeue selection. `statuses` says which
-- of pending, failed and cancelled it takes (one arm each, so each status is
-- read through its own partial index); the other filters are optional lists
-- (any of their values). In order, oldest finished first, pending jobs by
-- run_at: the first `limit` (NULL: all) are picked. A finished job whose
-- unique key a pending or running job holds (or an earlier one of the same
-- selection will) cannot go back to pending: `held` names its holder, and it
-- is left out of the pick and of the limit. The n-th of the N picked gets
-- run_at now + spread * n / N: evenly over the window, in order.
matched AS (
    SELECT id, status, queue, unique_key, coalesce(finished_at, run_at) AS since
    FROM all_jobs
    WHERE ((status = 'pending' AND 'pending' = ANY(%(statuses)s::text[]))
           OR (status = 'failed' AND 'failed' = ANY(%(statuses)s::text[]))
           OR (status = 'cancelled' AND 'cancelled' = ANY(%(statuses)s::text[])))
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
      AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND (%(since)s::interval IS NULL
           OR coalesce(finished_at, created_at) >= now() - %(since)s::interval)
      -- The same, spelled so that the history's days before it are left out.
      AND (%(since)s::interval IS NULL OR finished_at IS NULL
           OR finished_at >= now() - %(since)s::interval)
      AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
),
held AS (
    SELECT m.*,
           CASE WHEN m.unique_key IS NULL OR m.status = 'pending' THEN NULL
                ELSE coalesce(
                    (SELECT live.id FROM jobs AS live
                     WHERE live.queue = m.queue AND live.unique_key = m.unique_key
                       AND live.unique_key IS NOT NULL
                       AND live.status IN ('pending', 'running')),
                    nullif(first_value(m.id) OVER (PARTITION BY m.queue, m.unique_key
                                                   ORDER BY m.since, m.id), m.id))
           END AS held_by
    FROM matched AS m
),
picked AS (
    SELECT id, status,
           now() + %(spread)s::interval
                   * ((row_number() OVER (ORDER BY since, id) - 1)::float8
                      / count(*) OVER ()) AS run_at
    FROM (SELECT * FROM held WHERE held_by IS NULL ORDER BY since, id LIMIT %(limit)s) AS first
)

-- name: job_requeue_preview
-- What job_requeue would do now, writing nothing: each picked job with the
-- status, run_at and max_attempts it would get (held_by NULL), then each job
-- left out for its unique key, unchanged, with its holder. In the order of
-- the pick.
WITH {picked}
SELECT {job},
       'pending' AS requeued_status,
       CASE WHEN jobs.status = 'pending' THEN least(jobs.run_at, p.run_at) ELSE p.run_at END
           AS requeued_run_at,
       CASE WHEN jobs.status = 'pending' THEN jobs.max_attempts
            ELSE jobs.attempts - jobs.handbacks + %(more)s END
           AS requeued_max_attempts,
       NULL::bigint AS held_by
FROM picked AS p
JOIN all_jobs AS jobs ON jobs.id = p.id
UNION ALL
SELECT {job}, jobs.status, jobs.run_at, jobs.max_attempts, h.held_by
FROM held AS h
JOIN all_jobs AS jobs ON jobs.id = h.id
WHERE h.held_by IS NOT NULL;

-- name: job_requeue
-- The requeue, in one statement: all of it or nothing. Failed and cancelled
-- jobs go back to pending with `more` new tries: attempts is the fencing
-- token and never goes down, max_attempts goes up instead, from the tries
-- used (attempts - handbacks). A pending job
-- keeps its attempts and becomes due at its picked run_at, never later than
-- it was. The status guard skips a job that moved since it was picked (a
-- pending job a worker claimed, a failed one purged or requeued by someone
-- else). Rows: the jobs changed (held_by NULL), then those left out for
-- their unique key, as job_requeue_preview gives them, then those picked
-- but not changed (held_by -1). A picked job that
-- the history holds moves back into jobs (see `leaving`).
WITH {picked},
moved AS (
    UPDATE jobs
    SET status = 'pending',
        run_at = CASE WHEN jobs.status = 'pending' THEN least(jobs.run_at, p.run_at)
                      ELSE p.run_at END,
        max_attempts = CASE WHEN jobs.status = 'pending' THEN jobs.max_attempts
                            ELSE jobs.attempts - jobs.handbacks + %(more)s END,
        finished_at = NULL,
        locked_until = NULL
    FROM picked AS p
    WHERE jobs.id = p.id AND jobs.status = p.status
    RETURNING {job}
),
-- A job picked from the history comes back into jobs under its own id, in
-- this statement: no snapshot sees it in both, or in neither.
leaving AS (
    DELETE FROM jobs_history AS jobs
    USING picked AS p
    WHERE jobs.id = p.id AND jobs.status = p.status
    RETURNING jobs.*, p.run_at AS picked_run_at
),
returned AS (
    INSERT INTO jobs (id, queue, kind, payload, status, priority, attempts, max_attempts,
                      run_at, locked_until, locked_by, last_error, created_at, finished_at,
                      handbacks, unique_key, schedule, tick, claimed_at, limit_key, seated)
    OVERRIDING SYSTEM VALUE
    SELECT id, queue, kind, payload, 'pending', priority, attempts,
           attempts - handbacks + %(more)s, picked_run_at, NULL, locked_by, last_error,
           created_at, NULL, handbacks, unique_key, schedule, tick, claimed_at, limit_key, seated
    FROM leaving
    RETURNING {job}
),
-- Its attempts come back with it.
attempts_leaving AS (
    DELETE FROM attempts_history WHERE job_id = ANY(ARRAY(SELECT id FROM leaving))
    RETURNING *
),
attempts_returned AS (
    INSERT INTO attempts
    SELECT job_id, claim, attempt, worker, outcome, due_at, claimed_at, started_at, finished_at,
           exit_status, signal, error, user_cpu, system_cpu, max_rss_bytes, stdout_head,
           stdout_tail, stdout_bytes, stderr_head, stderr_tail, stderr_bytes, late, recorded_by
    FROM attempts_leaving
    -- A worker that reported after the job moved wrote its record of the
    -- same claim into attempts (see docs/table.md): that one, the worker's
    -- own, is kept.
    ON CONFLICT (job_id, claim) DO NOTHING
)
SELECT *, NULL::bigint AS held_by FROM moved
UNION ALL
SELECT *, NULL::bigint AS held_by FROM returned
UNION ALL
SELECT {job}, h.held_by
FROM held AS h
JOIN all_jobs AS jobs ON jobs.id = h.id
WHERE h.held_by IS NOT NULL
UNION ALL
-- Picked, yet changed by nothing here (held_by -1): its row left the
-- table it was read from while this statement waited for it. A worker
-- moving it into the history is the usual cause, and the row is then where
-- this statement's snapshot cannot see it: the caller asks again for these.
SELECT {job}, -1::bigint
FROM picked AS p
JOIN all_jobs AS jobs ON jobs.id = p.id
WHERE p.id NOT IN (SELECT id FROM moved) AND p.id NOT IN (SELECT id FROM returned);

-- The selection of `cancel`, the same in job_cancel_select and job_cancel:
-- pending and running jobs (those of `statuses`, each status through its
-- own partial index), narrowed by each filter given (NULL: any).

-- name: job_cancel_select
-- The jobs job_cancel would take now, by id, without locking anything;
-- lease_expired says whether a running one's worker is gone (NULL for a
-- pending one).
SELECT {job},
       CASE WHEN status = 'running'
            THEN locked_until < now() OR locked_until IS NULL END AS lease_expired
FROM jobs
WHERE ((status = 'pending' AND 'pending' = ANY(%(statuses)s::text[]))
       OR (status = 'running' AND 'running' = ANY(%(statuses)s::text[])))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
ORDER BY id;

-- name: job_cancel
-- Pending or running -> cancelled, finished now, in one statement. Each row
-- is locked first (in id order), waiting for a worker that is reporting on
-- it at this instant, and the selection is checked again on the row as that
-- report left it: a job that has just ended (done, failed) is not taken, one
-- sent back to pending for a retry is. Then the change is fenced on the
-- status and attempt that were locked, like every move out of running: a
-- race with the job's own end has exactly one winner, and a worker's later
-- report, fenced on status running, matches nothing. attempts is kept.
-- The attempt of a running job is recorded as cancelled (its worker's record
-- adds what the process did). cancelled_from is the status the job had;
-- lease_expired as in job_cancel_select.
WITH cancelled AS (
    UPDATE jobs
    SET status = 'cancelled',
        finished_at = now(),
        locked_until = NULL,  -- locked_by stays: the worker that last held it
        last_error = %(error)s
    FROM (
        SELECT id, status, attempts, locked_until
        FROM jobs
        WHERE ((status = 'pending' AND 'pending' = ANY(%(statuses)s::text[]))
               OR (status = 'running' AND 'running' = ANY(%(statuses)s::text[])))
          AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
          AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
          AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
        ORDER BY id
        FOR UPDATE
    ) AS picked
    WHERE jobs.id = picked.id
      AND jobs.status = picked.status
      AND jobs.attempts = picked.attempts
    RETURNING jobs.*,
              picked.status AS cancelled_from,
              CASE WHEN picked.status = 'running'
                   THEN picked.locked_until < now() OR picked.locked_until IS NULL
              END AS lease_expired
), recorded AS (
    INSERT INTO attempts (job_id, claim, attempt, worker, outcome, due_at, claimed_at, error,
                          recorded_by)
    SELECT id, attempts, attempts - handbacks, locked_by, 'cancelled', run_at, claimed_at,
           last_error, 'cancel'
    FROM cancelled
    WHERE cancelled_from = 'running'
    ON CONFLICT (job_id, claim) DO NOTHING
)
SELECT {job}, jobs.cancelled_from, jobs.lease_expired
FROM cancelled AS jobs;

-- name: workers_notify_cancel
-- Tell the workers which running jobs were cancelled, as (id, attempt)
-- pairs, with the schema so that workers of another schema ignore it; the
-- worker holding one stops it. Delivered when the cancel commits, and only
-- then. A payload must stay under 8000 bytes: callers send a few hundred
-- jobs per notification.
SELECT pg_notify('pgqctl_cancel',
                 json_build_object('schema', current_schema(),
                                   'jobs', %(jobs)s::jsonb)::text);

-- name: job_purge_cutoff
-- Purge deletes rows finished before this instant, fixed when it starts, so
-- it ends even while workers keep finishing jobs.
SELECT now() - %(older_than)s::interval AS cutoff;

-- name: job_purge_count
SELECT count(*)
FROM all_jobs
WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(cutoff)s;

-- name: job_purge_batch
-- One short transaction per batch, in {table}: jobs, or the history's days
-- that purge does not drop whole (the day the cutoff falls in; the status
-- and the cutoff prune the partitions to those before it). SKIP LOCKED so
-- it never waits on a row someone is updating (a requeue), and workers
-- never wait on more than this. ARRAY(...) makes the delete a primary-key
-- lookup of the batch's ids, never a join the planner might run as a scan
-- of the whole table. A job's attempts go with it, by the attempts' primary
-- key. One row: how many jobs went.
WITH gone AS (
    DELETE FROM {table}
    WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(cutoff)s
      AND id = ANY(ARRAY(
        SELECT id
        FROM {table}
        WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(cutoff)s
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING id
), attempts_gone AS (
    DELETE FROM attempts WHERE job_id = ANY(ARRAY(SELECT id FROM gone))
), attempts_history_gone AS (
    DELETE FROM attempts_history WHERE job_id = ANY(ARRAY(SELECT id FROM gone))
)
SELECT count(*) FROM gone;
-- monitor: check and metrics (pgqctl/monitor.py). Besides stats_counts (with
-- no done rows for check), they read these, each through a partial index:
-- their cost follows the live jobs and the jobs finished within a short
-- window, never the history before it.
