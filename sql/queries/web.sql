-- The SQL of pgqctl/web/ (the page `pgqctl web` serves): named blocks, loaded
-- by pgqctl/sql.py with every other file of sql/queries/ (names are unique
-- across them). Every value is a psycopg placeholder; queries are
-- unqualified: each transaction names the schema first.

-- name: web_now
-- The database's clock, which every age on a page is measured against.
SELECT now() AS now;

-- name: web_id_range
-- The lowest and highest job ids, from the two ends of the primary key.
SELECT min(id) AS lowest, max(id) AS highest FROM all_jobs;

-- name: web_minutes
-- The minutes since `since` (the window's start as a value, so that the
-- history's days before it are neither planned nor opened): the jobs done
-- and failed in each (one range of jobs_finished_idx per status: the
-- window's rows only, whatever the history holds), and the median wait
-- from due to started of the attempts that finished in it
-- ({recent_attempts}; none when no worker keeps attempts). Only the
-- minutes that have any.
WITH finished AS (
    SELECT date_trunc('minute', finished_at) AS at,
           count(*) FILTER (WHERE status = 'done') AS done,
           count(*) FILTER (WHERE status = 'failed') AS failed
    FROM (
        SELECT status, finished_at FROM all_jobs
        WHERE status = 'done' AND finished_at > %(since)s::timestamptz
        UNION ALL
        SELECT status, finished_at FROM all_jobs
        WHERE status = 'failed' AND finished_at > %(since)s::timestamptz
    ) AS f
    GROUP BY 1
), waited AS (
    SELECT date_trunc('minute', finished_at) AS at,
           percentile_cont(0.5) WITHIN GROUP (
               -- due_at is a job's run_at: bounded, as plain SQL may set it to
               -- '-infinity' (pgqctl/fartime.py)
               ORDER BY extract(epoch FROM
                   started_at - least(greatest(due_at, '0001-01-01Z'), '10000-01-01Z')
               )) AS wait_p50
    FROM {recent_attempts} AS a
    WHERE started_at IS NOT NULL AND due_at IS NOT NULL
    GROUP BY 1
)
SELECT coalesce(f.at, w.at) AS at, coalesce(f.done, 0)::int AS done,
       coalesce(f.failed, 0)::int AS failed, greatest(w.wait_p50, 0)::float8 AS wait_p50
FROM finished AS f
FULL JOIN waited AS w ON w.at = f.at
ORDER BY 1;
