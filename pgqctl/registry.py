"""The worker registry: each worker's row, as it writes it, and `pgqctl workers`,
which lists the registered workers, whether each is alive, and what it runs.

Each worker writes its own row of `workers` (`Beat`, below: it registers with
its first exchange, heartbeats at least every --heartbeat, removes the row
when it stops cleanly). A worker is active while its last heartbeat is at
most three of its own intervals old, and stale after that: killed, or cut
off from the database. It is dead once a reap took its jobs back for it
(`leases.reap`: no heartbeat for --dead-after of its intervals, or `reap
--worker`), until it heartbeats again. Any worker removes a row stale for
an hour. The SQL is sql/queries/registry.sql. Nothing here prints or exits.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import dict_row

from pgqctl.db import QueueConnection, atomic
from pgqctl.sql import query

Connection = psycopg.Connection[Any]

STATES = ("active", "stale", "dead")


@dataclass(frozen=True)
class Worker:
    """One row of `workers`, with its state and the jobs it holds."""

    id: str  # host:pid: `locked_by` of its jobs is id:slot, or id:prefetch
    state: str  # one of STATES
    host: str
    pid: int
    version: str
    queues: tuple[str, ...]  # () for every queue
    kinds: tuple[str, ...]  # () for every kind
    concurrency: int
    running: int  # as of its last heartbeat
    done: int  # attempts done since it started
    failed: int  # attempts failed (retried or not) since it started
    started_at: dt.datetime
    last_seen: dt.datetime
    seen_seconds_ago: float
    heartbeat_seconds: float
    lease_seconds: float
    jobs: tuple[int, ...]  # the running jobs it holds in its slots, by locked_by, now
    prefetched: tuple[int, ...]  # those it holds claimed ahead, not started (--prefetch)
    # When a reap last found it dead (and took its jobs), and how many jobs
    # reaps took from it as a dead worker's; it is dead while no heartbeat
    # came since.
    reaped_at: dt.datetime | None = None
    reaped_jobs: int = 0

    def as_record(self) -> dict[str, Any]:
        found = asdict(self)
        found["queues"] = list(self.queues)
        found["kinds"] = list(self.kinds)
        found["jobs"] = list(self.jobs)
        found["prefetched"] = list(self.prefetched)
        return found


FIELDS = tuple(Worker.__dataclass_fields__)


def list_workers(conn: Connection) -> list[Worker]:
    """Every registered worker, by host and pid."""
    with atomic(conn), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("workers_list"), {})
        rows = cur.fetchall()
    return [
        Worker(
            **{
                **{name: row[name] for name in FIELDS},
                "queues": tuple(row["queues"]),
                "kinds": tuple(row["kinds"]),
                "jobs": tuple(row["jobs"]),
                "prefetched": tuple(row["prefetched"]),
            }
        )
        for row in rows
    ]


@dataclass(frozen=True)
class Fleet:
    """How many workers are active and stale, and the queues each active one
    serves: what check and metrics need."""

    active: int
    stale: int
    active_queues: tuple[tuple[str, ...], ...]  # per active worker; () for every queue

    def serving(self, queue: str) -> int:
        """Active workers that claim from `queue` (one with no --queue claims from all)."""
        return sum(1 for queues in self.active_queues if not queues or queue in queues)

    def counts(self) -> dict[str, int]:
        return {"active": self.active, "stale": self.stale}


def fleet(conn: Connection) -> Fleet:
    with atomic(conn):
        rows = conn.execute(query("workers_states"), {}).fetchall()
    active: list[tuple[str, ...]] = [tuple(queues) for queues, alive in rows if alive]
    return Fleet(len(active), len(rows) - len(active), tuple(active))


# --- what each worker writes of its own row -------------------------------------


@dataclass(frozen=True)
class Beat:
    """A worker's row in `workers`: who it is, and its counters now.

    started_at None registers the worker (the server's now() becomes its
    start); later heartbeats send the started_at registration returned, so
    that a row re-created after someone removed it keeps the true start.
    """

    id: str  # host:pid, as locked_by names the worker before the slot
    host: str
    pid: int
    version: str
    queues: tuple[str, ...]  # () for every queue
    kinds: tuple[str, ...]
    concurrency: int
    heartbeat: float  # seconds between heartbeats: stale after three missed
    lease: float
    started_at: dt.datetime | None = None
    running: int = 0
    done: int = 0  # attempts reported done since the start
    failed: int = 0  # attempts reported failed (retried or not) since the start
    # The worker's --dead-after, when it reaps: the heartbeat then says
    # whether another worker is dead and waits for a reap (Beaten.dead_found).
    dead_after: int | None = None

    def params(self) -> dict[str, object]:
        found = asdict(self)
        found["queues"] = list(self.queues)
        found["kinds"] = list(self.kinds)
        return found


class Beaten(NamedTuple):
    """What a heartbeat's row says back (sql/queries/registry.sql, worker_beat)."""

    started_at: dt.datetime
    limited: bool  # any limit exists: claim with worker_claim_limited
    dead_found: bool  # another worker is dead and its jobs wait for a reap


def heartbeat(conn: QueueConnection, beat: Beat) -> Beaten:
    """Register the worker, or heartbeat when no exchange goes out."""
    with conn.transaction():
        row = conn.execute(query("worker_beat"), beat.params()).fetchone()
    assert row is not None  # an upsert returns its row
    return Beaten(*row)


def unregister(conn: QueueConnection, worker: str) -> None:
    """A clean stop: the worker's row goes."""
    with conn.transaction():
        conn.execute(query("worker_unregister"), {"id": worker})


def forget_stale(conn: QueueConnection) -> list[str]:
    """Remove the rows of workers gone for an hour; their ids."""
    with conn.transaction():
        return sorted(row[0] for row in conn.execute(query("workers_forget_stale")).fetchall())
