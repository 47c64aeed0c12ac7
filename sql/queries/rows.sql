-- The SQL of pgqctl/rows.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: job_columns
-- A job as the read commands read it, put in place of {job} in their
-- statements (pgqctl/rows.py): every column of jobs, but payload and
-- last_error only as a prefix of `payload_chars` and `error_chars`
-- characters (one more than is shown, so that a cut is seen), as text. A row
-- written with plain SQL may hold a payload of any size or depth: the
-- commands never take more than the prefix, nor decode a value psycopg's
-- loader could not.
jobs.id, jobs.queue, jobs.kind,
left(jobs.payload::text, %(payload_chars)s) AS payload_head,
jobs.status, jobs.priority, jobs.attempts, jobs.max_attempts, jobs.run_at,
jobs.locked_until, jobs.locked_by,
left(jobs.last_error, %(error_chars)s) AS last_error_head,
jobs.created_at, jobs.finished_at, jobs.handbacks, jobs.unique_key, jobs.schedule, jobs.tick,
jobs.claimed_at, jobs.limit_key, jobs.seated
