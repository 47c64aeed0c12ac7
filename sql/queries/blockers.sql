-- The SQL of pgqctl/blockers.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: lock_holder
-- Who kept a statement of ours waiting for a lock it gave up on after
-- %(waited)s seconds: the other session holding a lock on a table (or index)
-- of the queue's schema whose transaction began before that wait did (one
-- that began later cannot have blocked it), the strongest lock first, then
-- the oldest transaction. Read after the wait is over, when
-- pg_blocking_pids() of our session no longer tells. At most one row.
SELECT l.pid,
       coalesce(a.application_name, ''),
       coalesce(a.state, ''),
       extract(epoch FROM now() - a.xact_start)::float8,
       c.relname,
       l.mode
FROM pg_locks AS l
JOIN pg_class AS c ON c.oid = l.relation
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'relation'
  AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND n.nspname = %(schema)s
  AND l.pid <> pg_backend_pid()
  AND l.pid <> ALL (%(ours)s::int[])
  AND (a.xact_start IS NULL OR a.xact_start <= now() - make_interval(secs => %(waited)s))
ORDER BY array_position(
           ARRAY['AccessExclusiveLock', 'ExclusiveLock', 'ShareRowExclusiveLock',
                 'ShareLock', 'ShareUpdateExclusiveLock', 'RowExclusiveLock',
                 'RowShareLock', 'AccessShareLock'],
           l.mode),
         a.xact_start NULLS LAST
LIMIT 1;
