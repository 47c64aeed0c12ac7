-- The SQL of pgqctl/embedded.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: embedded_workers_connected
-- The workers connected to a server, in any database (by the
-- application_name each worker gives its connections). One row per worker.
SELECT DISTINCT application_name
FROM pg_stat_activity
WHERE application_name LIKE 'pgqctl worker %'
ORDER BY application_name;
