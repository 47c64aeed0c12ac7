-- compatibility: additive
-- A fifth status, 'cancelled': an operator stopped the job (`pgqctl cancel`),
-- pending or running. It is finished like done and failed: it has
-- finished_at, purge deletes it (jobs_finished_idx), and no claim takes it.
--
-- Clients that predate it never write it and skip it as they skip any
-- finished job: it is additive for them.
--
-- Done in steps so that writers never wait for a table scan: the wider
-- CHECK is added NOT VALID (a moment under ACCESS EXCLUSIVE: new rows are
-- checked from then on), then validated under SHARE UPDATE EXCLUSIVE, which
-- reads every row while enqueues, claims and reports go on. The finished
-- index is built anew CONCURRENTLY beside the old one, which is then
-- dropped CONCURRENTLY; the new one takes its name. Each step can run
-- again after an interruption.

-- step: transaction; locks jobs ACCESS EXCLUSIVE
ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('pending', 'running', 'done', 'failed', 'cancelled')) NOT VALID;

CREATE OR REPLACE FUNCTION jobs_sync_finished_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.finished_at := CASE WHEN NEW.status IN ('done', 'failed', 'cancelled') THEN now() END;
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS jobs_sync_finished_at ON jobs;
CREATE TRIGGER jobs_sync_finished_at
    BEFORE INSERT OR UPDATE OF status, finished_at ON jobs
    FOR EACH ROW
    WHEN ((NEW.status IN ('done', 'failed', 'cancelled')) <> (NEW.finished_at IS NOT NULL))
    EXECUTE FUNCTION jobs_sync_finished_at();

-- step: transaction; locks jobs SHARE UPDATE EXCLUSIVE; reads jobs
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_status_check;

-- step: no transaction; locks jobs SHARE UPDATE EXCLUSIVE; reads jobs
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_finished_new_idx ON jobs (status, finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');

-- step: no transaction; locks jobs SHARE UPDATE EXCLUSIVE
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_idx;

-- step: transaction; locks jobs SHARE UPDATE EXCLUSIVE
ALTER INDEX IF EXISTS jobs_finished_new_idx RENAME TO jobs_finished_idx;
