-- The SQL of pgqctl/db.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: settings_set_local
-- The first statement of every transaction: the queue's schema as its
-- search_path, and any other settings the connection asks for, all ending
-- with the transaction. One row per setting.
SELECT set_config(name, value, true)
FROM unnest(%(names)s::text[], %(values)s::text[]) AS s (name, value);

-- name: server_backend
-- The server process serving this transaction. One row.
SELECT pg_backend_pid();

-- name: server_read_only
-- Whether the server is a standby, and whether it takes no writes at all.
-- One row.
SELECT pg_is_in_recovery(), current_setting('transaction_read_only')::bool;

-- name: schema_state
-- Whether the queue's schema exists and this role may use it, whether it
-- holds pgqctl's bookkeeping and a jobs table, whether this role may read
-- the bookkeeping, and whether that is the migration log (else the table
-- pgqctl kept before it). From the catalogs, so it works whatever the role
-- may see. One row.
SELECT n.oid IS NOT NULL,
       n.oid IS NOT NULL AND has_schema_privilege(n.oid, 'USAGE'),
       coalesce(l.oid, m.oid) IS NOT NULL,
       j.oid IS NOT NULL,
       coalesce(l.oid, m.oid) IS NOT NULL AND has_table_privilege(coalesce(l.oid, m.oid), 'SELECT'),
       l.oid IS NOT NULL
FROM (SELECT 1) AS one
LEFT JOIN pg_namespace AS n ON n.nspname = %(schema)s
LEFT JOIN pg_class AS m ON m.relnamespace = n.oid AND m.relname = 'pgqctl_migrations'
LEFT JOIN pg_class AS l ON l.relnamespace = n.oid AND l.relname = 'pgqctl_migration_log'
LEFT JOIN pg_class AS j ON j.relnamespace = n.oid AND j.relname = 'jobs';

-- name: schema_version
-- The migrations applied in the schema, and the oldest migration a client
-- must know to use it (pgqctl/migrate.py). One row.
SELECT coalesce(array_agg(name), '{}'), max(serves_from) FROM pgqctl_migration_log;

-- name: schema_version_legacy
-- The same, from a schema no pgqctl with the log has migrated yet. One row.
SELECT coalesce(array_agg(name), '{}'), NULL::text FROM pgqctl_migrations;

-- name: server_window_start
-- The start of the last `window` on the server's clock. A statement given
-- it as a value (not `now() - interval`) is planned knowing it, so the
-- history's days before it are never planned nor opened. One row.
SELECT now() - %(window)s::interval AS since;
