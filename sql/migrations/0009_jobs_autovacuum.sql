-- compatibility: additive
-- Autovacuum for a queue table: vacuum and analyze `jobs` after a fixed
-- number of changed rows, not a fraction of the table.
--
-- The defaults (vacuum when 20% of the table is dead, analyze at 10%) suit a
-- table that grows; a queue updates the same few live rows over and over
-- (each job dies twice: at its claim and at its end) beside a history of
-- done rows that only grows. With a million done rows the default waits for
-- 200,000 dead tuples, and those sit in the claim indexes that every claim
-- walks. With a fixed threshold the dead tuples of the live part stay few
-- whatever the history holds.
--
-- vacuum after 5,000 dead tuples: about 2,500 jobs run. At tens of jobs a
-- second that is a vacuum every minute or two, each one cheap (it reads only
-- the pages changed since the last, through the visibility map); above
-- that, autovacuum_naptime (1 min by default) is the pace, and lowering the
-- threshold would buy nothing.
-- analyze after 10,000 changed rows: `stats` estimates done counts from the
-- planner's statistics, which should follow a busy queue within minutes, but
-- an ANALYZE samples up to 30,000 rows, so not every few seconds.
-- vacuum after 10,000 inserted rows too: a bulk load sets its pages
-- all-visible soon, as the default 20% of a large table never would.
--
-- `pgqctl doctor` checks these (pgqctl/doctor.py RECOMMENDED) and prints the
-- ALTER TABLE that restores them. Setting storage parameters takes a SHARE
-- UPDATE EXCLUSIVE lock only: workers go on.

-- step: transaction; locks jobs SHARE UPDATE EXCLUSIVE
ALTER TABLE jobs SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 10000
);
