-- compatibility: additive
-- The queue table, with the column names and status values of the classic
-- SKIP LOCKED design, so plain SQL written for that design runs unchanged.

-- step: transaction
CREATE TABLE jobs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text NOT NULL DEFAULT 'default',
    kind          text NOT NULL,
    payload       jsonb NOT NULL,
    status        text NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'done', 'failed')),
    priority      integer NOT NULL DEFAULT 0,
    -- The fencing token: incremented by every claim and never decreased.
    attempts      integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts  integer NOT NULL DEFAULT 3 CHECK (max_attempts > 0),
    run_at        timestamptz NOT NULL DEFAULT now(),
    locked_until  timestamptz,
    locked_by     text,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);

-- Partial indexes: the hot queries touch only the live part of the table,
-- never the finished history.
CREATE INDEX jobs_claim_idx ON jobs (priority DESC, run_at, id)
    WHERE status = 'pending';
CREATE INDEX jobs_lease_idx ON jobs (locked_until)
    WHERE status = 'running';
CREATE INDEX jobs_finished_idx ON jobs (status, finished_at)
    WHERE status IN ('done', 'failed');

-- Keep finished_at true to status for writers that do not set it (plain SQL
-- such as `UPDATE jobs SET status = 'done' WHERE id = 3`), so purge sees
-- every finished row. pgqctl sets it itself; the WHEN clause keeps the
-- function from running at all in that case.
CREATE FUNCTION jobs_sync_finished_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.finished_at := CASE WHEN NEW.status IN ('done', 'failed') THEN now() END;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_sync_finished_at
    BEFORE INSERT OR UPDATE OF status, finished_at ON jobs
    FOR EACH ROW
    WHEN ((NEW.status IN ('done', 'failed')) <> (NEW.finished_at IS NOT NULL))
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
