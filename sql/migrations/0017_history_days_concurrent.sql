-- compatibility: additive
-- The history's functions made again so that sessions making, or
-- dropping, the same day at once all succeed.
--
-- Workers started together each make the days their first move needs.
-- Before, the second found a day missing, waited for the first's lock on
-- the parent, then failed with "relation already exists", and its move with
-- it (tried again a chore later). Now a day made meanwhile by another
-- session counts as made. Likewise two purges dropping the same day: the
-- second finds it gone, as if it had never been there.
--
-- And a day's bounds are written as midnight UTC in ISO form: they were a
-- timestamptz's text, in the session's DateStyle and time zone, and read
-- back wrong where those make it ambiguous (DateStyle SQL in Asia/Kolkata
-- printed "IST", which PostgreSQL 15 reads as Israel's: a day from 03:30).
--
-- Replaces two functions' bodies; their arguments, results and rights are
-- the same, so earlier clients call them as before. CREATE OR REPLACE
-- resets a function's settings, so their search_path is pinned again.

-- step: transaction
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
    part := to_regclass(format('%I.%I', current_schema(),
                               'jobs_history_done_' || to_char(day, 'YYYYMMDD')));
    IF part IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT nullif(c.reltuples, -1)::bigint INTO estimate FROM pg_class AS c WHERE c.oid = part;
    BEGIN
        EXECUTE format('DROP TABLE %I.%I', current_schema(),
                       'jobs_history_done_' || to_char(day, 'YYYYMMDD'));
    EXCEPTION WHEN undefined_table THEN
        -- Dropped by another session since the check (two purges at once).
        RETURN NULL;
    END;
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
