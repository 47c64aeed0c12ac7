"""Why a lead ratio falls short, and what would close it: the closing note.

Keyed by ratio name; printed only for a ratio whose median misses its target
in the run being reported. Written from measurements on the 2-core machines
(the figures named here are printed in the same run), and to be revised when
the code or the figures move.
"""

from __future__ import annotations

NO_ANALYSIS = "no analysis recorded for this shortfall yet: profile it before quoting the figure."

_ENQUEUE_CLI = (
    "the CLI figure is timed from exec to exit: about 0.15 s of interpreter start-up and "
    "imports (`python -X importtime -c 'import pgqctl.cli'`: psycopg is most of it) on a "
    "load that takes well under a second, then about 1.7 us of Python per line (each line "
    "is decoded and checked before COPY, so a bad line can fail the load before anything "
    "is written) and a server-side INSERT ... SELECT from a staging table that returns the "
    "ids in file order; bulk_enqueue.pgqctl_api is the same COPY path with the jobs already "
    "in memory. What would close it: COPY straight into jobs when nobody needs the ids "
    "(which needs USAGE on the id sequence, a privilege an enqueue-only role may lack)."
)

_AGAINST_COPY = (
    "the raw COPY writes (kind, payload) straight into jobs and returns nothing; pgqctl "
    "checks every job in Python first (types, sizes, NUL characters, so that a bad one "
    "fails the load before anything is written), COPYs into a temporary staging table and "
    "moves the rows with one INSERT ... SELECT that draws the ids and returns them in input "
    "order: the jobs are written twice on the server, once to the staging table and once to "
    "jobs and its indexes (the raw COPY maintains the same indexes). The CLI adds "
    "about 0.15 s of interpreter start-up and imports and reads and decodes the file. What "
    "would close it: COPY straight into jobs when the caller does not need the ids (the "
    "CLI without --json), which needs USAGE on the id sequence, a privilege an "
    "enqueue-only role may lack."
)

SHORTFALLS: dict[str, str] = {
    "bulk_enqueue.pgqctl_api/raw_copy": _AGAINST_COPY,
    "bulk_enqueue.pgqctl_cli/raw_copy": _AGAINST_COPY,
    "bulk_enqueue.pgqctl_api/procrastinate": (
        "see bulk_enqueue.pgqctl_api/raw_copy: the API's own cost is the checks and the "
        "staging table; procrastinate's batch insert is one statement of arrays."
    ),
    "bulk_enqueue.pgqctl_cli/pgqueuer": _ENQUEUE_CLI,
    "bulk_enqueue.pgqctl_cli/procrastinate": _ENQUEUE_CLI,
    "bulk_enqueue.pgqctl_api/pgqueuer": (
        "the API validates each job in Python (types, sizes, NUL characters) and stages the "
        "rows through a temporary table so it can return ids in order; pgqueuer sends its "
        "lists as arrays with no checks. What would close it: COPY straight into jobs when "
        "the caller does not need the ids, and a cheaper per-job check."
    ),
    "drain.pgqctl/procrastinate": (
        "procrastinate drains a few hundred jobs/s here (a stored-procedure call and event "
        "rows per job), so the target asks pgqctl for 5,000-9,000 jobs/s from 4 processes "
        "that share 2 cores with PostgreSQL; the exchange commits once per batch of up to "
        "10 jobs per worker, and drain.pgqctl/seed_loop shows that batching already buys "
        "about 5x over a commit per job. What would close it: more jobs per exchange when "
        "the queue is deep (the worker claims as many as it has free slots), less Python "
        "per job in the exchange (a dataclass and a json.loads per claimed row), and a "
        "measurement on a quiet machine."
    ),
    "drain.pgqctl/pgqueuer_asyncpg": (
        "both take 10 jobs per round trip and both are bound by Python and commits on 2 "
        "cores, so the ratio sits near its target and moves with the machine's load (see "
        "min .. max); drain.pgqctl/seed_loop shows what batching already buys. What would "
        "close it: less Python per job on the exchange (a dataclass and a json.loads of the "
        "payload per claimed row, a JSON object per reported job), or more jobs per "
        "exchange when more slots are free."
    ),
    "purge.claim_p99_during/quiet": (
        "the purge takes only finished rows, FOR UPDATE SKIP LOCKED, and claims read only "
        "the pending partial index, so the workers do not wait on its row locks; what they "
        "share is the server: each worker commit flushes WAL that may already hold a "
        "batch's deletions, and on 2 cores the purge's backend competes with them for CPU. "
        "The purge rests as long as each batch took (--pause auto); compare "
        "purge.claim_quiet_p50 across runs: when the machine's other tenants push the quiet "
        "exchanges up, the ratio moves with them. What would close it: a longer --pause or "
        "a smaller --batch-size, and a measurement on a quiet machine."
    ),
}
