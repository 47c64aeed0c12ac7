-- The SQL of pgqctl/history.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: history_days_before
-- The days of the history's done jobs that end at or before `cutoff`,
-- oldest first: what purge drops whole. Only the partitions
-- pgqctl_history_add_days made (their names say their day).
SELECT to_date(substring(c.relname FROM '_([0-9]{8})$'), 'YYYYMMDD') AS day
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
-- By the search_path, as every query here: the queue's schema is first,
-- whatever its name needs quoting.
WHERE i.inhparent = 'jobs_history_done'::regclass
  AND c.relname ~ '^jobs_history_done_[0-9]{8}$'
  AND (to_date(substring(c.relname FROM '_([0-9]{8})$'), 'YYYYMMDD') + 1)::timestamp
      AT TIME ZONE 'UTC' <= %(cutoff)s
ORDER BY 1;

-- name: history_drop_day
-- One day of done jobs dropped whole, with their attempts; its rows by the
-- statistics (-1: unknown, NULL: no such partition). One row.
SELECT pgqctl_history_drop_day(%(day)s);

-- name: history_add_days
-- The history's partitions from `first` (NULL: today) to `ahead` days after
-- today, UTC days by the server's clock, those missing; how many were made.
-- One row.
SELECT pgqctl_history_add_days(
    coalesce(%(first)s::date, (now() AT TIME ZONE 'UTC')::date),
    (now() AT TIME ZONE 'UTC')::date + %(ahead)s::int);

-- name: history_now
-- The server's clock, which the move's cutoff is measured against. One row.
SELECT now() AS now;

-- name: history_lock_limit
-- The transaction's lock_timeout (the command's --lock-timeout), in
-- seconds; 0: none. One row.
SELECT setting::float8 / 1000 AS seconds FROM pg_settings WHERE name = 'lock_timeout';

-- name: history_lock_timeout
-- How long a drop waits for the history's lock in this transaction. One row.
SELECT set_config('lock_timeout', %(timeout)s, true);

-- name: history_move_days
-- The first `most` UTC days, oldest first, that hold done jobs
-- history_move_batch would move: one probe of jobs_finished_idx a day
-- (from `floor`, then from the start of the day after the last one found),
-- however many rows each day holds. Only days with jobs get a partition: one job that plain
-- SQL says finished in 2001 needs one day, not every day since.
WITH RECURSIVE found AS (
    SELECT (SELECT min(finished_at) FROM jobs
            WHERE status = 'done' AND finished_at < %(cutoff)s
              AND finished_at >= %(floor)s) AS at,
           1 AS n
    UNION ALL
    SELECT (SELECT min(j.finished_at) FROM jobs AS j
            WHERE j.status = 'done' AND j.finished_at < %(cutoff)s
              AND j.finished_at >= ((f.at AT TIME ZONE 'UTC')::date + 1)::timestamp
                                   AT TIME ZONE 'UTC'),
           f.n + 1
    FROM found AS f
    WHERE f.at IS NOT NULL AND f.n < %(most)s
)
SELECT (at AT TIME ZONE 'UTC')::date AS day FROM found WHERE at IS NOT NULL ORDER BY 1;

-- name: history_make_days
-- The history's partitions of these UTC days, those missing (each day
-- alone: the days between are not made); how many were made. One row.
SELECT coalesce(sum(pgqctl_history_add_days(d, d)), 0)::int
FROM unnest(%(days)s::date[]) AS d;

-- name: history_move_batch
-- Up to `batch_size` jobs of `status` that finished before `cutoff`, the
-- oldest first, moved from jobs into the history with their attempts in
-- one statement: no snapshot sees a job or an attempt in both, or in
-- neither. SKIP LOCKED passes over a row
-- someone is changing (a requeue, a purge); the status guard on the delete
-- leaves a row that changed since it was picked. jobs_history has jobs'
-- columns in jobs' order. A job that plain SQL gave a finished_at before
-- 2000 (or '-infinity') has no day to go to: it stays in jobs (`floor` is
-- never earlier). One row: how many moved, and the last finished_at among
-- them, where the next batch may start: the index entries of the rows
-- moved before stay until a vacuum, and a walk from the start of the
-- range would read them all again, batch after batch.
WITH picked AS (
    SELECT id
    FROM jobs
    -- The IN list is jobs_finished_idx's predicate: the worker's plans are
    -- generic, and `status = $1` alone does not show the planner that the
    -- partial index holds the rows, so it scanned and sorted the whole of
    -- jobs for every batch (8 s a batch at 10 million finished rows).
    WHERE status = %(status)s AND status IN ('done', 'failed', 'cancelled')
      AND finished_at < %(cutoff)s AND finished_at >= %(floor)s
    ORDER BY finished_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM jobs
    WHERE id = ANY(ARRAY(SELECT id FROM picked)) AND status = %(status)s
    RETURNING *
), archived AS (
    INSERT INTO jobs_history SELECT * FROM moved
    RETURNING finished_at
), attempts_moved AS (
    -- A join, not = ANY(array): with few attempts per job the planner
    -- scans attempts, and each row's search of a 2,000-id array made the
    -- move 2x slower.
    DELETE FROM attempts WHERE job_id IN (SELECT id FROM moved)
    RETURNING *
), attempts_archived AS (
    INSERT INTO attempts_history
    SELECT a.*, m.status, m.finished_at
    FROM attempts_moved AS a
    JOIN moved AS m ON m.id = a.job_id
)
SELECT count(*), max(finished_at) FROM archived;

-- name: history_state
-- How far the move is behind: the oldest finished_at of a job still in jobs
-- that the move would take (jobs_finished_idx, one end of each status's
-- range; NULL: none). One row.
SELECT least((SELECT min(finished_at) FROM jobs WHERE status = 'done'
              AND finished_at BETWEEN '2000-01-01Z' AND '9999-12-31Z'),
             (SELECT min(finished_at) FROM jobs WHERE status = 'failed'
              AND finished_at BETWEEN '2000-01-01Z' AND '9999-12-31Z'),
             (SELECT min(finished_at) FROM jobs WHERE status = 'cancelled'
              AND finished_at BETWEEN '2000-01-01Z' AND '9999-12-31Z'))
           AS oldest_in_jobs,
       now() AS now;

-- name: history_read_locks
-- What a read of one job and its attempts by id locks (the plan opens every
-- partition of the history and each of their indexes, as no day can be
-- left out by an id), and the lock table's size: max_locks_per_transaction
-- slots for each connection and prepared transaction the server allows.
-- One row.
WITH parts AS (
    SELECT relid FROM pg_partition_tree('jobs_history'::regclass)
    UNION ALL
    SELECT relid FROM pg_partition_tree('attempts_history'::regclass)
)
SELECT (SELECT count(*) FROM parts)
       + (SELECT count(*) FROM pg_index WHERE indrelid IN (SELECT relid FROM parts))
       AS read_locks,
       (SELECT count(*) FROM pg_partition_tree('jobs_history_done'::regclass)
        WHERE isleaf) AS days,
       current_setting('max_locks_per_transaction')::int AS max_locks,
       current_setting('max_locks_per_transaction')::int
       * (current_setting('max_connections')::int
          + current_setting('max_prepared_transactions')::int) AS lock_slots;
