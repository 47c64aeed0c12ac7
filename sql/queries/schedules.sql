-- The SQL of pgqctl/schedules.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

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
LEFT JOIN all_jobs AS j ON j.id = s.last_job_id
ORDER BY s.name;

-- name: schedule_get
-- One schedule, or no row.
SELECT s.*, j.status AS last_job_status, now() AS now
FROM schedules AS s
LEFT JOIN all_jobs AS j ON j.id = s.last_job_id
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
