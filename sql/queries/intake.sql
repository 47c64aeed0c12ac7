-- The SQL of pgqctl/intake/: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: jobs_load_privileges
-- How this role may load many jobs, in one row: whether it may create the
-- temporary table a COPY load stages rows in (the TEMP privilege on the
-- database), the sequence of jobs.id if it may draw ids from it (USAGE or
-- UPDATE; NULL if not), which a COPY straight into jobs needs, and the
-- transaction's statement_timeout in seconds (0: none), which bounds how
-- long that COPY may stay open.
-- %(table)s is the table's name as SQL spells it (schema-qualified or not).
SELECT has_database_privilege(current_database(), 'TEMP'),
       CASE WHEN has_sequence_privilege(s, 'USAGE') OR has_sequence_privilege(s, 'UPDATE')
            THEN s::regclass::oid END,
       extract(epoch FROM current_setting('statement_timeout')::interval)::float8
FROM (SELECT pg_get_serial_sequence(%(table)s, 'id') AS s) AS t;

-- name: jobs_draw_ids
-- %(count)s new ids from the sequence of jobs.id (%(sequence)s, its oid),
-- for a COPY straight into jobs. One row: the first and the last, and, only
-- when they are not every id between (another session drew some of those
-- meanwhile), all of them in order: a run of ids costs the client nothing
-- to read.
WITH drawn AS (
    SELECT nextval(%(sequence)s::oid::regclass) AS id FROM generate_series(1, %(count)s)
)
SELECT min(id), max(id),
       CASE WHEN max(id) - min(id) + 1 <> count(*) THEN array_agg(id ORDER BY id) END
FROM drawn;

-- name: transaction_open
-- Only to begin the caller's transaction on a connection outside autocommit
-- (psycopg sends BEGIN before it), so a savepoint can be set in it. One row.
SELECT 1;

-- name: jobs_insert_arrays
-- Jobs from arrays, one element each, in the order given. One row (the id)
-- per job.
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at, limit_key)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay)), limit_key
FROM unnest(%(kind)s::text[], %(payload)s::jsonb[], %(queue)s::text[],
            %(priority)s::integer[], %(max_attempts)s::integer[],
            %(run_at)s::timestamptz[], %(delay)s::float8[], %(limit_key)s::text[])
     WITH ORDINALITY AS t (kind, payload, queue, priority, max_attempts, run_at, delay,
                           limit_key, n)
ORDER BY n
RETURNING id;

-- name: jobs_insert_arrays_unique
-- jobs_insert_arrays for jobs some of which have a unique key: a job whose
-- key a pending or running job of its queue holds (one committed before, one
-- of this statement's earlier rows, or one whose inserting transaction this
-- waits for) is not inserted. Only loads with a key pay for ON CONFLICT's
-- speculative insertion. One row (id, queue, key) per job inserted.
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at, limit_key,
                    unique_key)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay)), limit_key, unique_key
FROM unnest(%(kind)s::text[], %(payload)s::jsonb[], %(queue)s::text[],
            %(priority)s::integer[], %(max_attempts)s::integer[],
            %(run_at)s::timestamptz[], %(delay)s::float8[], %(limit_key)s::text[],
            %(unique_key)s::text[])
     WITH ORDINALITY AS t (kind, payload, queue, priority, max_attempts, run_at, delay,
                           limit_key, unique_key, n)
ORDER BY n
ON CONFLICT (queue, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'running') DO NOTHING
RETURNING id, queue, unique_key;

-- name: jobs_load_create
-- The staging table of a COPY load, gone at the end of the transaction, so
-- that no server connection a pooler hands on keeps it. A second load in the
-- same transaction finds it there (each chunk empties it first): not
-- dropping it keeps psycopg from clearing the caller's prepared statements,
-- as it does after any DROP. n is numeric: the jobs of one line with
-- "kinds" are numbered N, N.001, N.002... (pgqctl/intake/fanout.py).
-- limit_key stays NULL but in the chunks copied with it
-- (jobs_load_copy_limited). No rows.
CREATE TEMPORARY TABLE IF NOT EXISTS pgqctl_enqueue_load (
    n            numeric,
    kind         text,
    payload      jsonb,
    queue        text,
    priority     integer,
    max_attempts integer,
    run_at       timestamptz,
    delay        float8,
    limit_key    text,
    unique_key   text
) ON COMMIT DROP;

-- name: jobs_load_copy
-- Rows of COPY's text format into the staging table: a chunk whose jobs
-- have no limit key (pgqctl/intake/copy_rows.py).
COPY pg_temp.pgqctl_enqueue_load (n, kind, payload, queue, priority, max_attempts, run_at, delay,
                                  unique_key)
FROM STDIN;

-- name: jobs_load_copy_limited
-- jobs_load_copy for a chunk in which some jobs have a limit key: every row
-- has the limit_key field (\N for a job without one).
COPY pg_temp.pgqctl_enqueue_load (n, kind, payload, queue, priority, max_attempts, run_at, delay,
                                  limit_key, unique_key)
FROM STDIN;

-- name: jobs_copy_direct
-- Jobs straight into jobs, with ids drawn by jobs_draw_ids: a chunk whose
-- jobs have no unique key and are due at once (run_at, the default: now()).
-- It fires the same triggers as any INSERT (the one notification included).
COPY {jobs} (id, kind, payload, queue, priority, max_attempts) FROM STDIN;

-- name: jobs_copy_direct_limited
-- jobs_copy_direct for a chunk in which some jobs have a limit key (\N for
-- a job without one).
COPY {jobs} (id, kind, payload, queue, priority, max_attempts, limit_key) FROM STDIN;

-- name: jobs_insert_loaded
-- The staged rows into jobs, in file order. One row (the id) per job.
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at, limit_key)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay)), limit_key
FROM pg_temp.pgqctl_enqueue_load
ORDER BY n
RETURNING id;

-- name: jobs_insert_loaded_unique
-- jobs_insert_loaded for a chunk in which some jobs have a unique key, as
-- jobs_insert_arrays_unique does it. One row (id, queue, key) per job inserted.
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at, limit_key,
                    unique_key)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay)), limit_key, unique_key
FROM pg_temp.pgqctl_enqueue_load
ORDER BY n
ON CONFLICT (queue, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'running') DO NOTHING
RETURNING id, queue, unique_key;

-- name: jobs_unique_holders
-- The pending or running job holding each (queue, key) given, through
-- jobs_unique_key_idx. One row per key held.
SELECT j.queue, j.unique_key, j.id, j.status
FROM unnest(%(queue)s::text[], %(unique_key)s::text[]) AS k (queue, unique_key)
JOIN {jobs} AS j
  ON j.queue = k.queue AND j.unique_key = k.unique_key
 AND j.unique_key IS NOT NULL AND j.status IN ('pending', 'running');

-- name: jobs_load_truncate
-- Empty the staging table for a chunk. No rows.
TRUNCATE pg_temp.pgqctl_enqueue_load;

-- Every transition out of 'running' is fenced on
-- (id, the attempt the worker claimed, status = 'running'): a worker whose
-- lease was lost matches no row and changes nothing.
