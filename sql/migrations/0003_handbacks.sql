-- compatibility: additive
-- Hand-backs: claims that do not count as tries.
--
-- A worker that stops before its job ends hands the job back: pending, due
-- now, the interrupted try not counted. `attempts` cannot go back down (it
-- is the fencing token: every claim raises it, and a stale worker's report
-- matches nothing once it has moved on), so until now a hand-back raised
-- max_attempts instead, and a job with 3 tries handed back twice read "5",
-- its next run "attempt 3 of 5". Counting the hand-backs keeps both true:
-- attempts still rises with every claim, and the tries a job has used are
-- attempts - handbacks, out of an unchanged max_attempts.
--
-- Adding a column with a constant default rewrites nothing (PostgreSQL 11
-- and later): this takes a moment whatever the table holds.

-- step: transaction; locks jobs ACCESS EXCLUSIVE
ALTER TABLE jobs ADD COLUMN handbacks integer NOT NULL DEFAULT 0;
