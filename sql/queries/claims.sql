-- The SQL of pgqctl/claims.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

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
        attempts = least(j.attempts, 2147483646) + 1,
        claimed_at = now(),
        locked_until = now() + %(lease)s * interval '1 second',
        locked_by = %(worker)s || COALESCE(
            ':' || (%(slots)s::text[])[array_position((SELECT ids FROM picked), j.id)], '')
        {seated}
    WHERE j.id = ANY((SELECT ids FROM picked)::bigint[])
    RETURNING j.id, j.queue, j.kind, j.payload, j.attempts, j.max_attempts,
              j.handbacks, j.priority, j.run_at, j.schedule, j.tick
)
-- A claim never overflows attempts: a row written with the integer maximum
-- (plain SQL) is claimed at that count, for the worker to fail for good,
-- rather than failing every claim that meets it.
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
           ORDER BY priority, run_at DESC, id DESC LIMIT 1)
{wake};

-- The claims, one for each kind of worker, each the `picked` part of
-- worker_exchange: the ids of up to `limit` due jobs in claim order
-- (priority DESC, run_at, id), each locked as it is read; SKIP LOCKED passes
-- over the rows other workers are claiming. Each reads about as many rows as
-- it takes, whatever other queues and kinds hold.
--
-- The constant LIMIT 100 under each walk is for the planner, and caps a
-- claim at 100 jobs (claims.MOST_PER_CLAIM: the worker asks for no more and
-- claims again at once after a whole one). Given a parameter for a limit,
-- the planner would assume a tenth of the rows, an estimate that grows with
-- the backlog. And the constant must be small: the worker's plan is
-- generic, made once from the statistics of the moment, and a walk that
-- may need more rows than it expects to find is planned as a sequential
-- scan and a sort of every due job. On a table of 6,200 rows, with 10,000
-- there each claim from a floor read the whole table (a drain at 2,800
-- jobs/s against 10,400 walking jobs_claim_idx); with 1,000 the arm of the
-- higher priorities still did, in one run of four (0.6 ms an exchange).
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

-- name: worker_claim_limited
-- The claim while limits exist (`pgqctl limit`; see 0013): the database's
-- pgqctl_claim_limited walks as the others do, passing over the jobs of
-- full limits, and takes each claimed job's seats and tokens. Its other
-- answers go in the statement's `seated` and `wake` parts below.
SELECT c.ids, c.seated, c.wake
FROM pgqctl_claim_limited(%(queues)s::text[], %(kinds)s::text[], %(limit)s) AS c

-- name: worker_exchange_seated
-- In the claim's update, with worker_claim_limited: a job that took seats is
-- marked, so that leaving `running` frees them (jobs_free_seats).
, seated = CASE WHEN j.id = ANY((SELECT seated FROM picked)::bigint[]) THEN true END

-- name: worker_exchange_wake
-- The last arm, with worker_claim_limited: milliseconds until a rate limit
-- that held jobs back has a token again, in the attempts column.
UNION ALL SELECT 'wake', NULL, NULL, NULL, NULL, ceil(wake * 1000)::int, NULL, NULL, NULL,
                 NULL
          FROM picked WHERE wake IS NOT NULL

-- name: worker_claim_all
-- A worker with no --queue and no --kind: jobs_claim_idx, in order.
SELECT ARRAY(
    SELECT id FROM (
        SELECT id FROM jobs
        WHERE status = 'pending' AND run_at <= now()
          AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
        ORDER BY priority DESC, run_at, id
        LIMIT 100 FOR UPDATE SKIP LOCKED
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
         ORDER BY priority DESC, run_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) AS a
        UNION ALL
        SELECT id FROM (SELECT id FROM jobs
         WHERE status = 'pending' AND run_at <= now() AND priority = %(floor_priority)s
           AND (run_at, id) >= (%(floor_run_at)s, %(floor_id)s)
           AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
         ORDER BY run_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) AS a
        UNION ALL
        SELECT id FROM (SELECT id FROM jobs
         WHERE status = 'pending' AND run_at <= now() AND priority < %(floor_priority)s
           AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
         ORDER BY priority DESC, run_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) AS a
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
        LIMIT 100 FOR UPDATE SKIP LOCKED
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
        LIMIT 100 FOR UPDATE SKIP LOCKED
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
-- The seconds are a difference of epochs, not of timestamps: a job due at
-- 'infinity' (never) gives Infinity, where before PostgreSQL 17 subtracting
-- the timestamps fails ("cannot subtract infinite timestamps").

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
SELECT (extract(epoch FROM least(min((
    SELECT run_at FROM jobs
    WHERE status = 'pending' AND priority = l.priority AND run_at > now()
      AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
    ORDER BY run_at LIMIT 1)), (SELECT min(until) FROM paused_queues_now)))
    - extract(epoch FROM now()))::float8
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
SELECT (extract(epoch FROM least(min((
    SELECT run_at FROM jobs
    WHERE status IS NOT DISTINCT FROM 'pending' AND queue = l.queue
      AND priority = l.priority AND run_at > now()
      AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
    ORDER BY run_at LIMIT 1)),
    (SELECT min(until) FROM paused_queues_now WHERE queue = ANY(%(queues)s::text[]))))
    - extract(epoch FROM now()))::float8
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
SELECT (extract(epoch FROM least(min((
    SELECT run_at FROM jobs
    WHERE status IS NOT DISTINCT FROM 'pending' AND kind = l.kind
      AND priority = l.priority AND run_at > now()
      AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))
    ORDER BY run_at LIMIT 1)), (SELECT min(until) FROM paused_queues_now)))
    - extract(epoch FROM now()))::float8
FROM level AS l;

-- The worker's row in `workers` (the registry; see the workers section).

-- name: transaction_begin
-- The start of a worker's transaction, sent in one round trip with what it
-- holds: at READ COMMITTED whatever the server's default, as the SKIP LOCKED
-- claim assumes. No rows.
BEGIN ISOLATION LEVEL READ COMMITTED;

-- name: transaction_commit
-- No rows.
COMMIT;

-- name: job_fence_state
-- Where jobs whose fenced update matched nothing stand now, to say why.
SELECT id, status, attempts
FROM all_jobs
WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_ended_state
-- Which of these jobs ended while a worker held them, with their attempt:
-- cancelled by an operator (with why, cut to a log line's length), or done
-- by the job's own program in its own transaction. A worker checks before
-- it stops a job it was told about (anyone may send a notification), and
-- when a renewal matched nothing.
SELECT id, attempts, status, left(last_error, 1000)
FROM all_jobs
WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('cancelled', 'done');
