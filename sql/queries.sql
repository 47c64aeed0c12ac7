-- Runtime queries, one named block each, loaded by pgqctl/sql.py. Each
-- section belongs to one library module (pgqctl/<section>.py); each block
-- says what it does and how many rows it returns.
--
-- Every value is a psycopg placeholder (%(name)s); nothing is pasted in.
-- Queries are unqualified: each transaction names the schema first
-- (settings_set_local), so nothing depends on a session's state.

-- ---------------------------------------------------------------------------
-- db: connections and the checks every command makes (pgqctl/db.py).
-- ---------------------------------------------------------------------------

-- name: settings_set_local
-- The first statement of every transaction: the queue's schema as its
-- search_path, and any other settings the connection asks for, all ending
-- with the transaction. One row per setting.
SELECT set_config(name, value, true)
FROM unnest(%(names)s::text[], %(values)s::text[]) AS s (name, value);

-- name: server_backend
-- The server process serving this transaction. One row.
SELECT pg_backend_pid();

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

-- name: migration_log_exists
-- Whether the schema has the migration log. One row or none.
SELECT 1 FROM pg_tables WHERE schemaname = %(schema)s AND tablename = 'pgqctl_migration_log';

-- ---------------------------------------------------------------------------
-- admin: the operator's commands, stats, leases, list, show, reap, requeue,
-- purge (pgqctl/admin.py). Each status is read through its own partial index
-- (claim, lease, finished), so none of these scans the done history unless
-- asked to (`stats --exact`, `purge`, `list` without --status).
-- ---------------------------------------------------------------------------

-- name: stats_counts
-- Per queue: exact pending, running, failed and cancelled counts, expired
-- leases and the oldest due pending job, one arm per status so each reads its own partial index. Done
-- jobs are counted among at most `bound` of them (NULL: all of them, exact),
-- so a long history is never read unless asked for: the most recently
-- finished (jobs_finished_idx, backwards), which find the queues that worked
-- since the statistics were last gathered. The CASE folds away for NULL:
-- an exact count sorts nothing.
SELECT queue,
       count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'done') AS done,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE status = 'running'
                          AND (locked_until < now() OR locked_until IS NULL)) AS expired_leases,
       extract(epoch FROM now() - min(run_at) FILTER (
           WHERE status = 'pending' AND run_at <= now()))::float8 AS oldest_pending_age_seconds
FROM (
    SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'pending'
    UNION ALL
    SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'running'
    UNION ALL
    SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'failed'
    UNION ALL
    SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'cancelled'
    UNION ALL
    (SELECT queue, status, run_at, locked_until FROM jobs WHERE status = 'done'
     ORDER BY CASE WHEN %(bound)s::bigint IS NOT NULL THEN finished_at END DESC
     LIMIT %(bound)s)
) AS counted
GROUP BY queue;

-- name: stats_table_estimate
-- What the planner knows, from catalogs only: the live rows in the table
-- (the statistics counter, else the last ANALYZE's count), the most common
-- queues with their share of rows at the last ANALYZE, how many rows were
-- inserted, updated or deleted since (how stale those shares may be), and
-- the queue column's statistics target (ANALYZE samples 300 rows per unit).
-- One row.
SELECT coalesce(nullif(pg_stat_get_live_tuples(c.oid), 0),
                greatest(c.reltuples, 0)::bigint) AS rows,
       pg_stat_get_mod_since_analyze(c.oid) AS changed,
       coalesce(nullif(a.attstattarget, -1),
                current_setting('default_statistics_target')::int) AS target,
       st.null_frac,
       st.n_distinct,
       st.most_common_vals::text::text[] AS common_queues,
       st.most_common_freqs AS common_shares,
       st.attname IS NOT NULL AS analyzed
FROM pg_class AS c
JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attname = 'queue'
LEFT JOIN pg_stats AS st
       ON st.schemaname = current_schema() AND st.tablename = 'jobs'
      AND st.attname = 'queue' AND NOT st.inherited
WHERE c.oid = 'jobs'::regclass;

-- name: job_columns
-- A job as the read commands read it, put in place of {job} in their
-- statements (pgqctl/rows.py): every column of jobs, but payload and
-- last_error only as a prefix of `payload_chars` and `error_chars`
-- characters (one more than is shown, so that a cut is seen), as text. A row
-- written with plain SQL may hold a payload of any size or depth: the
-- commands never take more than the prefix, nor decode a value psycopg's
-- loader could not.
jobs.id, jobs.queue, jobs.kind,
left(jobs.payload::text, %(payload_chars)s) AS payload_head,
jobs.status, jobs.priority, jobs.attempts, jobs.max_attempts, jobs.run_at,
jobs.locked_until, jobs.locked_by,
left(jobs.last_error, %(error_chars)s) AS last_error_head,
jobs.created_at, jobs.finished_at, jobs.handbacks, jobs.unique_key, jobs.schedule, jobs.tick

-- name: lease_list
-- Running jobs, soonest lease end first (jobs_lease_idx order). A running job
-- without a lease (only plain SQL makes one) counts as expired, here, in
-- stats and for reap: nobody holds it, so nothing else would ever free it.
SELECT {job},
       locked_until < now() OR locked_until IS NULL AS expired,
       round(extract(epoch FROM locked_until - now())::numeric, 3) AS seconds_left
FROM jobs
WHERE status = 'running'
  AND (locked_until < now() OR locked_until IS NULL OR NOT %(expired_only)s)
ORDER BY locked_until NULLS FIRST, id;

-- The jobs reap takes: every running job whose lease expired (or that has
-- none), and every running job held by a dead worker, lease or not. A worker
-- is dead when its row in `workers` has seen no heartbeat for `dead_after`
-- of its own heartbeat intervals, counting only the time the server has
-- been up (pg_postmaster_start_time: after a restart every worker needs a
-- moment to reconnect, and none of them is dead for that). `worker` (host:pid,
-- `reap --worker`) narrows the reap to that worker's jobs, taken as soon as
-- its row is stale (three of its heartbeats); NULL: every worker. A worker's
-- jobs are those whose locked_by is its id followed by :slot or :prefetch
-- (the same match as workers_list). One row per job, with why it is taken:
-- expired (its lease), dead (its worker, by the rule) or asked (--worker).

-- name: lease_reap_preview
-- What lease_reap would do now, without locking or writing anything: each
-- job it would take with the status and the last_error it would get (the
-- same expressions as lease_reap's). One row per job.
WITH dead AS (
    SELECT id, last_seen, heartbeat_seconds
    FROM workers
    WHERE CASE WHEN %(worker)s::text IS NULL
               THEN greatest(last_seen, pg_postmaster_start_time())
                    < now() - %(dead_after)s * heartbeat_seconds * interval '1 second'
               ELSE id = %(worker)s
                    AND last_seen < now() - 3 * heartbeat_seconds * interval '1 second'
          END
), taken AS (
    SELECT j.*, d.id AS dead_worker,
           CASE WHEN d.id IS NULL THEN 'expired'
                WHEN %(worker)s::text IS NULL THEN 'dead' ELSE 'asked' END AS reason,
           extract(epoch FROM now() - d.last_seen)::numeric(12, 1) AS silent_seconds,
           d.heartbeat_seconds
    FROM jobs AS j
    LEFT JOIN dead AS d ON d.id = regexp_replace(j.locked_by, ':([0-9]+|prefetch)$', '')
    WHERE j.status = 'running'
      AND (d.id IS NOT NULL
           OR (%(worker)s::text IS NULL AND (j.locked_until < now() OR j.locked_until IS NULL)))
)
SELECT {job},
       jobs.reason, jobs.dead_worker,
       CASE WHEN attempts - handbacks >= max_attempts THEN 'failed' ELSE 'pending' END
           AS reaped_status,
       CASE
           WHEN reason <> 'expired'
           THEN format('worker %%s %%s: no heartbeat for %%ss (it beats every %%ss) (held by %%s)',
                       dead_worker,
                       CASE reason WHEN 'dead' THEN 'dead' ELSE 'reaped on demand' END,
                       silent_seconds, heartbeat_seconds, locked_by)
           WHEN locked_until IS NULL
           THEN format('running without a lease (held by %%s)',
                       coalesce(locked_by, 'an unnamed worker'))
           ELSE format('lease expired at %%s (held by %%s)',
                       to_char(locked_until AT TIME ZONE 'UTC',
                               'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                       coalesce(locked_by, 'an unnamed worker'))
       END AS reaped_error,
       locked_by AS held_by
FROM taken AS jobs
ORDER BY locked_until NULLS FIRST, id;

-- name: lease_reap
-- The seed's reclaim in one statement, and the jobs of dead workers with
-- it. SKIP LOCKED: rows a worker is updating right now (renewal, report,
-- heartbeat) are left for the next run instead of waited on, and two reaps
-- at once never take the same row. A dead worker's row is locked first and
-- its staleness checked again on the row as it is then: a heartbeat that
-- commits meanwhile makes it alive, and none of its jobs is taken. Each job
-- is fenced as every transition out of running is (still running, the
-- attempt read), so a late report of the dead worker matches nothing. The
-- dead workers get reaped_at, and the count of their jobs taken.
WITH dead AS (
    SELECT id, last_seen, heartbeat_seconds
    FROM workers
    WHERE CASE WHEN %(worker)s::text IS NULL
               THEN greatest(last_seen, pg_postmaster_start_time())
                    < now() - %(dead_after)s * heartbeat_seconds * interval '1 second'
               ELSE id = %(worker)s
                    AND last_seen < now() - 3 * heartbeat_seconds * interval '1 second'
          END
    FOR UPDATE SKIP LOCKED
), taken AS (
    SELECT j.id, j.attempts, j.locked_by, j.locked_until, d.id AS dead_worker,
           CASE WHEN d.id IS NULL THEN 'expired'
                WHEN %(worker)s::text IS NULL THEN 'dead' ELSE 'asked' END AS reason,
           extract(epoch FROM now() - d.last_seen)::numeric(12, 1) AS silent_seconds,
           d.heartbeat_seconds
    FROM jobs AS j
    LEFT JOIN dead AS d ON d.id = regexp_replace(j.locked_by, ':([0-9]+|prefetch)$', '')
    WHERE j.status = 'running'
      AND (d.id IS NOT NULL
           OR (%(worker)s::text IS NULL AND (j.locked_until < now() OR j.locked_until IS NULL)))
    FOR UPDATE OF j SKIP LOCKED
), reaped AS (
    UPDATE jobs
    SET status = CASE WHEN jobs.attempts - jobs.handbacks >= jobs.max_attempts
                      THEN 'failed' ELSE 'pending' END,
        finished_at = CASE WHEN jobs.attempts - jobs.handbacks >= jobs.max_attempts
                           THEN now() END,
        last_error = CASE
            WHEN taken.reason <> 'expired'
            THEN format('worker %%s %%s: no heartbeat for %%ss (it beats every %%ss) (held by %%s)',
                        taken.dead_worker,
                        CASE taken.reason WHEN 'dead' THEN 'dead' ELSE 'reaped on demand' END,
                        taken.silent_seconds, taken.heartbeat_seconds, taken.locked_by)
            WHEN taken.locked_until IS NULL
            THEN format('running without a lease (held by %%s)',
                        coalesce(taken.locked_by, 'an unnamed worker'))
            -- ISO 8601 in UTC to the millisecond, as pgqctl writes every time.
            ELSE format('lease expired at %%s (held by %%s)',
                        to_char(taken.locked_until AT TIME ZONE 'UTC',
                                'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                        coalesce(taken.locked_by, 'an unnamed worker'))
        END,
        locked_until = NULL  -- locked_by stays: the worker that last held it
    FROM taken
    WHERE jobs.id = taken.id
      AND jobs.attempts = taken.attempts
      AND jobs.status = 'running'
    RETURNING jobs.*, taken.locked_by AS held_by, taken.reason, taken.dead_worker
), marked AS (
    -- Once per death (not again until it heartbeats), and whenever jobs go.
    UPDATE workers AS w
    SET reaped_at = now(), reaped_jobs = w.reaped_jobs + coalesce(r.jobs, 0)
    FROM dead AS d
    LEFT JOIN (SELECT dead_worker, count(*) AS jobs FROM reaped GROUP BY 1) AS r
           ON r.dead_worker = d.id
    WHERE w.id = d.id
      AND (r.jobs IS NOT NULL OR w.reaped_at IS NULL OR w.reaped_at < w.last_seen)
)
SELECT {job}, jobs.held_by, jobs.reason, jobs.dead_worker FROM reaped AS jobs;

-- name: workers_notify
-- Wake listening workers; delivered when the surrounding transaction commits.
SELECT pg_notify('pgqctl_jobs', current_schema());

-- The filters of `list`, the same in job_list, job_list_next and job_count:
-- each a list of values (NULL: any), every one given narrows. Statuses get
-- one arm each, folded to true or false by the parameters, so that the jobs
-- of each status given are read through their own partial index and `list
-- --status pending --status failed` never reads the done history (a
-- `status = ANY(...)` would: no partial index answers it). A new status
-- needs its arm in each (tests/unit/test_admin_sql.py checks).

-- name: job_list
-- Jobs matching the filters, newest first, at most `limit` (NULL: all).
SELECT {job}
FROM jobs
WHERE (%(statuses)s::text[] IS NULL
       OR (status = 'pending' AND 'pending' = ANY(%(statuses)s::text[]))
       OR (status = 'running' AND 'running' = ANY(%(statuses)s::text[]))
       OR (status = 'done' AND 'done' = ANY(%(statuses)s::text[]))
       OR (status = 'failed' AND 'failed' = ANY(%(statuses)s::text[]))
       OR (status = 'cancelled' AND 'cancelled' = ANY(%(statuses)s::text[])))
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(since)s::interval IS NULL OR created_at >= now() - %(since)s::interval)
-- Newest first. The CASE folds to a constant (and drops out) when done jobs
-- may match: the primary key is walked backwards. When only pending,
-- running or failed jobs may, it forces a sort of the matching rows, which
-- come from their small partial indexes, instead of a backward walk through
-- the done history that the planner may pick when those rows are old.
ORDER BY CASE WHEN NOT ('done' = ANY(coalesce(%(statuses)s::text[], '{done}')))
              THEN -id END,
         id DESC
LIMIT %(limit)s;

-- name: job_list_next
-- Pending jobs matching the filters in the order workers claim them
-- (priority DESC, run_at, id: jobs_claim_idx, walked in order), at most
-- `limit` (NULL: all). Jobs not due yet are listed where they will stand.
SELECT {job}
FROM jobs
WHERE status = 'pending'
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(since)s::interval IS NULL OR created_at >= now() - %(since)s::interval)
ORDER BY priority DESC, run_at, id
LIMIT %(limit)s;

-- name: job_count
-- How many jobs match job_list's filters, counting at most `bound` of them
-- (NULL: every one). One row.
SELECT count(*)
FROM (
    SELECT 1
    FROM jobs
    WHERE (%(statuses)s::text[] IS NULL
           OR (status = 'pending' AND 'pending' = ANY(%(statuses)s::text[]))
           OR (status = 'running' AND 'running' = ANY(%(statuses)s::text[]))
           OR (status = 'done' AND 'done' = ANY(%(statuses)s::text[]))
           OR (status = 'failed' AND 'failed' = ANY(%(statuses)s::text[]))
           OR (status = 'cancelled' AND 'cancelled' = ANY(%(statuses)s::text[])))
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
      AND (%(since)s::interval IS NULL OR created_at >= now() - %(since)s::interval)
    LIMIT %(bound)s
) AS matched;

-- name: job_get
SELECT {job} FROM jobs WHERE id = %(id)s;

-- Requeue: job_requeue_preview (--dry-run) and job_requeue share the
-- selection of job_requeue_pick, put in place of {picked}, so the preview
-- shows exactly what the change would do; and both compute a job's new
-- values with the same expressions (tests compare the two).

-- name: job_requeue_pick
-- The CTEs that pick the jobs of a requeue selection. `statuses` says which
-- of pending, failed and cancelled it takes (one arm each, so each status is
-- read through its own partial index); the other filters are optional lists
-- (any of their values). In order, oldest finished first, pending jobs by
-- run_at: the first `limit` (NULL: all) are picked. A finished job whose
-- unique key a pending or running job holds (or an earlier one of the same
-- selection will) cannot go back to pending: `held` names its holder, and it
-- is left out of the pick and of the limit. The n-th of the N picked gets
-- run_at now + spread * n / N: evenly over the window, in order.
matched AS (
    SELECT id, status, queue, unique_key, coalesce(finished_at, run_at) AS since
    FROM jobs
    WHERE ((status = 'pending' AND 'pending' = ANY(%(statuses)s::text[]))
           OR (status = 'failed' AND 'failed' = ANY(%(statuses)s::text[]))
           OR (status = 'cancelled' AND 'cancelled' = ANY(%(statuses)s::text[])))
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
      AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND (%(since)s::interval IS NULL
           OR coalesce(finished_at, created_at) >= now() - %(since)s::interval)
),
held AS (
    SELECT m.*,
           CASE WHEN m.unique_key IS NULL OR m.status = 'pending' THEN NULL
                ELSE coalesce(
                    (SELECT live.id FROM jobs AS live
                     WHERE live.queue = m.queue AND live.unique_key = m.unique_key
                       AND live.unique_key IS NOT NULL
                       AND live.status IN ('pending', 'running')),
                    nullif(first_value(m.id) OVER (PARTITION BY m.queue, m.unique_key
                                                   ORDER BY m.since, m.id), m.id))
           END AS held_by
    FROM matched AS m
),
picked AS (
    SELECT id, status,
           now() + %(spread)s::interval
                   * ((row_number() OVER (ORDER BY since, id) - 1)::float8
                      / count(*) OVER ()) AS run_at
    FROM (SELECT * FROM held WHERE held_by IS NULL ORDER BY since, id LIMIT %(limit)s) AS first
)

-- name: job_requeue_preview
-- What job_requeue would do now, writing nothing: each picked job with the
-- status, run_at and max_attempts it would get (held_by NULL), then each job
-- left out for its unique key, unchanged, with its holder. In the order of
-- the pick.
WITH {picked}
SELECT {job},
       'pending' AS requeued_status,
       CASE WHEN jobs.status = 'pending' THEN least(jobs.run_at, p.run_at) ELSE p.run_at END
           AS requeued_run_at,
       CASE WHEN jobs.status = 'pending' THEN jobs.max_attempts
            ELSE jobs.attempts - jobs.handbacks + %(more)s END
           AS requeued_max_attempts,
       NULL::bigint AS held_by
FROM picked AS p
JOIN jobs ON jobs.id = p.id
UNION ALL
SELECT {job}, jobs.status, jobs.run_at, jobs.max_attempts, h.held_by
FROM held AS h
JOIN jobs ON jobs.id = h.id
WHERE h.held_by IS NOT NULL;

-- name: job_requeue
-- The requeue, in one statement: all of it or nothing. Failed and cancelled
-- jobs go back to pending with `more` new tries: attempts is the fencing
-- token and never goes down, max_attempts goes up instead, from the tries
-- used (attempts - handbacks). A pending job
-- keeps its attempts and becomes due at its picked run_at, never later than
-- it was. The status guard skips a job that moved since it was picked (a
-- pending job a worker claimed, a failed one purged or requeued by someone
-- else). Rows: the jobs changed (held_by NULL), then those left out for
-- their unique key, as job_requeue_preview gives them.
WITH {picked},
moved AS (
    UPDATE jobs
    SET status = 'pending',
        run_at = CASE WHEN jobs.status = 'pending' THEN least(jobs.run_at, p.run_at)
                      ELSE p.run_at END,
        max_attempts = CASE WHEN jobs.status = 'pending' THEN jobs.max_attempts
                            ELSE jobs.attempts - jobs.handbacks + %(more)s END,
        finished_at = NULL,
        locked_until = NULL
    FROM picked AS p
    WHERE jobs.id = p.id AND jobs.status = p.status
    RETURNING {job}
)
SELECT *, NULL::bigint AS held_by FROM moved
UNION ALL
SELECT {job}, h.held_by
FROM held AS h
JOIN jobs ON jobs.id = h.id
WHERE h.held_by IS NOT NULL;

-- The selection of `cancel`, the same in job_cancel_select and job_cancel:
-- pending and running jobs (those of `statuses`, each status through its
-- own partial index), narrowed by each filter given (NULL: any).

-- name: job_cancel_select
-- The jobs job_cancel would take now, by id, without locking anything;
-- lease_expired says whether a running one's worker is gone (NULL for a
-- pending one).
SELECT {job},
       CASE WHEN status = 'running'
            THEN locked_until < now() OR locked_until IS NULL END AS lease_expired
FROM jobs
WHERE ((status = 'pending' AND 'pending' = ANY(%(statuses)s::text[]))
       OR (status = 'running' AND 'running' = ANY(%(statuses)s::text[])))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
ORDER BY id;

-- name: job_cancel
-- Pending or running -> cancelled, finished now, in one statement. Each row
-- is locked first (in id order), waiting for a worker that is reporting on
-- it at this instant, and the selection is checked again on the row as that
-- report left it: a job that has just ended (done, failed) is not taken, one
-- sent back to pending for a retry is. Then the change is fenced on the
-- status and attempt that were locked, like every move out of running: a
-- race with the job's own end has exactly one winner, and a worker's later
-- report, fenced on status running, matches nothing. attempts is kept.
-- cancelled_from is the status the job had; lease_expired as in
-- job_cancel_select.
UPDATE jobs
SET status = 'cancelled',
    finished_at = now(),
    locked_until = NULL,  -- locked_by stays: the worker that last held it
    last_error = %(error)s
FROM (
    SELECT id, status, attempts, locked_until
    FROM jobs
    WHERE ((status = 'pending' AND 'pending' = ANY(%(statuses)s::text[]))
           OR (status = 'running' AND 'running' = ANY(%(statuses)s::text[])))
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
    ORDER BY id
    FOR UPDATE
) AS picked
WHERE jobs.id = picked.id
  AND jobs.status = picked.status
  AND jobs.attempts = picked.attempts
RETURNING {job},
          picked.status AS cancelled_from,
          CASE WHEN picked.status = 'running'
               THEN picked.locked_until < now() OR picked.locked_until IS NULL
          END AS lease_expired;

-- name: workers_notify_cancel
-- Tell the workers which running jobs were cancelled, as (id, attempt)
-- pairs, with the schema so that workers of another schema ignore it; the
-- worker holding one stops it. Delivered when the cancel commits, and only
-- then. A payload must stay under 8000 bytes: callers send a few hundred
-- jobs per notification.
SELECT pg_notify('pgqctl_cancel',
                 json_build_object('schema', current_schema(),
                                   'jobs', %(jobs)s::jsonb)::text);

-- name: job_purge_cutoff
-- Purge deletes rows finished before this instant, fixed when it starts, so
-- it ends even while workers keep finishing jobs.
SELECT now() - %(older_than)s::interval AS cutoff;

-- name: job_purge_count
SELECT count(*)
FROM jobs
WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(cutoff)s;

-- name: job_purge_batch
-- One short transaction per batch; SKIP LOCKED so it never waits on a row
-- someone is updating (a requeue), and workers never wait on more than this.
-- ARRAY(...) makes the delete a primary-key lookup of the batch's ids, never a
-- join the planner might run as a scan of the whole table.
DELETE FROM jobs
WHERE id = ANY(ARRAY(
    SELECT id
    FROM jobs
    WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(cutoff)s
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
));
-- ---------------------------------------------------------------------------
-- monitor: check and metrics (pgqctl/monitor.py). Besides stats_counts (with
-- no done rows for check), they read these, each through a partial index:
-- their cost follows the live jobs and the jobs finished within a short
-- window, never the history before it.
-- ---------------------------------------------------------------------------

-- name: monitor_running_since
-- Per queue with running jobs: seconds since the running job due longest ago
-- became due (its run_at; a claim records no start time of its own), from
-- jobs_lease_idx's rows. One row per queue.
SELECT queue, extract(epoch FROM now() - min(run_at))::float8 AS oldest_running_age_seconds
FROM jobs
WHERE status = 'running'
GROUP BY queue;

-- name: monitor_finished_since
-- Per queue: the jobs of one finished status (jobs.py FINISHED; run once for
-- each) that finished within `window`, from the window's range of
-- jobs_finished_idx (status, finished_at) only: as many rows as finished in
-- it, whatever the history before it holds. One status a statement, sent as
-- a value: both columns then bound the range, where a list of statuses would
-- match the index's predicate whole and bound nothing but finished_at, so
-- read the whole index. One row per queue that has any.
SELECT queue, count(*) AS finished
FROM jobs
WHERE status = %(status)s
  AND finished_at > now() - %(window)s::interval
GROUP BY queue;

-- name: monitor_leases_soonest
-- `top`: the `limit` running jobs whose leases end soonest (a job without a
-- lease first: nobody holds it), as lease_list gives them. Sorts the running
-- jobs only (jobs_lease_idx's rows), however long the history.
SELECT {job},
       locked_until < now() OR locked_until IS NULL AS expired,
       round(extract(epoch FROM locked_until - now())::numeric, 3) AS seconds_left
FROM jobs
WHERE status = 'running'
ORDER BY locked_until NULLS FIRST, id
LIMIT %(limit)s;

-- ---------------------------------------------------------------------------
-- doctor: vacuum, bloat and xmin-horizon diagnosis of the queue's tables
-- (pgqctl/doctor.py). Catalogs and statistics views only, but for
-- doctor_pgstattuple and doctor_pgstatindex, which read a table or an index
-- whole (run only when the extension is there and this role may use it).
-- Nothing here changes anything: doctor prints the SQL to act, never runs it.
-- ---------------------------------------------------------------------------

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
-- table's fillfactor; NULL until analyzed). One row each.
WITH widths AS (
    SELECT tablename, sum((1 - null_frac) * avg_width) AS width
    FROM pg_stats
    WHERE schemaname = %(schema)s AND NOT inherited
    GROUP BY tablename
)
SELECT c.oid::bigint AS oid, c.relname AS name,
       s.n_live_tup, s.n_dead_tup, s.n_mod_since_analyze, s.n_ins_since_vacuum,
       s.n_tup_ins, s.n_tup_upd, s.n_tup_del, s.n_tup_hot_upd,
       s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze,
       s.vacuum_count, s.autovacuum_count, s.analyze_count, s.autoanalyze_count,
       extract(epoch FROM now() - greatest(s.last_vacuum, s.last_autovacuum))::float8
           AS seconds_since_vacuum,
       pg_table_size(c.oid) AS table_bytes,
       pg_indexes_size(c.oid) AS index_bytes,
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
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND c.relname = ANY(%(names)s::text[])
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

-- ---------------------------------------------------------------------------
-- workers: the registry of running workers (pgqctl/registry.py), written by
-- the workers themselves (worker_beat and its neighbours, in the claims
-- section).
-- ---------------------------------------------------------------------------

-- name: workers_list
-- Every registered worker, by host and pid, with its state (stale: no
-- heartbeat for three of its intervals; dead: a reap took its jobs as a
-- dead worker's, or found it dead, after its last heartbeat) and the ids of the jobs it holds:
-- running in its slots (jobs), and claimed ahead of a free slot (prefetched).
-- The running jobs are read once, through jobs_lease_idx (status =
-- 'running'), and grouped by holder: `locked_by` is host:pid:slot, the
-- worker's id and the slot, or host:pid:prefetch for a prefetched job (see
-- worker_exchange). One row per worker.
WITH held AS (
    SELECT regexp_replace(locked_by, ':([0-9]+|prefetch)$', '') AS worker,
           array_agg(id ORDER BY id) FILTER (WHERE locked_by !~ ':prefetch$') AS jobs,
           array_agg(id ORDER BY id) FILTER (WHERE locked_by ~ ':prefetch$') AS prefetched
    FROM jobs
    WHERE status = 'running' AND locked_by IS NOT NULL
    GROUP BY 1
)
SELECT w.*,
       CASE WHEN w.reaped_at >= w.last_seen THEN 'dead'
            WHEN w.last_seen >= now() - 3 * w.heartbeat_seconds * interval '1 second'
            THEN 'active' ELSE 'stale' END AS state,
       extract(epoch FROM now() - w.last_seen)::float8 AS seen_seconds_ago,
       coalesce(h.jobs, '{}') AS jobs,
       coalesce(h.prefetched, '{}') AS prefetched
FROM workers AS w
LEFT JOIN held AS h ON h.worker = w.id
ORDER BY w.host, w.pid, w.id;

-- name: worker_get
-- One worker's row, how long since its last heartbeat, and whether it is
-- active (as workers_list says), or no row.
SELECT w.*, extract(epoch FROM now() - w.last_seen)::float8 AS seen_seconds_ago,
       w.last_seen >= now() - 3 * w.heartbeat_seconds * interval '1 second' AS active
FROM workers AS w
WHERE w.id = %(id)s;

-- name: workers_states
-- What check and metrics need of each worker: its queues (empty: every
-- queue) and whether it is active, as workers_list says. One row per worker.
SELECT queues,
       last_seen >= now() - 3 * heartbeat_seconds * interval '1 second'
           AND NOT coalesce(reaped_at >= last_seen, false) AS active
FROM workers;

-- ---------------------------------------------------------------------------
-- control: pausing and resuming queues (pgqctl/control.py). The claims skip
-- the queues of paused_queues_now (see the worker section).
-- ---------------------------------------------------------------------------

-- name: paused_expired_delete
-- Forget pauses that have ended by themselves (the claims ignore them
-- already), so that pausing such a queue again starts a new pause. No rows.
DELETE FROM paused_queues WHERE until <= now();

-- name: paused_upsert
-- Pause each queue, until `seconds` from now (NULL: until resumed). A queue
-- paused already keeps its paused_at, and its reason unless one is given.
-- One row per queue, saying whether it was paused already.
WITH before AS (
    SELECT queue FROM paused_queues WHERE queue = ANY(%(queues)s::text[])
)
INSERT INTO paused_queues AS p (queue, reason, until)
SELECT q, %(reason)s, now() + %(seconds)s * interval '1 second'
FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (queue) DO UPDATE
SET reason = coalesce(EXCLUDED.reason, p.reason),
    until = EXCLUDED.until
RETURNING p.queue, p.reason, p.paused_at, p.until,
          p.queue IN (SELECT queue FROM before) AS updated;

-- name: paused_delete
-- Resume these queues: the pauses in effect that ended. One row per queue
-- that was paused.
DELETE FROM paused_queues
WHERE queue = ANY(%(queues)s::text[]) AND (until IS NULL OR until > now())
RETURNING queue, reason, paused_at, until;

-- name: paused_list
-- The pauses in effect, by queue. One row each.
SELECT queue, reason, paused_at, until FROM paused_queues_now ORDER BY queue;

-- name: queues_known
-- Which of these queues pgqctl knows: one with a pending or running job, a
-- pause, a schedule, or one the table's statistics (ANALYZE's sample of the
-- whole table, history included) have seen. Each test reads an index or a
-- small table, never the finished history: a queue that is not known costs
-- no more than one that is. One row per known queue.
SELECT q AS queue
FROM unnest(%(queues)s::text[]) AS q
WHERE EXISTS (SELECT 1 FROM jobs WHERE status IS NOT DISTINCT FROM 'pending' AND queue = q)
   OR EXISTS (SELECT 1 FROM jobs WHERE status = 'running' AND queue = q)
   OR EXISTS (SELECT 1 FROM paused_queues WHERE queue = q)
   OR EXISTS (SELECT 1 FROM schedules WHERE queue = q)
   OR q IN (
        SELECT unnest(coalesce(most_common_vals::text::text[], '{}')
                      || coalesce(histogram_bounds::text::text[], '{}'))
        FROM pg_stats
        WHERE schemaname = current_schema() AND tablename = 'jobs' AND attname = 'queue'
   );

-- name: queue_names
-- The names of the known queues (as queues_known means it), for a "did you
-- mean": the pending ones by a skip scan of jobs_claim_queue_idx (one index
-- probe per queue, at most 1000 queues), the rest from small tables and the
-- statistics. One row per name.
WITH RECURSIVE pending(queue) AS (
    (SELECT queue FROM jobs WHERE status IS NOT DISTINCT FROM 'pending' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM jobs j
            WHERE j.status IS NOT DISTINCT FROM 'pending' AND j.queue > p.queue
            ORDER BY j.queue LIMIT 1)
    FROM pending p
    WHERE p.queue IS NOT NULL
)
SELECT queue FROM (SELECT queue FROM pending WHERE queue IS NOT NULL LIMIT 1000) AS names
UNION SELECT queue FROM jobs WHERE status = 'running'
UNION SELECT queue FROM paused_queues
UNION SELECT queue FROM schedules
UNION SELECT unnest(coalesce(most_common_vals::text::text[], '{}')
                    || coalesce(histogram_bounds::text::text[], '{}'))
      FROM pg_stats
      WHERE schemaname = current_schema() AND tablename = 'jobs' AND attname = 'queue';

-- ---------------------------------------------------------------------------
-- schedules: cron and interval schedules (pgqctl/schedules.py). The workers
-- enqueue their ticks (the ticks section).
-- ---------------------------------------------------------------------------

-- name: schedule_insert
-- A new schedule; no row when the name is taken. Paused when asked.
INSERT INTO schedules (name, cron, every_seconds, timezone, kind, payload, queue, priority,
                       max_attempts, paused, overlap, source, sync_source)
VALUES (%(name)s, %(cron)s, %(every_seconds)s, %(timezone)s, %(kind)s, %(payload)s::jsonb,
        %(queue)s, %(priority)s, %(max_attempts)s, %(paused)s, %(overlap)s, %(source)s,
        %(sync_source)s)
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: schedule_update
-- A schedule's new definition (from a sync file). A new timing ticks from
-- now: the ticks of the old one before the change are not caught up. Its
-- pause is kept when `keep_paused`, its overlap when `keep_overlap`; a
-- resumed schedule ticks from now too. One row.
UPDATE schedules
SET cron = %(cron)s,
    every_seconds = %(every_seconds)s,
    timezone = %(timezone)s,
    kind = %(kind)s,
    payload = %(payload)s::jsonb,
    queue = %(queue)s,
    priority = %(priority)s,
    max_attempts = %(max_attempts)s,
    paused = CASE WHEN %(keep_paused)s THEN paused ELSE %(paused)s END,
    overlap = CASE WHEN %(keep_overlap)s THEN overlap ELSE %(overlap)s END,
    ticks_after = CASE WHEN %(retime)s OR (paused AND NOT %(keep_paused)s AND NOT %(paused)s)
                       THEN now() ELSE ticks_after END,
    source = %(source)s,
    sync_source = %(sync_source)s,
    updated_at = now()
WHERE name = %(name)s
RETURNING name;

-- The schedules with the status of their last tick's job (NULL once it is
-- purged), and the database's time to say what is due against.

-- name: schedule_list
-- Every schedule, by name. One row each.
SELECT s.*, j.status AS last_job_status, now() AS now
FROM schedules AS s
LEFT JOIN jobs AS j ON j.id = s.last_job_id
ORDER BY s.name;

-- name: schedule_get
-- One schedule, or no row.
SELECT s.*, j.status AS last_job_status, now() AS now
FROM schedules AS s
LEFT JOIN jobs AS j ON j.id = s.last_job_id
WHERE s.name = %(name)s;

-- name: schedule_delete
-- Remove a schedule; its jobs stay. No rows.
DELETE FROM schedules WHERE name = %(name)s;

-- name: schedule_set_paused
-- Pause or resume; a resumed schedule ticks from now on. No rows.
UPDATE schedules
SET paused = %(paused)s,
    ticks_after = CASE WHEN %(paused)s THEN ticks_after ELSE now() END,
    updated_at = now()
WHERE name = %(name)s;

-- name: schedule_run
-- One job of the schedule now, outside its ticks (its tick NULL, so the
-- one-job-per-tick index leaves it be). One row (its id), or none.
INSERT INTO jobs (queue, kind, payload, priority, max_attempts, schedule)
SELECT queue, kind, payload, priority, max_attempts, name
FROM schedules
WHERE name = %(name)s
RETURNING id;

-- name: schedules_lock
-- Held by a sync until it commits: two syncs at once would each undo the
-- other. Workers' ticks wait for it (a moment). No rows.
LOCK TABLE schedules IN SHARE ROW EXCLUSIVE MODE;

-- name: schedules_notify
-- Tell the workers the schedules changed; delivered at commit.
SELECT pg_notify('pgqctl_schedules', current_schema());

-- ---------------------------------------------------------------------------
-- ticks: the workers enqueue due ticks (pgqctl/ticks.py).
-- ---------------------------------------------------------------------------

-- name: ticks_schedules
-- What a worker needs to work out the due ticks of each schedule, and the
-- database's time (its clock for all the workers: theirs may differ). One
-- row per schedule, or one row of NULLs but `now` when there is none.
SELECT s.name, s.cron, s.every_seconds, s.timezone, s.paused, s.updated_at,
       greatest(s.ticks_after, s.last_tick) AS after, n.now
FROM (SELECT now() AS now) AS n
LEFT JOIN schedules AS s ON true
ORDER BY s.name;

-- name: ticks_enqueue
-- Enqueue the ticks a worker found due, in one statement: `ticks` is a JSON
-- array of {name, version (the updated_at it read), tick}. A tick is
-- enqueued when its schedule still has that definition, is not paused, and
-- has not had that tick or a later one (last_tick: also once the tick's job
-- is purged). The schedule rows are locked, skipping those another worker
-- is ticking right now (it enqueues the same ticks); a row that worker has
-- just changed is read again, as it now is, before it is locked. The unique
-- (schedule, tick) index backs it all: a tick enqueued twice adds nothing.
-- A schedule with overlap 'skip' has at most one job of its ticks pending
-- or running: while the previous tick's job (last_job_id) is, its due ticks
-- are skipped; else only the latest of them is enqueued and the earlier
-- ones skipped. A skipped tick is done with all the same (last_tick moves
-- past it), and counted: skipped_ticks, last_skipped_tick. The job's status
-- is read under the schedule's lock, so the database, not a worker, decides.
-- One row per schedule named: its definition's version and last tick now,
-- the jobs (ids and ticks) this statement enqueued for it, and the ticks it
-- skipped.
WITH wanted AS (
    SELECT * FROM jsonb_to_recordset(%(ticks)s::jsonb)
                  AS t(name text, version timestamptz, tick timestamptz)
), locked AS (
    SELECT s.name, s.kind, s.payload, s.queue, s.priority, s.max_attempts, s.overlap,
           s.last_job_id, w.tick
    FROM schedules AS s
    JOIN wanted AS w ON w.name = s.name AND w.version = s.updated_at
    WHERE NOT s.paused AND w.tick > greatest(s.ticks_after, s.last_tick)
    FOR UPDATE OF s SKIP LOCKED
), due AS (
    SELECT l.*,
           l.overlap = 'skip' AND (
               EXISTS (SELECT FROM jobs AS j
                       WHERE j.id = l.last_job_id AND j.status IN ('pending', 'running'))
               OR l.tick < max(l.tick) OVER (PARTITION BY l.name)) AS skipped
    FROM locked AS l
), enqueued AS (
    INSERT INTO jobs (queue, kind, payload, priority, max_attempts, schedule, tick)
    SELECT queue, kind, payload, priority, max_attempts, name, tick
    FROM due
    WHERE NOT skipped
    ORDER BY name, tick
    ON CONFLICT (schedule, tick) WHERE schedule IS NOT NULL DO NOTHING
    RETURNING id, schedule, tick
), advanced AS (
    UPDATE schedules AS s
    SET last_tick = d.tick,
        last_job_id = coalesce(e.id, s.last_job_id),
        skipped_ticks = s.skipped_ticks + d.skipped,
        last_skipped_tick = coalesce(d.last_skipped, s.last_skipped_tick)
    FROM (SELECT name, max(tick) AS tick, count(*) FILTER (WHERE skipped) AS skipped,
                 max(tick) FILTER (WHERE skipped) AS last_skipped
          FROM due GROUP BY name) AS d
    LEFT JOIN enqueued AS e ON e.schedule = d.name AND e.tick = d.tick
    WHERE s.name = d.name
    RETURNING s.name, s.last_tick
)
SELECT s.name, s.updated_at AS version,
       greatest(s.ticks_after, coalesce(a.last_tick, s.last_tick)) AS after,
       ARRAY(SELECT e.id FROM enqueued AS e WHERE e.schedule = s.name ORDER BY e.tick) AS jobs,
       ARRAY(SELECT e.tick FROM enqueued AS e WHERE e.schedule = s.name ORDER BY e.tick) AS ticks,
       ARRAY(SELECT d.tick FROM due AS d WHERE d.name = s.name AND d.skipped ORDER BY d.tick)
           AS skipped
FROM schedules AS s
LEFT JOIN advanced AS a ON a.name = s.name
WHERE s.name IN (SELECT name FROM wanted);

-- ---- enqueue (pgqctl/intake/) ----------------------------------------------
-- These blocks write {jobs} for the table: the enqueue API composes it with
-- psycopg.sql.Identifier, schema-qualified when its caller names a schema and
-- bare (the search_path) otherwise. A job is due at run_at when given, else at
-- the transaction's now() plus delay seconds. ORDER BY n hands out ids in
-- input order, so the returned ids line up with the jobs given.

-- name: role_may_create_temp
-- Whether this role may create the temporary table a COPY load stages rows
-- in (the TEMP privilege on the database). One row.
SELECT has_database_privilege(current_database(), 'TEMP');

-- name: transaction_open
-- Only to begin the caller's transaction on a connection outside autocommit
-- (psycopg sends BEGIN before it), so a savepoint can be set in it. One row.
SELECT 1;

-- name: jobs_insert_arrays
-- Jobs from arrays, one element each, in the order given. One row (the id)
-- per job.
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay))
FROM unnest(%(kind)s::text[], %(payload)s::jsonb[], %(queue)s::text[],
            %(priority)s::integer[], %(max_attempts)s::integer[],
            %(run_at)s::timestamptz[], %(delay)s::float8[])
     WITH ORDINALITY AS t (kind, payload, queue, priority, max_attempts, run_at, delay, n)
ORDER BY n
RETURNING id;

-- name: jobs_insert_arrays_unique
-- jobs_insert_arrays for jobs some of which have a unique key: a job whose
-- key a pending or running job of its queue holds (one committed before, one
-- of this statement's earlier rows, or one whose inserting transaction this
-- waits for) is not inserted. Only loads with a key pay for ON CONFLICT's
-- speculative insertion. One row (id, queue, key) per job inserted.
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at, unique_key)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay)), unique_key
FROM unnest(%(kind)s::text[], %(payload)s::jsonb[], %(queue)s::text[],
            %(priority)s::integer[], %(max_attempts)s::integer[],
            %(run_at)s::timestamptz[], %(delay)s::float8[], %(unique_key)s::text[])
     WITH ORDINALITY AS t (kind, payload, queue, priority, max_attempts, run_at, delay,
                           unique_key, n)
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
-- "kinds" are numbered N, N.001, N.002... (pgqctl/intake/fanout.py). No rows.
CREATE TEMPORARY TABLE IF NOT EXISTS pgqctl_enqueue_load (
    n            numeric,
    kind         text,
    payload      jsonb,
    queue        text,
    priority     integer,
    max_attempts integer,
    run_at       timestamptz,
    delay        float8,
    unique_key   text
) ON COMMIT DROP;

-- name: jobs_load_copy
-- Rows of COPY's text format into the staging table.
COPY pg_temp.pgqctl_enqueue_load (n, kind, payload, queue, priority, max_attempts, run_at, delay,
                                  unique_key)
FROM STDIN;

-- name: jobs_insert_loaded
-- The staged rows into jobs, in file order. One row (the id) per job.
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay))
FROM pg_temp.pgqctl_enqueue_load
ORDER BY n
RETURNING id;

-- name: jobs_insert_loaded_unique
-- jobs_insert_loaded for a chunk in which some jobs have a unique key, as
-- jobs_insert_arrays_unique does it. One row (id, queue, key) per job inserted.
INSERT INTO {jobs} (kind, payload, queue, priority, max_attempts, run_at, unique_key)
SELECT kind, payload, queue, priority, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => delay)), unique_key
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

-- ---------------------------------------------------------------------------
-- claims: the worker's side of the queue (pgqctl/claims.py, pgqctl/worker/).
-- ---------------------------------------------------------------------------
-- Every transition out of 'running' is fenced on
-- (id, the attempt the worker claimed, status = 'running'): a worker whose
-- lease was lost matches no row and changes nothing.

-- name: worker_exchange
-- One round trip of a worker: report the jobs that ended (done, failed: back
-- to pending after a delay, or failed for good when out of attempts or never
-- runnable; handed back: pending now, the interrupted attempt not counted),
-- renew the leases of those still held, and claim up to `limit` due jobs in
-- claim order. A claimed job is held by `worker`:slot, slot the n-th of
-- `slots` (text: a slot number, or `prefetch` for a job claimed ahead of a
-- free slot, which the worker keeps until one frees); a renewal that carries
-- a slot moves the job's locked_by to it (a prefetched job now started).
-- Batches come in as JSON arrays of objects. The parts touch disjoint rows
-- (ended, running, pending), so one statement does them all; every row
-- returned says which part it answers.
--
-- The worker runs this statement thousands of times a second, so it must run
-- on one cached (generic) plan: planning it afresh costs more than running
-- it. Every part therefore finds its rows through the primary key (`id =
-- ANY(ARRAY(...))`), a plan that stays right whatever the parameters and the
-- table's statistics say; a join on the batch could turn into a scan of every
-- running job, or of the whole table, when the planner cannot see the batch.
-- The fence on status is spelled `IS NOT DISTINCT FROM 'running'`, not `=`, so
-- that the planner cannot use the partial lease index (WHERE status =
-- 'running') instead: a plan cached while few jobs ran believes that index
-- empty, and would then scan every running job for each report. The text
-- must stay under psycopg's 4 kB limit for caching its parse (comment lines
-- are not sent; tests/unit/test_sql.py checks), with each claim in place.
--
-- The claim differs with the worker's --queue and --kind, which a worker
-- keeps for its life, so the statement is sent with the one claim it needs
-- rather than with every claim behind one-time tests of the parameters: a
-- plan's parts are all set up on every run, used or not (and planned every
-- time when statements are not prepared), and a worker with no --queue
-- would pay 10 to 15% more per exchange for the claims of the others.
WITH done AS (
    UPDATE jobs AS j
    SET status = 'done',
        finished_at = now(),
        locked_until = NULL
    FROM jsonb_to_recordset(%(done)s::jsonb) AS r(id bigint, attempt int)
    WHERE j.id = ANY(ARRAY(SELECT (e ->> 'id')::bigint
                           FROM jsonb_array_elements(%(done)s::jsonb) AS e))
      AND j.id = r.id
      AND j.attempts = r.attempt
      AND j.status IS NOT DISTINCT FROM 'running'
    RETURNING j.id
), failed AS (
    UPDATE jobs AS j
    SET status = CASE WHEN r.permanent OR j.attempts - j.handbacks >= j.max_attempts
                      THEN 'failed' ELSE 'pending' END,
        run_at = CASE WHEN r.permanent OR j.attempts - j.handbacks >= j.max_attempts
                      THEN j.run_at ELSE now() + r.delay * interval '1 second' END,
        finished_at = CASE WHEN r.permanent OR j.attempts - j.handbacks >= j.max_attempts
                           THEN now() END,
        locked_until = NULL,
        last_error = r.error
    FROM jsonb_to_recordset(%(failed)s::jsonb)
         AS r(id bigint, attempt int, error text, delay float8, permanent bool)
    WHERE j.id = ANY(ARRAY(SELECT (e ->> 'id')::bigint
                           FROM jsonb_array_elements(%(failed)s::jsonb) AS e))
      AND j.id = r.id
      AND j.attempts = r.attempt
      AND j.status IS NOT DISTINCT FROM 'running'
    RETURNING j.id, j.status, j.run_at
), handed_back AS (
    UPDATE jobs AS j
    SET status = 'pending',
        run_at = now(),
        locked_until = NULL,
        handbacks = j.handbacks + 1,
        last_error = %(reason)s
    FROM jsonb_to_recordset(%(handed_back)s::jsonb) AS r(id bigint, attempt int)
    WHERE j.id = ANY(ARRAY(SELECT (e ->> 'id')::bigint
                           FROM jsonb_array_elements(%(handed_back)s::jsonb) AS e))
      AND j.id = r.id
      AND j.attempts = r.attempt
      AND j.status IS NOT DISTINCT FROM 'running'
    RETURNING j.id
), renewed AS (
    UPDATE jobs AS j
    SET locked_until = now() + %(lease)s * interval '1 second',
        locked_by = COALESCE(%(worker)s || ':' || r.slot, j.locked_by)
    FROM jsonb_to_recordset(%(renew)s::jsonb) AS r(id bigint, attempt int, slot int)
    WHERE j.id = ANY(ARRAY(SELECT (e ->> 'id')::bigint
                           FROM jsonb_array_elements(%(renew)s::jsonb) AS e))
      AND j.id = r.id
      AND j.attempts = r.attempt
      AND j.status IS NOT DISTINCT FROM 'running'
    RETURNING j.id
), picked AS MATERIALIZED (
    -- The claim for the worker's filters, one of the worker_claim_* blocks
    -- below (claims.py puts it here): the ids of up to `limit` due jobs.
    {claim}
), claimed AS (
    UPDATE jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        locked_until = now() + %(lease)s * interval '1 second',
        locked_by = %(worker)s || COALESCE(
            ':' || (%(slots)s::text[])[array_position((SELECT ids FROM picked), j.id)], '')
    WHERE j.id = ANY((SELECT ids FROM picked)::bigint[])
    RETURNING j.id, j.queue, j.kind, j.payload, j.attempts, j.max_attempts,
              j.handbacks, j.priority, j.run_at, j.schedule, j.tick
)
-- The arms are read in order, and each part runs when first read: reports and
-- renewals first, the claim last. A claim's SKIP LOCKED recheck can keep a
-- lock on a row another worker just claimed; were the claim first, that
-- worker's report could wait on us while ours waited on it (a deadlock). With
-- the claim last, a statement holds no claim locks while it waits to report.
SELECT 'done' AS part, id, NULL::text AS queue, NULL::text AS kind, NULL::text AS payload,
       NULL::int AS attempts, NULL::int AS max_attempts, NULL::int AS handbacks,
       NULL::text AS status, NULL::timestamptz AS run_at
FROM done
UNION ALL SELECT 'failed', id, NULL, NULL, NULL, NULL, NULL, NULL, status, run_at FROM failed
UNION ALL SELECT 'handed_back', id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
          FROM handed_back
UNION ALL SELECT 'renewed', id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM renewed
-- Claimed jobs come last, in claim order: the worker starts them in that order.
-- Their schedule and tick (for the job's environment) travel in the columns
-- of status and run_at, of the same types, which the claimed arm has no use
-- for: fewer bytes than two more columns in every arm. A payload comes as
-- text, at most `payload_chars` characters of it (one more than the worker's
-- limit in bytes: a cut one is over the limit), whatever size a row holds.
UNION ALL (SELECT 'claimed', id, queue, kind, left(payload::text, %(payload_chars)s), attempts,
                  max_attempts, handbacks, schedule, tick
           FROM claimed
           ORDER BY priority DESC, run_at, id)
-- The last job claimed, in claim order: its id, priority (in the attempts
-- column) and run_at, where a later claim may start its walk (claims.Floor).
UNION ALL (SELECT 'floor', id, NULL, NULL, NULL, priority, NULL, NULL, NULL, run_at
           FROM claimed
           ORDER BY priority, run_at DESC, id DESC LIMIT 1);

-- The claims, one for each kind of worker, each the `picked` part of
-- worker_exchange: the ids of up to `limit` due jobs in claim order
-- (priority DESC, run_at, id), each locked as it is read; SKIP LOCKED passes
-- over the rows other workers are claiming. Each reads about as many rows as
-- it takes, whatever other queues and kinds hold.
--
-- The constant LIMIT 10000 under each walk is for the planner: given a
-- parameter for a limit it assumes a tenth of the rows, an estimate that
-- grows with the backlog until it turns on JIT compilation for every run
-- (from about 10 million pending jobs). It also caps a claim at 10,000 jobs.
--
-- Paused queues are skipped: `<> ALL(ARRAY(SELECT queue FROM
-- paused_queues_now))` reads the pauses in effect once per statement (an
-- InitPlan over a table of a row per paused queue), and costs each row read
-- a comparison with an array that is empty while nothing is paused
-- (bench/pause_bench.py: no measurable cost). The walks compare `queue ||
-- ''`, not `queue`: from the queue column's statistics, the planner would
-- take the test of a table with one queue (most tables) to reject nearly
-- every row, and turn the walk into a scan and sort of every pending job. A
-- worker of some queues drops the paused ones before walking; the others
-- pass over a paused queue's due jobs as they walk, which costs more the
-- longer its backlog.

-- name: worker_claim_all
-- A worker with no --queue and no --kind: jobs_claim_idx, in order.
SELECT ARRAY(
    SELECT id FROM (
        SELECT id FROM jobs
        WHERE status = 'pending' AND run_at <= now()
          AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
        ORDER BY priority DESC, run_at, id
        LIMIT 10000 FOR UPDATE SKIP LOCKED
    ) AS walk LIMIT %(limit)s
) AS ids;

-- name: worker_claim_all_from
-- worker_claim_all, starting its walk at the worker's floor (claims.Floor):
-- the priority, run_at and id of the last job it claimed a second or more
-- before. The jobs a worker claimed stay in jobs_claim_idx, ahead of every
-- pending job, until vacuum removes them; the walk from the index's start
-- visits each of them (a heap fetch), and while a transaction anywhere holds
-- back the xmin horizon vacuum cannot remove them: a claim then costs more
-- with every job run since that transaction began (bench/horizon_bench.py).
-- From the floor, a claim reads what it takes however many there are.
-- Three walks, in claim order, each read only as far as the cut needs
-- (an Append reads its arms in turn): higher priorities from their start
-- (a job of a higher priority is taken at once), the floor's priority from
-- the floor, lower priorities from their start. A job due before the floor
-- and still pending (a producer's transaction that ran for more than that
-- second, a --run-at in the past, a queue's pause ended) is left to the
-- worker's next walk from the start, at most a second later
-- (claims.FULL_WALK_EVERY).
SELECT ARRAY(
    SELECT id FROM (
        SELECT id FROM (SELECT id FROM jobs
         WHERE status = 'pending' AND run_at <= now() AND priority > %(floor_priority)s
           AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
         ORDER BY priority DESC, run_at, id LIMIT 10000 FOR UPDATE SKIP LOCKED) AS a
        UNION ALL
        SELECT id FROM (SELECT id FROM jobs
         WHERE status = 'pending' AND run_at <= now() AND priority = %(floor_priority)s
           AND (run_at, id) >= (%(floor_run_at)s, %(floor_id)s)
           AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
         ORDER BY run_at, id LIMIT 10000 FOR UPDATE SKIP LOCKED) AS a
        UNION ALL
        SELECT id FROM (SELECT id FROM jobs
         WHERE status = 'pending' AND run_at <= now() AND priority < %(floor_priority)s
           AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
         ORDER BY priority DESC, run_at, id LIMIT 10000 FOR UPDATE SKIP LOCKED) AS a
    ) AS w LIMIT %(limit)s
) AS ids;

-- name: worker_claim_queues
-- A worker with --queue (and maybe --kind, a filter within its queues): each
-- queue's own range of jobs_claim_queue_idx, walked in order for up to
-- `limit` jobs, the walks merged in claim order and cut to `limit`. One walk
-- per queue, because PostgreSQL 15 does not return an index scan on `queue =
-- ANY(...)` in the order of the columns after queue: it would sort the
-- served queues' whole backlog. A row a walk locked and the cut dropped
-- stays locked, unclaimed, until the statement's transaction commits, at
-- once: for that moment other workers pass over it, as over rows being
-- claimed, and take the next.
-- The status is spelled `IS NOT DISTINCT FROM 'pending'`, as the predicates
-- of jobs_claim_queue_idx and jobs_claim_kind_idx are: the one status test
-- those indexes answer to, and one that jobs_claim_idx (WHERE status =
-- 'pending') does not. So a walk cannot take jobs_claim_idx with a filter on
-- queue instead, a plan that statistics of a few queues make look cheaper
-- and that walks past every other queue's jobs.
SELECT ARRAY(
    SELECT w.id
    FROM unnest(%(queues)s::text[]) AS q,
    LATERAL (SELECT * FROM (
        SELECT id, priority, run_at FROM jobs
        WHERE status IS NOT DISTINCT FROM 'pending' AND run_at <= now() AND queue = q
          AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
        ORDER BY priority DESC, run_at, id
        LIMIT 10000 FOR UPDATE SKIP LOCKED
    ) AS walk LIMIT %(limit)s) AS w
    WHERE q <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
    ORDER BY w.priority DESC, w.run_at, w.id
    LIMIT %(limit)s
) AS ids;

-- name: worker_claim_kinds
-- A worker with --kind and no --queue: each kind's own range of
-- jobs_claim_kind_idx, as worker_claim_queues walks queues.
SELECT ARRAY(
    SELECT w.id
    FROM unnest(%(kinds)s::text[]) AS k,
    LATERAL (SELECT * FROM (
        SELECT id, priority, run_at FROM jobs
        WHERE status IS NOT DISTINCT FROM 'pending' AND run_at <= now() AND kind = k
          AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
        ORDER BY priority DESC, run_at, id
        LIMIT 10000 FOR UPDATE SKIP LOCKED
    ) AS walk LIMIT %(limit)s) AS w
    ORDER BY w.priority DESC, w.run_at, w.id
    LIMIT %(limit)s
) AS ids;

-- When a worker's next delayed job is due, one block for each kind of worker
-- as for the claims: seconds from now, or NULL. One row. The claim indexes
-- order jobs by priority first, so instead of reading every pending job for
-- the smallest run_at, each steps from the highest priority present to each
-- next lower one (an index probe each) and takes the first delayed job of
-- each: a few probes per priority level, however many jobs are pending or
-- delayed, and an estimate that stays small for the generic plan (a scan's
-- grows with the table until JIT compilation turns on for every run).
-- Paused queues are skipped as the claims skip them, and the end of a pause
-- (of a queue the worker serves) counts as a job coming due: its jobs can
-- be claimed from then on, and nobody notifies the worker when it comes.

-- name: job_next_due
-- A worker with no --queue and no --kind: jobs_claim_idx.
WITH RECURSIVE level (priority) AS (
    SELECT (SELECT priority FROM jobs WHERE status = 'pending'
            ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT priority FROM jobs WHERE status = 'pending' AND priority < l.priority
            ORDER BY priority DESC LIMIT 1)
    FROM level AS l WHERE l.priority IS NOT NULL
)
SELECT extract(epoch FROM least(min((
    SELECT run_at FROM jobs
    WHERE status = 'pending' AND priority = l.priority AND run_at > now()
      AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
    ORDER BY run_at LIMIT 1)), (SELECT min(until) FROM paused_queues_now)) - now())::float8
FROM level AS l;

-- name: job_next_due_queues
-- A worker with --queue (--kind filters within its queues): each queue's
-- range of jobs_claim_queue_idx, spelled as worker_claim_queues is and for
-- the same reason.
WITH RECURSIVE level (queue, priority) AS (
    SELECT q, (SELECT priority FROM jobs
               WHERE status IS NOT DISTINCT FROM 'pending' AND queue = q
               ORDER BY priority DESC LIMIT 1)
    FROM unnest(%(queues)s::text[]) AS q
    WHERE q <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
    UNION ALL
    SELECT l.queue, (SELECT priority FROM jobs
                     WHERE status IS NOT DISTINCT FROM 'pending' AND queue = l.queue
                       AND priority < l.priority
                     ORDER BY priority DESC LIMIT 1)
    FROM level AS l WHERE l.priority IS NOT NULL
)
SELECT extract(epoch FROM least(min((
    SELECT run_at FROM jobs
    WHERE status IS NOT DISTINCT FROM 'pending' AND queue = l.queue
      AND priority = l.priority AND run_at > now()
      AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
    ORDER BY run_at LIMIT 1)),
    (SELECT min(until) FROM paused_queues_now WHERE queue = ANY(%(queues)s::text[])))
    - now())::float8
FROM level AS l;

-- name: job_next_due_kinds
-- A worker with --kind and no --queue: each kind's range of
-- jobs_claim_kind_idx.
WITH RECURSIVE level (kind, priority) AS (
    SELECT k, (SELECT priority FROM jobs
               WHERE status IS NOT DISTINCT FROM 'pending' AND kind = k
               ORDER BY priority DESC LIMIT 1)
    FROM unnest(%(kinds)s::text[]) AS k
    UNION ALL
    SELECT l.kind, (SELECT priority FROM jobs
                    WHERE status IS NOT DISTINCT FROM 'pending' AND kind = l.kind
                      AND priority < l.priority
                    ORDER BY priority DESC LIMIT 1)
    FROM level AS l WHERE l.priority IS NOT NULL
)
SELECT extract(epoch FROM least(min((
    SELECT run_at FROM jobs
    WHERE status IS NOT DISTINCT FROM 'pending' AND kind = l.kind
      AND priority = l.priority AND run_at > now()
      AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
    ORDER BY run_at LIMIT 1)), (SELECT min(until) FROM paused_queues_now)) - now())::float8
FROM level AS l;

-- The worker's row in `workers` (the registry; see the workers section).

-- name: worker_beat
-- Register the worker, or heartbeat: its row, written whole, with last_seen
-- now and its counters. An upsert, so a row someone removed (or that was
-- removed as stale while the worker was cut off) comes back with the next
-- heartbeat, and a row left by an earlier process of the same host:pid (a
-- restarted container) is replaced. started_at NULL registers (now);
-- heartbeats send the started_at that registration returned. Sent at most
-- every --heartbeat, in the pipeline of an exchange when one goes out, alone
-- otherwise. One row: started_at.
INSERT INTO workers AS w (id, host, pid, version, queues, kinds, concurrency,
                          heartbeat_seconds, lease_seconds, started_at, last_seen,
                          running, done, failed)
VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(queues)s::text[], %(kinds)s::text[],
        %(concurrency)s, %(heartbeat)s, %(lease)s, coalesce(%(started_at)s, now()), now(),
        %(running)s, %(done)s, %(failed)s)
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version,
    queues = EXCLUDED.queues, kinds = EXCLUDED.kinds, concurrency = EXCLUDED.concurrency,
    heartbeat_seconds = EXCLUDED.heartbeat_seconds, lease_seconds = EXCLUDED.lease_seconds,
    started_at = EXCLUDED.started_at, last_seen = EXCLUDED.last_seen,
    running = EXCLUDED.running, done = EXCLUDED.done, failed = EXCLUDED.failed
RETURNING started_at;

-- name: worker_unregister
-- A clean stop: the worker's row goes. No rows.
DELETE FROM workers WHERE id = %(id)s;

-- name: workers_forget_stale
-- Rows of workers gone for an hour (and for three of their heartbeats, for
-- a worker whose --heartbeat is longer): killed or cut off for good. Run by
-- every worker with its reap; a worker that was only cut off comes back
-- with its next heartbeat. One row per worker removed: its id.
DELETE FROM workers
WHERE last_seen < now() - greatest(interval '1 hour',
                                   3 * heartbeat_seconds * interval '1 second')
RETURNING id;

-- name: worker_listen
-- Hear about new jobs (the jobs table's insert trigger notifies). No rows.
LISTEN pgqctl_jobs;

-- name: worker_listen_schedules
-- Schedules added, changed or removed: the worker reads them again.
LISTEN pgqctl_schedules;

-- name: worker_listen_cancel
-- Hear about running jobs an operator cancelled (`pgqctl cancel` notifies).
-- No rows.
LISTEN pgqctl_cancel;

-- name: transaction_begin
-- The start of a worker's transaction, sent in one round trip with what it
-- holds: at READ COMMITTED whatever the server's default, as the SKIP LOCKED
-- claim assumes. No rows.
BEGIN ISOLATION LEVEL READ COMMITTED;

-- name: transaction_commit
-- No rows.
COMMIT;

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

-- name: job_fence_state
-- Where jobs whose fenced update matched nothing stand now, to say why.
SELECT id, status, attempts
FROM jobs
WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_ended_state
-- Which of these jobs ended while a worker held them, with their attempt:
-- cancelled by an operator (with why, cut to a log line's length), or done
-- by the job's own program in its own transaction. A worker checks before
-- it stops a job it was told about (anyone may send a notification), and
-- when a renewal matched nothing.
SELECT id, attempts, status, left(last_error, 1000)
FROM jobs
WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('cancelled', 'done');

-- ---------------------------------------------------------------------------
-- migrate: applying sql/migrations/ (pgqctl/migrate.py).
-- ---------------------------------------------------------------------------

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

-- ---------------------------------------------------------------------------
-- embedded: the embedded PostgreSQL (pgqctl/embedded.py)
-- ---------------------------------------------------------------------------

-- name: embedded_workers_connected
-- The workers connected to a server, in any database (by the
-- application_name each worker gives its connections). One row per worker.
SELECT DISTINCT application_name
FROM pg_stat_activity
WHERE application_name LIKE 'pgqctl worker %'
ORDER BY application_name;
