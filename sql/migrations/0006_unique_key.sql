-- compatibility: additive
-- Unique jobs: at most one pending or running job per (queue, unique_key).
--
-- The database enforces it, so producers that race each other (several
-- processes enqueueing the same key at once) cannot both win: the second
-- INSERT waits for the first to commit and then conflicts. A key is free
-- again once its job is done or failed (or leaves pending and running in
-- any other way); jobs without a key (NULL) are never constrained.
-- Producers say `INSERT ... ON CONFLICT (queue, unique_key) WHERE
-- unique_key IS NOT NULL AND status IN ('pending', 'running') DO NOTHING`
-- (or plain `ON CONFLICT DO NOTHING`).
--
-- The predicate names the two live statuses rather than excluding the
-- finished ones, so a finished status added later stays outside it.
--
-- Adding a nullable column without a default rewrites nothing: a moment
-- under ACCESS EXCLUSIVE. The index holds only keyed live jobs, so it stays
-- small; it is built CONCURRENTLY (reading the whole table once while
-- writers go on). Until then no job has a key, so none can conflict.

-- step: transaction; locks jobs ACCESS EXCLUSIVE
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS unique_key text;

-- step: no transaction; locks jobs SHARE UPDATE EXCLUSIVE; reads jobs
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_unique_key_idx ON jobs (queue, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'running');
