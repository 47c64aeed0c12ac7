-- compatibility: additive
-- actions: what operators did to the queue from the web page (`pgqctl web
-- --allow-actions`), one row per action: when, who (the name given to the
-- page's authentication, and the address it came from), what (retry,
-- run_now, cancel, pause, resume, requeue_matching, cancel_matching),
-- which jobs or queue (`target`: the job's id, the queue, or the filter the
-- jobs matched, as JSON), and how many jobs it changed. A bulk action's row
-- is written with its first batch and its count raised with each further
-- one, in the batch's own transaction: the row never says more was done
-- than was; `finished` is false until its last batch (a page stopped
-- midway leaves it false). `pgqctl actions` lists them.
--
-- A new table only. Additive for earlier clients: they write no actions.

-- step: transaction
CREATE TABLE IF NOT EXISTS actions (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text NOT NULL,
    action    text NOT NULL,
    target    jsonb NOT NULL,
    jobs      bigint NOT NULL DEFAULT 0,
    finished  boolean NOT NULL DEFAULT true
);
CREATE INDEX IF NOT EXISTS actions_at_idx ON actions (at);
