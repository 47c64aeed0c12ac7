-- The SQL of pgqctl/failures.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: failure_groups
-- Failed jobs (status failed: out of attempts, or never runnable), of these
-- queues and kinds, finished within `since`, grouped by kind and cause, the
-- most frequent first, at most `limit` groups. A job's cause is the first
-- line of its last_error, then, when more lines follow (a worker's "exit
-- status 1" and the job's output), the last line that is not blank: a
-- program's last words are most often its error. In a cause, numbers are
-- one placeholder (N) and so are UUIDs (U), but a first line that says how
-- a program ended keeps its exit status or signal: "invoice 1187 has no
-- customer" and "invoice 2204 has no customer" are one cause, "exit status
-- 1" and "exit status 2" are two. Read through jobs_finished_idx (status,
-- finished_at); each line is cut and matched once per job (MATERIALIZED).
-- Each group: its job count, the first and last finished_at, and the id and
-- cause of the job that failed last, as an example. `total` counts every
-- failed job matched.
WITH failed AS MATERIALIZED (
    SELECT id, kind, finished_at,
           split_part(e, E'\n', 1) AS first_line,
           CASE WHEN strpos(e, E'\n') > 0
                THEN btrim(reverse(split_part(reverse(rtrim(e, E'\n\r\t ')), E'\n', 1)))
           END AS last_line
    FROM all_jobs, left(coalesce(last_error, ''), 65536) AS e
    WHERE status = 'failed'
      AND (%(since)s::interval IS NULL OR finished_at >= now() - %(since)s::interval)
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
), caused AS MATERIALIZED (
    SELECT id, kind, finished_at, first_line,
           CASE WHEN last_line = '' OR last_line = first_line
                     OR last_line LIKE '[output truncated:%%'
                THEN NULL ELSE last_line END AS last_line
    FROM failed
), grouped AS MATERIALIZED (
    SELECT id, kind, finished_at,
           first_line || coalesce(': ' || last_line, '') AS cause,
           CASE WHEN first_line ~ '^(exit status -?[0-9]+|killed by signal [0-9]+)'
                THEN first_line
                ELSE regexp_replace(
                         regexp_replace(first_line, '[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-'
                                                    '[0-9a-fA-F]{12}', 'U', 'g'),
                         '[0-9]+', 'N', 'g') END
           || coalesce(': ' || regexp_replace(
                  regexp_replace(last_line, '[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}',
                                 'U', 'g'),
                  '[0-9]+', 'N', 'g'), '') AS pattern
    FROM caused
)
SELECT kind, pattern, count(*) AS jobs,
       min(finished_at) AS first_seen, max(finished_at) AS last_seen,
       (array_agg(id ORDER BY finished_at DESC, id DESC))[1] AS example_id,
       (array_agg(cause ORDER BY finished_at DESC, id DESC))[1] AS example,
       sum(count(*)) OVER () AS total
FROM grouped
GROUP BY kind, pattern
ORDER BY count(*) DESC, max(finished_at) DESC, kind, pattern
LIMIT %(limit)s;
