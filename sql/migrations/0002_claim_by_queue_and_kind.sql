-- compatibility: additive
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
-- Building them: CREATE INDEX CONCURRENTLY, outside a transaction, so
-- enqueues, claims and reports go on while each index reads the whole table
-- (its history too) and sorts the pending jobs: on 2 cores, 2 to 3.5 s per
-- index for 1,000,000 pending jobs. Until this migration is recorded, an
-- index left invalid by a failed build is dropped and built again by the
-- next `pgqctl migrate`.

-- step: no transaction; locks jobs SHARE UPDATE EXCLUSIVE; reads jobs
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_claim_queue_idx
    ON jobs (queue, priority DESC, run_at, id)
    WHERE status IS NOT DISTINCT FROM 'pending';

-- step: no transaction; locks jobs SHARE UPDATE EXCLUSIVE; reads jobs
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_claim_kind_idx
    ON jobs (kind, priority DESC, run_at, id)
    WHERE status IS NOT DISTINCT FROM 'pending';
