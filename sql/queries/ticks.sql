-- The SQL of pgqctl/ticks.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

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

-- These blocks write {jobs} for the table: the enqueue API composes it with
-- psycopg.sql.Identifier, schema-qualified when its caller names a schema and
-- bare (the search_path) otherwise. A job is due at run_at when given, else at
-- the transaction's now() plus delay seconds. ORDER BY n hands out ids in
-- input order, so the returned ids line up with the jobs given.
