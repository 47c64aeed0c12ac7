-- Runtime queries, one named block each, loaded by pgqctl/sql.py.
--
-- Every value is a psycopg placeholder (%(name)s); nothing is pasted in.
-- Queries are unqualified: the connection's search_path names the schema.

-- ---- enqueue (pgqctl/enqueue.py) -------------------------------------------
-- These blocks write {jobs} for the table: the enqueue API composes it with
-- psycopg.sql.Identifier, schema-qualified when its caller names a schema and
-- bare (the search_path) otherwise. A job is due at run_at when given, else at
-- the transaction's now() plus delay seconds. ORDER BY n hands out ids in
-- input order, so the returned ids line up with the jobs given.

-- name: jobs_insert_arrays
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay))
FROM unnest(%(kind)s::text[], %(payload)s::jsonb[], %(queue)s::text[],
            %(priority)s::integer[], %(max_attempts)s::integer[],
            %(run_at)s::timestamptz[], %(delay)s::float8[])
     WITH ORDINALITY AS t (kind, payload, queue, priority, max_attempts, run_at, delay, n)
ORDER BY n
RETURNING id;

-- name: jobs_load_create
CREATE TEMPORARY TABLE pgqctl_enqueue_load (
    n            bigint,
    kind         text,
    payload      jsonb,
    queue        text,
    priority     integer,
    max_attempts integer,
    run_at       timestamptz,
    delay        float8
) ON COMMIT DROP;

-- name: jobs_load_copy
COPY pg_temp.pgqctl_enqueue_load (n, kind, payload, queue, priority, max_attempts, run_at, delay)
FROM STDIN;

-- name: jobs_insert_loaded
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay))
FROM pg_temp.pgqctl_enqueue_load
ORDER BY n
RETURNING id;

-- name: jobs_load_truncate
TRUNCATE pg_temp.pgqctl_enqueue_load;

-- name: jobs_load_drop
DROP TABLE pg_temp.pgqctl_enqueue_load;
