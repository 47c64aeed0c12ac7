"""SQL the benchmarks share: the seed's plain loop and the history fixtures."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.seed import SEED_CLAIM

__all__ = ["HISTORY", "HISTORY_SPREAD", "LIVE_SET", "REEXPIRE", "SEED_CLAIM", "SEED_DONE"]

# The seed's lease claim (LIMIT 1), as the tests run it, and its fenced
# report: the plain-SQL loop that pgqctl's worker is compared with.
SEED_DONE = """
UPDATE jobs SET status = 'done', locked_until = NULL
WHERE id = %s
  AND attempts = %s
RETURNING id, status
"""

# A live set next to the history: 1,000 pending, 100 running of which 50
# have an expired lease, 100 failed.
LIVE_SET = """
INSERT INTO jobs (queue, kind, payload)
SELECT 'q' || i % 3, 'bench', '{"argv": ["true"]}' FROM generate_series(1, 1000) AS i;
INSERT INTO jobs (queue, kind, payload, status, attempts, locked_until, locked_by)
SELECT 'q' || i % 3, 'bench', '{"argv": ["true"]}', 'running', 1,
       CASE WHEN i <= 50 THEN now() - interval '5 minutes' ELSE now() + interval '1 day' END,
       'bench:1:' || i
FROM generate_series(1, 100) AS i;
INSERT INTO jobs (queue, kind, payload, status, attempts, last_error)
SELECT 'q' || i % 3, 'bench', '{"argv": ["true"]}', 'failed', 3, 'exit status 1'
FROM generate_series(1, 100) AS i;
"""
# Finished rows, `n` of them, for the cost-against-history measures.
HISTORY = """
INSERT INTO jobs (queue, kind, payload, status, attempts, created_at, finished_at)
SELECT 'q' || i %% 3, 'bench', '{"argv": ["true"]}', 'done', 1,
       now() - interval '30 days' + i * interval '1 millisecond',
       now() - interval '30 days' + i * interval '1 millisecond' + interval '2 seconds'
FROM generate_series(1, %(n)s) AS i
"""
# Finished rows, `n` of them, as a queue that ran leaves them: finished
# evenly over `span`, the newest `end` ago, each created 2 s before it
# finished, ids in the order of time. One INSERT ... SELECT, so that 10
# million rows load in a minute or two. `n`, `span` and `end` are parameters.
HISTORY_SPREAD = """
INSERT INTO jobs (queue, kind, payload, status, attempts,
                  run_at, created_at, claimed_at, finished_at)
SELECT 'q' || i %% 3, 'bench', '{"argv": ["true"]}', 'done', 1,
       t - interval '2 seconds', t - interval '2 seconds', t - interval '1 second', t
FROM (
    SELECT i,
           now() - %(end)s::interval
           - (%(n)s::bigint - i) * (%(span)s::interval / %(n)s::bigint) AS t
    FROM generate_series(1, %(n)s::bigint) AS i
) AS finished
"""
# Puts back the expired leases a real reap took, untimed, before each reap.
REEXPIRE = """
UPDATE jobs
SET status = 'running', attempts = 1, locked_until = now() - interval '5 minutes',
    locked_by = 'bench:1:0', last_error = NULL, finished_at = NULL
WHERE id = ANY(%(ids)s)
"""
