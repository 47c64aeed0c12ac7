"""pgqctl: run and administer a job queue stored in one PostgreSQL table.

Enqueue from Python inside your own transaction::

    import pgqctl

    job_id = pgqctl.enqueue(conn, "send_receipt", {"order_id": 42})
    ids = pgqctl.enqueue_many(conn, [{"kind": "resize", "payload": {"image": 7}}])
    # At most one pending or running job per key: this gives the holder's id.
    job_id = pgqctl.enqueue(conn, "sync", {"user": 7}, unique_key="sync:7")
    # One event, many consumers: one job per kind, their ids in that order.
    ids = pgqctl.enqueue(conn, ["send_receipt", "update_crm"], {"order_id": 42})

In a job's program, its own writes and its "done" in one transaction::

    with conn.transaction():
        conn.execute("INSERT INTO invoices ...")
        pgqctl.complete_job(conn)  # the job and attempt the worker gave
"""

from __future__ import annotations

__version__ = "0.1.0"

# Cheap to import: pgqctl.intake loads psycopg only when it inserts.
from pgqctl.completion import JobNotRunning, complete_job
from pgqctl.intake.api import DuplicateJob, enqueue, enqueue_many

__all__ = [
    "DuplicateJob",
    "JobNotRunning",
    "__version__",
    "complete_job",
    "enqueue",
    "enqueue_many",
]
