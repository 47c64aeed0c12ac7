-- The current queue schema in one readable file.
--
-- This is what every migration under sql/migrations/ adds up to; the test
-- suite checks that both give the same catalog. Change it together with a
-- new migration, never instead of one.

CREATE TABLE jobs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text NOT NULL DEFAULT 'default',
    kind          text NOT NULL,
    payload       jsonb NOT NULL,
    status        text NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'done', 'failed', 'cancelled')),
    priority      integer NOT NULL DEFAULT 0,
    -- The fencing token: incremented by every claim and never decreased.
    attempts      integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts  integer NOT NULL DEFAULT 3 CHECK (max_attempts > 0),
    run_at        timestamptz NOT NULL DEFAULT now(),
    locked_until  timestamptz,
    locked_by     text,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    -- Claims a worker handed back unfinished (it stopped): they do not count
    -- as tries. The tries used are attempts - handbacks, of max_attempts.
    handbacks     integer NOT NULL DEFAULT 0,
    -- At most one pending or running job per (queue, unique_key); NULL: no key.
    unique_key    text,
    -- The schedule that enqueued the job and the tick it is for (see
    -- schedules); NULL for jobs enqueued otherwise. `schedule run` sets
    -- only the schedule.
    schedule      text,
    tick          timestamptz,
    -- When the last claim took it (see 0012); NULL before the first.
    claimed_at    timestamptz,
    -- The key of per-key limits (see 0013); true while the job holds seats.
    limit_key     text,
    seated        boolean
);

-- Vacuumed and analyzed after a fixed number of rows, not a fraction of the
-- table (see 0007; `pgqctl doctor` checks them).
ALTER TABLE jobs SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 10000
);

-- Partial indexes: the hot queries touch only the live part of the table,
-- never the finished history.
CREATE INDEX jobs_claim_idx ON jobs (priority DESC, run_at, id)
    WHERE status = 'pending';
-- The same order within each queue and within each kind: a worker that
-- serves some queues or kinds walks only their part. The predicate's
-- spelling keeps them to the statements that ask for them (see 0002).
CREATE INDEX jobs_claim_queue_idx ON jobs (queue, priority DESC, run_at, id)
    WHERE status IS NOT DISTINCT FROM 'pending';
CREATE INDEX jobs_claim_kind_idx ON jobs (kind, priority DESC, run_at, id)
    WHERE status IS NOT DISTINCT FROM 'pending';
CREATE INDEX jobs_lease_idx ON jobs (locked_until)
    WHERE status = 'running';
CREATE INDEX jobs_finished_idx ON jobs (status, finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');
-- Time windows (`list --since`): block ranges, a few kB (see 0015).
CREATE INDEX jobs_created_brin ON jobs USING brin (created_at) WITH (autosummarize = on);
-- Unique jobs: enforced here so that racing producers cannot both insert.
-- The live statuses are named, so a later finished status stays outside.
CREATE UNIQUE INDEX jobs_unique_key_idx ON jobs (queue, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'running');

-- One job per (schedule, tick), however many workers enqueue it at once.
CREATE UNIQUE INDEX jobs_schedule_tick_idx ON jobs (schedule, tick)
    WHERE schedule IS NOT NULL;

-- Keep finished_at true to status for writers that do not set it (plain SQL
-- such as `UPDATE jobs SET status = 'done' WHERE id = 3`), so purge sees
-- every finished row. pgqctl sets it itself; the WHEN clause keeps the
-- function from running at all in that case.
CREATE FUNCTION jobs_sync_finished_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.finished_at := CASE WHEN NEW.status IN ('done', 'failed', 'cancelled') THEN now() END;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_sync_finished_at
    BEFORE INSERT OR UPDATE OF status, finished_at ON jobs
    FOR EACH ROW
    WHEN ((NEW.status IN ('done', 'failed', 'cancelled')) <> (NEW.finished_at IS NOT NULL))
    EXECUTE FUNCTION jobs_sync_finished_at();

-- Wake listening workers once per INSERT statement (a bulk load of 100,000
-- rows sends one notification). The payload names the schema so workers of
-- another schema in the same database can ignore it. Notifications are
-- delivered only if the inserting transaction commits.
CREATE FUNCTION jobs_notify_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgqctl_jobs', TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_insert
    AFTER INSERT ON jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION jobs_notify_insert();

-- Paused queues (see 0003): claimed from again when `until` passes (NULL:
-- until resumed); paused_queues_now holds the pauses in effect.
CREATE TABLE paused_queues (
    queue     text PRIMARY KEY,
    reason    text,
    paused_at timestamptz NOT NULL DEFAULT now(),
    until     timestamptz
);

CREATE VIEW paused_queues_now AS
    SELECT queue, reason, paused_at, until
    FROM paused_queues
    WHERE until IS NULL OR until > now();

-- Schedules (see 0008): a cron expression in a time zone, or an interval in
-- whole seconds; ticked by the workers. last_tick (the latest tick
-- enqueued, and last_job_id its job) keeps a purged tick from coming back;
-- no tick at or before ticks_after is due. sync_source (see 0010): the
-- source whose sync made it, the only one that may remove it; overlap: skip
-- or allow a tick while the previous tick's job is pending or running.
CREATE TABLE schedules (
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
    CHECK ((cron IS NULL) <> (every_seconds IS NULL)),
    sync_source   text,
    overlap       text NOT NULL DEFAULT 'skip' CHECK (overlap IN ('allow', 'skip')),
    skipped_ticks bigint NOT NULL DEFAULT 0,
    last_skipped_tick timestamptz
);

-- The workers that run (see 0007): one row per worker, id = host:pid as in
-- locked_by before the slot; heartbeats rewrite last_seen and the counters.
-- reaped_at (see 0010): when a reap last took its jobs as a dead worker's.
CREATE TABLE workers (
    id                text PRIMARY KEY,
    host              text NOT NULL,
    pid               integer NOT NULL,
    version           text NOT NULL,
    queues            text[] NOT NULL DEFAULT '{}',
    kinds             text[] NOT NULL DEFAULT '{}',
    concurrency       integer NOT NULL,
    heartbeat_seconds float8 NOT NULL,
    lease_seconds     float8 NOT NULL,
    started_at        timestamptz NOT NULL DEFAULT now(),
    last_seen         timestamptz NOT NULL DEFAULT now(),
    running           integer NOT NULL DEFAULT 0,
    done              bigint NOT NULL DEFAULT 0,
    failed            bigint NOT NULL DEFAULT 0,
    reaped_at         timestamptz,
    reaped_jobs       bigint NOT NULL DEFAULT 0
);

-- A job's program completes its own job in its own transaction (see 0011):
-- fenced by claim, raising SQLSTATE PGQ01 in any other state; EXECUTE
-- revoked from PUBLIC; search_path pinned to this schema, then pg_temp.
CREATE OR REPLACE FUNCTION pgqctl_complete_job(job_id bigint, claim integer)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    now_status text;
    now_attempts integer;
BEGIN
    UPDATE jobs AS j
    SET status = 'done', finished_at = now(), locked_until = NULL
    WHERE j.id = job_id AND j.attempts = claim AND j.status = 'running';
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT j.status, j.attempts INTO now_status, now_attempts FROM jobs AS j WHERE j.id = job_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % does not exist (deleted, or a wrong PGQCTL_JOB_ID)', job_id
            USING ERRCODE = 'PGQ01';
    ELSIF now_attempts > claim THEN
        RAISE EXCEPTION 'job % claim % is stale: it was claimed again since (claim %, now %)',
            job_id, claim, now_attempts, now_status
            USING ERRCODE = 'PGQ01',
                  HINT = 'roll back: the claim that holds the job does its work';
    ELSIF now_attempts < claim THEN
        RAISE EXCEPTION 'job % has had only % claim(s), not %', job_id, now_attempts, claim
            USING ERRCODE = 'PGQ01',
                  HINT = 'pass PGQCTL_JOB_CLAIM as the worker gave it';
    ELSE
        RAISE EXCEPTION 'job % claim % is not running: it is %', job_id, claim, now_status
            USING ERRCODE = 'PGQ01',
                  HINT = CASE now_status
                      WHEN 'done' THEN 'it was completed already; roll back'
                      WHEN 'cancelled' THEN 'an operator cancelled it; roll back'
                      ELSE 'its lease ran out and it was reaped; roll back, it runs again'
                  END;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION pgqctl_complete_job(bigint, integer) FROM PUBLIC;
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION %I.pgqctl_complete_job(bigint, integer) SET search_path = %I, pg_temp',
        current_schema(), current_schema());
END
$$;

-- Every attempt of a job that ended (see 0012): one row per claim, keyed by
-- the fencing token; written by the worker that ran it (with its next
-- exchange), a reap (lease_lost) or a cancel (cancelled).
CREATE TABLE attempts (
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
CREATE INDEX attempts_finished_idx ON attempts (finished_at);

-- Flow control (see 0013): limits on a queue or a kind for the whole fleet,
-- the seats their running jobs hold, the trigger that frees a job's seats
-- as it leaves running, and the claim that keeps them.
CREATE TABLE limits (
    id             integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope          text NOT NULL CHECK (scope IN ('queue', 'kind')),
    name           text NOT NULL,
    concurrency    integer CHECK (concurrency > 0),
    per_key        integer CHECK (per_key > 0),
    rate           integer CHECK (rate > 0),
    period_seconds float8 CHECK (period_seconds > 0),
    burst          integer CHECK (burst > 0),
    tokens         float8,
    refilled_at    timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (scope, name),
    CHECK (concurrency IS NOT NULL OR per_key IS NOT NULL OR rate IS NOT NULL),
    CHECK ((rate IS NULL) = (period_seconds IS NULL) AND (rate IS NULL) = (burst IS NULL))
);
CREATE TABLE limit_seats (
    limit_id integer NOT NULL REFERENCES limits ON DELETE CASCADE,
    key      text NOT NULL,
    seat     integer NOT NULL,
    job_id   bigint,
    claim    integer,
    taken_at timestamptz,
    PRIMARY KEY (limit_id, key, seat)
);
CREATE INDEX limit_seats_job_idx ON limit_seats (job_id) WHERE job_id IS NOT NULL;
-- A free seat is found without reading the taken ones.
CREATE INDEX limit_seats_free_idx ON limit_seats (limit_id, key, seat)
    WHERE job_id IS NULL;


CREATE FUNCTION jobs_free_seats() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE limit_seats SET job_id = NULL, claim = NULL, taken_at = NULL
    WHERE job_id = OLD.id;
    PERFORM pg_notify('pgqctl_jobs', TG_TABLE_SCHEMA);
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    NEW.seated := NULL;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_free_seats
    BEFORE UPDATE OF status ON jobs
    FOR EACH ROW
    WHEN (OLD.seated AND NEW.status IS DISTINCT FROM 'running')
    EXECUTE FUNCTION jobs_free_seats();
CREATE TRIGGER jobs_free_seats_deleted
    BEFORE DELETE ON jobs
    FOR EACH ROW
    WHEN (OLD.seated)
    EXECUTE FUNCTION jobs_free_seats();

-- The claim of a worker while limits exist: up to `wanted` due jobs of
-- these queues and kinds (NULL: all) in claim order, each locked, and for
-- each the seats and the token its limits ask for. Jobs of a limit that is
-- full (no free seat, no token) are passed over, so the jobs behind them
-- are claimed. Returns the ids claimed, those of them that hold seats, and
-- `wake`: seconds until a rate limit that held jobs back has a token again
-- (NULL: none did), for the worker to claim again then.
CREATE FUNCTION pgqctl_claim_limited(
    queues text[], kinds text[], wanted integer,
    OUT ids bigint[], OUT seated bigint[], OUT wake float8)
LANGUAGE plpgsql
-- The walk's filters are arrays the planner cannot see into: it would take
-- them to reject nearly every row, and sort every due job rather than walk
-- the claim index in order (0.9 ms against 0.06 ms a claim at 2,000 due).
SET enable_sort = off
SET enable_bitmapscan = off
AS $$
DECLARE
    sep constant text := chr(31);
    lim record;
    job record;
    -- Limits that can take no more jobs in this claim, as 'queue' || sep ||
    -- name (or 'kind'...), and keys, as the same || sep || key.
    closed text[] := '{}';
    closed_keys text[] := '{}';
    held text[];
    seat_row record;
    seat_keys text[];
    took boolean;
    free_now float8;
    candidate record;
    -- Jobs of limits that filled during the walk passed over, at most.
    pass_over constant integer := 100;
    passed integer := 0;
    at timestamptz;
BEGIN
    ids := '{}';
    seated := '{}';
    IF wanted < 1 THEN
        RETURN;  -- an exchange that only reports
    END IF;
    -- Which limits are closed before the walk, from their seats and buckets.
    FOR lim IN
        SELECT l.*, l.scope || sep || l.name AS tag FROM limits AS l ORDER BY l.id
    LOOP
        IF lim.concurrency IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM limit_seats AS s
            WHERE s.limit_id = lim.id AND s.key = '' AND s.seat <= lim.concurrency
              AND s.job_id IS NULL) THEN
            closed := closed || lim.tag;
        END IF;
        IF lim.rate IS NOT NULL THEN
            free_now := least(lim.burst::float8, coalesce(lim.tokens, lim.burst)
                + extract(epoch FROM clock_timestamp() - coalesce(lim.refilled_at, clock_timestamp()))
                  * lim.rate / lim.period_seconds);
            IF free_now < 1 THEN
                closed := closed || lim.tag;
                wake := least(wake, (1 - free_now) * lim.period_seconds / lim.rate);
            END IF;
        END IF;
        IF lim.per_key IS NOT NULL THEN
            closed_keys := closed_keys || ARRAY(
                SELECT lim.tag || sep || s.key FROM limit_seats AS s
                WHERE s.limit_id = lim.id AND s.key <> '' AND s.seat <= lim.per_key
                GROUP BY s.key HAVING count(s.job_id) >= lim.per_key);
        END IF;
    END LOOP;

    -- The walk reads due jobs in claim order without locking them, and locks
    -- each one it would take (SKIP LOCKED: one another claim holds is passed
    -- over; one claimed since the walk began is no longer pending). Jobs of
    -- a limit that filled during the walk are passed over in the loop, for
    -- at most PASS_OVER of them: the next claim leaves them out of its walk.
    FOR candidate IN
        SELECT j.id, j.queue, j.kind, j.limit_key
        FROM jobs AS j
        WHERE j.status = 'pending' AND j.run_at <= now()
          AND (queues IS NULL OR j.queue = ANY(queues))
          AND (kinds IS NULL OR j.kind = ANY(kinds))
          AND j.queue <> ALL(ARRAY(SELECT p.queue FROM paused_queues_now AS p))
          AND ('queue' || sep || j.queue) <> ALL(closed)
          AND ('kind' || sep || j.kind) <> ALL(closed)
          AND (j.limit_key IS NULL
               OR (('queue' || sep || j.queue || sep || j.limit_key) <> ALL(closed_keys)
                   AND ('kind' || sep || j.kind || sep || j.limit_key) <> ALL(closed_keys)))
        ORDER BY j.priority DESC, j.run_at, j.id
    LOOP
        IF ('queue' || sep || candidate.queue) = ANY(closed)
           OR ('kind' || sep || candidate.kind) = ANY(closed)
           OR (candidate.limit_key IS NOT NULL
               AND (('queue' || sep || candidate.queue || sep || candidate.limit_key)
                        = ANY(closed_keys)
                    OR ('kind' || sep || candidate.kind || sep || candidate.limit_key)
                        = ANY(closed_keys))) THEN
            passed := passed + 1;
            EXIT WHEN passed > pass_over;
            CONTINUE;
        END IF;
        SELECT j.id, j.queue, j.kind, j.limit_key, least(j.attempts, 2147483646) + 1 AS claim
        INTO job
        FROM jobs AS j
        WHERE j.id = candidate.id AND j.status = 'pending' AND j.run_at <= now()
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        took := true;
        held := '{}';
        FOR lim IN
            SELECT l.*, l.scope || sep || l.name AS tag FROM limits AS l
            WHERE (l.scope = 'queue' AND l.name = job.queue)
               OR (l.scope = 'kind' AND l.name = job.kind)
            ORDER BY l.id
        LOOP
            -- A seat of the limit.
            IF lim.concurrency IS NOT NULL THEN
                SELECT s.limit_id, s.key, s.seat INTO seat_row FROM limit_seats AS s
                WHERE s.limit_id = lim.id AND s.key = '' AND s.seat <= lim.concurrency
                  AND s.job_id IS NULL
                ORDER BY s.seat LIMIT 1 FOR UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    closed := closed || lim.tag;
                    took := false;
                    EXIT;
                END IF;
                UPDATE limit_seats SET job_id = job.id, claim = job.claim,
                                       taken_at = now()
                WHERE limit_id = seat_row.limit_id AND key = '' AND seat = seat_row.seat;
                held := held || ARRAY[lim.id::text, '', seat_row.seat::text];
            END IF;
            -- A seat of the job's key.
            IF lim.per_key IS NOT NULL AND job.limit_key IS NOT NULL THEN
                IF NOT EXISTS (SELECT 1 FROM limit_seats AS s
                               WHERE s.limit_id = lim.id AND s.key = job.limit_key) THEN
                    INSERT INTO limit_seats (limit_id, key, seat)
                    SELECT lim.id, job.limit_key, n FROM generate_series(1, lim.per_key) AS n
                    ORDER BY n
                    ON CONFLICT DO NOTHING;
                END IF;
                SELECT s.limit_id, s.key, s.seat INTO seat_row FROM limit_seats AS s
                WHERE s.limit_id = lim.id AND s.key = job.limit_key
                  AND s.seat <= lim.per_key AND s.job_id IS NULL
                ORDER BY s.seat LIMIT 1 FOR UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    closed_keys := closed_keys || (lim.tag || sep || job.limit_key);
                    took := false;
                    EXIT;
                END IF;
                UPDATE limit_seats SET job_id = job.id, claim = job.claim,
                                       taken_at = now()
                WHERE limit_id = seat_row.limit_id AND key = seat_row.key
                  AND seat = seat_row.seat;
                held := held || ARRAY[lim.id::text, seat_row.key, seat_row.seat::text];
            END IF;
            -- A token of the bucket, under the limit row's lock (a
            -- locked row is another claim taking one: passed over).
            IF lim.rate IS NOT NULL THEN
                at := clock_timestamp();
                SELECT least(l.burst::float8, coalesce(l.tokens, l.burst)
                           + extract(epoch FROM at - coalesce(l.refilled_at, at))
                             * l.rate / l.period_seconds)
                INTO free_now
                FROM limits AS l WHERE l.id = lim.id FOR NO KEY UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    closed := closed || lim.tag;
                    wake := least(wake, 0.05);
                    took := false;
                ELSIF free_now < 1 THEN
                    closed := closed || lim.tag;
                    wake := least(wake, (1 - free_now) * lim.period_seconds / lim.rate);
                    took := false;
                ELSE
                    UPDATE limits SET tokens = free_now - 1, refilled_at = at
                    WHERE id = lim.id;
                END IF;
                EXIT WHEN NOT took;
            END IF;
        END LOOP;
        IF took THEN
            ids := ids || job.id;
            IF cardinality(held) > 0 THEN
                seated := seated || job.id;
            END IF;
        ELSIF cardinality(held) > 0 THEN
            -- Seats taken for a job another limit refused go back.
            FOR i IN 1 .. cardinality(held) / 3 LOOP
                UPDATE limit_seats SET job_id = NULL, claim = NULL, taken_at = NULL
                WHERE limit_id = held[3 * i - 2]::integer AND key = held[3 * i - 1]
                  AND seat = held[3 * i]::integer;
            END LOOP;
        END IF;
        EXIT WHEN cardinality(ids) >= wanted;
    END LOOP;
END;
$$;

-- What operators did from the web page (see 0014): when, who, what, on
-- which jobs or queue, and how many jobs it changed; `pgqctl actions`.
CREATE TABLE actions (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text NOT NULL,
    action    text NOT NULL,
    target    jsonb NOT NULL,
    jobs      bigint NOT NULL DEFAULT 0,
    finished  boolean NOT NULL DEFAULT true
);
CREATE INDEX actions_at_idx ON actions (at);

-- Finished jobs' history and their attempts' (see 0016): partitioned by
-- status, the done jobs then by the UTC day they finished, so that
-- retention drops whole days; all_jobs and all_attempts read a job and its attempts
-- wherever they are. The functions keep the days (SECURITY DEFINER: the
-- application role may keep them without owning the table).
CREATE TABLE jobs_history (
    id            bigint NOT NULL,
    queue         text NOT NULL,
    kind          text NOT NULL,
    payload       jsonb NOT NULL,
    status        text NOT NULL CHECK (status IN ('done', 'failed', 'cancelled')),
    priority      integer NOT NULL,
    attempts      integer NOT NULL,
    max_attempts  integer NOT NULL,
    run_at        timestamptz NOT NULL,
    locked_until  timestamptz,
    locked_by     text,
    last_error    text,
    created_at    timestamptz NOT NULL,
    finished_at   timestamptz NOT NULL,
    handbacks     integer NOT NULL,
    unique_key    text,
    schedule      text,
    tick          timestamptz,
    claimed_at    timestamptz,
    limit_key     text,
    seated        boolean
) PARTITION BY LIST (status);
CREATE TABLE jobs_history_done PARTITION OF jobs_history
    FOR VALUES IN ('done') PARTITION BY RANGE (finished_at);
CREATE TABLE jobs_history_failed PARTITION OF jobs_history
    FOR VALUES IN ('failed');
CREATE TABLE jobs_history_cancelled PARTITION OF jobs_history
    FOR VALUES IN ('cancelled');
-- Each partition gets these: a job by id, the newest first (a list pages
-- by id), the most recently finished (stats, top, the web page), and time
-- windows by created_at as in jobs (see 0015).
CREATE INDEX jobs_history_id_idx ON jobs_history (id);
CREATE INDEX jobs_history_finished_idx ON jobs_history (finished_at);
CREATE INDEX jobs_history_created_brin ON jobs_history
    USING brin (created_at) WITH (autosummarize = on);

-- The attempts of the jobs in jobs_history, moved with them: attempts'
-- columns, then the job's status and finished_at, which place each in the
-- partition of its job's day, so that a day's jobs and their attempts are
-- dropped together.
CREATE TABLE attempts_history (
    job_id          bigint NOT NULL,
    claim           integer NOT NULL,
    attempt         integer NOT NULL,
    worker          text,
    outcome         text NOT NULL,
    due_at          timestamptz,
    claimed_at      timestamptz,
    started_at      timestamptz,
    finished_at     timestamptz NOT NULL,
    exit_status     integer,
    signal          integer,
    error           text,
    user_cpu        float8,
    system_cpu      float8,
    max_rss_bytes   bigint,
    stdout_head     text,
    stdout_tail     text,
    stdout_bytes    bigint,
    stderr_head     text,
    stderr_tail     text,
    stderr_bytes    bigint,
    late            boolean NOT NULL,
    recorded_by     text NOT NULL,
    job_status      text NOT NULL CHECK (job_status IN ('done', 'failed', 'cancelled')),
    job_finished_at timestamptz NOT NULL
) PARTITION BY LIST (job_status);
CREATE TABLE attempts_history_done PARTITION OF attempts_history
    FOR VALUES IN ('done') PARTITION BY RANGE (job_finished_at);
CREATE TABLE attempts_history_failed PARTITION OF attempts_history
    FOR VALUES IN ('failed');
CREATE TABLE attempts_history_cancelled PARTITION OF attempts_history
    FOR VALUES IN ('cancelled');
-- A job's attempts (`show`, `logs`), and those ended within a window
-- (`metrics`, `top`, retention by --attempts-older-than).
CREATE INDEX attempts_history_job_idx ON attempts_history (job_id, claim);
CREATE INDEX attempts_history_finished_idx ON attempts_history (finished_at);

-- Every job, live or finished: jobs, then the history. Read-only; a
-- change goes to the table that holds the row. A migration that adds a
-- column to jobs adds it to jobs_history in the same place, and makes this
-- view again (its * was expanded when it was made).
CREATE OR REPLACE VIEW all_jobs AS
    SELECT * FROM jobs
    UNION ALL
    SELECT * FROM jobs_history;

-- Every attempt, of a live job or of one in the history.
CREATE OR REPLACE VIEW all_attempts AS
    SELECT * FROM attempts
    UNION ALL
    SELECT job_id, claim, attempt, worker, outcome, due_at, claimed_at, started_at, finished_at,
           exit_status, signal, error, user_cpu, system_cpu, max_rss_bytes,
           stdout_head, stdout_tail, stdout_bytes, stderr_head, stderr_tail, stderr_bytes,
           late, recorded_by
    FROM attempts_history;

CREATE OR REPLACE FUNCTION pgqctl_history_add_days(first date, last date)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    day date;
    tbl text;
    made integer := 0;
BEGIN
    IF NOT has_table_privilege(session_user, 'jobs_history', 'INSERT') THEN
        RAISE EXCEPTION 'permission denied for table jobs_history'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    FOR day IN SELECT generate_series(first, last, interval '1 day')::date LOOP
        FOREACH tbl IN ARRAY ARRAY['jobs_history_done', 'attempts_history_done'] LOOP
            IF to_regclass(format('%I.%I', current_schema(),
                                  tbl || '_' || to_char(day, 'YYYYMMDD'))) IS NULL THEN
                BEGIN
                    EXECUTE format(
                        'CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES FROM (%L) TO (%L)',
                        current_schema(), tbl || '_' || to_char(day, 'YYYYMMDD'),
                        current_schema(), tbl,
                        -- Midnight UTC written out: a timestamptz's text
                        -- follows the session's DateStyle and TimeZone, and
                        -- may not read back as the same time.
                        to_char(day, 'YYYY-MM-DD') || ' 00:00:00+00',
                        to_char(day + 1, 'YYYY-MM-DD') || ' 00:00:00+00');
                    made := made + 1;
                EXCEPTION WHEN duplicate_table OR unique_violation THEN
                    -- Made by another session since the check: it waited
                    -- for that one's lock on the parent, then found it.
                    NULL;
                END;
            END IF;
        END LOOP;
    END LOOP;
    RETURN made;
END
$$;

-- Drops the partition of one day's done jobs, and its attempts', if
-- pgqctl_history_add_days made it, and returns about how many rows it held,
-- from the statistics (-1 if never vacuumed or analyzed: counting them would
-- read the day whole, where the drop reads nothing); NULL when there is no
-- such partition.
CREATE OR REPLACE FUNCTION pgqctl_history_drop_day(day date)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    part regclass;
    estimate bigint;
BEGIN
    IF NOT has_table_privilege(session_user, 'jobs_history', 'DELETE') THEN
        RAISE EXCEPTION 'permission denied for table jobs_history'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Before the look-up: a session dropping the same day meanwhile holds
    -- this lock until it commits, so the look-up sees its drop.
    EXECUTE format('LOCK TABLE %I.jobs_history_done IN ACCESS EXCLUSIVE MODE',
                   current_schema());
    part := to_regclass(format('%I.%I', current_schema(),
                               'jobs_history_done_' || to_char(day, 'YYYYMMDD')));
    IF part IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT nullif(c.reltuples, -1)::bigint INTO estimate FROM pg_class AS c WHERE c.oid = part;
    EXECUTE format('DROP TABLE %I.%I', current_schema(),
                   'jobs_history_done_' || to_char(day, 'YYYYMMDD'));
    -- Its jobs' attempts, the same day's.
    EXECUTE format('DROP TABLE IF EXISTS %I.%I', current_schema(),
                   'attempts_history_done_' || to_char(day, 'YYYYMMDD'));
    RETURN coalesce(estimate, -1);
END
$$;

DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION %I.pgqctl_history_add_days(date, date) SET search_path = %I, pg_temp',
        current_schema(), current_schema());
    EXECUTE format(
        'ALTER FUNCTION %I.pgqctl_history_drop_day(date) SET search_path = %I, pg_temp',
        current_schema(), current_schema());
END
$$;

-- Today's partitions and tomorrow's; the workers' move makes the days it
-- needs, and it and `pgqctl purge` keep a day ahead.
SELECT pgqctl_history_add_days(
    (now() AT TIME ZONE 'UTC')::date, (now() AT TIME ZONE 'UTC')::date + 1);
