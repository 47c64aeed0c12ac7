"""Why a lead ratio falls short, and what would close it: the closing note.

Keyed by ratio name; printed only for a ratio whose median misses its target
in the run being reported. Written from measurements on the 2-core machines
(the figures named here are printed in the same run), and to be revised when
the code or the figures move.
"""

from __future__ import annotations

NO_ANALYSIS = "no analysis recorded for this shortfall yet: profile it before quoting the figure."

_ENQUEUE_CLI = (
    "the CLI figure is timed from exec to exit: about 0.3 s of interpreter start-up and "
    "imports (`python -X importtime -c 'import pgqctl.cli'`: psycopg alone is half), then "
    "every line is decoded and validated in Python before COPY; bulk_enqueue.pgqctl_api, "
    "the same COPY path with the jobs already in memory, is the library's own rate. What "
    "would close it: import psycopg and rich only once a command needs them, and validate "
    "lines with one json.loads and no re-encode of payloads that are already JSON text."
)

SHORTFALLS: dict[str, str] = {
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
    "e2e.c4.pgqctl_worker/spawn_limit": (
        "the spawn limit is one Python process whose threads only run `true`; the worker is "
        "one Python process too, so the gap is the Python work it adds per job under the "
        "same GIL: its runner (process group, output pipes, environment: "
        "bench/spawn_overhead.py measures runner.run at about 0.75x of plain "
        "subprocess.run), handing the job to a slot thread and the result back to the main "
        "loop, and its share of a database exchange; on 2 cores PostgreSQL's CPU for each "
        "commit comes out of the same budget. e2e.c4.pgqctl_worker/seed_loop compares it "
        "with 4 plain processes each running the seed's loop. What would close it: the "
        "worker's hot path: a leaner spawn (no output pipes when "
        "nobody reads them, posix_spawn), fewer thread hand-offs per job, and fewer "
        "exchanges per job when slots finish close together."
    ),
    "purge.claim_stall/batch_time": (
        "the purge takes only finished rows, FOR UPDATE SKIP LOCKED, and claims read only "
        "the pending partial index, so the workers are not meant to wait on its row locks; "
        "compare purge.claim_stall_max with purge.claim_quiet_max (the longest exchange "
        "the same workers saw in the second before the purge) and purge.claim_p99_during "
        "to tell a purge effect from the machine's noise. What the workers do share with "
        "the purge: each worker commit must flush WAL that already holds a batch's "
        "deletions, and on 2 cores the purge's backend competes with them for CPU. What "
        "would close it: a pause between batches (or a smaller --batch-size) so worker "
        "commits do not queue behind a batch's WAL, then a measurement on a quiet machine."
    ),
}
