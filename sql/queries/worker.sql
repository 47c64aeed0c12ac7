-- The SQL of pgqctl/worker/: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: worker_listen
-- Hear about new jobs (the jobs table's insert trigger notifies). No rows.
LISTEN pgqctl_jobs;

-- name: worker_listen_schedules
-- Schedules added, changed or removed: the worker reads them again.
LISTEN pgqctl_schedules;

-- name: worker_listen_limits
-- Limits set or removed (`pgqctl limit` notifies): claim as they require.
LISTEN pgqctl_limits;

-- name: worker_listen_cancel
-- Hear about running jobs an operator cancelled (`pgqctl cancel` notifies).
-- No rows.
LISTEN pgqctl_cancel;
