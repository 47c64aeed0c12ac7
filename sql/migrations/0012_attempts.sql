-- compatibility: additive
-- Every attempt of a job kept, and when a running job was claimed.
--
-- attempts: one row per claim of a job that ended, written by whoever ended
-- it: the worker that ran it (with its next exchange: how it ended, its
-- exit status or signal, its error, the CPU time and peak memory of its
-- process, and the first and last part of its stdout and stderr), a reap
-- that took it back ('lease_lost'), or a cancel of a running job
-- ('cancelled'). Keyed by (job_id, claim): claim is the job's attempts
-- counter as that claim left it, the fencing token, which never repeats; so
-- a stale worker's late record can never land on the live claim's row.
-- attempt is the try's number as the job saw it (PGQCTL_JOB_ATTEMPT), which
-- repeats after a hand-back. When a worker's record comes after a reap's or
-- a cancel's row for the same claim, it adds what the process did and
-- keeps the outcome; `late` marks a record that came after its claim was
-- taken (reaped, claimed again, or the job deleted). due_at: the job's
-- run_at when it was claimed; started_at - due_at is how long it waited.
--
-- No foreign key to jobs: purge deletes a job's attempts with it, in the
-- same statement, and history may live apart from jobs later.
--
-- jobs.claimed_at: set by every claim (NULL before the first); a running
-- job has been running since then (a prefetched one waited for a slot).
--
-- A new table and a nullable column without a default: no table is
-- rewritten, and the ALTER holds its lock only for a moment. Additive for
-- earlier clients: their workers record no attempts and set no claimed_at.

-- step: transaction
CREATE TABLE IF NOT EXISTS attempts (
    job_id        bigint NOT NULL,
    claim         integer NOT NULL,
    attempt       integer NOT NULL,
    worker        text,
    outcome       text NOT NULL CHECK (outcome IN ('done', 'failed', 'timed_out', 'cancelled',
                                                   'lease_lost', 'handed_back', 'refused')),
    due_at        timestamptz,
    claimed_at    timestamptz,
    started_at    timestamptz,
    finished_at   timestamptz NOT NULL DEFAULT now(),
    exit_status   integer,
    signal        integer,
    error         text,
    user_cpu      float8,
    system_cpu    float8,
    max_rss_bytes bigint,
    stdout_head   text,
    stdout_tail   text,
    stdout_bytes  bigint,
    stderr_head   text,
    stderr_tail   text,
    stderr_bytes  bigint,
    late          boolean NOT NULL DEFAULT false,
    recorded_by   text NOT NULL CHECK (recorded_by IN ('worker', 'reap', 'cancel')),
    PRIMARY KEY (job_id, claim)
);
-- Retention (`purge --attempts-older-than`) and recent failures by time.
CREATE INDEX IF NOT EXISTS attempts_finished_idx ON attempts (finished_at);

-- step: transaction; locks jobs ACCESS EXCLUSIVE
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS claimed_at timestamptz;
