-- compatibility: additive
-- The history of finished jobs (and of their attempts) in storage of its
-- own, partitioned by status, and the done jobs (the bulk of any queue's
-- history) by the UTC day they finished, apart from the pending and
-- running jobs the workers claim from; and
-- all_jobs and all_attempts, the relations every command reads a job and
-- its attempts from, wherever they are.
--
-- jobs_history holds rows of jobs' columns, in jobs' order, with the
-- finished statuses only and finished_at never NULL:
--   jobs_history                   PARTITION BY LIST (status)
--     jobs_history_done            PARTITION BY RANGE (finished_at)
--       jobs_history_done_20261205   one UTC day: [00:00, next 00:00)
--     jobs_history_failed          one table
--     jobs_history_cancelled       one table
-- Failed and cancelled jobs are few beside the done ones, and kept longer;
-- days of their own would triple the partitions that every read of the
-- history plans and opens (a command's first read of each costs its
-- session about 0.2 ms).
-- attempts_history holds the attempts of those jobs, attempts' columns and
-- then their job's status and finished_at, partitioned the same way by
-- those (attempts_history_done_20261205 holds the attempts of the jobs of
-- jobs_history_done_20261205).
-- A job moves from jobs to jobs_history with its attempts in one statement
-- (DELETE ... RETURNING feeding an INSERT), so every snapshot sees it in
-- exactly one of the two, and keeps its id: ids stay unique across both.
--
-- Retention drops a day's partitions of done jobs and their attempts
-- (`purge --older-than`, on a day's boundary, whatever their row count); a
-- purge within a day, and of failed or cancelled jobs, deletes row by row,
-- as in jobs.
--
-- pgqctl_history_add_days(first, last) creates the days' partitions that
-- are missing; pgqctl_history_drop_day(day) drops one day's. Both
-- are SECURITY DEFINER, so that a role that may only read and write the
-- queue's tables (the application role of docs/operating.md) can keep the
-- history: creating or dropping a partition needs the table's owner. Each
-- checks first that the session's role may write (INSERT) or delete from
-- (DELETE) jobs_history, and does nothing else: names are made here, never
-- taken from the caller. Their search_path is pinned to the queue's
-- schema, then pg_temp.
--
-- New tables, views and functions; jobs and attempts are untouched.
-- Additive: earlier clients never see the history and keep finishing jobs
-- in jobs, where all_jobs reads them too.

-- step: transaction
CREATE TABLE IF NOT EXISTS jobs_history (
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
CREATE TABLE IF NOT EXISTS jobs_history_done PARTITION OF jobs_history
    FOR VALUES IN ('done') PARTITION BY RANGE (finished_at);
CREATE TABLE IF NOT EXISTS jobs_history_failed PARTITION OF jobs_history
    FOR VALUES IN ('failed');
CREATE TABLE IF NOT EXISTS jobs_history_cancelled PARTITION OF jobs_history
    FOR VALUES IN ('cancelled');
-- Each partition gets these: a job by id, the newest first (a list pages
-- by id), the most recently finished (stats, top, the web page), and time
-- windows by created_at as in jobs (see 0015).
CREATE INDEX IF NOT EXISTS jobs_history_id_idx ON jobs_history (id);
CREATE INDEX IF NOT EXISTS jobs_history_finished_idx ON jobs_history (finished_at);
CREATE INDEX IF NOT EXISTS jobs_history_created_brin ON jobs_history
    USING brin (created_at) WITH (autosummarize = on);

-- The attempts of the jobs in jobs_history, moved with them: attempts'
-- columns, then the job's status and finished_at, which place each in the
-- partition of its job's day, so that a day's jobs and their attempts are
-- dropped together.
CREATE TABLE IF NOT EXISTS attempts_history (
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
CREATE TABLE IF NOT EXISTS attempts_history_done PARTITION OF attempts_history
    FOR VALUES IN ('done') PARTITION BY RANGE (job_finished_at);
CREATE TABLE IF NOT EXISTS attempts_history_failed PARTITION OF attempts_history
    FOR VALUES IN ('failed');
CREATE TABLE IF NOT EXISTS attempts_history_cancelled PARTITION OF attempts_history
    FOR VALUES IN ('cancelled');
-- A job's attempts (`show`, `logs`), and those ended within a window
-- (`metrics`, `top`, retention by --attempts-older-than).
CREATE INDEX IF NOT EXISTS attempts_history_job_idx ON attempts_history (job_id, claim);
CREATE INDEX IF NOT EXISTS attempts_history_finished_idx ON attempts_history (finished_at);

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
                EXECUTE format(
                    'CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES FROM (%L) TO (%L)',
                    current_schema(), tbl || '_' || to_char(day, 'YYYYMMDD'),
                    current_schema(), tbl,
                    (day::timestamp AT TIME ZONE 'UTC'),
                    ((day + 1)::timestamp AT TIME ZONE 'UTC'));
                made := made + 1;
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
    part := to_regclass(format('%I.%I', current_schema(),
                               'jobs_history_done_' || to_char(day, 'YYYYMMDD')));
    IF part IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT nullif(c.reltuples, -1)::bigint INTO estimate FROM pg_class AS c WHERE c.oid = part;
    EXECUTE format('DROP TABLE %s', part);
    -- Its jobs' attempts, the same day's.
    part := to_regclass(format('%I.%I', current_schema(),
                               'attempts_history_done_' || to_char(day, 'YYYYMMDD')));
    IF part IS NOT NULL THEN
        EXECUTE format('DROP TABLE %s', part);
    END IF;
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
