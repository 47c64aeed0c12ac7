-- The SQL of pgqctl/why.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: job_why
-- One job and what stands between it and a worker, in one snapshot: whether
-- it is due (and how long until it is), the pause of its queue, the worker
-- holding it (its state as workers_list says it) and its lease, the active
-- workers that would claim it (a worker with no --queue or --kind takes
-- every one) with their slots and the jobs they ran at their last
-- heartbeat, every active worker, and how many due jobs of its queue come
-- before it in claim order (priority, then run_at, then id; counted through
-- jobs_claim_queue_idx up to %(ahead_bound)s). No row: no such job. A time
-- plain SQL set to 'infinity' cannot be subtracted from: it is bounded first
-- to the years a Python datetime holds (pgqctl/fartime.py), by comparisons,
-- which keep a NULL (least and greatest would not).
SELECT {job},
       extract(epoch FROM
           CASE WHEN jobs.run_at > '10000-01-01Z' THEN '10000-01-01Z'
                WHEN jobs.run_at < '0001-01-01Z' THEN '0001-01-01Z'
                ELSE jobs.run_at END - now()
       )::float8 AS due_in,
       extract(epoch FROM
           CASE WHEN jobs.locked_until > '10000-01-01Z' THEN '10000-01-01Z'
                WHEN jobs.locked_until < '0001-01-01Z' THEN '0001-01-01Z'
                ELSE jobs.locked_until END - now()
       )::float8 AS lease_left,
       extract(epoch FROM
           now() - CASE WHEN jobs.claimed_at > '10000-01-01Z' THEN '10000-01-01Z'
                        WHEN jobs.claimed_at < '0001-01-01Z' THEN '0001-01-01Z'
                        ELSE jobs.claimed_at END
       )::float8 AS claimed_ago,
       p.reason AS pause_reason, p.paused_at, p.until AS paused_until,
       p.queue IS NOT NULL AS paused,
       h.id AS holder, h.state AS holder_state, h.seen_seconds_ago AS holder_seen_ago,
       s.workers AS serving_workers, s.slots AS serving_slots, s.running AS serving_running,
       a.workers AS active_workers,
       ahead.higher AS ahead_higher, ahead.same AS ahead_same
FROM all_jobs AS jobs
LEFT JOIN paused_queues_now AS p ON p.queue = jobs.queue
LEFT JOIN LATERAL (
    SELECT w.id,
           CASE WHEN w.reaped_at >= w.last_seen THEN 'dead'
                WHEN w.last_seen >= now() - 3 * w.heartbeat_seconds * interval '1 second'
                THEN 'active' ELSE 'stale' END AS state,
           extract(epoch FROM now() - w.last_seen)::float8 AS seen_seconds_ago
    FROM workers AS w
    WHERE w.id = regexp_replace(jobs.locked_by, ':([0-9]+|prefetch)$', '')
) AS h ON true
CROSS JOIN LATERAL (
    SELECT count(*) AS workers,
           coalesce(sum(w.concurrency), 0)::bigint AS slots,
           coalesce(sum(w.running), 0)::bigint AS running
    FROM workers AS w
    WHERE w.last_seen >= now() - 3 * w.heartbeat_seconds * interval '1 second'
      AND NOT coalesce(w.reaped_at >= w.last_seen, false)
      AND (cardinality(w.queues) = 0 OR jobs.queue = ANY(w.queues))
      AND (cardinality(w.kinds) = 0 OR jobs.kind = ANY(w.kinds))
) AS s
CROSS JOIN LATERAL (
    SELECT count(*) AS workers
    FROM workers AS w
    WHERE w.last_seen >= now() - 3 * w.heartbeat_seconds * interval '1 second'
      AND NOT coalesce(w.reaped_at >= w.last_seen, false)
) AS a
LEFT JOIN LATERAL (
    -- Two walks of the queue's claim index, each a range of it: the due jobs
    -- of a higher priority, then those of the same one before it.
    SELECT (SELECT count(*) FROM (
                SELECT 1 FROM jobs AS o
                WHERE o.status IS NOT DISTINCT FROM 'pending' AND o.queue = jobs.queue
                  AND o.priority > jobs.priority AND o.run_at <= now()
                LIMIT %(ahead_bound)s) AS higher) AS higher,
           (SELECT count(*) FROM (
                SELECT 1 FROM jobs AS o
                WHERE o.status IS NOT DISTINCT FROM 'pending' AND o.queue = jobs.queue
                  AND o.priority = jobs.priority AND (o.run_at, o.id) < (jobs.run_at, jobs.id)
                  AND o.run_at <= now()
                LIMIT %(ahead_bound)s) AS same) AS same
    WHERE jobs.status = 'pending'
) AS ahead ON true
WHERE jobs.id = %(id)s;
