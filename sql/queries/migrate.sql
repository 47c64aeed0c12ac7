-- The SQL of pgqctl/migrate.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: migration_log_exists
-- Whether the schema has the migration log. One row or none.
SELECT 1 FROM pg_tables WHERE schemaname = %(schema)s AND tablename = 'pgqctl_migration_log';

-- admin: the operator's commands, stats, leases, list, show, reap, requeue,
-- purge (pgqctl/admin.py). Each status is read through its own partial index
-- (claim, lease, finished), so none of these scans the done history unless
-- asked to (`stats --exact`, `purge`, `list` without --status).

-- name: migrate_lock
-- Serialize migrations of one schema until this transaction ends: a lock
-- that ends with the transaction is never left behind on a pooled server
-- connection. One row.
SELECT pg_advisory_xact_lock(%(key)s, hashtext(%(schema)s));

-- name: migrations_table_exists
-- Whether the schema has a table named pgqctl_migrations (from the catalog,
-- whatever the role may read), and whether this role may read it. One row or
-- none.
SELECT has_table_privilege(format('%%I.%%I', schemaname, tablename), 'SELECT'),
       current_user
FROM pg_tables WHERE schemaname = %(schema)s AND tablename = 'pgqctl_migrations';

-- name: migrations_table_columns
-- The columns of that table, to tell pgqctl's from another's. One row each.
SELECT column_name
FROM information_schema.columns
WHERE table_schema = %(schema)s AND table_name = 'pgqctl_migrations';

-- name: migrations_applied
-- Every migration recorded in the table that pgqctl before the log kept.
-- One row each.
SELECT name, checksum, applied_at FROM pgqctl_migrations;

-- name: migration_log_applied
-- Every applied migration with its checksum. One row each.
SELECT name, checksum, applied_at FROM pgqctl_migration_log;

-- name: jobs_relation_kind
-- The kind of relation (pg_class.relkind) named jobs in the schema, if any.
-- One row or none.
SELECT c.relkind
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = 'jobs';

-- name: schema_exists
-- One row if the schema exists, else none.
SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s;

-- name: migrations_create
-- The bookkeeping table, in the schema the transaction names. No rows.
CREATE TABLE IF NOT EXISTS pgqctl_migrations (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_log_create
-- The migration log, in the schema the transaction names; on its creation,
-- it takes over what the table of earlier pgqctl recorded. serves_from: the
-- oldest migration a client must know to use the schema once this one is
-- applied. No rows.
CREATE TABLE IF NOT EXISTS pgqctl_migration_log (
    name        text PRIMARY KEY,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    serves_from text NOT NULL
);

-- name: migration_log_take_over
-- Copy the migrations an earlier pgqctl recorded into the new log. No rows.
INSERT INTO pgqctl_migration_log (name, checksum, applied_at, serves_from)
SELECT name, checksum, applied_at, %(first)s FROM pgqctl_migrations
ON CONFLICT (name) DO NOTHING;

-- name: migration_record
-- Record one applied migration: a breaking one must be known to every
-- client, an additive one keeps the oldest client served so far. No rows.
INSERT INTO pgqctl_migration_log (name, checksum, serves_from)
SELECT %(name)s, %(checksum)s,
       CASE WHEN %(breaking)s THEN %(name)s
            ELSE coalesce(max(serves_from), %(name)s) END
FROM pgqctl_migration_log;

-- name: migration_record_legacy
-- Record a migration in the table pgqctl before the log reads (it compares
-- its row count with the migrations it knows). No rows.
INSERT INTO pgqctl_migrations (name, checksum) VALUES (%(name)s, %(checksum)s)
ON CONFLICT (name) DO NOTHING;

-- name: migration_legacy_catch_up
-- Record every applied migration in that table too: pgqctl before the log
-- then reads the schema as migrated by a newer pgqctl and refuses it. No
-- rows.
INSERT INTO pgqctl_migrations (name, checksum, applied_at)
SELECT name, checksum, applied_at FROM pgqctl_migration_log
ON CONFLICT (name) DO NOTHING;

-- name: migration_lock_timeout
-- How long a migration's statements wait for a table lock in this
-- transaction. One row.
SELECT set_config('lock_timeout', %(timeout)s, true);

-- name: migration_indexes
-- The schema's indexes of these names: whether each is valid, and whether a
-- CREATE INDEX CONCURRENTLY is building it now. One row each.
SELECT c.relname,
       i.indisvalid,
       EXISTS (SELECT 1 FROM pg_stat_progress_create_index AS p WHERE p.index_relid = c.oid)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_index AS i ON i.indexrelid = c.oid
WHERE n.nspname = %(schema)s AND c.relname = ANY(%(names)s::text[]);

-- name: migration_table_sizes
-- Size on disk and estimated rows of the schema's tables of these names.
-- One row each.
SELECT c.relname, pg_table_size(c.oid), greatest(c.reltuples, 0)::bigint
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = ANY(%(names)s::text[]) AND c.relkind IN ('r', 'p');
