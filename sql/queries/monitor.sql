-- The SQL of pgqctl/monitor.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: monitor_running_since
-- Per queue with running jobs: seconds since the running job claimed first
-- was claimed (claimed_at; its run_at for a job a worker older than the
-- attempt history claimed), from jobs_lease_idx's rows. One row per queue.
SELECT queue,
       extract(epoch FROM now() - min(coalesce(claimed_at, run_at)))::float8
           AS oldest_running_age_seconds
FROM jobs
WHERE status = 'running'
GROUP BY queue;

-- name: monitor_finished_since
-- Per queue: the jobs of one finished status (jobs.py FINISHED; run once for
-- each) that finished within `window`, from the window's range of
-- jobs_finished_idx (status, finished_at) only: as many rows as finished in
-- it, whatever the history before it holds. One status a statement, sent as
-- a value: both columns then bound the range, where a list of statuses would
-- match the index's predicate whole and bound nothing but finished_at, so
-- read the whole index. One row per queue that has any.
SELECT queue, count(*) AS finished
FROM jobs
WHERE status = %(status)s
  AND finished_at > now() - %(window)s::interval
GROUP BY queue;

-- name: monitor_leases_soonest
-- `top`: the `limit` running jobs whose leases end soonest (a job without a
-- lease first: nobody holds it), as lease_list gives them. Sorts the running
-- jobs only (jobs_lease_idx's rows), however long the history.
SELECT {job},
       locked_until < now() OR locked_until IS NULL AS expired,
       round(extract(epoch FROM locked_until - now())::numeric, 3) AS seconds_left
FROM jobs
WHERE status = 'running'
ORDER BY locked_until NULLS FIRST, id
LIMIT %(limit)s;

-- doctor: vacuum, bloat and xmin-horizon diagnosis of the queue's tables
-- (pgqctl/doctor.py). Catalogs and statistics views only, but for
-- doctor_pgstattuple and doctor_pgstatindex, which read a table or an index
-- whole (run only when the extension is there and this role may use it).
-- Nothing here changes anything: doctor prints the SQL to act, never runs it.
