-- compatibility: additive
-- A job's own program may mark its job done in its own transaction, with
-- its own writes: the invoice and the job's "done" commit together or not
-- at all. A program that dies before its commit leaves neither; the job is
-- retried as after any crash, and the retry writes the invoice once.
--
--   SELECT pgqctl_complete_job($1, $2);  -- PGQCTL_JOB_ID, PGQCTL_JOB_CLAIM
--
-- Fenced as the worker's own report: it matches only the claim that is
-- running (the job's attempts counter as that claim left it, which never
-- repeats; PGQCTL_JOB_ATTEMPT, the try's number, does after a hand-back).
-- Any other state (claimed again, the lease was reaped, an operator
-- cancelled the job, it is done already) raises SQLSTATE PGQ01, so
-- the caller's transaction cannot commit: a stale run's writes roll back
-- with its completion.
--
-- SECURITY DEFINER so that a program's role needs no right on the table:
-- EXECUTE on this function lets it complete a running job whose id and
-- claim it knows, nothing more. EXECUTE is revoked from PUBLIC; grant it
-- to the roles your jobs connect as. Its search_path is pinned to the
-- queue's schema (then pg_temp), so the caller's path cannot redirect it.

-- step: transaction
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
