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
        "rows per job), so the target asks pgqctl for several thousand jobs/s from 4 "
        "processes that share 2 cores with PostgreSQL. pgqctl's exchange claims up to 20 "
        "jobs per round trip and commit (10 slots, --prefetch 10), and most of its CPU per "
        "job is now the server's: about 120 us against 40-60 us of the worker's Python, on "
        "a loaded machine (two updates per job, neither HOT, each inserting into every "
        "index of jobs, and a commit per exchange). What would close it: more jobs per "
        "exchange (a deeper --prefetch), fewer index entries written per job, and a "
        "measurement on a quiet machine."
    ),
    "drain.pgqctl/pgqueuer_asyncpg": (
        "pgqctl claims up to 20 jobs per exchange (10 slots, --prefetch 10), pgqueuer 10 "
        "per dequeue; on 2 cores shared with PostgreSQL the rate follows the CPU per job, "
        "and pgqctl's is now mostly the server's (about 120 us a job against 40-60 us of "
        "the worker's Python: two non-HOT updates per job, every index of jobs written "
        "twice). The ratio moves with the machine's load (see min .. max). What would "
        "close it: fewer index entries written per job (a claim that leaves the claim "
        "indexes' columns alone), or more jobs per exchange."
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
