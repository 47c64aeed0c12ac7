-- The SQL of pgqctl/leases.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: lease_list
-- Running jobs, soonest lease end first (jobs_lease_idx order). A running job
-- without a lease (only plain SQL makes one) counts as expired, here, in
-- stats and for reap: nobody holds it, so nothing else would ever free it.
-- A lease until 'infinity' (plain SQL) cannot be subtracted from: it is
-- bounded first to the years a Python datetime holds (pgqctl/fartime.py),
-- by comparisons, which keep a NULL (least and greatest would not).
SELECT {job},
       locked_until < now() OR locked_until IS NULL AS expired,
       round(extract(epoch FROM
           CASE WHEN locked_until > '10000-01-01Z' THEN '10000-01-01Z'
                WHEN locked_until < '0001-01-01Z' THEN '0001-01-01Z'
                ELSE locked_until END - now()
       )::numeric, 3) AS seconds_left
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
-- dead workers get reaped_at, and the count of their jobs taken; each
-- attempt taken is recorded in attempts.
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
), lost AS (
    -- Each attempt a reap ends, recorded as lease_lost; a late record of its
    -- worker adds what the process did (attempt_record).
    INSERT INTO attempts (job_id, claim, attempt, worker, outcome, due_at, claimed_at, error,
                          recorded_by)
    SELECT id, attempts, attempts - handbacks, held_by, 'lease_lost', run_at, claimed_at,
           last_error, 'reap'
    FROM reaped
    ON CONFLICT (job_id, claim) DO NOTHING
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

-- name: worker_get
-- One worker's row, how long since its last heartbeat, and whether it is
-- active (as workers_list says), or no row.
SELECT w.*, extract(epoch FROM now() - w.last_seen)::float8 AS seen_seconds_ago,
       w.last_seen >= now() - 3 * w.heartbeat_seconds * interval '1 second' AS active
FROM workers AS w
WHERE w.id = %(id)s;
