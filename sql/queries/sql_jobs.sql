-- The SQL of pgqctl/sql_jobs.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: sql_job_limits
-- A SQL handler's job (pgqctl/sql_jobs.py), first in its transaction, which
-- leaves the session's search_path (where the operator's tables and
-- procedures are) as it is: the job's timeout (0: none) bounds the
-- operator's statement, rather than the worker's statement and lock timeouts.
SELECT set_config('statement_timeout', %(timeout_ms)s, true),
       set_config('lock_timeout', '0', true);

-- name: type_name
-- A type's name as SQL writes it (jsonb, bigint, character varying).
SELECT format_type(%(oid)s, NULL);

-- name: sql_job_complete
-- A SQL handler's job, last in its transaction: done, fenced as the
-- worker's report is. No row: the attempt is no longer the one running, and
-- the transaction (the statement's writes with it) rolls back.
UPDATE jobs
SET status = 'done', finished_at = now(), locked_until = NULL
WHERE id = %(id)s AND attempts = %(attempt)s AND status = 'running'
RETURNING id;
