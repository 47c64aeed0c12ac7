-- The SQL of pgqctl/attempts.py: named blocks, loaded by pgqctl/sql.py with every other
-- file of sql/queries/ (names are unique across them). Every value is a
-- psycopg placeholder; queries are unqualified: each transaction names the
-- schema first (settings_set_local, sql/queries/db.sql).

-- name: attempt_record
-- A worker's records of the attempts that ended since its last exchange,
-- sent in the exchange's pipeline and transaction, before its statement.
-- Times come as seconds before now (measured on the worker's monotonic
-- clock), so the server's clock stamps them and a worker's skewed clock
-- cannot. A record for a claim that a reap or a cancel recorded already adds
-- what the process did and keeps their outcome; one sent again (its
-- exchange's answer was lost) replaces itself. `late`: the claim had been
-- taken (reaped, claimed again, or the job deleted) when the record came.
-- due_at is the job's run_at as its claim found it: this goes before the
-- exchange's report, which may set a retry's run_at.
INSERT INTO attempts AS a (
    job_id, claim, attempt, worker, outcome, due_at, claimed_at, started_at, finished_at,
    exit_status, signal, error, user_cpu, system_cpu, max_rss_bytes,
    stdout_head, stdout_tail, stdout_bytes, stderr_head, stderr_tail, stderr_bytes,
    late, recorded_by)
SELECT r.job_id, r.claim, r.attempt, r.worker, r.outcome,
       CASE WHEN j.attempts = r.claim THEN j.run_at END,
       now() - r.claimed_ago * interval '1 second',
       now() - r.started_ago * interval '1 second',
       now() - r.ended_ago * interval '1 second',
       r.exit_status, r.signal, r.error, r.user_cpu, r.system_cpu, r.max_rss_bytes,
       r.stdout_head, r.stdout_tail, r.stdout_bytes, r.stderr_head, r.stderr_tail, r.stderr_bytes,
       j.attempts IS DISTINCT FROM r.claim, 'worker'
FROM jsonb_to_recordset(%(attempts)s::jsonb) AS r(
    job_id bigint, claim int, attempt int, worker text, outcome text, claimed_ago float8,
    started_ago float8, ended_ago float8, exit_status int, signal int, error text,
    user_cpu float8, system_cpu float8, max_rss_bytes bigint,
    stdout_head text, stdout_tail text, stdout_bytes bigint,
    stderr_head text, stderr_tail text, stderr_bytes bigint)
-- One index probe per record, whatever the plan thinks of the set's size (it
-- guesses 100 rows, and would hash the whole of jobs to join them): a LATERAL
-- subquery with a LIMIT cannot be flattened into a join.
LEFT JOIN LATERAL (SELECT run_at, attempts FROM jobs WHERE id = r.job_id LIMIT 1) AS j ON true
ON CONFLICT (job_id, claim) DO UPDATE
SET outcome = CASE WHEN a.recorded_by = 'worker' THEN EXCLUDED.outcome ELSE a.outcome END,
    error = CASE WHEN a.recorded_by = 'worker' THEN EXCLUDED.error ELSE a.error END,
    finished_at = CASE WHEN a.recorded_by = 'worker' THEN EXCLUDED.finished_at
                       ELSE a.finished_at END,
    worker = EXCLUDED.worker,
    due_at = coalesce(a.due_at, EXCLUDED.due_at),
    claimed_at = EXCLUDED.claimed_at,
    started_at = EXCLUDED.started_at,
    exit_status = EXCLUDED.exit_status,
    signal = EXCLUDED.signal,
    user_cpu = EXCLUDED.user_cpu,
    system_cpu = EXCLUDED.system_cpu,
    max_rss_bytes = EXCLUDED.max_rss_bytes,
    stdout_head = EXCLUDED.stdout_head,
    stdout_tail = EXCLUDED.stdout_tail,
    stdout_bytes = EXCLUDED.stdout_bytes,
    stderr_head = EXCLUDED.stderr_head,
    stderr_tail = EXCLUDED.stderr_tail,
    stderr_bytes = EXCLUDED.stderr_bytes,
    late = EXCLUDED.late OR a.recorded_by = 'reap';

-- name: attempt_list
-- A job's attempts, in claim order, without their output: how each ended,
-- where, when, what it cost, and the last line it wrote (the end of its
-- stderr, else of its stdout: a failing program's last words).
SELECT job_id, claim, attempt, worker, outcome, due_at, claimed_at, started_at, finished_at,
       exit_status, signal, left(error, %(error_chars)s) AS error,
       user_cpu, system_cpu, max_rss_bytes, stdout_bytes, stderr_bytes, late, recorded_by,
       right(CASE WHEN coalesce(nullif(stderr_tail, ''), stderr_head, '') ~ '\S'
                  THEN coalesce(nullif(stderr_tail, ''), stderr_head)
                  ELSE coalesce(nullif(stdout_tail, ''), stdout_head) END, 2000) AS output_end
FROM all_attempts
WHERE job_id = %(id)s
ORDER BY claim;

-- name: attempt_get
-- One attempt whole, output included: the try numbered `attempt` (the latest
-- claim of that number: a hand-back repeats it), or the latest claim.
SELECT *
FROM all_attempts
WHERE job_id = %(id)s AND (%(attempt)s::int IS NULL OR attempt = %(attempt)s::int)
ORDER BY claim DESC
LIMIT 1;

-- name: attempt_purge_count
-- How many attempts finished before `cutoff` (attempts_finished_idx, and
-- each of the history's days' index on finished_at).
SELECT count(*) FROM all_attempts WHERE finished_at < %(cutoff)s;

-- name: attempt_purge_batch
-- Up to `batch_size` attempts finished before `cutoff`, whatever their job,
-- from {table} (attempts, or the history's), in one short transaction;
-- SKIP LOCKED never waits on a row a worker is writing. One row: how many
-- went.
WITH gone AS (
    DELETE FROM {table}
    WHERE (job_id, claim) IN (
        SELECT job_id, claim
        FROM {table}
        WHERE finished_at < %(cutoff)s
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
)
SELECT count(*) FROM gone;
