"""pgqctl: run and administer a job queue stored in one PostgreSQL table.

Enqueue from Python inside your own transaction::

    import pgqctl

    job_id = pgqctl.enqueue(conn, "send_receipt", {"order_id": 42})
    ids = pgqctl.enqueue_many(conn, [{"kind": "resize", "payload": {"image": 7}}])
    # At most one pending or running job per key: this gives the holder's id.
    job_id = pgqctl.enqueue(conn, "sync", {"user": 7}, unique_key="sync:7")
"""

from __future__ import annotations

__version__ = "0.1.0"

# Cheap to import: pgqctl.enqueue loads psycopg only when it inserts.
from pgqctl.enqueue import DuplicateJob, enqueue, enqueue_many

__all__ = ["DuplicateJob", "__version__", "enqueue", "enqueue_many"]
