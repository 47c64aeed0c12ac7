-- A fifth status, 'cancelled': an operator stopped the job (`pgqctl cancel`),
-- pending or running. It is finished like done and failed: it has
-- finished_at, purge deletes it (jobs_finished_idx), and no claim takes it.
--
-- Cost on a big table: the new CHECK reads every row once and the finished
-- index is rebuilt from the history, holding an ACCESS EXCLUSIVE lock
-- meanwhile (workers and producers wait). Purge the done history first to
-- keep it short.

ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('pending', 'running', 'done', 'failed', 'cancelled'));

DROP INDEX jobs_finished_idx;
CREATE INDEX jobs_finished_idx ON jobs (status, finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');

CREATE OR REPLACE FUNCTION jobs_sync_finished_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.finished_at := CASE WHEN NEW.status IN ('done', 'failed', 'cancelled') THEN now() END;
    RETURN NEW;
END;
$$;

DROP TRIGGER jobs_sync_finished_at ON jobs;
CREATE TRIGGER jobs_sync_finished_at
    BEFORE INSERT OR UPDATE OF status, finished_at ON jobs
    FOR EACH ROW
    WHEN ((NEW.status IN ('done', 'failed', 'cancelled')) <> (NEW.finished_at IS NOT NULL))
    EXECUTE FUNCTION jobs_sync_finished_at();
