-- Claim indexes for workers restricted to some queues or kinds.
--
-- jobs_claim_idx orders every pending job; a worker restricted with --queue
-- or --kind had to walk it past every due job of the others, so one queue's
-- backlog slowed down the workers of all the others (500,000 pending jobs in
-- one queue: 69 ms a claim for a worker of another one). These hold the
-- same order within each queue and within each kind, so the claim walks
-- only the part of the queues or kinds it serves (worker_exchange in
-- queries.sql).
--
-- Their predicate is spelled `status IS NOT DISTINCT FROM 'pending'` (the
-- same rows as `status = 'pending'`, status being NOT NULL) so that only the
-- statements spelled that way, the claim's and job_next_due's walks of a
-- queue or a kind, can use them; and those walks cannot use jobs_claim_idx
-- instead, whose order serves every queue at once (a plan may find it
-- cheaper from the statistics of a few queues, and then walk past the other
-- queues' jobs on every claim).
--
-- Each index costs every job an index entry while it is pending (enqueue,
-- retry, requeue), like jobs_claim_idx; finished and running jobs have none.
--
-- Building them: migrations run in a transaction, so these cannot be built
-- CONCURRENTLY here. Each CREATE INDEX reads the whole table once (its
-- history too) and sorts the pending jobs, holding a SHARE lock meanwhile:
-- enqueues, claims and reports wait, reads go on. On 2 cores, a table of
-- 1,000,000 pending jobs took 2 to 3.5 s per index. For a big table,
-- build them beforehand without blocking writes, under these names and
-- definitions, with CREATE INDEX CONCURRENTLY (outside a transaction); this
-- migration then finds them and leaves them be. A concurrent build that
-- failed leaves an invalid index under the name: drop it and build again,
-- or this migration would keep it and the claims would not use it.

CREATE INDEX IF NOT EXISTS jobs_claim_queue_idx ON jobs (queue, priority DESC, run_at, id)
    WHERE status IS NOT DISTINCT FROM 'pending';
CREATE INDEX IF NOT EXISTS jobs_claim_kind_idx ON jobs (kind, priority DESC, run_at, id)
    WHERE status IS NOT DISTINCT FROM 'pending';
