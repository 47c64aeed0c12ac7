"""Why a lead ratio falls short, and what would close it: the closing note.

Keyed by ratio name; printed only for a ratio whose median misses its target
in the run being reported. Written from measurements on the 2-core machines
(the figures named here are printed in the same run), and to be revised when
the code or the figures move.
"""

from __future__ import annotations

NO_ANALYSIS = "no analysis recorded for this shortfall yet: profile it before quoting the figure."

_ENQUEUE_CLI = (
    "the CLI figure is timed from exec to exit: interpreter start-up and imports (psycopg, "
    "which brings asyncio and importlib.metadata, is most of them) and the connection's "
    "checks take 0.15-0.2 s on a quiet machine and up to 1 s at a load average of 7 "
    "(`pgqctl enqueue --file` of a one-line file against the same of 100,000 lines), "
    "paid before the first row goes; then each line is decoded by json's C scanner (most "
    "of the 2-3 us of Python per line) and checked, on the core PostgreSQL needs, while "
    "the rows go by COPY straight into jobs. The load itself (the 100,000-line run less "
    "the one-line run) took 0.7-1.6x the raw COPY's time over 5 rounds at a load average "
    "of 6-8. pgqueuer's figure falls "
    "less than a COPY's when the machine is loaded: in the same rounds the raw COPY "
    "itself is 2.2-3.8x pgqueuer (4.2x in a quieter run), so 2.5x pgqueuer asks the CLI "
    "for 0.65-1.1x the raw COPY, start-up included. What would close it: a shorter "
    "start-up (psycopg imported without asyncio, the SQL blocks read lazily), or a "
    "quieter machine."
)

_AGAINST_COPY = (
    "the raw COPY writes (kind, payload) straight into jobs and returns nothing; pgqctl "
    "checks every job in Python as it goes (types, sizes, NUL characters, commands a "
    "worker would refuse: a bad one rolls the load back and nothing is enqueued), draws "
    "the ids from the sequence before each chunk of up to 10,000 jobs so as to return "
    "them, and COPYs each chunk straight into jobs: the server's work per job is the "
    "same (bench/enqueue_bench.py: about 1.1 s of backend CPU per 100,000 jobs for both, "
    "1.3 s through the staging table that a role without USAGE on the sequence takes), "
    "and the client's CPU too (0.35-0.4 s). What is left is a round trip per chunk and "
    "the client's checks on the core the server needs; the CLI adds its start-up (see "
    "the CLI's ratio against pgqueuer). What would close it: a quieter machine; the "
    "ratio swings 0.4-1.1 between rounds at a load average of 3-8."
)

SHORTFALLS: dict[str, str] = {
    "bulk_enqueue.pgqctl_api/raw_copy": _AGAINST_COPY,
    "bulk_enqueue.pgqctl_cli/raw_copy": _AGAINST_COPY,
    "bulk_enqueue.pgqctl_api/procrastinate": (
        "see bulk_enqueue.pgqctl_api/raw_copy: the API runs at the raw COPY's pace within "
        "the noise; procrastinate's batch insert is one statement of arrays."
    ),
    "bulk_enqueue.pgqctl_cli/pgqueuer": _ENQUEUE_CLI,
    "bulk_enqueue.pgqctl_cli/procrastinate": _ENQUEUE_CLI,
    "bulk_enqueue.pgqctl_api/pgqueuer": (
        "pgqueuer's figure falls less than a COPY's when the machine is loaded: in the same "
        "rounds the raw COPY itself is 2.2-3.8x pgqueuer (4.2x in a quieter run), and the "
        "API runs at the raw COPY's pace within the noise (see "
        "bulk_enqueue.pgqctl_api/raw_copy). What would close it: a quieter machine."
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
