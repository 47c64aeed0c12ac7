-- compatibility: additive
-- Schedules: cron expressions and intervals, ticked by the running workers.
--
-- A schedule is a row of `schedules`; every worker (without --no-schedules)
-- reads them, works out which ticks are due, and enqueues them. There is no
-- leader: any number of workers may try to enqueue the same tick at once,
-- and the database keeps it to one job per (schedule, tick) in two ways:
--
-- - jobs_schedule_tick_idx, a unique index on the job's (schedule, tick):
--   the second INSERT of a tick waits for the first to commit, then
--   conflicts and adds nothing. It is the guarantee while the tick's job
--   exists.
-- - schedules.last_tick, the latest tick enqueued, advanced by the same
--   statement that enqueues (under the schedule row's lock): a tick at or
--   before it is never enqueued again. It is the guarantee once the tick's
--   job has been purged, when the index no longer holds it.
--
-- A table of ticks was the alternative; it would grow by one row per tick
-- and need purging of its own, where two columns on jobs and one on
-- schedules keep it to what is live. `schedule` and `tick` stay on the job
-- after its schedule is removed (history), so they are not a foreign key.
--
-- A schedule has a cron expression (in `timezone`) or an interval in whole
-- seconds (`every_seconds`, ticks at multiples of it since the epoch, UTC).
-- `ticks_after`: no tick at or before it is ever due (set when the schedule
-- is made, when its timing changes and when it is resumed), so a resumed or
-- changed schedule does not catch up the ticks of before. `source` says
-- whether `schedule add` ('cli') or `schedule sync` ('file') made it: sync
-- removes only the latter unless told. `updated_at` changes with the
-- definition; a worker enqueues a tick only for the definition it read.
--
-- Adding nullable columns without defaults rewrites nothing: a moment under
-- ACCESS EXCLUSIVE. The index holds only scheduled jobs; it is built
-- CONCURRENTLY (reading the table once while writers go on).

-- step: transaction; locks jobs ACCESS EXCLUSIVE
CREATE TABLE IF NOT EXISTS schedules (
    name          text PRIMARY KEY,
    cron          text,
    every_seconds integer CHECK (every_seconds > 0),
    timezone      text NOT NULL DEFAULT 'UTC',
    kind          text NOT NULL,
    payload       jsonb NOT NULL DEFAULT '{}',
    queue         text NOT NULL DEFAULT 'default',
    priority      integer NOT NULL DEFAULT 0,
    max_attempts  integer NOT NULL DEFAULT 3 CHECK (max_attempts > 0),
    paused        boolean NOT NULL DEFAULT false,
    source        text NOT NULL DEFAULT 'cli' CHECK (source IN ('cli', 'file')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    ticks_after   timestamptz NOT NULL DEFAULT now(),
    last_tick     timestamptz,
    last_job_id   bigint,
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);

ALTER TABLE jobs ADD COLUMN IF NOT EXISTS schedule text;
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS tick timestamptz;
-- step: no transaction; locks jobs SHARE UPDATE EXCLUSIVE; reads jobs
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_schedule_tick_idx ON jobs (schedule, tick)
    WHERE schedule IS NOT NULL;
