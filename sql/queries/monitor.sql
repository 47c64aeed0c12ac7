-- The SQL of pgqctl/monitor.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: monitor_running_since
-- Per queue with running jobs: seconds since the running job claimed first
-- was claimed (claimed_at; its run_at for a job a worker older than the
-- attempt history claimed), from jobs_lease_idx's rows. One row per queue.
-- An infinite time (plain SQL) cannot be subtracted from: it is bounded first
-- to the years a Python datetime holds (pgqctl/fartime.py); run_at is never
-- NULL, nor then the minimum of a queue's.
SELECT queue,
       extract(epoch FROM
           now() - least(greatest(min(coalesce(claimed_at, run_at)), '0001-01-01Z'),
                         '10000-01-01Z')
       )::float8 AS oldest_running_age_seconds
FROM jobs
WHERE status = 'running'
GROUP BY queue;

-- name: monitor_finished_since
-- Per queue: the jobs of one finished status (jobs.py FINISHED; run once for
-- each) that finished after `since` (the window's start as a value: the
-- history's days before it are not planned), from the window's range of
-- jobs_finished_idx (status, finished_at) only: as many rows as finished in
-- it, whatever the history before it holds. One status a statement, sent as
-- a value: both columns then bound the range, where a list of statuses would
-- match the index's predicate whole and bound nothing but finished_at, so
-- read the whole index. One row per queue that has any.
SELECT queue, count(*) AS finished
FROM all_jobs
WHERE status = %(status)s
  AND finished_at > %(since)s::timestamptz
GROUP BY queue;

-- name: monitor_leases_soonest
-- `top`: the `limit` running jobs whose leases end soonest (a job without a
-- lease first: nobody holds it), as lease_list gives them. Sorts the running
-- jobs only (jobs_lease_idx's rows), however long the history. A lease
-- until 'infinity' is bounded as in lease_list.
SELECT {job},
       locked_until < now() OR locked_until IS NULL AS expired,
       round(extract(epoch FROM
           CASE WHEN locked_until > '10000-01-01Z' THEN '10000-01-01Z'
                WHEN locked_until < '0001-01-01Z' THEN '0001-01-01Z'
                ELSE locked_until END - now()
       )::numeric, 3) AS seconds_left
FROM jobs
WHERE status = 'running'
ORDER BY locked_until NULLS FIRST, id
LIMIT %(limit)s;

-- doctor: vacuum, bloat and xmin-horizon diagnosis of the queue's tables
-- (pgqctl/doctor.py). Catalogs and statistics views only, but for
-- doctor_pgstattuple and doctor_pgstatindex, which read a table or an index
-- whole (run only when the extension is there and this role may use it).
-- Nothing here changes anything: doctor prints the SQL to act, never runs it.

-- name: monitor_recent_attempts
-- Put in place of {recent_attempts} in the three statements below: the
-- attempts that finished after `since` (the window's start as a value),
-- from attempts and from the history's days that can hold them. An
-- attempt ends before its job does, so its job's day is at or after the
-- window's start: the days before are neither planned nor opened (a
-- record a worker made after its job was reaped and moved may be left out).
(SELECT job_id, outcome, due_at, started_at, finished_at
 FROM attempts
 WHERE finished_at > %(since)s::timestamptz
 UNION ALL
 SELECT job_id, outcome, due_at, started_at, finished_at
 FROM attempts_history
 WHERE finished_at > %(since)s::timestamptz AND job_finished_at > %(since)s::timestamptz)

-- name: monitor_attempt_times
-- The attempts that finished after `since` (attempts_finished_idx's range;
-- {recent_attempts}) and started, with their job's queue and kind (a purged job's are left
-- out): per queue and kind, for how long each ran (started to finished) and
-- how long it waited (due to started; not known for a job claimed before
-- the attempt history), how many fall in each bucket of `bounds`
-- (width_bucket: bucket 0 below the first bound, bucket i from bound i to
-- the next) and their sum. due_at is a job's run_at, which plain SQL may
-- set to '-infinity': bounded as in lease_list.
WITH recent AS MATERIALIZED (
    SELECT j.queue, j.kind,
           extract(epoch FROM a.finished_at - a.started_at)::float8 AS ran,
           extract(epoch FROM
               a.started_at - CASE WHEN a.due_at > '10000-01-01Z' THEN '10000-01-01Z'
                                  WHEN a.due_at < '0001-01-01Z' THEN '0001-01-01Z'
                                  ELSE a.due_at END
           )::float8 AS waited
    FROM {recent_attempts} AS a
    JOIN all_jobs AS j ON j.id = a.job_id
    WHERE a.started_at IS NOT NULL
      -- A job finishes with its last attempt or later: the history's days
      -- before the window (`since`, its start as a value) hold none of
      -- these jobs, and are not planned.
      AND (j.finished_at IS NULL OR j.finished_at > %(since)s::timestamptz)
)
SELECT 'ran' AS measure, queue, kind, width_bucket(ran, %(bounds)s::float8[]) AS bucket,
       count(*) AS attempts, sum(ran) AS seconds
FROM recent
GROUP BY queue, kind, bucket
UNION ALL
SELECT 'waited', queue, kind, width_bucket(greatest(waited, 0), %(bounds)s::float8[]),
       count(*), sum(greatest(waited, 0))
FROM recent
WHERE waited IS NOT NULL
GROUP BY queue, kind, 4;

-- name: monitor_kind_run_times
-- `top`: per kind, the attempts that started and finished after `since`
-- ({recent_attempts}; a purged job's are left out), and the
-- 50th, 95th and 99th percentiles of how long they ran; the busiest first.
SELECT j.kind, count(*) AS attempts,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM a.finished_at - a.started_at)) AS percentiles
FROM {recent_attempts} AS a
JOIN all_jobs AS j ON j.id = a.job_id
WHERE a.started_at IS NOT NULL
  AND (j.finished_at IS NULL OR j.finished_at > %(since)s::timestamptz)
GROUP BY j.kind
ORDER BY count(*) DESC, j.kind;

-- name: monitor_attempt_outcomes
-- The attempts that finished after `since` ({recent_attempts}), per queue,
-- kind and outcome (started or not; a purged job's are left out).
SELECT j.queue, j.kind, a.outcome, count(*) AS attempts
FROM {recent_attempts} AS a
JOIN all_jobs AS j ON j.id = a.job_id
WHERE (j.finished_at IS NULL OR j.finished_at > %(since)s::timestamptz)
GROUP BY 1, 2, 3;
