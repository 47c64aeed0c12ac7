-- compatibility: additive
-- Flow control: limits on a queue or a kind that hold for the whole fleet,
-- enforced by the claim itself (pgqctl_claim_limited), with no leader and
-- no count that can drift.
--
-- limits: one row per queue or kind (`pgqctl limit set`), with any of
--   concurrency: at most this many of its jobs running at any instant;
--   per_key: at most this many running jobs of each limit_key;
--   rate / period_seconds with burst: a token bucket. It holds `burst`
--   tokens at most and refills at rate/period per second, from
--   clock_timestamp(); each claim of a job takes one. So in any window of
--   `period` seconds at most rate + burst jobs start, and over a long run
--   rate per period. tokens and refilled_at are the bucket's state, changed
--   only under the row's lock.
--
-- limit_seats: a running job under a concurrency limit holds one of the
-- limit's seats (key ''), a keyed job under a per-key limit one of its
-- key's seats; seats 1..N, taken with FOR UPDATE SKIP LOCKED, so two
-- claims never take the same seat and a seat taken by a claim that
-- committed after a claimer's snapshot is seen taken (its newest version
-- is checked). A job that holds seats is marked `seated`; whatever moves
-- it out of running (a report, a reap, a cancel, its own completion, plain
-- SQL, a delete) frees them in the same transaction (jobs_free_seats), and
-- tells listening workers that a seat is free.
--
-- jobs.limit_key: the key of per-key limits (`enqueue --limit-key`).
-- jobs.seated: true while the job holds seats.
--
-- New tables, two nullable columns without default (no rewrite), new
-- functions and triggers: additive. Earlier clients claim without looking
-- at limits (a fleet that mixes them does not keep its limits).

-- step: transaction
CREATE TABLE IF NOT EXISTS limits (
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
CREATE TABLE IF NOT EXISTS limit_seats (
    limit_id integer NOT NULL REFERENCES limits ON DELETE CASCADE,
    key      text NOT NULL,
    seat     integer NOT NULL,
    job_id   bigint,
    claim    integer,
    taken_at timestamptz,
    PRIMARY KEY (limit_id, key, seat)
);
CREATE INDEX IF NOT EXISTS limit_seats_job_idx ON limit_seats (job_id) WHERE job_id IS NOT NULL;
-- A free seat is found without reading the taken ones.
CREATE INDEX IF NOT EXISTS limit_seats_free_idx ON limit_seats (limit_id, key, seat)
    WHERE job_id IS NULL;

-- step: transaction; locks jobs ACCESS EXCLUSIVE
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS limit_key text;
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS seated boolean;

-- step: transaction
CREATE OR REPLACE FUNCTION jobs_free_seats() RETURNS trigger
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

-- step: transaction; locks jobs SHARE ROW EXCLUSIVE
DROP TRIGGER IF EXISTS jobs_free_seats ON jobs;
CREATE TRIGGER jobs_free_seats
    BEFORE UPDATE OF status ON jobs
    FOR EACH ROW
    WHEN (OLD.seated AND NEW.status IS DISTINCT FROM 'running')
    EXECUTE FUNCTION jobs_free_seats();
DROP TRIGGER IF EXISTS jobs_free_seats_deleted ON jobs;
CREATE TRIGGER jobs_free_seats_deleted
    BEFORE DELETE ON jobs
    FOR EACH ROW
    WHEN (OLD.seated)
    EXECUTE FUNCTION jobs_free_seats();

-- step: transaction
-- The claim of a worker while limits exist: up to `wanted` due jobs of
-- these queues and kinds (NULL: all) in claim order, each locked, and for
-- each the seats and the token its limits ask for. Jobs of a limit that is
-- full (no free seat, no token) are passed over, so the jobs behind them
-- are claimed. Returns the ids claimed, those of them that hold seats, and
-- `wake`: seconds until a rate limit that held jobs back has a token again
-- (NULL: none did), for the worker to claim again then.
CREATE OR REPLACE FUNCTION pgqctl_claim_limited(
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
