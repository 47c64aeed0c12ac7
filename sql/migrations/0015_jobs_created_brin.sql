-- compatibility: additive
-- A block-range (BRIN) index on jobs.created_at, for `list --since` and the
-- searches that take a time window (`requeue --since`, the web page's).
--
-- Without it, a window that matches fewer jobs than a page (a kind with no
-- job in the last hour) had the planner walk the primary key backwards
-- through the whole history, or scan the table, waiting for matches that
-- never came: 0.6 s at 10 million finished rows and growing with them
-- (bench/history_bench.py). Rows are appended about in created_at order,
-- so each range of 128 pages holds a narrow span of times and the index
-- names the few ranges a recent window can be in: a few kB for the whole
-- table, where a btree would be about 200 MB at that size and be written
-- by every claim and every finish (their updates are not HOT: the status
-- is indexed). The BRIN index costs an insert a summary update at most.
-- autosummarize asks autovacuum to summarize each range once filled, so
-- the unsummarized tail (always read) stays short between vacuums.
--
-- Built CONCURRENTLY: writers go on while it reads the table once.

-- step: no transaction; locks jobs SHARE UPDATE EXCLUSIVE; reads jobs
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_created_brin ON jobs
    USING brin (created_at) WITH (autosummarize = on);
