-- compatibility: additive
-- pgqctl_history_drop_day made again so that two purges dropping the same
-- day at once cannot meet inside the server's DROP.
--
-- 0017 looked the day's partition up, then dropped it, catching "does not
-- exist" for a day another session dropped in between. But a DROP that
-- had found the partition, and then waited for the other's lock on the
-- parent, could go on after that one committed and fail inside the server
-- ("could not find tuple for parent of relation ..."), an internal error
-- no handler can tell apart from a real one: one purge in about ten of
-- four sessions dropping ten days at once failed so.
--
-- Now the function takes the parent's lock first, the one the DROP takes
-- anyway (ACCESS EXCLUSIVE on jobs_history_done), and looks the partition
-- up only then: the second session waits, then finds the day gone. The
-- lock is held no longer than before, and a lock_timeout still bounds the
-- wait.
--
-- Replaces the function's body; its arguments, result and rights are the
-- same, so earlier clients call it as before. CREATE OR REPLACE resets a
-- function's settings, so its search_path is pinned again.

-- step: transaction
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
        'ALTER FUNCTION %I.pgqctl_history_drop_day(date) SET search_path = %I, pg_temp',
        current_schema(), current_schema());
END
$$;
