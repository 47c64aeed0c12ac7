-- The SQL of pgqctl/doctor.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: doctor_access
-- What this role may see: every session's transaction (superuser or
-- pg_read_all_stats, which pg_monitor has), and how many client sessions of
-- this database it cannot see into. One row.
SELECT r.rolsuper AS superuser,
       r.rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') AS sees_all_sessions,
       (SELECT count(*) FROM pg_stat_activity AS a
        WHERE a.backend_type IS NULL AND a.datname = current_database()) AS hidden_sessions
FROM pg_roles AS r
WHERE r.rolname = current_user;

-- name: doctor_extension
-- pgstattuple, when installed: its schema and whether this role may run it
-- (superuser or pg_stat_scan_tables, which pg_monitor has). One row or none.
SELECT n.nspname AS schema,
       has_function_privilege(format('%%I.pgstattuple(regclass)', n.nspname), 'EXECUTE')
           AS usable
FROM pg_extension AS e
JOIN pg_namespace AS n ON n.oid = e.extnamespace
WHERE e.extname = 'pgstattuple';

-- name: doctor_tables
-- The queue's tables (those of `names` that exist in the schema), jobs
-- first: their statistics counters, sizes, storage parameters, and an
-- estimate of the bytes their live rows need (live rows times the average
-- width ANALYZE measured, plus tuple header and line pointer, at the
-- table's fillfactor; NULL until analyzed). One row each. A partitioned
-- table (the history) is one row, its partitions' sizes and live and dead
-- rows summed; its partitions are not listed.
WITH widths AS (
    SELECT tablename, sum((1 - null_frac) * avg_width) AS width
    FROM pg_stats
    WHERE schemaname = %(schema)s AND NOT inherited
    GROUP BY tablename
)
SELECT c.oid::bigint AS oid, c.relname AS name,
       -- A partitioned table's own statistics are zeros: its partitions' count.
       CASE WHEN c.relkind = 'p' THEN parts.live ELSE s.n_live_tup END AS n_live_tup,
       CASE WHEN c.relkind = 'p' THEN parts.dead ELSE s.n_dead_tup END AS n_dead_tup,
       s.n_mod_since_analyze, s.n_ins_since_vacuum,
       s.n_tup_ins, s.n_tup_upd, s.n_tup_del, s.n_tup_hot_upd,
       s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze,
       s.vacuum_count, s.autovacuum_count, s.analyze_count, s.autoanalyze_count,
       extract(epoch FROM now() - greatest(s.last_vacuum, s.last_autovacuum))::float8
           AS seconds_since_vacuum,
       coalesce(parts.table_bytes, pg_table_size(c.oid)) AS table_bytes,
       coalesce(parts.index_bytes, pg_indexes_size(c.oid)) AS index_bytes,
       coalesce(c.reloptions, '{}') AS reloptions,
       (ceil(greatest(s.n_live_tup, 0) * (24 + 4 + ceil(w.width / 8.0) * 8)
             / ((current_setting('block_size')::int - 24)
                * coalesce((SELECT split_part(o, '=', 2)::int FROM unnest(c.reloptions) AS o
                            WHERE o LIKE 'fillfactor=%%'), 100) / 100.0))
        * current_setting('block_size')::int)::bigint AS needed_bytes
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_all_tables AS s ON s.relid = c.oid
LEFT JOIN widths AS w ON w.tablename = c.relname
LEFT JOIN LATERAL (
    SELECT sum(pg_stat_get_live_tuples(t.relid))::bigint AS live,
           sum(pg_stat_get_dead_tuples(t.relid))::bigint AS dead,
           sum(pg_table_size(t.relid))::bigint AS table_bytes,
           sum(pg_indexes_size(t.relid))::bigint AS index_bytes
    FROM pg_partition_tree(c.oid) AS t
    WHERE t.isleaf
) AS parts ON c.relkind = 'p'
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relname = ANY(%(names)s::text[])
ORDER BY c.relname <> 'jobs', c.relname;

-- name: doctor_indexes
-- The indexes of those tables: size, scans, whether btree, and an estimate
-- of the bytes their entries need (entries at the last vacuum or analyze
-- times the key columns' average width, plus index tuple header and line
-- pointer, at btree's 90%% fillfactor; NULL without statistics). One row each.
SELECT t.relname AS table_name, ic.oid::bigint AS oid, ic.relname AS name,
       am.amname = 'btree' AS btree, i.indpred IS NOT NULL AS partial,
       pg_relation_size(ic.oid) AS bytes, si.idx_scan AS scans,
       (ceil(greatest(ic.reltuples, 0)
             * (8 + 4 + ceil((SELECT sum(st.avg_width)
                               FROM pg_attribute AS a
                               JOIN pg_stats AS st
                                 ON st.schemaname = %(schema)s AND st.tablename = t.relname
                                AND st.attname = a.attname AND NOT st.inherited
                               WHERE a.attrelid = t.oid AND a.attnum = ANY(i.indkey)) / 8.0) * 8)
             / ((current_setting('block_size')::int - 24 - 16) * 0.9))
        * current_setting('block_size')::int)::bigint AS needed_bytes
FROM pg_index AS i
JOIN pg_class AS ic ON ic.oid = i.indexrelid
JOIN pg_class AS t ON t.oid = i.indrelid
JOIN pg_am AS am ON am.oid = ic.relam
LEFT JOIN pg_stat_all_indexes AS si ON si.indexrelid = ic.oid
WHERE t.oid = ANY(%(tables)s::bigint[]::oid[])
ORDER BY t.relname <> 'jobs', t.relname, ic.relname;

-- name: doctor_pgstattuple
-- A table's exact figures, from reading it whole ({ext}: pgstattuple's
-- schema). One row.
SELECT table_len, tuple_count, tuple_len, dead_tuple_count, dead_tuple_len, free_space
FROM {ext}.pgstattuple(%(oid)s::bigint::oid::regclass);

-- name: doctor_pgstatindex
-- A btree index's exact figures, from reading it whole. One row.
SELECT index_size, avg_leaf_density, leaf_fragmentation
FROM {ext}.pgstatindex(%(oid)s::bigint::oid::regclass);

-- name: doctor_sessions
-- Sessions of this database whose transaction holds an xid or a snapshot
-- (xmin), oldest first, but this one, autovacuum's (vacuum's own xmin holds
-- nobody back) and WAL senders (doctor_standbys), and a pgqctl worker's
-- own transaction younger than a second (its claims and reports: a busy
-- worker is always in one, and holds the horizon back by no more than that).
-- Sessions of other databases do not hold back this database's tables. One
-- row each.
SELECT a.pid, a.usename AS "user", a.application_name AS application,
       host(a.client_addr) AS client_addr, a.state, a.backend_type, a.datname AS database,
       a.backend_xid::text AS xid, a.backend_xmin::text AS xmin,
       greatest(age(a.backend_xid), age(a.backend_xmin)) AS xid_age,
       greatest(extract(epoch FROM now() - a.xact_start), 0)::float8 AS transaction_age_seconds,
       a.xact_start, a.query_start, left(a.query, 300) AS query
FROM pg_stat_activity AS a
WHERE (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
  AND a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND coalesce(a.backend_type, 'hidden') NOT IN ('autovacuum worker', 'walsender')
  AND NOT (a.application_name LIKE 'pgqctl worker %%'
           AND coalesce(a.xact_start > now() - interval '1 second', false))
ORDER BY xid_age DESC, a.pid;

-- name: doctor_prepared
-- Prepared transactions (two-phase commit) of this database, oldest first:
-- each holds its horizon until COMMIT PREPARED or ROLLBACK PREPARED, run in
-- this database. One row each.
SELECT gid, owner, database,
       transaction::text AS xid, age(transaction) AS xid_age, prepared,
       extract(epoch FROM now() - prepared)::float8 AS age_seconds
FROM pg_prepared_xacts
WHERE database = current_database()
ORDER BY prepared, gid;

-- name: doctor_slots
-- Replication slots holding an xmin (every database's tables: a standby's
-- hot_standby_feedback through its slot) or a catalog_xmin (the system
-- catalogs only: logical decoding). One row each.
SELECT slot_name, slot_type, plugin, database, active, active_pid,
       database IS NULL OR database = current_database() AS this_database,
       xmin::text AS xmin, age(xmin) AS xmin_age,
       catalog_xmin::text AS catalog_xmin, age(catalog_xmin) AS catalog_xmin_age,
       wal_status
FROM pg_replication_slots
WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
ORDER BY greatest(age(xmin), age(catalog_xmin)) DESC, slot_name;

-- name: doctor_standbys
-- Standbys whose hot_standby_feedback holds the horizon through their WAL
-- sender (a standby with a slot holds it through the slot instead). One row
-- each; their figures are NULL to a role that cannot see other sessions.
SELECT pid, usename AS "user", application_name AS application,
       host(client_addr) AS client_addr, state,
       backend_xmin::text AS xmin, age(backend_xmin) AS xmin_age, reply_time
FROM pg_stat_replication
WHERE backend_xmin IS NOT NULL
ORDER BY age(backend_xmin) DESC, pid;

-- name: doctor_autovacuum
-- The server's autovacuum settings, and what its workers vacuum now. One row.
SELECT current_setting('autovacuum') = 'on' AS enabled,
       current_setting('track_counts') = 'on' AS track_counts,
       current_setting('autovacuum_max_workers')::int AS max_workers,
       extract(epoch FROM current_setting('autovacuum_naptime')::interval)::float8
           AS naptime_seconds,
       current_setting('autovacuum_vacuum_threshold')::bigint AS vacuum_threshold,
       current_setting('autovacuum_vacuum_scale_factor')::float8 AS vacuum_scale_factor,
       current_setting('autovacuum_vacuum_insert_threshold')::bigint AS vacuum_insert_threshold,
       current_setting('autovacuum_vacuum_insert_scale_factor')::float8
           AS vacuum_insert_scale_factor,
       current_setting('autovacuum_analyze_threshold')::bigint AS analyze_threshold,
       current_setting('autovacuum_analyze_scale_factor')::float8 AS analyze_scale_factor,
       ARRAY(SELECT coalesce(nullif(a.query, ''), '?') FROM pg_stat_activity AS a
             WHERE a.backend_type = 'autovacuum worker' ORDER BY a.pid) AS workers;

-- workers: the registry of running workers (pgqctl/registry.py), written by
-- the workers themselves (worker_beat and its neighbours, in the claims
-- section).
