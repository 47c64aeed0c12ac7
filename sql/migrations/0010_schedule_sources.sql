-- compatibility: additive
-- Schedules a sync cannot wipe, schedules that do not pile up behind a slow
-- job, and workers known to be dead before their leases end.
--
-- schedules.sync_source: the name of the file (or the --source) whose
-- `schedule sync` made the schedule. A sync removes only the schedules of
-- its own source, so two teams' files never remove each other's. NULL for
-- schedules made by `schedule add` (source 'cli'), and for those synced
-- before sources existed: a sync that names one adopts it; no sync removes
-- one it does not name.
--
-- schedules.overlap: what a tick does while the job of the schedule's
-- previous tick is still pending or running: 'skip' (enqueue nothing,
-- count the tick in skipped_ticks and last_skipped_tick) or 'allow'
-- (enqueue it anyway). The schedules that exist keep 'allow', the way they
-- ticked before; new ones get 'skip' unless told.
--
-- workers.reaped_at: when a reap last took the jobs of this worker because
-- it was dead (no heartbeat for --dead-after of its heartbeat intervals),
-- or on demand (`reap --worker`); reaped_jobs counts the jobs so taken. A
-- worker reaped after its last heartbeat is shown dead; one that
-- heartbeats again is active again.
--
-- Every column is nullable or has a constant default: no table is
-- rewritten, and each ALTER holds its lock only for a moment. The CHECK on
-- overlap is validated in a step of its own, under a lock writers pass.
--
-- Additive for earlier clients: their workers tick every schedule as
-- 'allow' and take no dead worker's jobs early, their `schedule sync`
-- knows no sources (it removes what its file does not name, as it always
-- did), and their `schedule add` gets the new default, 'skip'.

-- step: transaction; locks schedules ACCESS EXCLUSIVE; locks workers ACCESS EXCLUSIVE
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS sync_source text;
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS overlap text NOT NULL DEFAULT 'allow';
ALTER TABLE schedules DROP CONSTRAINT IF EXISTS schedules_overlap_check;
ALTER TABLE schedules ADD CONSTRAINT schedules_overlap_check
    CHECK (overlap IN ('allow', 'skip')) NOT VALID;
ALTER TABLE schedules ALTER COLUMN overlap SET DEFAULT 'skip';
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS skipped_ticks bigint NOT NULL DEFAULT 0;
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS last_skipped_tick timestamptz;

ALTER TABLE workers ADD COLUMN IF NOT EXISTS reaped_at timestamptz;
ALTER TABLE workers ADD COLUMN IF NOT EXISTS reaped_jobs bigint NOT NULL DEFAULT 0;

-- step: transaction; locks schedules SHARE UPDATE EXCLUSIVE; reads schedules
ALTER TABLE schedules VALIDATE CONSTRAINT schedules_overlap_check;
