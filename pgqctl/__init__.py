"""pgqctl: run and administer a job queue stored in one PostgreSQL table.

Enqueue from Python inside your own transaction::

    import pgqctl

    job_id = pgqctl.enqueue(conn, "send_receipt", {"order_id": 42})
    ids = pgqctl.enqueue_many(conn, [{"kind": "resize", "payload": {"image": 7}}])
"""

from __future__ import annotations

__version__ = "0.1.0"

# Cheap to import: pgqctl.enqueue loads psycopg only when it inserts.
from pgqctl.enqueue import enqueue, enqueue_many

__all__ = ["__version__", "enqueue", "enqueue_many"]
